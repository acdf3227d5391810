"""The checkpoint state of a Parquet row stream: what is left of an epoch, by rows.

An :class:`~aioload.sources.IterableParquetDataset` stream (one per worker, or the
loader's loop) records after every batch the rows it has not delivered, never their
values. A row is named by its *unit* (a row group, numbered across the files in order)
and its position in it; consecutive rows are written as runs ``[unit, start, stop]``:

- ``runs``: the row ranges still to read, in order (the ones being read ahead included);
- ``buffer``: the rows the shuffle buffer holds, in its slots' order;
- ``ready``: rows taken from the buffer (or the input) and not yet delivered, in order;
- ``rng``: the shuffle buffer's generator state (None: no shuffle);
- ``draining``: the input is spent, the buffer is being emptied;
- ``layout``: the split it was made under; a resumed stream with the same layout continues
  exactly, any other re-splits what is left
  (:func:`~aioload.sources.streams.state.resplit`, as shard streams do).

Every state is plain JSON, validated completely by :func:`check_rows_state` before
anything is read (a state is outside data): anything malformed, rows the files do not have,
a row named twice (:mod:`~aioload.sources.streams.checks`), or more rows in ``buffer`` than
the layout's shuffle buffer holds (in ``ready`` than it, or the largest row group, and
:data:`READY_SLACK` rows) raises :class:`~aioload.sources.streams.state.ShardStateError`.

Example::

    >>> runs_of(np.array([[0, 3], [0, 4], [2, 0]]))
    [[0, 3, 5], [2, 0, 1]]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

import numpy as np

from aioload.checks import is_int
from aioload.sources.streams.checks import Span, check_spans, shuffle_bound
from aioload.sources.streams.split import Segment
from aioload.sources.streams.state import Run, ShardStateError, check_rng

__all__ = [
    "ROWS_FORMAT",
    "READY_SLACK",
    "ROWS_VERSION",
    "RowsState",
    "check_rows_state",
    "refs_of",
    "runs_of",
]

ROWS_FORMAT = "aioload.parquet-stream"
"""The ``"format"`` field of every Parquet stream state."""

ROWS_VERSION = 1

READY_SLACK = 256
"""Rows a stream takes at once when it is iterated row by row: part of ``ready`` then."""


def runs_of(refs: np.ndarray[Any, Any]) -> list[list[int]]:
    """Rows ``refs`` (an ``(n, 2)`` array of unit, row) as runs ``[unit, start, stop]``."""
    if not len(refs):
        return []
    units, rows = refs[:, 0], refs[:, 1]
    breaks = np.flatnonzero((np.diff(units) != 0) | (np.diff(rows) != 1)) + 1
    starts = np.concatenate([[0], breaks])
    ends = np.concatenate([breaks, [len(refs)]])
    return [
        [int(units[s]), int(rows[s]), int(rows[s]) + int(e - s)]
        for s, e in zip(starts, ends, strict=True)
    ]


def refs_of(runs: Sequence[Segment]) -> np.ndarray[Any, Any]:
    """Runs of rows as an ``(n, 2)`` array of unit, row."""
    if not runs:
        return np.zeros((0, 2), dtype=np.int64)
    return np.concatenate(
        [
            np.stack([np.full(len(run), run.shard), np.arange(run.start, run.stop)], axis=1).astype(
                np.int64
            )
            for run in runs
        ]
    )


@dataclass
class RowsState:
    """A checked Parquet stream state (see the module docstring)."""

    epoch: int
    layout: dict[str, Any]
    runs: list[Segment]
    buffer: list[Segment] = field(default_factory=list)
    ready: list[Segment] = field(default_factory=list)
    rng: dict[str, Any] | None = None
    draining: bool = False

    def to_json(self, units: int) -> dict[str, Any]:
        """The state as plain JSON types."""

        def listed(runs: list[Segment]) -> list[list[int]]:
            return [[run.shard, run.start, run.stop] for run in runs]

        return {
            "format": ROWS_FORMAT,
            "version": ROWS_VERSION,
            "units": units,
            "epoch": self.epoch,
            "layout": dict(self.layout),
            "runs": listed(self.runs),
            "buffer": listed(self.buffer),
            "ready": listed(self.ready),
            "rng": self.rng,
            "draining": self.draining,
        }

    def left(self) -> list[Run]:
        """Every row left, as runs (for :func:`~aioload.sources.streams.state.resplit`)."""
        return [Run(p.shard, p.start, p.start, p.stop) for p in self._pieces()]

    def spans(self) -> list[Span]:
        """Every row the state names (for :func:`~.stream_checks.check_spans`)."""
        return [Span(p.shard, p.start, p.stop) for p in self._pieces()]

    def _pieces(self) -> list[Segment]:
        return [*self.ready, *self.buffer, *self.runs]


def _fail(message: str) -> NoReturn:
    raise ShardStateError(f"Parquet stream state: {message}")


def _count(value: Any, name: str) -> int:
    if not is_int(value) or not 0 <= value < 2**62:
        _fail(f"{name} should be an int >= 0; got {value!r:.80}")
    return int(value)


def _runs(value: Any, name: str, rows: Sequence[int]) -> list[Segment]:
    if not isinstance(value, list):
        _fail(f"{name!r} should be a list of [unit, start, stop]; got {value!r:.80}")
    runs = []
    for item in value:
        if not isinstance(item, list | tuple) or len(item) != 3:
            _fail(f"an entry of {name!r} should be [unit, start, stop]; got {item!r:.80}")
        unit, start, stop = (_count(part, f"an entry of {name!r}") for part in item)
        if unit >= len(rows):
            _fail(f"{name!r} names unit {unit}, past the dataset's {len(rows)} row groups")
        if not start < stop <= rows[unit]:
            _fail(
                f"{name!r} names rows {start} to {stop} of unit {unit}, which has {rows[unit]} "
                "rows: the state is of other files"
            )
        runs.append(Segment(unit, start, stop))
    return runs


def check_rows_state(state: Any, rows: Sequence[int]) -> RowsState:
    """Checks a stream state of a dataset whose units have ``rows`` rows; returns it parsed.

    Raises:
        ShardStateError: the state is not one a stream of these files made.
    """
    if not isinstance(state, Mapping):
        _fail(f"should be a dict from state_dict(); got {type(state).__name__}")
    if state.get("format") != ROWS_FORMAT:
        _fail(f"'format' should be {ROWS_FORMAT!r}; got {state.get('format')!r:.80}")
    if state.get("version") != ROWS_VERSION:
        _fail(f"version {state.get('version')!r:.40}; this aioload reads version {ROWS_VERSION}")
    if state.get("units") != len(rows):
        _fail(
            f"it was taken over {state.get('units')!r:.40} row groups, these files have "
            f"{len(rows)}: resume with the same files"
        )
    layout = state.get("layout")
    if not isinstance(layout, Mapping) or not all(isinstance(k, str) for k in layout):
        _fail(f"'layout' should be a dict; got {layout!r:.80}")
    draining = state.get("draining")
    if not isinstance(draining, bool):
        _fail(f"'draining' should be a bool; got {draining!r:.40}")
    try:
        rng = check_rng(state.get("rng"))
    except ShardStateError as error:
        _fail(str(error).partition(": ")[2])
    checked = RowsState(
        _count(state.get("epoch"), "'epoch'"),
        dict(layout),
        _runs(state.get("runs"), "runs", rows),
        _runs(state.get("buffer"), "buffer", rows),
        _runs(state.get("ready"), "ready", rows),
        rng,
        draining,
    )
    check_spans(checked.spans(), "row group", _fail)
    shuffle = shuffle_bound(layout, _fail)
    if shuffle is not None:
        for name, runs, most in (
            ("buffer", checked.buffer, shuffle),
            ("ready", checked.ready, max(shuffle, max(rows, default=0)) + READY_SLACK),
        ):
            held = sum(len(run) for run in runs)
            if held > most:
                _fail(
                    f"its {name!r} holds {held} rows, more than a stream of its layout holds "
                    f"({most})"
                )
    return checked
