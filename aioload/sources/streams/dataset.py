"""StreamDataset: the one base of the stream datasets — tar shards, JSON lines, Parquet rows.

:class:`~aioload.sources.ShardDataset`, :class:`~aioload.sources.JsonLinesDataset` and
:class:`~aioload.sources.IterableParquetDataset` stream *units* (shards, files, row groups)
of *samples* (tar samples, lines, rows). How an epoch is shared out and how a stream
checkpoints is the same for all three, and is written once, here:

- **Arguments**: the shuffles, the seed, rank and world size, the split, ``drop_last`` and
  the units read at once are checked alike (a bool is not an int, as torch has it).
- **Epochs** (:meth:`~StreamDataset.set_epoch`) and the epoch's **order** of units: as
  given, or a permutation of ``(seed, epoch)``, the same in every rank and worker.
- **The plan**: a worker's share of an epoch, as runs
  (:class:`~aioload.sources.streams.state.Run`). With the *whole* split rank ``r`` of
  ``world_size`` takes units ``r, r + world_size, ...`` and its worker ``w`` every
  ``num_workers``-th of those; with the format's *sized* split (``"samples"``, ``"rows"``)
  every rank gets the same number of samples and each worker whole batches of them
  (:mod:`aioload.sources.streams.split`).
- **The layout** a stream runs under (rank, world size, worker, workers, the split and its
  settings): a state resumes exactly where its layout is the stream's.
- **States**: :meth:`~StreamDataset.state_dict`, :meth:`~StreamDataset.load_state_dict`,
  checked whole before anything is read (the format's checks, then
  :mod:`aioload.sources.streams.checks` over the states of each rank together), and the
  elastic resume: :meth:`~StreamDataset.resume_streams` (another ``num_workers``) and
  :meth:`~StreamDataset.merge_states` (another world size).
- **The start of a stream** (:meth:`~StreamDataset._start`): fresh from the plan, exactly
  from a loaded state, or from a re-split of it; and pickling (the stream being read stays
  in its process).

**Re-splitting** what states have left: the states of one rank (its workers') hold that
rank's leftovers only, so they are shared out over the rank's new workers — no rank share
is taken of them again; the states of every rank of a job
(:meth:`~StreamDataset.merge_states`) are shared out over the ranks of the job resuming
them, then over each rank's workers. Any other set of states is refused: it would lose
samples, or repeat them (:mod:`aioload.sources.streams.resume`).

A format keeps only what is its own: its units and their sample counts (for a sized
split), how to open a unit and read it from a position, how a state of its kind is
written and checked, and how its stream is built from a :class:`Start` (the hooks below,
``_unit_count`` to ``_stream``).

Example::

    class Lines(StreamDataset[StreamState]):     # a new format: only its own parts
        _whole_split, _unit_name, _shuffle_key = "files", "file", "shuffle_files"
        _state_prefix = "shard stream state"
        def _unit_count(self): return len(self.urls)
        def _check_state(self, state): return check_state(state, shards=len(self.urls))
        def _state_json(self, state): return state.to_json(len(self.urls))
        def _new_state(self, epoch, layout, runs): return StreamState(epoch, layout, runs)
        def _stream(self, guard): ...   # self._start(worker, workers, batch) and read
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, NoReturn, Protocol, TypeVar

import numpy as np

from aioload.checks import is_int
from aioload.data.datasets import IterableDataset
from aioload.faults.guard import StreamGuard
from aioload.ranks import rank_and_world_size
from aioload.sources.streams.checks import Span, check_spans
from aioload.sources.streams.resume import merged_loader_state, recorded_streams, split_over
from aioload.sources.streams.split import (
    epoch_order,
    rank_segments,
    samples_per_rank,
    worker_segments,
)
from aioload.sources.streams.state import Run, ShardStateError, resplit

__all__ = ["Start", "StreamDataset", "StreamStateLike", "check_count", "check_epoch"]


class StreamStateLike(Protocol):
    """What the base needs of a format's checked stream state."""

    epoch: int
    layout: dict[str, Any]
    rng: dict[str, Any] | None

    def left(self) -> list[Run]:
        """Every sample the state has left (buffered ones included), as runs."""
        ...

    def spans(self) -> list[Span]:
        """Every sample the state names, as spans (for :func:`check_spans`)."""
        ...


S = TypeVar("S", bound=StreamStateLike)


@dataclass
class Start(Generic[S]):
    """How a worker's stream starts: from ``plan``, or exactly from ``resumed``.

    Attributes:
        layout: the layout the stream runs under (recorded in its states).
        rng: the shuffle buffer's generator (a resumed one's state restored).
        plan: the runs to read (a fresh stream's share, or a re-split one's).
        resumed: the state the stream continues exactly (its runs, buffer and generator):
            then ``plan`` is empty.
    """

    layout: dict[str, Any]
    rng: np.random.Generator
    plan: list[Run] = field(default_factory=list)
    resumed: S | None = None


def check_count(name: str, value: Any, low: int) -> int:
    """``value`` if it is an int >= ``low`` (a bool is not one, as torch has it).

    Raises:
        ValueError: naming the argument and what it should be.

    Example::

        >>> check_count("shuffle_buffer", 1000, 0)
        1000
    """
    if not is_int(value) or value < low:
        raise ValueError(f"{name} should be an int >= {low}; got {value!r}")
    return value


def check_epoch(epoch: Any) -> int:
    """``epoch`` if it is an int >= 0 (not a bool, as torch's samplers have it).

    Example::

        >>> check_epoch(3)
        3
    """
    return check_count("epoch", epoch, 0)


class StreamDataset(IterableDataset[Any], Generic[S]):
    """The base of the stream datasets: split, epochs, states and resume, written once.

    See the module docstring for what it owns and what a format adds. A format sets the
    class attributes below and calls :meth:`_init_stream` from its ``__init__``.

    Attributes:
        shuffle_units: every epoch has a new order of the units (the format names the
            argument: ``shuffle_shards``, ``shuffle_files``, ``shuffle_row_groups``).
        units_in_flight: the units each worker reads at once (``shards_in_flight``,
            ``files_in_flight``; 1 for a format without one).
        shuffle_buffer: samples held in the shuffle buffer (0 or 1: none).
        seed: the seed of every shuffle.
        rank: this process's rank.
        world_size: the number of ranks.
        split: how an epoch is shared out (:attr:`_whole_split` or :attr:`_sized_split`).
        drop_last: with the sized split, the epoch's tail is dropped instead of padded.
        epoch: the epoch the next iteration streams (:meth:`set_epoch`).
    """

    _whole_split: ClassVar[str]
    """The split by whole units (``"shards"``, ``"files"``, ``"row_groups"``)."""
    _sized_split: ClassVar[str | None] = None
    """The split by samples, the same number on every rank (None: the format has none)."""
    _unit_name: ClassVar[str]
    """What a unit is called in messages (``"shard"``)."""
    _shuffle_key: ClassVar[str]
    """The argument (and layout key) that shuffles the units (``"shuffle_shards"``)."""
    _in_flight_key: ClassVar[str | None] = None
    """The argument (and layout key) of the units read at once (None: the format has none)."""
    _state_prefix: ClassVar[str]
    """How the format's state errors begin (``"shard stream state"``)."""

    shuffle_units: bool
    units_in_flight: int
    shuffle_buffer: int
    seed: int
    rank: int
    world_size: int
    split: str
    drop_last: bool
    epoch: int

    def _init_stream(
        self,
        *,
        shuffle_units: bool,
        shuffle_buffer: int,
        seed: int,
        rank: int | None,
        world_size: int | None,
        split: str | None = None,
        drop_last: bool = False,
        in_flight: int = 1,
    ) -> None:
        """Checks and keeps the arguments every stream has (see the class docstring).

        Raises:
            ValueError: a count that is not an int (a bool is not one) or out of range, a
                rank outside the world, a split the format does not have.
            TypeError: a ``drop_last`` that is not a bool.
        """
        self.shuffle_buffer = check_count("shuffle_buffer", shuffle_buffer, 0)
        self.seed = check_count("seed", seed, 0)
        if self._in_flight_key is not None:
            in_flight = check_count(self._in_flight_key, in_flight, 1)
        self.rank, self.world_size = rank_and_world_size(rank, world_size)
        splits = [name for name in (self._sized_split, self._whole_split) if name is not None]
        if split is None:
            split = self._default_split(self.world_size)
        elif split not in splits:
            raise ValueError(f"split should be {' or '.join(map(repr, splits))}; got {split!r}")
        if not isinstance(drop_last, bool):
            raise TypeError(f"drop_last should be a bool; got {drop_last!r}")
        self.split = split
        self.drop_last = drop_last
        self.shuffle_units = bool(shuffle_units)
        self.units_in_flight = in_flight
        self.epoch = 0
        self._resume: S | None = None  # loaded by load_state_dict, for the next iteration
        self._live: Callable[[], S] | None = None  # where the stream being read stands

    def _default_split(self, world_size: int) -> str:
        """The split without ``split=``: the sized one with several ranks, if any."""
        if world_size > 1 and self._sized_split is not None:
            return self._sized_split
        return self._whole_split

    def set_epoch(self, epoch: int) -> None:
        """Sets the epoch the next iteration shuffles for (as ``DistributedSampler``).

        Call it before each epoch, in every rank, with the same value; without it every
        epoch has the order of epoch 0. With worker processes, persistent ones included,
        the epoch reaches every worker's copy of the dataset when the next epoch starts
        (``iter(loader)``).

        Raises:
            ValueError: ``epoch`` is not an int >= 0 (a bool is not one).

        Example::

            for epoch in range(10):
                dataset.set_epoch(epoch)
                for batch in loader: ...
        """
        self.epoch = check_epoch(epoch)

    # -- the format's own parts ----------------------------------------------------------

    def _unit_count(self) -> int:
        """How many units the dataset has (shards, files, row groups)."""
        raise NotImplementedError

    def _unit_counts(self) -> list[int]:
        """Every unit's samples, for the sized split (loading what says them)."""
        raise NotImplementedError

    def _offset_of(self, unit: int, position: int) -> int:
        """The byte sample ``position`` of ``unit`` starts at (sized split, re-splits)."""
        return position

    def _whole_run(self, unit: int) -> Run:
        """A whole unit, as a run."""
        return Run(unit, 0, 0, -1)

    def _check_state(self, state: Any) -> S:
        """Checks a state of the format's kind (raising its error); returns it parsed."""
        raise NotImplementedError

    def _state_json(self, state: S) -> dict[str, Any]:
        """A checked state as plain JSON, in the format's layout."""
        raise NotImplementedError

    def _new_state(self, epoch: int, layout: dict[str, Any], runs: list[Run]) -> S:
        """The state of a stream that has read nothing of ``runs`` yet."""
        raise NotImplementedError

    def _stream(self, guard: StreamGuard | None) -> AsyncIterator[Any]:
        """The stream (under ``guard``, the loader's fault policy, if any)."""
        raise NotImplementedError

    # -- the epoch's plan ------------------------------------------------------------

    def _refuse(self, message: str) -> NoReturn:
        raise ShardStateError(f"{self._state_prefix}: {message}")

    def _order_of(self, epoch: int) -> list[int]:
        return epoch_order(self._unit_count(), self.shuffle_units, self.seed, epoch)

    def _plan(
        self,
        epoch: int,
        rank: int,
        world_size: int,
        worker: int,
        workers: int,
        batch_size: int | None = None,
    ) -> list[Run]:
        """What worker ``worker`` of ``workers`` of rank ``rank`` reads of epoch ``epoch``."""
        order = self._order_of(epoch)
        if self.split != self._sized_split:
            return [self._whole_run(unit) for unit in order[rank::world_size][worker::workers]]
        share = rank_segments(order, self._unit_counts(), rank, world_size, self.drop_last)
        return [
            Run(s.shard, s.start, self._offset_of(s.shard, s.start), s.stop)
            for s in worker_segments(share, worker, workers, batch_size)
        ]

    def _layout(
        self,
        rank: int,
        world_size: int,
        worker: int,
        workers: int,
        batch_size: int | None = None,
    ) -> dict[str, Any]:
        """What a stream's order depends on: a state resumes exactly where it is the same."""
        layout: dict[str, Any] = {
            "rank": rank,
            "world_size": world_size,
            "worker": worker,
            "num_workers": workers,
            "split": self.split,
            "shuffle_buffer": self.shuffle_buffer,
            "seed": self.seed,
            self._shuffle_key: self.shuffle_units,
        }
        if self._sized_split is not None:
            sized = self.split == self._sized_split and workers > 1
            layout["batch_size"] = batch_size if sized else None
            layout["drop_last"] = self.drop_last
        if self._in_flight_key is not None:
            layout[self._in_flight_key] = self.units_in_flight
        return layout

    def _samples_per_rank(self) -> int:
        """``len(dataset)``: the samples each rank yields per epoch, with the sized split."""
        if self.split != self._sized_split:
            raise TypeError(
                f"{self!r} gives ranks and workers whole {self._unit_name}s "
                f"(split={self.split!r}), so it promises no length; pass "
                f"split={self._sized_split!r} for one, the same on every rank"
            )
        return samples_per_rank(sum(self._unit_counts()), self.world_size, self.drop_last)

    # -- re-splits -----------------------------------------------------------------

    def _split_over(self, states: Sequence[S]) -> tuple[int, int]:
        """The ranks what ``states`` have left is shared out over: ``(rank, world_size)``
        (:func:`~aioload.sources.streams.resume.split_over`).

        Raises:
            ShardStateError: states of another rank, or of some of a job's ranks only.
        """
        return split_over(
            [state.layout for state in states], self.rank, self.world_size, self._refuse
        )

    def _check_together(self, states: Sequence[S]) -> None:
        """Refuses states of one rank that name a sample twice between them."""
        ranks: dict[Any, list[Span]] = {}
        for state in states:
            owner = (repr(state.layout.get("rank")), repr(state.layout.get("world_size")))
            ranks.setdefault(owner, []).extend(state.spans())
        for spans in ranks.values():
            check_spans(spans, self._unit_name, self._refuse)

    def _resplit(
        self,
        states: Sequence[S],
        worker: int,
        workers: int,
        batch_size: int | None,
        over: tuple[int, int],
    ) -> list[Run]:
        """Worker ``worker`` of ``workers``' share of what ``states`` have left, shared out
        over rank ``over[0]`` of ``over[1]`` (see :meth:`_split_over`)."""
        sized = self.split == self._sized_split
        return resplit(
            [run for state in states for run in state.left()],
            self._order_of(states[0].epoch),
            rank=over[0],
            world_size=over[1],
            worker=worker,
            num_workers=workers,
            batch_size=batch_size,
            counts=self._unit_counts() if sized else None,
            offset_of=self._offset_of,
        )

    def _fresh(
        self, epoch: int, rank: int, world_size: int, worker: int, workers: int, batch: int | None
    ) -> S:
        """The state of a worker that had delivered nothing: its whole share is left."""
        layout = self._layout(rank, world_size, worker, workers, batch)
        return self._new_state(
            epoch, layout, self._plan(epoch, rank, world_size, worker, workers, batch)
        )

    # -- streams ---------------------------------------------------------------------

    def _start(self, worker: int, workers: int, batch_size: int | None) -> Start[S]:
        """How this worker's stream starts: fresh, exactly resumed, or re-split (from the
        state loaded last, which it takes)."""
        layout = self._layout(self.rank, self.world_size, worker, workers, batch_size)
        resume, self._resume = self._resume, None
        rng = np.random.default_rng([self.seed, self.epoch, self.rank, worker])
        if resume is None:
            plan = self._plan(self.epoch, self.rank, self.world_size, worker, workers, batch_size)
            return Start(layout, rng, plan)
        if resume.layout == layout:
            # The same split: continue exactly, buffer, generator and turn order included.
            if resume.rng is not None:
                rng.bit_generator.state = resume.rng
            return Start(layout, rng, resumed=resume)
        over = self._split_over([resume])
        return Start(layout, rng, self._resplit([resume], worker, workers, batch_size, over))

    def __aiter__(self) -> AsyncIterator[Any]:
        self._live = None  # a new iteration: the last one's state is no longer where it stands
        return self._stream(None)

    def guarded_stream(self, guard: StreamGuard) -> AsyncIterator[Any]:
        """The stream under the loader's fault policy (see :mod:`aioload.faults.guard`).

        The loader calls it instead of ``aiter(dataset)`` when it has ``retry`` or
        ``on_error='skip'``. The samples and their order are those of ``aiter(dataset)``;
        a read that fails transiently is retried with the policy's backoff, and what
        cannot be read or decoded is skipped and recorded (the format's module docstring
        says what each skip names). It checkpoints and resumes as the plain stream does.

        Example::

            loader = DataLoader(dataset, batch_size=32, retry=RetryPolicy(attempts=3),
                                on_error="skip", max_skipped=100)
            for batch in loader: ...
            loader.skipped   # [SkippedItem(key=..., where=...), ...]
        """
        self._live = None
        return self._stream(guard)

    # -- checkpoints ---------------------------------------------------------------

    def state_dict(self) -> dict[str, Any] | None:
        """Where this process's stream stands: the samples it has not yielded, as JSON.

        Taken by the loader after every batch (see :meth:`DataLoader.state_dict()
        <aioload.DataLoader.state_dict>`): units, sample positions (and byte offsets,
        where the format has them), the shuffle buffer's samples and generator, never
        the samples themselves. None before the first iteration.

        Example::

            state = dataset.state_dict()       # within an iteration, e.g. in a worker
            json.dumps(state)                  # plain JSON
        """
        if self._live is not None:
            return self._state_json(self._live())
        return None if self._resume is None else self._state_json(self._resume)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Makes the next iteration continue the stream ``state`` describes.

        Its epoch replaces :meth:`set_epoch`'s for that iteration. With the same layout
        (rank, world size, worker, workers, the split and its settings) the stream
        continues exactly: the same samples in the same order. Otherwise what is left is
        re-split (see :meth:`resume_streams`). The state is checked whole before anything
        is read.

        Raises:
            ShardStateError: a malformed state, one of other units or of another kind of
                dataset, one that names a sample twice or more than its buffer holds, or
                one of another rank.

        Example::

            dataset.load_state_dict(json.load(open("stream.json")))
        """
        checked = self._check_state(state)
        self._split_over([checked])  # another rank's leftovers are refused now, not later
        self._resume = checked
        self.epoch = checked.epoch

    def resume_streams(
        self, states: Sequence[Any], num_workers: int, batch_size: int | None
    ) -> list[Any]:
        """The states a resumed epoch gives each of ``num_workers`` workers (one, with 0).

        The loader's hook for an elastic resume (see :mod:`aioload.pipeline.checkpoint`):
        ``states`` are the stream states a checkpoint recorded, one per worker (None: a
        worker that had delivered nothing) — of this rank, or of every rank of a job
        (:meth:`merge_states`). Where they are this loader's layout they are returned as
        they are and the epoch continues exactly. Otherwise every sample they have left
        is re-split, in the epoch's unit order, with fresh shuffle buffers: a rank's own
        leftovers over its new workers; every rank's over the new ranks, then their
        workers. With the sized split at sample granularity (whole batches per worker);
        else run by run, as units are split. Each sample left comes once.

        Raises:
            ShardStateError: a malformed state (see :meth:`load_state_dict`), states of
                different epochs, states of one rank that name a sample twice between
                them, or states of another rank (or of some of a job's ranks only).

        Example::

            states = dataset.resume_streams(recorded, num_workers=1, batch_size=32)
        """
        workers = max(num_workers, 1)
        parsed = [None if state is None else self._check_state(state) for state in states]
        known = [state for state in parsed if state is not None]
        if not known:
            return [None] * workers
        epoch = known[0].epoch
        if any(state.epoch != epoch for state in known):
            self._refuse("the states are of different epochs")
        layouts = [
            self._layout(self.rank, self.world_size, worker, workers, batch_size)
            for worker in range(workers)
        ]
        if len(parsed) == workers and all(
            state is None or state.layout == layouts[i] for i, state in enumerate(parsed)
        ):
            self._check_together(known)
            return list(states)
        recorded = len(parsed)
        filled = [
            state
            if state is not None
            else self._fresh(epoch, self.rank, self.world_size, i, recorded, batch_size)
            for i, state in enumerate(parsed)
        ]
        over = self._split_over(filled)
        self._check_together(filled)
        return [
            self._state_json(
                self._new_state(
                    epoch, layouts[worker], self._resplit(filled, worker, workers, batch_size, over)
                )
            )
            for worker in range(workers)
        ]

    def merge_states(self, loader_states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """One loader state from every rank's :meth:`DataLoader.state_dict()
        <aioload.DataLoader.state_dict>`, in rank order, for a job of another size.

        Every rank of the new job loads the result (``loader.load_state_dict(merged)``)
        and takes its share of what was left (see :meth:`resume_streams`): each remaining
        sample comes once across the new ranks (a sample left twice, by the padding of
        the old job's sized split, comes once). A rank whose loader had not started the
        epoch the others are in has its whole share left; one that had ended it, nothing.
        Its ``"batches"`` is the fewest any rank had received. With no rank in an epoch
        it is rank 0's state.

        Raises:
            ValueError: no state, one that is not a loader's ``state_dict()``, or ranks
                in epochs that are not the same (or the one after it, ended).
            ShardStateError: a stream state that does not check.

        Example::

            states = [json.load(open(f"ckpt-rank{r}.json")) for r in range(2)]
            merged = dataset.merge_states(states)     # on each of 3 new ranks
            loader.load_state_dict(merged)
        """
        recorded = recorded_streams(loader_states)  # what each rank's workers had left
        if not recorded.running:
            return dict(loader_states[0])  # between epochs, or not started: nothing to merge
        world_size = len(loader_states)
        known = [self._check_state(s.state) for s in recorded.streams if s.state is not None]
        if not known and not recorded.ended:
            streams = [stream.state for stream in recorded.streams]  # nothing delivered anywhere
        else:
            epoch = known[0].epoch if known else self.epoch
            streams = []
            for stream in recorded.streams:
                state = stream.state
                if state is None:
                    rank, worker = stream.rank, stream.worker
                    fresh = self._fresh(
                        epoch, rank, world_size, worker, stream.workers, stream.batch_size
                    )
                    if (rank, worker) in recorded.ended:
                        fresh = self._new_state(epoch, fresh.layout, [])
                    state = self._state_json(fresh)
                streams.append(state)
        return merged_loader_state(loader_states, recorded.running[0], streams, self._length())

    def _length(self) -> int | None:
        try:
            return len(self)  # type: ignore[arg-type]
        except TypeError:
            return None

    def __getstate__(self) -> dict[str, Any]:
        # The stream being read (tasks, open reads) stays in the process that reads it.
        return {**self.__dict__, "_live": None}
