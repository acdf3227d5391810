"""``aioload.SharedList``: a read-only sequence of pickled items that workers share.

Its semantics as a sequence, its validation, its pickled size (a handle, not a
copy), and loaders reading it with workers under every start method.

Datasets live at module level: workers start with ``forkserver`` or ``spawn``,
which pickle them.
"""

from __future__ import annotations

import pickle
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

import aioload
from aioload import DataLoader, SharedList
from tests.mappings import in_setup_segment

RECORDS = [{"id": i, "name": f"item-{i}", "score": i / 4} for i in range(5000)]
PICKLING = ["forkserver", pytest.param("spawn", marks=pytest.mark.slow)]

# -- a sequence ----------------------------------------------------------------------


def test_items_read_back_by_index_from_either_end() -> None:
    shared = SharedList(RECORDS)
    assert len(shared) == 5000
    assert shared[0] == RECORDS[0] and shared[4999] == RECORDS[4999]
    assert shared[-1] == RECORDS[-1] and shared[-5000] == RECORDS[0]
    assert shared[np.int64(7)] == RECORDS[7]  # samplers may give numpy integers
    for bad in (5000, -5001):
        with pytest.raises(IndexError, match=f"index {bad} out of range for 5000 items"):
            shared[bad]
    with pytest.raises(TypeError, match="integers or slices, not str"):
        shared["1"]  # type: ignore[call-overload]


def test_a_slice_is_a_list_of_the_items() -> None:
    shared = SharedList(range(10))
    assert shared[2:5] == [2, 3, 4]
    assert shared[::-3] == [9, 6, 3, 0]
    assert shared[8:100] == [8, 9] and shared[5:2] == []
    assert type(shared[:]) is list


def test_it_is_a_read_only_sequence() -> None:
    shared = SharedList(["b", "a", "b"])
    assert isinstance(shared, Sequence)
    assert list(shared) == ["b", "a", "b"]
    assert "a" in shared and "c" not in shared
    assert shared.index("a") == 1 and shared.count("b") == 2
    assert list(reversed(shared)) == ["b", "a", "b"]
    with pytest.raises(TypeError):
        shared[0] = "c"  # type: ignore[index]


def test_each_read_is_a_new_copy() -> None:
    shared = SharedList([{"x": [1]}])
    item = shared[0]
    item["x"].append(2)
    assert shared[0] == {"x": [1]} and shared[0] is not shared[0]


def test_any_iterable_and_the_empty_one() -> None:
    assert list(SharedList(i * i for i in range(4))) == [0, 1, 4, 9]
    assert list(SharedList({"k": 1})) == ["k"]  # a dict's keys, as list() gives
    empty: SharedList[Any] = SharedList([])
    assert len(empty) == 0 and list(empty) == []
    with pytest.raises(IndexError):
        empty[0]


def test_the_repr_is_short() -> None:
    shared = SharedList(RECORDS)
    text = repr(shared)
    assert text.startswith("SharedList(5000 items, ") and text.endswith(" KiB)")
    assert len(text) < 40
    assert repr(SharedList([1])).endswith(" bytes)")


def test_what_is_not_an_iterable_or_not_picklable_is_refused() -> None:
    with pytest.raises(TypeError, match="takes an iterable of items, not int"):
        SharedList(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"cannot hold item 2 \(a _thread\.lock\)"):
        SharedList([1, 2, threading.Lock()])


def test_pickled_it_is_a_handle_of_two_buffers() -> None:
    shared = SharedList(RECORDS)
    buffers: list[pickle.PickleBuffer] = []
    blob = pickle.dumps(shared, protocol=5, buffer_callback=buffers.append)
    assert len(blob) < 300  # whatever the number of items
    assert len(buffers) == 2
    assert sum(b.raw().nbytes for b in buffers) > 100_000
    received = pickle.loads(blob, buffers=buffers)
    assert len(received) == 5000 and received[1234] == RECORDS[1234]
    # Plain pickling copies the items, and works the same.
    assert list(pickle.loads(pickle.dumps(shared))) == RECORDS


# -- through a loader ----------------------------------------------------------------


class Records(aioload.Dataset[dict[str, Any]]):
    """Reads a SharedList of records; each sample says where its storage lies in the worker."""

    def __init__(self, records: SharedList[dict[str, Any]]) -> None:
        self.records = records
        self.shared: bool | None = None  # found once per worker: /proc/self/maps is slow to read

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> dict[str, Any]:
        storage = self.records._data  # its one buffer of pickles
        if self.shared is None:
            self.shared = in_setup_segment(storage)
        return {**self.records[index], "shared": self.shared, "writeable": storage.flags.writeable}


def ids(batches: list[dict[str, Any]]) -> list[int]:
    return [i for batch in batches for i in batch["id"].tolist()]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("method", ["fork", *PICKLING])
def test_a_loader_reads_it_directly_with_workers(method: str) -> None:
    loader = DataLoader(
        SharedList(RECORDS), batch_size=64, num_workers=2, multiprocessing_context=method
    )
    batches = list(loader)
    assert ids(batches) == list(range(5000))
    assert batches[1]["name"][:2] == ["item-64", "item-65"]
    assert batches[2]["score"].tolist() == [i / 4 for i in range(128, 192)]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("method", PICKLING)
def test_workers_read_its_storage_from_the_shared_segment(method: str) -> None:
    records = SharedList({"id": i, "name": f"item-{i}"} for i in range(20_000))
    loader = DataLoader(
        Records(records), batch_size=1000, num_workers=2, multiprocessing_context=method
    )
    batches = list(loader)
    assert ids(batches) == list(range(20_000))
    assert batches[3]["name"][:2] == ["item-3000", "item-3001"]
    assert all(batch["shared"].all() for batch in batches)  # no copy of its own
    assert not any(batch["writeable"].any() for batch in batches)
