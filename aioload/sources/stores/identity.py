"""What tells one object store from another: the settings that select where a read goes.

Two datasets may name the same URL, ``s3://bucket/shard-0001.tar``, and read
two different objects: one from a local S3-compatible server, the other from
AWS; one from the Azure account ``a``, the other from account ``b``. A cache
that named its entries by the URL alone would serve one's bytes for the
other's. :func:`store_identity` spells out every setting that selects the
store, from the store's own configuration (the options a dataset was given,
under obstore's names) and from the environment variables obstore read when
it built the store:

- S3: the bucket, the endpoint (``endpoint``, ``aws_endpoint_url_s3``;
  ``AWS_ENDPOINT``, ``AWS_ENDPOINT_URL``, ``AWS_ENDPOINT_URL_S3``), the
  region (``region``, ``default_region``; ``AWS_REGION``,
  ``AWS_DEFAULT_REGION``: it selects AWS's endpoint), virtual-hosted style
  and S3 Express.
- Azure: the account (``account_name``; ``AZURE_STORAGE_ACCOUNT_NAME``), the
  container, the endpoint (``AZURE_STORAGE_ENDPOINT``, ``AZURE_ENDPOINT``),
  the emulator (``use_emulator``, ``AZURITE_BLOB_STORAGE_URL``) and Fabric's
  endpoint.
- GCS: the bucket, ``base_url`` (``GOOGLE_BASE_URL``), and the
  ``gcs_base_url`` a service-account file or key may carry.
- HTTP: the URL's host, and its user information (which may select what a
  server answers), as a digest.
- A prefix the store itself adds to every path (``S3Store(prefix=...)``).

Credentials play no other part: the same object, whoever reads it (a reader
without the right to read it fails, it does not read another object). Every
value that could be a secret appears only as a digest.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

from obstore.store import AzureStore, GCSStore, HTTPStore, LocalStore, MemoryStore, S3Store

__all__ = ["IDENTITY_VERSION", "store_identity"]

IDENTITY_VERSION = 2
"""Bumped whenever what :func:`store_identity` spells out changes (old cache entries go)."""

# (the store's configuration key, the environment variables obstore reads for it)
_S3_SETTINGS = (
    ("endpoint_url_s3", ("AWS_ENDPOINT_URL_S3",)),
    ("endpoint", ("AWS_ENDPOINT_URL", "AWS_ENDPOINT")),
    ("region", ("AWS_REGION",)),
    ("default_region", ("AWS_DEFAULT_REGION",)),
    ("virtual_hosted_style_request", ("AWS_VIRTUAL_HOSTED_STYLE_REQUEST",)),
    ("s3_express", ("AWS_S3_EXPRESS",)),
)
_AZURE_SETTINGS = (
    ("account_name", ("AZURE_STORAGE_ACCOUNT_NAME",)),
    ("endpoint", ("AZURE_STORAGE_ENDPOINT", "AZURE_ENDPOINT")),
    ("use_emulator", ("AZURE_STORAGE_USE_EMULATOR",)),
    ("use_fabric_endpoint", ("AZURE_USE_FABRIC_ENDPOINT",)),
    # The emulator's address: read by obstore when use_emulator is on; no configuration key.
    ("azurite_blob_storage_url", ("AZURITE_BLOB_STORAGE_URL",)),
)
_GCS_SETTINGS = (("base_url", ("GOOGLE_BASE_URL",)),)
# Where a service account (which may name its own base URL) is given.
_GCS_ACCOUNT_FILES = (
    ("service_account", ("GOOGLE_SERVICE_ACCOUNT", "GOOGLE_SERVICE_ACCOUNT_PATH")),
    ("application_credentials", ("GOOGLE_APPLICATION_CREDENTIALS",)),
)
_GCS_ACCOUNT_KEY = ("service_account_key", ("GOOGLE_SERVICE_ACCOUNT_KEY",))


def store_identity(store: Any, environment: Mapping[str, str]) -> str:
    """The settings that select ``store``, as one string (equal strings: the same store).

    Args:
        store: an obstore store.
        environment: the environment variables as they were when the store
            was built (obstore read them then).

    Example::

        >>> from obstore.store import S3Store
        >>> store_identity(S3Store("bucket", skip_signature=True),
        ...                {"AWS_ENDPOINT_URL": "http://127.0.0.1:8333"})
        'v2 s3 bucket=bucket AWS_ENDPOINT_URL=http://127.0.0.1:8333'
    """
    config: Mapping[str, Any] = getattr(store, "config", None) or {}
    parts = [f"v{IDENTITY_VERSION}"]
    if isinstance(store, S3Store):
        parts += ["s3", f"bucket={config.get('bucket', '')}"]
        parts += _settings(config, environment, _S3_SETTINGS)
    elif isinstance(store, AzureStore):
        parts += ["azure", f"container={config.get('container_name', '')}"]
        parts += _settings(config, environment, _AZURE_SETTINGS)
    elif isinstance(store, GCSStore):
        parts += ["gcs", f"bucket={config.get('bucket', '')}"]
        parts += _settings(config, environment, _GCS_SETTINGS)
        base = _service_account_base_url(config, environment)
        if base:
            parts.append(f"account_base_url={base}")
    elif isinstance(store, HTTPStore):
        address = urlsplit(str(store.url))
        userinfo, at, host = address.netloc.rpartition("@")
        parts += ["http", f"{address.scheme}://{host}{address.path.rstrip('/')}"]
        if at:
            parts.append(f"user={_digest(userinfo)}")
    elif isinstance(store, LocalStore):
        parts += ["file", str(store.prefix or "")]
    elif isinstance(store, MemoryStore):
        # Every memory store is a store of its own, in one process.
        parts += ["memory", f"{os.getpid()}:{id(store)}"]
    else:
        parts.append(type(store).__name__)
    prefix = getattr(store, "prefix", None)
    if prefix and not isinstance(store, LocalStore):
        parts.append(f"prefix={prefix}")
    return " ".join(parts)


def _settings(
    config: Mapping[str, Any],
    environment: Mapping[str, str],
    settings: Iterable[tuple[str, tuple[str, ...]]],
) -> list[str]:
    """``key=value`` for each setting given, the store's configuration first, then the
    environment (both are listed when both are set: which one obstore prefers is its own
    business, and two stores that differ in either are told apart)."""
    found = []
    for key, names in settings:
        value = config.get(key)
        if value is not None and value != "":
            found.append(f"{key}={value}")
        for name in names:
            if environment.get(name):
                found.append(f"{name}={environment[name]}")
    return found


def _service_account_base_url(config: Mapping[str, Any], environment: Mapping[str, str]) -> str:
    """The ``gcs_base_url`` a service account names (a local GCS emulator's), if any."""
    key_option, key_names = _GCS_ACCOUNT_KEY
    texts = [config.get(key_option)] + [environment.get(name) for name in key_names]
    for option, names in _GCS_ACCOUNT_FILES:
        for path in [config.get(option)] + [environment.get(name) for name in names]:
            if path:
                try:
                    with open(path, encoding="utf-8") as file:
                        texts.append(file.read(1 << 20))
                except (OSError, UnicodeDecodeError):
                    continue  # obstore reports it when it reads the file
    bases = []
    for text in texts:
        if not text:
            continue
        try:
            account = json.loads(text)
        except ValueError:
            continue
        if isinstance(account, dict) and isinstance(account.get("gcs_base_url"), str):
            bases.append(account["gcs_base_url"])
    return ",".join(bases)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]
