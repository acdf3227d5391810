"""Parquet through the local cache: every column chunk an entry of its own.

A shuffled epoch reads the same chunks in other company (other row groups read together,
other coalesced ranges), so the cache keys chunks, not the ranges a read asked for: the
bytes the ObjectServer served say how much of each epoch came from the store.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from aioload import DataLoader
from aioload.sources import IterableParquetDataset, LocalCache, ParquetDataset
from aioload.stats.source_counts import SourceCounter
from aioload.testing import ObjectServer

FILES = 3
ROWS = 600  # per file, in row groups of 40
ROW_GROUP = 40


@pytest.fixture(scope="module")
def table_server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    folder = tmp_path_factory.mktemp("table")
    for number in range(FILES):
        ids = np.arange(number * ROWS, (number + 1) * ROWS, dtype=np.int64)
        table = pa.table(
            {
                "id": ids,
                "score": ids * 0.5,
                "text": [f"row {i} " * (i % 5) for i in ids],
            }
        )
        pq.write_table(table, folder / f"part-{number}.parquet", row_group_size=ROW_GROUP)
    with ObjectServer(folder) as server:
        yield server


def urls(server: ObjectServer) -> list[str]:
    return [f"{server.url}/part-{number}.parquet" for number in range(FILES)]


def served(server: ObjectServer) -> tuple[int, int]:
    stats = server.stats()
    return stats["requests"], stats["bytes"]


def epoch_ids(loader: DataLoader[Any]) -> list[int]:
    return [int(i) for batch in loader for i in np.asarray(batch["id"])]


def test_shuffled_epochs_read_what_the_first_one_read_from_the_cache(
    table_server: ObjectServer, tmp_path: Path
) -> None:
    dataset = IterableParquetDataset(
        urls(table_server),
        shuffle_row_groups=True,
        read_ahead="20KiB",  # a few row groups read together, others each epoch
        cache_dir=tmp_path / "cache",
    )
    loader = DataLoader(dataset, batch_size=64)
    per_epoch = []
    orders = []
    for epoch in range(3):
        dataset.set_epoch(epoch)
        before = served(table_server)[1]
        got = epoch_ids(loader)
        assert sorted(got) == list(range(FILES * ROWS))
        orders.append(got)
        per_epoch.append(served(table_server)[1] - before)
    assert len({tuple(order) for order in orders}) == 3  # three orders, three sets of reads
    first, second, third = per_epoch
    assert first > 0
    assert second <= 0.05 * first and third <= 0.05 * first, per_epoch


def test_chunks_not_cached_are_still_fetched_together(
    table_server: ObjectServer, tmp_path: Path
) -> None:
    def first_epoch(**cache: Any) -> tuple[int, int]:
        dataset = IterableParquetDataset(urls(table_server), read_ahead="1MiB", **cache)
        before = served(table_server)
        assert sorted(epoch_ids(DataLoader(dataset, batch_size=64))) == list(range(FILES * ROWS))
        after = served(table_server)
        return after[0] - before[0], after[1] - before[1]

    plain = first_epoch()
    cached = first_epoch(cache_dir=tmp_path / "cache")
    # Per file: the footer, then one request for all its row groups' chunks (neighbours
    # coalesced), with or without the cache, although each chunk is kept on its own.
    assert cached == plain
    assert plain[0] <= 2 * FILES
    assert len([p for p in (tmp_path / "cache").iterdir() if p.suffix == ".data"]) > 3 * FILES


def test_map_style_reads_share_the_chunks_a_stream_kept(
    table_server: ObjectServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aioload.sources.parquet import read as parquet_read

    # Decoded from exactly the chunks kept or fetched: a read of any other byte fails.
    monkeypatch.setattr(parquet_read, "STRICT_READS", True)
    cache = tmp_path / "cache"
    stream = IterableParquetDataset(urls(table_server), read_ahead="1MiB", cache_dir=cache)
    assert sorted(epoch_ids(DataLoader(stream, batch_size=64))) == list(range(FILES * ROWS))
    before = served(table_server)
    rows = ParquetDataset(urls(table_server), cache_dir=cache, row_group_cache=0)
    got = []
    for batch in DataLoader(rows, batch_size=50, shuffle=True, generator=1):
        for i, score, text in zip(batch["id"], batch["score"], batch["text"], strict=True):
            assert (score, text) == (i * 0.5, f"row {i} " * (i % 5))
            got.append(int(i))
    assert sorted(got) == list(range(FILES * ROWS))
    assert served(table_server) == before  # one row group at a time: the same chunks


# -- LocalCache.read_many ----------------------------------------------------------------


def test_read_many_fetches_what_is_missing_with_one_call(tmp_path: Path) -> None:
    cache = LocalCache(tmp_path / "cache")
    counts = SourceCounter()
    calls: list[list[int]] = []

    def entries(names: list[str]) -> list[tuple[str, str]]:
        return [(f"memory:///{name}", name) for name in names]

    async def read(names: list[str]) -> list[bytes]:
        async def fetch(numbers: list[int]) -> list[memoryview]:
            calls.append([names[n] for n in numbers])
            joined = b"".join(names[n].encode() * 3 for n in numbers)
            view, out, at = memoryview(joined), [], 0
            for n in numbers:
                size = 3 * len(names[n])
                out.append(view[at : at + size])
                at += size
            return out

        return [bytes(data) for data in await cache.read_many(entries(names), fetch, counts)]

    assert asyncio.run(read(["a", "bb", "ccc"])) == [b"aaa", b"bbbbbb", b"ccccccccc"]
    assert asyncio.run(read(["bb", "dddd", "a", "ee"])) == [
        b"bbbbbb",
        b"dddddddddddd",
        b"aaa",
        b"eeeeee",
    ]
    assert calls == [["a", "bb", "ccc"], ["dddd", "ee"]]
    taken = counts.take()
    assert taken is not None and (taken.cache_hits, taken.cache_misses) == (2, 5)
    assert asyncio.run(read(["ccc", "ee"])) == [b"ccccccccc", b"eeeeee"]
    assert len(calls) == 2  # everything kept: no fetch


def test_read_many_waits_for_an_entry_another_reader_writes(tmp_path: Path) -> None:
    cache = LocalCache(tmp_path / "cache")
    other = LocalCache(tmp_path / "cache")  # another process's instance, as far as locks go
    counts = SourceCounter()

    async def main() -> list[bytes]:
        release = asyncio.Event()
        writing = asyncio.Event()

        async def slow() -> bytes:
            writing.set()
            await release.wait()
            return b"shared"

        async def fetch(numbers: list[int]) -> list[bytes]:
            return [[b"shared", b"mine"][n] for n in numbers]

        writer = asyncio.ensure_future(other.read("memory:///x", "x", slow, counts))
        await writing.wait()
        reader = asyncio.ensure_future(
            cache.read_many([("memory:///x", "x"), ("memory:///y", "y")], fetch, counts)
        )
        await asyncio.sleep(0.05)
        assert not reader.done()  # waits for the other writer's entry
        release.set()
        assert await writer == b"shared"
        return [bytes(data) for data in await reader]

    assert asyncio.run(main()) == [b"shared", b"mine"]
    taken = counts.take()
    # The writer's miss; the reader's miss of y and its hit of x once written.
    assert taken is not None and (taken.cache_hits, taken.cache_misses) == (1, 2)
