"""IterableParquetDataset: Parquet rows streamed by row group, split by rank and worker.

How an epoch is shared out, as :class:`~aioload.sources.ShardDataset` shares shards, with
row groups for shards and rows for samples (:mod:`aioload.sources.rank_split`): the
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
across neighbouring row groups (:mod:`aioload.sources.parquet_stream`).

Batches come straight from Arrow: the loader, batching automatically, reads whole batches
from :meth:`IterableParquetDataset.batch_stream` (see :mod:`aioload.row_block`), so
``default_collate`` gives a dict of numpy arrays without a Python object per row, and a
``collate_fn`` of yours gets the rows as dicts. Iterated itself (``async for``,
``batch_size=None``, a :class:`~aioload.sources.MixDataset`), it yields rows as dicts.

The stream checkpoints and resumes (``state_dict``/``load_state_dict``, exactly with the
same layout; re-split with another, :meth:`~IterableParquetDataset.resume_streams`), and
under the loader's fault policy a row group that cannot be read is retried, then skipped.

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
import functools
import os
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from typing import Any, Literal

import numpy as np

from aioload.datasets import IterableDataset
from aioload.fetch import Skip
from aioload.ranks import rank_and_world_size
from aioload.source_stats import SourceCounts
from aioload.sources.arrow_rows import ArrowRows
from aioload.sources.parquet_files import ParquetFiles
from aioload.sources.parquet_state import RowsState, check_rows_state, refs_of
from aioload.sources.parquet_stream import Piece, RowStream, read_rows
from aioload.sources.rank_split import (
    Segment,
    epoch_order,
    rank_segments,
    samples_per_rank,
    worker_segments,
)
from aioload.sources.shard_state import resplit
from aioload.sources.sizes import parse_size
from aioload.sources.stream_resume import resume_streams
from aioload.stream_faults import StreamGuard
from aioload.urls import redact_url
from aioload.worker_info import get_worker_info

__all__ = ["IterableParquetDataset"]

DEFAULT_READ_AHEAD = 64 << 20
"""Bytes of column chunks an IterableParquetDataset worker reads ahead, by default."""

_ROW_CHUNK = 256  # rows taken at once when the stream is iterated row by row


class _Held:
    """The rows a row-by-row iteration has taken from its stream: yielded up to ``next``."""

    __slots__ = ("next", "piece")

    def __init__(self) -> None:
        self.piece: Piece | None = None
        self.next = 0


class IterableParquetDataset(IterableDataset[Any]):
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
        **store_options: options of :func:`~aioload.sources.open_store`.

    Example::

        dataset = IterableParquetDataset("s3://bucket/table/", columns=["text", "label"],
                                         shuffle_row_groups=True, shuffle_buffer=10_000,
                                         **options)
        loader = DataLoader(dataset, batch_size=256, num_workers=2)
        for epoch in range(3):
            dataset.set_epoch(epoch)
            for batch in loader:       # {"text": [...256 str], "label": array(256)}
                ...
    """

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
        **store_options: Any,
    ) -> None:
        if not isinstance(shuffle_buffer, int) or shuffle_buffer < 0:
            raise ValueError(f"shuffle_buffer should be an int >= 0; got {shuffle_buffer!r}")
        if not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed should be an int >= 0; got {seed!r}")
        read_ahead = parse_size(read_ahead)
        rank, world_size = rank_and_world_size(rank, world_size)
        if split is None:
            split = "rows" if world_size > 1 else "row_groups"
        if split not in ("rows", "row_groups"):
            raise ValueError(f"split should be 'rows' or 'row_groups'; got {split!r}")
        if not isinstance(drop_last, bool):
            raise TypeError(f"drop_last should be a bool; got {drop_last!r}")
        self.files = ParquetFiles(
            urls_or_prefix, columns, cache_dir, cache_limit, store_options, skip_unreadable=True
        )
        self.shuffle_row_groups = bool(shuffle_row_groups)
        self.shuffle_buffer = shuffle_buffer
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.split: Literal["rows", "row_groups"] = split
        self.drop_last = drop_last
        self.read_ahead = read_ahead
        self.epoch = 0
        self._resume: RowsState | None = None  # loaded by load_state_dict, for the next iter
        self._live: tuple[RowStream, dict[str, Any], _Held] | None = None

    @property
    def columns(self) -> list[str] | None:
        """The columns read (None: all)."""
        return self.files.columns

    async def load(self) -> None:
        """Reads the footers (listing a prefix first), once."""
        await self.files.load()

    def set_epoch(self, epoch: int) -> None:
        """Sets the epoch the next iteration shuffles for (as ``DistributedSampler``).

        Call it before each epoch, in every rank, with the same value. With
        worker processes, persistent ones included, the epoch reaches every
        worker's copy of the dataset when the next epoch starts (``iter(loader)``).

        Example::

            for epoch in range(10):
                dataset.set_epoch(epoch)
                for batch in loader: ...
        """
        if not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch should be an int >= 0; got {epoch!r}")
        self.epoch = epoch

    def take_source_counts(self) -> SourceCounts | None:
        """Cache hits and misses and bytes from the store since the previous call
        (see :mod:`aioload.source_stats`)."""
        return self.files.counts.take()

    def __len__(self) -> int:
        """The rows this rank yields per epoch, the same on every rank (``split="rows"``).

        Raises:
            TypeError: ``split="row_groups"`` (a rank gets what its row groups hold).
        """
        if self.split != "rows":
            raise TypeError(
                f"{self!r} gives ranks and workers whole row groups (split='row_groups'), so "
                "it promises no length; pass split='rows' for one, the same on every rank"
            )
        return samples_per_rank(self.files.num_rows, self.world_size, self.drop_last)

    # -- the epoch's plan -------------------------------------------------------

    def _order_of(self, epoch: int) -> list[int]:
        return epoch_order(len(self.files.units), self.shuffle_row_groups, self.seed, epoch)

    def _plan(
        self, epoch: int, rank: int, world_size: int, worker: int, workers: int, batch: int | None
    ) -> list[Segment]:
        order = self._order_of(epoch)
        rows = self.files.unit_rows
        if self.split == "row_groups":
            mine = order[rank::world_size][worker::workers]
            return [Segment(unit, 0, int(rows[unit])) for unit in mine]
        counts = [int(count) for count in rows]
        share = rank_segments(order, counts, rank, world_size, self.drop_last)
        return worker_segments(share, worker, workers, batch)

    def _layout(self, worker: int, workers: int, batch: int | None) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "worker": worker,
            "num_workers": workers,
            "batch_size": batch if self.split == "rows" and workers > 1 else None,
            "split": self.split,
            "shuffle_buffer": self.shuffle_buffer,
            "seed": self.seed,
            "shuffle_row_groups": self.shuffle_row_groups,
            "drop_last": self.drop_last,
        }

    def _resplit(
        self, states: Sequence[RowsState], worker: int, workers: int, batch: int | None
    ) -> list[Segment]:
        runs = resplit(
            [state.left() for state in states],
            self._order_of(states[0].epoch),
            rank=self.rank,
            world_size=self.world_size,
            worker=worker,
            num_workers=workers,
            batch_size=batch,
            offset_of=(lambda unit, row: row) if self.split == "rows" else None,
        )
        # A Parquet run always knows where it stops (stop -1 is a tar shard's "to its end").
        return [Segment(run.shard, run.start, run.stop) for run in runs]

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
    ) -> tuple[RowStream, list[Skip]]:
        """This worker's stream, and the skip markers to yield before it (the files left
        out as unreadable)."""
        await self.files.load()
        skipped = self._unreadable(guard)
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        if batch is None and info is not None:
            batch = info.batch_size
        layout = self._layout(worker, workers, batch)
        resume, self._resume = self._resume, None
        rng = np.random.default_rng([self.seed, self.epoch, self.rank, worker])
        files = self.files
        assert files.schema is not None
        buffer = ready = None
        draining = False
        if resume is None:
            runs = self._plan(self.epoch, self.rank, self.world_size, worker, workers, batch)
        elif resume.layout == layout:
            runs, draining = resume.runs, resume.draining
            if resume.rng is not None:
                rng.bit_generator.state = resume.rng
            buffer = await read_rows(refs_of(resume.buffer), files.read_many, files.schema)
            ready = await read_rows(refs_of(resume.ready), files.read_many, files.schema)
        else:
            runs = self._resplit([resume], worker, workers, batch)
        stream = RowStream(
            runs,
            files.read_many,
            files.schema,
            self.read_ahead,
            files.unit_bytes,
            self.shuffle_buffer,
            rng,
            files.describe,
            files.file_of,
            guard,
            buffer,
            ready,
            draining,
        )
        self._live = (stream, layout, _Held())
        return stream, skipped

    async def batch_stream(
        self, batch_size: int, drop_last: bool, guard: StreamGuard | None
    ) -> AsyncGenerator[ArrowRows | Skip, None]:
        """The loader's batches: ``batch_size`` rows each as an :class:`ArrowRows` block.

        The batch-stream protocol of :mod:`aioload.row_block`: the worker's last batch is
        shorter (dropped with ``drop_last``); under ``guard`` a row range that cannot be
        read comes as a skip marker.
        """
        stream, skipped = await self._open(batch_size, guard)
        try:
            for marker in skipped:
                yield marker
            while True:
                piece = await stream.take(batch_size)
                short = isinstance(piece, Piece) and drop_last and len(piece) < batch_size
                if piece is None or short:
                    return
                if not isinstance(piece, Piece):
                    yield piece  # a skip marker
                    continue
                names = self.files.schema.names  # type: ignore[union-attr]
                yield ArrowRows(piece.make_table, piece.views, names=names, length=len(piece))
        finally:
            await stream.aclose()

    def __aiter__(self) -> AsyncIterator[Any]:
        self._live = None
        return self._rows(None)

    def guarded_stream(self, guard: StreamGuard) -> AsyncIterator[Any]:
        """The rows under the loader's fault policy (see :mod:`aioload.stream_faults`):
        a row group whose read fails transiently is retried; one that cannot be read
        (missing or truncated file, a footer that lies, a store error after the retries)
        is skipped, recorded with its file and row group; a file whose footer cannot be
        read (missing, truncated, not Parquet) is skipped whole, recorded with its URL."""
        self._live = None
        return self._rows(guard)

    async def _rows(self, guard: StreamGuard | None) -> AsyncGenerator[Any, None]:
        stream, skipped = await self._open(None, guard)
        assert self._live is not None
        held = self._live[2]  # the rows taken and not all yielded yet: part of the state
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

    # -- checkpoints --------------------------------------------------------------

    def state_dict(self) -> dict[str, Any] | None:
        """Where this process's stream stands: the rows it has not delivered, as JSON
        (see :mod:`aioload.sources.parquet_state`). None before the first iteration."""
        if self._live is None:
            return None if self._resume is None else self._resume.to_json(len(self.files.units))
        stream, layout, held = self._live
        state = stream.state(self.epoch, layout)
        if held.piece is not None:
            state.ready = held.piece.cut(held.next)[1].runs() + state.ready
        return state.to_json(len(self.files.units))

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Makes the next iteration continue the stream ``state`` describes (its epoch
        replaces :meth:`set_epoch`'s). The same layout continues exactly; another
        re-splits what is left.

        Raises:
            ShardStateError: a malformed state, or one of other files.
        """
        rows = [int(count) for count in self.files.load_blocking().unit_rows]
        checked = check_rows_state(state, rows)
        self._resume = checked
        self.epoch = checked.epoch

    def resume_streams(
        self, states: Sequence[Any], num_workers: int, batch_size: int | None
    ) -> list[Any]:
        """The states a resumed epoch gives each of ``num_workers`` workers (one, with 0).

        The loader's hook for an elastic resume (see :mod:`aioload.checkpoint`): where
        ``states`` are this loader's layout they are returned as they are; otherwise every
        row they have left is re-split over the workers, in the epoch's row-group order.
        """
        rows = [int(count) for count in self.files.load_blocking().unit_rows]
        units = len(rows)

        def fresh(epoch: int, worker: int, workers: int) -> RowsState:
            plan = self._plan(epoch, self.rank, self.world_size, worker, workers, batch_size)
            return RowsState(epoch, {}, plan)

        def resplit_for(filled: list[RowsState], worker: int, workers: int) -> Any:
            runs = self._resplit(filled, worker, workers, batch_size)
            layout = self._layout(worker, workers, batch_size)
            return RowsState(filled[0].epoch, layout, runs).to_json(units)

        return resume_streams(
            states,
            num_workers,
            functools.partial(check_rows_state, rows=rows),
            functools.partial(self._layout, batch=batch_size),
            fresh,
            resplit_for,
        )

    def __getstate__(self) -> dict[str, Any]:
        # The stream being read (tasks, tables) stays in the process that reads it.
        return {**copy.copy(self.__dict__), "_live": None}

    def __repr__(self) -> str:
        files = self.files
        where = files.prefix if files.prefix is not None else files.urls[0]
        return f"IterableParquetDataset({redact_url(where)!r}, columns={files.columns!r})"
