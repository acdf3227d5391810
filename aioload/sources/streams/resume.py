"""The elastic resume's bookkeeping: whose states are shared out, and merging ranks' states.

A stream resumed under another layout re-splits what its states have left
(:func:`~aioload.sources.streams.state.resplit`). Over which ranks depends on whose states
they are (:func:`split_over`): the states of one rank are its own leftovers, shared out
over its new workers only; the states of every rank of a job are shared out over the new
job's ranks, then their workers; any other set is refused (it would lose samples, or
repeat them).

:meth:`StreamDataset.merge_states
<aioload.sources.streams.dataset.StreamDataset.merge_states>` makes one loader state out of
every rank's :meth:`DataLoader.state_dict() <aioload.DataLoader.state_dict>`, for a job of
another size. What it needs to know of those states — which ranks were in the epoch, and
what each of their workers' streams recorded — is read here, by :func:`recorded_streams`,
and the merged loader state is written by :func:`merged_loader_state`. The streams
themselves (checking them, filling in what a worker that had not started has left) are the
dataset's.

Example::

    >>> states = [{"in_progress": False, "epoch": 1, "fits": {"num_workers": 0}}] * 2
    >>> recorded_streams(states).running
    []
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from aioload.checks import is_int

__all__ = ["Recorded", "RecordedStream", "merged_loader_state", "recorded_streams", "split_over"]


def split_over(
    layouts: Iterable[Mapping[str, Any]],
    rank: int,
    world_size: int,
    fail: Callable[[str], NoReturn],
) -> tuple[int, int]:
    """The ranks what states of ``layouts`` have left is shared out over: ``(rank, world_size)``.

    ``(0, 1)`` for states of this rank, ``rank`` of ``world_size`` (its leftovers are its
    own: only its workers share them); ``(rank, world_size)`` for the states of every rank
    of a job (a merge: each rank takes its share).

    Args:
        layouts: the layouts of the states (their ``"rank"`` and ``"world_size"``).
        rank: the rank resuming them.
        world_size: the ranks of the job resuming them.
        fail: raises the format's error with the message (states of another rank, or of
            some of a job's ranks only).

    Example::

        >>> def fail(message): raise ValueError(message)
        >>> split_over([{"rank": 1, "world_size": 2}], 1, 2, fail)
        (0, 1)
        >>> split_over([{"rank": 0, "world_size": 2}, {"rank": 1, "world_size": 2}], 0, 3, fail)
        (0, 3)
    """
    owners = {(layout.get("rank"), layout.get("world_size")) for layout in layouts}
    if owners == {(rank, world_size)}:
        return 0, 1
    sizes = {size for _, size in owners}
    size = next(iter(sizes)) if len(sizes) == 1 else None
    if (
        is_int(size)
        and len(owners) == size
        and all(isinstance(owner, int) and 0 <= owner < size for owner, _ in owners)
    ):
        return rank, world_size
    ranks = ", ".join(sorted(repr(owner) for owner, _ in owners))
    of = ", ".join(sorted(map(repr, sizes)))
    fail(
        f"the states are of rank(s) {ranks:.80} of {of:.40}, this dataset is rank {rank} of "
        f"{world_size}: resume a rank from its own states, or every rank from all ranks' "
        "states (merge_states)"
    )


@dataclass(frozen=True)
class RecordedStream:
    """One worker's stream in a rank's loader state.

    Attributes:
        rank: the rank whose loader recorded it.
        worker: the worker of that rank.
        workers: that rank's workers (1 with ``num_workers=0``).
        batch_size: that loader's batch size.
        state: the stream's state as recorded (None: the worker had delivered nothing).
    """

    rank: int
    worker: int
    workers: int
    batch_size: int | None
    state: Any


@dataclass(frozen=True)
class Recorded:
    """What every rank's loader state says of the epoch being merged.

    Attributes:
        running: the loader states of the ranks in an epoch (none: nothing to merge).
        streams: every worker's stream of every rank, in rank and worker order.
        ended: ``(rank, worker)`` of the streams of ranks that had ended the epoch
            (recorded as None: nothing of theirs is left).
    """

    running: list[Mapping[str, Any]]
    streams: list[RecordedStream] = field(default_factory=list)
    ended: set[tuple[int, int]] = field(default_factory=set)


def recorded_streams(loader_states: Sequence[Mapping[str, Any]]) -> Recorded:
    """The streams every rank's loader state (in rank order) recorded of the epoch in progress.

    A rank whose loader had not started that epoch has its workers' streams as None (all
    left); one that had ended it (its state is of the next epoch, between epochs), as None
    and marked in :attr:`Recorded.ended` (nothing left).

    Raises:
        ValueError: no state, one that is not a loader's ``state_dict()``, or ranks in
            epochs that are not the same (or the one after it, ended).

    Example::

        recorded = recorded_streams(states)   # one DataLoader.state_dict() per rank
        [stream.state for stream in recorded.streams]
    """
    if not loader_states:
        raise ValueError("merge_states needs every rank's loader state; got none")
    if not all(isinstance(state, Mapping) for state in loader_states):
        raise ValueError("merge_states needs every rank's loader state_dict(), a dict each")
    running = [state for state in loader_states if state.get("in_progress")]
    if not running:
        return Recorded(running)  # between epochs, or not started: nothing to merge
    epoch = running[0].get("epoch")
    recorded: list[RecordedStream] = []
    ended: set[tuple[int, int]] = set()
    for rank, state in enumerate(loader_states):
        fits = state.get("fits")
        if not isinstance(fits, Mapping):
            raise ValueError(f"rank {rank}'s loader state has no 'fits': not a state_dict()")
        num_workers, batch_size = fits.get("num_workers") or 0, fits.get("batch_size")
        dataset = state.get("dataset")
        if state.get("in_progress") and state.get("epoch") == epoch:
            streams = (
                dataset.get("workers")
                if num_workers and isinstance(dataset, Mapping)
                else [dataset]
            )
        elif not state.get("in_progress") and state.get("epoch") in (epoch, _next(epoch)):
            # Not started (all left), or ended (nothing left: marked for below).
            streams = [None] * max(num_workers, 1)
            if state.get("epoch") != epoch:
                ended.update((rank, worker) for worker in range(len(streams)))
        else:
            raise ValueError(
                f"rank {rank}'s loader state is of epoch {state.get('epoch')!r:.20}, rank "
                f"{loader_states.index(running[0])}'s of {epoch!r:.20}: merge states taken "
                "at the same time"
            )
        if not isinstance(streams, list):
            raise ValueError(f"rank {rank}'s loader state has no stream state per worker")
        for worker, stream in enumerate(streams):
            recorded.append(RecordedStream(rank, worker, max(num_workers, 1), batch_size, stream))
    return Recorded(running, recorded, ended)


def merged_loader_state(
    loader_states: Sequence[Mapping[str, Any]],
    running: Mapping[str, Any],
    streams: list[Any],
    length: int | None,
) -> dict[str, Any]:
    """The loader state every rank of the new job loads: ``running``'s (the first rank in
    the epoch), with ``streams`` as its workers' and the fewest batches any rank had received.

    Args:
        loader_states: every rank's loader state, in rank order.
        running: the first of them in the epoch.
        streams: the stream state of every worker of every rank, as the merged workers'.
        length: the dataset's length for a rank of the new job (None: it has none).
    """
    merged = copy.deepcopy(dict(running))
    merged["dataset"] = {"workers": streams, "next_worker": 0}
    merged["fits"] = {
        **running["fits"],
        "num_workers": len(streams),
        "dataset_length": length,  # this rank's share now
    }
    merged["batches"] = min(int(state.get("batches", 0)) for state in loader_states)
    merged["received"] = []
    return merged


def _next(epoch: Any) -> Any:
    """The epoch after ``epoch``, when it is one (a loader state's field, unchecked)."""
    return epoch + 1 if is_int(epoch) else None
