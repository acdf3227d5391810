"""Reads for resuming a shard stream: samples with their byte spans, and exact byte ranges.

:func:`group_spans` groups tar members into samples as
:func:`~aioload.sources.tar.reader.group_samples` does, and gives each sample's bytes in its
shard (what a checkpoint records). :func:`range_chunks` reads bytes ``first`` to
``end - 1`` of an object with one ranged GET (the shuffle buffer's samples, re-read on
resume), counted as every read is.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Any

from aioload.errors import TarFormatError
from aioload.sources.stores.reads import open_read
from aioload.sources.stores.store import StoreLocation
from aioload.sources.tar.reader import split_name
from aioload.stats.source_counts import SourceCounter

__all__ = ["group_spans", "range_chunks"]


async def group_spans(
    members: AsyncIterator[tuple[str, bytes, int, int]], url: str
) -> AsyncGenerator[tuple[dict[str, Any], int, int, bool], None]:
    """``(sample, first, end, last)`` for every sample of ``members`` (from ``iter_tar_spans``).

    ``first`` and ``end`` bound the sample's bytes; ``last`` is true for the stream's
    last sample (the shard's, for a read to its end).
    """
    sample: dict[str, Any] | None = None
    first = end = 0
    async for name, body, begin, stop in members:
        key, field = split_name(name)
        if not field or name.rpartition("/")[2].startswith("."):
            continue
        if sample is None or sample["__key__"] != key:
            if sample is not None:
                yield sample, first, end, False
            sample, first = {"__key__": key, "__url__": url}, begin
        elif field in sample:
            raise TarFormatError(f"{url}: sample {key!r} has two members for field {field!r}")
        sample[field] = body
        end = stop
    if sample is not None:
        yield sample, first, end, True


async def range_chunks(
    location: StoreLocation,
    path: str,
    url: str,
    first: int,
    end: int,
    counts: SourceCounter,
) -> AsyncGenerator[bytes, None]:
    """Bytes ``first`` to ``end - 1`` of ``path``, as they arrive (one ranged GET)."""
    _, chunks = await open_read(location, path, url, counts, (first, end))
    async with aclosing(chunks):
        async for chunk in chunks:
            yield chunk
