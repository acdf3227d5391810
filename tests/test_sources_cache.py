"""The local cache of ShardDataset and ObjectDataset: requests counted on the ObjectServer,
the limit, sharing between processes, crashes, and SeaweedFS."""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from aioload import DataLoader
from aioload.sources import (
    LocalCache,
    ObjectDataset,
    ShardDataset,
    ShardWriter,
    default_decode,
    parse_size,
)
from aioload.sources.cache.folder import CacheFolder
from aioload.sources.cache.local import entry_identity
from aioload.stats.source_counts import SourceCounter, SourceCounts
from aioload.testing import ObjectServer

SHARDS = 8
PER_SHARD = 15
SAMPLES = SHARDS * PER_SHARD
PAYLOAD = 4096


def label(sample: dict[str, Any]) -> int:
    """A sample's label, its payload checked (module level: runs in the workers)."""
    decoded = default_decode(sample)
    assert decoded["bin"] == bytes([decoded["cls"] % 251]) * PAYLOAD
    number: int = decoded["cls"]
    return number


@pytest.fixture(scope="module")
def shard_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cached")
    with ShardWriter(str(root / "shards" / "s-%03d.tar"), maxcount=PER_SHARD) as writer:
        for i in range(SAMPLES):
            writer.write({"__key__": f"{i:05d}", "cls": i, "bin": bytes([i % 251]) * PAYLOAD})
    assert len(writer.shards) == SHARDS
    objects = root / "objects"
    objects.mkdir()
    for i in range(40):
        (objects / f"{i:03d}.bin").write_bytes(bytes([i]) * 1000)
    return root


@pytest.fixture(scope="module")
def server(shard_folder: Path) -> Iterator[ObjectServer]:
    with ObjectServer(shard_folder, latency=0.002) as running:
        yield running


def shard_size(folder: Path) -> int:
    return (folder / "shards" / "s-000.tar").stat().st_size


def requests(server: ObjectServer) -> int:
    return server.stats()["requests"]


def folder_bytes(folder: Path) -> int:
    """What the cache's files take, as their sizes say (a partial file counts in full)."""
    total = 0
    for name in os.listdir(folder):
        try:
            total += (folder / name).stat().st_size
        except FileNotFoundError:
            pass  # renamed or removed while we looked
    return total - (folder / ".aioload-cache").stat().st_size


def urls(server: ObjectServer) -> str:
    return server.url + f"/shards/s-{{000..{SHARDS - 1:03d}}}.tar"


# -- sizes and arguments ---------------------------------------------------------------


def test_sizes_are_parsed_and_bad_ones_refused(tmp_path: Path) -> None:
    assert parse_size("50GB") == 50 * 10**9
    assert parse_size("512MiB") == 512 * 2**20
    assert parse_size("1.5 GB") == 1_500_000_000
    assert parse_size("1.1mb") == 1_100_000
    assert parse_size(4096) == 4096
    for bad in ("", "GB", "12 parsecs", "-1GB", "1e9", "5 G"):
        with pytest.raises(ValueError, match=r"cache_limit should be .*MiB"):
            ShardDataset("file:///x/a.tar", cache_dir=tmp_path, cache_limit=bad)
    for bad_type in (1.5, True, [1]):
        with pytest.raises(TypeError, match="cache_limit should be an int of bytes"):
            ObjectDataset("file:///x/", cache_dir=tmp_path, cache_limit=bad_type)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least 1 byte"):
        ShardDataset("file:///x/a.tar", cache_dir=tmp_path, cache_limit=0)
    with pytest.raises(ValueError, match="without cache_dir"):
        ShardDataset("file:///x/a.tar", cache_limit="1GB")
    dataset = ShardDataset("file:///x/a.tar", cache_dir=tmp_path / "new", cache_limit="2 KiB")
    assert dataset.cache is not None and dataset.cache.limit == 2048
    assert (tmp_path / "new").is_dir()


def test_counters_pickle_empty() -> None:
    counter = SourceCounter()
    counter.hit()
    counter.received(10)
    assert pickle.loads(pickle.dumps(counter)).take() is None
    assert counter.take() == SourceCounts(1, 0, 10)
    assert counter.take() is None
    assert SourceCounts(1, 2, 3) + SourceCounts(1, 1, 1) == SourceCounts(2, 3, 4)


# -- ShardDataset against the ObjectServer -----------------------------------------------


@pytest.mark.parametrize("workers", [0, 2])
def test_epoch_two_sends_no_request_for_cached_shards(
    server: ObjectServer, shard_folder: Path, tmp_path: Path, workers: int
) -> None:
    dataset = ShardDataset(urls(server), decode=label, cache_dir=tmp_path, cache_limit="1GB")
    loader = DataLoader(dataset, batch_size=PER_SHARD, num_workers=workers, collate_fn=list)
    size = shard_size(shard_folder)
    before = requests(server)
    assert sorted(n for batch in loader for n in batch) == list(range(SAMPLES))
    assert requests(server) - before == SHARDS  # one GET per shard
    first = loader.stats().epoch
    assert (first.cache_hits, first.cache_misses) == (0, SHARDS)
    assert first.store_bytes == SHARDS * size
    assert folder_bytes(tmp_path) == SHARDS * size
    for _ in range(2):
        before = requests(server)
        assert sorted(n for batch in loader for n in batch) == list(range(SAMPLES))
        assert requests(server) == before  # not one request
        again = loader.stats().epoch
        assert (again.cache_hits, again.cache_misses, again.store_bytes) == (SHARDS, 0, 0)
    total = loader.stats().total
    assert (total.cache_hits, total.cache_misses) == (2 * SHARDS, SHARDS)
    assert "cache hits 8, misses 0" in str(loader.stats())


def test_ranks_splitting_shards_by_samples_read_their_share_from_the_cache(
    server: ObjectServer, tmp_path: Path
) -> None:
    # 120 samples over 3 ranks: 40 each, so shards are cut between ranks. Through a cache a
    # cut shard is read whole (and kept); each rank still yields exactly its own samples.
    shares = []
    for rank in range(3):
        dataset = ShardDataset(
            urls(server), decode=label, rank=rank, world_size=3, cache_dir=tmp_path / str(rank)
        )
        loader = DataLoader(dataset, batch_size=8, collate_fn=list)
        first = [n for batch in loader for n in batch]
        before = requests(server)
        assert [n for batch in loader for n in batch] == first
        assert requests(server) == before  # the second epoch from the cache alone
        assert len(first) == len(dataset) == SAMPLES // 3
        shares.append(first)
    assert sorted(n for share in shares for n in share) == list(range(SAMPLES))


@pytest.mark.parametrize("workers", [0, 2])
def test_the_limit_holds_with_a_cache_smaller_than_the_set(
    server: ObjectServer, shard_folder: Path, tmp_path: Path, workers: int
) -> None:
    size = shard_size(shard_folder)
    limit = 3 * size + size // 2  # three and a half shards of eight
    dataset = ShardDataset(
        urls(server), decode=label, shards_in_flight=2, cache_dir=tmp_path, cache_limit=limit
    )
    loader = DataLoader(dataset, batch_size=5, num_workers=workers, collate_fn=list)
    for epoch in range(3):
        seen = []
        for batch in loader:
            seen += batch
            assert folder_bytes(tmp_path) <= limit  # partial downloads included
        assert sorted(seen) == list(range(SAMPLES))
        stats = loader.stats().epoch
        assert stats.cache_hits + stats.cache_misses == SHARDS
        assert stats.store_bytes == stats.cache_misses * size
        if epoch == 0:
            assert stats.cache_misses == SHARDS
    assert 0 < folder_bytes(tmp_path) <= limit
    assert dataset.cache is not None and dataset.cache.usage() == folder_bytes(tmp_path)
    left = [name for name in os.listdir(tmp_path) if not name.endswith((".data", "-cache"))]
    assert left == []  # no partial or lock file once the readers are done


def test_least_recently_used_goes_first(server: ObjectServer, tmp_path: Path) -> None:
    keys = [f"{i:03d}.bin" for i in range(4)]
    # Room for two objects of 1000 bytes, and for the little an eviction frees beyond that.
    dataset = ObjectDataset(server.url + "/objects/", keys, cache_dir=tmp_path, cache_limit=2100)

    async def read(*indices: int) -> None:
        for index in indices:
            assert await dataset[index] == bytes([index]) * 1000
            await asyncio.sleep(0.03)  # past the file system's clock tick: the order is clear

    asyncio.run(read(0, 1, 0, 2))  # 1 is the least recently used when 2 needs room
    cached = sorted(name.split("-", 2)[2] for name in os.listdir(tmp_path) if ".data" in name)
    assert cached == ["000.bin.data", "002.bin.data"]
    before = requests(server)
    asyncio.run(read(0, 2))
    assert requests(server) == before


def test_an_entry_being_read_is_never_evicted(tmp_path: Path) -> None:
    folder = CacheFolder(str(tmp_path), 1000)
    first, second = folder.files("a", "a"), folder.files("b", "b")
    for files in (first, second):
        lock = folder.lock_entry(files)
        assert lock is not None
        part = folder.reserve(files, 400)
        assert part is not None
        os.pwrite(part, b"x" * 400, 0)
        os.close(part)
        folder.commit(files)
        folder.unlock_entry(files, lock)
    reading = folder.open_entry(first)
    assert reading is not None
    other = folder.open_entry(second)
    assert other is not None
    third = folder.files("c", "c")
    lock = folder.lock_entry(third)
    assert lock is not None
    assert folder.reserve(third, 400) is None  # both entries are being read: no room
    os.close(other)
    part = folder.reserve(third, 400)  # "b" is free to go now, "a" is still being read
    assert part is not None
    os.close(part)
    assert os.path.exists(first.data) and not os.path.exists(second.data)
    assert folder.usage() == 800
    folder.abandon(third, 400)
    folder.unlock_entry(third, lock)
    os.close(reading)
    assert folder.usage() == 400


def test_a_crash_mid_download_leaves_nothing_corrupt(
    server: ObjectServer, shard_folder: Path, tmp_path: Path
) -> None:
    # A process that dies while writing a shard into the cache: half a .part, its lock file.
    size = shard_size(shard_folder)
    url = server.url + "/shards/s-000.tar"
    script = textwrap.dedent(
        f"""
        import os

        from aioload.sources import ShardDataset
        from aioload.sources.cache.local import entry_identity
        dataset = ShardDataset({url!r}, cache_dir={str(tmp_path)!r}, cache_limit={10 * size})
        folder = dataset.cache._folder
        location = dataset._objects[0][0]
        files = folder.files(entry_identity({url!r}, location), "s-000.tar")
        assert folder.lock_entry(files) is not None
        part = folder.reserve(files, {size})
        os.pwrite(part, b"garbage" * 100, 0)
        os._exit(3)
        """
    )
    crashed = subprocess.run([sys.executable, "-c", script], timeout=30, env=_env())
    assert crashed.returncode == 3
    assert any(name.endswith(".part") for name in os.listdir(tmp_path))
    dataset = ShardDataset(url, decode=label, cache_dir=tmp_path, cache_limit=10 * size)

    async def epoch() -> list[int]:
        return [n async for n in dataset]

    # The half-written file is not taken for the shard: it is read from the store again.
    before = requests(server)
    assert asyncio.run(epoch()) == list(range(PER_SHARD))
    assert requests(server) == before + 1
    assert asyncio.run(epoch()) == list(range(PER_SHARD))
    assert requests(server) == before + 1
    assert dataset.cache is not None and dataset.cache.usage() == size  # stale part gone
    assert sorted(name.rsplit(".", 1)[1] for name in os.listdir(tmp_path)) == [
        "aioload-cache",
        "data",
    ]


def test_one_process_reading_a_shard_twice_downloads_it_once(
    server: ObjectServer, tmp_path: Path
) -> None:
    # Two datasets on one folder, in one loop: the second waits for the first's download.
    def make() -> ShardDataset:
        return ShardDataset(urls(server), decode=label, cache_dir=tmp_path)

    first, second = make(), make()

    async def both() -> tuple[list[int], list[int]]:
        async def read(dataset: ShardDataset) -> list[int]:
            return [n async for n in dataset]

        a, b = await asyncio.gather(read(first), read(second))
        return a, b

    before = requests(server)
    a, b = asyncio.run(both())
    assert a == b == list(range(SAMPLES))
    assert requests(server) - before == SHARDS
    counts = [d.take_source_counts() for d in (first, second)]
    assert sum(c.cache_misses for c in counts if c) == SHARDS
    assert sum(c.cache_hits for c in counts if c) == SHARDS


def test_a_full_disk_falls_back_to_the_store(
    server: ObjectServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aioload.sources.cache import local as cache_module

    def full(fd: int, data: Any, offset: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cache_module, "_write_all", full)
    dataset = ShardDataset(urls(server), decode=label, cache_dir=tmp_path, cache_limit="1MB")
    assert [n for batch in DataLoader(dataset, batch_size=7) for n in batch] == list(range(SAMPLES))
    assert dataset.cache is not None and dataset.cache.usage() == 0
    objects = ObjectDataset(server.url + "/objects/", ["001.bin"], cache_dir=tmp_path)
    assert asyncio.run(objects[0]) == bytes([1]) * 1000


@pytest.mark.slow
def test_two_processes_started_together_read_each_shard_once(
    shard_folder: Path, tmp_path: Path
) -> None:
    # Slow answers (20 ms): both processes ask for every shard while the other downloads it.
    script = textwrap.dedent(
        """
        import asyncio, json, sys
        from aioload.sources import ShardDataset
        dataset = ShardDataset(sys.argv[1], cache_dir=sys.argv[2], cache_limit="1GB",
                               shards_in_flight=2)
        print("ready", flush=True)
        sys.stdin.readline()  # go: both processes start at once

        async def main():
            return [int(s["cls"]) async for s in dataset]
        labels = asyncio.run(main())
        print(json.dumps({"labels": labels, "counts": dataset.take_source_counts()}), flush=True)
        """
    )
    with ObjectServer(shard_folder, latency=0.02) as slow:
        processes = [
            subprocess.Popen(
                [sys.executable, "-c", script, urls(slow), str(tmp_path)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=_env(),
            )
            for _ in range(2)
        ]
        try:
            for process in processes:
                assert process.stdout is not None and process.stdout.readline() == "ready\n"
            before = requests(slow)
            for process in processes:
                assert process.stdin is not None
                process.stdin.write("go\n")
                process.stdin.flush()
            results = [json.loads(process.communicate(timeout=40)[0]) for process in processes]
        finally:
            for process in processes:
                if process.poll() is None:
                    process.kill()
                    process.wait()
        assert requests(slow) - before == SHARDS  # each shard from the store once
    for result in results:
        assert sorted(result["labels"]) == list(range(SAMPLES))
    hits, misses, store_bytes = (sum(r["counts"][i] for r in results) for i in range(3))
    assert (hits, misses) == (SHARDS, SHARDS)
    assert store_bytes == SHARDS * shard_size(shard_folder)


@pytest.mark.parametrize(
    "context", ["fork", "forkserver", pytest.param("spawn", marks=pytest.mark.slow)]
)
def test_workers_share_the_cache_under_every_start_method(
    server: ObjectServer, tmp_path: Path, context: str
) -> None:
    # In a fresh process: a worker forked from one whose obstore client has run would hang
    # (its runtime's threads do not survive a fork), whatever the cache does.
    script = textwrap.dedent(
        """
        import json, sys
        from aioload import DataLoader
        from aioload.sources import ShardDataset

        def main():
            dataset = ShardDataset(sys.argv[1], cache_dir=sys.argv[2], cache_limit="1GB")
            loader = DataLoader(dataset, batch_size=15, num_workers=2, collate_fn=list,
                                multiprocessing_context=sys.argv[3], persistent_workers=True,
                                timeout=30)
            try:
                for epoch in range(2):
                    labels = sorted(int(s["cls"]) for batch in loader for s in batch)
                    stats = loader.stats().epoch
                    print(json.dumps([labels, stats.cache_hits, stats.cache_misses]), flush=True)
                    sys.stdin.readline()  # the test has counted the epoch's requests
            finally:
                loader.close()

        if __name__ == "__main__":
            main()
        """
    )
    path = tmp_path / "start_method.py"
    path.write_text(script)
    cache = tmp_path / "cache"
    process = subprocess.Popen(
        [sys.executable, str(path), urls(server), str(cache), context],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    assert process.stdin is not None and process.stdout is not None
    try:
        before = requests(server)
        for epoch in range(2):
            labels, hits, misses = json.loads(process.stdout.readline())
            assert labels == list(range(SAMPLES))
            assert (hits, misses) == ((0, SHARDS) if epoch == 0 else (SHARDS, 0))
            assert requests(server) - before == SHARDS  # none in epoch 2
            process.stdin.write("next\n")
            process.stdin.flush()
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stdin.close()
        process.stdout.close()


# -- ObjectDataset ----------------------------------------------------------------------


@pytest.mark.parametrize("workers", [0, 2])
def test_objects_are_read_from_the_cache_in_later_epochs(
    server: ObjectServer, tmp_path: Path, workers: int
) -> None:
    keys = [f"{i:03d}.bin" for i in range(40)]
    dataset = ObjectDataset(
        server.url + "/objects/", keys, decode=first_byte, cache_dir=tmp_path, cache_limit="1MiB"
    )
    loader = DataLoader(dataset, batch_size=8, num_workers=workers, collate_fn=list)
    before = requests(server)
    assert [n for batch in loader for n in batch] == list(range(40))
    assert requests(server) - before == 40
    first = loader.stats().epoch
    assert (first.cache_hits, first.cache_misses, first.store_bytes) == (0, 40, 40_000)
    before = requests(server)
    assert [n for batch in loader for n in batch] == list(range(40))
    assert requests(server) == before
    again = loader.stats().epoch
    assert (again.cache_hits, again.cache_misses, again.store_bytes) == (40, 0, 0)
    # A byte range is an entry of its own.
    ranged = ObjectDataset(server.url + "/objects/", keys, byte_range=(10, 20), cache_dir=tmp_path)
    assert asyncio.run(ranged[3]) == bytes([3]) * 10
    before = requests(server)
    assert asyncio.run(ranged[3]) == bytes([3]) * 10
    assert requests(server) == before


def first_byte(data: Any) -> int:
    return int(bytes(data[:1])[0])


def test_store_bytes_are_counted_without_a_cache(server: ObjectServer, shard_folder: Path) -> None:
    dataset = ShardDataset(urls(server), decode=label)
    loader = DataLoader(dataset, batch_size=10, num_workers=2, collate_fn=list)
    assert sorted(n for batch in loader for n in batch) == list(range(SAMPLES))
    stats = loader.stats().epoch
    assert (stats.cache_hits, stats.cache_misses) == (0, 0)
    assert stats.store_bytes == SHARDS * shard_size(shard_folder)
    assert "cache hits 0, misses 0" in str(loader.stats())


# -- SeaweedFS ------------------------------------------------------------------------


def test_seaweedfs_shards_and_objects_through_the_cache(
    s3_prefix: str, s3_storage_options: dict[str, Any], shard_folder: Path, tmp_path: Path
) -> None:
    import obstore

    from aioload.sources import open_store

    store, prefix = open_store(s3_prefix, storage_options=s3_storage_options)

    async def upload() -> None:
        for path in sorted((shard_folder / "shards").iterdir()):
            await obstore.put_async(store, f"{prefix}/shards/{path.name}", path.read_bytes())
        await obstore.put_async(store, f"{prefix}/objects/a.npy", _npy(np.arange(5)))

    asyncio.run(upload())
    dataset = ShardDataset(
        f"{s3_prefix}/shards/s-{{000..{SHARDS - 1:03d}}}.tar",
        decode=label,
        cache_dir=tmp_path,
        cache_limit="10MB",
        storage_options=s3_storage_options,
    )
    loader = DataLoader(dataset, batch_size=PER_SHARD, num_workers=2, collate_fn=list)
    for epoch in range(2):
        assert sorted(n for batch in loader for n in batch) == list(range(SAMPLES))
        stats = loader.stats().epoch
        expected = (0, SHARDS) if epoch == 0 else (SHARDS, 0)
        assert (stats.cache_hits, stats.cache_misses) == expected
        assert (stats.store_bytes > 0) == (epoch == 0)
    objects = ObjectDataset(
        f"{s3_prefix}/objects/",
        ["a.npy"],
        decode={},
        cache_dir=tmp_path,
        storage_options=s3_storage_options,
    )
    for _ in range(2):
        assert asyncio.run(objects[0]).tolist() == [0, 1, 2, 3, 4]
    counts = objects.take_source_counts()
    assert counts is not None and (counts.cache_hits, counts.cache_misses) == (1, 1)
    # Entries are named by the URL and the store's endpoint: another endpoint, other entries.
    assert len([name for name in os.listdir(tmp_path) if name.endswith(".data")]) == SHARDS + 1
    assert LocalCache(tmp_path).usage() == folder_bytes(tmp_path)


def _npy(array: np.ndarray) -> bytes:
    import io

    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def _env() -> dict[str, str]:
    """The environment of a child Python process, with this checkout importable."""
    root = str(Path(__file__).resolve().parent.parent)
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": root if not path else f"{root}{os.pathsep}{path}"}


def test_waiting_gives_up_on_a_writer_that_makes_no_progress(
    server: ObjectServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aioload.sources.cache import local as cache_module

    monkeypatch.setattr(cache_module, "WAIT_STALL", 0.2)
    dataset = ObjectDataset(server.url + "/objects/", ["002.bin"], cache_dir=tmp_path)
    assert dataset.cache is not None
    folder = dataset.cache._folder
    location = dataset._location
    identity = entry_identity(location.describe(location.key("002.bin")), location)
    files = folder.files(identity, "002.bin")
    lock = folder.lock_entry(files)
    assert lock is not None  # a writer that hangs: holds the lock, writes nothing
    try:
        started = time.monotonic()
        assert asyncio.run(dataset[0]) == bytes([2]) * 1000  # from the store, after 0.2 s
        assert 0.2 <= time.monotonic() - started < 5
    finally:
        folder.unlock_entry(files, lock)
    counts = dataset.take_source_counts()
    assert counts is not None and counts.cache_misses == 1
    assert not os.path.exists(files.data)  # the waiter does not keep what it read past


def test_a_missing_shard_fails_as_without_a_cache(server: ObjectServer, tmp_path: Path) -> None:
    shards = [server.url + "/shards/s-000.tar", server.url + "/shards/missing.tar"]
    dataset = ShardDataset(shards, decode=label, cache_dir=tmp_path, shards_in_flight=2)
    with pytest.raises(FileNotFoundError, match=r"missing\.tar"):
        for _ in DataLoader(dataset, batch_size=4):
            pass
    # No lock or partial file stays behind (the other shard, cut short, is not kept whole).
    assert not [name for name in os.listdir(tmp_path) if name.endswith((".part", ".lock"))]
    assert dataset.cache is not None and dataset.cache.usage() == folder_bytes(tmp_path)


def test_a_disk_that_fills_mid_shard_goes_on_from_the_store_where_it_left_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aioload.sources.cache import local as cache_module

    # A shard of several chunks (obstore hands over at least 1 MiB at a time).
    with ShardWriter(str(tmp_path / "big-%d.tar")) as writer:
        for i in range(40):
            writer.write({"__key__": f"{i:03d}", "cls": i, "bin": bytes([i % 251]) * PAYLOAD * 25})
    writes = []
    real = cache_module._write_all

    def fills_up(fd: int, data: Any, offset: int) -> None:
        writes.append(offset)
        if len(writes) > 1:
            raise OSError(28, "No space left on device")
        real(fd, data, offset)

    monkeypatch.setattr(cache_module, "_write_all", fills_up)

    def big_label(sample: dict[str, Any]) -> int:
        decoded = default_decode(sample)
        assert decoded["bin"] == bytes([decoded["cls"] % 251]) * PAYLOAD * 25
        number: int = decoded["cls"]
        return number

    dataset = ShardDataset(
        Path(writer.shards[0]).as_uri(), decode=big_label, cache_dir=tmp_path / "cache"
    )

    async def epoch() -> list[int]:
        return [n async for n in dataset]

    assert asyncio.run(epoch()) == list(range(40))
    assert len(writes) == 2  # the first chunk went into the cache, the second failed
    assert dataset.cache is not None and dataset.cache.usage() == 0
    counts = dataset.take_source_counts()
    size = Path(writer.shards[0]).stat().st_size
    # The whole shard, and once more the chunk that could not be written: the rest came
    # from where the file left off, not from the start.
    assert counts is not None and counts.cache_misses == 1
    assert size < counts.store_bytes < size + 2 * writes[1]


# -- what names an entry: every setting that selects the store ---------------------------


@pytest.fixture
def two_stores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """Two object servers that both speak for bucket ``bucket`` and account ``acct``
    (S3 path-style and Azure emulator URLs are plain paths): the same key, other bytes."""
    servers = []
    try:
        for fill in (b"A", b"B"):
            root = tmp_path_factory.mktemp("store")
            for folder in ("bucket", "acct/cont", "other/cont"):
                (root / folder).mkdir(parents=True)
            (root / "bucket" / "x.bin").write_bytes(fill * 100)
            (root / "acct" / "cont" / "x.bin").write_bytes(fill * 100)
            (root / "other" / "cont" / "x.bin").write_bytes(fill.lower() * 100)
            servers.append(ObjectServer(root).start())
        yield servers[0].url, servers[1].url
    finally:
        for running in servers:
            running.stop()


def test_an_endpoint_from_the_environment_names_the_entry(
    two_stores: tuple[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    no_cloud_env: None,
) -> None:
    first, second = two_stores
    monkeypatch.setenv("AWS_ALLOW_HTTP", "true")
    read = []
    for name, endpoint in (
        ("AWS_ENDPOINT_URL", first),
        ("AWS_ENDPOINT_URL", second),
        ("AWS_ENDPOINT_URL_S3", first),
        ("AWS_ENDPOINT", second),
    ):
        for other in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT"):
            monkeypatch.delenv(other, raising=False)
        monkeypatch.setenv(name, endpoint)
        dataset = ObjectDataset(
            "s3://bucket/", ["x.bin"], storage_options={"skip_signature": True}, cache_dir=tmp_path
        )
        read.append(asyncio.run(dataset[0]))
    assert read == [b"A" * 100, b"B" * 100, b"A" * 100, b"B" * 100]


def test_the_azure_account_names_the_entry(
    two_stores: tuple[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    no_cloud_env: None,
) -> None:
    first, second = two_stores
    options = {"use_emulator": True, "skip_signature": True, "allow_http": True}
    read = []
    for account, emulator in (("acct", first), ("other", first), ("acct", second)):
        monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", account)
        monkeypatch.setenv("AZURITE_BLOB_STORAGE_URL", emulator)
        dataset = ObjectDataset(
            "az://cont/", ["x.bin"], cache_dir=tmp_path, storage_options=options
        )
        read.append(asyncio.run(dataset[0]))
    assert read == [b"A" * 100, b"a" * 100, b"B" * 100]


def test_the_settings_that_select_a_store_name_its_entries(
    monkeypatch: pytest.MonkeyPatch, no_cloud_env: None
) -> None:
    from aioload.sources.stores.store import StoreLocation

    def identity(url: str, **options: Any) -> str:
        return StoreLocation(url, options).identity

    anonymous = {"skip_signature": True}
    s3 = identity("s3://bucket/", **anonymous)
    assert identity("s3://bucket/", **anonymous) == s3  # the same settings: the same entries
    others = [
        identity("s3://other/", **anonymous),
        identity("s3://bucket/", endpoint="http://127.0.0.1:1", **anonymous),
        identity("s3://bucket/", aws_endpoint_url_s3="http://127.0.0.1:1", **anonymous),
        identity("s3://bucket/", region="eu-west-1", **anonymous),
        identity("s3://bucket/", virtual_hosted_style_request=True, **anonymous),
    ]
    for name, value in (
        ("AWS_ENDPOINT_URL", "http://127.0.0.1:2"),
        ("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:2"),
        ("AWS_ENDPOINT", "http://127.0.0.1:3"),
        ("AWS_REGION", "eu-west-2"),
        ("AWS_DEFAULT_REGION", "eu-west-3"),
    ):
        monkeypatch.setenv(name, value)
        others.append(identity("s3://bucket/", **anonymous))
        monkeypatch.delenv(name)
    # Credentials do not select what is read from S3: the same entries, whoever reads them.
    keyed = identity("s3://bucket/", access_key_id="k", secret_access_key="s")
    assert keyed == s3
    azure = identity("az://cont/", account_name="one", **anonymous)
    others += [
        azure,
        identity("az://cont/", account_name="two", **anonymous),
        identity("az://cont/", account_name="one", endpoint="http://127.0.0.1:4", **anonymous),
        identity("gs://bucket/", **anonymous),
        identity("gs://bucket/", base_url="http://127.0.0.1:5", **anonymous),
        identity("http://127.0.0.1:6/"),
        identity("http://token@127.0.0.1:6/"),
        identity("http://other@127.0.0.1:6/"),
    ]
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", "three")
    others.append(identity("az://cont/", **anonymous))
    assert len({s3, *others}) == len(others) + 1
    # No secret in the identity (it is hashed into file names, but it may be printed).
    assert "token" not in identity("http://token@127.0.0.1:6/")


# -- the folder is this user's own: no link followed, no folder of another user ----------


def test_a_new_cache_folder_is_private(tmp_path: Path) -> None:
    LocalCache(tmp_path / "a" / "cache")
    assert (tmp_path / "a" / "cache").stat().st_mode & 0o777 == 0o700


def test_links_planted_in_the_folder_are_never_followed(
    server: ObjectServer, shard_folder: Path, tmp_path: Path
) -> None:
    # Someone who could write the folder plants links where the cache's files will be: the
    # cache must not write through them (nor read a planted file as the shard).
    url = server.url + "/shards/s-000.tar"
    folder = tmp_path / "cache"
    dataset = ShardDataset(url, decode=label, cache_dir=folder, cache_limit="1GB")
    assert dataset.cache is not None
    location = dataset._objects[0][0]
    files = dataset.cache._folder.files(entry_identity(url, location), "s-000.tar")
    victims = {}
    for suffix in ("part", "lock"):
        victim = tmp_path / f"victim.{suffix}"
        victim.write_bytes(b"precious " + suffix.encode())
        os.symlink(victim, getattr(files, suffix))
        victims[victim] = victim.read_bytes()

    async def epoch() -> list[int]:
        return [n async for n in dataset]

    for _ in range(2):
        assert asyncio.run(epoch()) == list(range(PER_SHARD))
    for victim, content in victims.items():
        assert victim.read_bytes() == content
    # A planted .data link is not taken for the entry either.
    os.unlink(files.data) if os.path.lexists(files.data) else None
    fake = tmp_path / "fake.tar"
    fake.write_bytes((shard_folder / "shards" / "s-001.tar").read_bytes())
    os.symlink(fake, files.data)
    assert asyncio.run(epoch()) == list(range(PER_SHARD))


def test_a_planted_ledger_link_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "cache"
    folder.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    os.symlink(victim, folder / ".aioload-cache")
    with pytest.raises(PermissionError, match=r"\.aioload-cache"):
        cache = LocalCache(folder, "1GB")
        cache.usage()
    assert victim.read_bytes() == b"precious"


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a folder to another user")
def test_a_folder_of_another_user_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "cache"
    folder.mkdir(mode=0o700)
    os.chown(folder, 65534, 65534)
    with pytest.raises(PermissionError, match=r"(?s)cache.*owned by uid 65534.*0700"):
        LocalCache(folder)
    with pytest.raises(PermissionError, match="owned by uid 65534"):
        ShardDataset("file:///x/a.tar", cache_dir=folder)
    # Nor through a link another user made to a folder of ours.
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    link = tmp_path / "link"
    os.symlink(mine, link)
    os.lchown(link, 65534, 65534)
    with pytest.raises(PermissionError, match=r"link.*uid 65534"):
        LocalCache(link)


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o702, 0o1777])
def test_a_folder_others_can_write_is_refused(tmp_path: Path, mode: int) -> None:
    folder = tmp_path / "cache"
    folder.mkdir()
    os.chmod(folder, mode)
    with pytest.raises(PermissionError, match=r"(?s)can be written by .*chmod go-w"):
        LocalCache(folder)
    os.chmod(folder, 0o755)  # others may read: a cache of public data
    LocalCache(folder)


# -- one limit per folder, kept in its ledger -------------------------------------------


def test_an_instance_without_a_limit_keeps_to_the_folders(
    server: ObjectServer, tmp_path: Path
) -> None:
    keys = [f"{i:03d}.bin" for i in range(6)]
    limited = ObjectDataset(server.url + "/objects/", keys, cache_dir=tmp_path, cache_limit=2100)
    unlimited = ObjectDataset(server.url + "/objects/", keys, cache_dir=tmp_path)

    async def read(dataset: ObjectDataset, *indices: int) -> None:
        for index in indices:
            assert await dataset[index] == bytes([index]) * 1000
            assert folder_bytes(tmp_path) <= 2100

    asyncio.run(read(limited, 0))
    asyncio.run(read(unlimited, 1, 2, 3))
    asyncio.run(read(limited, 4))
    asyncio.run(read(unlimited, 5))
    assert unlimited.cache is not None and unlimited.cache.folder_limit() == 2100


def test_another_limit_replaces_the_folders_and_says_so(tmp_path: Path) -> None:
    LocalCache(tmp_path, 1000)
    assert LocalCache(tmp_path).folder_limit() == 1000
    with pytest.warns(UserWarning, match=r"(?s)limit of .* from 1000 to 3000"):
        third = LocalCache(tmp_path, 3000)
    assert third.folder_limit() == LocalCache(tmp_path).folder_limit() == 3000
    # A ledger removed (or rewritten by an earlier version) gets its limit back from the
    # first instance with a limit that reserves room.
    os.unlink(tmp_path / ".aioload-cache")
    folder = CacheFolder(str(tmp_path), None)
    assert folder.folder_limit() is None
    _fill(third._folder, "x", 10)
    assert folder.folder_limit() == 3000


def _fill(folder: CacheFolder, name: str, size: int) -> None:
    files = folder.files(name, name)
    lock = folder.lock_entry(files)
    assert lock is not None
    part = folder.reserve(files, size)
    assert part is not None
    os.pwrite(part, b"x" * size, 0)
    os.close(part)
    folder.commit(files)
    folder.unlock_entry(files, lock)


def test_an_entry_that_cannot_fit_evicts_nothing(tmp_path: Path) -> None:
    folder = CacheFolder(str(tmp_path), 1000)
    for name in ("a", "b"):
        _fill(folder, name, 400)
    reading = folder.open_entry(folder.files("a", "a"))
    assert reading is not None
    try:
        for name, size in (("c", 700), ("d", 1001)):
            files = folder.files(name, name)
            lock = folder.lock_entry(files)
            assert lock is not None
            # 700 fits only if "a" goes, and "a" is being read; 1001 never fits.
            assert folder.reserve(files, size) is None
            folder.unlock_entry(files, lock)
            assert os.path.exists(folder.files("b", "b").data)  # not evicted for nothing
            assert folder.usage() == 800
    finally:
        os.close(reading)


def test_entries_of_an_earlier_version_are_dropped(server: ObjectServer, tmp_path: Path) -> None:
    import hashlib

    # An entry as an earlier version named it (by its URL alone), holding another store's
    # bytes: it is never taken for the object, and it is removed.
    url = server.url + "/objects/003.bin"
    digest = hashlib.sha256(url.encode()).hexdigest()[:32]
    (tmp_path / f"{digest}-003.bin.data").write_bytes(b"another store's bytes")
    (tmp_path / ".aioload-cache").write_bytes(b"21")
    dataset = ObjectDataset(server.url + "/objects/", ["003.bin"], cache_dir=tmp_path)
    assert not (tmp_path / f"{digest}-003.bin.data").exists()  # gone on opening the folder
    assert asyncio.run(dataset[0]) == bytes([3]) * 1000
    assert dataset.cache is not None and dataset.cache.usage() == 1000
