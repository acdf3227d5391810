"""The worker processes of a loader: starting, replacing and stopping them.

A :class:`WorkerPool` lives for one epoch, or for the loader's life with
``persistent_workers=True``; the :class:`~aioload.backends.processes.backend.ProcessBackend`
of each epoch uses it. The setup (dataset, ``collate_fn``, ``worker_init_fn``)
is pickled once for all workers; a persistent pool serves one epoch at a time
(:meth:`WorkerPool.claim` / :meth:`WorkerPool.release`). Every method that
starts or stops processes blocks: the backend calls them in a thread.

Workers end with the process that started them, on every way out:

- a normal exit: an ``atexit`` handler and a ``multiprocessing.util.Finalize``
  stop every pool first (:func:`_stop_every_pool`). The finalizer is what a
  ``multiprocessing`` child runs: it leaves with ``os._exit`` after
  multiprocessing's own exit function, which skips ``atexit`` but runs these
  finalizers before it terminates and joins the child's daemon processes — a
  join that would otherwise race an epoch still running in a daemon thread,
  which saw its workers terminated and started new ones;
- any other end (SIGKILL, ``os._exit``): each worker watches the process that
  started it and ends with it (see :mod:`aioload.backends.processes.worker`).

A process forked from one that holds pools (``multiprocessing``'s ``fork``
start method, ``os.fork``) inherits copies of them; they are not its own, and
stopping one there only drops the copies, never the parent's workers. It does
not inherit the parent's fork server either: multiprocessing would ask the
child to ``waitpid`` a process that is not its child, so the child forgets it
and starts its own.
"""

from __future__ import annotations

import asyncio
import atexit
import multiprocessing
import multiprocessing.context
import multiprocessing.util  # before our atexit handler (see _stop_every_pool)
import os
import socket
import sys
import threading
import time
import weakref
from collections.abc import Callable
from multiprocessing import forkserver

from aioload.backends.processes.main_module import check_script_for_workers
from aioload.backends.processes.setup_parcel import SetupParcel
from aioload.backends.processes.start_method import WorkerStart, worker_start
from aioload.backends.processes.wire import Command, command_frame, result_socket_pair
from aioload.backends.processes.worker import worker_main
from aioload.memory.segments import SegmentReader
from aioload.read.reader import WorkerSetup

__all__ = ["WorkerHandle", "WorkerPool", "exit_began", "warm_forkserver"]

_STOP_GRACE = 2.0  # seconds a worker gets to exit after STOP before it is terminated
# The same at interpreter exit, where nothing will receive what a busy worker still reads
# (torch's workers are terminated at once there).
_EXIT_STOP_GRACE = 0.25
_TERMINATE_GRACE = 1.0  # then after SIGTERM, before SIGKILL


class WorkerHandle:
    """The loader's end of one worker process: its process, its command and result sockets
    (and the worker's ends, until it has them), and the segments it sends, mapped.

    :class:`WorkerPool` makes one per worker id and replaces it when the worker dies; the
    epoch's backend (:mod:`aioload.backends.processes.backend`) sends and receives through it.

    Args:
        worker_id: the worker's id (``get_worker_info().id``).
        keep_free: idle segments of this worker kept mapped for reuse.

    Example::

        handle = pool.workers[0]
        handle.commands.send(frame)  # a command; results arrive on handle.results
    """

    def __init__(self, worker_id: int, keep_free: int) -> None:
        self.id = worker_id
        self.process: multiprocessing.process.BaseProcess | None = None  # set when started
        self.commands, self.worker_commands = socket.socketpair()
        self.results, self.worker_results = result_socket_pair()
        self.commands.setblocking(False)
        self.results.setblocking(False)
        self.backlog = bytearray()  # command bytes the socket could not take yet
        self.reader = SegmentReader(keep_free)  # maps the segments this worker sends

    @property
    def started(self) -> bool:
        return self.process is not None

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def close_worker_ends(self) -> None:
        self.worker_commands.close()
        self.worker_results.close()

    def close(self) -> None:
        self.close_worker_ends()
        self.commands.close()
        self.results.close()
        self.reader.close()


_live_pools: weakref.WeakSet[WorkerPool] = weakref.WeakSet()
exiting = False  # the interpreter is exiting: dying workers are not restarted
_finalizer_pid: int | None = None  # the process whose multiprocessing finalizer is registered
_EXIT_PRIORITY = 20  # before multiprocessing.Pool's (15) and Queue's (10) finalizers


def exit_began() -> None:
    """The interpreter is exiting: dying workers are no longer restarted, and workers
    that do not stop when asked are terminated sooner (call at exit, before the epochs
    still running are stopped).
    """
    global exiting
    exiting = True


@atexit.register
def _stop_every_pool() -> None:
    """Stops every worker of this process before multiprocessing's exit handler joins them.

    An epoch may still run in a daemon thread at exit; without this, it would
    see its workers die under multiprocessing's exit handler and restart them.
    Registered after ``multiprocessing.util`` is imported, so it runs before
    that module's handler (atexit runs handlers last-in, first-out); in a
    multiprocessing child, which skips atexit, the finalizer registered by
    :func:`_stop_at_exit` runs it inside that handler, before its joins.
    """
    exit_began()
    pid = os.getpid()
    for pool in list(_live_pools):
        if pool.pid == pid:  # a forked child's copies of its parent's pools are not its own
            pool.shutdown()


def _stop_at_exit() -> None:
    """Registers :func:`_stop_every_pool` with multiprocessing's exit, once per process.

    A forked child starts with an empty finalizer registry, hence the pid.
    """
    global _finalizer_pid
    pid = os.getpid()
    if _finalizer_pid != pid:
        _finalizer_pid = pid
        multiprocessing.util.Finalize(None, _stop_every_pool, exitpriority=_EXIT_PRIORITY)


def _forget_inherited_forkserver() -> None:
    """In a forked child: the parent's fork server is not ours (see the module docstring)."""
    server = getattr(forkserver, "_forkserver", None)
    if server is None or getattr(server, "_forkserver_pid", None) is None:
        return
    alive = getattr(server, "_forkserver_alive_fd", None)
    server._forkserver_pid = None
    server._forkserver_address = None
    server._forkserver_alive_fd = None
    if alive is not None:
        try:
            os.close(alive)  # our copy: the parent's server no longer waits for us
        except OSError:
            pass


os.register_at_fork(after_in_child=_forget_inherited_forkserver)


class WorkerPool:
    """The worker processes of a loader (see the module docstring).

    Args:
        setup: what every worker receives.
        context: the multiprocessing context that starts them; None: the rule
            of :mod:`aioload.backends.processes.start_method` decides at each start
            (:func:`~aioload.backends.processes.start_method.worker_start`).
        base_seed: worker ``i`` seeds its generators with ``base_seed + i``.
        keep_free: idle shared-memory segments kept per worker for reuse.
    """

    def __init__(
        self,
        setup: WorkerSetup,
        context: multiprocessing.context.BaseContext | None,
        base_seed: int,
        keep_free: int,
    ) -> None:
        self._setup = setup
        self._context = context
        self.base_seed = base_seed
        self._keep_free = keep_free
        self._parcel: SetupParcel | None = None  # made by the first start that pickles
        self._lock = threading.Lock()
        self.workers = [WorkerHandle(i, keep_free) for i in range(setup.num_workers)]
        self.closed = False
        # A persistent pool serves one epoch at a time (see claim/release).
        self._owner_lock = threading.Lock()
        self._owner: tuple[asyncio.AbstractEventLoop, Callable[[str], None]] | None = None
        self._free = threading.Event()
        self._free.set()
        self._close_requested = False
        self.pid = os.getpid()  # the process whose workers these are
        _stop_at_exit()
        _live_pools.add(self)

    def replace(self, handle: WorkerHandle) -> WorkerHandle:
        """A fresh, not yet started handle for ``handle``'s worker id (the old one is closed)."""
        with self._lock:
            if self.closed:
                raise RuntimeError("the DataLoader's worker pool is closed")
            self._retire(handle)
            new = WorkerHandle(handle.id, self._keep_free)
            self.workers[handle.id] = new
            return new

    def fork_now(self) -> bool:
        """Forks the workers not started yet, now, if they start by a fork of this process
        (see :mod:`aioload.backends.processes.start_method`); True if it did.

        Call it from the thread that iterates, before aioload starts a thread
        of its own for the epoch. It blocks for the forks (a few milliseconds
        each: the page tables are copied, not the memory). Other ways of
        starting (the fork template, the fork server) pickle the setup first,
        which may take longer: :meth:`start` does it, in a thread.
        """
        waiting = [handle for handle in self.workers if not handle.started]
        if self.closed or not waiting:
            return False
        start = worker_start(self._context, self._objects())
        if start.method != "fork":
            return False
        self.start(waiting, start)
        return True

    def start(self, handles: list[WorkerHandle], start: WorkerStart | None = None) -> None:
        """Starts the processes of ``handles`` (blocking: call it in a thread).

        ``start``: how; by default as the rule says now (a restart included).

        Raises:
            RuntimeError: only the fork server is left (a runtime that does not
                survive a fork runs here, and no fork template could be made
                before it started), and the script has no ``__main__`` guard
                (see :func:`~aioload.backends.processes.main_module.check_script_for_workers`).
        """
        with self._lock:
            if self.closed:
                raise RuntimeError("the DataLoader's worker pool is closed")
            start = start or worker_start(self._context, self._objects())
            if start.fallback:
                # A restart may come here where its epoch's first workers were forked.
                check_script_for_workers(self._objects(), start.method, in_the_way=start.in_the_way)
            context = start.context
            warm_forkserver(context)
            setup: WorkerSetup | SetupParcel = self._setup
            if start.pickles:
                if self._parcel is None:
                    self._parcel = SetupParcel.pack(self._setup, start.method)
                setup = self._parcel
            for handle in handles:
                if handle.started:
                    continue
                process = context.Process(  # type: ignore[attr-defined]
                    target=worker_main,
                    args=(
                        handle.id,
                        self.base_seed + handle.id,
                        setup,
                        handle.worker_commands,
                        handle.worker_results,
                        self.pid,
                    ),
                    name=f"aioload-worker-{handle.id}",
                    daemon=True,
                )
                process.start()
                handle.process = process
                # The child has its own copies now; ours would hide its exit (no EOF).
                handle.close_worker_ends()

    def _objects(self) -> dict[str, object]:
        """What the workers receive, by the names the loader's checks give them."""
        setup = self._setup
        return {
            "dataset": setup.dataset,
            "collate_fn": setup.collate_fn,
            "worker_init_fn": setup.worker_init_fn,
            "policy": setup.policy,
        }

    def claim(self, loop: asyncio.AbstractEventLoop, stop: Callable[[str], None]) -> bool:
        """Makes the caller's epoch the pool's only user, or asks the current one to stop.

        Returns False (after calling the owner's ``stop`` with the reason) while
        another epoch still holds the pool — an iterator that was dropped but
        has not finished closing; the caller retries.
        """
        with self._owner_lock:
            owner = self._owner
            if owner is None:
                self._owner = (loop, stop)
                self._free.clear()
                return True
        owner[1]("a new iteration of the same DataLoader (persistent_workers=True) started")
        return False

    def release(self) -> bool:
        """The owning epoch lets go; True when the pool was closed meanwhile (shut it down)."""
        with self._owner_lock:
            self._owner = None
            self._free.set()
            return self._close_requested

    def close(self) -> None:
        """Stops the owning epoch if any, then every worker (see :meth:`shutdown`).

        Called on the owning epoch's own loop (``with loader: async for ...:
        break``) it cannot wait for that epoch, which ends on a later turn of
        the loop: the epoch shuts the pool down when it lets go.
        """
        with self._owner_lock:
            owner = self._owner
            self._close_requested = owner is not None
        if owner is not None:
            loop, stop = owner
            stop("the DataLoader was closed")
            try:
                running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is loop:
                return
            self._free.wait(_STOP_GRACE)
        self.shutdown()

    def shutdown(self) -> None:
        """Stops every worker: asks, then terminates, then kills (blocking).

        In a process forked from the pool's own, only this process's copies
        of the sockets and mappings go: the workers are the parent's.
        """
        with self._lock:
            if self.closed:
                return
            self.closed = True
            if self._parcel is not None:
                self._parcel.close()  # started workers keep their own mappings
            if os.getpid() != self.pid:
                for handle in self.workers:
                    handle.close()
                return
            for handle in self.workers:
                self._ask_to_stop(handle)
            deadline = time.monotonic() + (_EXIT_STOP_GRACE if exiting else _STOP_GRACE)
            for handle in self.workers:
                if handle.process is not None:
                    handle.process.join(max(0.0, deadline - time.monotonic()))
            for handle in self.workers:
                self._retire(handle)

    def _ask_to_stop(self, handle: WorkerHandle) -> None:
        try:
            handle.commands.send(command_frame(Command.STOP))
        except OSError:
            pass  # full or closed: closing the socket below says the same
        handle.commands.close()

    def _retire(self, handle: WorkerHandle) -> None:
        """Makes sure ``handle``'s process is gone and reaped, and frees its resources."""
        self._ask_to_stop(handle)
        process = handle.process
        if process is not None:
            process.join(0)
            if process.exitcode is None:
                process.terminate()
                process.join(_TERMINATE_GRACE)
            if process.exitcode is None:
                process.kill()
                process.join()
            process.close()
        handle.close()


def warm_forkserver(context: multiprocessing.context.BaseContext) -> None:
    """Starts the fork server now, with what workers import preloaded, so workers start fast.

    Preloaded: aioload's worker code, and the third-party packages this process
    has imported (torch, say). A worker still runs the main script again, as
    with ``spawn`` (Python 3.11's fork server never preloads it: it drops the
    preparation data's ``init_main_from_path`` and ``sys_path``), but the
    script's heavy imports are then already done. Only a package that imports
    cleanly here is listed; one that fails in the server is skipped there.
    """
    if context.get_start_method() != "forkserver":
        return
    # multiprocessing has no public way to read the preload list or to ask whether
    # the server runs; only a server that is not running yet takes a preload list.
    server = getattr(forkserver, "_forkserver", None)
    if server is not None and getattr(server, "_forkserver_pid", 0) is None:
        preload = list(getattr(server, "_preload_modules", ["__main__"]))
        wanted = ["aioload.backends.processes.worker", *_imported_packages()]
        context.set_forkserver_preload(list(dict.fromkeys([*preload, *wanted])))
    forkserver.ensure_running()


def _imported_packages() -> list[str]:
    """The top-level third-party packages (from site-packages) this process has imported."""
    packages = []
    for name, module in list(sys.modules.items()):
        if "." in name or name.startswith("_"):
            continue
        path = getattr(module, "__file__", None) or ""
        if "site-packages" in path or "dist-packages" in path:
            packages.append(name)
    return sorted(packages)
