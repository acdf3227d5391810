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

Where a rank and a world size come from, decided once for every split (the
stream datasets, :func:`split_by_rank_and_worker`,
:class:`~aioload.DistributedSampler`), each value on its own: the argument
when one is given; else ``torch.distributed``'s default process group when it
is initialised (``get_rank()``, ``get_world_size()``, as torch's
``DistributedSampler`` reads them: ``torch.multiprocessing.spawn`` sets no
variables); else the ``RANK`` and ``WORLD_SIZE`` environment variables, as
``torchrun`` sets them; else the process is the only rank (``0`` of ``1``).
In a loader's worker process they are those of the loader's process, which
the worker receives when it starts (a worker started by ``spawn`` or a fork
server has no process group of its own): :func:`launcher_ranks`.
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

from aioload.checks import is_int
from aioload.worker_info import get_worker_info

__all__ = [
    "LauncherRanks",
    "launcher_rank",
    "launcher_ranks",
    "launcher_world_size",
    "rank_and_world_size",
    "ranks_for_workers",
    "set_loader_ranks",
    "split_by_rank_and_worker",
]

T = TypeVar("T")

LauncherRanks = tuple[int | None, int | None]
"""A rank and a world size as the launcher set them up, each None where nothing says."""

# In a loader's worker process: the loader's process's (set when the worker starts).
_loader_ranks: LauncherRanks | None = None


def launcher_ranks() -> LauncherRanks:
    """This process's rank and world size as its launcher set them up (see the module docstring).

    ``torch.distributed``'s default process group when torch is imported and
    the group is initialised; else ``RANK`` / ``WORLD_SIZE``, each None where
    the variable is not set; in a loader's worker, what the loader's process
    had. Torch is never imported here.

    Raises:
        ValueError: ``RANK`` or ``WORLD_SIZE`` is set but not an integer.

    Example::

        launcher_ranks()   # (None, None): one process; (1, 4) under torchrun's rank 1 of 4
    """
    return launcher_rank(), launcher_world_size()


def _distributed() -> Any:
    """``torch.distributed`` when torch is imported and its default group initialised."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist
    return None


def launcher_rank() -> int | None:
    """The rank of :func:`launcher_ranks` alone (``WORLD_SIZE`` is not read)."""
    if _loader_ranks is not None:
        return _loader_ranks[0]
    dist = _distributed()
    return _from_env("RANK") if dist is None else int(dist.get_rank())


def launcher_world_size() -> int | None:
    """The world size of :func:`launcher_ranks` alone (``RANK`` is not read)."""
    if _loader_ranks is not None:
        return _loader_ranks[1]
    dist = _distributed()
    return _from_env("WORLD_SIZE") if dist is None else int(dist.get_world_size())


def ranks_for_workers() -> LauncherRanks | None:
    """What a loader's workers are to answer for :func:`launcher_ranks`: this process's.

    None when ``RANK`` or ``WORLD_SIZE`` is not an integer: the workers read the
    environment themselves, and fail there only if something splits by rank.
    """
    try:
        return launcher_ranks()
    except ValueError:
        return None


def set_loader_ranks(ranks: LauncherRanks) -> None:
    """In a worker process: :func:`launcher_ranks` answers ``ranks``, the loader process's."""
    global _loader_ranks
    _loader_ranks = ranks


def rank_and_world_size(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """This process's rank and the number of ranks.

    Each one not given comes from :func:`launcher_ranks`: ``torch.distributed``
    when its default process group is initialised, else ``RANK`` /
    ``WORLD_SIZE`` (as ``torchrun`` sets them); when nothing says, the process
    is rank 0 of 1.

    Raises:
        ValueError: a value that is not an integer, a world size below 1, or
            a rank outside ``[0, world_size - 1]``.

    Example::

        >>> rank_and_world_size(1, 4)
        (1, 4)
    """
    if world_size is None:
        world_size = launcher_world_size()
        world_size = 1 if world_size is None else world_size
    if rank is None:
        rank = launcher_rank()
        rank = 0 if rank is None else rank
    if not is_int(world_size) or world_size < 1:
        raise ValueError(f"world_size should be a positive integer; got {world_size!r}")
    if not is_int(rank) or not 0 <= rank < world_size:
        raise ValueError(f"rank should be an integer in [0, {world_size - 1}]; got {rank!r}")
    return rank, world_size


def _from_env(variable: str) -> int | None:
    text = os.environ.get(variable)
    if text is None:
        return None
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
        rank: this rank (default: ``torch.distributed``'s when initialised, else
            ``RANK``, else 0; see :func:`rank_and_world_size`).
        world_size: the number of ranks (default: likewise, or ``WORLD_SIZE``, else 1).

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
