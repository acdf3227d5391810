"""The elastic-resume hook every stream dataset shares: resume as recorded, or re-split.

A loader resuming an iterable dataset's epoch with another number of workers (or another
layout) calls the dataset's ``resume_streams(states, num_workers, batch_size)`` (see
:mod:`aioload.checkpoint`). The decision and its checks are the same for shard, JSON-lines
and Parquet streams; only their states and splits differ, so each dataset hands
:func:`resume_streams` its own parts.

Example::

    return resume_streams(states, num_workers, parse, layout_of, fresh, resplit_for)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from aioload.sources.shard_state import ShardStateError

__all__ = ["resume_streams"]


class _State(Protocol):
    epoch: int
    layout: dict[str, Any]


S = TypeVar("S", bound=_State)


def resume_streams(
    states: Sequence[Any],
    num_workers: int,
    parse: Callable[[Any], S],
    layout_of: Callable[[int, int], dict[str, Any]],
    fresh: Callable[[int, int, int], S],
    resplit_for: Callable[[list[S], int, int], Any],
) -> list[Any]:
    """The states a resumed epoch gives each of ``num_workers`` workers (one, with 0).

    Args:
        states: the recorded stream states, one per recorded worker (None: a worker that
            had delivered nothing).
        num_workers: the resumed loader's workers.
        parse: checks one state (raising the dataset's state error), returns it parsed.
        layout_of: ``(worker, workers)``: the layout a worker of this loader streams under.
        fresh: ``(epoch, worker, workers)``: the state of a worker of the recorded loader
            that had delivered nothing (its whole share is left).
        resplit_for: ``(filled, worker, workers)``: worker ``worker``'s share of what the
            parsed states have left, as a JSON state.

    Where the recorded states are this loader's layout they are returned as they are (the
    epoch continues exactly); otherwise every sample they have left is re-split.
    """
    workers = max(num_workers, 1)
    parsed = [None if state is None else parse(state) for state in states]
    known = [state for state in parsed if state is not None]
    if not known:
        return [None] * workers
    epoch = known[0].epoch
    if any(state.epoch != epoch for state in known):
        raise ShardStateError("stream state: the states are of different epochs")
    layouts = [layout_of(worker, workers) for worker in range(workers)]
    if len(parsed) == workers and all(
        state is None or state.layout == layouts[i] for i, state in enumerate(parsed)
    ):
        return list(states)
    filled = [
        state if state is not None else fresh(epoch, i, len(parsed))
        for i, state in enumerate(parsed)
    ]
    return [resplit_for(filled, worker, workers) for worker in range(workers)]
