"""Reading a run of a shard's samples: one byte-range request, checked against the index.

A :class:`~aioload.sources.streams.split.Segment` that is not a whole shard is read with one
ranged GET from its first sample's offset (a header, where the tar reader can start) to
the end of its last sample. What comes back is checked against the shard's index, so that
an index that no longer fits its shard fails loudly instead of yielding the wrong samples:

- the object's size (every ranged answer gives it) must be the index's ``shard_size``;
- the samples must carry the keys the index lists for those positions, and be as many
  (checked by the reader, :meth:`~aioload.sources.ShardDataset.__aiter__`, as they come:
  :func:`key_mismatch` and :func:`count_mismatch` are its errors).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing

from aioload.sources.stores.reads import open_read
from aioload.sources.stores.store import StoreLocation
from aioload.sources.streams.split import Segment
from aioload.sources.tar.index import ShardIndex, ShardIndexError
from aioload.stats.source_counts import SourceCounter

__all__ = ["count_mismatch", "key_mismatch", "range_stream"]

_REBUILD = (
    "the index does not describe this shard (was the shard rewritten after its index?): "
    "write the index again (ShardDataset.write_indexes(overwrite=True), or ShardWriter)"
)


async def range_stream(
    location: StoreLocation,
    path: str,
    url: str,
    index: ShardIndex,
    segment: Segment,
    counts: SourceCounter,
) -> AsyncGenerator[bytes, None]:
    """The bytes of ``segment``'s samples, chunk by chunk as they arrive (counted).

    Args:
        location: the shard's store.
        path: the shard's path in it.
        url: the shard's URL for messages (redacted).
        index: the shard's index.
        segment: the samples to read.
        counts: where the bytes received are counted.

    Raises:
        ShardIndexError: the shard's size is not the index's.
        FileNotFoundError, PermissionError, ConnectionError, TimeoutError: as any read.
    """
    size, chunks = await open_read(
        location, path, url, counts, index.byte_range(segment.start, segment.stop)
    )
    async with aclosing(chunks):
        if size != index.shard_size:
            raise ShardIndexError(
                f"{url}: the shard is {size} bytes long, its index says {index.shard_size}: "
                + _REBUILD
            )
        async for chunk in chunks:
            yield chunk


def key_mismatch(
    url: str, index: ShardIndex, segment: Segment, position: int, key: str
) -> ShardIndexError:
    """The error for sample ``key`` read where ``index`` expects sample ``position``."""
    if position >= segment.stop:
        first = index.byte_range(segment.start, segment.stop)[0]
        return ShardIndexError(
            f"{url}: sample {key!r} comes after the {len(segment)} samples its index places "
            f"from byte {first}: " + _REBUILD
        )
    return ShardIndexError(
        f"{url}: sample {position} has key {key!r}, its index says "
        f"{index.keys[position]!r}: " + _REBUILD
    )


def count_mismatch(url: str, segment: Segment, position: int) -> ShardIndexError:
    """The error for a read of ``segment`` that ended before sample ``position``."""
    return ShardIndexError(
        f"{url}: {position - segment.start} samples where its index places {len(segment)} "
        f"(samples {segment.start} to {segment.stop - 1}): " + _REBUILD
    )
