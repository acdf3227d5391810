"""What the settings know of an ``executor``: whether it can run a loader's batches, and its size.

A loader refuses an executor that cannot work when it is built (:func:`check_executor`),
and sizes its window by the tasks the executor runs at once (:func:`executor_size`).
dask.distributed's executor is recognised without importing dask (:func:`is_dask`),
and its workers are listed the one way both old and new dask accept
(:func:`dask_workers`); the executor backend uses both too.

Example::

    >>> import concurrent.futures
    >>> with concurrent.futures.ThreadPoolExecutor(4) as pool:
    ...     executor_size(pool), is_dask(pool)
    (4, False)
"""

from __future__ import annotations

import concurrent.futures
import sys
from typing import Any

__all__ = ["check_executor", "dask_workers", "executor_size", "is_dask"]


def _dask_executor_type() -> type | None:
    """dask.distributed's ``ClientExecutor`` when distributed is imported (never imports it)."""
    module = sys.modules.get("distributed.cfexecutor")
    found = getattr(module, "ClientExecutor", None)
    return found if isinstance(found, type) else None


def is_dask(executor: concurrent.futures.Executor) -> bool:
    """Whether ``executor`` is dask.distributed's (``Client.get_executor()``).

    Example::

        >>> import concurrent.futures
        >>> is_dask(concurrent.futures.ThreadPoolExecutor(1))
        False
    """
    kind = _dask_executor_type()
    return kind is not None and isinstance(executor, kind)


def dask_workers(client: Any) -> dict[str, Any]:
    """The cluster's workers by address, with their names and threads.

    Example::

        workers = dask_workers(executor._client)   # {address: {"nthreads": 2, ...}, ...}
    """
    try:
        info = client.scheduler_info(n_workers=-1)  # all of them (newer dask lists 5 by default)
    except TypeError:  # a dask without n_workers lists them all
        info = client.scheduler_info()
    workers: dict[str, Any] = info["workers"]
    return workers


def check_executor(
    executor: Any, *, num_workers: int, persistent_workers: bool, iterable: bool
) -> None:
    """Refuses an ``executor`` argument that cannot work, saying what is allowed.

    dask's executor merges identical calls by default (``pure=True``: a task's key is
    a hash of its function and arguments), so a batch asked for again — a later epoch
    with the same seed, a retry — would silently get the earlier result: such an
    executor is refused.

    Raises:
        TypeError: ``executor`` is not a ``concurrent.futures.Executor``.
        ValueError: it is combined with ``num_workers > 0`` or
            ``persistent_workers``, the dataset is iterable, or it is a dask
            executor with ``pure=True``.

    Example::

        >>> import concurrent.futures
        >>> pool = concurrent.futures.ThreadPoolExecutor(2)
        >>> check_executor(pool, num_workers=0, persistent_workers=False, iterable=False)
        >>> try:
        ...     check_executor(pool, num_workers=2, persistent_workers=False, iterable=False)
        ... except ValueError as error:
        ...     print(str(error)[:49])
        executor and num_workers=2 are mutually exclusive
    """
    if not isinstance(executor, concurrent.futures.Executor):
        raise TypeError(
            "executor should be a concurrent.futures.Executor (a ThreadPoolExecutor, a "
            "ProcessPoolExecutor, or a distributed engine's, such as dask's "
            f"Client.get_executor(pure=False)) or None; got {type(executor).__name__}"
        )
    if num_workers > 0:
        raise ValueError(
            f"executor and num_workers={num_workers} are mutually exclusive: batches run "
            "either in aioload's own worker processes (num_workers > 0) or as tasks of the "
            "executor; pass num_workers=0 with an executor"
        )
    if persistent_workers:
        raise ValueError(
            "persistent_workers applies to aioload's own worker processes (num_workers > 0); "
            "an executor's workers are the executor's and outlive every epoch already"
        )
    if iterable:
        raise ValueError(
            "executor runs a map-style dataset's batches as independent tasks; an iterable "
            "dataset's stream cannot be split into tasks: use num_workers > 0 (and shard the "
            "stream with aioload.get_worker_info() or aioload.split_by_rank_and_worker)"
        )
    if is_dask(executor) and executor._kwargs.get("pure", True):  # type: ignore[attr-defined]
        raise ValueError(
            "this dask executor was made with pure=True (Client.get_executor()'s default): "
            "dask would merge tasks with equal arguments, so a batch fetched again (a later "
            "epoch with the same seed, a retry) would silently return the earlier result "
            "instead of being read anew; use client.get_executor(pure=False)"
        )


def executor_size(executor: concurrent.futures.Executor) -> int | None:
    """How many tasks the executor runs at once, as far as it tells (None: unknown).

    Example::

        >>> import concurrent.futures
        >>> executor_size(concurrent.futures.ThreadPoolExecutor(3))
        3
    """
    if is_dask(executor):
        try:
            workers = dask_workers(executor._client)  # type: ignore[attr-defined]
            return sum(int(worker.get("nthreads", 1)) for worker in workers.values()) or None
        except Exception:
            return None
    size = getattr(executor, "_max_workers", None)
    return size if isinstance(size, int) and size > 0 else None
