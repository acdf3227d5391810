"""The backend contract, run by every backend: what a user sees wherever batches are read.

One suite, five backends — the inline backend over a sync and over an async dataset, two
worker processes, a thread-pool executor and a process-pool executor — and for each:
every key exactly once, in order and out of order; errors keep their type and say where
they came from; errors that cannot be pickled still arrive; skips and retries are counted;
``break`` leaves nothing running; a checkpoint resumes where it was taken.

Datasets live at module level: worker processes and the process pool pickle them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import multiprocessing
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

import aioload
from aioload import DataLoader, RetryPolicy, WorkerError


class Items(aioload.Dataset):
    """Sample ``k`` is ``{"key": k, "x": [k, k]}``; some keys fail, some only at first."""

    def __init__(
        self,
        n: int,
        fail: dict[int, tuple[type[Exception], str]] | None = None,
        transient: frozenset[int] = frozenset(),
    ) -> None:
        self.n = n
        self.fail = fail or {}
        self.transient = transient
        self._attempted: set[int] = set()  # each copy (worker) retries its own keys

    def __len__(self) -> int:
        return self.n

    def read(self, key: int) -> dict[str, Any]:
        if key in self.fail:
            kind, message = self.fail[key]  # made here: a Cursed error cannot be pickled
            raise kind(message)
        if key in self.transient and key not in self._attempted:
            self._attempted.add(key)
            raise ConnectionResetError(f"key {key}: connection reset")
        return {"key": key, "x": np.full(2, key, dtype=np.int64)}

    def __getitem__(self, key: int) -> dict[str, Any]:
        return self.read(key)


class AsyncItems(Items):
    async def __getitem__(self, key: int) -> dict[str, Any]:  # type: ignore[override]
        await asyncio.sleep(0)
        return self.read(key)


class Cursed(Exception):
    """An error that cannot be pickled (it holds a lock)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.lock = threading.Lock()


@dataclass
class Backend:
    """How one backend builds a loader over a dataset."""

    name: str
    dataset_kind: type[Items]
    options: dict[str, Any]
    remote: bool  # results cross a pickle boundary
    where_note: str | None  # the note naming the worker an error came from

    def loader(self, dataset: Items, **kwargs: Any) -> DataLoader[Any]:
        return DataLoader(dataset, **self.options, **kwargs)

    def dataset(self, n: int, **kwargs: Any) -> Items:
        return self.dataset_kind(n, **kwargs)


@pytest.fixture(scope="module")
def thread_pool() -> Iterator[concurrent.futures.ThreadPoolExecutor]:
    with concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="contract") as pool:
        yield pool


BACKENDS = ["inline-sync", "inline-async", "workers", "thread-pool", "process-pool"]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Backend:
    name = request.param
    if name == "inline-sync":
        return Backend(name, Items, {}, remote=False, where_note=None)
    if name == "inline-async":
        return Backend(name, AsyncItems, {}, remote=False, where_note=None)
    if name == "workers":
        return Backend(
            name, Items, {"num_workers": 2}, remote=True, where_note="raised in DataLoader worker"
        )
    pool = request.getfixturevalue("thread_pool" if name == "thread-pool" else "process_pool")
    return Backend(
        name,
        Items,
        {"executor": pool},
        remote=name == "process-pool",
        where_note="raised in executor worker",
    )


def keys_of(batch: dict[str, Any]) -> list[int]:
    assert batch["x"].shape == (len(batch["key"]), 2)
    np.testing.assert_array_equal(batch["x"][:, 0], batch["key"])
    return [int(k) for k in batch["key"]]


def all_keys(batches: Any) -> list[int]:
    return [k for batch in batches for k in keys_of(batch)]


# -- exactly once, in order and out of order ---------------------------------------


def test_every_key_exactly_once_in_the_samplers_order(backend: Backend) -> None:
    reference = DataLoader(Items(50), batch_size=4, shuffle=True, generator=7)
    expected = [keys_of(batch) for batch in reference]
    loader = backend.loader(backend.dataset(50), batch_size=4, shuffle=True, generator=7)
    got = [keys_of(batch) for batch in loader]
    assert got == expected
    assert sorted(k for batch in got for k in batch) == list(range(50))
    assert [k for batch in got for k in batch] != list(range(50))  # it did shuffle


def test_out_of_order_delivers_every_key_once(backend: Backend) -> None:
    loader = backend.loader(backend.dataset(50), batch_size=4, in_order=False)
    assert sorted(all_keys(loader)) == list(range(50))


@pytest.mark.asyncio
async def test_async_for_delivers_every_key_once_in_order(backend: Backend) -> None:
    loader = backend.loader(backend.dataset(30), batch_size=4)
    assert [k async for batch in loader for k in keys_of(batch)] == list(range(30))


def test_without_automatic_batching_each_element_is_one_key(backend: Backend) -> None:
    loader = backend.loader(backend.dataset(5), batch_size=None)
    assert [int(sample["key"]) for sample in loader] == [0, 1, 2, 3, 4]


# -- errors ------------------------------------------------------------------------


def test_an_error_keeps_its_type_and_names_batch_keys_and_worker(backend: Backend) -> None:
    dataset = backend.dataset(12, fail={5: (KeyError, "no key 5")})
    with pytest.raises(KeyError, match="no key 5") as caught:
        list(backend.loader(dataset, batch_size=4))
    notes = "\n".join(caught.value.__notes__)
    assert "batch 1 (keys [4, 5, 6, 7])" in notes
    if backend.where_note is not None:
        assert backend.where_note in notes
    if backend.remote:
        assert "worker traceback:" in notes and "in read" in notes


def test_an_error_that_cannot_be_pickled_still_arrives(backend: Backend) -> None:
    dataset = backend.dataset(8, fail={2: (Cursed, "key 2 is cursed")})
    expected = WorkerError if backend.remote else Cursed
    with pytest.raises(expected, match="key 2 is cursed") as caught:
        list(backend.loader(dataset, batch_size=4))
    notes = "\n".join(caught.value.__notes__)
    assert "batch 0 (keys [0, 1, 2, 3])" in notes
    if backend.remote:
        assert "Cursed" in str(caught.value)
        assert "worker traceback" in notes


def test_skips_and_retries_are_counted(backend: Backend) -> None:
    dataset = backend.dataset(16, fail={6: (ValueError, "broken")}, transient=frozenset({1, 9}))
    loader = backend.loader(
        dataset,
        batch_size=4,
        retry=RetryPolicy(attempts=3, backoff=0.001),
        on_error="skip",
    )
    assert all_keys(loader) == [k for k in range(16) if k != 6]
    assert [item.key for item in loader.skipped] == [6]
    epoch = loader.stats().epoch
    assert epoch.skipped == 1
    assert epoch.retries == 2  # keys 1 and 9 failed once each, wherever they were read


# -- ending early and cleanup ------------------------------------------------------


def _aioload_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("aioload")}


def _aioload_children() -> list[Any]:
    return [p for p in multiprocessing.active_children() if p.name.startswith("aioload-worker")]


def test_break_leaves_nothing_running_and_the_next_epoch_is_whole(backend: Backend) -> None:
    before = _aioload_threads()
    loader = backend.loader(backend.dataset(400), batch_size=4)
    for batch in loader:
        assert keys_of(batch) == [0, 1, 2, 3]
        break
    deadline = time.monotonic() + 10
    while (_aioload_threads() - before or _aioload_children()) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _aioload_threads() - before == set()
    assert _aioload_children() == []
    assert all_keys(loader) == list(range(400))


# -- checkpoints -------------------------------------------------------------------


@pytest.mark.parametrize("in_order", [True, False])
def test_a_checkpoint_resumes_exactly_the_rest(backend: Backend, in_order: bool) -> None:
    def make() -> DataLoader[Any]:
        return backend.loader(
            backend.dataset(40), batch_size=4, shuffle=True, generator=1, in_order=in_order
        )

    first = make()
    iterator = iter(first)
    taken = [keys_of(next(iterator)) for _ in range(3)]
    state = json.loads(json.dumps(first.state_dict()))
    rest = [keys_of(batch) for batch in iterator]
    resumed = make()
    resumed.load_state_dict(state)
    again = [keys_of(batch) for batch in resumed]
    if in_order:
        assert again == rest
    else:
        assert sorted(k for b in again for k in b) == sorted(k for b in rest for k in b)
    assert sorted(k for b in taken + rest for k in b) == list(range(40))
