"""ShardWriter -> SeaweedFS -> ShardDataset: every sample exactly once, split by rank and worker."""

from __future__ import annotations

import asyncio
import collections
import io
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import obstore
import pytest

from aioload import DataLoader
from aioload.sources import (
    ShardDataset,
    ShardWriter,
    TarFormatError,
    default_decode,
    expand_urls,
    open_store,
)

SAMPLES = 120
PER_SHARD = 15  # 8 shards


def sample(i: int) -> dict[str, Any]:
    return {
        "__key__": f"{i:06d}",
        "npy": np.full(3, i, np.int64),
        "cls": i,
        "txt": f"sample {i}",
        "bin": bytes([i % 256]) * (i % 7),
    }


def key_and_label(decoded: dict[str, Any]) -> tuple[str, int]:
    """What the tests collect of a sample (module level: runs in the workers)."""
    assert decoded["npy"].tolist() == [decoded["cls"]] * 3
    assert decoded["txt"] == f"sample {decoded['cls']}"
    return decoded["__key__"], decoded["cls"]


def check_label(raw: dict[str, Any]) -> tuple[str, int]:
    return key_and_label(default_decode(raw))


@pytest.fixture(scope="module")
def shard_urls(
    tmp_path_factory: pytest.TempPathFactory, seaweedfs: Any, s3_storage_options: dict[str, Any]
) -> str:
    """8 shards of 15 samples in SeaweedFS; the brace pattern that names them."""
    folder = tmp_path_factory.mktemp("shards")
    with ShardWriter(str(folder / "train-%04d.tar"), maxcount=PER_SHARD) as writer:
        for i in range(SAMPLES):
            writer.write(sample(i))
    assert len(writer.shards) == SAMPLES // PER_SHARD
    store, _ = open_store(seaweedfs.url, storage_options=s3_storage_options)

    async def upload() -> None:
        await asyncio.gather(
            *(
                obstore.put_async(store, f"shards/{os.path.basename(p)}", Path(p).read_bytes())
                for p in writer.shards
            )
        )

    asyncio.run(upload())
    return f"{seaweedfs.url}/shards/train-{{0000..0007}}.tar"


def labels(loader: DataLoader) -> list[int]:
    return [label for batch in loader for _, label in batch]


@pytest.mark.parametrize("workers", [0, 2])
def test_every_sample_once_per_epoch(
    shard_urls: str, s3_storage_options: dict[str, Any], workers: int
) -> None:
    dataset = ShardDataset(shard_urls, decode=check_label, storage_options=s3_storage_options)
    loader = DataLoader(dataset, batch_size=16, num_workers=workers, collate_fn=list)
    assert sorted(labels(loader)) == list(range(SAMPLES))


@pytest.mark.parametrize("workers", [0, 2])
def test_shards_in_flight_take_samples_in_turn(
    shard_urls: str, s3_storage_options: dict[str, Any], workers: int
) -> None:
    dataset = ShardDataset(
        shard_urls, decode=check_label, shards_in_flight=3, storage_options=s3_storage_options
    )
    loader = DataLoader(dataset, batch_size=16, num_workers=workers, collate_fn=list)
    first = labels(loader)
    assert sorted(first) == list(range(SAMPLES))
    assert labels(loader) == first  # the order does not depend on timing
    if workers == 0:
        # One sample from each of shards 0, 1, 2 in turn; shard 3 takes the place of the first
        # shard that runs dry.
        assert first[:6] == [0, 15, 30, 1, 16, 31]
        assert first[45:48] == [45, 60, 75]


def test_shards_in_flight_raise_a_failed_shard_in_its_place(
    shard_urls: str, s3_storage_options: dict[str, Any]
) -> None:
    urls = expand_urls(shard_urls)
    urls.insert(2, urls[0].replace("train-0000", "missing"))
    dataset = ShardDataset(
        urls, decode=check_label, shards_in_flight=2, storage_options=s3_storage_options
    )
    seen: list[int] = []
    with pytest.raises(FileNotFoundError, match=r"missing\.tar"):
        for batch in DataLoader(dataset, batch_size=1, collate_fn=list):
            seen += [label for _, label in batch]
    # Shards 0 and 1 in turn, until the missing shard's turn.
    assert seen[:2] == [0, 15]
    with pytest.raises(ValueError, match="shards_in_flight"):
        ShardDataset(urls, shards_in_flight=0, storage_options=s3_storage_options)


def test_two_ranks_split_the_shards(
    shard_urls: str, s3_storage_options: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[int] = []
    for rank in range(2):
        # As torchrun sets them; the dataset reads them at construction.
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        dataset = ShardDataset(
            shard_urls, decode=check_label, shuffle_shards=True, storage_options=s3_storage_options
        )
        assert (dataset.rank, dataset.world_size) == (rank, 2)
        dataset.set_epoch(3)
        got = labels(DataLoader(dataset, batch_size=8, num_workers=2, collate_fn=list))
        assert len(got) == SAMPLES // 2  # 4 of the 8 shards each
        seen += got
    assert sorted(seen) == list(range(SAMPLES))


@pytest.mark.asyncio
async def test_shuffles_are_seeded_per_epoch(
    shard_urls: str, s3_storage_options: dict[str, Any]
) -> None:
    def dataset(seed: int) -> ShardDataset:
        return ShardDataset(
            shard_urls,
            shuffle_shards=True,
            shuffle_buffer=20,
            seed=seed,
            decode=check_label,
            storage_options=s3_storage_options,
        )

    async def epoch(data: ShardDataset, number: int) -> list[int]:
        data.set_epoch(number)
        return [label async for _, label in data]

    first, again, other_seed = dataset(5), dataset(5), dataset(6)
    order = await epoch(first, 0)
    assert sorted(order) == list(range(SAMPLES))
    assert order != list(range(SAMPLES))
    assert await epoch(again, 0) == order
    assert await epoch(other_seed, 0) != order
    next_epoch = await epoch(first, 1)
    assert next_epoch != order and sorted(next_epoch) == list(range(SAMPLES))


@pytest.mark.asyncio
async def test_resampled_is_endless(shard_urls: str, s3_storage_options: dict[str, Any]) -> None:
    dataset = ShardDataset(
        shard_urls, resampled=True, decode=check_label, storage_options=s3_storage_options
    )
    counts: collections.Counter[int] = collections.Counter()
    async for _, label in dataset:
        counts[label] += 1
        if counts.total() == 3 * SAMPLES:
            break
    assert counts.total() == 3 * SAMPLES and set(counts) <= set(range(SAMPLES))
    assert max(counts.values()) > 1  # drawn with replacement


def test_writer_rotates_and_writes_readable_tars(tmp_path: Path) -> None:
    pattern = str(tmp_path / "out" / "s-%03d.tar")
    big = np.zeros(3000, np.uint8)
    with ShardWriter(pattern, maxcount=100, maxsize=11_000) as writer:
        for i in range(6):
            writer.write({"__key__": f"k{i}", "npy": big, "json": {"i": i}})
    # Each sample takes 5 KiB of tar (headers and padding included): two per shard.
    assert [os.path.basename(p) for p in writer.shards] == ["s-000.tar", "s-001.tar", "s-002.tar"]
    with tarfile.open(writer.shards[0]) as tar:
        assert tar.getnames() == ["k0.npy", "k0.json", "k1.npy", "k1.json"]
        member = tar.extractfile("k0.npy")
        assert member is not None
        assert np.array_equal(np.load(io.BytesIO(member.read())), big)
    with pytest.raises(ValueError, match="__key__"):
        ShardWriter(str(tmp_path / "x-%d.tar")).write({"cls": 1})
    with pytest.raises(ValueError, match="dot"):
        ShardWriter(str(tmp_path / "x-%d.tar")).write({"__key__": "a.b", "cls": 1})
    with pytest.raises(ValueError, match="%d"):
        ShardWriter(str(tmp_path / "fixed.tar"))


@pytest.mark.asyncio
async def test_long_names_and_a_truncated_shard(tmp_path: Path) -> None:
    deep = "/".join(["folder"] * 30)  # a member name past tar's 100 characters
    with ShardWriter(str(tmp_path / "long-%d.tar")) as writer:
        writer.write({"__key__": f"{deep}/0001", "txt": "deep", "cls": 1})
        writer.write({"__key__": f"{deep}/0002", "txt": "deeper", "cls": 2})
    url = Path(writer.shards[0]).as_uri()
    samples = [s async for s in ShardDataset(url, decode=default_decode)]
    assert [(s["__key__"], s["txt"], s["cls"]) for s in samples] == [
        (f"{deep}/0001", "deep", 1),
        (f"{deep}/0002", "deeper", 2),
    ]
    truncated = tmp_path / "cut.tar"
    truncated.write_bytes(Path(writer.shards[0]).read_bytes()[:1500])
    with pytest.raises(TarFormatError, match=r"cut\.tar"):
        [s async for s in ShardDataset(truncated.as_uri())]


def test_brace_patterns() -> None:
    assert expand_urls("s3://b/a-{08..11}.tar") == [f"s3://b/a-{i:02d}.tar" for i in (8, 9, 10, 11)]
    assert expand_urls(["file:///x/{1..2}-{0..1}.tar"]) == [
        "file:///x/1-0.tar",
        "file:///x/1-1.tar",
        "file:///x/2-0.tar",
        "file:///x/2-1.tar",
    ]
    with pytest.raises(ValueError, match="rank"):
        ShardDataset("file:///x/a.tar", rank=2, world_size=2)


@pytest.mark.parametrize("in_flight", [1, 4])
@pytest.mark.parametrize("workers", [0, 2])
def test_stopping_early_closes_quietly(
    slow_shards: Any, workers: int, in_flight: int, capfd: pytest.CaptureFixture[str]
) -> None:
    # Slow reads (50 ms each): the epoch ends with shard streams in the middle of a read.
    url = slow_shards.url + "/quiet/q-{000..015}.tar"
    dataset = ShardDataset(url, shards_in_flight=in_flight)
    loader = DataLoader(dataset, batch_size=2, num_workers=workers, collate_fn=list)
    iterator = iter(loader)
    assert len(next(iterator)) == 2
    iterator.close()
    assert "Traceback" not in capfd.readouterr().err


@pytest.fixture
def slow_shards(object_folder: Path, object_server: Any) -> Iterator[Any]:
    """The object server with 16 small shards under quiet/, answering after 50 ms."""
    with ShardWriter(str(object_folder / "quiet" / "q-%03d.tar"), maxcount=2) as writer:
        for i in range(32):
            writer.write({"__key__": f"{i:04d}", "cls": i})
    object_server.configure(latency=0.05)
    yield object_server
    object_server.configure(latency=0.002)
