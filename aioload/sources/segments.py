"""Reading a run of a shard's samples: one byte-range request, checked against the index.

A :class:`~aioload.sources.rank_split.Segment` that is not a whole shard is read with one
ranged GET from its first sample's offset (a header, where the tar reader can start) to
the end of its last sample. What comes back is checked against the shard's index, so that
an index that no longer fits its shard fails loudly instead of yielding the wrong samples:

- the object's size (every ranged answer gives it) must be the index's ``shard_size``;
- the samples must carry the keys the index lists for those positions, and be as many.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import obstore

from aioload.sources.rank_split import Segment
from aioload.sources.shard_index import ShardIndex, ShardIndexError
from aioload.sources.stores import StoreLocation, raise_translated

__all__ = ["checked_samples", "range_stream"]

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
    chunk_size: int,
) -> AsyncGenerator[bytes, None]:
    """The bytes of ``segment``'s samples, chunk by chunk as they arrive.

    Args:
        location: the shard's store.
        path: the shard's path in it.
        url: the shard's URL for messages (redacted).
        index: the shard's index.
        segment: the samples to read.
        chunk_size: the least bytes obstore hands over at once.

    Raises:
        ShardIndexError: the shard's size is not the index's.
        FileNotFoundError, PermissionError, ConnectionError, TimeoutError: as any read.
    """
    first, end = index.byte_range(segment.start, segment.stop)
    try:
        result = await obstore.get_async(location.store, path, options={"range": (first, end)})
        size = result.meta["size"]
        chunks = aiter(result.stream(min_chunk_size=chunk_size))
    except Exception as error:
        raise_translated(error, url)
    if size != index.shard_size:
        raise ShardIndexError(
            f"{url}: the shard is {size} bytes long, its index says {index.shard_size}: " + _REBUILD
        )
    while True:
        try:
            chunk = await anext(chunks)
        except StopAsyncIteration:
            return
        except Exception as error:
            raise_translated(error, url)
        yield chunk


async def checked_samples(
    samples: AsyncIterator[dict[str, Any]], index: ShardIndex, segment: Segment, url: str
) -> AsyncGenerator[dict[str, Any], None]:
    """``samples`` (those of ``segment``), checked against the keys ``index`` lists.

    Raises:
        ShardIndexError: a sample whose key is not the index's, or a count that differs.
    """
    keys = index.keys
    position, stop = segment.start, segment.stop
    async for sample in samples:
        key = sample["__key__"]
        if position >= stop:
            raise ShardIndexError(
                f"{url}: sample {key!r} comes after the {len(segment)} samples its index "
                f"places from byte {index.byte_range(segment.start, stop)[0]}: " + _REBUILD
            )
        if key != keys[position]:
            raise ShardIndexError(
                f"{url}: sample {position} has key {key!r}, its index says "
                f"{keys[position]!r}: " + _REBUILD
            )
        position += 1
        yield sample
    if position != stop:
        raise ShardIndexError(
            f"{url}: {position - segment.start} samples where its index places "
            f"{len(segment)} (samples {segment.start} to {stop - 1}): " + _REBUILD
        )
