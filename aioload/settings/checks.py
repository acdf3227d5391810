"""torch's checks of a loader's arguments, one per setting, with torch's errors and messages.

:class:`~aioload.settings.LoaderSettings` calls them in torch's order when it is made
(the first error found is the one raised, as under torch); each returns what its
setting settles to where that differs from what was given (``concurrency=None`` is
:data:`DEFAULT_CONCURRENCY`, a ``batch_sampler`` leaves no ``batch_size``, ...).
:func:`build_samplers` makes the samplers the settings call for. Nothing here knows
how batches are loaded.

Example::

    >>> check_concurrency(None), check_prefetch_factor(None, num_workers=2)
    (256, 2)
    >>> check_in_order(1)
    Traceback (most recent call last):
        ...
    TypeError: in_order should be a bool; got 1
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
import os
import warnings
from typing import Any, Literal

from aioload.checks import is_int
from aioload.samplers.builtin import BatchSampler, RandomSampler, SequentialSampler
from aioload.samplers.offered import offered_sampler
from aioload.samplers.shuffling import Rng

__all__ = [
    "AUTO_MOST_CONCURRENCY",
    "AUTO_START_CONCURRENCY",
    "DEFAULT_CONCURRENCY",
    "DEFAULT_MAX_WORKER_RESTARTS",
    "build_samplers",
    "check_concurrency",
    "check_in_order",
    "check_max_skipped_fraction",
    "check_max_worker_restarts",
    "check_multiprocessing_context",
    "check_num_workers",
    "check_persistent_workers",
    "check_prefetch_factor",
    "check_sampling",
    "check_timeout",
    "epoch_items",
    "warn_excessive_workers",
]

DEFAULT_CONCURRENCY = 256
"""Async item fetches in flight at once on one event loop unless ``concurrency`` says otherwise."""

AUTO_MOST_CONCURRENCY = 4096
"""The highest limit ``concurrency="auto"`` tunes to, on one event loop (the window, sized
for it, holds it to its memory budget)."""

AUTO_START_CONCURRENCY = 32
"""The limit ``concurrency="auto"`` starts from: an eighth of the fixed default, far below
the knee of any remote store, one growth step fewer than 16 from it."""

DEFAULT_MAX_WORKER_RESTARTS = 3
"""Worker deaths one epoch survives (by restarting the worker) unless told otherwise."""


def check_num_workers(num_workers: Any) -> None:
    """Refuses a ``num_workers`` that is not an int >= 0 (torch's message)."""
    if not is_int(num_workers):
        raise TypeError(f"num_workers should be an int; got {num_workers!r}")
    if num_workers < 0:
        raise ValueError(
            "num_workers option should be non-negative; "
            "use num_workers=0 to disable multiprocessing."
        )


def check_timeout(timeout: float) -> None:
    """Refuses a negative ``timeout`` (torch's message)."""
    if timeout < 0:
        raise ValueError("timeout option should be non-negative")


def check_prefetch_factor(prefetch_factor: Any, *, num_workers: int) -> int | None:
    """``prefetch_factor`` checked; with workers and none given, torch's 2."""
    if prefetch_factor is None:
        return 2 if num_workers > 0 else None
    if not is_int(prefetch_factor):
        raise TypeError(f"prefetch_factor should be an int; got {prefetch_factor!r}")
    if prefetch_factor < 1:
        raise ValueError(
            f"prefetch_factor should be a positive integer (batches in flight per "
            f"worker); got {prefetch_factor}"
        )
    return prefetch_factor


def check_persistent_workers(persistent_workers: bool, *, num_workers: int, executor: Any) -> None:
    """Refuses ``persistent_workers`` without workers to keep (torch's message)."""
    if persistent_workers and num_workers == 0 and executor is None:
        raise ValueError("persistent_workers option needs num_workers > 0")


def check_concurrency(concurrency: Any) -> int | Literal["auto"]:
    """``concurrency`` checked; None is :data:`DEFAULT_CONCURRENCY`.

    ``"auto"`` (aioload's own value: torch has no such argument) has the loader tune
    it while it reads (:mod:`aioload.read.tuning`).
    """
    if concurrency is None:
        return DEFAULT_CONCURRENCY
    if concurrency == "auto" and isinstance(concurrency, str):
        return "auto"
    if not is_int(concurrency):
        raise TypeError(f"concurrency should be an int or 'auto'; got {concurrency!r}")
    if concurrency < 1:
        raise ValueError(f"concurrency should be at least 1; got {concurrency}")
    return concurrency


def check_in_order(in_order: Any) -> None:
    """Refuses an ``in_order`` that is not a bool."""
    if not isinstance(in_order, bool):
        raise TypeError(f"in_order should be a bool; got {in_order!r}")


def check_multiprocessing_context(context: Any, *, num_workers: int) -> None:
    """Refuses a ``multiprocessing_context`` without workers, or not a start method (torch's)."""
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


def check_max_worker_restarts(max_worker_restarts: Any) -> None:
    """Refuses a ``max_worker_restarts`` that is not an int >= 0."""
    if not is_int(max_worker_restarts) or max_worker_restarts < 0:
        raise ValueError(
            "max_worker_restarts should be a non-negative integer (worker deaths an epoch "
            f"survives by restarting the worker); got {max_worker_restarts!r}"
        )


def check_sampling(
    *,
    iterable: bool,
    shuffle: bool | None,
    sampler: Any,
    batch_sampler: Any,
    batch_size: Any,
    drop_last: Any,
) -> tuple[bool | None, int | None, bool]:
    """torch's exclusions between the sampling arguments; returns what they settle.

    Returns ``(shuffle, batch_size, drop_last)``: ``shuffle`` a bool for a map-style
    dataset (an iterable one's stays as given, None or False), and with a
    ``batch_sampler`` no ``batch_size`` and no ``drop_last`` (the batch sampler's own).
    """
    if iterable:
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
        return shuffle, None, False
    if batch_size is None:
        if drop_last:
            raise ValueError(
                "batch_size=None option disables auto-batching "
                "and is mutually exclusive with drop_last"
            )
        return shuffle, None, drop_last
    if not is_int(batch_size) or batch_size <= 0:
        raise ValueError(
            "batch_size should be a positive integer value or None, "
            f"but got batch_size={batch_size!r}"
        )
    # torch's BatchSampler checks drop_last; the other branches only test its truth.
    if not isinstance(drop_last, bool):
        raise ValueError(f"drop_last should be a boolean value, but got drop_last={drop_last!r}")
    return shuffle, batch_size, drop_last


def build_samplers(
    dataset: Any,
    *,
    iterable: bool,
    shuffle: bool,
    sampler: Any,
    batch_sampler: Any,
    batch_size: int | None,
    drop_last: bool,
    generator: Rng,
) -> tuple[Any, Any, bool]:
    """The samplers a map-style dataset is read with: ``(sampler, batch_sampler, offered)``.

    The sampler given, else the dataset's own ``default_sampler(shuffle, generator)``
    where it offers one (``offered``: see :mod:`aioload.samplers.offered`), else a
    ``RandomSampler`` with ``shuffle`` or a ``SequentialSampler``; a ``BatchSampler``
    over it for a ``batch_size``. An iterable dataset has none.
    """
    if iterable:
        return sampler, batch_sampler, False
    offered = False
    if sampler is None and batch_sampler is None:
        # A dataset may offer its own (see aioload.samplers.offered): one listed as it goes.
        sampler = offered_sampler(dataset, shuffle, generator)
        offered = sampler is not None
    if sampler is None:
        sampler = (
            RandomSampler(dataset, generator=generator) if shuffle else SequentialSampler(dataset)
        )
    if batch_size is not None and batch_sampler is None:
        batch_sampler = BatchSampler(sampler, batch_size, drop_last)
    return sampler, batch_sampler, offered


def check_max_skipped_fraction(max_skipped: Any, *, sampler: Any, batch_sampler: Any) -> None:
    """Refuses a fraction ``max_skipped`` where the epoch's items cannot be counted."""
    if isinstance(max_skipped, float) and epoch_items(sampler, batch_sampler) is None:
        raise ValueError(
            f"max_skipped={max_skipped!r} is a fraction of the epoch's items, but the "
            "sampler has no length; give a count (an int) instead"
        )


def epoch_items(sampler: Any, batch_sampler: Any) -> int | None:
    """How many items an epoch asks for, when the samplers tell (None: unknown).

    Example::

        >>> from aioload import BatchSampler, SequentialSampler
        >>> epoch_items(None, BatchSampler(SequentialSampler(range(10)), 4, drop_last=True))
        8
    """
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
