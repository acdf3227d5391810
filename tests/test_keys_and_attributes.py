"""One key or many, a generic DataLoader, and attributes that cannot go stale.

- With automatic batching every element of the batch sampler is a sequence of keys, whatever
  its type (a tuple, a numpy array); without it every element of the sampler is one key,
  whatever its type (a list is one key then), as in torch — on every backend.
- ``DataLoader[T]`` is subscriptable, as torch's is.
- What sized the window (``num_workers``, ``prefetch_factor``, ``concurrency``) cannot be
  assigned after construction: the window would silently stay what it was.
"""

from __future__ import annotations

import concurrent.futures
import typing
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import aioload
from aioload import DataLoader, Sampler

BACKENDS = {
    "inline": {},
    "workers": {"num_workers": 2},
    "threads": {"executor": "threads"},
}


class Echo(aioload.Dataset[Any]):
    """Returns the key it was given: tuples and lists as keys are visible as such."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, key: Any) -> Any:
        return {"key": np.asarray(key), "kind": type(key).__name__}


class TupleBatches(Sampler[tuple[int, ...]]):
    def __iter__(self) -> Iterator[tuple[int, ...]]:
        return iter([(0, 1, 2), (3, 4), (5, 6, 7)])

    def __len__(self) -> int:
        return 3


class ArrayBatches(Sampler[np.ndarray]):
    def __iter__(self) -> Iterator[np.ndarray]:
        return iter([np.array([1, 0]), np.array([7])])

    def __len__(self) -> int:
        return 2


class ListKeys(Sampler[list[int]]):
    """Each key is itself a list (a composite key), not a batch."""

    def __iter__(self) -> Iterator[list[int]]:
        return iter([[0, 1], [2, 3]])

    def __len__(self) -> int:
        return 2


def options(name: str, pool: concurrent.futures.ThreadPoolExecutor) -> dict[str, Any]:
    found = dict(BACKENDS[name])
    if found.get("executor") == "threads":
        found["executor"] = pool
    return found


@pytest.fixture(scope="module")
def pool() -> Iterator[concurrent.futures.ThreadPoolExecutor]:
    with concurrent.futures.ThreadPoolExecutor(2) as executor:
        yield executor


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_a_batch_samplers_tuples_are_sequences_of_keys(
    backend: str, pool: concurrent.futures.ThreadPoolExecutor
) -> None:
    loader = DataLoader(Echo(), batch_sampler=TupleBatches(), **options(backend, pool))
    batches = list(loader)
    assert [batch["key"].tolist() for batch in batches] == [[0, 1, 2], [3, 4], [5, 6, 7]]
    assert [batch["kind"] for batch in batches] == [["int"] * 3, ["int"] * 2, ["int"] * 3]


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_a_batch_samplers_arrays_are_sequences_of_keys(
    backend: str, pool: concurrent.futures.ThreadPoolExecutor
) -> None:
    loader = DataLoader(Echo(), batch_sampler=ArrayBatches(), **options(backend, pool))
    batches = list(loader)
    assert [batch["key"].tolist() for batch in batches] == [[1, 0], [7]]
    assert all(len(batch["kind"]) == len(batch["key"]) for batch in batches)  # one per key


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_without_automatic_batching_a_list_is_one_key(
    backend: str, pool: concurrent.futures.ThreadPoolExecutor
) -> None:
    loader = DataLoader(Echo(), sampler=ListKeys(), batch_size=None, **options(backend, pool))
    samples = list(loader)
    assert [sample["key"].tolist() for sample in samples] == [[0, 1], [2, 3]]
    assert [sample["kind"] for sample in samples] == ["list", "list"]


def test_the_same_as_torch() -> None:
    torch = pytest.importorskip("torch")
    theirs = [
        (batch["key"].tolist(), batch["kind"])
        for batch in torch.utils.data.DataLoader(Echo(), batch_sampler=TupleBatches())
    ]
    ours = [
        (batch["key"].tolist(), batch["kind"])
        for batch in DataLoader(Echo(), batch_sampler=TupleBatches())
    ]
    assert ours == theirs
    one_key = torch.utils.data.DataLoader(Echo(), sampler=ListKeys(), batch_size=None)
    ours_one = DataLoader(Echo(), sampler=ListKeys(), batch_size=None)
    assert [(s["key"].tolist(), s["kind"]) for s in ours_one] == [
        (s["key"].tolist(), s["kind"]) for s in one_key
    ]


def test_dataloader_is_generic() -> None:
    def batches() -> DataLoader[dict[str, np.ndarray]]:
        return DataLoader(Echo(), batch_size=4)

    assert DataLoader[list[int]] is not None  # subscripting works at run time
    # Evaluating the annotation subscripts the class, as a module without
    # `from __future__ import annotations` does when it defines the function.
    hint = typing.get_type_hints(batches)["return"]
    assert typing.get_origin(hint) is DataLoader
    assert len(list(batches())) == 2


@pytest.mark.parametrize(
    ("attribute", "value"), [("num_workers", 4), ("prefetch_factor", 8), ("concurrency", 16)]
)
def test_what_sized_the_window_cannot_change_after_construction(attribute: str, value: int) -> None:
    loader = DataLoader(Echo(), batch_size=2, prefetch_factor=3)
    window = loader.window
    with pytest.raises(ValueError, match=f"{attribute} attribute should not be set after"):
        setattr(loader, attribute, value)
    assert loader.window == window
