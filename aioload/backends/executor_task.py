"""What runs inside an executor's worker: one task reads, collates and returns one batch.

:func:`run_batch` is the function the executor backend submits, once per
batch (never per item: a task on a distributed engine costs milliseconds).
It runs wherever the executor puts it — a thread of a thread pool, a process
of a process pool, a dask worker — and does there what a worker process of
``num_workers > 0`` does:

- **The setup once per worker.** The dataset, ``collate_fn`` and
  ``worker_init_fn`` of an epoch are kept per worker, keyed by the epoch's
  key (the loader's identity and the epoch's number): the first task of an
  epoch on a worker loads them (from the object itself in a thread pool, a
  file the loader wrote once in a process pool, data dask broadcast to every
  worker), seeds the worker's generators and calls ``worker_init_fn``; later
  tasks of the epoch find them ready. Only the last few epochs are kept.
- **Who the worker is.** :func:`aioload.get_worker_info` works inside the
  task: ``id`` is the thread's place in the pool (thread pools, in the order
  threads first ran a task of a loader), the process's place in the pool's
  spawn order (process pools), or the dask worker's name when it is an
  integer (``LocalCluster`` names its workers 0, 1, …; otherwise its place
  among the names the cluster had when the epoch started). ``num_workers``
  is the pool's size (``max_workers``), or the dask cluster's workers when
  the epoch started.
- **Async datasets.** The items of the batch run concurrently on an event
  loop that belongs to the thread the task runs in: created by the thread's
  first task, reused by every later one, closed when the thread ends.
- **The batch** is read by the same :class:`~aioload.read.reader.BatchReader`
  as every other backend's, and the task returns its outcome's wire form
  (:func:`aioload.backends.processes.wire.outcome_to_wire`): the bare batch, or the batch with
  its skips and retries, or the error.
- **Errors** keep their type (``SystemExit`` and ``KeyboardInterrupt``
  too: they are returned like any other, not raised in the executor's
  worker); a note names the worker. One that cannot be
  pickled (a process or dask worker sends it back pickled) is rebuilt in
  the loader as a :class:`~aioload.WorkerError` naming its type, with its
  traceback (:class:`~aioload.backends.processes.wire.ErrorReport`).
"""

from __future__ import annotations

import asyncio
import os
import pickle
import threading
import weakref
import zlib
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Literal

from aioload.backends.base import Outcome
from aioload.backends.processes.wire import outcome_to_wire
from aioload.backends.processes.worker import seed_generators
from aioload.data.protocol import inspect_dataset
from aioload.eventloop import new_event_loop
from aioload.read.eager import ItemPool
from aioload.read.reader import BatchReader, WorkerSetup
from aioload.worker_info import WorkerInfo, set_thread_worker_info

__all__ = ["EpochKey", "Placement", "SetupFile", "ThreadIds", "run_batch"]

EpochKey = tuple[str, int]
"""The loader's identity (a random token) and the epoch's number."""

_KEPT_EPOCHS = 4  # setups a worker keeps: a new epoch may start before the last one's tasks end


class ThreadIds:
    """Numbers the threads of a thread pool 0, 1, … in the order they first run a task.

    It lives in the loader's process and reaches the tasks by reference (a
    thread pool pickles nothing), one per executor, so a thread keeps its id
    across epochs and loaders.
    """

    def __init__(self) -> None:
        self._ids: dict[int, int] = {}
        self._lock = threading.Lock()

    def of_current(self) -> int:
        ident = threading.get_ident()
        with self._lock:
            found = self._ids.get(ident)
            if found is None:
                found = self._ids[ident] = len(self._ids)
            return found

    def __reduce__(self) -> Any:
        raise TypeError("ThreadIds serves threads of the loader's own process only")


@dataclass(frozen=True)
class Placement:
    """What a task needs to tell which worker it runs in.

    Attributes:
        kind: ``'thread'`` (a thread pool of the loader's process),
            ``'process'`` (a process pool), ``'dask'`` or ``'other'``.
        num_workers: the pool's size, as far as the loader knows it.
        pids: process pools: the pool's processes in the order it spawned them.
        names: dask: the cluster's worker names when the epoch started, sorted.
        threads: thread pools (and other executors running in the loader's
            process): the loader's thread numbering.
        loader_pid: the loader's process.
    """

    kind: Literal["thread", "process", "dask", "other"]
    num_workers: int
    pids: tuple[int, ...] = ()
    names: tuple[str, ...] = ()
    threads: ThreadIds | None = field(default=None, compare=False)
    loader_pid: int = field(default_factory=os.getpid)

    def __reduce__(self) -> Any:
        # The thread numbering stays home: only threads of the loader's process use it.
        return (
            Placement,
            (self.kind, self.num_workers, self.pids, self.names, None, self.loader_pid),
        )


@dataclass(frozen=True)
class SetupFile:
    """An epoch's pickled setup in a file the loader wrote once (process pools)."""

    path: str


@dataclass
class _WorkerState:
    """One worker's epoch: its setup, identity and reader."""

    setup: WorkerSetup
    info: WorkerInfo
    where: str
    reader: BatchReader


_lock = threading.Lock()  # guards the process's states (dask runs tasks in several threads)
_process_states: OrderedDict[EpochKey, _WorkerState] = OrderedDict()
_local = threading.local()


def run_batch(
    key: EpochKey,
    base_seed: int,
    setup: WorkerSetup | SetupFile | bytes,
    placement: Placement,
    seq: int,
    keys: Any,
) -> Any:
    """Reads and collates batch ``seq`` (``keys``) in the executor's worker.

    Returns the wire form of the batch's outcome (see
    :func:`aioload.backends.processes.wire.outcome_to_wire`): errors are returned, not raised.
    """
    try:
        state = _state(key, base_seed, setup, placement)
    except BaseException as error:  # a worker_init_fn's SystemExit too: it is the batch's error
        outcome = Outcome(seq, error=error)
    else:
        set_thread_worker_info(state.info)
        try:
            reader = state.reader
            if reader.protocol.is_async:
                outcome = _thread_loop().run_until_complete(
                    _read_async(reader, seq, keys, state.setup.concurrency)
                )
            else:
                outcome = reader.read_sync(seq, keys)
        finally:
            set_thread_worker_info(None)
        if outcome.error is not None:
            outcome.error.add_note(f"raised in executor worker {state.info.id} ({state.where})")
    # A thread pool hands the result over as it is; everything else pickles it.
    return outcome_to_wire(outcome, pickled=placement.kind != "thread")


# -- the worker's setup ---------------------------------------------------------


def _state(
    key: EpochKey, base_seed: int, setup: WorkerSetup | SetupFile | bytes, placement: Placement
) -> _WorkerState:
    """The worker's state for the epoch ``key``, set up by the first task that asks."""
    if placement.kind == "thread" or _in_loader_process(placement):
        # A thread is the worker: its state is its own; the process's generators
        # are the caller's, so aioload does not reseed them.
        states: OrderedDict[EpochKey, _WorkerState] | None = getattr(_local, "states", None)
        if states is None:
            states = _local.states = OrderedDict()
        found = states.get(key)
        if found is None:
            found = _new_state(key, base_seed, setup, placement, seed=False)
            _keep(states, key, found)
        return found
    with _lock:
        found = _process_states.get(key)
        if found is None:
            found = _new_state(key, base_seed, setup, placement, seed=True)
            _keep(_process_states, key, found)
        return found


def _keep(states: OrderedDict[EpochKey, _WorkerState], key: EpochKey, state: _WorkerState) -> None:
    states[key] = state
    while len(states) > _KEPT_EPOCHS:
        states.popitem(last=False)


def _in_loader_process(placement: Placement) -> bool:
    # A thread pool, or a cluster of threads in the loader's own process (dask's
    # processes=False): its generators are the caller's.
    return os.getpid() == placement.loader_pid


def _new_state(
    key: EpochKey,
    base_seed: int,
    setup: WorkerSetup | SetupFile | bytes,
    placement: Placement,
    *,
    seed: bool,
) -> _WorkerState:
    worker_id, where = _identity(placement)
    try:
        loaded = _load_setup(setup)
        info = WorkerInfo(worker_id, placement.num_workers, base_seed + worker_id, loaded.dataset)
        if seed:
            seed_generators(info.seed, worker_id)
        if loaded.worker_init_fn is not None:
            set_thread_worker_info(info)
            try:
                loaded.worker_init_fn(worker_id)
            finally:
                set_thread_worker_info(None)
    except BaseException as error:
        error.add_note(f"raised while setting up executor worker {worker_id} ({where})")
        raise
    reader = BatchReader(loaded, inspect_dataset(loaded.dataset), worker=worker_id)
    return _WorkerState(loaded, info, where, reader)


def _load_setup(setup: WorkerSetup | SetupFile | bytes) -> WorkerSetup:
    if isinstance(setup, SetupFile):
        with open(setup.path, "rb") as file:
            setup = file.read()
    if isinstance(setup, bytes):
        setup = pickle.loads(setup)
    if not isinstance(setup, WorkerSetup):
        raise TypeError(f"an executor task got {type(setup).__name__} instead of its setup")
    return setup


def _identity(placement: Placement) -> tuple[int, str]:
    """This worker's id and a description of where it runs."""
    if placement.threads is not None and os.getpid() == placement.loader_pid:
        return placement.threads.of_current(), f"thread {threading.current_thread().name}"
    pid = os.getpid()
    if placement.kind == "process":
        pids = placement.pids
        # A process missing from the snapshot was spawned by this very submission.
        return (pids.index(pid) if pid in pids else len(pids)), f"pid {pid}"
    if placement.kind == "dask":
        from distributed import get_worker

        worker = get_worker()
        name = str(worker.name)
        if name.isdigit():
            worker_id = int(name)
        elif name in placement.names:
            worker_id = placement.names.index(name)
        else:  # joined after the epoch started: a stable number from its name
            worker_id = placement.num_workers + zlib.crc32(name.encode()) % (1 << 16)
        return worker_id, f"dask worker {name} at {worker.address}, pid {pid}"
    return pid, f"pid {pid}"


# -- reading ------------------------------------------------------------------------


async def _read_async(reader: BatchReader, seq: int, keys: Any, concurrency: int) -> Outcome:
    """Batch ``seq``'s items, read concurrently (up to ``concurrency`` at once) on this loop."""
    finished: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()

    def done(outcome: Outcome) -> None:
        if not finished.done():
            finished.set_result(outcome)

    pool = ItemPool(concurrency)
    try:
        reader.read_async(seq, keys, pool, done)
        return await finished
    finally:
        await pool.aclose()  # nothing of this batch outlives its task


def _thread_loop() -> asyncio.AbstractEventLoop:
    """This thread's event loop: made by its first async task, closed when the thread ends."""
    loop: asyncio.AbstractEventLoop | None = getattr(_local, "loop", None)
    if loop is None:
        loop = _local.loop = new_event_loop()
        weakref.finalize(threading.current_thread(), _close_loop, loop)
    return loop


def _close_loop(loop: asyncio.AbstractEventLoop) -> None:
    if not loop.is_running() and not loop.is_closed():
        loop.close()
