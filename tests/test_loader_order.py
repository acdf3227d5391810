"""Reordering: in_order yields by sequence number, in_order=False as batches finish."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from aioload import DataLoader


class OneSlowKey:
    """Key 0 takes `delay` seconds, every other key is instant."""

    def __init__(self, n: int, delay: float, sync: bool = False) -> None:
        self.n, self.delay, self.sync = n, delay, sync

    async def __getitem__(self, i: int) -> int:
        if i == 0:
            await asyncio.sleep(self.delay)
        return i

    def __len__(self) -> int:
        return self.n


class OneSlowKeySync:
    thread_safe = True

    def __init__(self, n: int, delay: float) -> None:
        self.n, self.delay = n, delay

    def __getitem__(self, i: int) -> int:
        if i == 0:
            time.sleep(self.delay)
        return i

    def __len__(self) -> int:
        return self.n


def first_keys(batches: list[np.ndarray]) -> list[int]:
    return [int(b[0]) for b in batches]


@pytest.mark.parametrize("style", ["for", "async for"])
def test_out_of_order_yields_fast_batches_first(style: str) -> None:
    loader = DataLoader(OneSlowKey(40, 1.0), batch_size=4, in_order=False, prefetch_factor=10)
    batches = _run(loader, style)
    assert first_keys(batches)[-1] == 0  # the slow batch came last
    assert sorted(int(x) for b in batches for x in b) == list(range(40))


@pytest.mark.parametrize("style", ["for", "async for"])
def test_in_order_yields_batch_zero_first(style: str) -> None:
    loader = DataLoader(OneSlowKey(40, 1.0), batch_size=4, in_order=True, prefetch_factor=10)
    batches = _run(loader, style)
    assert first_keys(batches) == list(range(0, 40, 4))
    assert [int(x) for b in batches for x in b] == list(range(40))


def test_out_of_order_with_a_thread_safe_sync_dataset() -> None:
    async def main() -> list[np.ndarray]:
        loader = DataLoader(OneSlowKeySync(24, 0.5), batch_size=4, in_order=False)
        return [b async for b in loader]

    batches = asyncio.run(main())
    assert first_keys(batches)[-1] == 0
    assert sorted(int(x) for b in batches for x in b) == list(range(24))


def _run(loader: DataLoader, style: str) -> list[np.ndarray]:
    if style == "for":
        return list(loader)

    async def main() -> list[np.ndarray]:
        return [b async for b in loader]

    return asyncio.run(main())
