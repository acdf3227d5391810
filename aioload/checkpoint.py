"""Checkpoints of a loader: what a state holds, and checking one before it is loaded.

A state (see :meth:`aioload.DataLoader.state_dict`) describes what the consumer
has *received*: the epoch, the batches received in order (``batches``) and past
them out of order (``received``), the epoch's base seed and the loader
generator's state before drawing it, the sampler's state, and an iterable
dataset's state (one per worker with workers, plus whose turn comes next).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aioload.samplers import BatchSampler, _Resumable
from aioload.scheduler import Progress

__all__ = [
    "STATE_VERSION",
    "EpochStart",
    "Resume",
    "check_state",
    "check_worker_streams",
    "count_field",
    "record_in",
]

STATE_VERSION = 1


@dataclass
class EpochStart:
    """What replays an epoch's start, and what its consumer received (for checkpoints)."""

    number: int
    base_seed: int
    generator: Any  # the loader generator's state before the base-seed draw
    sampler_before: Any  # the sampler's state before the epoch iterated it
    progress: Progress
    sampler_after: Any = None  # a built-in sampler's state once its iteration began


@dataclass
class Resume:
    """Where a loaded in-progress state resumes its epoch."""

    done: int
    received: list[int]
    base_seed: int
    fast_forward: int
    stream_state: Any


def record_in(states: dict[int, Any], seq: int, worker: int, state: Any) -> None:
    states[seq] = (worker, state)


def check_worker_streams(state: Any, num_workers: int) -> None:
    """Checks the per-worker stream states of a checkpoint taken with workers."""
    workers = state.get("workers") if isinstance(state, Mapping) else None
    turn = state.get("next_worker") if isinstance(state, Mapping) else None
    if (
        not isinstance(workers, list)
        or len(workers) != num_workers
        or not isinstance(turn, int)
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
    if isinstance(sampler, _Resumable):
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
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"DataLoader state field {name!r} should be an int >= 0")
        counts[name] = value
    received = state.get("received")
    if not isinstance(received, list) or not all(
        isinstance(seq, int) and not isinstance(seq, bool) and seq > counts["batches"]
        for seq in received
    ):
        raise ValueError(
            "DataLoader state field 'received' should be a list of the batch numbers past "
            "'batches' that were received"
        )
    base_seed = state.get("base_seed")
    if in_progress and (not isinstance(base_seed, int) or isinstance(base_seed, bool)):
        raise ValueError("DataLoader state in progress needs an int 'base_seed'")
    return in_progress, counts["epoch"], counts["batches"], received, base_seed or 0
