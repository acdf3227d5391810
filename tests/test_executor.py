"""``DataLoader(executor=...)``: batches as tasks of a thread pool or a process pool.

Datasets live at module level: the process pool (``forkserver``) pickles them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import multiprocessing
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import aioload
from aioload import DataLoader
from aioload.backends.processes.pool import warm_forkserver

# -- datasets ------------------------------------------------------------------


class Squares(aioload.Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"x": np.full(3, index, dtype=np.float32), "y": index * index}


_unpickled = 0  # setups unpickled in this process


class WhereAmI(aioload.Dataset):
    """Each sample says who read it: pid, thread, worker info, and the setups unpickled."""

    def __init__(self, n: int = 32) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __setstate__(self, state: dict[str, Any]) -> None:
        global _unpickled
        _unpickled += 1
        self.__dict__.update(state)

    def __getitem__(self, index: int) -> tuple[int, int, int, int, int, int, bool]:
        info = aioload.get_worker_info()
        assert info is not None
        return (
            index,
            os.getpid(),
            threading.get_ident(),
            info.id,
            info.num_workers,
            _unpickled,
            info.dataset is self,
        )


class AsyncWhere(aioload.Dataset):
    """Async items that sleep, and say which loop and thread ran them."""

    def __init__(self, n: int, delay: float = 0.0, slow_key: int = -1, slow: float = 0.0) -> None:
        self.n, self.delay, self.slow_key, self.slow = n, delay, slow_key, slow

    def __len__(self) -> int:
        return self.n

    async def __getitem__(self, index: int) -> tuple[int, int, int, int]:
        await asyncio.sleep(self.slow if index == self.slow_key else self.delay)
        info = aioload.get_worker_info()
        assert info is not None
        return index, id(asyncio.get_running_loop()), threading.get_ident(), info.id


class Slow(aioload.Dataset):
    """Sync items that take ``delay`` seconds; counts its reads (thread pools share it)."""

    def __init__(self, n: int, delay: float) -> None:
        self.n, self.delay = n, delay
        self.reads = 0
        self.lock = threading.Lock()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        time.sleep(self.delay)
        with self.lock:
            self.reads += 1
        return index


class Stream(aioload.IterableDataset):
    def __iter__(self) -> Iterator[int]:
        return iter(range(4))


_inits: list[tuple[int, int]] = []


def record_init(worker_id: int) -> None:
    info = aioload.get_worker_info()
    assert info is not None and info.id == worker_id
    _inits.append((worker_id, threading.get_ident()))


# -- fixtures --------------------------------------------------------------------


@pytest.fixture(scope="module")
def threads() -> Iterator[concurrent.futures.ThreadPoolExecutor]:
    with concurrent.futures.ThreadPoolExecutor(3, thread_name_prefix="pool") as executor:
        yield executor


@pytest.fixture
def processes(
    process_pool: concurrent.futures.ProcessPoolExecutor,
) -> concurrent.futures.ProcessPoolExecutor:
    return process_pool


@pytest.fixture(params=["threads", "processes"])
def executor(request: pytest.FixtureRequest) -> concurrent.futures.Executor:
    found: concurrent.futures.Executor = request.getfixturevalue(request.param)
    return found


def keys_of(batches: list[tuple[Any, ...]]) -> list[int]:
    return [int(k) for batch in batches for k in batch[0]]


# -- results -----------------------------------------------------------------------


@pytest.mark.asyncio
async def test_async_for_with_out_of_order_delivery(
    threads: concurrent.futures.ThreadPoolExecutor,
) -> None:
    # Key 0 is slow: with in_order=False the other batches do not wait for it.
    dataset = AsyncWhere(24, delay=0.0, slow_key=0, slow=0.3)
    loader = DataLoader(dataset, batch_size=4, executor=threads, in_order=False)
    order = [int(batch[0][0]) async for batch in loader]
    assert sorted(order) == list(range(0, 24, 4))
    assert order[0] != 0


# -- where tasks run -------------------------------------------------------------


def test_worker_info_and_init_once_per_thread(
    threads: concurrent.futures.ThreadPoolExecutor,
) -> None:
    dataset = WhereAmI(48)
    ids: dict[int, int] = {}
    for _ in range(2):
        _inits.clear()
        loader = DataLoader(dataset, batch_size=2, executor=threads, worker_init_fn=record_init)
        samples = [s for batch in loader for s in zip(*batch, strict=True)]
        assert sorted(int(s[0]) for s in samples) == list(range(48))
        for s in samples:  # every thread keeps one id, across epochs too
            assert ids.setdefault(int(s[2]), int(s[3])) == int(s[3])
        assert {int(s[4]) for s in samples} == {3}  # num_workers: the pool's size
        assert all(bool(s[6]) for s in samples)  # a thread pool shares the dataset itself
        # worker_init_fn: once per worker (thread) and epoch, never per task.
        assert sorted(_inits) == sorted({(int(s[3]), int(s[2])) for s in samples})
    assert sorted(set(ids.values())) == sorted(ids.values())
    assert set(ids.values()) <= {0, 1, 2}
    assert aioload.get_worker_info() is None  # not in the consumer's thread


def test_setup_reaches_each_process_once_per_epoch(
    processes: concurrent.futures.ProcessPoolExecutor,
) -> None:
    dataset = WhereAmI(64)
    unpickled: list[dict[int, set[int]]] = []
    ids: dict[int, int] = {}
    for _ in range(2):
        loader = DataLoader(dataset, batch_size=2, executor=processes)
        samples = [s for batch in loader for s in zip(*batch, strict=True)]
        assert sorted(int(s[0]) for s in samples) == list(range(64))
        counts: dict[int, set[int]] = {}
        for s in samples:
            assert ids.setdefault(int(s[1]), int(s[3])) == int(s[3])  # stable per process
            counts.setdefault(int(s[1]), set()).add(int(s[5]))
        assert {int(s[4]) for s in samples} == {2}
        unpickled.append(counts)
    assert sorted(ids.values()) == [0, 1]
    # 32 tasks an epoch, yet each process unpickled the setup once per epoch.
    for counts in unpickled:
        assert all(len(seen) == 1 for seen in counts.values())
    for pid, (count,) in unpickled[1].items():
        if pid in unpickled[0]:
            assert count == next(iter(unpickled[0][pid])) + 1


def test_async_items_share_one_loop_per_thread(
    threads: concurrent.futures.ThreadPoolExecutor,
) -> None:
    dataset = AsyncWhere(64, delay=0.02)
    started = time.perf_counter()
    samples = [
        s
        for _ in range(2)
        for batch in DataLoader(dataset, batch_size=16, executor=threads)
        for s in zip(*batch, strict=True)
    ]
    elapsed = time.perf_counter() - started
    assert sorted(int(s[0]) for s in samples) == sorted(list(range(64)) * 2)
    loops_by_thread: dict[int, set[int]] = {}
    for _, loop, thread, _ in samples:
        loops_by_thread.setdefault(int(thread), set()).add(int(loop))
    # One loop per thread, reused by every task of both epochs.
    assert all(len(loops) == 1 for loops in loops_by_thread.values())
    # The 16 items of a batch run concurrently: 8 batches of 16 x 20 ms items read one
    # after the other would take 2.6 s.
    assert elapsed < 1.5


def test_async_items_in_processes(processes: concurrent.futures.ProcessPoolExecutor) -> None:
    loader = DataLoader(AsyncWhere(20, delay=0.001), batch_size=4, executor=processes)
    assert keys_of(list(loader)) == list(range(20))


# -- errors ---------------------------------------------------------------------------


# -- arguments -----------------------------------------------------------------------


def test_invalid_executor_arguments(threads: concurrent.futures.ThreadPoolExecutor) -> None:
    with pytest.raises(TypeError, match=r"concurrent\.futures\.Executor"):
        DataLoader(Squares(4), executor=object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="mutually exclusive"):
        DataLoader(Squares(4), executor=threads, num_workers=2)
    with pytest.raises(ValueError, match="persistent_workers"):
        DataLoader(Squares(4), executor=threads, persistent_workers=True)
    with pytest.raises(ValueError, match="iterable dataset"):
        DataLoader(Stream(), executor=threads)
    with pytest.raises(ValueError, match="multiprocessing_context"):
        DataLoader(Squares(4), executor=threads, multiprocessing_context="spawn")
    loader = DataLoader(Squares(4), executor=threads)
    with pytest.raises(ValueError, match="executor attribute"):
        loader.executor = threads
    assert DataLoader(Squares(4), executor=threads, prefetch_factor=3).window == 9
    assert DataLoader(Squares(4), executor=threads).window == 6


def test_a_shut_down_executor_fails_the_epoch_clearly() -> None:
    executor = concurrent.futures.ThreadPoolExecutor(1)
    executor.shutdown()
    with pytest.raises(RuntimeError, match="after shutdown") as caught:
        list(DataLoader(Squares(4), batch_size=2, executor=executor))
    assert any("submitting batch 0" in note for note in caught.value.__notes__)


# -- ending early -------------------------------------------------------------------


def test_break_cancels_pending_batches_and_waits_for_running_ones(
    threads: concurrent.futures.ThreadPoolExecutor,
) -> None:
    dataset = Slow(400, delay=0.01)
    loader = DataLoader(dataset, batch_size=4, executor=threads)
    for _ in loader:
        break
    # Only the window's batches were started, and none runs after the loop ended.
    reads = dataset.reads
    assert reads <= loader.window * 4
    time.sleep(0.1)
    assert dataset.reads == reads
    # The executor is the caller's: still open.
    assert threads.submit(int, "7").result() == 7


@pytest.mark.asyncio
async def test_aclose_stops_async_iteration(
    processes: concurrent.futures.ProcessPoolExecutor,
) -> None:
    loader = DataLoader(AsyncWhere(200, delay=0.005), batch_size=4, executor=processes)
    iterator = aiter(loader)
    first = await anext(iterator)
    assert list(first[0]) == [0, 1, 2, 3]
    await iterator.aclose()  # type: ignore[attr-defined]
    assert processes.submit(int, "3").result() == 3


def test_an_unpicklable_dataset_is_named(
    processes: concurrent.futures.ProcessPoolExecutor,
) -> None:
    with pytest.raises(TypeError, match=r"cannot send dataset\.lock to the executor's workers"):
        list(DataLoader(Slow(4, delay=0.0), batch_size=2, executor=processes))


def test_no_setup_file_is_left(
    processes: concurrent.futures.ProcessPoolExecutor,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the setup file goes
    assert len(list(DataLoader(Squares(12), batch_size=4, executor=processes))) == 3
    for _ in DataLoader(Squares(400), batch_size=4, executor=processes):
        break
    assert list(tmp_path.iterdir()) == []


class DiesOnKey(aioload.Dataset):
    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> int:
        if index == 5:
            os._exit(3)
        return index


def test_a_dead_pool_process_fails_the_epoch_naming_keys() -> None:
    context = multiprocessing.get_context("forkserver")
    warm_forkserver(context)
    with concurrent.futures.ProcessPoolExecutor(2, mp_context=context) as pool:
        batches = []
        with pytest.raises(concurrent.futures.process.BrokenProcessPool) as caught:
            for batch in DataLoader(DiesOnKey(), batch_size=4, executor=pool):
                batches.append(batch.tolist())
    # The pool fails every batch it held, maybe the first one too (in order: the first fails).
    assert batches in ([], [[0, 1, 2, 3]])
    failed = "keys [4, 5, 6, 7]" if batches else "keys [0, 1, 2, 3]"
    assert any(failed in note for note in caught.value.__notes__)
