"""IterableParquetDataset: Parquet rows streamed by row group, split by rank and worker.

How an epoch is shared out, as :class:`~aioload.sources.ShardDataset` shares shards, with
row groups for shards and rows for samples (:mod:`aioload.sources.streams.split`): the
row groups of all files (in the files' order, or a permutation drawn from ``(seed,
epoch)`` with ``shuffle_row_groups``, the same in every rank and worker) are split

- ``split="rows"`` (the default with ``world_size > 1``): every rank gets the same number
  of rows, ``DistributedSampler``'s way (``drop_last`` drops the tail, else it is padded
  by repeating rows from the epoch's start), in contiguous runs cut at row boundaries;
  each worker of a rank gets whole batches of its share. ``len(dataset)`` is the rows per
  rank and ``len(loader)`` the same on every rank.
- ``split="row_groups"`` (the default with one rank): rank ``r`` takes row groups ``r, r +
  world_size, ...``, worker ``w`` every ``num_workers``-th of those; no length.

Each worker reads ``read_ahead`` bytes of row groups ahead (only the requested columns;
a file's row groups with as few requests as their column chunks allow), and a row
shuffle buffer of ``shuffle_buffer`` rows, seeded per epoch, rank and worker, mixes rows
across neighbouring row groups (:mod:`aioload.sources.parquet.stream`).

Batches come straight from Arrow: the loader, batching automatically, reads whole batches
from :meth:`IterableParquetDataset.batch_stream` (see :mod:`aioload.data.row_block`), so
``default_collate`` gives a dict of numpy arrays without a Python object per row, and a
``collate_fn`` of yours gets the rows as dicts. Iterated itself (``async for``,
``batch_size=None``, a :class:`~aioload.sources.MixDataset`), it yields rows as dicts.

The stream checkpoints and resumes as every stream dataset does
(:class:`~aioload.sources.streams.dataset.StreamDataset`): ``state_dict``/``load_state_dict``,
exactly with the same layout; re-split over other workers
(:meth:`~IterableParquetDataset.resume_streams`) or the ranks of a job of another size
(:meth:`~IterableParquetDataset.merge_states`), each row left once. Under the loader's
fault policy a row group that cannot be read is retried, then skipped.

A file whose footer cannot be read — missing, truncated, not Parquet: what every rank and
worker sees alike — is left out of the row groups when the footers are read (a warning is
logged), so the split and ``len()`` are those of the readable files. Iterating without
the policy then raises its error, as a stream that fails at the footer; under
``on_error="skip"`` the file is skipped and recorded (key: its URL; the first worker of
each rank records it), and the other files are read. Other footer errors (a store that
does not answer) fail the stream under any policy: a file left out by one process and read
by another would break the split.
"""

from __future__ import annotations

import copy
import os
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from functools import partial
from typing import Any, Literal

from aioload.data.row_block import LazyState
from aioload.faults.guard import StreamGuard
from aioload.faults.policy import Skip
from aioload.sources.parquet.arrow_rows import ArrowRows
from aioload.sources.parquet.early import EarlyReads
from aioload.sources.parquet.files import ParquetFiles
from aioload.sources.parquet.state import READY_SLACK, RowsState, check_rows_state, refs_of
from aioload.sources.parquet.stream import FILES_AT_ONCE, Piece, RowStream, read_rows
from aioload.sources.sizes import parse_size
from aioload.sources.stores.reads import CountedReads
from aioload.sources.streams.dataset import StreamDataset
from aioload.sources.streams.split import Segment
from aioload.sources.streams.state import Run
from aioload.urls import redact_url
from aioload.worker_info import get_worker_info

__all__ = ["IterableParquetDataset"]

DEFAULT_READ_AHEAD = 64 << 20
"""Bytes of column chunks an IterableParquetDataset worker reads ahead, by default."""

_ROW_CHUNK = READY_SLACK  # rows taken at once when the stream is iterated row by row


class _Held:
    """The rows a row-by-row iteration has taken from its stream: yielded up to ``next``."""

    __slots__ = ("next", "piece")

    def __init__(self) -> None:
        self.piece: Piece | None = None
        self.next = 0


class IterableParquetDataset(CountedReads, StreamDataset[RowsState]):
    """Streams the rows of Parquet files by row group (see the module docstring).

    Args:
        urls_or_prefix: the files: a list of URLs, one URL with a brace pattern, or a
            prefix ending in ``/`` whose ``.parquet`` objects are listed (sorted).
        columns: the columns to read, in this order (None: every column).
        shuffle_row_groups: a new order of the row groups every epoch (from ``seed`` and
            the epoch; see :meth:`set_epoch`).
        shuffle_buffer: rows held in the shuffle buffer (0 or 1: none).
        seed: the seed of every shuffle.
        rank: this process's rank (default: ``torch.distributed``'s when it is
            initialised, else the ``RANK`` environment variable, else 0; see
            :func:`~aioload.rank_and_world_size`).
        world_size: the number of ranks (default: likewise, else ``WORLD_SIZE``, else 1).
        split: ``"rows"`` (the same number of rows on every rank) or ``"row_groups"``
            (whole row groups per rank and worker). Default: ``"rows"`` with
            ``world_size > 1``, else ``"row_groups"``.
        drop_last: with ``split="rows"``, drop the epoch's last ``rows % world_size``
            rows instead of padding (``DistributedSampler``'s choice).
        read_ahead: how far each worker reads ahead of its consumer: the bytes of the
            requested column chunks (compressed, as stored) of the row groups read at
            once, at least one row group; an int or a size such as ``"256MiB"``. Memory:
            these row groups decoded, a few times this as a rule. A file's row groups
            among them are fetched together, with as few requests as their chunks allow.
        cache_dir: a local folder that keeps every byte range read, so that later
            epochs read from disk (see :class:`~aioload.sources.LocalCache`).
        cache_limit: the most bytes the disk cache takes (``"50GB"``).
        storage_options: the stores' options, one mapping: ``{"endpoint": ...,
            "region": ...}``, any option of :func:`~aioload.sources.open_store`
            (default: from the environment).
        hedge: send a read again when it is slow, and take the first answer (see
            :mod:`aioload.sources.stores.hedge`): True, after the 95th percentile of
            the store's recent reads; a float, after that many seconds; False (the
            default), never. At most about five hedges per hundred reads.
        max_requests_per_second: the most GET requests a second the dataset sends, all
            its copies in the loader's worker processes together (see
            :mod:`aioload.sources.stores.budget`). Default: no limit.

    Example::

        dataset = IterableParquetDataset("s3://bucket/table/", columns=["text", "label"],
                                         shuffle_row_groups=True, shuffle_buffer=10_000,
                                         storage_options=options)
        loader = DataLoader(dataset, batch_size=256, num_workers=2)
        for epoch in range(3):
            dataset.set_epoch(epoch)
            for batch in loader:       # {"text": [...256 str], "label": array(256)}
                ...
    """

    _whole_split, _sized_split, _unit_name = "row_groups", "rows", "row group"
    _shuffle_key, _state_prefix = "shuffle_row_groups", "Parquet stream state"
    split: Literal["rows", "row_groups"]

    def __init__(
        self,
        urls_or_prefix: str | Sequence[str],
        columns: Sequence[str] | None = None,
        *,
        shuffle_row_groups: bool = False,
        shuffle_buffer: int = 0,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        split: Literal["rows", "row_groups"] | None = None,
        drop_last: bool = False,
        read_ahead: int | str = DEFAULT_READ_AHEAD,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | str | None = None,
        storage_options: Mapping[str, Any] | None = None,
        hedge: bool | float = False,
        max_requests_per_second: float | None = None,
    ) -> None:
        self._init_stream(
            shuffle_units=shuffle_row_groups,
            shuffle_buffer=shuffle_buffer,
            seed=seed,
            rank=rank,
            world_size=world_size,
            split=split,
            drop_last=drop_last,
        )
        self.read_ahead = parse_size(read_ahead)
        self.files = ParquetFiles(
            urls_or_prefix,
            columns,
            cache_dir,
            cache_limit,
            storage_options,
            skip_unreadable=True,
            hedge=hedge,
            max_requests_per_second=max_requests_per_second,
        )
        self._counts = self.files.counts  # what the files read is what this dataset read
        # The stream being read's state function (_live, when it still is) and its snapshot's.
        self._snapshot: tuple[Any, Callable[[], Callable[[], RowsState]]] | None = None

    @property
    def shuffle_row_groups(self) -> bool:
        """Whether every epoch has a new order of the row groups."""
        return self.shuffle_units

    @property
    def columns(self) -> list[str] | None:
        """The columns read (None: all)."""
        return self.files.columns

    async def load(self) -> None:
        """Reads the footers (listing a prefix first), once."""
        await self.files.load()

    def __len__(self) -> int:
        """The rows this rank yields per epoch, the same on every rank (``split="rows"``).

        Raises:
            TypeError: ``split="row_groups"`` (a rank gets what its row groups hold).
        """
        return self._samples_per_rank()

    # -- the stream's units and states (StreamDataset's hooks) -------------------

    def _unit_count(self) -> int:
        return len(self.files.load_blocking().units)

    def _unit_counts(self) -> list[int]:
        return [int(count) for count in self.files.load_blocking().unit_rows]

    def _whole_run(self, unit: int) -> Run:
        return Run(unit, 0, 0, int(self.files.load_blocking().unit_rows[unit]))

    def _check_state(self, state: Any) -> RowsState:
        return check_rows_state(state, self._unit_counts())

    def _state_json(self, state: RowsState) -> dict[str, Any]:
        return state.to_json(self._unit_count())

    def _new_state(self, epoch: int, layout: dict[str, Any], runs: list[Run]) -> RowsState:
        return RowsState(epoch, layout, _segments(runs))

    # -- streams ------------------------------------------------------------------

    def _unreadable(self, guard: StreamGuard | None) -> list[Skip]:
        """The skip markers of the files left out as unreadable: raises the first one's
        error without the policy; the first worker of a rank records them (once)."""
        files = self.files
        if guard is None:
            files.raise_unreadable()
            return []
        info = get_worker_info()
        if info is not None and info.id != 0:
            return []
        markers = []
        for number, error in files.unreadable.items():
            url = redact_url(files.urls[number])
            where = f"{url}: the whole file (its footer cannot be read)"
            markers.append(guard.skip(url, copy.copy(error), where=where))
        return markers

    async def _open(
        self, batch: int | None, guard: StreamGuard | None
    ) -> tuple[RowStream, list[Skip], _Held]:
        """This worker's stream, the skip markers to yield before it (the files left out
        as unreadable), and the rows of it taken and not all yielded yet."""
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        early = self._early_reads(worker, workers)
        try:
            return await self._open_stream(batch, guard, info, worker, workers, early)
        except BaseException:
            if early is not None:
                early.cancel()
            raise

    def _early_reads(self, worker: int, workers: int) -> EarlyReads | None:
        """What this worker's stream reads first, read while the footers arrive, where the
        footers are still to be read and the row groups are the files' in order."""
        if (
            self.files.loaded
            or self.split != "row_groups"
            or self.shuffle_units
            or self._resume is not None
        ):
            return None
        offset, stride = self.rank + self.world_size * worker, self.world_size * workers
        return EarlyReads(self.files, self.read_ahead, FILES_AT_ONCE, offset, stride)

    async def _open_stream(
        self,
        batch: int | None,
        guard: StreamGuard | None,
        info: Any,
        worker: int,
        workers: int,
        early: EarlyReads | None,
    ) -> tuple[RowStream, list[Skip], _Held]:
        await self.files.load(on_footer=None if early is None else early.footer_in)
        skipped = self._unreadable(guard)
        if batch is None and info is not None:
            batch = info.batch_size
        start = self._start(worker, workers, batch)
        files = self.files
        assert files.schema is not None
        buffer = ready = None
        draining = False
        resumed = start.resumed
        runs = _segments(start.plan)
        if resumed is not None:
            runs, draining = resumed.runs, resumed.draining
            buffer = await read_rows(refs_of(resumed.buffer), files.read_many, files.schema)
            ready = await read_rows(refs_of(resumed.ready), files.read_many, files.schema)
        stream = RowStream(
            runs,
            files.read_many,
            files.schema,
            self.read_ahead,
            files.unit_bytes,
            self.shuffle_buffer,
            start.rng,
            files.describe,
            files.file_of,
            guard,
            buffer,
            ready,
            draining,
            early,
        )
        held = _Held()
        self._live = live = partial(_state_of, stream, self.epoch, start.layout, held)
        self._snapshot = (live, partial(_snapshot_of, stream, self.epoch, start.layout, held))
        return stream, skipped, held

    def state_snapshot(self) -> dict[str, Any] | LazyState | None:
        """:meth:`state_dict` as of now, made into JSON only when asked: what the loader
        takes after every batch (see :mod:`aioload.data.row_block`), at O(1) cost.

        Example::

            snapshot = dataset.state_snapshot()   # within an iteration
            resolve_state(snapshot) == state_then  # the JSON state_dict() gave then
        """
        found = self._snapshot
        if found is None or found[0] is not self._live:
            return self.state_dict()  # no stream, or not the one being read: as it is
        return _RowsSnapshot(found[1](), self._state_json)

    async def batch_stream(
        self, batch_size: int, drop_last: bool, guard: StreamGuard | None
    ) -> AsyncGenerator[ArrowRows | Skip, None]:
        """The loader's batches: ``batch_size`` rows each as an :class:`ArrowRows` block.

        The batch-stream protocol of :mod:`aioload.data.row_block`: the worker's last batch is
        shorter (dropped with ``drop_last``); under ``guard`` a row range that cannot be
        read comes as a skip marker.
        """
        stream, skipped, _ = await self._open(batch_size, guard)
        names = self.files.schema.names  # type: ignore[union-attr]
        take = stream.take
        try:
            for marker in skipped:
                yield marker
            while True:
                piece = await take(batch_size)
                if not isinstance(piece, Piece):
                    if piece is None:
                        return
                    yield piece  # a skip marker
                    continue
                length = len(piece)
                if drop_last and length < batch_size:
                    return
                yield ArrowRows(piece.make_table, piece.views, names=names, length=length)
        finally:
            await stream.aclose()

    async def _stream(self, guard: StreamGuard | None) -> AsyncGenerator[Any, None]:
        stream, skipped, held = await self._open(None, guard)
        try:
            for marker in skipped:
                yield marker
            while True:
                piece = await stream.take(_ROW_CHUNK)
                if piece is None:
                    return
                if not isinstance(piece, Piece):
                    yield piece
                    continue
                held.piece = piece
                for i, row in enumerate(ArrowRows(piece.table).rows()):
                    held.next = i + 1
                    yield row
                held.piece = None
        finally:
            await stream.aclose()

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "_snapshot": None}  # the stream stays here

    def __repr__(self) -> str:
        files = self.files
        where = files.prefix if files.prefix is not None else files.urls[0]
        return f"IterableParquetDataset({redact_url(where)!r}, columns={files.columns!r})"


def _segments(runs: list[Run]) -> list[Segment]:
    # A Parquet run always knows where it stops (stop -1 is a tar shard's "to its end").
    return [Segment(run.shard, run.start, run.stop) for run in runs]


def _state_of(stream: RowStream, epoch: int, layout: dict[str, Any], held: _Held) -> RowsState:
    """Where ``stream`` stands, the rows a row-by-row iteration took and did not yield first."""
    return _snapshot_of(stream, epoch, layout, held)()


def _snapshot_of(
    stream: RowStream, epoch: int, layout: dict[str, Any], held: _Held
) -> Callable[[], RowsState]:
    """:func:`_state_of` as of now, made when called."""
    made = stream.snapshot(epoch, layout)
    piece, taken = held.piece, held.next
    if piece is None:
        return made
    return partial(_with_held, made, piece.labels(), taken)  # no table kept alive


def _with_held(made: Callable[[], RowsState], piece: Piece, taken: int) -> RowsState:
    state = made()
    state.ready = piece.cut(taken)[1].runs() + state.ready
    return state


class _RowsSnapshot(LazyState):
    """A Parquet stream's state as of one batch, made into JSON when asked."""

    __slots__ = ("_make", "_to_json")

    def __init__(
        self, make: Callable[[], RowsState], to_json: Callable[[RowsState], dict[str, Any]]
    ) -> None:
        self._make, self._to_json = make, to_json

    def resolve(self) -> dict[str, Any]:
        return self._to_json(self._make())
