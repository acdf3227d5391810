"""The process backend (``num_workers > 0``): fetches run in worker processes.

:class:`~aioload.backends.processes.pool.WorkerPool` owns the processes: it starts them
(the setup pickled once for all of them), replaces one that died, and stops
them all. A pool lives for one epoch, or for the loader's life with
``persistent_workers=True``.

:class:`ProcessBackend` is one epoch's use of a pool, behind the scheduler's
:class:`~aioload.backends.base.Backend` interface:

- Map-style datasets: the loader samples, and batch ``i`` goes to worker
  ``i % num_workers`` (as in torch, so a seeded run hands each batch to the
  same worker and random state again). Iterable datasets: each worker streams
  its own copy, and "the next batch" requests go round-robin over the workers
  that still have data, so in-order output interleaves the workers as torch
  does. With ``in_order=False`` the next batch goes instead to the worker
  with the fewest in flight (round-robin among equals): a stalled worker
  holds back only its own batches.
- Results come back on the loop through the result sockets (a reader callback,
  never a blocking call) and their arrays are views of shared memory
  (:mod:`aioload.memory.segments`).
- A worker that dies is noticed at once (its process sentinel becomes
  readable). For map-style datasets it is replaced and the batches it held
  are sent again, so the epoch still yields every sample exactly once; past
  ``max_worker_restarts`` restarts in an epoch, or for an iterable dataset
  (whose stream position died with the worker), the epoch fails with a
  :class:`WorkerCrashedError`. A replacement starts as the rule of
  :mod:`aioload.backends.processes.start_method` says at that moment, which never runs
  the script again where the epoch's first workers did not.

Blocking work — pickling the setup, starting and stopping processes — runs in
a short-lived thread, so the loop (possibly the caller's) never blocks.
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing.process
import signal
import time
from typing import Any

import anyio.abc

from aioload.backends.base import Outcome, OutcomeSink
from aioload.backends.processes import pool as pool_module
from aioload.backends.processes.pool import WorkerHandle, WorkerPool
from aioload.backends.processes.wire import (
    Command,
    ErrorReport,
    Result,
    command_frame,
    outcome_from_wire,
    receive_results,
)
from aioload.backends.threads import in_thread
from aioload.data.epochs import DatasetEpochs
from aioload.errors import WorkerCrashedError
from aioload.settings import LoaderSettings
from aioload.stats.recorder import EpochRecorder

__all__ = ["ProcessBackend"]


def _describe_death(pid: int | None, exitcode: int | None) -> str:
    """torch's sentence for a dead worker (``is killed by signal: ...``), with the signal's name."""
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        described = signal.strsignal(-exitcode) or name
        return f"DataLoader worker (pid {pid}) is killed by signal: {described} ({name})."
    code = "" if exitcode is None else f" with exit code {exitcode}"
    return f"DataLoader worker (pid {pid}) exited unexpectedly{code}."


_EXIT_STATUS_WAIT = 0.2  # seconds a process whose sentinel fired gets to become reapable


def _exit_code(process: multiprocessing.process.BaseProcess) -> int | None:
    """``process``'s exit code, once its sentinel has fired.

    A forked child's sentinel (a pipe) reads its end as the child closes its
    descriptors, a moment before the kernel makes it a zombie that can be
    reaped: that moment is waited for, briefly (a worker that closed the pipe
    itself may live on; its exit code is then unknown).
    """
    deadline = time.monotonic() + _EXIT_STATUS_WAIT
    while process.exitcode is None and time.monotonic() < deadline:
        time.sleep(0.001)
    return process.exitcode


class ProcessBackend:
    """One epoch's fetches on a :class:`WorkerPool` (see the module docstring).

    Args:
        pool: the worker processes.
        settings: the loader's settings: whether the dataset is iterable (workers
            stream and batch it), ``max_worker_restarts`` (worker deaths this epoch
            survives by restarting) and ``in_order`` (batches are yielded in order:
            they go to the workers round-robin; otherwise each goes to the worker
            with the fewest batches in flight, so a stalled worker holds back only
            its own).
        owns_pool: stop the pool when the epoch ends (not persistent workers).
        epoch: this epoch's number, unique within the pool.
        task_group: the epoch's scope.
        sink: where outcomes go.
        resume_streams: an iterable dataset resumed from a checkpoint: each
            worker's stream state (None: start afresh), sent with the epoch's
            start to that worker.
        dataset_epochs: what ``set_epoch`` gave the loader's dataset, sent with
            the epoch's start to every worker (persistent workers keep their
            copy of the dataset across epochs).
        first_worker: the worker whose turn comes first (resumed epochs).
        stats: the epoch's stats recorder, which counts worker restarts.
    """

    def __init__(
        self,
        pool: WorkerPool,
        settings: LoaderSettings,
        *,
        owns_pool: bool,
        epoch: int,
        task_group: anyio.abc.TaskGroup,
        sink: OutcomeSink,
        resume_streams: list[Any] | None = None,
        first_worker: int = 0,
        stats: EpochRecorder | None = None,
        dataset_epochs: DatasetEpochs = (),
    ) -> None:
        self._stats = stats
        self._dataset_epochs = dataset_epochs
        self._settings = settings
        self._pool = pool
        self._resume_streams = list(resume_streams) if resume_streams is not None else None
        self._owns_pool = owns_pool
        self._epoch = epoch
        self._restarts = 0
        self._sink = sink
        self._loop = asyncio.get_running_loop()
        self._held: dict[int, dict[int, Any]] = {}  # worker id -> seq -> keys
        self._exhausted_workers: set[int] = set()
        self._round_robin = itertools.islice(
            itertools.cycle(range(len(pool.workers))), first_worker, None
        )
        self._attached: list[WorkerHandle] = []
        self._watched: dict[WorkerHandle, int] = {}  # handle -> its sentinel's descriptor
        self._queued: list[tuple[int, Any]] = []  # submitted before the pool was ours
        self._ready = False
        self._owner = False  # holds a persistent pool
        self._failed = False
        self._closing = False
        # Starts and restarts run in the epoch's scope; they are shielded, so the
        # scope's end waits for them, and aclose() never races a half-started worker.
        self._tg = task_group
        task_group.start_soon(self._begin)

    # -- the Backend interface --------------------------------------------

    @property
    def exhausted(self) -> bool:
        return len(self._exhausted_workers) == len(self._pool.workers) or self._failed

    def submit(self, seq: int, keys: Any) -> None:
        if self._failed:
            self._sink.deliver(Outcome(seq, end=True))
        elif not self._ready:
            self._queued.append((seq, keys))
        else:
            self._send_batch(seq, keys)

    async def aclose(self) -> None:
        self._closing = True
        for handle in self._attached:
            self._detach(handle)
        if self._owns_pool:
            await in_thread(self._pool.shutdown)
        elif self._owner:
            for handle in self._pool.workers:
                self._send(handle, command_frame(Command.END_EPOCH))
            if self._pool.release():
                await in_thread(self._pool.shutdown)

    # -- starting -----------------------------------------------------------

    async def _begin(self) -> None:
        pool = self._pool
        if not self._owns_pool:
            # A persistent pool may still serve the previous epoch (an iterator
            # dropped but not yet closed): ask it to stop and wait for it.
            while not pool.claim(self._loop, self._stop_from_any_thread):
                await asyncio.sleep(0.005)
            self._owner = True
            if pool.closed:
                self._fail(RuntimeError("the DataLoader's persistent workers were closed"))
                return
        for handle in pool.workers:
            self._attach(handle)
            resume = None if self._resume_streams is None else self._resume_streams[handle.id]
            self._start_epoch_in(handle, resume)
        self._ready = True
        # Commands wait in the sockets of workers that are still starting.
        queued, self._queued = self._queued, []
        for seq, keys in queued:
            self.submit(seq, keys)
        await self._start([h for h in pool.workers if not h.started])
        for handle in list(pool.workers):
            if handle.process is not None and handle.process.exitcode is not None:
                self._on_death(handle)  # died between epochs

    async def _start(self, handles: list[WorkerHandle]) -> None:
        if not handles:
            return
        try:
            await in_thread(lambda: self._pool.start(handles))
        except Exception as error:
            error.add_note("raised while starting the DataLoader's worker processes")
            self._fail(error)
            return
        for handle in handles:
            if handle in self._attached:
                self._watch(handle)

    def _stop_from_any_thread(self, reason: str) -> None:
        """Ends this epoch with a RuntimeError giving ``reason`` (callable from any thread)."""
        error = RuntimeError(f"this iteration was stopped: {reason}")
        try:
            self._loop.call_soon_threadsafe(self._fail, error)
        except RuntimeError:  # the loop is closed: the epoch is over anyway
            pass

    def _attach(self, handle: WorkerHandle) -> None:
        self._attached.append(handle)
        self._held[handle.id] = {}
        self._loop.add_reader(handle.results, self._on_results, handle)
        if handle.backlog:
            self._loop.add_writer(handle.commands, self._flush, handle)
        self._watch(handle)

    def _watch(self, handle: WorkerHandle) -> None:
        """Calls ``_on_death`` as soon as the worker's process ends."""
        if handle.process is not None and handle not in self._watched:
            sentinel = handle.process.sentinel
            self._watched[handle] = sentinel
            self._loop.add_reader(sentinel, self._on_death, handle)

    def _unwatch(self, handle: WorkerHandle) -> None:
        sentinel = self._watched.pop(handle, None)
        if sentinel is not None:
            self._loop.remove_reader(sentinel)

    def _detach(self, handle: WorkerHandle) -> None:
        loop = self._loop
        for fd in (handle.results, handle.commands):
            if fd.fileno() >= 0:
                loop.remove_reader(fd)
                loop.remove_writer(fd)
        self._unwatch(handle)

    # -- commands -----------------------------------------------------------

    def _send(self, handle: WorkerHandle, frame: bytes) -> None:
        """Sends ``frame`` without blocking; what does not fit waits for the socket."""
        recycle, drop = handle.reader.take_returned()
        if recycle or drop:
            frame = command_frame(Command.RECYCLE, recycle, drop) + frame
        if handle.backlog:
            handle.backlog += frame
            return
        try:
            sent = handle.commands.send(frame)
        except BlockingIOError:
            sent = 0
        except OSError:
            return  # the worker is gone; its death is handled through its sentinel
        if sent < len(frame):
            handle.backlog += frame[sent:]
            if handle in self._attached:
                self._loop.add_writer(handle.commands, self._flush, handle)

    def _flush(self, handle: WorkerHandle) -> None:
        try:
            sent = handle.commands.send(handle.backlog)
        except BlockingIOError:
            return
        except OSError:
            sent = len(handle.backlog)
        del handle.backlog[:sent]
        if not handle.backlog:
            self._loop.remove_writer(handle.commands)

    def _start_epoch_in(self, handle: WorkerHandle, resume: Any = None) -> None:
        """Tells a worker this epoch starts, before any request of it (it waits in the socket
        of a worker still starting)."""
        frame = command_frame(Command.START_EPOCH, self._epoch, self._dataset_epochs, resume)
        self._send(handle, frame)

    def _send_batch(self, seq: int, keys: Any) -> None:
        handle = self._choose()
        self._held[handle.id][seq] = keys
        if self._settings.protocol.iterable:
            self._send(handle, command_frame(Command.NEXT, self._epoch, seq))
        else:
            self._send(handle, command_frame(Command.FETCH, self._epoch, seq, keys))

    def _choose(self) -> WorkerHandle:
        # Round-robin, as torch: batch i goes to worker i % num_workers, so a seeded
        # run gives every batch to the same worker (and its random state) again.
        # Out of order, as torch too, the next batch goes where a slot is free: to
        # the least busy worker (round-robin among equals).
        workers = self._pool.workers
        if not self._settings.in_order:
            turn = next(self._round_robin)
            count = len(workers)
            live = [
                workers[(turn + step) % count]
                for step in range(count)
                if (turn + step) % count not in self._exhausted_workers
            ]
            if live:
                return min(live, key=lambda handle: len(self._held.get(handle.id, ())))
        for _ in workers:
            worker_id = next(self._round_robin)
            if worker_id not in self._exhausted_workers:
                return workers[worker_id]
        return workers[next(self._round_robin)]

    # -- results ------------------------------------------------------------

    def _on_results(self, handle: WorkerHandle) -> None:
        results, closed = receive_results(handle.results)
        if closed:
            self._loop.remove_reader(handle.results)
        held = self._held[handle.id]
        reader = handle.reader
        deliver = self._sink.deliver
        for kind, epoch, seq, segment, size, layout_at, fd in results:
            if kind == Result.START_FAILED:
                report: ErrorReport = reader.read(segment, size, layout_at, fd)
                self._fail(report.rebuild(self._where(handle)))
                continue
            if epoch != self._epoch or seq not in held or self._failed:
                if segment >= 0:
                    reader.discard(segment, size, fd)
                continue
            del held[seq]
            if kind == Result.END:
                self._exhausted_workers.add(handle.id)
                deliver(Outcome(seq, end=True, worker=handle.id))
                continue
            try:
                payload = reader.read(segment, size, layout_at, fd)
            except Exception as error:
                error.add_note(f"raised while receiving the result of worker {handle.id}")
                deliver(Outcome(seq, error=error, worker=handle.id))
                continue
            outcome = outcome_from_wire(payload, seq, worker=handle.id, where=self._where(handle))
            if outcome.end:  # the stream's end, with the dataset's last counts
                self._exhausted_workers.add(handle.id)
            deliver(outcome)

    @staticmethod
    def _where(handle: WorkerHandle) -> str:
        return f"DataLoader worker {handle.id} (pid {handle.pid})"

    # -- faults -------------------------------------------------------------

    def _fail(self, error: BaseException) -> None:
        """Ends the epoch with ``error`` (the scheduler delivers it and stops)."""
        if self._failed:
            return
        self._failed = True
        self._sink.fail(error)

    def _on_death(self, handle: WorkerHandle) -> None:
        self._unwatch(handle)
        if self._closing or self._failed or handle not in self._attached or pool_module.exiting:
            return  # at exit the workers are being stopped on purpose
        self._on_results(handle)  # what it sent before dying still counts
        self._attached.remove(handle)
        self._detach(handle)
        held = self._held.pop(handle.id)
        assert handle.process is not None
        exitcode, pid = _exit_code(handle.process), handle.pid
        keys = list(held.values())
        iterable, limit = self._settings.protocol.iterable, self._settings.max_worker_restarts
        if iterable or self._restarts >= limit:
            why = (
                "an iterable dataset's stream cannot be resumed in a new worker"
                if iterable
                else f"it was the restart limit (max_worker_restarts={limit})"
            )
            self._fail(
                WorkerCrashedError(
                    f"{_describe_death(pid, exitcode)} It was worker {handle.id}, holding "
                    f"batches {sorted(held)} (keys {keys!r}); not restarted: {why}",
                    worker_id=handle.id,
                    pid=pid,
                    exitcode=exitcode,
                    keys=keys,
                )
            )
            return
        self._restarts += 1
        if self._stats is not None:
            self._stats.worker_restarts += 1
        try:
            new = self._pool.replace(handle)
        except RuntimeError as error:  # the pool was closed meanwhile
            self._fail(error)
            return
        self._attach(new)
        self._start_epoch_in(new)  # map-style: no stream to resume
        for seq, batch_keys in sorted(held.items()):
            self._held[new.id][seq] = batch_keys
            self._send(new, command_frame(Command.FETCH, self._epoch, seq, batch_keys))
        # As the rule says now (aioload.backends.processes.start_method): a fork of this process
        # right here, or the fork template or a fork server from a thread.
        try:
            forked = self._pool.fork_now()
        except Exception:
            forked = False  # the start below says what is wrong
        if forked:
            self._watch(new)
        else:
            self._tg.start_soon(self._start, [new])
