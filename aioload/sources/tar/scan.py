"""Building a shard's index from its bytes: one pass over the tar headers.

:func:`scan_tar` walks a tar stream as :func:`~aioload.sources.tar.reader.iter_tar` reads it
(the same header rules, long names, pax records and errors) and groups members into
samples as :func:`~aioload.sources.tar.reader.group_samples` does, but keeps only where each
sample starts and ends: member bodies are stepped over without being copied. What it
returns is the :class:`~aioload.sources.tar.index.ShardIndex` whose byte ranges, read
on their own, give exactly the samples a whole read gives.

A sample starts at the first header of its first member: a GNU long-name or pax header
before the member's own header belongs to it, so that a read starting there names the
member as a read from the archive's start does.
"""

from __future__ import annotations

import tarfile
from collections.abc import AsyncIterator
from contextlib import aclosing

from aioload.errors import TarFormatError
from aioload.sources.tar.index import ShardIndex
from aioload.sources.tar.reader import split_name, walk_tar

__all__ = ["scan_tar"]

_REGULAR = frozenset(tarfile.REGULAR_TYPES)


class _Cursor:
    """Reads headers out of an async iterator of chunks and steps over bodies."""

    def __init__(self, chunks: AsyncIterator[bytes]) -> None:
        self._chunks = chunks
        self._view = memoryview(b"")
        self.offset = 0  # bytes consumed so far

    async def _more(self) -> bool:
        chunk = await anext(self._chunks, None)
        if chunk is None:
            return False
        self._view = memoryview(chunk).cast("B")
        return True

    async def read(self, size: int) -> bytes:
        """``size`` bytes, or fewer at the end of the stream."""
        parts = []
        want = size
        while want:
            if not self._view and not await self._more():
                break
            piece = self._view[:want]
            self._view = self._view[len(piece) :]
            parts.append(bytes(piece))
            want -= len(piece)
        self.offset += size - want
        return b"".join(parts)

    async def skip(self, size: int) -> int:
        """Steps over ``size`` bytes (fewer at the end of the stream); returns how many."""
        want = size
        while want:
            if not self._view and not await self._more():
                break
            step = min(want, len(self._view))
            self._view = self._view[step:]
            want -= step
        self.offset += size - want
        return size - want

    async def drain(self) -> None:
        """Counts the rest of the stream (the blocks after the end-of-archive marker)."""
        self.offset += len(self._view)
        self._view = memoryview(b"")
        async for chunk in self._chunks:
            self.offset += memoryview(chunk).nbytes


async def scan_tar(chunks: AsyncIterator[bytes], where: str) -> ShardIndex:
    """The index of the tar shard whose bytes ``chunks`` yields, read to its end.

    Args:
        chunks: the whole shard, in chunks of any size (bytes-like).
        where: the shard's URL, for error messages (already redacted).

    Raises:
        TarFormatError: as :func:`~aioload.sources.tar.reader.iter_tar` and
            :func:`~aioload.sources.tar.reader.group_samples` raise for the same shard.

    Example::

        index = await scan_tar(shard_stream, "s3://bucket/train-000017.tar")
        first, end = index.byte_range(10, 20)   # samples 10 to 19
    """
    cursor = _Cursor(chunks)
    keys: list[str] = []
    offsets: list[int] = []
    sizes: list[int] = []
    fields: set[str] = set()
    # The walk steps over member bodies; a sample starts where the member before it ended,
    # so that the headers in between (long names, pax records, long links) belong to it.
    async with aclosing(walk_tar(cursor, where, read_bodies=False)) as members:
        async for name, kind, _, _, begin, end in members:
            if kind not in _REGULAR:
                continue
            # group_samples' rules: skipped members leave the current sample open.
            key, field = split_name(name)
            if not field or name.rpartition("/")[2].startswith("."):
                continue
            if not keys or keys[-1] != key:
                keys.append(key)
                offsets.append(begin)
                sizes.append(end - begin)
                fields = {field}
                continue
            if field in fields:
                raise TarFormatError(f"{where}: sample {key!r} has two members for field {field!r}")
            fields.add(field)
            sizes[-1] = end - offsets[-1]
    await cursor.drain()
    return ShardIndex(keys, offsets, sizes, cursor.offset, where=where)
