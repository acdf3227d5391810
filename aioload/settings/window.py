"""The window of batches in flight that a loader's settings call for.

:func:`window_size` is computed once, when the settings are made
(:attr:`~aioload.settings.LoaderSettings.window`): with workers or an executor, or a
``prefetch_factor``, it is the user's; only the default window on the loop is sized by
what it serves, and held to :data:`DEFAULT_WINDOW_BYTES` once batches are measured.

Example::

    >>> from aioload.data.protocol import inspect_dataset
    >>> window_size(inspect_dataset(range(10)), num_workers=2, prefetch_factor=3,
    ...             concurrency=256, batch_size=4, batch_sampler=None, executor=None)
    (6, None)
"""

from __future__ import annotations

import concurrent.futures
import math
from typing import Any

from aioload.data.protocol import DatasetProtocol
from aioload.settings.executors import executor_size

__all__ = ["DEFAULT_WINDOW_BYTES", "THREADS_FOR_THREAD_SAFE", "window_size"]

DEFAULT_WINDOW_BYTES = 256 << 20
"""The memory the default window on the loop holds at most, once batches are measured."""

THREADS_FOR_THREAD_SAFE = 8
"""The threads that read a ``thread_safe`` sync dataset on the loop at once (at most
``concurrency``): the inline backend starts them, and the default window keeps them busy."""

_LEAST_DEFAULT_WINDOW = 16


def window_size(
    protocol: DatasetProtocol,
    *,
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
