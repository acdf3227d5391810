"""How worker processes start: ``fork`` where it is safe, the fork server otherwise.

torch forks its workers (Linux's default start method): they start in
milliseconds, inherit the dataset instead of unpickling a copy of it, and a
script needs no ``if __name__ == "__main__":`` guard. But ``fork`` copies only
the thread that calls it: a lock another thread holds at that moment
(logging's, a ``queue.Queue``'s, one of the user's) stays locked for ever in
the child, and the worker hangs the first time it takes it. Python 3.12 warns
about exactly this ("This process is multi-threaded, use of fork() may lead to
deadlocks in the child").

So when the loader's ``multiprocessing_context`` is left unset, aioload
chooses each time it starts workers (:func:`auto_start_method`):

- ``fork`` when the thread starting them is the process's only Python
  thread. That is the classic script: the sync facade forks its workers in
  the caller's thread *before* it starts its own loop thread, and ``async
  for`` forks them on the loop's thread when nothing else runs;
- the fork server otherwise (``spawn`` where there is none): an async
  service with thread pools, a script with a background thread, a worker
  restarted in the middle of an epoch (the loop thread runs then).

Native threads count when a runtime started and named them (tokio's, which
obstore starts at its first request: a worker forked after that hangs at its
own first request). Pool threads that keep their creator's name (OpenBLAS's)
do not, as they do not for Python's warning: they hold no Python lock, and
the libraries that start them make them safe across ``fork``
(``pthread_atfork``), as they must for torch's own workers.

aioload's own threads of an epoch end with it (the sync facade joins its loop
thread when the iteration ends or is dropped), so they do not stand in the way
of the next epoch's fork.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
import os
import sys
import threading
import time

__all__ = [
    "auto_start_method",
    "fallback_context",
    "fork_is_safe",
    "named_native_threads",
    "other_threads",
    "start_method_context",
    "threads_in_the_way",
    "wait_until_gone",
]


def other_threads() -> list[threading.Thread]:
    """The Python threads of this process other than the caller's."""
    current = threading.current_thread()
    return [thread for thread in threading.enumerate() if thread is not current]


_GONE_WAIT = 0.1  # seconds a joined thread's system thread gets to disappear


def wait_until_gone(thread: threading.Thread) -> None:
    """Returns once the system thread of joined ``thread`` has left the process (Linux).

    ``Thread.join`` returns when the thread's Python state is gone, a moment
    before the system thread itself exits; a fork in that moment sees two
    threads, and Python 3.12 warns that the process is multi-threaded.
    aioload joins its loop thread with this before the next epoch's fork.
    Waits at most a tenth of a second, polling ``/proc/self/task``.
    """
    native_id = thread.native_id
    if native_id is None or sys.platform != "linux":
        return
    deadline = time.monotonic() + _GONE_WAIT
    while os.path.exists(f"/proc/self/task/{native_id}") and time.monotonic() < deadline:
        time.sleep(0.0005)


def named_native_threads() -> list[str]:
    """The names of this process's threads that a native library started and named.

    Read from ``/proc/self/task/*/comm`` (Linux): a thread takes its
    creator's name unless it sets its own, so a thread named otherwise than
    the main thread belongs to a runtime that names its threads — tokio's
    (``tokio-rt-worker``, started by obstore's first request), gRPC's — and
    such runtimes do not survive a fork: a worker forked after obstore has
    been used hangs at its first request. Pool threads that keep their
    creator's name (OpenBLAS's) are made fork-safe by their libraries.
    Python threads keep the name too (before Python 3.14); they are counted
    by :func:`other_threads`.
    """
    try:
        with open("/proc/self/comm") as file:
            main_name = file.read().strip()
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return []
    current = str(threading.get_native_id())
    python_threads = {str(thread.native_id) for thread in threading.enumerate()}
    names = []
    for task in tasks:
        if task == current or task in python_threads:
            continue
        try:
            with open(f"/proc/self/task/{task}/comm") as file:
                name = file.read().strip()
        except OSError:  # the thread ended meanwhile
            continue
        if name != main_name:
            names.append(name)
    return names


def threads_in_the_way() -> list[str]:
    """The names of the threads that make a fork unsafe now (see :func:`fork_is_safe`)."""
    return [thread.name for thread in other_threads()] + named_native_threads()


def fork_is_safe() -> bool:
    """True when forking now cannot leave a child with a lock another thread held.

    Only on Linux (macOS's system libraries are not safe across ``fork``,
    which is why Python does not fork there by default), and only when the
    calling thread is the process's only Python thread and no native runtime
    that names its threads runs (see :func:`named_native_threads`).
    """
    if sys.platform != "linux" or "fork" not in multiprocessing.get_all_start_methods():
        return False
    return not threads_in_the_way()


def fallback_context() -> multiprocessing.context.BaseContext:
    """Where aioload chooses but cannot fork safely: the fork server (``spawn`` without one)."""
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")


def auto_start_method() -> str:
    """The start method for workers started now: ``fork`` if safe, else the fallback's."""
    return "fork" if fork_is_safe() else fallback_context().get_start_method()


def start_method_context(
    context: multiprocessing.context.BaseContext | str | None,
) -> multiprocessing.context.BaseContext | None:
    """The context a loader's ``multiprocessing_context`` names; None: choose at each start."""
    if context is None or isinstance(context, multiprocessing.context.BaseContext):
        return context
    return multiprocessing.get_context(context)
