"""The process's count of reads a store throttled (answered 503 or 429), for tuned concurrency.

The store errors of :mod:`aioload.sources.stores.errors` note every throttled read here
(:func:`note_throttle`) as they translate it; a concurrency tuner
(:mod:`aioload.read.tuning`) compares :func:`throttles_noted` between two looks, and
``loader.stats()`` reports what it saw. One count per process: a worker process counts
its own reads; on the loader's loop every loader of the process shares it.

Example::

    >>> before = throttles_noted()
    >>> note_throttle()
    >>> throttles_noted() - before
    1
"""

from __future__ import annotations

import threading

__all__ = ["note_throttle", "throttles_noted"]

_lock = threading.Lock()
_noted = [0]  # a list: updated in place, under the lock (sync reads note from threads)


def note_throttle() -> None:
    """Counts one read the store throttled (any thread)."""
    with _lock:
        _noted[0] += 1


def throttles_noted() -> int:
    """The throttled reads counted in this process so far."""
    return _noted[0]
