"""Reading a dataset's shards: whole, a run of samples from a byte offset, samples again.

:class:`ShardReads` is how a :class:`~aioload.sources.ShardDataset` reads its shards, each
read checked as it comes:

- **whole** (:meth:`ShardReads.whole`): through the local cache when there is one (which
  keeps a shard as stored), decompressed when the shard is compressed;
- **a run** of a stream's samples (:meth:`ShardReads.run`): with its index, one
  byte-range request from the run's first sample (:func:`~.segments.range_stream`), the
  keys checked against the index; without one, from the run's first byte to the shard's
  end (or from the start of a compressed shard, the samples before the run passed over);
- **samples again** (:meth:`ShardReads.refs`), those a checkpoint's shuffle buffer names:
  one ranged GET per run of neighbours (:func:`range_chunks`), each sample's byte offset
  and key checked.

:func:`group_spans` groups tar members into samples as
:func:`~aioload.sources.tar.reader.group_samples` does, and gives each sample's bytes in its
shard (what a checkpoint records). Every read is counted as bytes from the store.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import aclosing
from typing import Any

from aioload.errors import TarFormatError
from aioload.sources.cache.local import LocalCache, entry_identity
from aioload.sources.decompress import Compression, decompressed
from aioload.sources.stores.reads import open_read
from aioload.sources.stores.store import StoreLocation
from aioload.sources.streams.split import Segment
from aioload.sources.streams.state import Ref, Run, ShardStateError
from aioload.sources.tar.index import ShardIndex
from aioload.sources.tar.reader import group_samples, iter_tar, iter_tar_spans, split_name
from aioload.sources.tar.segments import count_mismatch, key_mismatch, range_stream
from aioload.stats.source_counts import SourceCounter
from aioload.urls import redact_url

__all__ = ["ShardReads", "group_spans", "range_chunks", "stored_shard"]


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


async def stored_shard(
    location: StoreLocation, path: str, url: str, counts: SourceCounter, offset: int = 0
) -> AsyncGenerator[bytes, None]:
    """The stored bytes of one shard from ``offset``, chunk by chunk as they arrive (counted;
    errors name it)."""
    _, chunks = await open_read(location, path, url, counts, offset)
    async with aclosing(chunks):
        async for chunk in chunks:
            yield chunk


class ShardReads:
    """How a dataset's shards are read (see the module docstring).

    Args:
        urls: the shards' URLs (messages show them with passwords as ``***``).
        objects: each shard's store and path in it.
        compressions: how each shard is stored (``"none"``: a plain tar).
        cache: the local cache whole shards are read through (None: the store).
        counts: where the reads are counted.

    Example::

        reads = ShardReads(urls, objects, compressions, cache, counts)
        async for sample in reads.samples(0): ...      # shard 0's samples, as they arrive
    """

    def __init__(
        self,
        urls: Sequence[str],
        objects: Sequence[tuple[StoreLocation, str]],
        compressions: Sequence[Compression],
        cache: LocalCache | None,
        counts: SourceCounter,
    ) -> None:
        self.urls = urls
        self.objects = objects
        self.compressions = compressions
        self.cache = cache
        self.counts = counts

    def rest_of_shard(self, url: str, left: Run) -> str:
        """How a skip record names what a shard's failed read lost (``left``: the run left)."""
        if self.compressions[left.shard] == "none":
            return f"{url}: the rest of the shard, from byte {left.offset}"
        return (
            f"{url}: the rest of the shard, from sample {left.start + 1} "
            f"(byte {left.offset} of the decompressed tar)"
        )

    def whole(self, number: int) -> AsyncGenerator[bytes, None]:
        """The tar of shard ``number``, decompressed if it is compressed: from the local
        cache if there is one (which keeps the bytes as stored), else the store."""
        url = redact_url(self.urls[number])
        location, path = self.objects[number]
        counts, cache = self.counts, self.cache
        stored = (
            stored_shard(location, path, url, counts)
            if cache is None
            else cache.stream(
                entry_identity(url, location),
                path.rpartition("/")[2],
                functools.partial(open_read, location, path, url, counts),
                counts,
            )
        )
        compression = self.compressions[number]
        return stored if compression == "none" else decompressed(stored, compression, url)

    async def samples(self, number: int) -> AsyncGenerator[dict[str, Any], None]:
        """The samples of shard ``number``, as its bytes arrive.

        Their ``__url__``, as every message, shows the URL's password as ``***``.
        """
        url = redact_url(self.urls[number])
        stream = self.whole(number)
        # Closed innermost last, whatever ends the iteration (the end, a break, an error).
        async with (
            aclosing(stream) as stream,
            aclosing(iter_tar(stream, url)) as members,
            aclosing(group_samples(members, url)) as grouped,
        ):
            async for sample in grouped:
                yield sample

    async def run(
        self, run: Run, index: ShardIndex | None
    ) -> AsyncGenerator[tuple[Any, Ref, bool], None]:
        """The samples of ``run`` with their refs, as they arrive (checked by ``index``).

        A whole shard is read whole (through the cache, if any); part of one, with one
        byte-range request from ``run.offset``, its first sample's header: nothing
        before it is read again. Through the cache a part of a shard that has an index
        is read whole, to be kept, and the samples around the run are skipped; so is
        part of a compressed shard (no byte range reaches into it).
        """
        if run.empty:
            return
        shard = run.shard
        url = redact_url(self.urls[shard])
        location, path = self.objects[shard]
        compressed = self.compressions[shard] != "none"
        before = 0  # where the sample before ends
        stop = run.stop
        if index is not None:
            stop = len(index) if stop == -1 else stop
            if stop > len(index) or (
                run.start < len(index) and run.offset != index.offsets[run.start]
            ):
                raise ShardStateError(
                    f"shard stream state: {url} has no sample {run.start} at byte {run.offset} "
                    f"(its index has {len(index)} samples): the state is of other shards"
                )
            whole = run.start == 0 and stop == len(index)
            if self.cache is not None or whole:
                read, first, stream = Segment(shard, 0, len(index)), 0, self.whole(shard)
            else:
                read, first = Segment(shard, run.start, stop), run.offset
                stream = range_stream(location, path, url, index, read, self.counts)
        elif compressed:
            # No byte range into a compressed shard: from its start, the samples before the
            # run passed over (and the run's first checked to be where the state says).
            read, first, stream = Segment(shard, 0, stop), 0, self.whole(shard)
        else:
            read, first = Segment(shard, run.start, stop), run.offset
            stream = (
                self.whole(shard)
                if first == 0
                else stored_shard(location, path, url, self.counts, first)
            )
        position = read.start
        async with (
            aclosing(stream) as chunks,
            aclosing(iter_tar_spans(chunks, url, start=first)) as members,
            aclosing(group_spans(members, url)) as grouped,
        ):
            async for sample, begin, end, last in grouped:
                key = sample["__key__"]
                if index is not None and (position >= read.stop or key != index.keys[position]):
                    raise key_mismatch(url, index, read, position, key)
                if compressed and position == run.start and not before <= run.offset <= begin:
                    raise _other_shard(url, run)  # the run starts where no sample does
                before = end
                if position >= run.start and (stop == -1 or position < stop):
                    yield sample, (shard, position, begin, end, key), stop == -1 and last
                position += 1
                if stop != -1 and position >= stop and index is None:
                    return  # a run cut from a shard without its index: the rest is another's
        if index is not None and position != read.stop:
            raise count_mismatch(url, read, position)
        if compressed and position < run.start:
            raise _other_shard(url, run)  # the shard ends before the run's first sample

    async def refs(self, group: list[Ref]) -> dict[tuple[int, int], Any]:
        """The samples of ``group``, refs of one shard, read again: one ranged GET from the
        first to the end of the last (neighbours), or a compressed shard whole."""
        shard, first, end = group[0][0], group[0][2], group[-1][3]
        url = redact_url(self.urls[shard])
        location, path = self.objects[shard]
        whole = self.compressions[shard] != "none"
        chunks = (
            self.whole(shard)
            if whole
            else range_chunks(location, path, url, first, end, self.counts)
        )
        found: dict[tuple[int, int], Any] = {}
        async with (
            aclosing(chunks),
            aclosing(iter_tar_spans(chunks, url, start=0 if whole else first)) as members,
            aclosing(group_spans(members, url)) as grouped,
        ):
            wanted = iter(group)
            ref = next(wanted, None)
            async for sample, begin, _, _ in grouped:
                if whole and ref is not None and begin < ref[2]:
                    continue  # a compressed shard's samples before the next one wanted
                if ref is None or ref[2] != begin or ref[4] != sample["__key__"]:
                    raise ShardStateError(
                        f"shard stream state: {url} has sample {sample['__key__']!r} at "
                        f"byte {begin}, the state expects {ref!r}: was the shard rewritten?"
                    )
                found[ref[0], ref[1]] = sample
                ref = next(wanted, None)
                if ref is None:
                    return found
        raise ShardStateError(f"shard stream state: {url} ends before the samples the state names")


def _other_shard(url: str, run: Run) -> ShardStateError:
    return ShardStateError(
        f"shard stream state: {url} has no sample {run.start} at byte {run.offset}: the state "
        "is of other shards"
    )
