"""ObjectDataset: a map-style async dataset over the objects of a store.

Each item is one GET (or one ranged GET) awaited on the loop that fetches it:
the loader's loop with ``num_workers=0``, each worker's own loop otherwise,
where every worker builds its own obstore client on first use. Hundreds of
reads are in flight per loop (the loader's ``concurrency``), which is what a
latency-bound store needs.

A listing (:class:`~aioload.sources.objects.listing.ObjectListing`) is an async
sampler: it yields keys page by page as the store's paginated listing returns them, so
the first batch is fetched while the rest of a large bucket is still being listed. A
dataset without keys offers it to the loader itself (:meth:`ObjectDataset.default_sampler`, see
:mod:`aioload.samplers.offered`): ``DataLoader(ObjectDataset(url))`` lists the
prefix as it reads, and with ``shuffle=True`` collects the listing first
(:class:`~aioload.sources.objects.listing.ShuffledListing`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import obstore

from aioload.checks import is_integral
from aioload.data.datasets import Dataset
from aioload.samplers.shuffling import Rng
from aioload.sources.cache.local import LocalCache, entry_identity
from aioload.sources.decoders import Decoder, as_decoder
from aioload.sources.objects.listing import ObjectListing, ShuffledListing
from aioload.sources.stores.budget import RequestBudget, check_rate
from aioload.sources.stores.hedge import hedged
from aioload.sources.stores.reads import CountedReads
from aioload.sources.stores.store import StoreLocation, raise_translated
from aioload.stats.source_counts import SourceCounter
from aioload.urls import redact_url

__all__ = ["ObjectDataset"]

ByteRange = tuple[int, int | None]


def _check_range(byte_range: Any, what: str) -> ByteRange:
    if (
        not isinstance(byte_range, tuple)
        or len(byte_range) != 2
        or not is_integral(byte_range[0])
        or not (byte_range[1] is None or is_integral(byte_range[1]))
    ):
        raise TypeError(
            f"{what} should be a tuple (start, end) of ints (end exclusive, or None for the "
            f"rest of the object; a negative start with end None reads the last -start bytes); "
            f"got {byte_range!r}"
        )
    start, end = byte_range
    if end is None:
        if start == 0:
            raise ValueError(f"{what}=(0, None) reads the whole object: leave it None")
    elif start < 0 or end <= start:
        raise ValueError(f"{what} should have 0 <= start < end; got {byte_range!r}")
    return start, end


async def _fetch(
    location: StoreLocation, path: str, byte_range: ByteRange | None, counts: SourceCounter
) -> Any:
    """The object at ``path`` (or its byte range), from the store; errors name it."""
    store = location.store

    async def request() -> Any:
        if byte_range is None:
            return await (await obstore.get_async(store, path)).bytes_async()
        start, end = byte_range
        if end is not None:
            return await obstore.get_range_async(store, path, start=start, end=end)
        bound: Any = {"offset": start} if start >= 0 else {"suffix": -start}
        result = await obstore.get_async(store, path, options={"range": bound})
        return await result.bytes_async()

    try:
        data: Any = await hedged(location.hedge, request, counts, budget=location.budget)
    except Exception as error:
        raise_translated(error, location.describe(path))
    counts.received(len(data))
    return data


class ObjectDataset(CountedReads, Dataset[Any]):
    """A map-style async dataset: item ``key`` is the object at ``URL/key``, decoded.

    Args:
        url_or_store: a URL such as ``"s3://bucket/train/"`` (see
            :func:`~aioload.sources.open_store`) or an obstore store. Keys are
            relative to the URL's path.
        keys: the keys of the dataset, relative to the URL (then ``len`` works,
            and integer indices ``0 .. len-1`` name them, so the default and
            random samplers work). None: the keys are not known up front; the
            dataset lists them itself (see :meth:`default_sampler`): a plain
            ``DataLoader(dataset)`` iterates :meth:`listing`.
        prefix: with ``keys=None``, what :meth:`listing` lists: the keys that
            start with it (relative to the URL; default all).
        decode: turns an object's bytes (``bytes``, as ``json.loads`` and
            ``PIL.Image.open(io.BytesIO(data))`` take them) into a sample; runs where
            the fetch runs (in the worker with ``num_workers > 0``). A
            :class:`~aioload.sources.Decoder` (or a mapping of extension ->
            ``fn(bytes)``, merged over the default decoders) decodes each
            object by its key's extension: ``x.jpg`` as an image, ``x.npy``
            as an array... Default: the bytes as ``bytes``.
        byte_range: read only ``(start, end)`` of every object (end exclusive;
            ``(start, None)``: from ``start`` on; ``(-n, None)``: the last ``n``
            bytes). A key may also be a tuple ``(key, start, end)`` for a range
            of its own.
        cache_dir: a local folder that keeps every object read (each byte
            range apart), so that later reads of it come from disk and send
            the store no request (shared safely by workers and processes;
            see :class:`~aioload.sources.LocalCache`). Default: no cache.
        cache_limit: the most bytes the cache takes on disk: an int, or a
            size such as ``"50GB"``, ``"512MiB"``; least recently used
            objects go first. Default: no limit but the disk's.
        storage_options: the store's options, one mapping, when ``url_or_store`` is a
            URL: ``{"endpoint": ..., "region": ..., "access_key_id": ...}``, any option
            of :func:`~aioload.sources.open_store` (default: from the environment).
        hedge: send a read again when it is slow, and take the first answer (see
            :mod:`aioload.sources.stores.hedge`): True, after the 95th percentile of
            the store's recent reads; a float, after that many seconds; False (the
            default), never. At most about five hedges per hundred reads.
        max_requests_per_second: the most GET requests a second the dataset sends, all
            its copies in the loader's worker processes together (see
            :mod:`aioload.sources.stores.budget`). Default: no limit.

    Errors name the object's URL: a missing object raises ``FileNotFoundError``,
    a denied request ``PermissionError`` (neither is retried), a server or
    connection failure ``ConnectionError`` once obstore's retries are spent.

    Example::

        dataset = ObjectDataset("s3://bucket/images/", decode=decode_jpeg, storage_options={
            "endpoint": "http://127.0.0.1:8333", "access_key_id": "...",
            "secret_access_key": "..."})
        loader = DataLoader(dataset, batch_size=32)   # lists the keys as it reads
        async for batch in loader:
            ...
    """

    def __init__(
        self,
        url_or_store: Any,
        keys: Sequence[str] | None = None,
        *,
        prefix: str | None = None,
        decode: Callable[[Any], Any] | Mapping[str, Callable[[bytes], Any] | None] | None = None,
        byte_range: ByteRange | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | str | None = None,
        storage_options: Mapping[str, Any] | None = None,
        hedge: bool | float = False,
        max_requests_per_second: float | None = None,
    ) -> None:
        if keys is not None:
            if isinstance(keys, str):
                raise TypeError("keys should be a sequence of keys, not one str")
            if prefix is not None:
                raise ValueError(
                    "pass keys or prefix, not both: prefix says what listing() lists when "
                    "the keys are not given"
                )
            keys = list(keys)
            for key in keys[:1]:
                if not isinstance(key, str):
                    raise TypeError(f"keys should be str (relative to the URL); got {key!r}")
        if prefix is not None and not isinstance(prefix, str):
            raise TypeError(f"prefix should be a str; got {prefix!r}")
        decode = as_decoder(decode, "bytes -> sample")
        if cache_dir is None and cache_limit is not None:
            raise ValueError("cache_limit was given without cache_dir: name the cache's folder")
        rate = check_rate(max_requests_per_second)
        self._location = StoreLocation(
            url_or_store,
            storage_options,
            hedge=hedge,
            budget=None if rate is None else RequestBudget(rate),
        )
        self._keys = keys
        self.prefix = prefix or ""
        self.decode = decode
        self.byte_range = None if byte_range is None else _check_range(byte_range, "byte_range")
        self.cache = None if cache_dir is None else LocalCache(cache_dir, cache_limit)
        self._counts = SourceCounter()

    @property
    def keys(self) -> list[str] | None:
        """The keys given at construction (None when listed lazily)."""
        return self._keys

    def __len__(self) -> int:
        if self._keys is None:
            raise TypeError(
                f"{self!r} lists its keys as it goes and has no length: a DataLoader over it "
                "samples its listing (see default_sampler()), which needs no length; for one, "
                "pass keys= (e.g. keys=await dataset.listing().collect())"
            )
        return len(self._keys)

    def default_sampler(self, shuffle: bool, generator: Rng = None) -> Any:
        """The sampler a ``DataLoader`` given none takes its keys from.

        The protocol is described in :mod:`aioload.samplers.offered`. With ``keys``:
        None, the loader's own (indices, as for any sized dataset). Without:
        :meth:`listing`, which yields keys as the store lists them (the first batch is
        read while the rest is still being listed); with ``shuffle``, a
        :class:`~aioload.sources.objects.listing.ShuffledListing` of it, which collects
        the whole listing at the first epoch (a request per 1,000 keys, all keys in
        memory; kept, sorted, for the loader's life) and draws a new order from
        ``generator`` every epoch. Neither has a length: ``len(loader)`` raises, and
        ``max_skipped`` takes a count. A checkpoint resumes by listing again and
        dropping the keys already received, which is exact over an unchanged prefix (a
        shuffled one refuses a listing that changed, once it has collected it).

        Example::

            dataset = ObjectDataset("s3://bucket/images/", decode=decode_jpeg,
                                    storage_options=options)
            loader = DataLoader(dataset, batch_size=32, shuffle=True, generator=0)
        """
        if self._keys is not None:
            return None
        listing = self.listing()
        return ShuffledListing(listing, generator) if shuffle else listing

    def listing(self, prefix: str | None = None, *, chunk_size: int = 1000) -> ObjectListing:
        """An async sampler of the keys under ``prefix`` (default: the dataset's prefix).

        Args:
            prefix: list the keys that start with it (relative to the URL).
            chunk_size: keys per page requested from the store's listing.
        """
        return ObjectListing(self._location, self.prefix if prefix is None else prefix, chunk_size)

    async def __getitem__(self, key: Any) -> Any:
        byte_range = self.byte_range
        if isinstance(key, tuple):
            if len(key) != 3:
                raise TypeError(f"a ranged key should be (key, start, end); got {key!r}")
            key, byte_range = key[0], _check_range(key[1:], "a ranged key's (start, end)")
        if is_integral(key):
            keys = self._keys
            if keys is None:
                raise TypeError(
                    f"{self!r} has no keys list to index with {key!r}: use str keys, e.g. "
                    "from listing()"
                )
            key = keys[key]
        elif not isinstance(key, str):
            raise TypeError(f"a key should be a str (or an int index into keys); got {key!r}")
        location = self._location
        path = location.key(key)
        cache = self.cache
        if cache is None:
            data: Any = await _fetch(location, path, byte_range, self._counts)
        else:
            identity = entry_identity(location.describe(path), location)
            name = path.rpartition("/")[2]
            if byte_range is not None:
                identity += f" [{byte_range[0]}:{byte_range[1]}]"
                name += f".{byte_range[0]}-{byte_range[1]}"
            data = await cache.read(
                identity,
                name,
                functools.partial(_fetch, location, path, byte_range, self._counts),
                self._counts,
            )
        # bytes for every decoder, whatever the read returned (obstore's Bytes from the
        # store, bytes from the cache): json.loads and the like accept no other buffer
        data = bytes(data)
        decode = self.decode
        if decode is None:
            return data
        if isinstance(decode, Decoder):  # by the key's extension
            return decode.decode_field(
                path.rpartition("/")[2], data, key=key, url=location.describe(path)
            )
        return decode(data)

    def __repr__(self) -> str:
        where = self._location.url or self._location.base
        return f"ObjectDataset({redact_url(where)!r})"
