"""Checkpoints of a loader: what each epoch records of what the consumer received,
``state_dict`` / ``load_state_dict``, and checking a state before it is loaded.

A state (see :meth:`aioload.DataLoader.state_dict`) describes what the consumer
has *received*: the epoch, the batches received in order (``batches``) and past
them out of order (``received``), the epoch's base seed and the loader
generator's state before drawing it, the sampler's state, and an iterable
dataset's state (one per worker with workers, plus whose turn comes next).

- :class:`~aioload.pipeline.received.Received` is an epoch's record of the batches the
  consumer took out (the scheduler keeps it up to date);
- :class:`Checkpoints` is a loader's checkpoint state: it starts each epoch
  (its base seed, where a loaded state resumes), makes states and loads them.

**Elastic streams.** A stream's state is recorded per worker, so by default a state
loads only into a loader with the same ``num_workers``. An iterable dataset may offer
``resume_streams(states, num_workers, batch_size) -> list``: given the stream states
the checkpoint recorded (one per worker, None for a worker that had delivered nothing;
or the one state of a loader without workers), it returns the states a resumed epoch
hands each of this loader's ``num_workers`` workers (one state with 0), returning them
unchanged where they fit. With it ``num_workers`` may differ between the loader that
took the state and the one that loads it; a re-split epoch starts with worker 0's turn.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from aioload.checks import is_int
from aioload.data.row_block import resolve_state
from aioload.pipeline.received import Received
from aioload.samplers.builtin import BatchSampler
from aioload.samplers.generators import (
    TORCH_GENERATOR,
    check_generator_state,
    check_torch_generator_state,
    seed_from,
    set_torch_generator_state,
    torch_generator_state,
)
from aioload.samplers.shuffling import Rng
from aioload.samplers.state import ResumableSampler, is_stateful, plain_json
from aioload.settings import LoaderSettings

__all__ = [
    "STATE_VERSION",
    "Checkpoints",
    "EpochPlan",
    "EpochStart",
    "Received",
    "Resume",
    "check_state",
    "check_worker_streams",
    "count_field",
]

STATE_VERSION = 2
"""Bumped when the layout of DataLoader.state_dict() changes, so an old state is refused clearly.

Version 2 added ``"fits"``: what the state depends on, checked when it is loaded."""

_MAX_SEED = 1 << 62  # a numpy Generator draws base seeds below this
_SEED_LIMIT = 1 << 63  # torch's draw (torch.empty((), dtype=torch.int64).random_()) is below this


@dataclass
class EpochStart:
    """What replays an epoch's start, and what its consumer received (for checkpoints)."""

    number: int
    base_seed: int
    generator: Any  # the loader generator's state before the base-seed draw
    sampler_before: Any  # the sampler's state before the epoch iterated it
    received: Received
    sampler_after: Any = None  # a built-in sampler's state once its iteration began


@dataclass
class Resume:
    """Where a loaded in-progress state resumes its epoch."""

    done: int
    received: list[int]
    base_seed: int
    fast_forward: int
    stream_state: Any


@dataclass(frozen=True)
class EpochPlan:
    """How a new epoch starts: what :meth:`Checkpoints.start_epoch` decided.

    Attributes:
        received: the epoch's record of what the consumer receives.
        base_seed: the seed of the epoch's workers (``base_seed + id``).
        on_iter: for the scheduler to call once the sampler's iterator is open.
        fast_forward: batches to draw and drop first (a resumed epoch over a
            sampler without a state of its own).
        resumed: the epoch continues a loaded state.
    """

    received: Received
    base_seed: int
    on_iter: Callable[[], None] | None
    fast_forward: int
    resumed: bool

    def worker_streams(self) -> tuple[list[Any] | None, int]:
        """A resumed stream's state per worker (None: start afresh) and whose turn is first."""
        state = self.received.stream_state
        if not self.resumed or self.received.stream_states is None or state is None:
            return None, 0
        return list(state["workers"]), state["next_worker"]


class Checkpoints:
    """A loader's checkpoint state (see :meth:`aioload.DataLoader.state_dict`).

    Args:
        settings: the loader's settings, of which a checkpoint reads the
            dataset, the index sampler (whose state it holds; None for an
            iterable dataset), the generator (a numpy ``Generator``, a
            ``torch.Generator`` whose draw the base seed is, or None: the base
            seed is drawn from torch's default generator when torch is imported,
            else from numpy's global state), ``num_workers``, ``in_order``,
            ``batch_size`` and ``drop_last``.

    A state records what it depends on (``"fits"``: the batch size,
    ``drop_last``, the dataset's length, the sampler's kind and length,
    ``in_order``, and ``num_workers`` for a stream read by workers); loading
    it into a loader where any of them differs fails naming the field, before
    anything is changed, and so does a state whose positions or counts are
    out of range or disagree with each other.
    """

    def __init__(self, settings: LoaderSettings) -> None:
        self._settings = settings
        dataset = settings.dataset
        self._dataset = dataset
        self._sampler = settings.index_sampler
        self._generator: Rng = settings.generator  # type: ignore[assignment]  # settled
        self._stream = settings.protocol.iterable and is_stateful(dataset)
        self._elastic = self._stream and callable(getattr(dataset, "resume_streams", None))
        self._epoch = 0  # epochs started (or resumed past, after load_state_dict)
        self._start: EpochStart | None = None  # what replays the latest epoch's start
        self._resume: Resume | None = None  # loaded by load_state_dict for the next epoch
        self._loaded: dict[str, Any] | None = None  # that state, until the next epoch starts

    @property
    def tracks_stream(self) -> bool:
        """The dataset is a stream with a state of its own, taken after every batch."""
        return self._stream

    def start_epoch(self) -> EpochPlan:
        """Starts the next epoch: draws its base seed and records what replays its start."""
        resume, self._resume, self._loaded = self._resume, None, None
        generator = self._generator
        # A checkpoint replays this epoch's start from the generator state before the draw.
        generator_before = self._generator_state()
        # Drawn every epoch, whatever num_workers, before the sampler draws (as
        # torch does), so a seeded generator shuffles alike with or without workers.
        # A torch.Generator (or, without a generator, torch's default one when torch
        # is imported, else numpy's global state) gives torch's own draw.
        # torch's draw is its base seed as it is, so the workers' seeds are torch's.
        if isinstance(generator, np.random.Generator):
            base_seed = int(generator.integers(_MAX_SEED))
        else:
            base_seed = seed_from(generator)
        if resume is not None:
            base_seed = resume.base_seed  # the same draw, or the one recorded without a generator
        sampler = self._sampler
        stream_state = None if resume is None else copy.deepcopy(resume.stream_state)
        if self._stream and self._settings.num_workers > 0 and stream_state is None:
            stream_state = {"workers": [None] * self._settings.num_workers, "next_worker": 0}
        received = Received(
            self._settings.in_order,
            0 if resume is None else resume.done,
            () if resume is None else resume.received,
            stream=self._stream,
            stream_state=stream_state,
        )
        start = EpochStart(
            number=self._epoch,
            base_seed=base_seed,
            generator=generator_before,
            sampler_before=sampler.state_dict() if is_stateful(sampler) else None,
            received=received,
        )
        self._epoch += 1
        self._start = start
        on_iter = None
        if count_field(sampler) is not None:

            def on_iter() -> None:
                # A built-in sampler's state once its iteration began: its start and a
                # count that state_dict() lowers to what the consumer received.
                start.sampler_after = sampler.state_dict()

        return EpochPlan(
            received,
            base_seed,
            on_iter,
            0 if resume is None else resume.fast_forward,
            resume is not None,
        )

    def check_checkpointable(self) -> None:
        """Refuses an iterable dataset that cannot say where its stream stands."""
        if self._settings.protocol.iterable and not is_stateful(self._dataset):
            error = TypeError(
                f"this DataLoader cannot checkpoint: its iterable dataset "
                f"{type(self._dataset).__name__} has no state_dict()/load_state_dict(), so a "
                "checkpoint could not say where its stream stood"
            )
            if hasattr(type(self._dataset), "state_dict"):  # a property that says why not
                try:
                    getattr(self._dataset, "state_dict")  # noqa: B009
                except AttributeError as why:  # a MixDataset's source without one, say
                    error.add_note(str(why))
            raise error

    def state_dict(self) -> dict[str, Any]:
        """The loader's state (see :meth:`aioload.DataLoader.state_dict`)."""
        self.check_checkpointable()
        if self._loaded is not None:
            return copy.deepcopy(self._loaded)
        start = self._start
        if start is None or start.received.finished:
            return self._between_epochs(self._epoch, self._generator_state(), self._sampler_state())
        done, received = start.received.position()
        sampler_state = start.sampler_before
        count = count_field(self._sampler)
        if count is not None:
            after = start.sampler_after
            if after is None:
                # The sampler was not iterated yet, so nothing was received: the
                # state is that of the moment before this epoch began.
                return self._between_epochs(start.number, start.generator, sampler_state)
            sampler_state = {**after, "in_progress": True, count: done}
        return {
            "type": "DataLoader",
            "version": STATE_VERSION,
            "in_progress": True,
            "epoch": start.number,
            "batches": done,
            "received": received,
            "base_seed": start.base_seed,
            "generator": start.generator,
            "sampler": sampler_state,
            "dataset": self._dataset_state(start.received.stream_state),
            "fits": self._fits(),
        }

    def _dataset_state(self, state: Any) -> Any:
        """The stream's state as of the last batch received, as JSON (a new object: the
        record goes on changing): each worker's, with workers."""
        if state is None or not self._settings.num_workers:
            return resolve_state(state)
        return {**state, "workers": [resolve_state(each) for each in state["workers"]]}

    def _generator_state(self) -> Any:
        generator = self._generator
        if generator is None:
            return None
        if isinstance(generator, np.random.Generator):
            return plain_json(generator.bit_generator.state)
        return torch_generator_state(generator)

    def _sampler_state(self) -> Any:
        return self._sampler.state_dict() if is_stateful(self._sampler) else None

    def _fits(self) -> dict[str, Any]:
        """What a state of this loader depends on (see the class docstring)."""
        sampler = self._sampler
        inner = getattr(sampler, "sampler", None) if isinstance(sampler, BatchSampler) else None
        kind = None if sampler is None else type(sampler).__name__
        if inner is not None:
            kind = f"{kind}({type(inner).__name__})"
        return {
            "batch_size": self._settings.batch_size,
            "drop_last": self._settings.drop_last,
            "dataset_length": _length(self._dataset),
            "sampler": kind,
            "sampler_length": _length(sampler),
            "in_order": self._settings.in_order,
            "num_workers": self._settings.num_workers if self._stream else None,
        }

    def _check_fits(self, state: Mapping[str, Any]) -> None:
        fits = state.get("fits")
        if not isinstance(fits, Mapping):
            raise ValueError("DataLoader state field 'fits' should be a dict from state_dict()")
        for name, ours in self._fits().items():
            if name == "num_workers" and self._elastic:
                continue  # the dataset re-splits its stream (resume_streams)
            theirs = fits.get(name, _MISSING)
            if theirs != ours or type(theirs) is not type(ours):
                raise ValueError(
                    f"DataLoader state does not fit this loader: it was taken with "
                    f"{name}={'(missing)' if theirs is _MISSING else repr(theirs)}, this loader "
                    f"has {name}={ours!r}; resume with a loader built with the same dataset "
                    "and arguments"
                )

    def _check_positions(self, state: Mapping[str, Any], done: int, received: list[int]) -> None:
        """Refuses positions past the epoch's end, and a sampler count that disagrees."""
        total = _length(self._sampler)
        if total is not None:
            if done > total:
                raise ValueError(
                    f"DataLoader state field 'batches' is {done}, past this epoch's {total} batches"
                )
            if received and received[-1] >= total:
                raise ValueError(
                    f"DataLoader state field 'received' names batch {received[-1]}, past this "
                    f"epoch's {total} batches"
                )
        count = count_field(self._sampler)
        sampler_state = state.get("sampler")
        if count is not None and isinstance(sampler_state, Mapping):
            theirs = sampler_state.get(count)
            if sampler_state.get("in_progress") and theirs != done:
                raise ValueError(
                    f"DataLoader state field 'batches' is {done}, but its sampler state says "
                    f"{count}={theirs!r}: the state was altered"
                )

    def _check_generator(self, state: Mapping[str, Any]) -> list[int] | None:
        """Checks a generator state against this loader's; the bytes of a torch one."""
        torch_state = state.get("bit_generator") == TORCH_GENERATOR
        numpy_generator = isinstance(self._generator, np.random.Generator)
        if torch_state == numpy_generator:
            raise ValueError(
                "DataLoader state holds a "
                + ("torch.Generator" if torch_state else "numpy generator")
                + " state, but this loader's generator is a "
                + ("numpy Generator" if numpy_generator else "torch.Generator")
                + ": build the loader with the same arguments"
            )
        if torch_state:
            return check_torch_generator_state(state, "DataLoader", "generator")
        assert isinstance(self._generator, np.random.Generator)
        check_generator_state(state, "DataLoader", self._generator)
        return None

    def _between_epochs(self, epoch: int, generator: Any, sampler: Any) -> dict[str, Any]:
        return {
            "type": "DataLoader",
            "version": STATE_VERSION,
            "in_progress": False,
            "epoch": epoch,
            "batches": 0,
            "received": [],
            "base_seed": None,
            "generator": generator,
            "sampler": sampler,
            "dataset": None,
            "fits": self._fits(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Loads ``state`` for the next epoch (see :meth:`aioload.DataLoader.load_state_dict`)."""
        self.check_checkpointable()
        in_progress, epoch, done, received, base_seed = check_state(state)
        self._check_fits(state)
        if in_progress:
            self._check_positions(state, done, received)
        sampler = self._sampler
        sampler_state = state.get("sampler")
        if is_stateful(sampler) != (sampler_state is not None):
            raise ValueError(
                f"DataLoader state has {'no' if sampler_state is None else 'a'} sampler state, "
                f"but this loader's {type(sampler).__name__} has "
                f"{'' if sampler_state is None else 'no '}state_dict(): build the loader with "
                "the same arguments"
            )
        generator = state.get("generator")
        if (generator is None) != (self._generator is None):
            raise ValueError(
                "DataLoader state has "
                + (
                    "no generator state, but this loader has a generator"
                    if generator is None
                    else "a generator state, but this loader has generator=None"
                )
                + ": build the loader with the same arguments"
            )
        torch_state = None
        if generator is not None:
            if not isinstance(generator, Mapping):
                raise ValueError("DataLoader state field 'generator' should be a dict or None")
            torch_state = self._check_generator(generator)
        if sampler is not None and sampler_state is not None:
            try:
                sampler.load_state_dict(sampler_state)
            except Exception as exc:
                exc.add_note("raised while loading the DataLoader's sampler state")
                raise
        if self._generator is not None and generator is not None:
            # After the sampler's: a sampler sharing the generator set it to the start
            # of its own iteration, which comes after the loader's base-seed draw.
            if isinstance(self._generator, np.random.Generator):
                self._generator.bit_generator.state = generator
            else:
                assert torch_state is not None
                set_torch_generator_state(self._generator, torch_state)
        dataset_state = state.get("dataset")
        if in_progress and dataset_state is not None and self._elastic:
            dataset_state = self._resplit_streams(state, dataset_state)
        if in_progress and dataset_state is not None:
            if self._settings.num_workers > 0:
                check_worker_streams(
                    dataset_state, self._settings.num_workers
                )  # loaded in each worker
            else:
                self._dataset.load_state_dict(dataset_state)
        self._epoch = epoch
        self._start = None
        self._resume = None
        if in_progress:
            self._resume = Resume(
                done=done,
                received=received,
                base_seed=base_seed,
                fast_forward=0 if count_field(sampler) is not None else done,
                stream_state=dataset_state,
            )
        self._loaded = copy.deepcopy(dict(state))

    def _resplit_streams(self, state: Mapping[str, Any], dataset_state: Any) -> Any:
        """The stream states for this loader's workers, from the dataset's resume_streams."""
        fits = state.get("fits")
        theirs = fits.get("num_workers") if isinstance(fits, Mapping) else None
        if not is_int(theirs) or theirs < 0:
            raise ValueError(
                f"DataLoader state field 'fits' should give num_workers; got {theirs!r:.50}"
            )
        if theirs > 0:
            check_worker_streams(dataset_state, theirs)
            recorded = list(dataset_state["workers"])
        else:
            recorded = [dataset_state]
        states = list(
            self._dataset.resume_streams(
                recorded, self._settings.num_workers, self._settings.batch_size
            )
        )
        if len(states) != max(self._settings.num_workers, 1):
            raise ValueError(
                f"{type(self._dataset).__name__}.resume_streams returned {len(states)} states "
                f"for {self._settings.num_workers} workers"
            )
        if self._settings.num_workers == 0:
            return states[0]
        unchanged = theirs == self._settings.num_workers and states == recorded
        turn = dataset_state["next_worker"] if unchanged else 0
        return {"workers": states, "next_worker": turn}


def check_worker_streams(state: Any, num_workers: int) -> None:
    """Checks the per-worker stream states of a checkpoint taken with workers."""
    workers = state.get("workers") if isinstance(state, Mapping) else None
    turn = state.get("next_worker") if isinstance(state, Mapping) else None
    if (
        not isinstance(workers, list)
        or len(workers) != num_workers
        or not is_int(turn)
        or not 0 <= turn < num_workers
    ):
        raise ValueError(
            "DataLoader state field 'dataset' should hold one stream state per worker "
            f"({num_workers}: build the loader with the same num_workers) and the "
            f"next worker's number; got {state!r:.200}"
        )


def count_field(sampler: Any) -> str | None:
    """The count of a built-in sampler's state that a checkpoint lowers (None: not built in)."""
    if isinstance(sampler, BatchSampler):
        return "batches"
    if isinstance(sampler, ResumableSampler):
        return "yielded"
    return None


def check_state(state: Any) -> tuple[bool, int, int, list[int], int]:
    """Checks a DataLoader state; returns in_progress, epoch, batches, received, base_seed."""
    if not isinstance(state, Mapping):
        raise ValueError(
            f"a DataLoader state should be a dict from state_dict(), got {type(state).__name__}"
        )
    if state.get("type") != "DataLoader":
        raise ValueError(f"expected a state from a DataLoader, got type={state.get('type')!r}")
    if state.get("version") != STATE_VERSION:
        raise ValueError(
            f"DataLoader state has version={state.get('version')!r}; this aioload reads "
            f"version {STATE_VERSION}"
        )
    in_progress = state.get("in_progress")
    if not isinstance(in_progress, bool):
        raise ValueError("DataLoader state field 'in_progress' should be a bool")
    counts = {}
    for name in ("epoch", "batches"):
        value = state.get(name)
        if not is_int(value) or value < 0:
            raise ValueError(f"DataLoader state field {name!r} should be an int >= 0")
        counts[name] = value
    received = state.get("received")
    if not isinstance(received, list) or not all(
        is_int(seq) and seq > counts["batches"] for seq in received
    ):
        raise ValueError(
            "DataLoader state field 'received' should be a list of the batch numbers past "
            "'batches' that were received"
        )
    if received != sorted(set(received)):
        raise ValueError("DataLoader state field 'received' should be sorted, without repeats")
    if not in_progress and (counts["batches"] or received):
        raise ValueError(
            "DataLoader state between epochs ('in_progress': false) should have 'batches' 0 "
            "and no 'received'"
        )
    base_seed = state.get("base_seed")
    if in_progress and (not is_int(base_seed) or not 0 <= base_seed < _SEED_LIMIT):
        raise ValueError(
            f"DataLoader state in progress needs an int 'base_seed' in [0, 2**63); "
            f"got {base_seed!r:.50}"
        )
    return in_progress, counts["epoch"], counts["batches"], received, base_seed or 0


_MISSING = object()


def _length(obj: Any) -> int | None:
    """``len(obj)``, or None for an object without a length."""
    if obj is None:
        return None
    try:
        return len(obj)
    except TypeError:
        return None
