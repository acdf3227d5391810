"""Where an object store's credentials come from, and the guard against a metadata lookup.

An S3, GCS or Azure store built without credentials asks the cloud's instance-metadata
service for them, at a link-local address, on its first request. Off a cloud VM that is a
slow, confusing failure, so :func:`~aioload.sources.stores.store.open_store` refuses to build such
a store (:func:`require_credentials`) unless the caller passes credentials, in options or in
the environment, ``skip_signature=True``, a ``credential_provider`` or
``metadata_credentials=True``. The store's environment variables (``AWS_*``, ``GOOGLE_*``,
``AZURE_*``, ``AZURITE_*``: :func:`store_variables`) are also what a store rebuilt in a
worker process needs (:func:`store_environment`).

``AWS_PROFILE``: obstore reads no AWS profiles (``~/.aws/config``, ``~/.aws/credentials``),
so an S3 store with a profile set and no other credentials gets its credentials from boto3,
which reads them as the AWS command line does (:func:`profile_provider`, through obstore's
``obstore.auth.boto3.Boto3CredentialProvider``); without boto3 the store is refused, naming
what to install. The profile's chain never asks the instance-metadata service unless
``metadata_credentials=True``: the guard holds for profiles too.

Example::

    >>> require_credentials("s3://bucket/", "s3", {"skip_signature": True}, None, False)
    >>> sorted(store_variables()) == sorted(
    ...     name for name in os.environ if name.startswith(STORE_VARIABLE_PREFIXES))
    True
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from typing import Any, Literal

__all__ = [
    "STORE_VARIABLE_PREFIXES",
    "CloudKind",
    "has_credentials",
    "profile_provider",
    "require_credentials",
    "store_environment",
    "store_variables",
]

CloudKind = Literal["s3", "gcs", "azure"]
"""The stores that would ask a cloud's instance metadata for credentials."""

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


_CREDENTIALS: dict[CloudKind, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "s3": (_S3_CREDENTIALS, _S3_CREDENTIAL_ENV),
    "gcs": (_GCS_CREDENTIALS, _GCS_CREDENTIAL_ENV),
    "azure": (_AZURE_CREDENTIALS, _AZURE_CREDENTIAL_ENV),
}


def has_credentials(kind: CloudKind, options: Mapping[str, Any]) -> bool:
    """Whether ``options`` or the environment say where a ``kind`` store's credentials come from.

    Args:
        kind: the kind of store.
        options: the store's options (its ``config`` mapping included).

    Example::

        >>> has_credentials("s3", {"access_key_id": "k", "secret_access_key": "s"})
        True
    """
    keys, env = _CREDENTIALS[kind]
    if any(options.get(key) for key in keys) or any(os.environ.get(name) for name in env):
        return True
    return "config" in options and any(options["config"].get(key) for key in keys)


def require_credentials(
    url: str, kind: CloudKind, options: Mapping[str, Any], provider: Any, metadata: bool
) -> None:
    """Refuses to build a ``kind`` store for ``url`` that would ask the instance metadata.

    Args:
        url: the store's URL, for the message (redacted).
        kind: the kind of store.
        options: the store's options (its ``config`` mapping included).
        provider: the ``credential_provider`` given, if any.
        metadata: ``metadata_credentials=True``: asking the instance metadata is meant.

    Raises:
        ValueError: no credentials in ``options`` or the environment, no provider, and
            ``metadata`` false; the message names what to pass.

    Example::

        require_credentials("s3://bucket/", "s3", options, None, False)
    """
    if metadata or provider is not None or has_credentials(kind, options):
        return
    keys, env = _CREDENTIALS[kind]
    raise ValueError(
        f"{url}: no credentials. Pass them in storage_options ({', '.join(keys[:2])}, ...) "
        f"or in the environment ({', '.join(env[:2])}, ...); {{'skip_signature': True}} for "
        "public data; a credential_provider; or {'metadata_credentials': True} to fetch them "
        "from the cloud's instance-metadata service (on a cloud VM). Without any of these "
        "the store would query that service at a link-local address on its first request."
    )


# The providers of botocore's chain that ask a metadata service: EC2's instance metadata
# (a link-local address) and the container's (only where ECS sets its variables, which
# obstore reads itself). A profile's chain keeps them only with metadata_credentials=True.
_METADATA_PROVIDERS = ("iam-role", "container-role")


def profile_provider(url: str, profile: str, metadata: bool) -> Any:
    """obstore's credential provider for the AWS profile ``profile``, through boto3.

    Args:
        url: the store's URL, for the messages (redacted).
        profile: the profile's name (``AWS_PROFILE``).
        metadata: ``metadata_credentials=True``: the profile's chain may ask the instance
            metadata; otherwise its metadata providers are removed.

    Raises:
        ValueError: boto3 is not installed (naming what to install), the profile is not
            found, or it holds no credentials.

    Example::

        provider = profile_provider("s3://bucket/", "dev", False)
    """
    try:
        import boto3
        import botocore.exceptions
        import botocore.session
        from obstore.auth.boto3 import Boto3CredentialProvider
    except ImportError as error:
        raise ValueError(
            f"{url}: AWS_PROFILE={profile!r} is set, but obstore reads no AWS profiles and "
            "aioload reads them through boto3, which is not installed: pip install "
            "'aioload-data[aws]' (boto3; obstore's credential provider "
            "obstore.auth.boto3.Boto3CredentialProvider then reads the profile), or pass "
            "credentials in storage_options or the environment (AWS_ACCESS_KEY_ID, ...)"
        ) from error
    try:
        session = botocore.session.Session(profile=profile)
        chain = session.get_component("credential_provider")
        if not metadata:
            for name in _METADATA_PROVIDERS:
                chain.remove(name)
        return Boto3CredentialProvider(boto3.Session(botocore_session=session))
    except botocore.exceptions.ProfileNotFound as error:
        raise ValueError(
            f"{url}: the AWS profile {profile!r} (AWS_PROFILE) is not in the AWS config files "
            "(~/.aws/config, ~/.aws/credentials, or AWS_CONFIG_FILE, AWS_SHARED_CREDENTIALS_FILE)"
        ) from error
    except botocore.exceptions.BotoCoreError as error:
        raise ValueError(f"{url}: the AWS profile {profile!r} (AWS_PROFILE): {error}") from error
    except ValueError as error:  # Boto3CredentialProvider: the chain found nothing
        raise ValueError(
            f"{url}: the AWS profile {profile!r} (AWS_PROFILE) names neither keys nor a role, "
            "SSO or a credential_process; on a cloud VM, {'metadata_credentials': True} lets "
            "its chain ask the instance-metadata service"
        ) from error


# AZURITE_: the Azure emulator's address (AZURITE_BLOB_STORAGE_URL), read by obstore too.
STORE_VARIABLE_PREFIXES = ("AWS_", "GOOGLE_", "AZURE_", "AZURITE_")
"""How the environment variables obstore reads when it builds a store begin."""


def store_variables() -> dict[str, str]:
    """The store variables of ``os.environ`` now (:data:`STORE_VARIABLE_PREFIXES`).

    Example::

        saved = store_variables()     # where a store's location is made
    """
    return {
        name: value
        for name, value in os.environ.items()
        if name.startswith(STORE_VARIABLE_PREFIXES)
    }


@contextlib.contextmanager
def store_environment(saved: Mapping[str, str]) -> Iterator[None]:
    """The store variables of ``os.environ`` as ``saved`` has them, while a store is built.

    obstore reads them once, when a store is built; they are put back right after.

    Example::

        with store_environment(saved):     # in a worker process, say
            store, _ = open_store(url, **options)
    """
    before = store_variables()
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
