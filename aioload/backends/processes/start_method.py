"""How worker processes start: the rule, in one place.

``multiprocessing_context`` names how workers start. Left unset (None), as in
torch, it is ``multiprocessing``'s default context: ``fork`` on Linux up to
Python 3.13 (``forkserver`` from 3.14, ``spawn`` on macOS and Windows), and
whatever ``multiprocessing.set_start_method`` chose. :func:`worker_start`
applies the rule each time workers start (a restart included):

1. **A start method that is not** ``fork`` (``spawn``, ``forkserver``: chosen,
   or Python's default) is used as it is. Each worker runs the main script
   again (as ``__mp_main__``), so a script needs its ``if __name__ ==
   "__main__":`` guard, and :mod:`aioload.backends.processes.main_module` refuses one without it
   before any worker starts, with one error naming the fix.
2. ``fork`` **chosen by name** (``multiprocessing_context="fork"``) forks the
   workers from the loader's process, whatever runs in it.
3. ``fork`` **as the default** forks them from the loader's process too, as
   torch does, whatever Python threads run (a ``tqdm`` bar's monitor, a
   logging ``QueueListener``, a metrics exporter): they inherit the dataset
   and the script needs no guard. Except where a native runtime that does not
   survive a fork runs in the process (:func:`runtimes_in_the_way`): obstore's
   tokio threads (a worker forked after the parent's first request hangs at
   its own) or CUDA initialised by torch. (Other native threads, libzmq's in a
   Jupyter kernel, serve libraries a worker does not call, as under torch.)
   Then:

   - they are forked from aioload's **fork template**
     (:mod:`aioload.backends.processes.fork_template`), a process forked from this one
     before that runtime started, when the process had loaded a library that
     can start one (obstore, a CUDA or ROCm build of torch): at the first
     loader with workers, and again at each epoch's start while it is still
     safe (:func:`keep_template_ready`). The template does not run the script
     again; the setup reaches the workers pickled (as under ``forkserver``,
     large arrays in one shared segment);
   - without a template that is fresh (the script's classes and functions are
     those it was forked with) and holds every class and function of
     ``__main__`` the workers name: CUDA alone still forks from the loader's
     process, as torch does (a forked worker must not use CUDA, as under
     torch); obstore's threads send the workers to the fork server (``spawn``
     where there is none), with rule 1's guard. That is the case of a script
     that made a request before any loader with workers existed.

A **restart** (a worker died mid-epoch) follows the same rule at that moment,
so it never runs the script again where its epoch's first workers did not:
forked from the loader's process, or from the template where a runtime stands
in the way; where only the fork server is left, the script is checked for its
guard first, and an unguarded one fails the epoch with that error.

Python 3.12+ warns (``DeprecationWarning``, hidden by default) when a process
with other threads forks: the warning is let through, as under torch; a lock
another thread holds at that moment stays held in the worker (Python's
``logging`` re-creates its own after a fork). A user whose threads hold their
own locks across the fork chooses ``forkserver`` or ``spawn``. aioload's own
threads of an epoch end with it (the sync facade forks its workers before it
starts its loop thread, and joins that thread when the iteration ends).
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import multiprocessing.context
import os
import sys
import threading
import time
from collections.abc import Mapping

from aioload.backends.processes import fork_template
from aioload.backends.processes.main_module import main_names, runs_main

__all__ = [
    "CUDA",
    "WorkerStart",
    "cuda_initialised",
    "default_start_method",
    "fallback_context",
    "keep_template_ready",
    "named_native_threads",
    "other_threads",
    "runtime_may_start",
    "runtimes_in_the_way",
    "start_method_context",
    "wait_until_gone",
    "worker_start",
]

CUDA = "CUDA (initialised by torch)"  # how CUDA is named among the runtimes in the way


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
    Python threads keep the name too (before Python 3.14) and are not counted.
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


def cuda_initialised() -> bool:
    """Whether torch has initialised CUDA in this process (never imports torch)."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    is_initialized = getattr(cuda, "is_initialized", None)
    return bool(is_initialized()) if callable(is_initialized) else False


# The native runtimes whose threads a forked child cannot do without: tokio's (obstore's
# ``tokio-rt-worker``; tokio's own default name, truncated to 15 bytes, ``tokio-runtime-w``).
# Other named threads (libzmq's ``ZMQbg/IO/0`` in a Jupyter kernel) serve libraries that a
# worker does not call, as under torch.
_HANGS_A_FORK = ("tokio-",)


def runtimes_in_the_way() -> list[str]:
    """What runs in this process that a forked worker could not use: the named threads of a
    runtime known to hang a forked child (tokio's, see :func:`named_native_threads`), and
    :data:`CUDA` once torch has initialised it."""
    named = named_native_threads()
    found = list(dict.fromkeys(name for name in named if name.startswith(_HANGS_A_FORK)))
    if cuda_initialised():
        found.append(CUDA)
    return found


def runtime_may_start() -> bool:
    """Whether this process has loaded a library that may later start such a runtime:
    obstore (``aioload.sources`` imports it), or a CUDA or ROCm build of torch."""
    if "obstore" in sys.modules:
        return True
    version = getattr(sys.modules.get("torch"), "version", None)
    return bool(getattr(version, "cuda", None) or getattr(version, "hip", None))


def default_start_method() -> str:
    """``multiprocessing``'s default start method, without fixing it.

    ``set_start_method`` may still be called afterwards (``get_start_method()``
    would fix the default, and a later ``set_start_method`` would fail).
    """
    return (
        multiprocessing.get_start_method(allow_none=True)
        or (multiprocessing.get_all_start_methods()[0])
    )


def fallback_context() -> multiprocessing.context.BaseContext:
    """Where no fork will do: the fork server (``spawn`` without one)."""
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")


@dataclasses.dataclass(frozen=True)
class WorkerStart:
    """How workers start now (see the module docstring).

    Attributes:
        method: ``"fork"`` (from the loader's process), ``"template"`` (from the
            fork template), ``"forkserver"`` or ``"spawn"``.
        context: the ``multiprocessing`` context whose ``Process`` starts them.
        in_the_way: the runtimes that kept them from being forked from the
            loader's process (empty when nothing did).
        fallback: aioload chose a method that runs the script again, because
            of ``in_the_way``, where the default was ``fork``.

    Example::

        start = worker_start(None)
        start.method            # 'fork' in a plain script on Linux
        start.pickles           # False: forked workers inherit the dataset
    """

    method: str
    context: multiprocessing.context.BaseContext
    in_the_way: tuple[str, ...] = ()
    fallback: bool = False

    @property
    def pickles(self) -> bool:
        """The setup reaches the workers pickled (not inherited by a fork of this process)."""
        return self.method != "fork"

    @property
    def runs_main(self) -> bool:
        """Each worker runs the main script again (the script needs its guard)."""
        return runs_main(self.method)


def worker_start(
    chosen: multiprocessing.context.BaseContext | None,
    objects: Mapping[str, object] | None = None,
) -> WorkerStart:
    """How workers started now start: ``chosen`` (the loader's context) or the rule's choice.

    ``objects``: what the workers receive (``{"dataset": ..., "collate_fn": ...}``); the fork
    template serves them only if it holds every class and function of ``__main__`` they name.
    """
    if chosen is not None:
        return WorkerStart(chosen.get_start_method(), chosen)
    method = default_start_method()
    context = multiprocessing.get_context(method)
    if method != "fork" or sys.platform != "linux":
        return WorkerStart(method, context)
    in_the_way = tuple(runtimes_in_the_way())
    if not in_the_way:
        return WorkerStart("fork", context)
    template = fork_template.current()
    needed = main_names(objects) if objects is not None else set()
    if template is not None and template.fresh() and template.has(needed):
        return WorkerStart("template", template.context(), in_the_way)
    if in_the_way == (CUDA,):
        return WorkerStart("fork", context, in_the_way)  # as torch
    fallback = fallback_context()
    return WorkerStart(fallback.get_start_method(), fallback, in_the_way, fallback=True)


def keep_template_ready(chosen: multiprocessing.context.BaseContext | None) -> None:
    """Forks the fork template now if workers may need it later and forking is safe now.

    Only for the default ``fork`` on Linux, in a process that has loaded a
    library that may start a runtime in the way (:func:`runtime_may_start`),
    while none runs yet, and not in a daemonic process (a worker: it may not
    have children). A template already there is kept while it holds what
    ``__main__`` holds now (see
    :meth:`~aioload.backends.processes.fork_template.ForkTemplate.complete`).
    Costs a fork (a few milliseconds) once per process, or again after the
    script defined or rebound classes or functions (a notebook cell run since).
    """
    if chosen is not None or sys.platform != "linux" or default_start_method() != "fork":
        return
    if multiprocessing.current_process().daemon:
        return
    if not runtime_may_start() or runtimes_in_the_way():
        return
    template = fork_template.current()
    if template is None or not template.complete():
        fork_template.replace()


def start_method_context(
    context: multiprocessing.context.BaseContext | str | None,
) -> multiprocessing.context.BaseContext | None:
    """The context a loader's ``multiprocessing_context`` names; None: the rule decides."""
    if context is None or isinstance(context, multiprocessing.context.BaseContext):
        return context
    return multiprocessing.get_context(context)
