"""The default window on the loop holds about 256 MiB of batches, whatever their size.

At batch size 4 an async dataset's default window is 128 batches; with 8 MiB items that
would be 4 GiB in flight. The epoch starts with 4 batches, measures them, and sizes the
window to the budget (never below 2, never above the window it was given).
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from aioload import DataLoader, Dataset
from aioload.settings import DEFAULT_WINDOW_BYTES


class BigItems(Dataset[np.ndarray]):
    """Async items of ``nbytes`` bytes; counts how many are alive at once (in flight)."""

    def __init__(self, n: int, nbytes: int, delay: float = 0.001) -> None:
        self.n, self.nbytes, self.delay = n, nbytes, delay
        self.in_flight = 0
        self.most_in_flight = 0

    def __len__(self) -> int:
        return self.n

    async def __getitem__(self, key: int) -> np.ndarray:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        await asyncio.sleep(self.delay)
        self.in_flight -= 1
        return np.zeros(self.nbytes, dtype=np.uint8)


@pytest.mark.asyncio
async def test_big_batches_shrink_the_default_window_to_the_budget() -> None:
    item = 8 << 20
    dataset = BigItems(400, item)
    loader = DataLoader(dataset, batch_size=4)
    assert loader.window == 128  # what concurrency alone would ask for
    allowed = DEFAULT_WINDOW_BYTES // (4 * item)  # 8 batches of 32 MiB
    batches = 0
    async for _ in loader:
        batches += 1
        await asyncio.sleep(0.002)  # a consumer slower than the reads: the window fills up
    assert batches == 100
    # Items in flight never exceeded the budget's batches (4 to start with, 8 after).
    assert dataset.most_in_flight <= allowed * 4
    assert loader.stats().epoch.items == 400


@pytest.mark.asyncio
async def test_small_batches_open_the_window_fully() -> None:
    dataset = BigItems(2000, 16, delay=0.02)  # slow enough for the window to fill
    loader: DataLoader[Any] = DataLoader(dataset, batch_size=4, concurrency=256)
    count = 0
    async for _ in loader:
        count += 1
    assert count == 500
    # 128 batches of 4 items could be in flight: far more than the 16 items of the start.
    assert dataset.most_in_flight > 4 * 4


def test_an_explicit_prefetch_factor_is_not_sized_down() -> None:
    # Items slow enough that all 16 batches are submitted before the first one is done.
    dataset = BigItems(64, 8 << 20, delay=0.2)
    loader = DataLoader(dataset, batch_size=4, prefetch_factor=16)
    assert sum(1 for _ in loader) == 16
    assert dataset.most_in_flight > 4 * 4  # the first read starts all 16 batches at once


def test_a_release_after_the_loop_closed_is_a_no_op() -> None:
    # The consumer's thread may hand back a slot after the epoch's loop ended (the epoch
    # failed while the batch before it was still being taken out): nothing to wake.
    from aioload.pipeline.scheduler import Window

    loop = asyncio.new_event_loop()
    window = Window(1, loop)

    async def wait_for_a_slot() -> None:
        await window.acquire()  # takes the only slot
        waiting = asyncio.ensure_future(window.acquire())  # waits for a slot
        await asyncio.sleep(0)
        waiting.cancel()

    loop.run_until_complete(wait_for_a_slot())
    loop.close()
    window.release_threadsafe()  # the waiter's loop is closed: no RuntimeError
