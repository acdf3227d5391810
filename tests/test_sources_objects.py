"""ObjectDataset and its listing sampler against SeaweedFS and the ObjectServer."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import obstore
import pytest
from servers import OBJECT_SIZE, OBJECTS, object_bytes

from aioload import DataLoader
from aioload.sources import ObjectDataset, ObjectListing, open_store
from aioload.testing import ObjectServer


def decode_number(data: Any) -> tuple[int, int]:
    """The object's number, and the process that decoded it (module level: pickled)."""
    return int.from_bytes(bytes(data[:4]), "little"), os.getpid()


def first_word(data: Any) -> np.ndarray:
    return np.frombuffer(bytes(data[:4]), np.uint32).copy()


async def put_objects(url: str, options: dict[str, Any], keys: list[str]) -> None:
    store, prefix = open_store(url, storage_options=options)
    await asyncio.gather(
        *(
            obstore.put_async(store, f"{prefix}/{key}", object_bytes(i))
            for i, key in enumerate(keys)
        )
    )


@pytest.mark.asyncio
async def test_keys_given_through_loader_in_order(
    s3_prefix: str, s3_storage_options: dict[str, Any]
) -> None:
    keys = [f"img/{i:04d}.bin" for i in range(40)]
    await put_objects(s3_prefix, s3_storage_options, keys)
    dataset = ObjectDataset(s3_prefix, keys, decode=first_word, storage_options=s3_storage_options)
    assert len(dataset) == 40
    loader = DataLoader(dataset, batch_size=16)
    batches = [batch async for batch in loader]
    assert [len(b) for b in batches] == [16, 16, 8]
    assert np.concatenate(batches).ravel().tolist() == list(range(40))
    # Without decode an item is the object's bytes; a str key reads that object.
    raw = ObjectDataset(s3_prefix, keys, storage_options=s3_storage_options)
    assert await raw["img/0003.bin"] == object_bytes(3)
    assert await raw[3] == object_bytes(3)


@pytest.mark.asyncio
async def test_listing_is_an_async_sampler_with_prefix(
    s3_prefix: str, s3_storage_options: dict[str, Any]
) -> None:
    keys = [f"a/{i:03d}.bin" for i in range(25)] + ["b/000.bin", "ab/000.bin"]
    await put_objects(s3_prefix, s3_storage_options, keys)
    dataset = ObjectDataset(s3_prefix + "/", prefix="a/", storage_options=s3_storage_options)
    listing = dataset.listing(chunk_size=7)
    assert isinstance(listing, ObjectListing)
    assert await listing.collect() == keys[:25]
    # A prefix may end inside a path segment: "a" matches "a/..." and "ab/...".
    assert sorted(await dataset.listing("a").collect()) == sorted([*keys[:25], "ab/000.bin"])
    loader = DataLoader(dataset, sampler=dataset.listing(), batch_size=10, collate_fn=list)
    numbers = [n for batch in [b async for b in loader] for n in batch]
    assert numbers == [object_bytes(i) for i in range(25)]
    with pytest.raises(TypeError, match=r"listing\(\)"):
        len(dataset)


def test_listing_sampler_with_worker_processes(
    s3_prefix: str, s3_storage_options: dict[str, Any]
) -> None:
    keys = [f"{i:04d}.bin" for i in range(60)]
    asyncio.run(put_objects(s3_prefix, s3_storage_options, keys))
    dataset = ObjectDataset(s3_prefix, decode=decode_number, storage_options=s3_storage_options)
    loader = DataLoader(
        dataset, sampler=dataset.listing(), batch_size=8, num_workers=2, collate_fn=list
    )
    samples = [sample for batch in loader for sample in batch]
    assert sorted(number for number, _ in samples) == list(range(60))
    pids = {pid for _, pid in samples}
    assert os.getpid() not in pids and len(pids) == 2  # decoded in the two workers


class CountingSampler:
    """Passes a listing's keys on and counts them: how far the listing got."""

    def __init__(self, listing: ObjectListing) -> None:
        self.listing = listing
        self.drawn = 0
        self.finished = False

    async def __aiter__(self) -> AsyncIterator[str]:
        async for key in self.listing:
            self.drawn += 1
            yield key
        self.finished = True


@pytest.mark.asyncio
async def test_listing_yields_before_it_ends(tmp_path: Path) -> None:
    # A file:// store lists lazily, page by page, like a bucket with millions of keys.
    total = 1500
    for i in range(total):
        (tmp_path / f"{i:05d}.bin").write_bytes(object_bytes(i))
    dataset = ObjectDataset(tmp_path.as_uri(), decode=decode_number)
    sampler = CountingSampler(dataset.listing(chunk_size=50))
    loader = DataLoader(dataset, sampler=sampler, batch_size=10, collate_fn=list)
    iterator = aiter(loader)
    first = await anext(iterator)
    assert len(first) == 10 and all(number < total for number, _ in first)
    assert not sampler.finished and sampler.drawn < total // 2
    await iterator.aclose()  # type: ignore[attr-defined]


@pytest.mark.asyncio
async def test_byte_ranges_over_http(object_server: Any) -> None:
    url = object_server.url + "/objects/"
    whole = object_bytes(7)
    dataset = ObjectDataset(url, byte_range=(0, 4))
    assert await dataset["00007.bin"] == whole[:4]
    assert await ObjectDataset(url, byte_range=(4000, None))["00007.bin"] == whole[4000:]
    assert await ObjectDataset(url, byte_range=(-10, None))["00007.bin"] == whole[-10:]
    # A key of its own range: (key, start, end).
    assert await ObjectDataset(url)[("00007.bin", 10, 20)] == whole[10:20]
    with pytest.raises(ValueError, match="start < end"):
        ObjectDataset(url, byte_range=(5, 5))


@pytest.mark.parametrize("workers", [0, 2])
def test_latency_bound_reads_overlap(object_folder: Path, workers: int) -> None:
    # 200 objects behind 20 ms each: one at a time would take 4 s. The reads of a batch (32)
    # are in flight together, and the window's next batches' with them: the server, a fresh
    # one for this loader alone, sees at least a batch's worth of requests at once.
    keys = [f"{i:05d}.bin" for i in range(OBJECTS)]
    with ObjectServer(object_folder, latency=0.02) as server:
        dataset = ObjectDataset(server.url + "/objects", keys, decode=first_word)
        loader = DataLoader(dataset, batch_size=32, num_workers=workers)
        numbers = np.concatenate([batch.ravel() for batch in loader])
        stats = server.stats()
    assert numbers.tolist() == list(range(OBJECTS))
    assert stats["requests"] == OBJECTS
    assert stats["most_in_flight"] >= 32, stats


@pytest.mark.asyncio
async def test_store_object_and_memory_store() -> None:
    store, _ = open_store("memory:///")
    for i in range(5):
        obstore.put(store, f"x/{i}.bin", object_bytes(i))
    dataset = ObjectDataset(store, [f"x/{i}.bin" for i in range(5)])
    loader = DataLoader(dataset, batch_size=5, collate_fn=list)
    assert [b async for b in loader] == [[object_bytes(i) for i in range(5)]]
    assert len(object_bytes(0)) == OBJECT_SIZE
    # Worker processes would each get an empty memory store: refused clearly.
    with pytest.raises(TypeError, match="MemoryStore"):
        [b async for b in DataLoader(dataset, batch_size=5, num_workers=1)]


def test_credentials_from_the_environment_reach_the_workers(
    s3_prefix: str, s3_storage_options: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = [f"{i:04d}.bin" for i in range(16)]
    asyncio.run(put_objects(s3_prefix, s3_storage_options, keys))
    # Set after the fork server may have started: the workers still see them.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_storage_options["access_key_id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_storage_options["secret_access_key"])
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_storage_options["endpoint"])
    monkeypatch.setenv("AWS_REGION", s3_storage_options["region"])
    dataset = ObjectDataset(s3_prefix, keys, decode=decode_number)
    loader = DataLoader(dataset, batch_size=4, num_workers=2, collate_fn=list)
    assert sorted(number for batch in loader for number, _ in batch) == list(range(16))
