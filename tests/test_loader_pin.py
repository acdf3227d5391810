"""``pin_memory=True``: same values, page-aligned numpy arrays, custom ``pin_memory()`` methods."""

from __future__ import annotations

import asyncio
import mmap
import threading
from typing import Any

import numpy as np
import pytest

from aioload import DataLoader

# Locking may be refused here; the loader then warns and falls back, which is not under test.
pytestmark = pytest.mark.filterwarnings("ignore::aioload.pinning.PinMemoryWarning")


class Rows:
    def __init__(self, n: int, kind: str = "array") -> None:
        self.n = n
        self.kind = kind

    def __getitem__(self, i: int) -> Any:
        x = np.arange(i * 8, i * 8 + 8, dtype=np.float32)
        if self.kind == "dict":
            return {"x": x, "y": np.int64(i)}
        if self.kind == "tuple":
            return (x, np.int64(i))
        return x

    def __len__(self) -> int:
        return self.n


def arrays(batch: Any) -> list[np.ndarray]:
    if isinstance(batch, dict):
        return [a for v in batch.values() for a in arrays(v)]
    if isinstance(batch, (list, tuple)):
        return [a for v in batch for a in arrays(v)]
    return [batch]


def assert_same(pinned: list[Any], plain: list[Any]) -> None:
    assert len(pinned) == len(plain)
    for p, q in zip(pinned, plain, strict=True):
        assert type(p) is type(q)
        for a, b in zip(arrays(p), arrays(q), strict=True):
            np.testing.assert_array_equal(a, b)
            assert a.dtype == b.dtype
            assert a.ctypes.data % mmap.PAGESIZE == 0


@pytest.mark.parametrize("kind", ["array", "dict", "tuple"])
def test_for_pinned_equals_unpinned_and_is_page_aligned(kind: str) -> None:
    plain = list(DataLoader(Rows(23, kind), batch_size=4))
    pinned = list(DataLoader(Rows(23, kind), batch_size=4, pin_memory=True))
    assert_same(pinned, plain)


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", ["array", "dict", "tuple"])
async def test_async_for_pinned_equals_unpinned(kind: str) -> None:
    plain = [b async for b in DataLoader(Rows(23, kind), batch_size=4)]
    pinned = [b async for b in DataLoader(Rows(23, kind), batch_size=4, pin_memory=True)]
    assert_same(pinned, plain)


def test_pinned_out_of_order_has_every_sample_once() -> None:
    loader = DataLoader(Rows(40), batch_size=3, pin_memory=True, in_order=False)
    batches = list(loader)
    for b in batches:
        assert b.ctypes.data % mmap.PAGESIZE == 0
    firsts = sorted(int(v) for b in batches for v in b[:, 0])
    assert firsts == [i * 8 for i in range(40)]


class Custom:
    def __init__(self, values: list[Any]) -> None:
        self.values = values
        self.pinned_in: str | None = None

    def pin_memory(self) -> Custom:
        out = Custom(self.values)
        out.pinned_in = threading.current_thread().name
        return out


def test_custom_pin_memory_method_is_called_in_the_pin_thread() -> None:
    loader = DataLoader(Rows(6), batch_size=2, pin_memory=True, collate_fn=Custom)
    batches = list(loader)
    assert [b.pinned_in for b in batches] == ["aioload-pin"] * 3
    assert [len(b.values) for b in batches] == [2, 2, 2]


def test_custom_pin_memory_under_async_for() -> None:
    async def main() -> list[Custom]:
        loader = DataLoader(Rows(6), batch_size=2, pin_memory=True, collate_fn=Custom)
        return [b async for b in loader]

    assert [b.pinned_in for b in asyncio.run(main())] == ["aioload-pin"] * 3
