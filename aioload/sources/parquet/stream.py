"""One worker's stream of Parquet rows, by columns: read-ahead, a row shuffle buffer, state.

:class:`RowStream` reads a list of row ranges (:class:`~aioload.sources.streams.split.Segment`:
rows ``start`` to ``stop - 1`` of one unit, a row group), reading ahead of the consumer
as many row groups as ``read_ahead`` bytes of their column chunks (at least one), the
row groups of one file together, and hands out rows in pieces of any size
(:meth:`RowStream.take`) — a whole batch at once, as Arrow tables, without one Python
object per row on the way.

The shuffle buffer holds up to ``shuffle`` rows, as one table. Each piece read joins it;
when it holds more than ``shuffle`` rows, the surplus leaves it, drawn at random (a
uniform choice of which rows, in a random order, from the generator): the same rows
and order as long as the generator's state is the same. At the end of the input it is
emptied in a random order. Memory stays bounded: ``shuffle`` rows, plus the row groups
read ahead and one piece.

Whenever the stream is between two :meth:`~RowStream.take` calls, :meth:`RowStream.state`
says what is left (see :mod:`aioload.sources.parquet.state`), and a stream made from that
state (the buffer's and ready rows read again) continues exactly.

Under the loader's fault policy a row range that cannot be read (retried first, as the
policy says) is skipped: :meth:`~RowStream.take` returns the skip marker the guard gives,
and the stream goes on with the next range.
"""

from __future__ import annotations

import asyncio
import copy
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa

from aioload.faults.guard import StreamGuard
from aioload.sources.parquet.arrow_rows import numeric_views, take_rows
from aioload.sources.parquet.early import EarlyReads
from aioload.sources.parquet.state import RowsState, refs_of, runs_of
from aioload.sources.streams.split import Segment, take

__all__ = ["Piece", "RowStream", "join", "read_rows"]

FILES_AT_ONCE = 4
"""Files a stream reads at once (the row groups of each with one call)."""

ReadUnits = Callable[[list[int]], Awaitable[list[pa.Table]]]
"""Reads some units' tables (every requested column, all their rows), in order."""


Views = dict[str, np.ndarray[Any, Any]]


class Piece:
    """Rows of a stream: rows ``start`` to ``start + length - 1`` of a table (with numpy
    views of its numeric columns), and which rows of the dataset they are — as runs of
    one unit's consecutive rows (rows straight from the input) or as ``refs``, an ``(n, 2)``
    array of unit, row (rows out of the shuffle buffer). Cutting one costs no Arrow work
    and no bookkeeping: a :meth:`window` shares its table and views, sliced when asked
    for, and its runs or refs are its parent's, cut when asked for (a checkpoint)."""

    __slots__ = (
        "_label",
        "_length",
        "_of",
        "_refs",
        "_runs",
        "_source",
        "_start",
        "_table",
        "_views",
    )

    def __init__(
        self,
        table: pa.Table,
        refs: np.ndarray[Any, Any] | None = None,
        runs: list[Segment] | None = None,
        views: Views | None = None,
        start: int = 0,
        length: int | None = None,
    ) -> None:
        self._source = table
        self._views = views if views is not None else {}
        self._start = start
        self._length = int(table.num_rows) - start if length is None else length
        whole = start == 0 and self._length == table.num_rows
        self._table: pa.Table | None = table if whole else None
        self._refs = refs
        self._runs = runs if runs is not None or refs is not None else []
        self._of: tuple[Piece, int] | None = None  # a window's parent, and where in it
        self._label: Piece | None = None  # its labels without its rows (see labels())

    def __len__(self) -> int:
        return self._length

    @property
    def table(self) -> pa.Table:
        """The rows, as an Arrow table."""
        return self.make_table()

    def make_table(self) -> pa.Table:
        """The rows, as an Arrow table (sliced on the first call)."""
        if self._table is None:
            self._table = self._source.slice(self._start, self._length)
        return self._table

    @property
    def views(self) -> Views:
        """The numeric columns viewed by numpy (a column without a view is not in it)."""
        first, end = self._start, self._start + self._length
        return {name: view[first:end] for name, view in self._views.items()}

    def by_runs(self) -> bool:
        """Whether the rows are labelled by runs (else by refs)."""
        piece = self
        while piece._runs is None and piece._refs is None:
            assert piece._of is not None
            piece = piece._of[0]
        return piece._runs is not None

    @property
    def refs(self) -> np.ndarray[Any, Any]:
        """The rows, as an ``(n, 2)`` array of unit, row."""
        if self._refs is None:
            if self._runs is None and self._of is not None and not self.by_runs():
                parent, first = self._of
                self._refs = parent.refs[first : first + self._length]
            else:
                self._refs = refs_of(self.runs())
        return self._refs

    def runs(self) -> list[Segment]:
        """The rows, as runs."""
        if self._runs is None:
            if self._of is not None and self.by_runs():
                parent, first = self._of
                self._runs = take(parent.runs(), first, first + self._length)
            else:
                self._runs = [Segment(*run) for run in runs_of(self.refs)]
        return self._runs

    def window(self, first: int, stop: int) -> Piece:
        """Rows ``first`` to ``stop - 1`` of this piece, with no work until asked for."""
        piece = Piece.__new__(Piece)
        piece._source, piece._views = self._source, self._views
        piece._start, piece._length = self._start + first, stop - first
        whole = first == 0 and stop == self._length
        piece._table = self._table if whole else None
        piece._refs = piece._runs = piece._label = None
        piece._of = (self, first)
        return piece

    def labels(self) -> Piece:
        """A piece of the same rows' labels (runs or refs) without the rows: what a state
        keeps, so that it holds no table alive (made once)."""
        label = self._label
        if label is None:
            runs = self._runs if self._runs is not None or self._refs is not None else self.runs()
            label = Piece.__new__(Piece)
            label._source, label._views, label._table = _NO_ROWS, {}, None
            label._start, label._length = 0, self._length
            label._refs, label._runs, label._of = self._refs, runs, None
            label._label = self._label = label
        return label

    def cut(self, count: int) -> tuple[Piece, Piece]:
        """The first ``count`` rows, and the rest."""
        return self.window(0, count), self.window(count, self._length)

    def take(self, positions: np.ndarray[Any, Any]) -> Piece:
        """The rows at ``positions``, in that order."""
        rows = positions + self._start
        views = {name: view[rows] for name, view in self._views.items()}
        return Piece(self._source.take(pa.array(rows)), self.refs[positions], views=views)


_NO_ROWS = pa.table({})  # the table of a piece of labels alone (Piece.labels)


def join(pieces: Sequence[Piece], schema: pa.Schema) -> Piece:
    """One piece of ``pieces``' rows, in order."""
    if len(pieces) == 1:
        return pieces[0]
    if not pieces:
        return Piece(schema.empty_table(), runs=[])
    table = pa.concat_tables([piece.table for piece in pieces])
    each = [piece.views for piece in pieces]
    names = set.intersection(*(set(views) for views in each))
    views = {name: np.concatenate([piece_views[name] for piece_views in each]) for name in names}
    if all(piece.by_runs() for piece in pieces):
        return Piece(table, runs=[run for piece in pieces for run in piece.runs()], views=views)
    return Piece(table, np.concatenate([piece.refs for piece in pieces]), views=views)


class RowStream:
    """The rows of ``runs``, read ``read_ahead`` bytes ahead, through a shuffle buffer.

    Args:
        runs: the row ranges to read, in order.
        read: reads units' tables (:data:`ReadUnits`).
        schema: the tables' schema (for empty pieces).
        read_ahead: the column-chunk bytes of the row groups read ahead (at least one).
        unit_bytes: every unit's column-chunk bytes (of the columns read).
        shuffle: the shuffle buffer's rows (0 or 1: no shuffle).
        rng: the shuffle buffer's generator.
        describe: ``"<file>, row group <n>"`` of a unit, for skip records.
        file_of: the file a unit is in (a refill reads each file's units with one call).
        guard: the loader's fault policy (None: errors raise).
        buffer: rows already in the buffer (a resumed stream), in slot order.
        ready: rows out of the buffer not yet delivered (a resumed stream).
        draining: the input was spent: ``buffer`` is being emptied.

    Example::

        stream = RowStream(runs, files.read_many, files.schema, 64 << 20, files.unit_bytes,
                           10_000, rng, files.describe, files.file_of)
        piece = await stream.take(256)    # a Piece, a skip marker, or None at the end
        stream.state(epoch, layout)       # what is left
        await stream.aclose()
    """

    def __init__(
        self,
        runs: Sequence[Segment],
        read: ReadUnits,
        schema: pa.Schema,
        read_ahead: int,
        unit_bytes: Sequence[int],
        shuffle: int,
        rng: np.random.Generator,
        describe: Callable[[int], str],
        file_of: Callable[[int], int],
        guard: StreamGuard | None = None,
        buffer: Piece | None = None,
        ready: Piece | None = None,
        draining: bool = False,
        early: EarlyReads | None = None,
    ) -> None:
        self._pending: deque[Segment] = deque(run for run in runs if len(run))
        self._early = early
        self._read = read
        self._schema = schema
        self._read_ahead = read_ahead
        self._unit_bytes = unit_bytes
        self._bytes_reading = 0
        self._shuffle = shuffle if shuffle > 1 else 0
        self._rng = rng
        self._describe = describe
        self._file_of = file_of
        # Made on the stream's loop (shared with the reads started early).
        self._files_at_once = None if early is None else early.files_at_once
        self._guard = guard
        # Each row range being read, the read (shared by a refill's ranges), its table's number.
        self._reading: deque[tuple[Segment, asyncio.Task[list[Any]], int]] = deque()
        empty = join([], schema)
        self._buffer = buffer if buffer is not None else empty
        self._ready: deque[Piece] = deque([ready] if ready is not None and len(ready) else [])
        self._at = 0  # the rows of the first ready piece before this are taken
        self._ready_rows = sum(len(piece) for piece in self._ready)
        self._draining = draining

    def state(self, epoch: int, layout: dict[str, Any]) -> RowsState:
        """What is left, between two :meth:`take` calls."""
        return self.snapshot(epoch, layout)()

    def snapshot(self, epoch: int, layout: dict[str, Any]) -> Callable[[], RowsState]:
        """:meth:`state` as of now, made when called: O(1) now (copies of the few things
        that change; the pieces and runs in them never change), the runs listed later."""
        rng = dict(self._rng.bit_generator.state) if self._shuffle else None
        return partial(
            _state_of,
            epoch,
            layout,
            tuple([segment for segment, _, _ in self._reading]),
            tuple(self._pending),
            tuple([piece.labels() for piece in self._ready]),
            self._at,
            self._buffer.labels(),
            rng,
            self._draining,
        )

    async def take(self, count: int) -> Piece | Any | None:
        """Up to ``count`` rows (fewer only at the end); a skip marker; None: the end."""
        while self._ready_rows < count:
            filled = await self._fill()
            if filled is False:
                break
            if filled is not True:
                return filled  # a skip marker: the range it names is dropped
        if not self._ready_rows:
            return None
        ready, at = self._ready, self._at
        head = ready[0]
        stop = at + count
        if stop <= len(head):
            # Most batches: a window of the first ready piece (a decoded row group), its
            # rows found by moving ``_at`` on, nothing cut or joined.
            self._ready_rows -= count
            if stop == len(head):
                ready.popleft()
                stop = 0
            self._at = stop
            return head.window(at, at + count)
        taken: list[Piece] = []
        wanted = count
        while wanted and ready:
            piece = ready[0]
            end = min(len(piece), at + wanted)
            taken.append(piece.window(at, end))
            wanted -= end - at
            if end == len(piece):
                ready.popleft()
                at = 0
            else:
                at = end
        self._at = at
        self._ready_rows -= count - wanted
        return join(taken, self._schema)

    async def _fill(self) -> bool | Any:
        """Moves rows towards ``ready``: True; False at the end; or a skip marker."""
        if self._draining:
            return self._drain()
        piece = await self._next_input()
        if piece is None:
            if self._shuffle:
                self._draining = True
                return self._drain()
            return False
        if not isinstance(piece, Piece):
            return piece
        if not self._shuffle:
            self._add_ready(piece)
            return True
        buffer = join([self._buffer, piece], self._schema)
        surplus = len(buffer) - self._shuffle
        if surplus <= 0:
            self._buffer = buffer
            return True
        chosen = self._rng.permutation(len(buffer))[:surplus]
        keep = np.ones(len(buffer), dtype=bool)
        keep[chosen] = False
        self._add_ready(buffer.take(chosen))
        self._buffer = buffer.take(np.flatnonzero(keep))
        return True

    def _drain(self) -> bool:
        buffer = self._buffer
        if not len(buffer):
            return False
        self._add_ready(buffer.take(self._rng.permutation(len(buffer))))
        self._buffer = join([], self._schema)
        return True

    def _add_ready(self, piece: Piece) -> None:
        if len(piece):
            self._ready.append(piece)
            self._ready_rows += len(piece)

    def _top_up(self) -> None:
        # Refilled once half the window is read, all at once: the row groups of one file
        # in a refill share their requests (ParquetFiles.read_many).
        budget, sizes = self._read_ahead, self._unit_bytes
        if self._bytes_reading > budget // 2 or not self._pending:
            return
        segments: list[Segment] = []
        while self._pending and (
            (not self._reading and not segments)
            or self._bytes_reading + sizes[self._pending[0].shard] <= budget
        ):
            segment = self._pending.popleft()
            segments.append(segment)
            self._bytes_reading += sizes[segment.shard]
        # One read per file: the first file's rows go out while the others still arrive.
        by_file: dict[int, list[int]] = {}
        for segment in segments:
            by_file.setdefault(self._file_of(segment.shard), []).append(segment.shard)
        tasks = {file: self._start_read(units) for file, units in by_file.items()}
        if self._early is not None:
            self._early.cancel()  # the first refill took what it could of them
            self._early = None
        taken: dict[int, int] = {}
        for segment in segments:
            file = self._file_of(segment.shard)
            number = taken[file] = taken.get(file, -1) + 1
            self._reading.append((segment, tasks[file], number))

    def _start_read(self, units: list[int]) -> asyncio.Task[list[Any]]:
        early = None if self._early is None else self._early.take(units)
        if early is None:
            return asyncio.ensure_future(self._read_units(units))
        return asyncio.ensure_future(self._read_early(early, units))

    async def _read_early(self, early: asyncio.Task[list[Any]], units: list[int]) -> list[Any]:
        # The read started before the footers were all in, for these very units; one that
        # failed is read again, as the stream would have read it (under its policy).
        try:
            return await early
        except Exception:
            return await self._read_units(units)

    async def _read_units(self, units: list[int]) -> list[Any]:
        # Files are read FILES_AT_ONCE at a time, in the stream's order: the first one's rows
        # arrive sooner than if every file of the read-ahead shared the connection at once.
        if self._files_at_once is None:
            self._files_at_once = asyncio.Semaphore(FILES_AT_ONCE)
        async with self._files_at_once:
            return await self._read_guarded(units)

    async def _read_guarded(self, units: list[int]) -> list[Any]:
        guard = self._guard
        if guard is None:
            return await self._read(units)
        try:
            tables: list[pa.Table] = await guard.retry(self._read, units)
        except Exception:
            if len(units) == 1:
                raise
            # One unit's failure fails the read of all: each is read again alone, so that
            # only the units that cannot be read are skipped (their error in their place).
            return [await self._read_alone(unit) for unit in units]
        return tables

    async def _read_alone(self, unit: int) -> pa.Table | Exception:
        try:
            tables: list[pa.Table] = await self._read_guarded([unit])
        except Exception as error:
            return error
        return tables[0]

    async def _next_input(self) -> Piece | Any | None:
        """The next row range's rows; a skip marker for one that cannot be read; None."""
        self._top_up()
        if not self._reading:
            return None
        segment, task, number = self._reading[0]
        try:
            table = (await asyncio.shield(task))[number]  # a cancel leaves the read to aclose
            if isinstance(table, Exception):
                raise table
        except Exception as error:
            self._done_reading()
            self._top_up()
            if self._guard is None:
                raise
            where = self._describe(segment.shard)
            return self._guard.skip(
                where, error, where=f"{where}, rows {segment.start} to {segment.stop - 1}"
            )
        self._done_reading()
        self._top_up()
        first, stop = segment.start, segment.stop
        views = numeric_views(table)
        return Piece(table, runs=[segment], views=views, start=first, length=stop - first)

    def _done_reading(self) -> None:
        segment, _, _ = self._reading.popleft()
        self._bytes_reading -= self._unit_bytes[segment.shard]

    async def aclose(self) -> None:
        """Cancels the reads ahead and waits for them to end."""
        if self._early is not None:
            self._early.cancel()
            self._early = None
        tasks = list({id(task): task for _, task, _ in self._reading}.values())
        self._reading.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            try:
                await task
            except BaseException:
                pass


def _state_of(
    epoch: int,
    layout: dict[str, Any],
    reading: tuple[Segment, ...],
    pending: tuple[Segment, ...],
    ready: tuple[Piece, ...],
    at: int,
    buffer: Piece,
    rng: dict[str, Any] | None,
    draining: bool,
) -> RowsState:
    """A stream's state from what :meth:`RowStream.snapshot` kept (the first ready piece's
    rows before ``at`` are taken)."""
    runs = [*reading, *pending]
    pieces = list(ready)
    if pieces and at:
        pieces[0] = pieces[0].window(at, len(pieces[0]))
    listed = [run for piece in pieces for run in piece.runs()]
    rng = None if rng is None else copy.deepcopy(rng)  # a new state each time
    return RowsState(epoch, layout, runs, buffer.runs(), listed, rng, draining)


async def read_rows(refs: np.ndarray[Any, Any], read: ReadUnits, schema: pa.Schema) -> Piece:
    """The rows ``refs`` names, read again (each unit once), in ``refs``' order."""
    if not len(refs):
        return join([], schema)
    units = [int(unit) for unit in np.unique(refs[:, 0])]
    table = take_rows(units, await read(units), refs[:, 0], refs[:, 1])
    return Piece(table, refs, views=numeric_views(table))
