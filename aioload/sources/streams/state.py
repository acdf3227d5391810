"""The checkpoint state of a shard stream: what is left of an epoch, by shards and samples.

A :class:`~aioload.sources.ShardDataset` stream (one per worker, or the loader's own loop)
records, after every batch, the samples it has not yielded yet, never their bytes:

- ``runs``: runs of consecutive samples still to read, each ``[shard, start, offset, stop]``:
  shard number (in the dataset's URLs), the first sample's position in the shard and the
  byte where it starts (a tar header: a resumed read starts there with a range request),
  and the position past the last one (``-1``: to the shard's end, for shards read
  without an index). The shards being read come first, in the turn order of
  ``shards_in_flight``, then the shards not yet opened, in the epoch's order.
- ``buffer``: the samples the shuffle buffer holds, each ``[shard, position, offset, end,
  key]`` (re-read on resume with one range request per run of neighbours), in its slots'
  order; with ``draining``, in the order they are still to come.
- ``rng``: the shuffle buffer's generator state (None: a fresh one).
- ``layout``: the split it was made under (rank, world size, worker, workers, batch size,
  buffer, shards in flight). A resumed stream with the same layout continues exactly;
  any other layout re-splits what is left (:func:`resplit`).

Every state is plain JSON. :func:`check_state` validates one completely before anything
is read (a state is outside data): anything malformed, a sample named twice, positions and
bytes that disagree (:mod:`~aioload.sources.streams.checks`), or more buffered samples than
the layout's shuffle buffer holds raises :class:`ShardStateError`. Whether the samples and
bytes exist is the dataset's to check, where it knows (a shard's index).

Example::

    >>> state = fresh_state([Run(0, 0, 0, -1)], {"rank": 0}, epoch=0, shards=1)
    >>> check_state(state, shards=1).runs
    [Run(shard=0, start=0, offset=0, stop=-1)]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn, cast

import numpy as np

from aioload.checks import is_int
from aioload.errors import ShardStateError
from aioload.sources.streams.checks import Span, check_spans, shuffle_bound
from aioload.sources.streams.split import Segment, take, worker_segments

__all__ = [
    "STATE_FORMAT",
    "STATE_VERSION",
    "Ref",
    "Run",
    "ShardStateError",
    "StreamState",
    "check_rng",
    "check_state",
    "fresh_state",
    "resplit",
]

STATE_FORMAT = "aioload.shard-stream"
"""The ``"format"`` field of every shard stream state."""

STATE_VERSION = 1
"""The layout of shard stream states this aioload writes and reads."""

Ref = tuple[int, int, int, int, str]
"""One sample held by a shuffle buffer: shard, position, first byte, end byte, key."""


@dataclass(frozen=True, slots=True)
class Run:
    """Samples ``start`` to ``stop - 1`` of shard ``shard``, the first at byte ``offset``.

    ``stop == -1``: to the shard's end (a shard read without its index).

    Example::

        >>> Run(3, 10, 5120, 20).empty, Run(3, 0, 0, -1).empty
        (False, False)
    """

    shard: int
    start: int
    offset: int
    stop: int

    @property
    def empty(self) -> bool:
        """No sample is left in it."""
        return 0 <= self.stop <= self.start


@dataclass
class StreamState:
    """A checked shard stream state (see the module docstring)."""

    epoch: int
    layout: dict[str, Any]
    runs: list[Run]
    buffer: list[Ref] = field(default_factory=list)
    draining: bool = False
    rng: dict[str, Any] | None = None

    def left(self) -> list[Run]:
        """Every sample left, the buffered ones first, as runs (for :func:`resplit`)."""
        return [*map(_sample_run, self.buffer), *self.runs]

    def spans(self) -> list[Span]:
        """Every sample the state names (for :func:`~.stream_checks.check_spans`)."""
        runs = [Span(run.shard, run.start, run.stop, run.offset) for run in self.runs]
        return runs + [Span(ref[0], ref[1], ref[1] + 1, ref[2], ref[3]) for ref in self.buffer]

    def to_json(self, shards: int, *, format: str = STATE_FORMAT) -> dict[str, Any]:
        """The state as plain JSON types, marked as a stream state of kind ``format``."""
        return {
            "format": format,
            "version": STATE_VERSION,
            "shards": shards,
            "epoch": self.epoch,
            "layout": dict(self.layout),
            "runs": [[r.shard, r.start, r.offset, r.stop] for r in self.runs],
            "buffer": [list(ref) for ref in self.buffer],
            "draining": self.draining,
            "rng": self.rng,
        }


def fresh_state(
    runs: list[Run], layout: dict[str, Any], *, epoch: int, shards: int
) -> dict[str, Any]:
    """The state of a stream that has yielded nothing of ``runs`` yet."""
    return StreamState(epoch, layout, runs).to_json(shards)


def _fail(message: str) -> NoReturn:
    raise ShardStateError(f"shard stream state: {message}")


def _count(value: Any, name: str, low: int = 0) -> int:
    if not is_int(value) or value < low or value >= 2**63:
        _fail(f"{name} should be an int >= {low}; got {value!r:.80}")
    return int(value)


def check_rng(value: Any) -> dict[str, Any] | None:
    """A PCG64 generator state from a checkpoint, checked by numpy itself (None: none)."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or value.get("bit_generator") != "PCG64":
        _fail(f"'rng' should be a PCG64 state or null; got {value!r:.80}")
    try:
        np.random.PCG64().state = cast(Any, dict(value))  # numpy's own checks of every field
    except (TypeError, ValueError, KeyError, OverflowError) as error:
        _fail(f"'rng' is not a valid PCG64 state: {error}")
    return dict(value)


def check_state(state: Any, *, shards: int, format: str = STATE_FORMAT) -> StreamState:
    """Checks a stream state of a dataset of ``shards`` shards; returns it parsed.

    ``format`` is the kind of stream the dataset makes (``"aioload.shard-stream"`` for
    a ShardDataset): a state of another kind is refused, as a state of other shards is.

    Raises:
        ShardStateError: the state is not one :func:`fresh_state` or a stream made.
    """
    if not isinstance(state, Mapping):
        _fail(f"should be a dict from ShardDataset.state_dict(); got {type(state).__name__}")
    if state.get("format") != format:
        _fail(f"'format' should be {format!r}; got {state.get('format')!r:.80}")
    if state.get("version") != STATE_VERSION:
        _fail(f"version {state.get('version')!r:.40}; this aioload reads version {STATE_VERSION}")
    if state.get("shards") != shards:
        _fail(
            f"it was taken over {state.get('shards')!r:.40} shards, this dataset has {shards}: "
            "resume with the same shard URLs"
        )
    epoch = _count(state.get("epoch"), "'epoch'")
    layout = state.get("layout")
    if not isinstance(layout, Mapping) or not all(isinstance(k, str) for k in layout):
        _fail(f"'layout' should be a dict; got {layout!r:.80}")
    runs_in = state.get("runs")
    if not isinstance(runs_in, list):
        _fail(f"'runs' should be a list; got {runs_in!r:.80}")
    runs = []
    for item in runs_in:
        if not isinstance(item, list | tuple) or len(item) != 4:
            _fail(f"a run should be [shard, start, offset, stop]; got {item!r:.80}")
        shard = _count(item[0], "a run's shard")
        if shard >= shards:
            _fail(f"a run names shard {shard}, past the dataset's {shards}")
        start, offset = _count(item[1], "a run's start"), _count(item[2], "a run's offset")
        stop = _count(item[3], "a run's stop", -1)
        if stop != -1 and stop < start:
            _fail(f"a run stops at {stop}, before its start {start}")
        runs.append(Run(shard, start, offset, stop))
    buffer_in = state.get("buffer")
    if not isinstance(buffer_in, list):
        _fail(f"'buffer' should be a list; got {buffer_in!r:.80}")
    buffer: list[Ref] = []
    for item in buffer_in:
        if not isinstance(item, list | tuple) or len(item) != 5:
            _fail(
                f"a buffered sample should be [shard, position, offset, end, key]; got {item!r:.80}"
            )
        shard = _count(item[0], "a buffered sample's shard")
        if shard >= shards:
            _fail(f"a buffered sample names shard {shard}, past the dataset's {shards}")
        position = _count(item[1], "a buffered sample's position")
        first, end = _count(item[2], "a buffered sample's offset"), _count(item[3], "its end")
        if end <= first or not isinstance(item[4], str) or not item[4]:
            _fail(f"a buffered sample should end past its offset and have a key; got {item!r:.80}")
        buffer.append((shard, position, first, end, item[4]))
    draining = state.get("draining")
    if not isinstance(draining, bool):
        _fail(f"'draining' should be a bool; got {draining!r:.40}")
    checked = StreamState(epoch, dict(layout), runs, buffer, draining, check_rng(state.get("rng")))
    check_spans(checked.spans(), "shard", _fail)
    shuffle = shuffle_bound(layout, _fail)
    if shuffle is not None and len(buffer) > shuffle:
        _fail(
            f"its buffer holds {len(buffer)} samples, more than a shuffle buffer of its layout "
            f"holds ({shuffle})"
        )
    return checked


def _sample_run(ref: Ref) -> Run:
    return Run(ref[0], ref[1], ref[2], ref[1] + 1)


def _remaining(left: Sequence[Run], order: Sequence[int]) -> list[Run]:
    """The samples ``left`` names, as runs in the epoch's shard order, each sample once.

    Runs of a shard that meet or overlap are joined: neighbours are read with one range
    request, and a sample named twice (the padding of a sized split, in the states of
    every rank of a job) comes once.
    """
    rank_of = {shard: i for i, shard in enumerate(order)}
    pieces = sorted(
        (run for run in left if not run.empty),
        key=lambda run: (rank_of.get(run.shard, len(order)), run.shard, run.start),
    )
    merged: list[Run] = []
    for run in pieces:
        last = merged[-1] if merged else None
        if (
            last is not None
            and last.shard == run.shard
            and (last.stop == -1 or last.stop >= run.start)
        ):
            stop = -1 if -1 in (last.stop, run.stop) else max(last.stop, run.stop)
            merged[-1] = Run(last.shard, last.start, last.offset, stop)
        else:
            merged.append(run)
    return merged


def resplit(
    left: Sequence[Run],
    order: Sequence[int],
    *,
    rank: int,
    world_size: int,
    worker: int,
    num_workers: int,
    batch_size: int | None,
    counts: Sequence[int] | None,
    offset_of: Callable[[int, int], int],
) -> list[Run]:
    """Worker ``worker`` of rank ``rank``'s share of the samples ``left`` names.

    The samples left are put in the epoch's shard order (``order``), each once. With
    ``counts`` (every shard's samples: a sized split, ``offset_of(shard, position)`` giving
    a sample's byte) they are re-split at sample granularity, as
    :mod:`~aioload.sources.streams.split` splits an epoch: rank ``r`` takes contiguous
    positions ``r * N // world_size`` to ``(r + 1) * N // world_size - 1`` (no padding:
    every sample left comes once), then its workers whole batches of it. Otherwise every
    run is a unit: rank ``r`` takes runs ``r, r + world_size, ...`` and worker ``w`` every
    ``num_workers``-th of those, as a split by whole shards does.

    ``left`` is what the ranks re-split over had left: a rank's own states are re-split
    over its workers only (``rank=0, world_size=1``), so no rank share is taken of them
    again.

    Example::

        >>> resplit([Run(0, 2, 2, 6)], [0], rank=0, world_size=1, worker=1, num_workers=2,
        ...         batch_size=None, counts=[6], offset_of=lambda shard, row: row)
        [Run(shard=0, start=4, offset=4, stop=6)]
    """
    remaining = _remaining(left, order)
    if counts is None:
        return remaining[rank::world_size][worker::num_workers]
    segments = [
        Segment(run.shard, run.start, counts[run.shard] if run.stop == -1 else run.stop)
        for run in remaining
    ]
    total = sum(len(segment) for segment in segments)
    share = take(segments, rank * total // world_size, (rank + 1) * total // world_size)
    mine = worker_segments(share, worker, num_workers, batch_size)
    return [Run(s.shard, s.start, offset_of(s.shard, s.start), s.stop) for s in mine]
