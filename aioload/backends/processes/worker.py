"""What runs inside a worker process: its event loop, seeding, serving commands.

The far side of the process backend (:mod:`aioload.backends.processes`). A
worker receives its :class:`~aioload.read.reader.WorkerSetup` (the
dataset, ``collate_fn``, ``worker_init_fn`` and the batching options) once
when it starts, gives torch one thread (as torch's workers do, when torch is
imported), seeds its random number generators, calls ``worker_init_fn``
and then serves commands on its own uvloop event loop. It is an inline
backend on a loop of its own: many fetches are in flight at once (an async
dataset's items up to ``concurrency``), and each batch's outcome goes back in
its wire form (:func:`aioload.backends.processes.wire.outcome_to_wire`) through shared memory
(:mod:`aioload.memory.segments`) as soon as it is ready, in any order; the loader
puts them back in order.

Under a fault policy the worker's reader retries, times out and skips items
itself; the skipped items and the retry count travel with their batch's
outcome, so the loader counts every worker's.

Each epoch is a scope of its own in the worker, begun by the epoch's
``START_EPOCH``, which cancels whatever the previous one still had in flight,
then gives the worker's copy of the dataset the epochs ``set_epoch`` gave the
loader's (:mod:`aioload.data.epochs`: persistent workers keep their copy
across epochs) and loads a resumed stream's state. Iterable datasets are
iterated afresh each epoch, batched here, with ``drop_last`` applied per
worker, as in torch.

A worker ignores Ctrl-C (SIGINT goes to the whole process group; the loader
decides when its workers stop) and exits when told to, when the loader's end
of the command socket closes, or when the loader's process ends, however it
ends (SIGKILL, ``os._exit``): a thread watches the loader's process (a pidfd;
a poll of its pid where there is none), because the socket is not enough —
another process may hold the loader's end of it (a child the loader forked),
and a worker busy in a long sync read does not look at it. The thread first
asks the worker's loop to stop; a loop that does not within
:data:`ORPHAN_GRACE` seconds is blocked in the dataset, and the worker exits
at once: nobody is left to receive what it reads. (``PR_SET_PDEATHSIG`` would
not do: it fires when the *thread* that started the worker ends, and workers
are started from short-lived threads; under ``forkserver`` their parent is the
fork server, not the loader.)

A read's ``SystemExit`` or ``KeyboardInterrupt`` is the batch's error like any
other (see :mod:`aioload.read.reader`): the worker reports it and goes on
serving.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import pickle
import random
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import anyio._backends._asyncio  # imported here so the fork server preloads it
import anyio.abc
import numpy as np
import uvloop  # noqa: F401  # likewise: a worker's first loop should not pay for imports

from aioload.backends.base import Outcome
from aioload.backends.inline import InlineBackend
from aioload.backends.processes.setup_parcel import SetupParcel, open_setup
from aioload.backends.processes.wire import (
    FRAME_LENGTH,
    NO_EPOCH,
    Command,
    ErrorReport,
    Result,
    outcome_to_wire,
    send_result,
)
from aioload.collate.core import collate_into
from aioload.collate.streamed import collate_as_read
from aioload.data.epochs import DatasetEpochs, set_dataset_epochs
from aioload.data.protocol import inspect_dataset
from aioload.eventloop import new_event_loop
from aioload.groups import raise_ungrouped, reported
from aioload.memory.segments import Arena, SegmentWriter
from aioload.ranks import set_loader_ranks
from aioload.read.reader import BatchReader, WorkerSetup
from aioload.worker_info import WorkerInfo, set_process_worker_info

__all__ = ["ORPHAN_GRACE", "seed_generators", "worker_main"]

# A request always follows its epoch's START_EPOCH on the same socket: this is a bug.
_NOT_STARTED = "worker got a request of epoch {} before that epoch's start"
ORPHAN_GRACE = 1.0  # seconds a worker whose loader died gets to stop by itself
_POLL_LOADER = 0.5  # seconds between looks at the loader's pid, where there is no pidfd


def seed_generators(seed: int, worker_id: int) -> None:
    """Seeds Python's ``random``, numpy's legacy global state and torch (if imported), as torch's
    workers do.

    ``seed`` is the worker's (``base_seed + worker_id``): ``random`` and torch take it, numpy takes
    the four words torch derives from the base seed and the worker id (numpy's own
    ``SeedSequence`` of them), so that ``np.random`` in a worker draws what it draws under torch.
    """
    random.seed(seed)
    base_seed = seed - worker_id
    words = [worker_id, base_seed & 0xFFFF_FFFF, base_seed >> 32]
    np.random.seed(np.random.SeedSequence(words).generate_state(4))
    # Only when the worker has imported torch (the dataset's or the main module
    # did): importing it here would add about a second to every worker start.
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(seed)


def limit_torch_threads() -> None:
    """Gives torch (if imported) one intra-op thread in this worker, as torch's workers do.

    N workers each running torch's default thread pool (one thread per core)
    would oversubscribe the cores N times. And a worker forked from a parent
    whose pool has run (a torch op in the dataset's ``__init__``) inherits a
    pool whose threads did not survive the fork: its first multi-threaded op
    (a convolution) waits for them forever (pytorch#53565). One thread runs
    every op on the worker's own thread. A ``worker_init_fn`` may raise it
    again (``torch.set_num_threads``).
    """
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)


# glibc mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def keep_freed_memory() -> None:
    """Has this process's allocator reuse freed memory for large arrays (glibc only).

    A worker allocates and frees every batch (samples, then the collated
    arrays). glibc serves blocks over its mmap threshold — 128 KiB at first —
    with fresh mappings and unmaps them when freed, so every batch pays a page
    fault for each 4 KiB it touches: for 1 MiB samples that is most of the
    work. Raising the threshold (to glibc's maximum, 32 MiB) and the trim
    threshold keeps freed blocks in the heap for the next batch. Only workers
    are tuned: the user's own process is not aioload's to change.
    """
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc
        return
    mallopt(_M_MMAP_THRESHOLD, 32 << 20)
    mallopt(_M_TRIM_THRESHOLD, 128 << 20)


def _wait_for_exit(pid: int) -> None:
    """Returns once process ``pid`` has ended (at once if it has already)."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except (AttributeError, OSError):  # no pidfd (not Linux, or before 5.3): poll
        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            except PermissionError:
                pass  # alive, and someone else's: only a pid reused by another user
            time.sleep(_POLL_LOADER)
    try:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)  # readable once the process has ended
        while not poller.poll():
            pass
    finally:
        os.close(pidfd)


class _LoaderWatch:
    """Ends the worker when the loader's process ends (see the module docstring)."""

    def __init__(self, loader_pid: int) -> None:
        self._loader_pid = loader_pid
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._worker: _Worker | None = None
        self._gone = False
        threading.Thread(target=self._watch, name="aioload-loader-watch", daemon=True).start()

    def serving(self, loop: asyncio.AbstractEventLoop, worker: _Worker) -> None:
        """The worker serves on ``loop`` now: stop it there when the loader goes."""
        with self._lock:
            self._loop, self._worker = loop, worker
            gone = self._gone
        if gone:
            worker.abandon()

    def _watch(self) -> None:
        _wait_for_exit(self._loader_pid)
        with self._lock:
            self._gone = True
            loop, worker = self._loop, self._worker
        if loop is not None and worker is not None:
            try:
                loop.call_soon_threadsafe(worker.abandon)
            except RuntimeError:  # the loop is closed: the worker is exiting anyway
                pass
        time.sleep(ORPHAN_GRACE)
        # Still here: the loop is blocked in the dataset (or the worker was still
        # starting). Nothing it does can reach anyone.
        os._exit(1)


def worker_main(
    worker_id: int,
    seed: int,
    setup: WorkerSetup | SetupParcel,
    commands: socket.socket,
    results: socket.socket,
    loader_pid: int | None = None,
) -> None:
    """The entry point of a worker process (the target of its ``Process``).

    ``setup`` arrives as a parcel when the start method pickles (see
    :mod:`aioload.backends.processes.setup_parcel`), or as the object itself under
    ``fork``. ``loader_pid``: the loader's process, which the worker does not
    outlive (None: not watched).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # First of all: a worker whose loader dies while it starts must not stay either.
    watch = _LoaderWatch(loader_pid) if loader_pid is not None else None
    keep_freed_memory()
    results.setblocking(True)
    writer = SegmentWriter()
    try:
        setup = open_setup(setup)
        info = WorkerInfo(worker_id, setup.num_workers, seed, setup.dataset, setup.batch_size)
        set_process_worker_info(info)
        if setup.ranks is not None:
            set_loader_ranks(setup.ranks)
        limit_torch_threads()  # after the setup: unpickling the dataset may import torch
        seed_generators(seed, worker_id)
        if setup.worker_init_fn is not None:
            setup.worker_init_fn(worker_id)
    except BaseException as error:
        report = writer.write(ErrorReport.of(error))
        send_result(results, Result.START_FAILED, NO_EPOCH, -1, report)
        return
    worker = _Worker(setup, worker_id, commands, results, writer)
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        runner.run(worker.serve(watch))


@dataclass(frozen=True, slots=True)
class _InArena:
    """A collated batch and the arena its large arrays were stacked into."""

    batch: Any
    arena: Arena


class _EpochSink:
    """The outcomes of one epoch's backend, on their way to the loader."""

    def __init__(self, worker: _Worker, epoch: int) -> None:
        self._worker = worker
        self._epoch = epoch

    def deliver(self, outcome: Outcome) -> None:
        self._worker.send(self._epoch, outcome)

    def fail(self, error: BaseException) -> None:  # an inline backend never fails whole
        raise AssertionError("a worker's inline backend reported a fatal failure") from error


class _Worker:
    """Serves one worker's commands on its event loop."""

    def __init__(
        self,
        setup: WorkerSetup,
        worker_id: int,
        commands: socket.socket,
        results: socket.socket,
        writer: SegmentWriter,
    ) -> None:
        self._setup = setup
        self._id = worker_id
        self._protocol = inspect_dataset(setup.dataset)
        self._commands = commands
        self._results = results
        self._writer = writer
        self._tg: anyio.abc.TaskGroup | None = None
        self._epoch = NO_EPOCH
        self._epoch_scope: anyio.CancelScope | None = None
        self._backend: InlineBackend | None = None
        self._start_error: BaseException | None = None  # why the epoch could not start
        self._loader_gone = False

    async def serve(self, watch: _LoaderWatch | None = None) -> None:
        self._commands.setblocking(False)
        reader, writer = await asyncio.open_connection(sock=self._commands)
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                if watch is not None:
                    watch.serving(asyncio.get_running_loop(), self)
                while not self._loader_gone:
                    try:
                        header = await reader.readexactly(FRAME_LENGTH.size)
                        (length,) = FRAME_LENGTH.unpack(header)
                        fields = pickle.loads(await reader.readexactly(length))
                    except (asyncio.IncompleteReadError, ConnectionError):
                        break  # the loader closed its end: it is gone or done with us
                    if not await self._dispatch(fields):
                        break
                tg.cancel_scope.cancel()
        finally:
            writer.close()

    async def _dispatch(self, fields: tuple[Any, ...]) -> bool:
        """Carries out one command; False means stop serving."""
        command = fields[0]
        if command == Command.START_EPOCH:
            epoch, dataset_epochs, resume = fields[1], fields[2], fields[3]
            try:
                await self._start_epoch(epoch, dataset_epochs, resume)
            except BaseException as error:  # the dataset refused its state, say
                if not reported(error):
                    raise
                self._start_error = error  # the epoch's first request reports it
        elif command == Command.FETCH or command == Command.NEXT:
            epoch, seq = fields[1], fields[2]
            if epoch != self._epoch:  # a request of an epoch that has not started here
                self.send(epoch, Outcome(seq, error=RuntimeError(_NOT_STARTED.format(epoch))))
            elif self._start_error is not None:
                refused, self._start_error = self._start_error, None
                self.send(epoch, Outcome(seq, error=refused))
            elif self._backend is None:  # the epoch could not start (reported once)
                self.send(epoch, Outcome(seq, end=True))
            else:
                self._backend.submit(seq, fields[3] if command == Command.FETCH else None)
        elif command == Command.RECYCLE:
            self._writer.recycle(fields[1])
            self._writer.drop(fields[2])
        elif command == Command.END_EPOCH:
            self._end_epoch()
        elif command == Command.STOP:
            return False
        return True

    async def _start_epoch(
        self, epoch: int, dataset_epochs: DatasetEpochs = (), resume: Any = None
    ) -> None:
        """Starts ``epoch``: the dataset's copy gets the epochs ``set_epoch`` gave the
        loader's dataset; then a stream resumed from a checkpoint loads its state (whose
        epoch wins)."""
        self._end_epoch()
        self._epoch = epoch
        try:
            set_dataset_epochs(self._setup.dataset, dataset_epochs)
        except BaseException as error:
            error.add_note("raised while setting this worker's dataset epoch (set_epoch)")
            raise
        if resume is not None:
            try:
                self._setup.dataset.load_state_dict(resume)
            except BaseException as error:
                error.add_note("raised while loading this worker's dataset state")
                raise
        assert self._tg is not None
        try:
            self._epoch_scope, self._backend = await self._tg.start(self._run_epoch, epoch)
        except BaseExceptionGroup as group:  # the epoch's task group failed as it started
            raise_ungrouped(group)

    def abandon(self) -> None:
        """The loader is gone: stop serving (on the loop)."""
        self._loader_gone = True
        if self._tg is not None:
            self._tg.cancel_scope.cancel()

    def _end_epoch(self) -> None:
        if self._epoch_scope is not None:
            self._epoch_scope.cancel()
        self._epoch_scope = self._backend = self._start_error = None
        self._epoch = NO_EPOCH

    async def _run_epoch(self, epoch: int, *, task_status: anyio.abc.TaskStatus[Any]) -> None:
        setup = self._setup
        backend: InlineBackend | None = None
        with anyio.CancelScope() as scope:
            try:
                async with anyio.create_task_group() as tg:
                    reader = BatchReader(
                        setup,
                        self._protocol,
                        worker=self._id,
                        collate=self._collate_in_shared_memory,
                        gather=self._gather_in_shared_memory,
                    )
                    backend = InlineBackend(
                        reader,
                        concurrency=setup.concurrency,
                        # This loop has nothing else to do (a sync read's retry waits
                        # block it like the read itself; the collate must stay on it).
                        offload_sync=False,
                        task_group=tg,
                        sink=_EpochSink(self, epoch),
                    )
                    task_status.started((scope, backend))
                    await anyio.sleep_forever()
            finally:
                # After the task group: its stream tasks are over, so an async
                # stream is not closed while one of them is inside it.
                if backend is not None:
                    with anyio.CancelScope(shield=True):
                        await backend.aclose()

    def _collate_in_shared_memory(self, samples: Any) -> _InArena:
        """Collates into room in the segment the batch will travel in (no copy later)."""
        return self._in_arena(self._setup.collate_fn, samples)

    def _gather_in_shared_memory(
        self, getitem: Callable[[Any], Any], keys: Sequence[Any]
    ) -> _InArena:
        """Reads a batch and stacks each sample into the segment as soon as it is read
        (:func:`~aioload.collate.streamed.collate_as_read`; the reader uses it only where
        ``collate_fn`` is ``default_collate``)."""
        return self._in_arena(collate_as_read, getitem, keys)

    def _in_arena(self, build: Callable[..., Any], *args: Any) -> _InArena:
        """``build(*args)`` with its arrays allocated in a fresh arena of the segment
        writer; the arena goes back if ``build`` fails."""
        arena = self._writer.arena()
        try:
            with collate_into(arena.allocate):
                return _InArena(build(*args), arena)
        except BaseException:
            arena.release()
            raise

    def send(self, epoch: int, outcome: Outcome) -> None:
        """Sends batch ``outcome.seq``'s outcome to the loader (if its epoch still runs)."""
        in_arena = outcome.batch if isinstance(outcome.batch, _InArena) else None
        if epoch != self._epoch:
            if in_arena is not None:
                in_arena.arena.release()
            return  # finished after its epoch was cancelled: nobody waits for it
        seq = outcome.seq
        try:
            if outcome.end and outcome.counts is None:
                send_result(self._results, Result.END, epoch, seq, None)
                return
            # (An end that carries the dataset's last counts travels as an outcome.)
            if in_arena is not None:
                outcome = outcome._replace(batch=in_arena.batch)
            try:
                written = self._writer.write(
                    outcome_to_wire(outcome), None if in_arena is None else in_arena.arena
                )
            except Exception as pickling_error:
                if in_arena is None:
                    raise
                in_arena.arena.release()
                pickling_error.add_note("raised while sending the batch to the loader")
                failed = outcome._replace(batch=None, error=pickling_error)
                written = self._writer.write(outcome_to_wire(failed))
            send_result(self._results, Result.OUTCOME, epoch, seq, written)
        except OSError:
            # The loader closed the result socket: it is gone, so is our purpose.
            self._loader_gone = True
            if self._tg is not None:
                self._tg.cancel_scope.cancel()
