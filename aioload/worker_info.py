"""Which worker this code runs in: :class:`WorkerInfo` and :func:`get_worker_info`.

A leaf module: datasets, sources and :mod:`aioload.ranks` ask it who they are
without importing the worker machinery (its event loop, transport and wire).
The worker process sets the process-wide answer when it starts; an executor
task sets a per-thread one while it runs.
"""

from __future__ import annotations

import threading
from dataclasses import FrozenInstanceError, dataclass
from typing import Any, NoReturn

__all__ = ["WorkerInfo", "get_worker_info", "set_process_worker_info", "set_thread_worker_info"]


@dataclass(frozen=True)
class WorkerInfo:
    """Describes the worker process this code runs in (see :func:`get_worker_info`).

    Attributes:
        id: the worker's number, ``0 <= id < num_workers``.
        num_workers: how many workers the loader has.
        seed: the seed of this worker's random generators (``base_seed + id``).
        dataset: this worker's copy of the dataset.
        batch_size: the loader's ``batch_size`` (None without automatic
            batching): for an iterable dataset, the samples per batch each worker
            makes of its own stream. Not in torch's ``WorkerInfo``: an iterable
            dataset may use it to share its stream out in whole batches, so that
            the workers' batches add up to ``len(loader)``.

    Its attributes are read-only: assigning one raises torch's
    ``RuntimeError("Cannot assign attributes to WorkerInfo objects")`` (which is also
    dataclasses' ``FrozenInstanceError``, an ``AttributeError``).
    """

    id: int
    num_workers: int
    seed: int
    dataset: Any
    batch_size: int | None = None


class _ReadOnlyError(FrozenInstanceError, RuntimeError):
    """Assigning an attribute of a :class:`WorkerInfo`: torch's ``RuntimeError`` there."""


def _read_only(self: WorkerInfo, *_: Any) -> NoReturn:
    raise _ReadOnlyError("Cannot assign attributes to WorkerInfo objects")


# The frozen dataclass's __init__ sets its fields past these, as it does past its own.
WorkerInfo.__setattr__ = _read_only  # type: ignore[method-assign, assignment]
WorkerInfo.__delattr__ = _read_only  # type: ignore[method-assign, assignment]


_worker_info: WorkerInfo | None = None
_thread_info = threading.local()  # set while an executor task runs in this thread


def get_worker_info() -> WorkerInfo | None:
    """The :class:`WorkerInfo` of the worker process calling it; None in the main process.

    Inside a task of the loader's ``executor`` it describes the executor's
    worker (see :mod:`aioload.backends.executor_task`).

    Use it in a dataset's ``__iter__`` or in ``worker_init_fn`` to give each
    worker its own share of an iterable dataset, or to open a per-worker
    resource (a client, a file handle) lazily.

    Example::

        >>> import aioload
        >>> class Range(aioload.IterableDataset):
        ...     def __init__(self, n): self.n = n
        ...     def __iter__(self):
        ...         info = aioload.get_worker_info()
        ...         if info is None:          # num_workers=0: everything here
        ...             return iter(range(self.n))
        ...         return iter(range(info.id, self.n, info.num_workers))
        >>> list(aioload.DataLoader(Range(5), batch_size=None))
        [0, 1, 2, 3, 4]
    """
    if _worker_info is not None:
        return _worker_info
    info: WorkerInfo | None = getattr(_thread_info, "info", None)
    return info


def set_process_worker_info(info: WorkerInfo) -> None:
    """Makes :func:`get_worker_info` return ``info`` everywhere in this (worker) process."""
    global _worker_info
    _worker_info = info


def set_thread_worker_info(info: WorkerInfo | None) -> None:
    """Makes :func:`get_worker_info` return ``info`` in this thread (executor tasks)."""
    _thread_info.info = info
