"""Worker processes: what users see with ``num_workers > 0``.

Datasets live at module level: workers start with ``forkserver``, which pickles them.
"""

from __future__ import annotations

import asyncio
import math
import mmap
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import aioload
from aioload import DataLoader, LoaderTimeoutError, WorkerCrashedError
from tests.mappings import segment_inode

# -- datasets ------------------------------------------------------------------


class Squares(aioload.Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"x": np.full(3, index, dtype=np.float32), "y": index * index}


class AsyncItems(aioload.Dataset):
    def __init__(self, n: int, delay: float = 0.0, slow_key: int = -1, slow: float = 0.0) -> None:
        self.n, self.delay, self.slow_key, self.slow = n, delay, slow_key, slow

    def __len__(self) -> int:
        return self.n

    async def __getitem__(self, index: int) -> int:
        await asyncio.sleep(self.slow if index == self.slow_key else self.delay)
        return index


class WhereAmI(aioload.Dataset):
    """Each sample says which process read it and what its worker info was."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> tuple[int, int, int, int, bool]:
        info = aioload.get_worker_info()
        assert info is not None
        return index, os.getpid(), info.id, info.num_workers, info.dataset is self


class Draws(aioload.Dataset):
    """Samples drawn from the worker's global generators (seeded per worker)."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> tuple[int, float, float]:
        info = aioload.get_worker_info()
        assert info is not None
        return info.seed, random.random(), float(np.random.rand())


class HoldsALock(aioload.Dataset):
    def __init__(self) -> None:
        self.handle = {"lock": threading.Lock()}

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> int:
        return index


class KillsItsWorker(aioload.Dataset):
    """Key ``victim`` SIGKILLs the worker reading it, the first ``times`` times only."""

    def __init__(self, n: int, victim: int, marker_dir: str, times: int = 1) -> None:
        self.n, self.victim, self.marker_dir, self.times = n, victim, marker_dir, times

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        if index == self.victim:
            for attempt in range(self.times):
                marker = Path(self.marker_dir, f"killed-{attempt}")
                if not marker.exists():
                    marker.touch()
                    os.kill(os.getpid(), signal.SIGKILL)
        return index


class Counter(aioload.Dataset):
    """Counts the reads made by this copy of the dataset (one copy per worker)."""

    def __init__(self) -> None:
        self.reads = 0

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> tuple[int, int]:
        self.reads += 1
        return os.getpid(), self.reads


class Payloads(aioload.Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {
            "image": np.arange(index, index + 12, dtype=np.uint16).reshape(3, 4),
            "fortran": np.asfortranarray(np.arange(6.0).reshape(2, 3)) + index,
            "strided": np.arange(20)[::3] + index,
            "objects": np.array([f"s{index}", None], dtype=object),
            "name": f"item-{index}",
            "raw": bytes([index]) * 5,
            "empty": np.zeros((0, 3)),
        }


class BigItems(aioload.Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> np.ndarray:
        return np.full(1 << 20, index, dtype=np.uint8)


class RangeByWorkerInfo(aioload.IterableDataset):
    """torch's first sharding example: split inside ``__iter__`` with get_worker_info()."""

    def __init__(self, start: int, end: int) -> None:
        self.start, self.end = start, end

    def __iter__(self) -> Iterator[int]:
        info = aioload.get_worker_info()
        if info is None:
            return iter(range(self.start, self.end))
        per_worker = math.ceil((self.end - self.start) / float(info.num_workers))
        start = self.start + info.id * per_worker
        return iter(range(start, min(start + per_worker, self.end)))


class PlainRange(aioload.IterableDataset):
    """torch's second sharding example: the same split made by ``worker_init_fn``."""

    def __init__(self, start: int, end: int) -> None:
        self.start, self.end = start, end

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.start, self.end))


def split_range(worker_id: int) -> None:
    info = aioload.get_worker_info()
    assert info is not None
    dataset = info.dataset
    overall_start, overall_end = dataset.start, dataset.end
    per_worker = math.ceil((overall_end - overall_start) / float(info.num_workers))
    dataset.start = overall_start + worker_id * per_worker
    dataset.end = min(dataset.start + per_worker, overall_end)


class AsyncShards(aioload.IterableDataset):
    """An async stream: worker ``i`` yields ``i*100 .. i*100 + count - 1``."""

    def __init__(self, counts: list[int]) -> None:
        self.counts = counts

    async def __aiter__(self) -> Any:
        info = aioload.get_worker_info()
        worker = 0 if info is None else info.id
        for i in range(self.counts[worker]):
            await asyncio.sleep(0)
            yield worker * 100 + i


def record_init(worker_id: int) -> None:
    info = aioload.get_worker_info()
    assert info is not None and info.id == worker_id
    info.dataset.initialised = worker_id


class InitAware(aioload.Dataset):
    initialised = -1

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> int:
        return self.initialised


def flat(batches: list[Any]) -> list[int]:
    return [int(v) for batch in batches for v in np.asarray(batch).ravel()]


# -- map-style ------------------------------------------------------------------


def test_get_worker_info_is_none_in_the_main_process() -> None:
    assert aioload.get_worker_info() is None


def test_worker_info_is_read_only_with_torchs_error() -> None:
    info = aioload.WorkerInfo(1, 2, 7, None)
    for attribute in ("id", "new"):
        with pytest.raises(RuntimeError, match=r"^Cannot assign attributes to WorkerInfo objects$"):
            setattr(info, attribute, 3)
    with pytest.raises(AttributeError):  # still what a frozen dataclass raises
        del info.seed
    assert info.id == 1 and all(f"{k}=" in repr(info) for k in ("id", "num_workers", "seed"))


def test_shuffled_order_does_not_depend_on_num_workers() -> None:
    def keys(num_workers: int) -> list[list[int]]:
        loader = DataLoader(
            Squares(40), batch_size=5, shuffle=True, generator=7, num_workers=num_workers
        )
        return [[flat([b["y"]]) for b in loader] for _ in range(2)]  # type: ignore[misc]

    assert keys(0) == keys(2)


def test_samples_are_read_in_the_workers_with_their_info() -> None:
    samples = [
        s
        for batch in DataLoader(WhereAmI(), batch_size=2, num_workers=2)
        for s in zip(*batch, strict=True)
    ]
    assert [int(s[0]) for s in samples] == list(range(8))
    pids = {int(s[1]) for s in samples}
    assert os.getpid() not in pids
    assert {int(s[2]) for s in samples} <= {0, 1}
    assert {int(s[3]) for s in samples} == {2}
    assert all(bool(s[4]) for s in samples)  # info.dataset is the worker's own copy


@pytest.mark.asyncio
async def test_async_dataset_items_are_awaited_concurrently_in_the_workers() -> None:
    # 64 items that each wait 0.2 s: concurrent fetching takes about one wait, not 64.
    loader = DataLoader(AsyncItems(64, delay=0.2), batch_size=16, num_workers=2)
    started = time.monotonic()
    got = [batch async for batch in loader]
    assert flat(got) == list(range(64))
    assert time.monotonic() - started < 5  # serially: 12.8 s


@pytest.mark.asyncio
async def test_async_for_keeps_the_callers_loop_running() -> None:
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.005)

    ticker = asyncio.create_task(tick())
    try:
        got = [b async for b in DataLoader(AsyncItems(32, delay=0.05), batch_size=4, num_workers=2)]
    finally:
        ticker.cancel()
    assert flat(got) == list(range(32))
    assert ticks >= 5


def test_out_of_order_yields_batches_as_they_complete() -> None:
    dataset = AsyncItems(40, slow_key=0, slow=0.6)
    got = list(DataLoader(dataset, batch_size=4, num_workers=2, in_order=False))
    assert sorted(flat(got)) == list(range(40))
    assert flat(got[:1]) != [0, 1, 2, 3]  # the slow first batch did not hold the others back
    ordered = list(DataLoader(dataset, batch_size=4, num_workers=2))
    assert flat(ordered) == list(range(40))


@pytest.mark.slow
def test_spawn_and_fork_and_context_objects_work() -> None:
    for context in ("spawn", "fork", multiprocessing.get_context("forkserver")):
        loader = DataLoader(
            Squares(6), batch_size=3, num_workers=2, multiprocessing_context=context
        )
        assert flat([b["y"] for b in loader]) == [i * i for i in range(6)]


def test_timeout_applies_to_batches_from_workers() -> None:
    loader = DataLoader(AsyncItems(8, slow_key=5, slow=30), batch_size=2, num_workers=2, timeout=2)
    with pytest.raises(LoaderTimeoutError, match=r"batch 2 \(keys \[4, 5\]\)"):
        list(loader)


# -- transport -------------------------------------------------------------------


def test_every_kind_of_value_crosses_intact() -> None:
    expected = list(DataLoader(Payloads(), batch_size=None))
    got = list(DataLoader(Payloads(), batch_size=None, num_workers=2))
    for a, b in zip(got, expected, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            if isinstance(a[key], np.ndarray):
                assert a[key].dtype == b[key].dtype and a[key].shape == b[key].shape
                assert a[key].flags.f_contiguous == b[key].flags.f_contiguous
                np.testing.assert_array_equal(a[key], b[key])
            else:
                assert a[key] == b[key]


def test_arrays_are_writable_views_of_shared_memory() -> None:
    (batch,) = list(DataLoader(BigItems(), batch_size=8, num_workers=1))
    assert batch.shape == (8, 1 << 20)
    assert [int(row[0]) for row in batch] == list(range(8))
    assert not batch.flags.owndata  # no copy was made in this process
    batch[0, :10] = 255  # the consumer owns it now
    assert batch[0, :10].tolist() == [255] * 10


def test_arrays_stay_valid_after_the_workers_are_gone() -> None:
    batches = list(DataLoader(BigItems(), batch_size=2, num_workers=2))
    assert [int(b[0, -1]) for b in batches] == [0, 2, 4, 6]
    assert [int(b[1].sum()) for b in batches] == [(2 * i + 1) * (1 << 20) for i in range(4)]


class MiB(aioload.Dataset):
    """Sample ``i`` is 1 MiB of uint32 that only sample ``i`` holds: ``i << 18`` onwards."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> np.ndarray:
        return MiB.expected(index)

    @staticmethod
    def expected(index: int) -> np.ndarray:
        return np.arange(index << 18, (index + 1) << 18, dtype=np.uint32)


@pytest.mark.parametrize("workers", [1, 2])
def test_segments_are_reused_across_batches(workers: int) -> None:
    # 64 batches of 1 MiB, each dropped once read (but every 16th, kept to the end): the
    # workers write them into a few recycled segments, not into a new one per batch, and a
    # segment still in use (a kept batch) is never written over.
    prefetch = 2
    loader = DataLoader(MiB(), batch_size=1, num_workers=workers, prefetch_factor=prefetch)
    inodes: set[int] = set()
    kept: dict[int, np.ndarray] = {}
    count = 0
    for index, batch in enumerate(loader):
        assert batch.shape == (1, 1 << 18)
        np.testing.assert_array_equal(batch[0], MiB.expected(index))
        inodes.add(segment_inode(batch))
        if index % 16 == 0:
            kept[index] = batch
        count += 1
    del batch
    assert count == 64
    for index, batch in kept.items():
        np.testing.assert_array_equal(batch[0], MiB.expected(index))
    # In flight per worker: `prefetch` batches, one more being read, and one the consumer
    # holds; plus the segments the kept batches hold. Without reuse: one segment per batch.
    bound = workers * (prefetch + 2) + len(kept) + 2
    assert len(inodes) <= bound, f"{len(inodes)} segments for 64 batches (at most {bound})"


# -- iterable datasets -------------------------------------------------------------


@pytest.mark.parametrize(
    ("num_workers", "expected"),
    [(0, [3, 4, 5, 6]), (2, [3, 5, 4, 6]), (12, [3, 4, 5, 6])],
)
def test_torch_documentation_sharding_examples(num_workers: int, expected: list[int]) -> None:
    by_info = DataLoader(RangeByWorkerInfo(3, 7), num_workers=num_workers)
    assert flat(list(by_info)) == expected
    by_init = DataLoader(PlainRange(3, 7), num_workers=num_workers, worker_init_fn=split_range)
    assert flat(list(by_init)) == expected


def test_each_worker_batches_its_own_stream_and_drops_its_own_last_batch() -> None:
    loader = DataLoader(RangeByWorkerInfo(0, 10), batch_size=3, num_workers=2)
    assert [b.tolist() for b in loader] == [[0, 1, 2], [5, 6, 7], [3, 4], [8, 9]]
    dropping = DataLoader(RangeByWorkerInfo(0, 10), batch_size=3, num_workers=2, drop_last=True)
    assert [b.tolist() for b in dropping] == [[0, 1, 2], [5, 6, 7]]


class BatchSizeSeen(aioload.IterableDataset):
    """Yields what get_worker_info() says of the batch size, once per worker."""

    def __iter__(self) -> Iterator[int]:
        info = aioload.get_worker_info()
        assert info is not None
        return iter([-1 if info.batch_size is None else info.batch_size])


def test_workers_know_the_batch_size_they_batch_their_stream_in() -> None:
    batched = DataLoader(BatchSizeSeen(), batch_size=5, num_workers=2)
    assert [b.tolist() for b in batched] == [[5], [5]]
    unbatched = DataLoader(BatchSizeSeen(), batch_size=None, num_workers=2)
    assert flat(list(unbatched)) == [-1, -1]


def test_async_iterable_streams_interleave_round_robin_until_each_is_exhausted() -> None:
    loader = DataLoader(AsyncShards([3, 1]), batch_size=None, num_workers=2)
    assert flat(list(loader)) == [0, 100, 1, 2]
    unordered = DataLoader(AsyncShards([3, 1]), batch_size=None, num_workers=2, in_order=False)
    assert sorted(flat(list(unordered))) == [0, 1, 2, 100]


# -- seeding and worker_init_fn ------------------------------------------------------


def test_worker_seeds_come_from_the_loader_generator() -> None:
    def draws(generator: int) -> list[tuple[int, float, float]]:
        loader = DataLoader(Draws(), batch_size=None, num_workers=2, generator=generator)
        return [(int(s), float(r), float(n)) for s, r, n in loader]

    first, again, other = draws(3), draws(3), draws(4)
    assert first == again  # batch i goes to worker i % num_workers, as in torch
    assert first != other
    seeds = sorted({seed for seed, _, _ in first})
    assert len(seeds) == 2 and seeds[1] == seeds[0] + 1  # base_seed + worker id
    base = seeds[0]
    for worker_id, seed in enumerate(seeds):
        mine = [(r, n) for s, r, n in first if s == seed]
        # numpy's global state is seeded as torch seeds it: from the base seed and the worker id.
        words = np.random.SeedSequence([worker_id, base & 0xFFFFFFFF, base >> 32]).generate_state(4)
        python, legacy = random.Random(seed), np.random.RandomState(words)
        assert mine == [(python.random(), float(legacy.rand())) for _ in mine]


def test_every_epoch_draws_a_new_base_seed() -> None:
    loader = DataLoader(Draws(), batch_size=None, num_workers=1, generator=5)
    assert {int(s[0]) for s in loader} != {int(s[0]) for s in loader}


def test_worker_init_fn_runs_in_each_worker_before_fetching() -> None:
    loader = DataLoader(InitAware(), batch_size=1, num_workers=2, worker_init_fn=record_init)
    assert set(flat(list(loader))) <= {0, 1}


def test_persistent_workers_keep_their_processes_and_dataset_copies() -> None:
    with DataLoader(Counter(), batch_size=2, num_workers=1, persistent_workers=True) as loader:
        first = [(int(p), int(r)) for batch in loader for p, r in zip(*batch, strict=True)]
        second = [(int(p), int(r)) for batch in loader for p, r in zip(*batch, strict=True)]
    assert {p for p, _ in first} == {p for p, _ in second}
    assert [r for _, r in second] == list(range(9, 17))  # the same copy kept counting


@pytest.mark.asyncio
async def test_persistent_workers_serve_async_epochs_after_a_break() -> None:
    loader = DataLoader(
        AsyncItems(32, delay=0.01), batch_size=4, num_workers=2, persistent_workers=True
    )
    try:
        async for _ in loader:
            break
        assert flat([b async for b in loader]) == list(range(32))
    finally:
        loader.close()


# -- errors ---------------------------------------------------------------------------


def test_a_dataset_that_cannot_be_pickled_fails_naming_the_culprit() -> None:
    with pytest.raises(TypeError, match=r"dataset\.handle\['lock'\] \(a _thread\.lock\)"):
        list(DataLoader(HoldsALock(), num_workers=1, multiprocessing_context="forkserver"))
    # fork does not pickle: the same dataset works there.
    assert flat(list(DataLoader(HoldsALock(), num_workers=1, multiprocessing_context="fork"))) == [
        0,
        1,
        2,
        3,
    ]


# -- crashes ---------------------------------------------------------------------------


def test_a_killed_worker_is_restarted_and_the_epoch_is_complete(tmp_path: Path) -> None:
    dataset = KillsItsWorker(120, victim=37, marker_dir=str(tmp_path))
    started = time.monotonic()
    got = flat(list(DataLoader(dataset, batch_size=4, num_workers=2)))
    assert got == list(range(120))  # every sample once, in order
    assert (tmp_path / "killed-0").exists()
    assert time.monotonic() - started < 10


def test_out_of_order_epochs_survive_a_crash_too(tmp_path: Path) -> None:
    dataset = KillsItsWorker(120, victim=90, marker_dir=str(tmp_path), times=2)
    got = flat(list(DataLoader(dataset, batch_size=4, num_workers=2, in_order=False)))
    assert sorted(got) == list(range(120))


def test_past_the_restart_limit_the_crash_is_reported(tmp_path: Path) -> None:
    dataset = KillsItsWorker(40, victim=10, marker_dir=str(tmp_path), times=2)
    loader = DataLoader(dataset, batch_size=4, num_workers=2, max_worker_restarts=1)
    with pytest.raises(
        WorkerCrashedError, match=r"^DataLoader worker \(pid \d+\) is killed by signal: Killed"
    ) as caught:
        list(loader)
    error = caught.value
    assert error.exitcode == -signal.SIGKILL
    assert [8, 9, 10, 11] in error.keys
    assert "max_worker_restarts=1" in str(error)


def test_a_crash_in_an_iterable_dataset_worker_is_reported(tmp_path: Path) -> None:
    with pytest.raises(WorkerCrashedError, match="cannot be resumed"):
        list(DataLoader(CrashingStream(str(tmp_path)), batch_size=2, num_workers=2))


class CrashingStream(aioload.IterableDataset):
    def __init__(self, marker_dir: str) -> None:
        self.marker_dir = marker_dir

    def __iter__(self) -> Iterator[int]:
        info = aioload.get_worker_info()
        for i in range(6):
            if info is not None and info.id == 1 and i == 3:
                os.kill(os.getpid(), signal.SIGKILL)
            yield i


def test_batches_from_workers_are_pinned_in_the_pin_thread() -> None:
    loader = DataLoader(Squares(8), batch_size=4, num_workers=2, pin_memory=True)
    batches = list(loader)
    assert flat([b["y"] for b in batches]) == [i * i for i in range(8)]
    assert all(b["x"].ctypes.data % mmap.PAGESIZE == 0 for b in batches)


class GrowingItems(aioload.Dataset):
    """Samples whose size grows with the key: each batch outgrows the last one's segment."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, index: int) -> dict[str, Any]:
        size = 1024 << index
        return {
            "a": np.full(size, index, dtype=np.uint8),
            "b": np.full(size // 2, index, dtype=np.uint16),
            "label": index,
        }


def stack_myself(samples: list[dict[str, Any]]) -> dict[str, Any]:
    return {key: np.stack([s[key] for s in samples]) for key in samples[0]}


@pytest.mark.parametrize("collate_fn", [None, stack_myself])
def test_batches_of_changing_sizes_and_layouts_arrive_intact(collate_fn: Any) -> None:
    # default_collate stacks into shared memory; a custom collate_fn's arrays are copied there.
    loader = DataLoader(GrowingItems(), batch_size=1, num_workers=1, collate_fn=collate_fn)
    for epoch in range(2):
        for index, batch in enumerate(loader):
            assert batch["a"].shape == (1, 1024 << index)
            assert batch["b"].dtype == np.uint16 and batch["b"].shape == (1, 512 << index)
            assert int(batch["a"].min()) == int(batch["a"].max()) == index
            assert int(batch["b"].min()) == int(batch["b"].max()) == index
            assert int(np.asarray(batch["label"]).ravel()[0]) == index, epoch


class DiesWhileOthersWait(aioload.Dataset):
    """Key 0 kills its worker at once; every other key waits far longer than the test runs."""

    def __len__(self) -> int:
        return 8

    async def __getitem__(self, index: int) -> int:
        if index == 0:
            os.kill(os.getpid(), signal.SIGKILL)
        await asyncio.sleep(60)
        return index


def test_a_dead_worker_is_noticed_at_once_not_after_a_timeout() -> None:
    loader = DataLoader(DiesWhileOthersWait(), batch_size=2, num_workers=2, max_worker_restarts=0)
    started = time.monotonic()
    with pytest.raises(WorkerCrashedError, match=r"It was worker 0, holding batches \[0"):
        list(loader)
    assert time.monotonic() - started < 10  # the other batches would wait 60 s


def test_a_script_whose_dataset_lives_in_a_sibling_module(tmp_path: Path) -> None:
    # The usual layout: train.py imports its dataset from a module next to it. Workers
    # (started by a fresh fork server in a fresh process) must find both.
    (tmp_path / "shapes.py").write_text(
        "import aioload\n"
        "class Shapes(aioload.Dataset):\n"
        "    def __len__(self): return 6\n"
        "    def __getitem__(self, i): return i * 2\n"
    )
    (tmp_path / "train.py").write_text(
        "from shapes import Shapes\n"
        "from aioload import DataLoader\n"
        "if __name__ == '__main__':\n"
        "    batches = DataLoader(Shapes(), batch_size=2, num_workers=2)\n"
        "    print([b.tolist() for b in batches])\n"
    )
    root = Path(__file__).resolve().parent.parent
    environment = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run(
        [sys.executable, str(tmp_path / "train.py")],
        capture_output=True,
        text=True,
        timeout=50,
        env=environment,
        cwd=root,  # not the script's folder: only sys.path[0] finds the sibling
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[[0, 2], [4, 6], [8, 10]]"
