"""Where an object store's credentials come from, and the guard against a metadata lookup.

An S3, GCS or Azure store built without credentials asks the cloud's instance-metadata
service for them, at a link-local address, on its first request. Off a cloud VM that is a
slow, confusing failure, so :func:`~aioload.sources.stores.store.open_store` refuses to build such
a store (:func:`_check_credentials`) unless the caller passes credentials, in options or in
the environment, ``skip_signature=True``, a ``credential_provider`` or
``metadata_credentials=True``. The store's environment variables (``AWS_*``, ``GOOGLE_*``,
``AZURE_*``, ``AZURITE_*``) are also what a store rebuilt in a worker process needs
(:func:`_environment`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from typing import Any

# Every name here is private to the stores of aioload.sources.
__all__: list[str] = []

# Options that say where a store's credentials come from, per kind of store; with none of
# them (as an argument or in the environment) obstore would ask the instance metadata.
_S3_CREDENTIALS = ("access_key_id", "skip_signature", "web_identity_token_file")
_S3_CREDENTIAL_ENV = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SKIP_SIGNATURE",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
)
_GCS_CREDENTIALS = (
    "service_account",
    "service_account_key",
    "application_credentials",
    "bearer_token",
    "skip_signature",
)
_GCS_CREDENTIAL_ENV = (
    "GOOGLE_SERVICE_ACCOUNT",
    "GOOGLE_SERVICE_ACCOUNT_PATH",
    "GOOGLE_SERVICE_ACCOUNT_KEY",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "GOOGLE_BEARER_TOKEN",
    "GOOGLE_SKIP_SIGNATURE",
)
_AZURE_CREDENTIALS = (
    "account_key",
    "sas_key",
    "token",
    "client_secret",
    "use_emulator",
    "use_azure_cli",
    "federated_token_file",
    "skip_signature",
)
_AZURE_CREDENTIAL_ENV = (
    "AZURE_STORAGE_ACCOUNT_KEY",
    "AZURE_STORAGE_ACCESS_KEY",
    "AZURE_STORAGE_SAS_KEY",
    "AZURE_STORAGE_TOKEN",
    "AZURE_CLIENT_SECRET",
    "AZURE_STORAGE_USE_EMULATOR",
    "AZURE_USE_AZURE_CLI",
    "AZURE_FEDERATED_TOKEN_FILE",
    "AZURE_SKIP_SIGNATURE",
)


def _check_credentials(
    url: str,
    options: Mapping[str, Any],
    provider: Any,
    metadata: bool,
    keys: tuple[str, ...],
    env: tuple[str, ...],
) -> None:
    if metadata or provider is not None:
        return
    if any(options.get(key) for key in keys) or any(os.environ.get(name) for name in env):
        return
    if "config" in options and any(options["config"].get(key) for key in keys):
        return
    raise ValueError(
        f"{url}: no credentials. Pass them as options ({', '.join(keys[:2])}, ...) or in "
        f"the environment ({', '.join(env[:2])}, ...); skip_signature=True for public data; "
        "a credential_provider; or metadata_credentials=True to fetch them from the cloud's "
        "instance-metadata service (on a cloud VM). Without any of these the store would "
        "query that service at a link-local address on its first request."
    )


# AZURITE_: the Azure emulator's address (AZURITE_BLOB_STORAGE_URL), read by obstore too.
_ENVIRONMENT_PREFIXES = ("AWS_", "GOOGLE_", "AZURE_", "AZURITE_")


@contextlib.contextmanager
def _environment(saved: Mapping[str, str]) -> Iterator[None]:
    """The store variables of ``os.environ`` as ``saved`` has them, while a store is built.

    obstore reads them once, when a store is built; they are put back right after.
    """
    before = {
        name: value for name, value in os.environ.items() if name.startswith(_ENVIRONMENT_PREFIXES)
    }
    if before == saved:
        yield
        return
    for name in before:
        if name not in saved:
            del os.environ[name]
    os.environ.update(saved)
    try:
        yield
    finally:
        for name in saved:
            os.environ.pop(name, None)
        os.environ.update(before)
