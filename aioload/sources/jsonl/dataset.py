"""JsonLinesDataset: an iterable async dataset over JSON-lines files in a store, streamed.

A file is a ``.jsonl`` or ``.ndjson`` file (one JSON value per line), or one compressed
as a whole: gzip (``.jsonl.gz``, ``.ndjson.gz``, and ``.json.gz`` as C4 names its files;
concatenated members and zero padding too, as ``gzip -d`` reads them), zstd
(``.jsonl.zst``; several frames too; needs ``pip install 'aioload-data[jsonl]'``), bz2
(``.jsonl.bz2``) or xz (``.jsonl.xz``), the compression told by the name, or by
``compression=`` for any name. Each file is streamed: its lines come while the rest of
it is still arriving, and a read holds a chunk of it at a time, never the whole file
(:mod:`.jsonl_lines`).

A sample is the value ``json.loads`` makes of a line, passed through ``decode``. Lines end
with ``\\n`` or ``\\r\\n``; the last may have no newline; a UTF-8 byte order mark at a
file's start is ignored. A blank line (only whitespace) is no sample, but it is counted
as a line: line numbers, in messages and checkpoints, are the file's own.

How an epoch is shared out: the files are put in order — the given order, or a
permutation drawn from ``(seed, epoch)`` with ``shuffle_files`` — and rank ``r`` of
``world_size`` takes files ``r, r + world_size, ...``, worker ``w`` of ``num_workers``
every ``num_workers``-th file of its rank's (as ``ShardDataset(split="shards")`` shares
shards). Ranks and workers get what their files hold: the dataset has no length. One
epoch yields every line of every file once across all ranks and workers. A shuffle
buffer of ``shuffle_buffer`` samples (seeded per epoch, rank and worker) mixes lines
across neighbouring files; ``files_in_flight`` files are read at once, one line from
each in turn.

Splits, epochs and checkpoints are every stream dataset's
(:class:`~aioload.sources.streams.dataset.StreamDataset`), and the stream is the shard
stream's (:mod:`aioload.sources.streams.tracked`, :mod:`~aioload.sources.streams.state`,
:mod:`~aioload.sources.streams.faults`): a run is lines ``start`` to ``stop - 1`` of a file,
the first at byte ``offset``; a ref is ``[file, line, first byte, end byte, key]`` (the
key: a checksum of the line, checked when the line is read again). For a compressed file
the bytes are positions in the decompressed stream. So a checkpoint is plain JSON,
resumes exactly, and re-splits over other worker counts (``resume_streams``) or the ranks
of a job of another size (``merge_states``). A resumed uncompressed file is read from its
next line's first byte (one ranged GET); a compressed one is read again from its start,
decompressed, and the lines already delivered are passed over.

Parsing (``json.loads``, then ``decode``) happens after the shuffle buffer, so that under
the loader's ``on_error='skip'`` a line that does not parse is skipped alone (recorded
with its file, line number and, uncompressed, byte offset); a file that cannot be read
is retried from its next line while its errors are transient and skipped from the line
where it failed otherwise. Without the policy these raise, naming the file and line.
"""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from contextlib import aclosing
from functools import partial
from typing import Any
from urllib.parse import urlsplit

from aioload.faults.guard import StreamGuard
from aioload.old_paths import upgrade_objects
from aioload.sources.cache.local import LocalCache, entry_identity
from aioload.sources.decompress import COMPRESSIONS, Compression, decompressed, zstd_decompressor
from aioload.sources.jsonl.lines import SUFFIXES, compression_of, is_blank, numbered_lines
from aioload.sources.stores.braces import expand_urls
from aioload.sources.stores.reads import STREAM_CHUNK, CountedReads, open_read
from aioload.sources.stores.store import StoreLocation, StoreLocations
from aioload.sources.streams.dataset import StreamDataset, check_count
from aioload.sources.streams.faults import decoded, guarded_runs
from aioload.sources.streams.state import Ref, Run, ShardStateError, StreamState, check_state
from aioload.sources.streams.tracked import OpenRun, reread, resumed_stream
from aioload.stats.source_counts import SourceCounter
from aioload.urls import redact_url
from aioload.worker_info import get_worker_info

__all__ = ["JSONL_STATE_FORMAT", "JsonLinesDataset"]

JSONL_STATE_FORMAT = "aioload.jsonl-stream"
"""The ``"format"`` field of a JsonLinesDataset's stream state."""

LineRead = AsyncGenerator[tuple[bytes, Ref, bool], None]


class JsonLinesDataset(CountedReads, StreamDataset[StreamState]):
    """Streams the lines of JSON-lines files (``.jsonl``, ``.ndjson``; gzip, zstd, bz2, xz).

    A sample is ``decode(json.loads(line))`` (the parsed value without ``decode``); see
    the module docstring for blank lines, how files are split across ranks and workers,
    checkpoints and errors. Any store obstore reaches: ``s3://``, ``gs://``, ``az://``,
    ``http(s)://``, ``file://``, ``memory://``.

    Args:
        urls: the files' URLs, or one string with a brace pattern
            (``"s3://bucket/part-{0000..0099}.jsonl.gz"``). Unless ``compression`` is
            given, each name ends with ``.jsonl`` or ``.ndjson``, either one or ``.json``
            followed by ``.gz``, ``.zst``, ``.bz2`` or ``.xz``.
        decode: turns a parsed line into the sample the loader collates (a callable;
            runs where the file is read: in the worker with ``num_workers > 0``).
            Default: the parsed value as it is.
        shuffle_files: a new order of the files every epoch (from ``seed`` and the
            epoch; see :meth:`set_epoch`).
        shuffle_buffer: samples held in a shuffle buffer (0 or 1: none).
        seed: the seed of the shuffles.
        rank: this process's rank (default: ``torch.distributed``'s when it is
            initialised, else the ``RANK`` environment variable, else 0; see
            :func:`~aioload.rank_and_world_size`).
        world_size: the number of ranks (default: likewise, else ``WORLD_SIZE``, else 1).
        files_in_flight: files each worker (or the loader's loop) streams at once, one
            line from each in turn (deterministic). Default: 1.
        cache_dir: a local folder that keeps every file read whole, so that later epochs
            read it from disk (see :class:`~aioload.sources.LocalCache`).
        cache_limit: the most bytes the cache takes on disk (an int, or ``"50GB"``).
        chunk_size: the least bytes a read from the store hands on at once (default
            1 MiB; smaller: a file's first lines come sooner).
        compression: how every file is stored, whatever its name: ``"gzip"``,
            ``"zstd"``, ``"bz2"``, ``"xz"``, or None (plain lines). Default
            ``"infer"``: each file's by its name's suffix.
        storage_options: the stores' options, one mapping for every file's store:
            ``{"endpoint": ..., "region": ...}``, any option of
            :func:`~aioload.sources.open_store` (default: from the environment).
        hedge: send a read again when it is slow, and take the first answer (see
            :mod:`aioload.sources.stores.hedge`): True, after the 95th percentile of
            the store's recent reads; a float, after that many seconds; False (the
            default), never. At most about five hedges per hundred reads.
        max_requests_per_second: the most GET requests a second the dataset sends, all
            its copies in the loader's worker processes together (see
            :mod:`aioload.sources.stores.budget`). Default: no limit.

    Raises:
        ValueError, TypeError: no URL, a name with another suffix (and no
            ``compression``), a bad argument.
        ImportError: a zstd file without the ``zstandard`` package.

    Example::

        >>> import gzip, json, os, tempfile
        >>> from pathlib import Path
        >>> from aioload import DataLoader
        >>> folder = tempfile.TemporaryDirectory()
        >>> for n in range(2):
        ...     with gzip.open(os.path.join(folder.name, f"chat-{n:04d}.jsonl.gz"), "wt") as file:
        ...         for i in range(5):
        ...             print(json.dumps({"text": f"{n}-{i}"}), file=file)
        >>> urls = Path(folder.name).as_uri() + "/chat-{0000..0001}.jsonl.gz"  # or s3://...
        >>> dataset = JsonLinesDataset(urls, decode=lambda row: row["text"], shuffle_files=True,
        ...                            shuffle_buffer=4)
        >>> loader = DataLoader(dataset, batch_size=4, collate_fn=list,
        ...                     on_error="skip", max_skipped=100)
        >>> for epoch in range(2):
        ...     dataset.set_epoch(epoch)
        ...     texts = [text for batch in loader for text in batch]   # batches of 4 str
        ...     print(f"epoch {epoch}: {len(texts)} lines, {len(set(texts))} different")
        epoch 0: 10 lines, 10 different
        epoch 1: 10 lines, 10 different
        >>> folder.cleanup()
    """

    _whole_split, _unit_name, _state_prefix = "files", "file", "shard stream state"
    _shuffle_key, _in_flight_key = "shuffle_files", "files_in_flight"

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        decode: Callable[[Any], Any] | None = None,
        shuffle_files: bool = False,
        shuffle_buffer: int = 0,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        files_in_flight: int = 1,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | str | None = None,
        chunk_size: int = STREAM_CHUNK,
        compression: str | None = "infer",
        storage_options: Mapping[str, Any] | None = None,
        hedge: bool | float = False,
        max_requests_per_second: float | None = None,
    ) -> None:
        given = _check_compression(compression)
        self.urls = expand_urls(urls)
        if not self.urls:
            raise ValueError("JsonLinesDataset needs at least one file URL")
        if decode is not None and not callable(decode):
            raise TypeError(f"decode should be a callable (parsed line -> sample); got {decode!r}")
        if cache_dir is None and cache_limit is not None:
            raise ValueError("cache_limit was given without cache_dir: name the cache's folder")
        self._init_stream(
            shuffle_units=shuffle_files,
            shuffle_buffer=shuffle_buffer,
            seed=seed,
            rank=rank,
            world_size=world_size,
            in_flight=files_in_flight,
        )
        self.chunk_size = check_count("chunk_size", chunk_size, 1)
        self.decode = decode
        self.cache = None if cache_dir is None else LocalCache(cache_dir, cache_limit)
        self._counts = SourceCounter()
        stores = StoreLocations(
            storage_options, hedge=hedge, max_requests_per_second=max_requests_per_second
        )  # one location per store root
        self._objects: list[tuple[StoreLocation, str]] = []  # each file's store and path
        self._compressions: list[Compression] = []
        for url in self.urls:
            compression = compression_of(urlsplit(url).path) if given is None else given
            if compression is None:
                raise ValueError(
                    f"{redact_url(url)!r} is not a JSON-lines file: a name should end with "
                    f"{', '.join(SUFFIXES)} (the suffix says the compression), or pass "
                    "compression= ('gzip', 'zstd', 'bz2', 'xz', or None for plain lines)"
                )
            if compression == "zstd" and "zstd" not in self._compressions:
                zstd_decompressor()  # the extra is missing: say so now
            self._objects.append(stores.of(url))
            self._compressions.append(compression)

    @property
    def shuffle_files(self) -> bool:
        """Whether every epoch has a new order of the files."""
        return self.shuffle_units

    @property
    def files_in_flight(self) -> int:
        """The files each worker streams at once."""
        return self.units_in_flight

    def files(self, worker: int = 0, num_workers: int = 1) -> list[str]:
        """The URLs worker ``worker`` of ``num_workers`` of this rank reads this epoch.

        Example::

            JsonLinesDataset(["file:///d/a.jsonl", "file:///d/b.jsonl"], rank=1,
                             world_size=2).files()   # ['file:///d/b.jsonl']
        """
        plan = self._plan(self.epoch, self.rank, self.world_size, worker, num_workers)
        return [self.urls[run.shard] for run in plan]

    async def _stream(self, guard: StreamGuard | None) -> AsyncGenerator[Any, None]:
        info = get_worker_info()
        worker, num_workers = (0, 1) if info is None else (info.id, info.num_workers)
        items = await self._tracked(worker, num_workers, guard)
        if guard is not None:  # parsed after the shuffle, a failure skipped by its ref
            parsed = decoded(items, self.urls, self._parse, guard, self._describe)
            async with aclosing(parsed) as samples:
                async for sample in samples:
                    yield sample
            return
        async with aclosing(items):
            async for line, ref in items:
                try:
                    sample = self._parse(line)
                except Exception as error:
                    _, where = self._describe(line, ref)
                    error.add_note(f"raised while reading {where}")
                    raise
                yield sample

    def _parse(self, line: bytes) -> Any:
        value = json.loads(line)
        return value if self.decode is None else self.decode(value)

    def _describe(self, line: Any, ref: Ref | None) -> tuple[Any, str | None]:
        """A line's key in a skip record (``url:line``), and where it is."""
        if ref is None:
            return None, None
        url = redact_url(self.urls[ref[0]])
        where = f"{url}, line {ref[1] + 1}"
        if self._compressions[ref[0]] == "none":
            where += f", byte {ref[2]}"
        return f"{url}:{ref[1] + 1}", where

    async def _tracked(
        self, worker: int, num_workers: int, guard: StreamGuard | None
    ) -> AsyncGenerator[tuple[Any, Ref | None], None]:
        """This worker's stream, as ``(line, ref)``: fresh, or resumed from the state
        loaded last. Under ``guard`` its runs are read by :func:`guarded_runs`."""
        start = self._start(worker, num_workers, None)
        open_run: OpenRun = self._run_lines
        if guard is not None:
            open_run = guarded_runs(open_run, self.urls, guard, self._rest_of_file)
        stream = await resumed_stream(
            start.plan,
            start.resumed,
            open_run,
            self._reread,
            self.files_in_flight,
            self.shuffle_buffer,
            start.rng,
        )
        self._live = partial(stream.state, self.epoch, start.layout)
        return stream.items()

    def _rest_of_file(self, url: str, left: Run) -> str:
        where = f"{url}: the rest of the file, from line {left.start + 1}"
        if self._compressions[left.shard] == "none":
            where += f" (byte {left.offset})"
        return where

    # -- the stream's units and states (StreamDataset's hooks) -----------------------

    def _unit_count(self) -> int:
        return len(self.urls)

    def _check_state(self, state: Any) -> StreamState:
        return check_state(state, shards=len(self.urls), format=JSONL_STATE_FORMAT)

    def _state_json(self, state: StreamState) -> dict[str, Any]:
        return state.to_json(len(self.urls), format=JSONL_STATE_FORMAT)

    def _new_state(self, epoch: int, layout: dict[str, Any], runs: list[Run]) -> StreamState:
        return StreamState(epoch, layout, runs)

    # -- reading ----------------------------------------------------------------------

    def _open(
        self, number: int, byte_range: int | tuple[int, int] = 0
    ) -> AsyncGenerator[bytes, None]:
        """File ``number``'s stored bytes, whole (through the cache, if any), from an
        offset or a ``(first, end)`` range (from the store: one GET)."""
        url = redact_url(self.urls[number])
        location, path = self._objects[number]
        opener = partial(_open_file, location, path, url, self._counts, self.chunk_size)
        if self.cache is None or byte_range != 0:
            return _chunks(opener, byte_range)
        return self.cache.stream(
            entry_identity(url, location),
            path.rpartition("/")[2],
            opener,
            self._counts,
        )

    def _lines_from(
        self, number: int, line: int, offset: int
    ) -> AsyncGenerator[tuple[int, bytes, int, int], None]:
        """File ``number``'s lines from line ``line`` at byte ``offset`` (of its plain
        bytes); a compressed file's from its start (the caller passes lines over)."""
        url = redact_url(self.urls[number])
        compression = self._compressions[number]
        if compression != "none" or offset == 0:
            stream = decompressed(self._open(number), compression, url)
            return _closing_lines(stream, 0, 0)
        # From the byte before: it must end a line, or the state is of another file.
        return _closing_lines(_after_newline(self._open(number, offset - 1), url), line, offset)

    async def _run_lines(self, run: Run) -> LineRead:
        """The non-blank lines of ``run`` with their refs, as they arrive.

        ``last`` marks a file's last sample (a run to the file's end), so that a run
        drained to its end is not opened again on resume: a line is handed on once
        the next non-blank one (or the file's end) has arrived.
        """
        if run.empty:
            return
        number, stop = run.shard, run.stop
        url = redact_url(self.urls[number])
        if (run.start == 0) != (run.offset == 0):
            raise _other_file(url, run.start, run.offset)
        held: tuple[bytes, Ref] | None = None
        ended = True
        reached = run.start == 0
        try:
            async with aclosing(self._lines_from(number, run.start, run.offset)) as lines:
                async for line, content, first, end in lines:
                    if line < run.start:
                        continue
                    if line == run.start:
                        if first != run.offset:
                            raise _other_file(url, run.start, run.offset)
                        reached = True
                    if stop != -1 and line >= stop:
                        ended = False
                        break
                    if is_blank(content):
                        continue
                    if held is not None:
                        yield held[0], held[1], False
                    held = content, (number, line, first, end, _key(content))
        except Exception:
            if held is not None:  # a whole line read before the failure is not lost
                yield held[0], held[1], False
            raise
        if not reached:
            raise _other_file(url, run.start, run.offset)
        if held is not None:
            yield held[0], held[1], stop == -1 and ended

    async def _reread(self, refs: Sequence[Ref]) -> list[bytes]:
        """The lines ``refs`` name, read again: one ranged GET per run of neighbours in a
        plain file, one read of each compressed file
        (:func:`~aioload.sources.streams.tracked.reread`)."""
        return await reread(refs, lambda number: self._compressions[number] != "none", self._refs)

    async def _refs(self, group: list[Ref]) -> dict[tuple[int, int], bytes]:
        number = group[0][0]
        url = redact_url(self.urls[number])
        if self._compressions[number] == "none":
            first, end = group[0][2], group[-1][3]
            lines = _closing_lines(self._open(number, (first, end)), group[0][1], first)
        else:
            lines = self._lines_from(number, 0, 0)
        wanted = {ref[1]: ref for ref in group}
        found: dict[tuple[int, int], bytes] = {}
        async with aclosing(lines):
            async for line, content, first, end in lines:
                ref = wanted.pop(line, None)
                if ref is None:
                    continue
                if (first, end, _key(content)) != ref[2:]:
                    raise ShardStateError(
                        f"shard stream state: {url} has another line {line + 1} "
                        f"(bytes {first} to {end}) than the state expects {list(ref)!r}: "
                        "was the file rewritten?"
                    )
                found[number, line] = content
                if not wanted:
                    return found
        raise ShardStateError(f"shard stream state: {url} ends before the lines the state names")

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(upgrade_objects(state))  # a pickle of the old layout, too

    def __repr__(self) -> str:
        return f"JsonLinesDataset({len(self.urls)} files, e.g. {redact_url(self.urls[0])!r})"


def _check_compression(compression: str | None) -> Compression | None:
    """The compression ``compression=`` names for every file; None: each by its suffix."""
    if compression is None:
        return "none"
    if compression == "infer":
        return None
    if compression in COMPRESSIONS and compression != "none":
        return compression
    raise ValueError(
        "compression should be 'infer' (by each file's suffix), 'gzip', 'zstd', 'bz2', "
        f"'xz' or None (plain lines); got {compression!r}"
    )


def _key(content: bytes) -> str:
    """What a ref checks a line by when it is read again: its CRC-32, in hex."""
    return f"{zlib.crc32(content):08x}"


def _other_file(url: str, line: int, offset: int) -> ShardStateError:
    return ShardStateError(
        f"shard stream state: {url} has no line {line + 1} at byte {offset}: "
        "the state is of other files"
    )


async def _open_file(
    location: StoreLocation,
    path: str,
    url: str,
    counts: SourceCounter,
    chunk_size: int,
    byte_range: int | tuple[int, int] = 0,
) -> tuple[int, AsyncGenerator[bytes, None]]:
    """The file's size and its bytes from ``byte_range`` on, as they arrive (counted)."""
    return await open_read(location, path, url, counts, byte_range, chunk_size)


async def _chunks(
    opener: Callable[[int | tuple[int, int]], Any], byte_range: int | tuple[int, int]
) -> AsyncGenerator[bytes, None]:
    _, chunks = await opener(byte_range)
    async with aclosing(chunks):
        async for chunk in chunks:
            yield chunk


async def _after_newline(
    chunks: AsyncGenerator[bytes, None], url: str
) -> AsyncGenerator[bytes, None]:
    """``chunks`` without their first byte, which must be a newline (a line's end)."""
    first = True
    async with aclosing(chunks):
        async for chunk in chunks:
            if first and chunk:
                if chunk[:1] != b"\n":
                    raise ShardStateError(
                        f"shard stream state: {url} has no line starting where the state "
                        "says: the state is of other files"
                    )
                first, chunk = False, chunk[1:]
            if chunk:
                yield chunk


async def _closing_lines(
    chunks: AsyncGenerator[bytes, None], line: int, position: int
) -> AsyncGenerator[tuple[int, bytes, int, int], None]:
    """:func:`numbered_lines` of ``chunks``, closing them whatever ends the iteration."""
    async with aclosing(chunks):
        async for item in numbered_lines(chunks, line, position):
            yield item
