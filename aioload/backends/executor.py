"""The executor backend (``executor=``): batches run as tasks of a ``concurrent.futures`` executor.

Any :class:`concurrent.futures.Executor` works — a ``ThreadPoolExecutor``
(GIL-releasing work, free-threaded Python), a ``ProcessPoolExecutor``, or a
distributed engine's executor, dask.distributed's
``Client.get_executor(pure=False)`` — when preprocessing needs more cores than
the training host has.

- **One task per batch**, never per item: a distributed task costs
  milliseconds. At most the loader's window of batches is in flight; results
  are put back in order by the scheduler as usual (or not: ``in_order=False``).
- **The setup once per worker.** The epoch's dataset, ``collate_fn`` and
  ``worker_init_fn`` reach each executor worker once, not with every task
  (:mod:`aioload.backends.executor_task` keeps them per worker by epoch):
  a thread pool passes the objects themselves; for a process pool the loader
  pickles them once into a temporary file that each process reads on its
  first task of the epoch (tasks carry the file's name); dask gets them
  broadcast to every worker once (``Client.scatter(broadcast=True)``) and
  each task refers to that data. Any other executor gets the pickled setup
  with every task (correct everywhere, but it costs the setup's size per
  batch). The file and the scattered data are released when the epoch ends.
- **Results** come back through the executor's futures (pickled by process
  pools and dask, so arrays are copied once; no shared memory): a done
  callback hands each to the loop, which completes the batch.
- **Worker loss.** dask reschedules the tasks of a worker that died on the
  others (its scheduler's ``allowed-failures``, 3 by default, before a task
  fails with ``KilledWorker``). A task dask gives up on its own (its result
  was lost with its worker before aioload fetched it: the future is
  cancelled) is submitted again by aioload, up to ``max_worker_restarts``
  times an epoch. So the epoch still yields every sample exactly once.
  A ``ProcessPoolExecutor`` cannot survive a dead process: every pending
  batch fails with ``BrokenProcessPool``, and so does the epoch.
- **Ending.** When the epoch ends (normally, by ``break``, an error, garbage
  collection) the batches not started are cancelled and, in thread and
  process pools, the backend waits (without blocking the loop) for the tasks
  already running, so nothing of the epoch runs after it. On dask the
  epoch's tasks are released (dask cancels those not started); a task
  already running cannot be interrupted and finishes on its worker, its
  result dropped. The executor itself belongs to the caller and stays open.

dask's executor merges identical calls by default (``pure=True``: a task's
key is a hash of its function and arguments), so a batch asked for again — a
later epoch with the same seed, a retry — would silently get the earlier
result; a loader refuses such an executor (see
:func:`~aioload.settings.executors.check_executor`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio.abc

from aioload.backends.base import Outcome, OutcomeSink
from aioload.backends.executor_task import (
    EpochKey,
    Placement,
    SetupFile,
    ThreadIds,
    run_batch,
)
from aioload.backends.processes.pickling import pickle_for_workers
from aioload.backends.processes.wire import outcome_from_wire
from aioload.backends.threads import in_thread, when_done_on_loop
from aioload.read.reader import WorkerSetup
from aioload.settings import LoaderSettings
from aioload.settings.executors import dask_workers, executor_size, is_dask
from aioload.stats.recorder import EpochRecorder

__all__ = ["ExecutorBackend"]


@dataclass
class _Shipment:
    """How one epoch's setup reaches the workers, and what to release after the epoch."""

    ref: Any  # the setup object, a SetupFile, pickled bytes, or a dask future
    placement: Placement
    release: Callable[[], None]


class ExecutorBackend:
    """One epoch's batches as tasks of ``executor`` (see the module docstring).

    Args:
        settings: the loader's settings: its ``executor``, where the tasks run, and
            ``max_worker_restarts``, the batches submitted again this epoch after dask
            gave their task up.
        setup: what every worker needs (dataset, collate_fn, worker_init_fn, ...).
        key: the epoch's key (the loader's token and the epoch's number).
        base_seed: worker ``id`` seeds its generators with ``base_seed + id``.
        task_group: the epoch's scope.
        sink: where outcomes go.
        stats: the epoch's stats recorder, which counts resubmits as worker restarts.
    """

    def __init__(
        self,
        settings: LoaderSettings,
        setup: WorkerSetup,
        *,
        key: EpochKey,
        base_seed: int,
        task_group: anyio.abc.TaskGroup,
        sink: OutcomeSink,
        stats: EpochRecorder | None = None,
    ) -> None:
        executor = settings.executor
        if executor is None:
            raise ValueError("an ExecutorBackend needs settings with an executor")
        self._stats = stats
        self._settings = settings
        self._executor = executor
        self._setup = setup
        self._key = key
        self._base_seed = base_seed
        self._threads = _thread_ids(executor)
        self._sink = sink
        self._loop = asyncio.get_running_loop()
        self._futures: dict[int, concurrent.futures.Future[Any]] = {}
        # dask: its own futures, submitted through the client (see _submit_to_dask).
        self._dask: Any = executor._client if is_dask(executor) else None  # type: ignore[attr-defined]
        self._dask_futures: dict[int, Any] = {}
        self._keys: dict[int, Any] = {}  # dask: the batches in flight, to submit one again
        self._resubmitted = 0
        self._queued: list[tuple[int, Any]] = []
        self._shipment: _Shipment | None = None  # set once the workers can be sent tasks
        self._shipped: _Shipment | None = None  # set by the shipping thread, even if cancelled
        self._pids: tuple[int, ...] = ()
        self._failed = False
        self._closing = False
        task_group.start_soon(self._begin)

    # -- the Backend interface --------------------------------------------

    @property
    def exhausted(self) -> bool:
        return self._failed

    def submit(self, seq: int, keys: Any) -> None:
        if self._failed:
            self._sink.deliver(Outcome(seq, end=True))
        elif self._shipment is None:
            self._queued.append((seq, keys))
        else:
            self._send(seq, keys)

    async def aclose(self) -> None:
        self._closing = True
        if self._dask is not None:
            # Forgetting a task cancels it unless it runs already; a running one
            # cannot be interrupted and finishes on its worker, its result dropped.
            for dask_future in self._dask_futures.values():
                dask_future.release()
            self._dask_futures.clear()
            futures = []
        else:
            futures = list(self._futures.values())
        for future in futures:
            future.cancel()  # those not started; running ones finish
        waiting = [asyncio.wrap_future(f) for f in futures if not f.done()]
        if waiting:
            await asyncio.wait(waiting)
        shipment, self._shipment, self._shipped = self._shipped, None, None
        if shipment is not None:
            shipment.release()

    # -- starting -----------------------------------------------------------

    async def _begin(self) -> None:
        try:
            # Pickling the setup or broadcasting it to a cluster blocks: not on the loop.
            await in_thread(self._ship)
        except Exception as error:
            error.add_note("raised while sending the dataset and collate_fn to the executor")
            self._fail(error)
            return
        if self._closing or self._shipped is None:
            return  # aclose() releases what was shipped
        self._shipment = self._shipped
        queued, self._queued = self._queued, []
        for seq, keys in queued:
            self.submit(seq, keys)

    def _ship(self) -> None:
        # Kept where aclose() finds it: a cancelled epoch still waits for this
        # thread (see _in_thread) but gets no return value from it.
        self._shipped = self._shipment_for(self._executor)

    def _shipment_for(self, executor: concurrent.futures.Executor) -> _Shipment:
        size = executor_size(executor) or 1
        if isinstance(executor, concurrent.futures.ThreadPoolExecutor):
            placement = Placement("thread", size, threads=self._threads)
            return _Shipment(self._setup, placement, _nothing)
        if is_dask(executor):
            return self._ship_to_dask()
        blob = _pickle_setup(self._setup)
        if isinstance(executor, concurrent.futures.ProcessPoolExecutor):
            return self._ship_to_processes(blob, size)
        # Any other executor: it may run tasks here or anywhere, so each task carries it.
        return _Shipment(blob, Placement("other", size, threads=self._threads), _nothing)

    def _ship_to_processes(self, blob: bytes, size: int) -> _Shipment:
        _fill_process_pool(self._executor, size)
        descriptor, path = tempfile.mkstemp(prefix="aioload-setup-", suffix=".pickle")
        try:
            with os.fdopen(descriptor, "wb") as file:
                file.write(blob)
        except BaseException:
            os.unlink(path)
            raise

        def release() -> None:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

        return _Shipment(SetupFile(path), Placement("process", size), release)

    def _ship_to_dask(self) -> _Shipment:
        client = self._executor._client  # type: ignore[attr-defined]
        workers = dask_workers(client)
        names = tuple(sorted(str(info.get("name", address)) for address, info in workers.items()))
        # Every worker holds the setup once; tasks refer to it by key, and a worker
        # that joins (or replaces a dead one) fetches it from another.
        future = client.scatter(self._setup, broadcast=True, hash=False)
        return _Shipment(future, Placement("dask", len(names), names=names), future.release)

    # -- batches ------------------------------------------------------------

    def _placement(self, shipment: _Shipment) -> Placement:
        placement = shipment.placement
        if placement.kind != "process":
            return placement
        # The pool's processes in spawn order (dict order), so each has a stable index.
        pids = tuple(getattr(self._executor, "_processes", None) or ())
        if pids != self._pids:
            self._pids = pids
            shipment.placement = Placement("process", placement.num_workers, pids=pids)
        return shipment.placement

    def _send(self, seq: int, keys: Any) -> None:
        shipment = self._shipment
        assert shipment is not None
        args = (self._key, self._base_seed, shipment.ref, self._placement(shipment), seq, keys)
        try:
            if self._dask is not None:
                future = self._submit_to_dask(seq, args)
            else:
                future = self._executor.submit(run_batch, *args)
        except Exception as error:  # shut down, broken: no later batch can run either
            error.add_note(f"raised while submitting batch {seq} (keys {keys!r}) to the executor")
            self._fail(error)
            return
        self._futures[seq] = future
        if self._dask is not None:
            self._keys[seq] = keys
        when_done_on_loop(future, self._loop, self._done, seq)

    def _submit_to_dask(self, seq: int, args: tuple[Any, ...]) -> concurrent.futures.Future[Any]:
        """Submits through the executor's client, keeping dask's future to release it.

        dask's executor returns a ``concurrent.futures.Future`` whose
        cancellation cancels the task with a blocking call to the scheduler
        (here: on the loop), and which logs an error whenever its task is
        cancelled or released before the result arrived. So aioload submits
        through the executor's client with the executor's options (``pure``
        forced to False, see :func:`~aioload.settings.executors.check_executor`),
        gathers each result on the client's event loop (concurrently, as the
        executor does), and ends an epoch by releasing dask's futures.
        """
        client = self._dask
        executor: Any = self._executor
        dask_future = client.submit(run_batch, *args, **{**executor._kwargs, "pure": False})
        self._dask_futures[seq] = dask_future
        mirror: concurrent.futures.Future[Any] = concurrent.futures.Future()

        async def gather() -> None:  # on the client's event loop
            try:
                result = await client.gather(dask_future, asynchronous=True)
            except concurrent.futures.CancelledError:  # released: the epoch ended
                mirror.cancel()
            except BaseException as error:
                mirror.set_exception(error)
            else:
                mirror.set_result(result)

        client.loop.add_callback(gather)
        return mirror

    def _done(self, seq: int, future: concurrent.futures.Future[Any]) -> None:
        if self._futures.get(seq) is not future:
            return
        del self._futures[seq]
        self._dask_futures.pop(seq, None)
        keys = self._keys.pop(seq, None)
        if self._closing or self._failed:
            return  # the epoch is over: nobody waits for this batch
        if future.cancelled() and self._dask is not None:
            # Not by us (the epoch runs): dask gave the task up, as when the worker
            # holding its result died before the result was fetched. Run it again.
            if self._resubmitted < self._settings.max_worker_restarts:
                self._resubmitted += 1
                if self._stats is not None:
                    self._stats.worker_restarts += 1
                self._send(seq, keys)
                return
            self._deliver_error(
                seq,
                concurrent.futures.CancelledError(
                    f"dask cancelled this batch's task, and {self._resubmitted} batches were "
                    f"already submitted again this epoch (max_worker_restarts="
                    f"{self._settings.max_worker_restarts})"
                ),
            )
            return
        if future.cancelled():
            self._deliver_error(
                seq,
                concurrent.futures.CancelledError(
                    "the executor cancelled this batch's task (was it shut down?)"
                ),
            )
            return
        error = future.exception()
        if error is not None:  # the task returns the batch's own errors: this is the executor's
            self._deliver_error(seq, error)
            return
        self._sink.deliver(outcome_from_wire(future.result(), seq))

    def _deliver_error(self, seq: int, error: BaseException) -> None:
        self._sink.deliver(Outcome(seq, error=error))

    def _fail(self, error: BaseException) -> None:
        """Ends the epoch with ``error`` (the scheduler delivers it and stops)."""
        if self._failed:
            return
        self._failed = True
        self._sink.fail(error)


def _pickle_setup(setup: WorkerSetup) -> bytes:
    """Pickles ``setup`` once for every worker; a failure names the object at fault."""
    return pickle_for_workers(
        setup,
        receivers="the executor's workers",
        why="a process pool or a cluster receives pickled",
        remedy="use a ThreadPoolExecutor, which pickles nothing",
    )


_numberings: weakref.WeakKeyDictionary[concurrent.futures.Executor, ThreadIds] = (
    weakref.WeakKeyDictionary()
)
_numberings_lock = threading.Lock()


def _thread_ids(executor: concurrent.futures.Executor) -> ThreadIds:
    """The numbering of ``executor``'s threads, shared by every loader that uses it."""
    with _numberings_lock:
        found = _numberings.get(executor)
        if found is None:
            found = _numberings[executor] = ThreadIds()
        return found


def _nothing() -> None:
    pass


_SPAWN_HOLD = 0.05  # seconds each warm-up task holds its process, so the next one spawns


def _fill_process_pool(executor: concurrent.futures.Executor, size: int) -> None:
    """Has a process pool start all its processes before the first batch (blocking).

    A process pool spawns its processes on demand, and a task may run in any
    of them: a worker's id (its place in spawn order) is only certain once
    every process exists. Tasks that hold a process for a moment make the pool
    start the next one for the next task, as it does under load.
    """
    processes = getattr(executor, "_processes", None)
    if processes is None or len(processes) >= size:
        return
    holds = [executor.submit(time.sleep, _SPAWN_HOLD) for _ in range(size)]
    concurrent.futures.wait(holds)
