"""ShardDataset split at sample granularity: equal steps on every rank, over HTTP and S3.

Shards of unequal sizes (with their index files, as ShardWriter writes them) served by the
latency-injecting ObjectServer (ranged reads over HTTP) and uploaded to SeaweedFS (a real
S3 server). Ranks are datasets built with ``rank=``/``world_size=`` in this process (the
multi-process run is ``test_multirank_shards.py``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import obstore
import pytest

from aioload import DataLoader
from aioload.sources import (
    Segment,
    ShardDataset,
    ShardIndex,
    ShardIndexError,
    ShardWriter,
    default_decode,
    open_store,
)
from aioload.sources.tar.index import INDEX_SUFFIX

SIZES = [17, 3, 25, 1, 11, 8, 14]  # samples per shard: 79 in all, 79 % 3 = 1
TOTAL = sum(SIZES)
WORLD = 3


def label(raw: dict[str, Any]) -> int:
    """A sample's number (module level: runs in the workers), checking its fields."""
    sample = default_decode(raw)
    assert sample["__key__"] == f"{sample['cls']:06d}"
    assert sample["txt"] == "x" * (sample["cls"] % 700)
    return int(sample["cls"])


def write_shards(folder: Path, sizes: list[int] = SIZES) -> list[Path]:
    """Shards ``part-000.tar`` ... with ``sizes[n]`` samples each, numbered on across shards."""
    paths = []
    number = 0
    for shard, size in enumerate(sizes):
        with ShardWriter(str(folder / "part-%03d.tar"), maxcount=size, start_shard=shard) as w:
            for _ in range(size):
                # Bodies of varied lengths: samples of different sizes, offsets not regular.
                w.write({"__key__": f"{number:06d}", "cls": number, "txt": "x" * (number % 700)})
                number += 1
        paths += [Path(p) for p in w.shards]
    return paths


@pytest.fixture(scope="module")
def http_shards(object_folder: Path, object_server: Any) -> str:
    """The shards (and their indexes) under split/ of the ObjectServer; their brace pattern."""
    folder = object_folder / "split"
    folder.mkdir(exist_ok=True)
    write_shards(folder)
    return f"{object_server.url}/split/part-{{000..{len(SIZES) - 1:03d}}}.tar"


@pytest.fixture(scope="module")
def s3_shards(
    tmp_path_factory: pytest.TempPathFactory, seaweedfs: Any, s3_storage_options: dict[str, Any]
) -> str:
    """The same shards and indexes uploaded to SeaweedFS."""
    folder = tmp_path_factory.mktemp("split")
    paths = write_shards(folder)
    asyncio.run(upload(seaweedfs.url, s3_storage_options, "split", paths, index=True))
    return f"{seaweedfs.url}/split/part-{{000..{len(SIZES) - 1:03d}}}.tar"


async def upload(
    url: str, options: dict[str, Any], prefix: str, paths: list[Path], *, index: bool
) -> None:
    store, _ = open_store(url, storage_options=options)
    files = [*paths, *([Path(f"{p}{INDEX_SUFFIX}") for p in paths] if index else [])]
    await asyncio.gather(
        *(obstore.put_async(store, f"{prefix}/{p.name}", p.read_bytes()) for p in files)
    )


def epoch_sequence(count: int, seed: int, epoch: int) -> list[int]:
    """Every sample's number in an epoch's shard order (a permutation of (seed, epoch))."""
    starts = np.cumsum([0, *SIZES])
    order = np.random.default_rng([seed, epoch]).permutation(count)
    return [n for shard in order for n in range(starts[shard], starts[shard + 1])]


def run_ranks(url: str, workers: int, drop_last: bool, **options: Any) -> list[dict[str, Any]]:
    """Each rank's lengths and samples for epoch 1 (shuffled shards)."""
    found = []
    for rank in range(WORLD):
        dataset = ShardDataset(
            url,
            decode=label,
            rank=rank,
            world_size=WORLD,
            drop_last=drop_last,
            shuffle_shards=True,
            seed=4,
            **options,
        )
        assert dataset.split == "samples"  # the default with several ranks
        dataset.set_epoch(1)
        loader = DataLoader(dataset, batch_size=4, num_workers=workers, collate_fn=list)
        batches = list(loader)
        found.append(
            {
                "len": len(dataset),
                "batches": len(loader),
                "yielded": len(batches),
                "samples": [n for batch in batches for n in batch],
            }
        )
    return found


def check_ranks(found: list[dict[str, Any]], drop_last: bool) -> None:
    share = TOTAL // WORLD if drop_last else -(-TOTAL // WORLD)  # 26 or 27
    batches = share // 4 + (share % 4 > 0)
    for rank in found:
        assert (rank["len"], rank["batches"], rank["yielded"]) == (share, batches, batches)
        assert len(rank["samples"]) == share
    counts = Counter(n for rank in found for n in rank["samples"])
    sequence = epoch_sequence(len(SIZES), seed=4, epoch=1)
    if drop_last:
        # Every sample at most once; the one left out is the epoch's last.
        assert set(counts.values()) == {1} and set(counts) == set(sequence[:-1])
    else:
        # Every sample once, and the epoch's first two once more: the padding.
        assert set(counts) == set(range(TOTAL))
        assert counts - Counter(range(TOTAL)) == Counter(sequence[: share * WORLD - TOTAL])


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("workers", [0, 2])
def test_equal_steps_on_every_rank_over_http(
    http_shards: str, workers: int, drop_last: bool
) -> None:
    check_ranks(run_ranks(http_shards, workers, drop_last), drop_last)


@pytest.mark.parametrize("workers", [0, 2])
def test_equal_steps_on_every_rank_over_s3(
    s3_shards: str, s3_storage_options: dict[str, Any], workers: int
) -> None:
    check_ranks(run_ranks(s3_shards, workers, False, storage_options=s3_storage_options), False)


def test_ranks_take_contiguous_runs_cut_at_samples(http_shards: str) -> None:
    # No shuffle: rank r reads positions r*27 to r*27 + 26 of the shards one after the other.
    datasets = [ShardDataset(http_shards, decode=label, rank=r, world_size=WORLD) for r in range(3)]
    assert [list(DataLoader(d, batch_size=None)) for d in datasets] == [
        list(range(0, 27)),
        list(range(27, 54)),
        [*range(54, TOTAL), 0, 1],  # padded from the epoch's start
    ]
    # Rank 1: the end of shard 2 (read from a sample's offset), shards 3 and 4 whole.
    assert datasets[1].segments() == [Segment(2, 7, 25), Segment(3, 0, 1), Segment(4, 0, 8)]
    assert datasets[1].shards() == datasets[1].urls[2:5]
    # Rank 2's 27 samples are 7 batches of 4 (the last short): 3 for worker 0, 4 for worker 1.
    assert datasets[2].segments(worker=0, num_workers=2, batch_size=4) == [
        Segment(4, 8, 11),
        Segment(5, 0, 8),
        Segment(6, 0, 1),
    ]
    assert datasets[2].segments(worker=1, num_workers=2, batch_size=4) == [
        Segment(6, 1, 14),
        Segment(0, 0, 2),
    ]


def test_shuffles_and_shards_in_flight_with_a_sample_split(http_shards: str) -> None:
    def epoch(rank: int, number: int) -> list[int]:
        dataset = ShardDataset(
            http_shards,
            decode=label,
            rank=rank,
            world_size=WORLD,
            drop_last=True,
            shuffle_shards=True,
            shuffle_buffer=10,
            shards_in_flight=3,
        )
        dataset.set_epoch(number)
        return list(DataLoader(dataset, batch_size=None))

    first = [epoch(rank, 0) for rank in range(WORLD)]
    assert [len(r) for r in first] == [26] * WORLD
    assert len({n for r in first for n in r}) == 78  # disjoint: 79 less the one dropped
    assert [epoch(rank, 0) for rank in range(WORLD)] == first  # the order is seeded
    assert [epoch(rank, 1) for rank in range(WORLD)] != first  # and new every epoch


@pytest.mark.asyncio
async def test_resampled_stays_endless_with_several_ranks(http_shards: str) -> None:
    dataset = ShardDataset(http_shards, decode=label, rank=1, world_size=WORLD, resampled=True)
    seen: Counter[int] = Counter()
    async for n in dataset:
        seen[n] += 1
        if seen.total() == 2 * TOTAL:
            break
    assert seen.total() == 2 * TOTAL and max(seen.values()) > 1
    with pytest.raises(TypeError, match="resampled"):
        len(dataset)


def test_a_split_by_shards_has_no_length(http_shards: str) -> None:
    dataset = ShardDataset(http_shards, rank=0, world_size=WORLD, split="shards")
    assert dataset.shards() == dataset.urls[0::3]
    with pytest.raises(TypeError, match="split='samples'"):
        len(dataset)
    with pytest.raises(TypeError, match="split='samples'"):
        len(DataLoader(dataset, batch_size=4))
    single = ShardDataset(http_shards)
    assert single.split == "shards"  # the default with one rank
    assert len(ShardDataset(http_shards, split="samples")) == TOTAL
    with pytest.raises(ValueError, match="split should be"):
        ShardDataset(http_shards, split="rows")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="drop_last"):
        ShardDataset(http_shards, drop_last=1)  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_indexes_load_once_also_inside_a_running_loop(http_shards: str) -> None:
    dataset = ShardDataset(http_shards, rank=2, world_size=WORLD)
    assert len(dataset) == 27  # sync, from inside this coroutine: on a helper thread
    indexes = dataset.indexes()
    assert [len(index) for index in indexes] == SIZES
    assert await dataset.load_indexes() is indexes  # kept
    assert all(isinstance(index, ShardIndex) for index in indexes)


@pytest.fixture
def copied_shards(
    object_folder: Path, http_shards: str, request: pytest.FixtureRequest
) -> Iterator[Path]:
    """A copy of the shards and their indexes for one test to damage, served over HTTP."""
    folder = object_folder / f"copy-{request.node.name}"
    shutil.copytree(object_folder / "split", folder)
    yield folder
    shutil.rmtree(folder)


def test_a_shard_without_index_file_is_indexed_by_reading_it(
    copied_shards: Path, object_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    (copied_shards / f"part-002.tar{INDEX_SUFFIX}").unlink()
    url = f"{object_server.url}/{copied_shards.name}/part-{{000..006}}.tar"
    with caplog.at_level(logging.WARNING, logger="aioload"):
        dataset = ShardDataset(url, decode=label, rank=0, world_size=WORLD)
        assert len(dataset) == 27
    assert "1 of 7 shards have no index file" in caplog.text and "part-002.tar" in caplog.text
    reference = ShardDataset(f"{object_server.url}/split/part-{{000..006}}.tar", world_size=3)
    assert dataset.indexes() == reference.indexes()  # the built index is the written one
    assert list(DataLoader(dataset, batch_size=None)) == list(range(27))


def rewrite_shard_2(folder: Path, key: str, payload: str) -> None:
    """Shard 2 written again with other samples, its old index file left beside it."""
    with ShardWriter(str(folder / "part-%03d.tar"), start_shard=2, index=False) as writer:
        for number in range(20, 45):
            writer.write({"__key__": key.format(number), "cls": number, "txt": payload})


def test_a_stale_index_is_refused(copied_shards: Path, object_server: Any) -> None:
    url = f"{object_server.url}/{copied_shards.name}/part-{{000..006}}.tar"
    # Rank 1 reads samples 7 to 24 of shard 2: one ranged read, from sample 7's offset.
    # Keys of another name but the same length and bodies: the shard keeps its size.
    rewrite_shard_2(copied_shards, "z{:05d}", "x" * 20)
    rank = ShardDataset(url, decode=label, rank=1, world_size=WORLD)
    with pytest.raises(ShardIndexError, match=r"part-002\.tar: sample 7 has key 'z00027', its"):
        list(DataLoader(rank, batch_size=None))
    # Another size: the ranged read's answer tells the shard's length, which the index knew.
    rewrite_shard_2(copied_shards, "{:06d}", "x" * 600)
    rank = ShardDataset(url, decode=label, rank=1, world_size=WORLD)
    with pytest.raises(ShardIndexError, match=r"part-002\.tar: the shard is \d+ bytes long"):
        list(DataLoader(rank, batch_size=None))


def test_a_damaged_index_file_is_refused(copied_shards: Path, object_server: Any) -> None:
    (copied_shards / f"part-004.tar{INDEX_SUFFIX}").write_bytes(b'{"format": "aioload.shard')
    url = f"{object_server.url}/{copied_shards.name}/part-{{000..006}}.tar"
    with pytest.raises(ShardIndexError, match=r"part-004\.tar\.idx\.json: bad shard index"):
        len(ShardDataset(url, rank=0, world_size=WORLD))


@pytest.mark.asyncio
async def test_write_indexes_puts_built_indexes_beside_their_shards(
    tmp_path: Path,
    s3_prefix: str,
    s3_storage_options: dict[str, Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    paths = write_shards(tmp_path, [5, 9, 2])
    prefix = s3_prefix.rsplit("/", 1)[1]
    await upload(s3_prefix.rsplit("/", 1)[0], s3_storage_options, prefix, paths, index=False)
    url = f"{s3_prefix}/part-{{000..002}}.tar"
    dataset = ShardDataset(url, rank=1, world_size=2, storage_options=s3_storage_options)
    with caplog.at_level(logging.WARNING, logger="aioload"):
        written = await dataset.write_indexes()
    assert written == [f"{u}{INDEX_SUFFIX}" for u in dataset.urls]
    assert "have no index file" not in caplog.text  # write_indexes builds them on purpose
    assert await dataset.write_indexes() == []  # all there now
    # Loaded first (built, with a warning), then written without reading the shards again.
    loaded = ShardDataset(url, rank=1, world_size=2, storage_options=s3_storage_options)
    store, _ = open_store(s3_prefix, storage_options=s3_storage_options)
    await obstore.delete_async(store, f"{prefix}/part-001.tar{INDEX_SUFFIX}")
    with caplog.at_level(logging.WARNING, logger="aioload"):
        assert len(await loaded.load_indexes()) == 3
    assert "1 of 3 shards have no index file" in caplog.text
    assert await loaded.write_indexes() == [f"{dataset.urls[1]}{INDEX_SUFFIX}"]
    again = ShardDataset(url, rank=1, world_size=2, storage_options=s3_storage_options)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="aioload"):
        assert await again.load_indexes() == dataset.indexes()
    assert "have no index file" not in caplog.text
    for path in paths:  # the same files as ShardWriter's
        written_index = Path(f"{path}{INDEX_SUFFIX}").read_bytes()
        position = [p.name for p in paths].index(path.name)
        assert again.indexes()[position].to_json() == written_index
    assert len(again) == 8
    rewritten = await again.write_indexes(overwrite=True)
    assert len(rewritten) == 3
    assert os.path.basename(rewritten[0]) == f"part-000.tar{INDEX_SUFFIX}"


def test_a_missing_shard_fails_its_index_load_naming_it(http_shards: str) -> None:
    urls = ShardDataset(http_shards).urls
    urls.insert(3, urls[0].replace("part-000", "missing"))
    dataset = ShardDataset(urls, rank=0, world_size=WORLD)
    # No index file, so the shard is read to build one: not there either. The error is the
    # store's own, not a group of them (the other loads are cancelled).
    with pytest.raises(FileNotFoundError, match=r"missing\.tar"):
        len(dataset)


def test_ranged_reads_count_their_bytes_from_the_store(
    http_shards: str, object_server: Any
) -> None:
    # Rank 1 of 3 reads the shards cut at its boundaries with ranged GETs: stats() counts
    # every byte of them, as for whole shards.
    dataset = ShardDataset(http_shards, decode=label, rank=1, world_size=3)
    dataset.indexes()  # loaded before the epoch: the index files are not the epoch's reads
    loader = DataLoader(dataset, batch_size=16, collate_fn=list)
    time.sleep(0.05)
    before = object_server.stats()["bytes"]
    assert sum(len(batch) for batch in loader) == len(dataset)
    sent = object_server.stats()["bytes"] - before
    assert loader.stats().epoch.store_bytes == sent > 0
