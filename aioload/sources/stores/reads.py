"""One GET of an object (whole, from an offset, or a byte range), its bytes as they arrive.

Every reader of shard bytes goes through :func:`open_read`: a whole shard,
the rest of one from a sample's offset, a ranged read of a run of samples or
of a shuffle buffer's samples. Errors are translated once, naming the object
(:func:`~aioload.sources.stores.store.raise_translated`), and every chunk is
counted as bytes received from the store
(:class:`~aioload.stats.source_counts.SourceCounter`), as is every request. A location
with a :class:`~aioload.sources.stores.hedge.Hedge` (``hedge=`` of the datasets) has a
slow request sent again (:func:`~aioload.sources.stores.hedge.hedged`: the time to the
answer's headers is what is hedged). :func:`read_bytes` and :func:`read_buffer` take a
body whole (a footer, a column chunk: nothing to do before the last byte is in).
:class:`CountedReads` hands a dataset's counts to the loader (its ``take_source_counts``
hook).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import obstore

from aioload.sources.stores.hedge import hedged
from aioload.sources.stores.store import StoreLocation, raise_translated
from aioload.stats.source_counts import SourceCounter, SourceCounts

__all__ = ["STREAM_CHUNK", "CountedReads", "open_read", "read_buffer", "read_bytes"]

STREAM_CHUNK = 1 << 20  # bytes: the least obstore hands over at once while streaming


async def open_read(
    location: StoreLocation,
    path: str,
    url: str,
    counts: SourceCounter,
    byte_range: int | tuple[int, int] = 0,
    chunk_size: int = STREAM_CHUNK,
) -> tuple[int, AsyncGenerator[bytes, None]]:
    """The object's size and its bytes, as they arrive.

    Args:
        location: the object's store.
        path: its path there.
        url: its URL for messages (redacted).
        counts: where the bytes received are counted.
        byte_range: an offset (0: the whole object; ``-n``: its last ``n`` bytes,
            or all of it if it is shorter) or ``(first, end)``, bytes ``first`` to
            ``end - 1``.
        chunk_size: the least bytes handed over at once.

    Example::

        size, chunks = await open_read(location, "train-000.tar", url, counts, 10240)
    """
    options = _range_options(byte_range)
    store = location.store

    def request() -> Any:
        return obstore.get_async(store, path, options=options)

    try:
        result = await hedged(location.hedge, request, counts, budget=location.budget)
        chunks = aiter(result.stream(min_chunk_size=chunk_size))
    except Exception as error:
        raise_translated(error, url)
    return int(result.meta["size"]), _received(chunks, url, counts)


async def _received(
    chunks: AsyncIterator[bytes], url: str, counts: SourceCounter
) -> AsyncGenerator[bytes, None]:
    while True:
        try:
            chunk = await anext(chunks)
        except StopAsyncIteration:
            return
        except Exception as error:
            raise_translated(error, url)
        counts.received(len(chunk))
        yield chunk


async def read_bytes(
    location: StoreLocation,
    path: str,
    url: str,
    counts: SourceCounter,
    byte_range: int | tuple[int, int] = 0,
) -> tuple[int, bytes]:
    """The object's size and the bytes of ``byte_range`` (see :func:`open_read`), joined.

    Example::

        size, tail = await read_bytes(location, "part-0.parquet", url, counts, -65536)
    """
    size, data = await read_buffer(location, path, url, counts, byte_range)
    return size, bytes(data)


async def read_buffer(
    location: StoreLocation,
    path: str,
    url: str,
    counts: SourceCounter,
    byte_range: int | tuple[int, int] = 0,
) -> tuple[int, memoryview]:
    """:func:`read_bytes`, the bytes as a view of the answer's own buffer (no copy).

    The body is taken whole, not streamed: where nothing is done with the bytes before
    the last one is in (a column chunk, a footer), streaming cost several times the
    transfer (5 ms against 1 ms for a MiB from a local file).

    Example::

        size, data = await read_buffer(location, "part-0.parquet", url, counts, (4, 1 << 20))
    """
    store = location.store
    options = _range_options(byte_range)

    def request() -> Any:
        return obstore.get_async(store, path, options=options)

    try:
        result = await hedged(location.hedge, request, counts, budget=location.budget)
        data = await result.bytes_async()
    except Exception as error:
        raise_translated(error, url)
    counts.received(len(data))
    return int(result.meta["size"]), memoryview(data)


def _range_options(byte_range: int | tuple[int, int]) -> Any:
    """obstore's options for ``byte_range`` (see :func:`open_read`)."""
    if isinstance(byte_range, tuple):
        return {"range": byte_range}
    if byte_range < 0:
        return {"range": {"suffix": -byte_range}}
    if byte_range:
        return {"range": {"offset": byte_range}}
    return None


class CountedReads:
    """What a dataset that reads a store counts, offered to the loader: the source-counts hook.

    A dataset class inherits it and keeps the counter its reads update (through
    :func:`open_read` and the local cache) as ``self._counts``; the loader takes the counts
    after every batch, where the dataset is read (see :mod:`aioload.stats.source_counts`).

    Example::

        >>> class Objects(CountedReads):
        ...     def __init__(self) -> None:
        ...         self._counts = SourceCounter()
        ...     def read(self, data: bytes) -> None:   # a read from the store
        ...         self._counts.received(len(data))
        >>> objects = Objects()
        >>> objects.read(b"x" * 4096)
        >>> objects.take_source_counts(), objects.take_source_counts()
        (SourceCounts(cache_hits=0, cache_misses=0, store_bytes=4096, requests=0, hedges=0), None)
    """

    _counts: SourceCounter

    def take_source_counts(self) -> SourceCounts | None:
        """Cache hits and misses and bytes from the store since the previous call (None:
        nothing since).

        The loader's hook for :meth:`DataLoader.stats() <aioload.DataLoader.stats>`
        (see :mod:`aioload.stats.source_counts`); counted in the process that reads.

        Example::

            dataset.take_source_counts()   # SourceCounts(cache_hits=0, ..., store_bytes=...)
        """
        return self._counts.take()
