"""``pin_memory=True``: same values, page-aligned numpy arrays, custom ``pin_memory()`` methods."""

from __future__ import annotations

import asyncio
import gc
import mmap
import sys
import threading
import weakref
from typing import Any

import numpy as np
import pytest

from aioload import DataLoader

# Locking may be refused here; the loader then warns and falls back, which is not under test.
pytestmark = pytest.mark.filterwarnings("ignore::aioload.memory.pinned.PinMemoryWarning")


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


@pytest.fixture
def no_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """As in a process that never imported torch."""
    monkeypatch.setitem(sys.modules, "torch", None)


@pytest.mark.usefixtures("no_torch")
def test_custom_pin_memory_method_is_called_in_the_pin_thread() -> None:
    loader = DataLoader(Rows(6), batch_size=2, pin_memory=True, collate_fn=Custom)
    batches = list(loader)
    assert [b.pinned_in for b in batches] == ["aioload-pin"] * 3
    assert [len(b.values) for b in batches] == [2, 2, 2]


@pytest.mark.usefixtures("no_torch")
def test_custom_pin_memory_under_async_for() -> None:
    async def main() -> list[Custom]:
        loader = DataLoader(Rows(6), batch_size=2, pin_memory=True, collate_fn=Custom)
        return [b async for b in loader]

    assert [b.pinned_in for b in asyncio.run(main())] == ["aioload-pin"] * 3


# -- with torch: what CUDA sees (no GPU here: torch's CUDA checks are stubbed) -------------


@pytest.fixture
def torch() -> Any:
    return pytest.importorskip("torch")


@pytest.mark.slow
def test_with_torch_and_no_accelerator_custom_batches_are_left_alone(
    torch: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # torch's loader turns pinning off without an accelerator, so a custom pin_memory() that
    # pins tensors (and would fail there) is never called.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.warns(UserWarning, match="no cuda accelerator"):
        batches = list(DataLoader(Rows(6), batch_size=2, pin_memory=True, collate_fn=Custom))
    assert [b.pinned_in for b in batches] == [None] * 3


class _FakePinnedMemory:
    """Stands in for CUDA: ``torch.empty(..., pin_memory=True)`` gives (and records) plain
    memory, and ``torch.cuda`` says a GPU is there, set up on device 3."""

    def __init__(self, torch: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        self.allocations: list[tuple[Any, str]] = []
        self.devices: list[tuple[int, str]] = []
        empty = torch.empty

        def pinned_empty(*args: Any, pin_memory: bool = False, **kwargs: Any) -> Any:
            tensor = empty(*args, **kwargs)
            if pin_memory:
                self.allocations.append((tensor, threading.current_thread().name))
            return tensor

        def set_device(index: int) -> None:
            self.devices.append((index, threading.current_thread().name))

        monkeypatch.setattr(torch, "empty", pinned_empty)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
        monkeypatch.setattr(torch.cuda, "set_device", set_device)

    def starts(self) -> set[int]:
        return {tensor.data_ptr() for tensor, _ in self.allocations}


@pytest.mark.slow
@pytest.mark.parametrize("num_workers", [0, 1])
@pytest.mark.parametrize("kind", ["array", "dict", "tuple"])
def test_with_cuda_numpy_batches_are_in_torchs_pinned_memory_and_stay_numpy(
    torch: Any, monkeypatch: pytest.MonkeyPatch, kind: str, num_workers: int
) -> None:
    plain = list(DataLoader(Rows(10, kind), batch_size=4))
    cuda = _FakePinnedMemory(torch, monkeypatch)
    pinned = list(
        DataLoader(Rows(10, kind), batch_size=4, pin_memory=True, num_workers=num_workers)
    )
    assert len(pinned) == len(plain)
    for p, q in zip(pinned, plain, strict=True):
        assert type(p) is type(q)
        for a, b in zip(arrays(p), arrays(q), strict=True):
            assert type(a) is np.ndarray and a.dtype == b.dtype
            np.testing.assert_array_equal(a, b)
            # What the user hands to .to("cuda", non_blocking=True) starts a pinned allocation,
            # which torch's host allocator finds by that address.
            assert torch.from_numpy(a).data_ptr() in cuda.starts()
    assert {thread for _, thread in cuda.allocations} == {"aioload-pin"}
    # The pin thread pins for the iterating thread's device, as torch's does.
    assert cuda.devices == [(3, "aioload-pin")]


@pytest.mark.slow
def test_torch_pinned_arrays_keep_their_memory_alive(
    torch: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    cuda = _FakePinnedMemory(torch, monkeypatch)
    batch = next(iter(DataLoader(Rows(4), batch_size=4, pin_memory=True)))
    view = batch[1:]
    owner: Any = view
    while not isinstance(owner, torch.Tensor):  # the array's bases lead to the pinned tensor
        owner = owner.base
    assert owner.data_ptr() in cuda.starts()
    memory = weakref.ref(owner)
    del batch, owner
    cuda.allocations.clear()
    gc.collect()
    assert memory() is not None  # a view of the array holds its pinned memory
    np.testing.assert_array_equal(view[0], np.arange(8, 16, dtype=np.float32))
    del view
    gc.collect()
    assert memory() is None  # and lets it go with the last view
