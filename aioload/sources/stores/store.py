"""URLs to obstore stores, the credential guard, and errors that name the URL and key.

:func:`open_store` turns ``s3://``, ``gs://``, ``az://``, ``http(s)://``,
``file://`` and ``memory://`` URLs into an obstore store rooted at the bucket
(or host, or filesystem root) and the key prefix the URL names. Options come
from one ``storage_options={...}`` mapping (as fsspec and Hugging Face ``datasets``
take them; every source of :mod:`aioload.sources` takes the same one) or from the
environment variables obstore reads itself (``AWS_ACCESS_KEY_ID``,
``AWS_ENDPOINT_URL``, ``AWS_REGION``, ...). A mapping, not keyword arguments: a
misspelt argument of a dataset is then a ``TypeError`` naming it, as in any Python
call, and only a misspelt store option is reported as one (also a ``TypeError``).

Why a guard: an S3, GCS or Azure store built without credentials asks the
cloud's instance-metadata service for them, at a link-local address, on its
first request. Off a cloud VM that is a slow, confusing failure (and traffic
to an address nobody meant to reach), so :func:`open_store` refuses to build
such a store unless the caller passes credentials, ``skip_signature=True``
(public data), a ``credential_provider``, or ``metadata_credentials=True``
(on a cloud VM, to use its role).

Why translate errors: obstore's exceptions carry a long debug dump and name the
path relative to the store. :func:`translate` turns them into the built-in
type a user catches (``FileNotFoundError``, ``PermissionError``,
``ConnectionError``, ``TimeoutError``, ``ValueError``) with a one-line message
naming the full URL of the object, and keeps obstore's error as the cause.
Every URL in a message passes through :func:`~aioload.urls.redact_url`
first: a password in a URL's userinfo is shown as ``***``.

This module parses the URL and the options and builds the store; the credential guard is in
:mod:`aioload.sources.stores.credentials` and the translation of errors in
:mod:`aioload.sources.stores.errors`, whose public functions are importable from here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

import obstore
import obstore.exceptions
from obstore.store import (
    AzureStore,
    GCSStore,
    HTTPStore,
    LocalStore,
    MemoryStore,
    ObjectStore,
    S3Store,
)

from aioload.sources.stores.budget import RequestBudget, check_rate
from aioload.sources.stores.credentials import (
    has_credentials,
    profile_provider,
    require_credentials,
    store_environment,
    store_variables,
)
from aioload.sources.stores.errors import (
    error_summary,
    is_transient,
    raise_translated,
    redact_error,
    translate,
)
from aioload.sources.stores.hedge import Hedge, check_hedge
from aioload.sources.stores.identity import store_identity
from aioload.urls import redact_url

__all__ = [
    "DEFAULT_RETRY_CONFIG",
    "StoreLocation",
    "StoreLocations",
    "is_transient",
    "join_key",
    "open_store",
    "raise_translated",
    "store_url",
    "translate",
]

DEFAULT_RETRY_CONFIG: dict[str, Any] = {
    "max_retries": 5,
    "backoff": {
        "init_backoff": timedelta(milliseconds=50),
        "max_backoff": timedelta(seconds=2),
        "base": 2,
    },
    "retry_timeout": timedelta(seconds=30),
}
"""obstore's retry of transient failures (5xx, 429, connection errors, timeouts) in aioload.

obstore's own default (10 retries over up to 3 minutes) keeps an unreachable
endpoint silent for about a minute; this one gives up after about 2 seconds of
refused connections while still riding out a busy server. Pass
``retry_config=`` to change it.
"""

_S3_SCHEMES = ("s3", "s3a")
_AZURE_SCHEMES = ("az", "azure", "abfs", "abfss", "adl")
_SCHEMES = (*_S3_SCHEMES, "gs", *_AZURE_SCHEMES, "http", "https", "file", "memory")

_ENDPOINT_ENV = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT")
_TRUE = ("1", "true", "yes", "on")


def open_store(
    url: str, *, storage_options: Mapping[str, Any] | None = None
) -> tuple[ObjectStore, str]:
    """The obstore store for ``url`` and the key prefix the URL names.

    The store is rooted at the bucket (``s3://``, ``gs://``), the container
    (``az://container``, the account from the options or the environment),
    the host (``http(s)://``), the filesystem root (``file://``) or a new
    in-memory store (``memory://``); the prefix is the rest of the URL's
    path, without a leading slash.

    Args:
        url: e.g. ``"s3://bucket/train/"``, ``"gs://bucket/shards"``,
            ``"http://127.0.0.1:8000/data"``, ``"file:///data/train"``.
        storage_options: the store's options, else from the environment (obstore reads
            the ``AWS_*``, ``GOOGLE_*``, ``AZURE_*`` variables): ``endpoint``,
            ``access_key_id``, ``secret_access_key``, ``session_token``,
            ``region``, ``skip_signature`` (anonymous requests), any other key
            of obstore's store configuration; ``allow_http`` (plain-HTTP
            endpoints; on by itself for an ``http://`` endpoint or URL),
            ``client_options``, ``retry_config`` (its keys override those
            of :data:`DEFAULT_RETRY_CONFIG`), ``credential_provider``, and
            ``metadata_credentials=True`` to let obstore fetch credentials
            from the cloud's instance-metadata service.

    Raises:
        ValueError: an unsupported or malformed URL, or no credentials for a
            cloud store (see the module docstring).
        TypeError: an option the store does not know, or ``storage_options``
            that is not a mapping.

    Example::

        >>> store, prefix = open_store("memory:///train/")
        >>> prefix
        'train/'
        >>> store, prefix = open_store("s3://bucket/train", storage_options={
        ...     "endpoint": "http://127.0.0.1:8333", "access_key_id": "key",
        ...     "secret_access_key": "secret", "region": "us-east-1"})
        >>> prefix
        'train'
    """
    if not isinstance(url, str):
        raise TypeError(f"the URL should be a str such as 's3://bucket/prefix'; got {url!r}")
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    shown = redact_url(url)  # the URL in messages
    if scheme not in _SCHEMES:
        raise ValueError(
            f"unsupported URL {shown!r}: the scheme should be one of "
            f"{', '.join(s + '://' for s in _SCHEMES)}"
        )
    options = _storage_options(storage_options)
    metadata = bool(options.pop("metadata_credentials", False))
    client: Any = dict(options.pop("client_options", None) or {})
    allow_http = options.pop("allow_http", None)
    retry = {**DEFAULT_RETRY_CONFIG, **(options.pop("retry_config", None) or {})}
    common: dict[str, Any] = {"retry_config": retry}
    provider = options.pop("credential_provider", None)
    path = parts.path.lstrip("/")
    try:
        if scheme in ("file", "memory"):
            _no_options(shown, options)
            if scheme == "file":
                if parts.netloc not in ("", "localhost"):
                    raise ValueError(f"a file:// URL names no host; got {shown!r}")
                return LocalStore(), path
            return MemoryStore(), path
        if scheme in ("http", "https"):
            _no_options(shown, options)
            if not parts.netloc:
                raise ValueError(f"the URL {shown!r} names no host")
            if scheme == "http" and allow_http is None:
                allow_http = True  # the URL itself asks for plain HTTP
            _client_flag(client, allow_http)
            store = HTTPStore.from_url(
                f"{scheme}://{parts.netloc}", client_options=client or None, **common
            )
            return store, path
        if not parts.netloc:
            raise ValueError(f"the URL {shown!r} names no bucket (expected {scheme}://BUCKET/...)")
        if provider is not None:
            common["credential_provider"] = provider
        if scheme in _S3_SCHEMES:
            endpoint = options.get("endpoint") or _first_env(_ENDPOINT_ENV)
            if allow_http is None:
                if os.environ.get("AWS_ALLOW_HTTP", "").lower() in _TRUE:
                    allow_http = True
                elif isinstance(endpoint, str) and endpoint.startswith("http://"):
                    allow_http = True  # an explicit plain-HTTP endpoint (a local server)
            _client_flag(client, allow_http)
            profile = os.environ.get("AWS_PROFILE")
            if profile and provider is None and not has_credentials("s3", options):
                # obstore reads no profiles; credentials given otherwise win, as in the AWS CLI
                provider = common["credential_provider"] = profile_provider(
                    shown, profile, metadata
                )
            require_credentials(shown, "s3", options, provider, metadata)
            s3 = S3Store(parts.netloc, client_options=client or None, **common, **options)
            return s3, path
        _client_flag(client, allow_http)
        if scheme == "gs":
            require_credentials(shown, "gcs", options, provider, metadata)
            gcs = GCSStore(parts.netloc, client_options=client or None, **common, **options)
            return gcs, path
        # az://CONTAINER/path, the account from the options or AZURE_STORAGE_ACCOUNT_NAME.
        require_credentials(shown, "azure", options, provider, metadata)
        azure = AzureStore(parts.netloc, client_options=client or None, **common, **options)
        return azure, path
    except obstore.exceptions.UnknownConfigurationKeyError as error:
        raise TypeError(f"{shown}: {error_summary(error)}") from redact_error(error)
    except obstore.exceptions.BaseError as error:
        raise ValueError(f"{shown}: {error_summary(error)}") from redact_error(error)


def _storage_options(options: Any) -> dict[str, Any]:
    """``storage_options=`` as a dict of its own (None: no options), or a ``TypeError``."""
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise TypeError(
            "storage_options should be a mapping of store options, such as "
            f"{{'endpoint': ..., 'region': ...}}; got {type(options).__name__}"
        )
    for key in options:
        if not isinstance(key, str):
            raise TypeError(f"storage_options' keys should be str (option names); got {key!r}")
    return dict(options)


def _no_options(url: str, options: Mapping[str, Any]) -> None:
    if options:
        raise TypeError(
            f"{url}: unexpected store options {sorted(options)} (this kind of store takes "
            "only client_options, retry_config and allow_http)"
        )


def _client_flag(client: dict[str, Any], allow_http: Any) -> None:
    if allow_http is not None:
        if not isinstance(allow_http, bool):
            raise TypeError(f"allow_http should be a bool; got {allow_http!r}")
        client.setdefault("allow_http", allow_http)


def _first_env(names: tuple[str, ...]) -> str | None:
    for name in names:
        value = os.environ.get(name)
        if value:
            return value
    return None


def join_key(prefix: str, key: str) -> str:
    """``key`` under the directory ``prefix`` (``prefix`` may end with ``/`` or not).

    Example::

        >>> join_key("train", "0001.jpg"), join_key("train/", "0001.jpg"), join_key("", "a")
        ('train/0001.jpg', 'train/0001.jpg', 'a')
    """
    if not prefix:
        return key
    if prefix.endswith("/"):
        return prefix + key
    return f"{prefix}/{key}"


def store_url(store: ObjectStore) -> str:
    """The URL of ``store``'s root, for messages (``s3://bucket/``, ``http://host/`` ...).

    A password in the URL's userinfo is shown as ``***`` (see
    :func:`~aioload.urls.redact_url`).
    """
    return redact_url(_root_url(store))


def _root_url(store: ObjectStore) -> str:
    if isinstance(store, S3Store):
        return f"s3://{store.config.get('bucket', '?')}/"
    if isinstance(store, GCSStore):
        return f"gs://{store.config.get('bucket', '?')}/"
    if isinstance(store, AzureStore):
        return f"az://{store.config.get('container_name', '?')}/"
    if isinstance(store, HTTPStore):
        return str(store.url).rstrip("/") + "/"
    if isinstance(store, LocalStore):
        root = store.prefix
        return f"file://{'' if root is None else root}/"
    if isinstance(store, MemoryStore):
        return "memory:///"
    return f"{type(store).__name__}:"


class StoreLocation:
    """A store, the prefix its keys live under, and how to name its objects in messages.

    Picklable: a store built from a URL is built again (with its own client) in
    each process that unpickles it, on first use, with the store's environment
    variables (``AWS_*``, ``GOOGLE_*``, ``AZURE_*``) as they were when this
    location was made: a worker process (started by a fork server, perhaps
    before they were set) sees the same credentials and endpoint as the
    caller. A store given as an object travels as obstore pickles it.

    Attributes:
        identity: every setting that selects the store (bucket, endpoint,
            region, account ..., from the options and the environment; see
            :func:`~aioload.sources.stores.identity.store_identity`): two
            locations with the same identity read the same objects.
        hedge: when a slow read is sent again (``hedge=`` of the datasets), or None.
        budget: the requests a second its reads may send (``max_requests_per_second=``),
            or None.
    """

    # also what a location pickled before hedges and budgets unpickles with
    hedge: Hedge | None = None
    budget: RequestBudget | None = None

    def __init__(
        self,
        url_or_store: Any,
        options: Mapping[str, Any] | None,
        *,
        hedge: bool | float = False,
        budget: RequestBudget | None = None,
    ) -> None:
        hedge = check_hedge(hedge)
        self.hedge = Hedge(hedge) if hedge is not False else None
        self.budget = budget
        self._options = options = _storage_options(options)
        self._store: Any
        self._environment = store_variables()
        if isinstance(url_or_store, str):
            self.url: str | None = url_or_store
            self._store, self.prefix = open_store(url_or_store, storage_options=options)
            self.base = store_url(self._store)
        else:
            if options:
                raise TypeError(
                    f"storage_options {sorted(options)} were given with a store object; "
                    "build the store with them, or pass a URL"
                )
            _check_store(url_or_store)
            self.url = None
            self._store, self.prefix = url_or_store, ""
            self.base = store_url(url_or_store)
        # Once, here: every process that unpickles this location names its cache entries alike.
        self.identity = store_identity(self._store, self._environment)

    @property
    def store(self) -> Any:
        """The store (built in this process on first use)."""
        store = self._store
        if store is None:
            assert self.url is not None
            with store_environment(self._environment):
                store, _ = open_store(self.url, storage_options=self._options)
            self._store = store
        return store

    def key(self, key: str) -> str:
        """The store path of ``key`` (a key relative to the URL's prefix)."""
        return join_key(self.prefix, key)

    def describe(self, path: str) -> str:
        """The full URL of the object at store path ``path``, for messages (password hidden)."""
        return self.base + path

    def relative(self, path: str) -> str:
        """The key of store path ``path`` relative to the prefix."""
        prefix = self.prefix
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        return path[len(prefix) :] if path.startswith(prefix) else path

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        if isinstance(self._store, MemoryStore):
            raise TypeError(
                "a MemoryStore cannot be sent to worker processes (each would get an empty "
                "store): use num_workers=0, or a file:// or remote store"
            )
        if self.url is not None:
            state["_store"] = None  # every process builds its own client
        return state


class StoreLocations:
    """One :class:`StoreLocation` per store root (scheme and bucket or host), made on first
    use, for a dataset whose URLs may name several stores.

    Example:
        >>> locations = StoreLocations({})
        >>> location, key = locations.of("file:///tmp/train/shard-0.tar")
        >>> key, locations.of("file:///tmp/val.tar")[0] is location
        ('tmp/train/shard-0.tar', True)
    """

    def __init__(
        self,
        options: Mapping[str, Any] | None,
        *,
        hedge: bool | float = False,
        max_requests_per_second: float | None = None,
    ) -> None:
        self._options = _storage_options(options)
        self._hedge = check_hedge(hedge)
        rate = check_rate(max_requests_per_second)
        # one budget for every store root: the dataset's requests, wherever they go
        self._budget = None if rate is None else RequestBudget(rate)
        self._locations: dict[str, StoreLocation] = {}

    def of(self, url: str) -> tuple[StoreLocation, str]:
        """The location of ``url``'s store root, and ``url``'s key in it."""
        parts = urlsplit(url)
        root = f"{parts.scheme}://{parts.netloc}/"
        location = self._locations.get(root)
        if location is None:
            location = self._locations[root] = StoreLocation(
                root,
                self._options,
                hedge=getattr(self, "_hedge", False),
                budget=getattr(self, "_budget", None),
            )
        return location, parts.path.lstrip("/")


def _check_store(store: Any) -> None:
    kinds = (S3Store, GCSStore, AzureStore, HTTPStore, LocalStore, MemoryStore)
    if not isinstance(store, kinds):
        raise TypeError(
            "expected a URL (such as 's3://bucket/prefix') or an obstore store "
            f"({', '.join(k.__name__ for k in kinds)}); got {type(store).__name__}"
        )
