"""What runs inside a worker process: its event loop, :class:`WorkerInfo`, seeding.

A worker receives its :class:`WorkerSetup` (the dataset, ``collate_fn``,
``worker_init_fn`` and the batching options) once when it starts, seeds its
random number generators, calls ``worker_init_fn`` and then serves commands
on its own uvloop event loop. It is an inline backend on a loop of its own:
many fetches are in flight at once (an async dataset's items up to
``concurrency``), results go back through shared memory
(:mod:`aioload.transport`) as soon as they are ready, in any order, and the
loader puts them back in order.

Under a fault policy the worker's inline backend retries, times out and skips
items itself; the items it skipped go back with their batch in a
:class:`SkippedBatch`, so the loader counts every worker's skips.

Each epoch is a scope of its own in the worker: a command of a new epoch
cancels whatever the previous one still had in flight. Iterable datasets are
iterated afresh each epoch, batched here, with ``drop_last`` applied per
worker, as in torch.

A worker ignores Ctrl-C (SIGINT goes to the whole process group; the loader
decides when its workers stop) and exits when told to or when the loader's
end of the command socket closes.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import pickle
import random
import signal
import socket
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import anyio
import anyio._backends._asyncio  # imported here so the fork server preloads it
import anyio.abc
import numpy as np
import uvloop  # noqa: F401  # likewise: a worker's first loop should not pay for imports

from aioload.backends.inline import InlineBackend
from aioload.collate import collate_into
from aioload.fetch import Fetcher, inspect_dataset
from aioload.iteration import new_event_loop
from aioload.policy import FaultPolicy, SkippedItem
from aioload.transport import Arena, SegmentWriter
from aioload.wire import FRAME_LENGTH, NO_EPOCH, Command, Result, send_result

__all__ = [
    "ErrorReport",
    "SkippedBatch",
    "StreamBatch",
    "WorkerInfo",
    "WorkerSetup",
    "get_worker_info",
    "set_thread_worker_info",
    "worker_main",
]


@dataclass(frozen=True)
class WorkerInfo:
    """Describes the worker process this code runs in (see :func:`get_worker_info`).

    Attributes:
        id: the worker's number, ``0 <= id < num_workers``.
        num_workers: how many workers the loader has.
        seed: the seed of this worker's random generators (``base_seed + id``).
        dataset: this worker's copy of the dataset.
    """

    id: int
    num_workers: int
    seed: int
    dataset: Any


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

        >>> class Range(aioload.IterableDataset):
        ...     def __init__(self, n): self.n = n
        ...     def __iter__(self):
        ...         info = aioload.get_worker_info()
        ...         if info is None:          # num_workers=0: everything here
        ...             return iter(range(self.n))
        ...         return iter(range(info.id, self.n, info.num_workers))
    """
    if _worker_info is not None:
        return _worker_info
    info: WorkerInfo | None = getattr(_thread_info, "info", None)
    return info


def set_thread_worker_info(info: WorkerInfo | None) -> None:
    """Makes :func:`get_worker_info` return ``info`` in this thread (executor tasks)."""
    _thread_info.info = info


@dataclass(frozen=True)
class WorkerSetup:
    """What every worker of a loader receives once per start.

    Attributes:
        dataset: the dataset (each worker works on its own copy).
        collate_fn: merges samples into a batch, in the worker.
        worker_init_fn: called with the worker id after seeding, or None.
        batch_size: samples per batch of an iterable dataset (None: no
            automatic batching).
        drop_last: drop each worker's last incomplete batch (iterable datasets).
        concurrency: the most item fetches in flight on the worker's loop.
        num_workers: how many workers the loader has.
        policy: the loader's fault policy (None: torch's behaviour).
        track_stream_state: an iterable dataset with ``state_dict``: send its
            state after each batch along with the batch (for checkpoints).
    """

    dataset: Any
    collate_fn: Callable[[Any], Any]
    worker_init_fn: Callable[[int], None] | None
    batch_size: int | None
    drop_last: bool
    concurrency: int
    num_workers: int
    policy: FaultPolicy | None = None
    track_stream_state: bool = False


@dataclass(frozen=True)
class ErrorReport:
    """A worker's exception on its way to the loader.

    ``error`` is the pickled exception, or None when it cannot be pickled; the
    type name, message and formatted traceback always cross. ``skipped``: the
    items the fault policy dropped from the failed batch before it failed.
    ``retries``: attempts the worker's fault policy repeated since its last
    result (for the loader's stats).
    """

    error: bytes | None
    type_name: str
    message: str
    traceback: str
    skipped: tuple[SkippedItem, ...] = ()
    retries: int = 0


@dataclass(frozen=True)
class SkippedBatch:
    """A batch on its way to the loader with the items the fault policy dropped from it.

    ``batch`` is None when every item was dropped (``empty``): nothing to deliver.
    ``retries``: attempts the worker's fault policy repeated since its last
    result (a batch with retries but no skips travels in one too).
    """

    batch: Any
    skipped: tuple[SkippedItem, ...]
    empty: bool
    retries: int = 0


@dataclass(frozen=True, slots=True)
class StreamBatch:
    """A batch of an iterable dataset and the dataset's state right after it was read."""

    batch: Any
    state: Any


def report(error: BaseException, skipped: Sequence[SkippedItem] = ()) -> ErrorReport:
    """Packs ``error`` (its traceback as text, and the batch's skips) for the loader."""
    text = "".join(traceback.format_exception(error))
    try:
        pickled: bytes | None = pickle.dumps(error, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        pickled = None
    kind = type(error)
    return ErrorReport(
        pickled, f"{kind.__module__}.{kind.__qualname__}", str(error), text, tuple(skipped)
    )


def seed_generators(seed: int) -> None:
    """Seeds Python's ``random``, numpy's legacy global state and torch (if imported)."""
    random.seed(seed)
    np.random.seed([seed & 0xFFFF_FFFF, (seed >> 32) & 0xFFFF_FFFF])
    # Only when the worker has imported torch (the dataset's or the main module
    # did): importing it here would add about a second to every worker start.
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(seed)


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


def worker_main(
    worker_id: int,
    seed: int,
    setup: WorkerSetup | bytes,
    commands: socket.socket,
    results: socket.socket,
) -> None:
    """The entry point of a worker process (the target of its ``Process``).

    ``setup`` arrives pickled once by the loader (bytes) when the start method
    pickles, or as the object itself under ``fork``.
    """
    global _worker_info
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    keep_freed_memory()
    results.setblocking(True)
    writer = SegmentWriter()
    try:
        if isinstance(setup, bytes):
            setup = pickle.loads(setup)
        assert isinstance(setup, WorkerSetup)
        _worker_info = WorkerInfo(worker_id, setup.num_workers, seed, setup.dataset)
        seed_generators(seed)
        if setup.worker_init_fn is not None:
            setup.worker_init_fn(worker_id)
    except BaseException as error:
        send_result(results, Result.START_FAILED, NO_EPOCH, -1, writer.write(report(error)))
        return
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        runner.run(_Worker(setup, commands, results, writer).serve())


@dataclass(frozen=True, slots=True)
class _InArena:
    """A collated batch and the arena its large arrays were stacked into."""

    batch: Any
    arena: Arena


class _Worker:
    """Serves one worker's commands on its event loop."""

    def __init__(
        self,
        setup: WorkerSetup,
        commands: socket.socket,
        results: socket.socket,
        writer: SegmentWriter,
    ) -> None:
        self._setup = setup
        self._protocol = inspect_dataset(setup.dataset)
        self._commands = commands
        self._results = results
        self._writer = writer
        self._tg: anyio.abc.TaskGroup | None = None
        self._epoch = NO_EPOCH
        self._epoch_scope: anyio.CancelScope | None = None
        self._backend: InlineBackend | None = None
        self._loader_gone = False
        self._stream_states: dict[int, Any] = {}  # seq -> the dataset's state after it
        self._retries = 0  # repeated attempts not yet reported to the loader

    async def serve(self) -> None:
        self._commands.setblocking(False)
        reader, writer = await asyncio.open_connection(sock=self._commands)
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
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
        if command == Command.FETCH or command == Command.NEXT:
            epoch, seq = fields[1], fields[2]
            if epoch != self._epoch:
                resume = fields[3] if command == Command.NEXT else None
                try:
                    await self._start_epoch(epoch, resume)
                except Exception as error:  # the dataset refused its checkpointed state
                    error.add_note("raised while loading this worker's dataset state")
                    self._complete(epoch, seq, error=error)
                    return True
            if self._backend is None:  # the epoch could not start (reported above)
                self._complete(epoch, seq, exhausted=True)
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

    async def _start_epoch(self, epoch: int, resume: Any = None) -> None:
        """Starts ``epoch``; a stream resumed from a checkpoint first loads its state."""
        self._end_epoch()
        self._epoch = epoch
        self._stream_states.clear()
        if resume is not None:
            self._setup.dataset.load_state_dict(resume)
        assert self._tg is not None
        self._epoch_scope, self._backend = await self._tg.start(self._run_epoch, epoch)

    def _record_stream_state(self, seq: int) -> None:
        self._stream_states[seq] = self._setup.dataset.state_dict()

    def _end_epoch(self) -> None:
        if self._epoch_scope is not None:
            self._epoch_scope.cancel()
        self._epoch_scope = self._backend = None
        self._epoch = NO_EPOCH

    async def _run_epoch(self, epoch: int, *, task_status: anyio.abc.TaskStatus[Any]) -> None:
        setup = self._setup
        backend: InlineBackend | None = None
        with anyio.CancelScope() as scope:
            try:
                async with anyio.create_task_group() as tg:
                    backend = InlineBackend(
                        Fetcher(setup.dataset, self._protocol),
                        self._collate_in_shared_memory,
                        batch_size=setup.batch_size,
                        drop_last=setup.drop_last,
                        concurrency=setup.concurrency,
                        # This loop has nothing else to do (a sync read's retry waits
                        # block it like the read itself; the collate must stay on it).
                        offload_sync=False,
                        task_group=tg,
                        complete=functools.partial(self._complete, epoch),
                        policy=setup.policy,
                        worker_id=None if _worker_info is None else _worker_info.id,
                        record_state=(
                            self._record_stream_state if setup.track_stream_state else None
                        ),
                        on_retry=self._count_retry,
                    )
                    task_status.started((scope, backend))
                    await anyio.sleep_forever()
            finally:
                # After the task group: its stream tasks are over, so an async
                # stream is not closed while one of them is inside it.
                if backend is not None:
                    with anyio.CancelScope(shield=True):
                        await backend.aclose()

    def _count_retry(self) -> None:
        self._retries += 1  # on this worker's loop: its only reader and writer

    def _collate_in_shared_memory(self, samples: Any) -> _InArena:
        """Collates into room in the segment the batch will travel in (no copy later)."""
        arena = self._writer.arena()
        try:
            with collate_into(arena.allocate):
                return _InArena(self._setup.collate_fn(samples), arena)
        except BaseException:
            arena.release()
            raise

    def _complete(
        self,
        epoch: int,
        seq: int,
        batch: Any = None,
        error: BaseException | None = None,
        exhausted: bool = False,
        skipped: Sequence[SkippedItem] = (),
    ) -> None:
        if epoch != self._epoch:
            if isinstance(batch, _InArena):
                batch.arena.release()
            return  # finished after its epoch was cancelled: nobody waits for it
        stream_state = self._stream_states.pop(seq, None)
        retries, self._retries = self._retries, 0
        try:
            if exhausted and skipped:
                # Every item was skipped: not the end of a stream, so no EXHAUSTED.
                written = self._writer.write(SkippedBatch(None, tuple(skipped), True, retries))
                send_result(self._results, Result.BATCH, epoch, seq, written)
                return
            if exhausted:
                send_result(self._results, Result.EXHAUSTED, epoch, seq, None)
                return
            if error is None:
                assert isinstance(batch, _InArena)
                payload = batch.batch
                if skipped or retries:  # the dropped items and the retry count ride along
                    payload = SkippedBatch(payload, tuple(skipped), False, retries)
                elif self._setup.track_stream_state:  # so does the stream's state after it
                    payload = StreamBatch(payload, stream_state)
                try:
                    written = self._writer.write(payload, batch.arena)
                except Exception as pickling_error:
                    batch.arena.release()
                    pickling_error.add_note("raised while sending the batch to the loader")
                    error = pickling_error
                else:
                    send_result(self._results, Result.BATCH, epoch, seq, written)
                    return
            written = self._writer.write(replace(report(error, skipped), retries=retries))
            send_result(self._results, Result.ERROR, epoch, seq, written)
        except OSError:
            # The loader closed the result socket: it is gone, so is our purpose.
            self._loader_gone = True
            if self._tg is not None:
                self._tg.cancel_scope.cancel()
