"""The loader's arguments: torch's checks, and what they settle.

:func:`check_arguments` validates what ``DataLoader(...)`` was given, with
torch's messages where torch has them, and returns the :class:`LoaderArguments`
they settle: the samplers built (the dataset's own ``default_sampler()`` where it offers
one, see :mod:`aioload.samplers.offered`; else ``shuffle`` → a ``RandomSampler``; a
``batch_size`` → a ``BatchSampler``), defaults filled in, the fault policy and
the dataset's protocol. Nothing here knows how batches are loaded.
"""

from __future__ import annotations

import concurrent.futures
import math
import multiprocessing
import multiprocessing.context
import os
import warnings
from dataclasses import dataclass
from typing import Any

from aioload.backends.executor import check_executor, executor_size
from aioload.backends.inline import THREADS_FOR_THREAD_SAFE
from aioload.data.protocol import DatasetProtocol, inspect_dataset
from aioload.faults.guard import check_stream_policy
from aioload.faults.policy import FaultPolicy, RetryPolicy
from aioload.samplers.builtin import BatchSampler, RandomSampler, SequentialSampler, as_generator
from aioload.samplers.offered import offered_sampler
from aioload.samplers.shuffling import Rng

__all__ = [
    "DEFAULT_CONCURRENCY",
    "DEFAULT_MAX_WORKER_RESTARTS",
    "DEFAULT_WINDOW_BYTES",
    "LoaderArguments",
    "check_arguments",
    "epoch_items",
    "warn_excessive_workers",
    "window_size",
]

DEFAULT_CONCURRENCY = 256
"""Async item fetches in flight at once on one event loop unless ``concurrency`` says otherwise."""

DEFAULT_MAX_WORKER_RESTARTS = 3
"""Worker deaths one epoch survives (by restarting the worker) unless told otherwise."""

DEFAULT_WINDOW_BYTES = 256 << 20
"""The memory the default window on the loop holds at most, once batches are measured."""

_LEAST_DEFAULT_WINDOW = 16


@dataclass(frozen=True)
class LoaderArguments:
    """What a loader's arguments settle (see :func:`check_arguments`)."""

    protocol: DatasetProtocol
    batch_size: int | None
    drop_last: bool
    sampler: Any
    batch_sampler: Any
    generator: Rng
    prefetch_factor: int | None
    concurrency: int
    policy: FaultPolicy
    sampler_offered: bool = False  # the sampler is the dataset's default_sampler()'s


def check_arguments(
    dataset: Any,
    *,
    batch_size: int | None,
    shuffle: bool | None,
    sampler: Any,
    batch_sampler: Any,
    num_workers: int,
    drop_last: bool,
    timeout: float,
    multiprocessing_context: Any,
    generator: Any,
    prefetch_factor: int | None,
    persistent_workers: bool,
    in_order: bool,
    concurrency: int | None,
    max_worker_restarts: int,
    retry: RetryPolicy | None,
    item_timeout: float | None,
    on_error: Any,
    max_skipped: int | float | None,
    executor: concurrent.futures.Executor | None,
) -> LoaderArguments:
    """Checks a ``DataLoader``'s arguments as torch does; returns what they settle.

    Raises:
        ValueError, TypeError: an argument is invalid or excludes another; the
            message says which and what is allowed.

    Example::

        >>> given = dict(
        ...     batch_size=4, shuffle=True, sampler=None, batch_sampler=None,
        ...     num_workers=0, drop_last=False, timeout=0, multiprocessing_context=None,
        ...     generator=0, prefetch_factor=None, persistent_workers=False, in_order=True,
        ...     concurrency=None, max_worker_restarts=3, retry=None, item_timeout=None,
        ...     on_error="raise", max_skipped=None, executor=None,
        ... )   # what DataLoader(range(10), batch_size=4, shuffle=True, generator=0) passes
        >>> args = check_arguments(range(10), **given)
        >>> type(args.sampler).__name__, type(args.batch_sampler).__name__, args.concurrency
        ('RandomSampler', 'BatchSampler', 256)
        >>> check_arguments(range(10), **{**given, "sampler": range(10)})
        Traceback (most recent call last):
            ...
        ValueError: sampler option is mutually exclusive with shuffle
    """
    if not isinstance(num_workers, int) or isinstance(num_workers, bool):
        raise TypeError(f"num_workers should be an int; got {num_workers!r}")
    if num_workers < 0:
        raise ValueError(
            "num_workers option should be non-negative; "
            "use num_workers=0 to disable multiprocessing."
        )
    if timeout < 0:
        raise ValueError("timeout option should be non-negative")
    if prefetch_factor is not None:
        if not isinstance(prefetch_factor, int) or isinstance(prefetch_factor, bool):
            raise TypeError(f"prefetch_factor should be an int; got {prefetch_factor!r}")
        if prefetch_factor < 1:
            raise ValueError(
                f"prefetch_factor should be a positive integer (batches in flight per "
                f"worker); got {prefetch_factor}"
            )
    elif num_workers > 0:
        prefetch_factor = 2
    if persistent_workers and num_workers == 0 and executor is None:
        raise ValueError("persistent_workers option needs num_workers > 0")
    if concurrency is None:
        concurrency = DEFAULT_CONCURRENCY
    elif not isinstance(concurrency, int) or isinstance(concurrency, bool):
        raise TypeError(f"concurrency should be an int; got {concurrency!r}")
    elif concurrency < 1:
        raise ValueError(f"concurrency should be at least 1; got {concurrency}")
    if not isinstance(in_order, bool):
        raise TypeError(f"in_order should be a bool; got {in_order!r}")
    _check_multiprocessing_context(multiprocessing_context, num_workers)
    if (
        not isinstance(max_worker_restarts, int)
        or isinstance(max_worker_restarts, bool)
        or max_worker_restarts < 0
    ):
        raise ValueError(
            "max_worker_restarts should be a non-negative integer (worker deaths an epoch "
            f"survives by restarting the worker); got {max_worker_restarts!r}"
        )

    policy = FaultPolicy(retry, item_timeout, on_error, max_skipped)

    protocol = inspect_dataset(dataset)
    if protocol.iterable and policy.active:
        check_stream_policy(dataset, policy)  # a stream applies it only if it opted in
    if executor is not None:
        check_executor(
            executor,
            num_workers=num_workers,
            persistent_workers=persistent_workers,
            iterable=protocol.iterable,
        )
    if protocol.iterable:
        if shuffle not in {False, None}:
            raise ValueError(
                "DataLoader with IterableDataset: expected unspecified shuffle option, "
                f"but got shuffle={shuffle}"
            )
        if sampler is not None:
            raise ValueError(
                "DataLoader with IterableDataset: expected unspecified sampler option, "
                f"but got sampler={sampler}"
            )
        if batch_sampler is not None:
            raise ValueError(
                "DataLoader with IterableDataset: expected unspecified batch_sampler "
                f"option, but got batch_sampler={batch_sampler}"
            )
    else:
        shuffle = bool(shuffle)

    if sampler is not None and shuffle:
        raise ValueError("sampler option is mutually exclusive with shuffle")
    if batch_sampler is not None:
        if batch_size != 1 or shuffle or sampler is not None or drop_last:
            raise ValueError(
                "batch_sampler option is mutually exclusive "
                "with batch_size, shuffle, sampler, and drop_last"
            )
        batch_size = None
        drop_last = False
    elif batch_size is None:
        if drop_last:
            raise ValueError(
                "batch_size=None option disables auto-batching "
                "and is mutually exclusive with drop_last"
            )
    else:
        _check_batch_size(batch_size)
        # torch's BatchSampler checks drop_last; the other branches only test its truth.
        if not isinstance(drop_last, bool):
            raise ValueError(
                f"drop_last should be a boolean value, but got drop_last={drop_last!r}"
            )

    rng = as_generator(generator)
    offered = False
    if not protocol.iterable:
        if sampler is None and batch_sampler is None:
            # A dataset may offer its own (see aioload.samplers.offered): one listed as it goes.
            sampler = offered_sampler(dataset, bool(shuffle), rng)
            offered = sampler is not None
        if sampler is None:
            sampler = (
                RandomSampler(dataset, generator=rng) if shuffle else SequentialSampler(dataset)
            )
        if batch_size is not None and batch_sampler is None:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)

    arguments = LoaderArguments(
        protocol=protocol,
        batch_size=batch_size,
        drop_last=drop_last,
        sampler=sampler,
        batch_sampler=batch_sampler,
        generator=rng,
        prefetch_factor=prefetch_factor,
        concurrency=concurrency,
        policy=policy,
        sampler_offered=offered,
    )
    if isinstance(max_skipped, float) and epoch_items(sampler, batch_sampler) is None:
        raise ValueError(
            f"max_skipped={max_skipped!r} is a fraction of the epoch's items, but the "
            "sampler has no length; give a count (an int) instead"
        )
    return arguments


def window_size(
    *,
    protocol: DatasetProtocol,
    num_workers: int,
    prefetch_factor: int | None,
    concurrency: int,
    batch_size: int | None,
    batch_sampler: Any,
    executor: concurrent.futures.Executor | None,
) -> tuple[int, int | None]:
    """The most batches in flight at once (see :attr:`aioload.DataLoader.window`), and the
    memory budget the epoch sizes that window down to (None: the window is the user's).

    Only the default window on the loop (``num_workers=0``, no ``prefetch_factor``) is
    sized by what it serves: twice the batches that keep ``concurrency`` items in
    flight where items can be in flight together (an async dataset; a sync one that
    is ``thread_safe``, up to its threads), and at least 16: a stream or a sync
    dataset reads one batch after another, but a deeper window lets the loop run
    ahead of the consumer and hand batches over in runs. It is then held to
    :data:`DEFAULT_WINDOW_BYTES` of batches once their size is measured.
    """
    if executor is not None:
        return (prefetch_factor or 2) * (executor_size(executor) or 1), None
    if prefetch_factor is not None:
        return prefetch_factor * max(1, num_workers), None
    if num_workers > 0:
        return 2 * num_workers, None
    if protocol.iterable:
        in_flight = 1
    elif protocol.is_async:
        in_flight = concurrency
    elif protocol.thread_safe:
        in_flight = min(concurrency, THREADS_FOR_THREAD_SAFE)
    else:
        in_flight = 1
    batch = batch_size or getattr(batch_sampler, "batch_size", None)
    if not isinstance(batch, int) or batch < 1:
        batch = 32 if batch_sampler is not None else 1
    return max(_LEAST_DEFAULT_WINDOW, 2 * math.ceil(in_flight / batch)), DEFAULT_WINDOW_BYTES


def warn_excessive_workers(num_workers: int, *, stacklevel: int) -> None:
    """Warns, with torch's words, when ``num_workers`` exceeds the CPUs this process may use.

    ``stacklevel`` counts from the caller of this function, so that the warning
    points at the user's line.
    """
    if num_workers <= 0:
        return
    cpuset_checked = hasattr(os, "sched_getaffinity")
    suggested = len(os.sched_getaffinity(0)) if cpuset_checked else os.cpu_count()
    if suggested is not None and num_workers <= suggested:
        return
    if suggested is None:
        advice = (
            "DataLoader is not able to compute a suggested max number of worker in current system."
        )
    else:
        advice = (
            f"Our suggested max number of worker in current system is {suggested}"
            f"{'' if cpuset_checked else ' (`cpuset` is not taken into account)'}, which is "
            "smaller than what this DataLoader is going to create."
        )
    warnings.warn(
        f"This DataLoader will create {num_workers} worker processes in total. {advice} "
        "Please be aware that excessive worker creation might get DataLoader running slow or "
        "even freeze, lower the worker number to avoid potential slowness/freeze if necessary.",
        UserWarning,
        stacklevel=stacklevel + 1,
    )


def epoch_items(sampler: Any, batch_sampler: Any) -> int | None:
    """How many items an epoch asks for, when the samplers tell (None: unknown)."""
    try:
        if batch_sampler is None:
            return len(sampler)
        inner = getattr(batch_sampler, "sampler", None)
        batch_size = getattr(batch_sampler, "batch_size", None)
        if inner is None or not isinstance(batch_size, int) or batch_size < 1:
            return None
        items = len(inner)
    except TypeError:
        return None
    if getattr(batch_sampler, "drop_last", False):
        items -= items % batch_size
    return items


def _check_batch_size(batch_size: Any) -> None:
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0:
        raise ValueError(
            "batch_size should be a positive integer value or None, "
            f"but got batch_size={batch_size!r}"
        )


def _check_multiprocessing_context(context: Any, num_workers: int) -> None:
    if context is None:
        return
    if num_workers == 0:
        raise ValueError(
            "multiprocessing_context can only be used with multi-process loading "
            f"(num_workers > 0), but got num_workers={num_workers}"
        )
    if isinstance(context, str):
        start_methods = multiprocessing.get_all_start_methods()
        if context not in start_methods:
            raise ValueError(
                "multiprocessing_context option should specify a valid start method in "
                f"{start_methods!r}, but got multiprocessing_context={context!r}"
            )
    elif not isinstance(context, multiprocessing.context.BaseContext):
        raise TypeError(
            "multiprocessing_context option should be a valid context object or a string "
            f"specifying the start method, but got multiprocessing_context={context!r}"
        )
