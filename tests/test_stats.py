"""loader.stats(): what was yielded, how long the consumer waited, what is in flight, faults."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest

import aioload
from aioload import ArrayDataset, DataLoader, RetryPolicy
from aioload.stats.recorder import LoaderStats, measure_batch

# -- datasets (top level: worker processes pickle them) -------------------------


class Rows(aioload.Dataset):
    """Row ``i`` is float32[4] filled with ``i``, with the int label ``i``."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        return np.full(4, i, np.float32), i


class SlowAsync(aioload.Dataset):
    """Every item waits ``delay`` seconds."""

    def __init__(self, n: int, delay: float) -> None:
        self.n, self.delay = n, delay

    def __len__(self) -> int:
        return self.n

    async def __getitem__(self, i: int) -> int:
        await asyncio.sleep(self.delay)
        return i


class Gated(aioload.Dataset):
    """Keys at or past ``gate_from`` wait until ``gate`` opens."""

    def __init__(self, n: int, gate_from: int, until: int | None = None) -> None:
        self.n, self.gate_from, self.until = n, gate_from, until
        self.gate = asyncio.Event()

    def __len__(self) -> int:
        return self.n

    async def __getitem__(self, i: int) -> int:
        if i >= self.gate_from and (self.until is None or i < self.until):
            await self.gate.wait()
        return i


class FailsFirst(aioload.Dataset):
    """Keys in ``flaky`` fail their first attempt (per copy) with ConnectionResetError;
    keys in ``broken`` always fail with KeyError."""

    def __init__(self, n: int, flaky: set[int], broken: set[int] = frozenset()) -> None:  # type: ignore[assignment]
        self.n, self.flaky, self.broken = n, flaky, broken
        self.seen: set[int] = set()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if i in self.broken:
            raise KeyError(i)
        if i in self.flaky and i not in self.seen:
            self.seen.add(i)
            raise ConnectionResetError(f"first read of {i}")
        return i


class KillsOnce(aioload.Dataset):
    """Key ``victim`` SIGKILLs the worker reading it, the first time only."""

    def __init__(self, n: int, victim: int, marker_dir: str) -> None:
        self.n, self.victim, self.marker_dir = n, victim, marker_dir

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        marker = Path(self.marker_dir, "killed")
        if i == self.victim and not marker.exists():
            marker.touch()
            os.kill(os.getpid(), signal.SIGKILL)
        return i


class Pair(NamedTuple):
    x: Any
    meta: Any


# -- counts -----------------------------------------------------------------------


@pytest.mark.parametrize("num_workers", [0, 2])
def test_sync_iteration_counts_batches_items_and_bytes(num_workers: int) -> None:
    loader = DataLoader(Rows(50), batch_size=8, num_workers=num_workers)
    assert sum(1 for _ in loader) == 7
    stats = loader.stats()
    assert isinstance(stats, LoaderStats)
    assert stats.epochs == 1 and not stats.iterating
    assert (stats.epoch.batches, stats.epoch.items) == (7, 50)
    # float32[4] rows and int64 labels: 16 + 8 bytes per item
    assert stats.epoch.bytes == 50 * (16 + 8)
    assert stats.total == stats.epoch
    assert stats.fetch_samples == 7 and stats.fetch_p50 is not None
    assert 0 < stats.fetch_p50 <= stats.fetch_p90 <= stats.fetch_p99  # type: ignore[operator]
    assert (stats.batches_in_flight, stats.items_in_flight, stats.reorder_buffer) == (0, 0, 0)
    assert stats.epoch.seconds > 0 and 0 <= stats.epoch.stall <= stats.epoch.seconds
    assert stats.epoch.items_per_s == pytest.approx(50 / stats.epoch.seconds)


@pytest.mark.asyncio
@pytest.mark.parametrize("in_order", [True, False])
async def test_async_iteration_counts_the_same(in_order: bool) -> None:
    loader = DataLoader(SlowAsync(30, 0.001), batch_size=4, in_order=in_order)
    async for _ in loader:
        pass
    stats = loader.stats()
    assert (stats.epoch.batches, stats.epoch.items, stats.epoch.bytes) == (8, 30, 30 * 8)
    assert not stats.iterating and stats.fetch_samples == 8


def test_before_any_iteration_everything_is_zero() -> None:
    stats = DataLoader(Rows(4)).stats()
    assert stats.epochs == 0 and not stats.iterating
    assert stats.epoch.batches == stats.total.items == 0
    assert stats.fetch_p50 is None and stats.fetch_samples == 0
    assert stats.epoch.stall_fraction == 0.0 and stats.epoch.items_per_s == 0.0
    assert "fetch -" in str(stats)


def test_totals_add_up_the_epochs_and_epoch_is_the_latest() -> None:
    loader = DataLoader(Rows(20), batch_size=5)
    for _ in range(3):
        list(loader)
    stats = loader.stats()
    assert stats.epochs == 3
    assert (stats.epoch.batches, stats.total.batches) == (4, 12)
    assert (stats.epoch.items, stats.total.items) == (20, 60)
    assert stats.total.seconds >= stats.epoch.seconds


def test_items_without_automatic_batching_and_for_iterable_datasets() -> None:
    loader = DataLoader(Rows(6), batch_size=None)
    list(loader)
    assert (loader.stats().epoch.batches, loader.stats().epoch.items) == (6, 6)

    class Stream(aioload.IterableDataset):
        def __iter__(self) -> Any:
            return iter(range(11))

    loader = DataLoader(Stream(), batch_size=4)
    list(loader)
    assert (loader.stats().epoch.batches, loader.stats().epoch.items) == (3, 11)


def test_bytes_walk_nested_batches() -> None:
    x = np.zeros((4, 3), np.float32)
    batch = {"image": x, "meta": Pair(np.arange(4), ["a", "b"]), "n": 3}
    assert measure_batch(batch) == (48 + 32, 4)
    # a list of 64 uncollated samples counts as its first sample times 64
    samples = [(np.zeros(16, np.float32), 0)] * 64
    assert measure_batch(samples) == (64 * 64, 64)
    assert measure_batch(7) == (0, -1)


@pytest.mark.parametrize(
    "batch",
    [
        {"a": np.zeros((5, 2)), "b": np.arange(5, dtype=np.int8)},
        {"scalar": np.float64(1.0), "a": np.zeros(3)},
        {"zero-d": np.array(2.0), "a": np.zeros((7, 1), np.float32)},
        {"a": np.zeros(3), "rows": [1, 2]},
        {f"c{i}": np.zeros(i + 1) for i in range(300)},  # wider than the walk's budget
        {},
    ],
)
def test_a_dict_of_arrays_measures_as_the_general_walk(batch: dict[str, Any]) -> None:
    """The one-pass path of default_collate's dicts gives what the two walks give."""
    from aioload.stats.measure import _walk, batch_nbytes

    assert measure_batch(batch) == (batch_nbytes(batch), _walk(batch)[1])


def test_break_ends_the_iteration_in_the_stats() -> None:
    loader = DataLoader(Rows(100), batch_size=2)
    for i, _ in enumerate(loader):
        if i == 2:
            assert loader.stats().iterating
            break
    stats = loader.stats()
    assert not stats.iterating and stats.epoch.batches == 3
    seconds = stats.epoch.seconds
    time.sleep(0.01)
    assert loader.stats().epoch.seconds == seconds  # the clock stopped at the end


def test_summary_and_dict() -> None:
    loader = DataLoader(Rows(10), batch_size=5)
    list(loader)
    stats = loader.stats()
    line = str(stats)
    assert "\n" not in line
    for words in ("2 batches", "10 items", "stall", "fetch p50/p90/p99", "in flight", "retries"):
        assert words in line
    plain = json.loads(json.dumps(stats.as_dict()))
    assert plain["epoch"]["items"] == 10 and "stall_fraction" in plain["total"]
    assert plain["fetch_samples"] == 2


# -- stall ------------------------------------------------------------------------


def test_a_slow_dataset_stalls_the_consumer() -> None:
    loader = DataLoader(SlowAsync(6, 0.02), batch_size=1, concurrency=1)
    list(loader)
    epoch = loader.stats().epoch
    assert epoch.stall_fraction > 0.5
    assert epoch.stall >= 5 * 0.02 * 0.9
    assert loader.stats().fetch_p50 >= 0.02 * 0.9  # type: ignore[operator]


@pytest.mark.asyncio
async def test_a_slow_dataset_stalls_an_async_consumer() -> None:
    loader = DataLoader(SlowAsync(6, 0.02), batch_size=1, concurrency=1)
    async for _ in loader:
        pass
    assert loader.stats().epoch.stall_fraction > 0.5


def test_a_slow_consumer_is_not_stalled() -> None:
    loader = DataLoader(Rows(64), batch_size=8)
    for _ in loader:
        time.sleep(0.02)  # the training step; the loader prefetches meanwhile
    epoch = loader.stats().epoch
    assert epoch.stall_fraction < 0.5
    assert epoch.stall < epoch.seconds - 8 * 0.02 * 0.9


# -- gauges -----------------------------------------------------------------------


async def _until(condition: Any, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.002)
    return True


@pytest.mark.asyncio
async def test_in_flight_figures_while_fetches_wait() -> None:
    dataset = Gated(40, gate_from=4)
    loader = DataLoader(dataset, batch_size=4, prefetch_factor=3)
    iterator = aiter(loader)
    await anext(iterator)
    # batch 0 went out; batches 1-3 hold the window's three slots, all waiting on the gate
    assert await _until(lambda: loader.stats().batches_in_flight == 3)
    stats = loader.stats()
    assert stats.iterating and stats.items_in_flight == 12 and stats.reorder_buffer == 0
    dataset.gate.set()
    rest = [batch async for batch in iterator]
    assert len(rest) == 9
    assert loader.stats().batches_in_flight == 0


@pytest.mark.asyncio
async def test_reorder_buffer_and_ready_batches() -> None:
    dataset = Gated(16, gate_from=4, until=8)  # only batch 1 waits
    loader = DataLoader(dataset, batch_size=4, prefetch_factor=4)
    iterator = aiter(loader)
    await anext(iterator)  # batch 0
    # batches 2 and 3 are done but must wait for batch 1 (in order)
    assert await _until(lambda: loader.stats().reorder_buffer == 2)
    assert loader.stats().batches_in_flight == 1
    dataset.gate.set()
    assert await _until(lambda: loader.stats().ready == 3)  # 1, 2 and 3 wait for the consumer
    rest = [batch.tolist() async for batch in iterator]
    assert rest[0] == [4, 5, 6, 7] and len(rest) == 3


# -- faults -----------------------------------------------------------------------


@pytest.mark.parametrize("num_workers", [0, 1])
def test_retries_and_skips_are_counted(num_workers: int) -> None:
    loader = DataLoader(
        FailsFirst(12, flaky={1, 5, 9}, broken={7}),
        batch_size=4,
        num_workers=num_workers,
        retry=RetryPolicy(attempts=2, backoff=0.0),
        on_error="skip",
    )
    assert sum(len(batch) for batch in loader) == 11
    epoch = loader.stats().epoch
    assert (epoch.retries, epoch.skipped, epoch.items) == (3, 1, 11)


def test_a_worker_restart_is_counted(tmp_path: Path) -> None:
    loader = DataLoader(
        KillsOnce(24, victim=13, marker_dir=str(tmp_path)), batch_size=4, num_workers=2
    )
    assert sorted(int(i) for batch in loader for i in batch) == list(range(24))
    assert loader.stats().epoch.worker_restarts == 1


# -- pinning keeps the counts -------------------------------------------------------


def test_pinned_batches_are_counted() -> None:
    loader = DataLoader(ArrayDataset(np.arange(12.0)), batch_size=4, pin_memory=True)
    list(loader)
    epoch = loader.stats().epoch
    assert (epoch.batches, epoch.items, epoch.bytes) == (3, 12, 96)
