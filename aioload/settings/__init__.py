"""A loader's settings: one frozen object, made once per loader, passed whole.

- ``core``: :class:`LoaderSettings`, every argument of :class:`~aioload.DataLoader` with
  its default and its doc, checked when made, and what the arguments settle (samplers,
  the fault policy, the window);
- ``checks``: torch's checks, one per setting;
- ``window``: the window of batches in flight;
- ``executors``: what an ``executor`` must be, and its size.

Its floor is between ``backends`` (which receive the settings whole) and ``read``: it
imports ``read``, ``faults``, ``collate``, ``samplers`` and the leaves, never
``backends`` or ``pipeline``.

Example::

    >>> from aioload.settings import LoaderSettings
    >>> LoaderSettings(dataset=range(10), batch_size=4).index_sampler.batch_size
    4
"""

from aioload.settings.checks import DEFAULT_CONCURRENCY, DEFAULT_MAX_WORKER_RESTARTS
from aioload.settings.core import (
    LIVE_SETTINGS,
    LOADER_ARGUMENTS,
    LOADER_ATTRIBUTES,
    LoaderSettings,
)
from aioload.settings.window import DEFAULT_WINDOW_BYTES, THREADS_FOR_THREAD_SAFE

__all__ = [
    "DEFAULT_CONCURRENCY",
    "DEFAULT_MAX_WORKER_RESTARTS",
    "DEFAULT_WINDOW_BYTES",
    "LIVE_SETTINGS",
    "LOADER_ARGUMENTS",
    "LOADER_ATTRIBUTES",
    "THREADS_FOR_THREAD_SAFE",
    "LoaderSettings",
]
