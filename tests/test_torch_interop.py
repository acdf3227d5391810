"""Torch interop: tensors from numpy batches without a copy, pinned through the pin stage."""

from __future__ import annotations

import subprocess
import sys
import threading
import warnings
from collections import OrderedDict
from typing import Any, NamedTuple

import numpy as np
import pytest

import aioload
import aioload.memory.pinned
from aioload import ArrayDataset, DataLoader
from aioload.interop import to_torch, torch_collate, torch_convert

pytestmark = pytest.mark.slow


@pytest.fixture
def torch() -> Any:
    return pytest.importorskip("torch")


class Point(NamedTuple):
    xy: Any
    name: Any


class Samples(aioload.Dataset):
    """Sample ``i``: a dict of a float32[3] image filled with ``i`` and the int label ``i``."""

    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"image": np.full(3, i, np.float32), "label": i}


# -- to_torch -------------------------------------------------------------------------


def test_arrays_become_tensors_that_share_their_memory(torch: Any) -> None:
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    tensor = to_torch(array)
    assert isinstance(tensor, torch.Tensor) and tensor.dtype == torch.float32
    assert tensor.data_ptr() == array.ctypes.data
    array[0, 0] = 42
    assert tensor[0, 0].item() == 42


def test_structure_is_kept_and_non_arrays_are_left_alone(torch: Any) -> None:
    batch = {
        "x": np.zeros((2, 2)),
        "point": Point(np.ones(2, np.int64), ["a", "b"]),
        "pair": (np.arange(2), 3),
        "ordered": OrderedDict(z=np.arange(1)),
        "names": np.array(["a", "b"]),
        "text": "hello",
        "scalar": np.float32(1.5),
    }
    out = to_torch(batch)
    assert isinstance(out["x"], torch.Tensor)
    assert isinstance(out["point"], Point) and isinstance(out["point"].xy, torch.Tensor)
    assert out["point"].name == ["a", "b"]
    assert isinstance(out["pair"], tuple) and isinstance(out["pair"][0], torch.Tensor)
    assert out["pair"][1] == 3
    assert isinstance(out["ordered"], OrderedDict) and isinstance(out["ordered"]["z"], torch.Tensor)
    assert isinstance(out["names"], np.ndarray)  # torch has no string tensors
    assert out["text"] == "hello"
    assert out["scalar"].dim() == 0 and out["scalar"].item() == 1.5


def test_read_only_arrays_are_copied_or_shared_on_request(torch: Any) -> None:
    array = np.frombuffer(bytes(range(8)), dtype=np.uint8)
    assert not array.flags.writeable
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # neither way warns
        copied = to_torch(array)
        shared = to_torch(array, readonly="share")
    assert copied.data_ptr() != array.ctypes.data
    copied[0] = 99  # a copy may be written
    assert array[0] == 0
    assert shared.data_ptr() == array.ctypes.data
    assert shared.tolist() == list(range(8))
    with pytest.raises(ValueError, match="'copy' or 'share'"):
        to_torch(array, readonly="yes")  # type: ignore[arg-type]


def test_arrays_torch_cannot_view_are_copied_once(torch: Any) -> None:
    reversed_ = np.arange(5)[::-1]
    assert to_torch(reversed_).tolist() == [4, 3, 2, 1, 0]
    swapped = np.arange(3, dtype=">i4")
    assert to_torch(swapped).tolist() == [0, 1, 2]
    strided = np.arange(10)[::2]  # positive strides: still a view
    assert to_torch(strided).data_ptr() == strided.ctypes.data


def test_without_torch_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ImportError, match=r"pip install torch "):
        to_torch(np.zeros(2))


def test_importing_aioload_does_not_import_torch() -> None:
    code = "import sys, aioload, aioload.interop; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# -- loaders ----------------------------------------------------------------------------


def test_torch_collate_makes_a_loader_yield_tensors(torch: Any) -> None:
    loader = DataLoader(Samples(), batch_size=4, collate_fn=torch_collate)
    batches = list(loader)
    assert [b["label"].tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert all(isinstance(b["image"], torch.Tensor) for b in batches)
    assert batches[0]["image"].shape == (4, 3)
    # the stats count tensors' bytes like arrays'
    assert loader.stats().epoch.bytes == 10 * (12 + 8)


@pytest.mark.asyncio
async def test_torch_collate_with_async_for_out_of_order(torch: Any) -> None:
    loader = DataLoader(Samples(), batch_size=3, collate_fn=torch_collate, in_order=False)
    labels = sorted([int(i) async for b in loader for i in b["label"]])
    assert labels == list(range(10))


def test_torch_convert_without_automatic_batching(torch: Any) -> None:
    loader = DataLoader(Samples(), batch_size=None, collate_fn=torch_convert)
    first = next(iter(loader))
    assert isinstance(first["image"], torch.Tensor) and first["label"] == 0


def test_with_workers_convert_in_the_consumer_without_a_copy(torch: Any) -> None:
    loader = DataLoader(ArrayDataset(np.arange(24.0).reshape(12, 2)), batch_size=4, num_workers=1)
    for (x,) in loader:
        tensor = to_torch(x)  # x is a view of the shared memory it arrived in
        assert tensor.data_ptr() == x.ctypes.data and x.flags.writeable
        assert tensor.shape == (4, 2)


def test_torch_collate_in_workers_works_too(torch: Any) -> None:
    loader = DataLoader(Samples(), batch_size=5, collate_fn=torch_collate, num_workers=1)
    labels = [b["label"] for b in loader]
    assert all(isinstance(t, torch.Tensor) for t in labels)
    assert torch.cat(labels).tolist() == list(range(10))


# -- pinning ----------------------------------------------------------------------------


def test_pin_memory_with_tensors_without_an_accelerator(torch: Any) -> None:
    loader = DataLoader(Samples(), batch_size=5, collate_fn=torch_collate, pin_memory=True)
    if torch.cuda.is_available():  # pragma: no cover - no GPU in CI
        assert all(b["image"].is_pinned() for b in loader)
        return
    # As torch's DataLoader: a warning, and the tensors as they are.
    aioload.memory.pinned._warn_unpinned_tensors.cache_clear()  # it warns once per process
    with pytest.warns(UserWarning, match="no cuda accelerator"):
        batches = list(loader)
    assert [b["label"].tolist() for b in batches] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    assert not batches[0]["image"].is_pinned()


def test_the_pin_thread_pins_tensors_when_an_accelerator_is_present(
    torch: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[str] = []

    def pin_memory(self: Any, *device: Any) -> Any:
        threads.append(threading.current_thread().name)
        return self.clone()

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.Tensor, "pin_memory", pin_memory)
    loader = DataLoader(Samples(), batch_size=5, collate_fn=torch_collate, pin_memory=True)
    batches = list(loader)
    assert [b["label"].tolist() for b in batches] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    assert threads == ["aioload-pin"] * 4  # image and label of each batch, in the pin thread
