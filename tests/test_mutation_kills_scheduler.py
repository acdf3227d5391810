"""The epoch's scheduler as users see it: resume over an async sampler, max_skipped, stats
(aioload/pipeline/scheduler.py).

Written for the survivors of the mutation run (docs/testing/mutation.md): an epoch over
an async sampler checkpoints and resumes, the skip limit ends the epoch with its error,
the fetch latencies are those of the documented batches, the in-flight gauges count
batches and items, and a window grown while batches are out frees the new slots.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import numpy as np
import pytest

import aioload
from aioload import DataLoader, TooManySkippedError
from aioload.pipeline.scheduler import Window
from tests.conftest import wait_until

N = 20


class Keys(aioload.Dataset):
    def __init__(self, bad: frozenset[int] = frozenset()) -> None:
        self.bad = bad

    def __len__(self) -> int:
        return N

    def __getitem__(self, key: int) -> int:
        if key in self.bad:
            raise LookupError(f"cannot read {key}")
        return key


class AsyncEvens:
    """An async user sampler without ``state_dict``: the even keys."""

    def __aiter__(self) -> AsyncIterator[int]:
        return self._keys()

    async def _keys(self) -> AsyncIterator[int]:
        for key in range(0, N, 2):
            await asyncio.sleep(0)
            yield key


def flat(batches: Any) -> list[int]:
    return [int(x) for batch in batches for x in np.asarray(batch).reshape(-1)]


@pytest.mark.parametrize("batch_size", [None, 2])
def test_an_epoch_over_an_async_sampler_resumes_where_it_stopped(batch_size: int | None) -> None:
    def loader() -> DataLoader:
        return DataLoader(Keys(), batch_size=batch_size, sampler=AsyncEvens())

    everything = flat(loader())
    assert everything == list(range(0, N, 2))
    interrupted = loader()
    iterator = iter(interrupted)
    head = flat(next(iterator) for _ in range(3))
    state = json.loads(json.dumps(interrupted.state_dict()))
    iterator.close()  # type: ignore[attr-defined]
    assert state["in_progress"] and state["batches"] == 3
    resumed = loader()
    resumed.load_state_dict(state)
    assert head + flat(resumed) == everything


def test_crossing_max_skipped_ends_the_epoch_with_its_error() -> None:
    loader = DataLoader(
        Keys(bad=frozenset({1, 6, 11})), batch_size=5, on_error="skip", max_skipped=2
    )
    got = []
    with pytest.raises(TooManySkippedError, match="max_skipped=2"):
        for batch in loader:
            got.append(batch.tolist())
    assert got == [[0, 2, 3, 4], [5, 7, 8, 9]]


class Stream(aioload.IterableDataset):
    def __iter__(self) -> Iterator[int]:
        return iter(range(40))


@pytest.mark.parametrize("dataset", [range(40), Stream()], ids=["map-style", "iterable"])
def test_fetch_latencies_are_measured_for_the_first_batches_then_one_in_32(dataset: Any) -> None:
    loader = DataLoader(dataset, batch_size=1)
    assert len(flat(loader)) == 40
    assert loader.stats().fetch_samples == 9  # batches 0..7, then 32


def test_a_failed_batch_has_its_latency_measured_too() -> None:
    loader = DataLoader(Keys(bad=frozenset({5})), batch_size=1)
    iterator = iter(loader)
    taken = 0
    with pytest.raises(LookupError):
        while True:
            next(iterator)
            taken += 1
    assert taken == 5
    list(iterator)  # the epoch goes on past a failed batch
    assert loader.stats().fetch_samples == 8


class Gated(aioload.Dataset):
    """Async; keys past the first batch wait for ``gate`` (so their batches stay in flight)."""

    def __init__(self) -> None:
        self.gate = threading.Event()

    def __len__(self) -> int:
        return 24

    async def __getitem__(self, key: int) -> int:
        while key >= 4 and not self.gate.is_set():
            await asyncio.sleep(0.005)
        return key


def test_the_gauges_count_the_batches_and_items_in_flight() -> None:
    dataset = Gated()
    # Batches of different sizes: the items in flight are those of each batch.
    sizes = [4, 5, 3, 2, 6, 4]
    starts = itertools.accumulate(sizes, initial=0)
    batches = [list(range(a, b)) for a, b in itertools.pairwise(starts)]
    loader = DataLoader(dataset, batch_sampler=batches, prefetch_factor=2)
    iterator = iter(loader)
    try:
        assert next(iterator).tolist() == [0, 1, 2, 3]
        assert wait_until(lambda: loader.stats().batches_in_flight >= 2)
        stats = loader.stats()
        # Batches 1, 2, ... are submitted in order and none can complete.
        assert stats.items_in_flight == sum(sizes[1 : 1 + stats.batches_in_flight])
    finally:
        dataset.gate.set()
        iterator.close()  # type: ignore[attr-defined]


def test_a_window_grown_while_batches_are_out_frees_the_new_slots() -> None:
    async def run() -> tuple[int, int]:
        window = Window(4, asyncio.get_running_loop())
        for _ in range(3):
            await window.acquire()
        window.resize(6)
        grown = window.free
        window.resize(2)
        return grown, window.free

    assert asyncio.run(run()) == (3, -1)
