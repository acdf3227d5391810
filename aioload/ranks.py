"""Splitting a stream between training ranks, then between each rank's workers.

A map-style dataset is split between ranks by its sampler
(:class:`~aioload.DistributedSampler`). An iterable dataset has no sampler:
each rank's copy, and within a rank each worker's copy, must take its own
share of the stream itself, or every sample is read ``world_size ×
num_workers`` times. :func:`split_by_rank_and_worker` does it in ``__iter__``:
the stream (of samples, or better of shards: file names, object keys) is
split by rank first — rank ``r`` of ``w`` keeps items ``r, r + w, r + 2w, …``
— and that share again by worker, so shards are never read twice and every
rank sees the same split whatever its ``num_workers``.

Ranks come from the ``RANK`` and ``WORLD_SIZE`` environment variables as
``torchrun`` sets them (or arguments); without them the process is the only
rank (``0`` of ``1``).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable, Iterator
from typing import TypeVar

from aioload.worker_info import get_worker_info

__all__ = ["rank_and_world_size", "split_by_rank_and_worker"]

T = TypeVar("T")


def rank_and_world_size(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """This process's rank and the number of ranks.

    Each one not given is read from ``RANK`` / ``WORLD_SIZE`` (as ``torchrun``
    sets them); when neither is given nor set, the process is rank 0 of 1.

    Raises:
        ValueError: a value that is not an integer, a world size below 1, or
            a rank outside ``[0, world_size - 1]``.

    Example::

        >>> rank_and_world_size(1, 4)
        (1, 4)
    """
    if world_size is None:
        world_size = _from_env("WORLD_SIZE", 1)
    if rank is None:
        rank = _from_env("RANK", 0)
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size should be a positive integer; got {world_size!r}")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank should be an integer in [0, {world_size - 1}]; got {rank!r}")
    return rank, world_size


def _from_env(variable: str, default: int) -> int:
    text = os.environ.get(variable)
    if text is None:
        return default
    try:
        return int(text)
    except ValueError:
        raise ValueError(
            f"the {variable} environment variable should be an integer; got {text!r}"
        ) from None


def split_by_rank_and_worker(
    items: Iterable[T], *, rank: int | None = None, world_size: int | None = None
) -> Iterator[T]:
    """This rank's and this worker's share of ``items``: split by rank first, then by worker.

    Rank ``r`` of ``w`` keeps items ``r, r + w, …``; worker ``i`` of the
    rank's ``n`` (see :func:`~aioload.get_worker_info`; one worker with
    ``num_workers=0``) keeps every ``n``-th of those from the ``i``-th on. Over
    all ranks and workers every item is taken exactly once, and only the
    items kept are yielded (the others are skipped without being used, so
    split a stream of shard names rather than of decoded samples when you can).

    The shares of ranks differ by at most one item per ``world_size`` items;
    a training loop that needs every rank to take the same number of steps
    should stop all ranks at the shortest share (or use a map-style dataset
    with :class:`~aioload.DistributedSampler`, which pads).

    Args:
        items: any iterable (the same sequence on every rank and worker).
        rank: this rank (default: ``RANK``, else 0).
        world_size: the number of ranks (default: ``WORLD_SIZE``, else 1).

    Example::

        class Shards(aioload.IterableDataset):
            def __init__(self, urls): self.urls = urls
            def __iter__(self):
                for url in aioload.split_by_rank_and_worker(self.urls):
                    yield from read_shard(url)

        >>> list(split_by_rank_and_worker(range(10), rank=1, world_size=2))
        [1, 3, 5, 7, 9]
    """
    rank, world_size = rank_and_world_size(rank, world_size)
    info = get_worker_info()
    worker, workers = (0, 1) if info is None else (info.id, max(1, info.num_workers))
    mine = itertools.islice(items, rank, None, world_size)
    return itertools.islice(mine, worker, None, workers)
