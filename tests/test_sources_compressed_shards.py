"""ShardDataset over compressed tar shards (.tar.gz, .tgz, .tar.zst, .tar.bz2, .tar.xz):
streamed and decompressed on the fly, cached as stored, split by whole shards, resumed."""

from __future__ import annotations

import asyncio
import bz2
import copy
import gzip
import json
import lzma
import tarfile
import warnings
from pathlib import Path
from typing import Any

import pytest

from aioload import DataLoader
from aioload.sources import ShardDataset, ShardWriter, default_decode
from aioload.sources.streams.state import ShardStateError
from aioload.testing import ObjectServer

SIZES = [9, 4, 13, 6]  # samples per shard: 32 in all
TOTAL = sum(SIZES)
PACK = {
    ".tar.gz": gzip.compress,
    ".tgz": gzip.compress,
    ".tar.bz2": bz2.compress,
    ".tar.xz": lzma.compress,
}


def label(raw: dict[str, Any]) -> int:
    """A sample's number (module level: runs in the workers)."""
    return int(default_decode(raw)["cls"])


def write_shards(folder: Path, suffix: str) -> list[str]:
    """Shards of SIZES, samples numbered across them, each compressed as ``suffix`` says."""
    folder.mkdir(parents=True, exist_ok=True)
    urls, number = [], 0
    for shard, size in enumerate(SIZES):
        plain = folder / f"plain-{shard:03d}.tar"
        with ShardWriter(str(folder / "plain-%03d.tar"), maxcount=size, start_shard=shard) as w:
            for _ in range(size):
                w.write({"__key__": f"{number:06d}", "cls": number, "txt": "x" * (number * 301)})
                number += 1
        path = folder / f"part-{shard:03d}{suffix}"
        path.write_bytes(PACK[suffix](plain.read_bytes()))
        urls.append(path.as_uri())
    return urls


async def collect(dataset: ShardDataset) -> list[int]:
    return [n async for n in dataset]


def flat(batches: list[Any]) -> list[int]:
    return [int(x) for batch in batches for x in batch]


@pytest.mark.asyncio
@pytest.mark.parametrize("suffix", list(PACK))
async def test_compressed_shards_are_read(tmp_path: Path, suffix: str) -> None:
    urls = write_shards(tmp_path, suffix)
    assert await collect(ShardDataset(urls, decode=label)) == list(range(TOTAL))


@pytest.mark.asyncio
async def test_a_tar_gz_written_by_tarfile_is_read(tmp_path: Path) -> None:
    path = tmp_path / "made.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        for i in range(5):
            for field, data in (("cls", str(i).encode()), ("txt", b"t" * i)):
                info = tarfile.TarInfo(f"sample{i:02d}.{field}")
                info.size = len(data)
                archive.addfile(info, __import__("io").BytesIO(data))
    dataset = ShardDataset(path.as_uri(), decode=label, shuffle_buffer=3)
    assert sorted(await collect(dataset)) == list(range(5))


def test_the_cache_keeps_a_compressed_shard_as_stored(tmp_path: Path) -> None:
    urls = write_shards(tmp_path / "shards", ".tar.gz")
    with ObjectServer(tmp_path / "shards") as server:
        served = [f"{server.url}/{url.rpartition('/')[2]}" for url in urls]
        dataset = ShardDataset(served, decode=label, cache_dir=tmp_path / "cache")
        loader = DataLoader(dataset, batch_size=5)
        for epoch in range(2):
            assert flat(list(loader)) == list(range(TOTAL))
            stats = loader.stats().epoch
            hits = (0, len(SIZES)) if epoch == 0 else (len(SIZES), 0)
            assert (stats.cache_hits, stats.cache_misses) == hits
    stored = sum((tmp_path / "shards" / url.rpartition("/")[2]).stat().st_size for url in urls)
    assert dataset.cache is not None and dataset.cache.usage() == stored


def test_several_ranks_split_whole_compressed_shards_and_say_so(tmp_path: Path) -> None:
    urls = write_shards(tmp_path, ".tar.gz")
    seen: list[int] = []
    for rank in range(2):
        with pytest.warns(UserWarning, match=r"(?s)compressed.*split whole shards"):
            dataset = ShardDataset(urls, decode=label, rank=rank, world_size=2)
        assert dataset.split == "shards"
        with pytest.raises(TypeError, match="promises no length"):
            len(dataset)
        seen += flat(list(DataLoader(dataset, batch_size=4)))
    assert sorted(seen) == list(range(TOTAL))
    with pytest.raises(ValueError, match=r"split='samples'.*compressed shard"):
        ShardDataset(urls, split="samples")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one rank, or split="shards" asked for: no warning
        ShardDataset(urls)
        ShardDataset(urls, rank=0, world_size=2, split="shards")
    with pytest.raises(ValueError, match="has no index"):
        asyncio.run(ShardDataset(urls, split="shards").load_indexes())


@pytest.mark.parametrize(("buffer", "in_flight"), [(0, 1), (5, 2)])
@pytest.mark.parametrize("suffix", [".tar.gz", ".tar.xz"])
def test_a_compressed_shard_resumes_from_its_start(
    tmp_path: Path, suffix: str, buffer: int, in_flight: int
) -> None:
    urls = write_shards(tmp_path, suffix)
    options: dict[str, Any] = {"shuffle_buffer": buffer, "shards_in_flight": in_flight, "seed": 1}
    full = flat(list(DataLoader(ShardDataset(urls, decode=label, **options), batch_size=3)))
    assert sorted(full) == list(range(TOTAL))
    for stop in (1, 2, 5, 9):
        run = DataLoader(ShardDataset(urls, decode=label, **options), batch_size=3)
        it = iter(run)
        taken = flat([next(it) for _ in range(stop)])
        state = json.loads(json.dumps(run.state_dict()))
        it.close()
        resumed = DataLoader(ShardDataset(urls, decode=label, **options), batch_size=3)
        resumed.load_state_dict(state)
        assert taken + flat(list(resumed)) == full, stop


def test_a_state_of_other_shards_is_refused(tmp_path: Path) -> None:
    urls = write_shards(tmp_path / "a", ".tar.gz")
    run = DataLoader(ShardDataset(urls, decode=label), batch_size=3)
    it = iter(run)
    next(it)
    state = json.loads(json.dumps(run.state_dict()))
    it.close()
    off_block = copy.deepcopy(state)
    off_block["dataset"]["runs"][0][2] += 7  # no tar block starts there: refused at once
    with pytest.raises(ShardStateError, match="512-byte block"):
        DataLoader(ShardDataset(urls, decode=label), batch_size=3).load_state_dict(off_block)
    state["dataset"]["runs"][0][2] += 512  # a block where no sample starts: found reading
    other = DataLoader(ShardDataset(urls, decode=label), batch_size=3)
    other.load_state_dict(state)
    with pytest.raises(ShardStateError, match="the state is of other shards"):
        list(other)


def test_a_truncated_compressed_shard_is_skipped_and_recorded(tmp_path: Path) -> None:
    urls = write_shards(tmp_path, ".tar.gz")
    first = Path(urls[0].removeprefix("file://"))
    first.write_bytes(first.read_bytes()[: first.stat().st_size // 2])
    skipping = DataLoader(ShardDataset(urls, decode=label), batch_size=4, on_error="skip")
    got = flat(list(skipping))
    assert got[len(got) - (TOTAL - SIZES[0]) :] == list(range(SIZES[0], TOTAL))
    kept = len(got) - (TOTAL - SIZES[0])
    assert got[:kept] == list(range(kept)) and kept < SIZES[0]
    (item,) = skipping.skipped
    assert item.key == urls[0] and item.error_type == "builtins.EOFError"
    assert f"the rest of the shard, from sample {kept + 1}" in (item.where or "")
    assert "of the decompressed tar" in (item.where or "")
    with pytest.raises(EOFError, match="ends early"):
        list(DataLoader(ShardDataset(urls, decode=label), batch_size=4))
