"""A sync dataset never blocks the consumer's loop; the sync facade overlaps fetch and compute."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable
from typing import Any

import pytest

from aioload import DataLoader

TICK = 0.005  # the probe's sleep: it measures how late each wake-up is
# How much the loop's lag may grow over an idle loop's, measured just before in the same test:
# a busy machine delays both alike, while a blocking call on the loop (the 50 ms read of an item
# below, or any 200 ms call) adds its whole duration.
TYPICAL_GROWTH = 0.015  # of the 90th percentile of the lags
WORST_GROWTH = 0.1  # of the longest lag


class Sleepy:
    def __init__(self, n: int, delay: float) -> None:
        self.n = n
        self.delay = delay

    def __getitem__(self, i: int) -> int:
        time.sleep(self.delay)
        return i

    def __len__(self) -> int:
        return self.n


class BlocksTheLoop(Sleepy):
    """An async dataset that wrongly sleeps synchronously: every item blocks the loop."""

    async def __getitem__(self, i: int) -> int:  # type: ignore[override]
        time.sleep(self.delay)
        return i


async def lags_during(work: Awaitable[Any]) -> tuple[Any, list[float]]:
    """Awaits ``work`` while sampling how late the loop wakes a ``TICK`` sleeper."""
    lags: list[float] = []
    done = False

    async def probe() -> None:
        while not done:
            start = time.monotonic()
            await asyncio.sleep(TICK)
            lags.append(time.monotonic() - start - TICK)

    task = asyncio.create_task(probe())
    try:
        result = await work
    finally:
        done = True
        await task
    return result, lags


def p90(lags: list[float]) -> float:
    return statistics.quantiles(lags, n=10, method="inclusive")[-1]


def assert_not_blocked(idle: list[float], busy: list[float]) -> None:
    """``busy``'s lags are an idle loop's, up to what a loaded machine adds to both."""
    assert len(idle) >= 10 and len(busy) >= 2, (len(idle), len(busy))
    typical, idle_typical = p90(busy), p90(idle)
    assert typical < idle_typical + TYPICAL_GROWTH, (
        f"the loop woke {typical * 1000:.1f} ms late (90th percentile), "
        f"against {idle_typical * 1000:.1f} ms when idle"
    )
    worst, idle_worst = max(busy), max(idle)
    assert worst < idle_worst + WORST_GROWTH, (
        f"the loop was blocked for {worst * 1000:.1f} ms, against {idle_worst * 1000:.1f} ms "
        "at worst when idle"
    )


async def load(dataset: Any, **kwargs: Any) -> list[int]:
    return [int(b[0]) async for b in DataLoader(dataset, batch_size=1, **kwargs)]


async def idle_lags() -> list[float]:
    _, lags = await lags_during(asyncio.sleep(0.3))
    return lags


@pytest.mark.asyncio
async def test_sync_dataset_does_not_block_the_consumers_loop() -> None:
    idle = await idle_lags()
    got, lags = await lags_during(load(Sleepy(10, 0.05)))
    assert got == list(range(10))
    assert_not_blocked(idle, lags)


@pytest.mark.asyncio
async def test_the_check_fails_when_items_are_read_on_the_loop() -> None:
    idle = await idle_lags()
    got, lags = await lags_during(load(BlocksTheLoop(10, 0.05)))
    assert got == list(range(10))
    with pytest.raises(AssertionError):
        assert_not_blocked(idle, lags)


@pytest.mark.asyncio
async def test_the_check_fails_when_one_call_blocks_the_loop() -> None:
    async def load_then_block() -> list[int]:
        got = []
        async for batch in DataLoader(Sleepy(10, 0.05), batch_size=1):
            got.append(int(batch[0]))
            if len(got) == 5:
                time.sleep(0.2)
        return got

    idle = await idle_lags()
    _, lags = await lags_during(load_then_block())
    with pytest.raises(AssertionError):
        assert_not_blocked(idle, lags)


def test_sync_facade_overlaps_fetching_with_the_consumer() -> None:
    n, delay = 15, 0.02
    dataset = Sleepy(n, delay)
    # The same reads and the same work one after the other, on this machine as loaded now.
    start = time.monotonic()
    for i in range(n):
        dataset[i]
        time.sleep(delay)
    serial = time.monotonic() - start
    start = time.monotonic()
    for _ in DataLoader(dataset, batch_size=1):
        time.sleep(delay)
    elapsed = time.monotonic() - start
    # Full overlap hides every read (n * delay); ask for a third of that.
    assert n * delay <= elapsed < serial - n * delay / 3, (
        f"{elapsed:.3f} s against {serial:.3f} s serial"
    )
