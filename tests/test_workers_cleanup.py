"""Worker processes are gone once an iteration ends, by whatever route it ends.

Every sample of these datasets is the pid of the worker process that read it, so
a test knows its workers and can watch them go: a worker is gone once its pid
has left the process table (reaped: no zombie) or belongs to a newer process.
Each route must get there within 5 s: exhaustion, ``break`` (also with slow
fetches in flight), an exception in the loop body or in the dataset, the
iterator being garbage-collected, ``close()``/``aclose()``, Ctrl-C and a
worker crash. Persistent workers stay between epochs and go when the loader is
closed or collected.

The autouse fixture checks, after every test, what the test may have left
without seeing it: a process descending from this one (other than the fork
server, the fork template and the resource tracker, which live as long as this
process; their children count), a new
entry in ``/dev/shm`` (POSIX shared memory and semaphores), a shared-memory
segment still mapped here (segments are ``memfd`` files, which never appear in
``/dev/shm``), a new socket, pipe, memfd or event-loop descriptor, or one of
aioload's per-epoch objects (an epoch, its backend, a worker pool) still alive.

Datasets live at module level: workers that start from the fork server or the fork
template receive them pickled.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import itertools
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from multiprocessing import resource_tracker
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import aioload
from aioload import DataLoader, WorkerCrashedError
from aioload.backends.processes import fork_template
from aioload.backends.processes.pool import warm_forkserver
from tests.conftest import wait_until

GONE_WITHIN = 5.0  # seconds: the bound for every route

# -- datasets ------------------------------------------------------------------------


class Pids(aioload.Dataset[int]):
    """Every sample is the reading process's pid; key ``fail_at`` raises LookupError."""

    def __init__(self, n: int = 16, delay: float = 0.0, fail_at: int = -1) -> None:
        self.n, self.delay, self.fail_at = n, delay, fail_at

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        if self.delay:
            time.sleep(self.delay)
        if index == self.fail_at:
            raise LookupError(f"key {index} is missing")
        return os.getpid()


class SlowPids:
    """Async: the first ``fast`` keys come at once, every other one takes 10 s.

    Only cancelling the fetches in flight can stop such an epoch quickly.
    """

    def __init__(self, n: int = 64, fast: int = 4) -> None:
        self.n, self.fast = n, fast

    def __len__(self) -> int:
        return self.n

    async def __getitem__(self, index: int) -> int:
        await asyncio.sleep(0 if index < self.fast else 10)
        return os.getpid()


class PidStream(aioload.IterableDataset[int]):
    """Every worker streams its pid ``n`` times."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[int]:
        return itertools.repeat(os.getpid(), self.n)


class AsyncPidStream(aioload.IterableDataset[int]):
    """Every worker streams its pid ``n`` times, asynchronously (``None``: forever)."""

    def __init__(self, n: int | None) -> None:
        self.n = n

    async def __aiter__(self) -> AsyncIterator[int]:
        for _ in itertools.count() if self.n is None else range(self.n):
            await asyncio.sleep(0)
            yield os.getpid()


class KillsItsWorkerOnce(aioload.Dataset[int]):
    """Key ``victim`` SIGKILLs the worker reading it, once; the pid goes to ``marker`` first."""

    def __init__(self, n: int, victim: int, marker: str) -> None:
        self.n, self.victim, self.marker = n, victim, marker

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        marker = Path(self.marker)
        if index == self.victim and not marker.exists():
            marker.write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
        return os.getpid()


class CrashingPidStream(aioload.IterableDataset[int]):
    """Worker 1 SIGKILLs itself after two samples.

    Every worker first writes its pid to ``<marker_dir>/worker-<id>``: the
    epoch's error may overtake the batches, so they need not all arrive.
    """

    def __init__(self, marker_dir: str) -> None:
        self.marker_dir = marker_dir

    def __iter__(self) -> Iterator[int]:
        info = aioload.get_worker_info()
        assert info is not None
        Path(self.marker_dir, f"worker-{info.id}").write_text(str(os.getpid()))
        for i in range(8):
            if info.id == 1 and i == 2:
                os.kill(os.getpid(), signal.SIGKILL)
            yield os.getpid()


class PidArrays(aioload.Dataset[dict[str, Any]]):
    """Samples with a 64 KiB array: batches arrive as views of shared memory."""

    def __init__(self, n: int = 16) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"pid": os.getpid(), "x": np.full(1 << 16, index, dtype=np.uint8)}


# -- processes -----------------------------------------------------------------------


def _stat(pid: int) -> tuple[str, int, int] | None:
    """``(state, parent pid, start time)`` of ``pid``, or None when it is not in the table."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # FileNotFoundError, or ProcessLookupError while it is being removed
        return None
    fields = text[text.rindex(")") + 2 :].split()  # the name in parentheses may hold spaces
    return fields[0], int(fields[1]), int(fields[19])


@dataclass(frozen=True)
class Proc:
    """A process, told apart from a later one with the same pid by its start time."""

    pid: int
    start: int | None  # None: it had left the table already when first seen

    @classmethod
    def of(cls, pid: int) -> Proc:
        stat = _stat(pid)
        return cls(pid, None if stat is None else stat[2])

    @property
    def gone(self) -> bool:
        """Reaped: neither running nor a zombie (a pid reused since does not count)."""
        if self.start is None:
            return True
        stat = _stat(self.pid)
        return stat is None or stat[2] != self.start

    @property
    def running(self) -> bool:
        stat = _stat(self.pid)
        return stat is not None and stat[2] == self.start and stat[0] not in "ZXx"


class Workers:
    """The worker processes whose pids came out of a loader."""

    def __init__(self) -> None:
        self.seen: dict[int, Proc] = {}

    def note(self, pids: Any) -> None:
        for pid in np.asarray(pids).ravel().tolist():
            if pid not in self.seen:
                assert pid != os.getpid(), "a sample was read in the loader's process"
                self.seen[pid] = Proc.of(pid)

    @property
    def pids(self) -> set[int]:
        return set(self.seen)

    def still_there(self) -> list[Proc]:
        return [proc for proc in self.seen.values() if not proc.gone]

    def all_running(self) -> bool:
        return all(proc.running for proc in self.seen.values())

    def assert_gone(self, count: int = 2) -> None:
        """Waits until every worker is gone, for at most 5 s."""
        assert len(self.seen) >= count, f"saw workers {self.pids}, expected {count}"
        assert wait_until(lambda: not self.still_there(), GONE_WITHIN), (
            f"workers still there after {GONE_WITHIN} s: {self.still_there()}"
        )
        assert_no_active_workers()

    async def assert_gone_async(self, count: int = 2) -> None:
        """:meth:`assert_gone` for a test on an event loop: the loop runs while waiting.

        Also waits for every other task of the loop to end (the epoch's included).
        """
        assert len(self.seen) >= count, f"saw workers {self.pids}, expected {count}"
        start = time.monotonic()
        deadline = start + GONE_WITHIN
        while self.still_there() and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        assert not self.still_there(), f"workers still there after {GONE_WITHIN} s"
        current = asyncio.current_task()

        def pending() -> set[asyncio.Task[Any]]:
            return {t for t in asyncio.all_tasks() if t is not current and not t.done()}

        while pending() and time.monotonic() < deadline + 1.0:
            await asyncio.sleep(0.005)
        assert not pending(), pending()
        assert_no_active_workers()


def assert_no_active_workers() -> None:
    """multiprocessing no longer counts any aioload worker among this process's children."""
    left = [p for p in multiprocessing.active_children() if p.name.startswith("aioload-worker")]
    assert not left, left


_HELPERS = (b"multiprocessing.forkserver import main", b"multiprocessing.resource_tracker import")


def _is_helper(pid: int) -> bool:
    """The fork server, the fork template or the resource tracker: they live as long as
    this process (the template is a fork of it, known by its name)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        name = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return False
    return any(helper in cmdline for helper in _HELPERS) or name == "aioload-templat"


def descendants() -> set[Proc]:
    """Every process below this one but the multiprocessing helpers (their children count)."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    starts: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            stat = _stat(int(entry.name))
            if stat is not None:
                children[stat[1]].append(int(entry.name))
                starts[int(entry.name)] = stat[2]
    me = os.getpid()
    found: set[Proc] = set()
    todo = list(children[me])
    while todo:
        pid = todo.pop()
        todo.extend(children[pid])
        if not (pid in children[me] and _is_helper(pid)):
            found.add(Proc(pid, starts[pid]))
    return found


# -- memory and descriptors -------------------------------------------------------------

_FD_KINDS = ("socket:", "pipe:", "/memfd:", "anon_inode:")


def descriptors() -> collections.Counter[str]:
    """This process's open sockets, pipes, memfds and event-loop descriptors, by kind."""
    kinds: collections.Counter[str] = collections.Counter()
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # the descriptor listdir itself used, closed since
            continue
        for kind in _FD_KINDS:
            if target.startswith(kind):
                kinds[target.split("[")[0].split(" ")[0]] += 1
    return kinds


def segment_mappings() -> int:
    """How many of the workers' shared-memory segments are mapped in this process."""
    return Path("/proc/self/maps").read_text().count("memfd:aioload")


def shm_names() -> set[str]:
    return set(os.listdir("/dev/shm"))


_EPOCH_PARTS = ("Epoch", "ProcessBackend", "WorkerPool", "SegmentReader")


def epoch_objects() -> collections.Counter[str]:
    """aioload's per-epoch objects alive after a collection: none may outlive its epoch."""
    gc.collect()
    return collections.Counter(
        type(o).__name__
        for o in gc.get_objects()
        if type(o).__name__ in _EPOCH_PARTS and type(o).__module__.startswith("aioload.")
    )


@dataclass(frozen=True)
class Resources:
    """What an iteration could leave behind."""

    processes: set[Proc]
    shm: set[str]
    mappings: int
    fds: collections.Counter[str]
    objects: collections.Counter[str]

    @classmethod
    def take(cls) -> Resources:
        objects = epoch_objects()  # first: the collection may free mappings and descriptors
        return cls(descendants(), shm_names(), segment_mappings(), descriptors(), objects)

    def left_since(self, before: Resources) -> dict[str, Any]:
        left = {
            "processes": self.processes - before.processes,
            "/dev/shm": self.shm - before.shm,
            "segments mapped": max(0, self.mappings - before.mappings),
            "descriptors": self.fds - before.fds,
            "epoch objects": self.objects - before.objects,
        }
        return {what: value for what, value in left.items() if value}


@pytest.fixture(scope="module", autouse=True)
def fork_server_running() -> Iterator[None]:
    """Starts the fork server, the resource tracker and a fork template first: they are not an
    iteration's leftovers.

    The fork server and the tracker live as long as this process, and each holds a pipe here:
    started by the first test that needs one (``spawn`` starts the tracker, ``forkserver``
    both), they would count as that test's leak. Whatever start method the loader's default
    picks, all run before any test takes its baseline, so the file passes alone and in any
    order. The template is this file's own, stopped at its end: earlier tests of the process
    may have started obstore's runtime, which a template forked now would carry broken into
    every worker of a later test that reads a store (this file's datasets never do).
    """
    resource_tracker.ensure_running()
    warm_forkserver(multiprocessing.get_context("forkserver"))
    assert len(list(DataLoader(Pids(2), num_workers=1))) == 2
    made = fork_template.replace()  # the process's template, if any, retires
    yield
    made.close()  # current() no longer offers it: later loaders fork their own when safe


def context_of(method: str | None) -> Any:
    """The ``multiprocessing_context`` a test's ``method`` names (``"template"``: the fork
    template's, as the rule picks it where a runtime that a fork does not survive runs)."""
    if method != "template":
        return method
    template = fork_template.current()
    assert template is not None
    return template.context()


@pytest.fixture(autouse=True)
def leaves_nothing_behind(request: pytest.FixtureRequest) -> Iterator[None]:
    before = Resources.take()
    yield
    if request.node.get_closest_marker("xfail") is not None:
        return  # a known bug: the test checks what it can itself
    left: dict[str, Any] = {}

    def clean() -> bool:
        nonlocal left
        left = Resources.take().left_since(before)
        return not left

    assert wait_until(clean, GONE_WITHIN), f"left behind: {left}"
    assert_no_active_workers()


# -- plain `for` ---------------------------------------------------------------------

START_METHODS = [None, "spawn", "fork", "template"]


@pytest.mark.parametrize("method", START_METHODS)
def test_for_exhaustion(method: str | None) -> None:
    workers = Workers()
    context = context_of(method)
    loader = DataLoader(Pids(8), batch_size=2, num_workers=2, multiprocessing_context=context)
    for batch in loader:
        workers.note(batch)
    workers.assert_gone()


@pytest.mark.parametrize("method", START_METHODS)
def test_for_break(method: str | None) -> None:
    workers = Workers()
    context = context_of(method)
    loader = DataLoader(Pids(64), batch_size=2, num_workers=2, multiprocessing_context=context)
    for i, batch in enumerate(loader):
        workers.note(batch)
        if i == 1:
            break
    workers.assert_gone()


def test_for_break_with_slow_fetches_in_flight() -> None:
    workers = Workers()
    started = time.monotonic()
    for i, batch in enumerate(DataLoader(SlowPids(), batch_size=2, num_workers=2)):
        workers.note(batch)
        if i == 1:
            break  # batches 2 and 3 are in flight, each waiting 10 s
    workers.assert_gone()
    assert time.monotonic() - started < GONE_WITHIN


def test_for_break_with_a_sync_fetch_running() -> None:
    workers = Workers()
    for i, batch in enumerate(DataLoader(Pids(32, delay=0.05), batch_size=2, num_workers=2)):
        workers.note(batch)
        if i == 1:
            break
    workers.assert_gone()


def test_for_exception_in_the_loop_body() -> None:
    workers = Workers()
    with pytest.raises(ZeroDivisionError):
        for i, batch in enumerate(DataLoader(Pids(64), batch_size=2, num_workers=2)):
            workers.note(batch)
            if i == 1:
                1 / 0  # noqa: B018
    workers.assert_gone()


def test_for_exception_raised_by_the_dataset_in_a_worker() -> None:
    workers = Workers()
    # Batches 0-2 arrive (workers 0, 1, 0); batch 3 holds the failing key.
    with pytest.raises(LookupError, match="key 6 is missing"):
        for batch in DataLoader(Pids(64, fail_at=6), batch_size=2, num_workers=2):
            workers.note(batch)
    workers.assert_gone()


def test_for_iterator_garbage_collected() -> None:
    workers = Workers()
    it = iter(DataLoader(Pids(64), batch_size=2, num_workers=2))
    workers.note(next(it))
    workers.note(next(it))
    del it
    gc.collect()
    workers.assert_gone()


def test_for_explicit_close() -> None:
    workers = Workers()
    it = iter(DataLoader(SlowPids(), batch_size=2, num_workers=2))
    workers.note(next(it))
    workers.note(next(it))
    it.close()
    workers.assert_gone()
    with pytest.raises(StopIteration):
        next(it)


def test_for_keyboard_interrupt_raised_in_the_loop_body() -> None:
    workers = Workers()
    with pytest.raises(KeyboardInterrupt):
        for i, batch in enumerate(DataLoader(Pids(64), batch_size=2, num_workers=2)):
            workers.note(batch)
            if i == 1:
                raise KeyboardInterrupt
    workers.assert_gone()


def test_for_ctrl_c_while_waiting_for_a_slow_batch() -> None:
    workers = Workers()
    main = threading.main_thread().ident
    assert main is not None

    def ctrl_c() -> None:
        # A terminal sends SIGINT to the whole foreground process group: the
        # workers get one too (and must leave stopping to the loader).
        for pid in workers.pids:
            os.kill(pid, signal.SIGINT)
        signal.pthread_kill(main, signal.SIGINT)

    timer = threading.Timer(0.1, ctrl_c)
    try:
        with pytest.raises(KeyboardInterrupt):
            for i, batch in enumerate(DataLoader(SlowPids(), batch_size=2, num_workers=2)):
                workers.note(batch)
                if i == 1:
                    timer.start()  # next() now waits 10 s for batch 2
    finally:
        timer.cancel()
        if timer.ident is not None:
            timer.join()
    workers.assert_gone()


def test_for_iterable_dataset_exhaustion_and_break() -> None:
    workers = Workers()
    count = 0
    for batch in DataLoader(PidStream(6), batch_size=2, num_workers=2):
        workers.note(batch)
        count += 1
    assert count == 6  # each worker streamed its own 6 samples
    workers.assert_gone()
    streaming = Workers()
    for i, batch in enumerate(DataLoader(AsyncPidStream(None), batch_size=2, num_workers=2)):
        streaming.note(batch)
        if i == 3:
            break  # the streams are endless
    streaming.assert_gone()


@pytest.mark.parametrize("method", [None, "template"])
def test_a_killed_worker_is_replaced_and_all_are_gone_after_the_epoch(
    tmp_path: Path, method: str | None
) -> None:
    marker = tmp_path / "killed"
    workers = Workers()
    keys = 0
    dataset = KillsItsWorkerOnce(40, 13, str(marker))
    context = context_of(method)
    for batch in DataLoader(dataset, batch_size=2, num_workers=2, multiprocessing_context=context):
        workers.note(batch)
        keys += len(batch)
    assert keys == 40  # the epoch completed through the restart
    killed = int(marker.read_text())
    workers.seen.setdefault(killed, Proc.of(killed))
    assert len(workers.seen) == 3  # two workers and the killed one's replacement
    workers.assert_gone(count=3)


def test_a_crash_that_ends_the_epoch_leaves_nothing_behind(tmp_path: Path) -> None:
    workers = Workers()
    with pytest.raises(WorkerCrashedError, match="cannot be resumed"):
        for batch in DataLoader(CrashingPidStream(str(tmp_path)), batch_size=2, num_workers=2):
            workers.note(batch)
    for marker in tmp_path.glob("worker-*"):
        pid = int(marker.read_text())
        workers.seen.setdefault(pid, Proc.of(pid))
    workers.assert_gone()


@pytest.mark.parametrize("stop_at", [None, 2])
def test_arrays_stay_valid_after_the_workers_are_gone(stop_at: int | None) -> None:
    workers = Workers()
    kept = []
    for i, batch in enumerate(DataLoader(PidArrays(), batch_size=2, num_workers=2)):
        workers.note(batch["pid"])
        kept.append(batch["x"])
        if i == stop_at:
            break
    del batch
    workers.assert_gone()
    assert len(kept) == (8 if stop_at is None else stop_at + 1)
    assert segment_mappings() > 0  # the arrays are views of the workers' shared memory
    for i, x in enumerate(kept):
        assert not x.flags.owndata
        assert x.shape == (2, 1 << 16)
        assert [int(x[0].min()), int(x[1].max())] == [2 * i, 2 * i + 1]
        x[0, :8] = 255  # still mapped, still writable
        assert x[0, :8].tolist() == [255] * 8
    del kept, x
    assert segment_mappings() == 0  # the last array took its segment with it


# -- persistent workers ---------------------------------------------------------------


def epoch(loader: DataLoader, stop_at: int | None = None) -> Workers:
    workers = Workers()
    for i, batch in enumerate(loader):
        workers.note(batch)
        if i == stop_at:
            break
    return workers


def test_persistent_workers_survive_epochs_and_go_at_close() -> None:
    loader = DataLoader(Pids(8), batch_size=2, num_workers=2, persistent_workers=True)
    try:
        first = epoch(loader)
        assert first.all_running()
        second = epoch(loader, stop_at=0)  # a break does not stop them either
        assert second.pids <= first.pids
        assert first.all_running()
        third = epoch(loader)
        assert third.pids == first.pids
    finally:
        loader.close()
    first.assert_gone()


def test_persistent_workers_go_when_the_with_block_ends() -> None:
    with DataLoader(Pids(8), batch_size=2, num_workers=2, persistent_workers=True) as loader:
        first = epoch(loader)
        assert epoch(loader).pids == first.pids
        for _ in loader:
            break  # the common shape: the block ends right after a break
    first.assert_gone()


def test_persistent_workers_go_when_the_loader_is_collected() -> None:
    loader = DataLoader(Pids(8), batch_size=2, num_workers=2, persistent_workers=True)
    first = epoch(loader)
    assert epoch(loader).pids == first.pids
    del loader
    gc.collect()
    first.assert_gone()


def test_persistent_workers_go_at_close_after_an_epoch_ended_by_an_error() -> None:
    with DataLoader(
        Pids(64, fail_at=6), batch_size=2, num_workers=2, persistent_workers=True
    ) as loader:
        workers = Workers()
        with pytest.raises(LookupError):
            for batch in loader:
                workers.note(batch)
        assert workers.all_running()
    workers.assert_gone()


# -- `async for` ----------------------------------------------------------------------


@pytest.mark.asyncio
async def test_async_for_exhaustion() -> None:
    workers = Workers()
    async for batch in DataLoader(Pids(8), batch_size=2, num_workers=2):
        workers.note(batch)
    await workers.assert_gone_async()


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "dataset", [Pids(64), SlowPids(), AsyncPidStream(None)], ids=["sync", "async-slow", "stream"]
)
async def test_async_for_break(dataset: Any) -> None:
    workers = Workers()
    started = time.monotonic()
    i = 0
    async for batch in DataLoader(dataset, batch_size=2, num_workers=2):
        workers.note(batch)
        if i == 1:
            break
        i += 1
    await workers.assert_gone_async()
    assert time.monotonic() - started < GONE_WITHIN


@pytest.mark.asyncio
async def test_async_for_exception_in_the_loop_body() -> None:
    workers = Workers()
    with pytest.raises(ZeroDivisionError):
        async for batch in DataLoader(SlowPids(), batch_size=2, num_workers=2):
            workers.note(batch)
            if len(workers.seen) == 2:
                1 / 0  # noqa: B018
    await workers.assert_gone_async()


@pytest.mark.asyncio
async def test_async_for_exception_raised_by_the_dataset_in_a_worker() -> None:
    workers = Workers()
    with pytest.raises(LookupError, match="key 6 is missing"):
        async for batch in DataLoader(Pids(64, fail_at=6), batch_size=2, num_workers=2):
            workers.note(batch)
    await workers.assert_gone_async()


@pytest.mark.asyncio
async def test_async_for_iterator_garbage_collected() -> None:
    workers = Workers()
    it = aiter(DataLoader(SlowPids(), batch_size=2, num_workers=2))
    workers.note(await anext(it))
    workers.note(await anext(it))
    del it
    gc.collect()
    await workers.assert_gone_async()


@pytest.mark.asyncio
async def test_async_for_aclose() -> None:
    workers = Workers()
    it = aiter(DataLoader(SlowPids(), batch_size=2, num_workers=2))
    workers.note(await anext(it))
    workers.note(await anext(it))
    await it.aclose()
    # aclose() returns once the epoch has ended: its workers are already told to stop.
    await workers.assert_gone_async()
    with pytest.raises(StopAsyncIteration):
        await anext(it)


@pytest.mark.asyncio
async def test_async_persistent_workers_survive_epochs_and_go_at_close() -> None:
    loader = DataLoader(SlowPids(8, fast=8), batch_size=2, num_workers=2, persistent_workers=True)
    try:
        first = Workers()
        async for batch in loader:
            first.note(batch)
        it = aiter(loader)
        again = Workers()
        again.note(await anext(it))
        await it.aclose()
        assert again.pids <= first.pids and first.all_running()
        third = Workers()
        async for batch in loader:
            third.note(batch)
        assert third.pids == first.pids
    finally:
        loader.close()
    await first.assert_gone_async()


@pytest.mark.asyncio
async def test_async_with_block_ending_right_after_a_break() -> None:
    workers = Workers()
    with DataLoader(
        SlowPids(8, fast=8), batch_size=2, num_workers=2, persistent_workers=True
    ) as loader:
        async for batch in loader:
            workers.note(batch)
            if len(workers.seen) == 2:
                break  # the dropped iterator's epoch is still stopping when close() runs
    del batch, loader
    await workers.assert_gone_async()
    assert not epoch_objects()
