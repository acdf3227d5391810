"""A sync dataset never blocks the consumer's loop; the sync facade overlaps fetch and compute."""

from __future__ import annotations

import asyncio
import time

import pytest

from aioload import DataLoader


class Sleepy:
    def __init__(self, n: int, delay: float) -> None:
        self.n = n
        self.delay = delay

    def __getitem__(self, i: int) -> int:
        time.sleep(self.delay)
        return i

    def __len__(self) -> int:
        return self.n


@pytest.mark.asyncio
async def test_sync_dataset_does_not_block_the_consumers_loop() -> None:
    worst = 0.0
    done = False

    async def ticker() -> None:
        nonlocal worst
        while not done:
            start = time.monotonic()
            await asyncio.sleep(0.005)
            worst = max(worst, time.monotonic() - start - 0.005)

    task = asyncio.create_task(ticker())
    got = [int(b[0]) async for b in DataLoader(Sleepy(10, 0.05), batch_size=1)]
    done = True
    await task
    assert got == list(range(10))
    assert worst < 0.025, f"the loop was blocked for {worst * 1000:.1f} ms"


def test_sync_facade_overlaps_fetching_with_the_consumer() -> None:
    n, delay = 15, 0.02
    start = time.monotonic()
    for _ in DataLoader(Sleepy(n, delay), batch_size=1):
        time.sleep(delay)
    elapsed = time.monotonic() - start
    serial = 2 * n * delay
    assert 0.4 * serial < elapsed < 0.8 * serial, f"{elapsed:.3f} s against {serial:.3f} s serial"
