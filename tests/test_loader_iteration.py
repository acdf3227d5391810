"""Iterating a loader: `for` and `async for`, epochs, iterable datasets, async samplers."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Iterator

import numpy as np
import pytest

from aioload import (
    ArrayDataset,
    BatchSampler,
    DataLoader,
    IterableDataset,
    SequentialSampler,
)


class SyncSquares:
    def __init__(self, n: int) -> None:
        self.n = n

    def __getitem__(self, i: int) -> int:
        return i * i

    def __len__(self) -> int:
        return self.n


class AsyncSquares(SyncSquares):
    async def __getitem__(self, i: int) -> int:  # type: ignore[override]
        await asyncio.sleep(0)
        return i * i


class BatchedSquares(SyncSquares):
    async def __getitems__(self, keys: list[int]) -> list[int]:
        await asyncio.sleep(0)
        return [k * k for k in keys]


def flat(batches: list[np.ndarray]) -> list[int]:
    return [int(x) for b in batches for x in b]


async def collect(loader: DataLoader) -> list[np.ndarray]:
    return [batch async for batch in loader]


@pytest.mark.parametrize("dataset_type", [SyncSquares, AsyncSquares, BatchedSquares])
def test_for_and_async_for_give_the_same_batches(dataset_type: type) -> None:
    loader = DataLoader(dataset_type(23), batch_size=5)
    sync_batches = list(loader)
    async_batches = asyncio.run(collect(loader))
    assert [b.tolist() for b in sync_batches] == [b.tolist() for b in async_batches]
    assert flat(sync_batches) == [i * i for i in range(23)]
    assert [len(b) for b in sync_batches] == [5, 5, 5, 5, 3]
    assert len(loader) == 5


def test_drop_last_and_no_auto_batching() -> None:
    assert [len(b) for b in DataLoader(SyncSquares(23), batch_size=5, drop_last=True)] == [5] * 4
    samples = list(DataLoader(AsyncSquares(4), batch_size=None))
    assert samples == [0, 1, 4, 9]


def test_every_iteration_is_a_new_epoch_and_shuffle_reshuffles() -> None:
    loader = DataLoader(ArrayDataset(np.arange(100)), batch_size=10, shuffle=True)
    first = flat([b[0] for b in loader])
    second = flat([b[0] for b in loader])
    assert sorted(first) == sorted(second) == list(range(100))
    assert first != second


def test_fixed_seed_reproduces_the_sequence_of_epochs() -> None:
    def epochs(seed: int) -> list[list[int]]:
        loader = DataLoader(ArrayDataset(np.arange(50)), batch_size=7, shuffle=True, generator=seed)
        return [flat([b[0] for b in loader]) for _ in range(3)]

    assert epochs(3) == epochs(3)
    assert epochs(3) != epochs(4)
    one, two, _ = epochs(3)
    assert one != two


class Stream(IterableDataset[int]):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.n))

    def __len__(self) -> int:
        return self.n


class AsyncStream(IterableDataset[int]):
    def __init__(self, n: int) -> None:
        self.n = n

    async def __aiter__(self) -> AsyncIterator[int]:
        for i in range(self.n):
            await asyncio.sleep(0)
            yield i


@pytest.mark.parametrize("stream", [Stream, AsyncStream])
@pytest.mark.parametrize("drop_last", [False, True])
def test_iterable_datasets_sync_and_async(stream: type, drop_last: bool) -> None:
    loader = DataLoader(stream(23), batch_size=5, drop_last=drop_last)
    expected = [list(range(i, min(i + 5, 23))) for i in range(0, 23, 5)]
    if drop_last:
        expected = expected[:-1]
    assert [b.tolist() for b in loader] == expected
    assert [b.tolist() for b in asyncio.run(collect(loader))] == expected


def test_iterable_dataset_without_batching() -> None:
    assert list(DataLoader(AsyncStream(3), batch_size=None)) == [0, 1, 2]


class AwaitingSampler:
    """Keys that arrive from a coroutine, like a paginated listing."""

    def __init__(self, n: int, delay: float = 0.0) -> None:
        self.n, self.delay = n, delay

    async def __aiter__(self) -> AsyncIterator[int]:
        for i in range(self.n):
            await asyncio.sleep(self.delay)
            yield i


def test_async_sampler_end_to_end() -> None:
    loader = DataLoader(AsyncSquares(10), sampler=AwaitingSampler(10), batch_size=4)
    assert [b.tolist() for b in loader] == [[0, 1, 4, 9], [16, 25, 36, 49], [64, 81]]
    batches = asyncio.run(collect(loader))
    assert flat(batches) == [i * i for i in range(10)]


def test_async_batch_sampler_end_to_end() -> None:
    batch_sampler = BatchSampler(AwaitingSampler(7), 3, drop_last=False)
    loader = DataLoader(SyncSquares(7), batch_sampler=batch_sampler)
    assert [b.tolist() for b in loader] == [[0, 1, 4], [9, 16, 25], [36]]


def test_slow_async_sampler_does_not_stall_batches_in_flight() -> None:
    """Batches already submitted are delivered while the sampler awaits its next key."""

    class SlowSecondHalf:
        async def __aiter__(self) -> AsyncIterator[list[int]]:
            yield [0, 1]
            yield [2, 3]
            await asyncio.sleep(0.3)
            yield [4, 5]

    async def main() -> float:
        loop = asyncio.get_running_loop()
        start = loop.time()
        async for batch in DataLoader(SyncSquares(6), batch_sampler=SlowSecondHalf()):
            if batch.tolist() == [4, 9]:
                return loop.time() - start
        raise AssertionError("batch 1 missing")

    assert asyncio.run(main()) < 0.25


def test_endless_stream_runs_no_further_ahead_than_the_window() -> None:
    drawn = itertools.count()

    class Endless:
        def __iter__(self) -> Iterator[list[int]]:
            while True:
                yield [next(drawn)]

    loader = DataLoader(SyncSquares(10**9), batch_sampler=Endless(), prefetch_factor=3)

    async def main() -> None:
        taken = 0
        async for _ in loader:
            taken += 1
            await asyncio.sleep(0.01)  # a slow consumer
            if taken == 20:
                break

    asyncio.run(main())
    # 20 taken + at most a window (3) in flight, +1 drawn by the blocked producer
    assert next(drawn) <= 20 + 3 + 1


def test_sequential_batch_sampler_keys_reach_the_dataset() -> None:
    seen: list[list[int]] = []

    class Recording:
        def __getitems__(self, keys: list[int]) -> list[int]:
            seen.append(list(keys))
            return keys

        def __getitem__(self, i: int) -> int:
            raise AssertionError("__getitems__ should be used")

        def __len__(self) -> int:
            return 10

    batch_sampler = BatchSampler(SequentialSampler(range(10)), 3, False)
    batches = list(DataLoader(Recording(), batch_sampler=batch_sampler))
    assert seen == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    assert [b.tolist() for b in batches] == seen


def test_plain_for_inside_a_running_loop_points_to_async_for() -> None:
    async def main() -> None:
        with pytest.raises(RuntimeError, match="async for"):
            iter(DataLoader(SyncSquares(3)))

    asyncio.run(main())
