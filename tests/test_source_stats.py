"""The source-counts hook: what a dataset counts of its reads reaches loader.stats(), exactly,
from the loader's loop, from worker processes and from an executor's tasks."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import AsyncIterator

import pytest

from aioload import DataLoader, IterableDataset
from aioload.stats.source_counts import SourceCounter, SourceCounts


class Counted:
    """Map-style: item i is a hit when even, a miss of i bytes when odd."""

    def __init__(self, length: int) -> None:
        self.length = length
        self.counts = SourceCounter()

    def __len__(self) -> int:
        return self.length

    async def __getitem__(self, index: int) -> int:
        await asyncio.sleep(0)
        if index % 2:
            self.counts.miss()
            self.counts.received(index)
        else:
            self.counts.hit()
        return index

    def take_source_counts(self) -> SourceCounts | None:
        return self.counts.take()


class CountedStream(IterableDataset[int]):
    """A stream that counts the bytes of a "shard" after its last sample has gone out."""

    def __init__(self, samples: int) -> None:
        self.samples = samples
        self.counts = SourceCounter()

    async def __aiter__(self) -> AsyncIterator[int]:
        from aioload import get_worker_info

        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(worker, self.samples, workers):
            yield i
        self.counts.miss()
        self.counts.received(1000)  # read after the last batch: reported with the stream's end

    def take_source_counts(self) -> SourceCounts | None:
        return self.counts.take()


@pytest.mark.parametrize("workers", [0, 2])
def test_map_style_counts_are_exact(workers: int) -> None:
    loader = DataLoader(Counted(40), batch_size=8, num_workers=workers, collate_fn=list)
    for _ in range(2):
        assert sorted(i for batch in loader for i in batch) == list(range(40))
        stats = loader.stats().epoch
        assert (stats.cache_hits, stats.cache_misses) == (20, 20)
        assert stats.store_bytes == sum(range(1, 40, 2))
    assert loader.stats().total.cache_hits == 40
    assert loader.stats().as_dict()["total"]["store_bytes"] == 2 * sum(range(1, 40, 2))


def test_counts_cross_an_executor() -> None:
    with concurrent.futures.ThreadPoolExecutor(2) as threads:
        loader = DataLoader(Counted(24), batch_size=6, executor=threads, collate_fn=list)
        assert sorted(i for batch in loader for i in batch) == list(range(24))
    stats = loader.stats().epoch
    assert (stats.cache_hits, stats.cache_misses) == (12, 12)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_streams_last_counts_come_with_its_end(workers: int) -> None:
    # 16 samples in batches of 4: the last batch is full, the counts come after it.
    loader = DataLoader(CountedStream(16), batch_size=4, num_workers=workers, collate_fn=list)
    assert sorted(i for batch in loader for i in batch) == list(range(16))
    stats = loader.stats().epoch
    assert stats.cache_misses == max(workers, 1)
    assert stats.store_bytes == 1000 * max(workers, 1)


def test_a_dataset_without_the_hook_counts_nothing() -> None:
    loader = DataLoader(list(range(10)), batch_size=5, num_workers=0)
    assert sum(len(batch) for batch in loader) == 10
    stats = loader.stats().epoch
    assert (stats.cache_hits, stats.cache_misses, stats.store_bytes) == (0, 0, 0)
    assert "cache hits" not in str(loader.stats())
