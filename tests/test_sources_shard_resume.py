"""ShardDataset checkpoints: stop mid-epoch, save through JSON, resume exactly or elastically.

Shards of unequal sizes, with their index files, served by the ObjectServer (which counts
the body bytes it sends: a resume must not read a consumed sample again) and uploaded to
SeaweedFS (a real S3 server). Ranks are datasets built with ``rank=``/``world_size=``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aioload import DataLoader
from aioload.sources import MixDataset, ShardDataset, ShardWriter, default_decode
from aioload.sources.streams.state import ShardStateError
from tests.strategies import JSON_VALUES

SIZES = [9, 4, 13, 6, 11]  # samples per shard: 43 in all
TOTAL = sum(SIZES)
PATTERN = f"part-{{000..{len(SIZES) - 1:03d}}}.tar"


def label(raw: dict[str, Any]) -> int:
    """A sample's number (module level: runs in the workers)."""
    return int(default_decode(raw)["cls"])


def write_shards(folder: Path, index: bool = True) -> None:
    number = 0
    for shard, size in enumerate(SIZES):
        pattern = str(folder / "part-%03d.tar")
        with ShardWriter(pattern, maxcount=size, start_shard=shard, index=index) as w:
            for _ in range(size):
                w.write({"__key__": f"{number:06d}", "cls": number, "txt": "x" * (number * 37)})
                number += 1


@pytest.fixture(scope="module")
def shards(object_folder: Path, object_server: Any) -> str:
    folder = object_folder / "resume"
    folder.mkdir(exist_ok=True)
    write_shards(folder)
    return f"{object_server.url}/resume/{PATTERN}"


def dataset(url: str, **options: Any) -> ShardDataset:
    return ShardDataset(url, decode=label, **options)


def loader(data: Any, workers: int, in_order: bool = True) -> DataLoader[Any]:
    return DataLoader(data, batch_size=3, num_workers=workers, in_order=in_order)


def flat(batches: list[Any]) -> list[int]:
    return [int(x) for batch in batches for x in batch]


def stop_after(run: DataLoader[Any], count: int) -> tuple[list[int], dict[str, Any]]:
    """The samples of the first ``count`` batches and the state then, through JSON."""
    it = iter(run)
    taken = [next(it) for _ in range(count)]
    state = json.loads(json.dumps(run.state_dict()))
    it.close()
    return flat(taken), state


CASES = [
    # split, workers, shards_in_flight, shuffle_buffer
    ("shards", 0, 1, 0),
    ("shards", 2, 4, 7),
    ("shards", 0, 4, 5),
    ("samples", 2, 1, 5),
    ("samples", 0, 4, 0),
]


@pytest.mark.parametrize(("split", "workers", "in_flight", "buffer"), CASES)
@pytest.mark.parametrize("in_order", [True, False])
def test_exact_resume_continues_with_the_samples_left(
    shards: str,
    object_server: Any,
    split: str,
    workers: int,
    in_flight: int,
    buffer: int,
    in_order: bool,
) -> None:
    options = {"split": split, "shards_in_flight": in_flight, "shuffle_buffer": buffer, "seed": 3}
    full = flat(list(loader(dataset(shards, **options), workers, in_order)))
    assert sorted(full) == list(range(TOTAL))
    for stop in (1, 5, 9):
        taken, state = stop_after(loader(dataset(shards, **options), workers, in_order), stop)
        before = _settled(object_server)
        rest = flat(list(_resumed(dataset(shards, **options), workers, in_order, state)))
        sent = object_server.stats()["bytes"] - before["bytes"]
        if in_order:
            assert taken + rest == full, stop
        assert Counter(taken + rest) == Counter(range(TOTAL)), stop
        # Only what was left is read: no consumed sample's bytes (the samples the
        # buffer held are read again, each once).
        assert sent <= _bytes_of(shards, set(rest)), stop


def _settled(server: Any) -> dict[str, int]:
    """The server's counts once the requests of a closed loader have all been answered."""
    stats = server.stats()
    while True:
        time.sleep(0.05)
        again = server.stats()
        if again == stats:  # (stats requests are not counted)
            return again
        stats = again


def _resumed(data: ShardDataset, workers: int, in_order: bool, state: Any) -> DataLoader[Any]:
    run = loader(data, workers, in_order)
    run.load_state_dict(state)
    return run


def _bytes_of(url: str, numbers: set[int]) -> int:
    """The bytes of samples ``numbers`` in their shards, and the end-of-archive blocks of
    the shards they are in (a read to a shard's end reads those too)."""
    total = 0
    for index in ShardDataset(url).indexes():
        left = [
            int(size)
            for key, size in zip(index.keys, index.sizes, strict=True)
            if int(key) in numbers
        ]
        if left:
            total += sum(left) + index.shard_size - int(index.offsets[-1] + index.sizes[-1])
    return total


@pytest.mark.parametrize(
    ("split", "before", "after"),
    [("shards", 2, 0), ("samples", 0, 2), ("samples", 2, 1), ("shards", 1, 2)],
)
def test_elastic_resume_with_other_workers_covers_the_rest_once(
    shards: str, split: str, before: int, after: int
) -> None:
    options = {"split": split, "shards_in_flight": 2, "shuffle_buffer": 4}
    taken, state = stop_after(loader(dataset(shards, **options), before), 4)
    rest = flat(list(_resumed(dataset(shards, **options), after, True, state)))
    assert Counter(taken + rest) == Counter(range(TOTAL))


@pytest.mark.parametrize("new_workers", [1, 2])
@pytest.mark.parametrize("split", ["samples", "shards"])
def test_elastic_resume_from_two_ranks_to_three(shards: str, split: str, new_workers: int) -> None:
    options = {"split": split, "shuffle_buffer": 3, "drop_last": True}
    old = [dataset(shards, rank=r, world_size=2, **options) for r in range(2)]
    taken, states = [], []
    for rank, data in enumerate(old):
        part, state = stop_after(loader(data, 2), 2 + rank)
        taken += part
        states.append(state)
    rest = []
    for rank in range(3):
        data = dataset(shards, rank=rank, world_size=3, **options)
        merged = json.loads(json.dumps(data.merge_states(states)))
        rest += flat(list(_resumed(data, new_workers, True, merged)))
    expected = Counter(range(TOTAL - TOTAL % 2)) if split == "samples" else Counter(range(TOTAL))
    assert Counter(taken + rest) == expected


def test_state_is_small_json_without_sample_bytes(shards: str) -> None:
    data = dataset(shards, shuffle_buffer=6, shards_in_flight=2)
    _, state = stop_after(loader(data, 0), 3)
    stream = state["dataset"]
    assert stream["format"] == "aioload.shard-stream"
    assert len(stream["buffer"]) == 6
    assert len(json.dumps(stream)) < 2000


def test_resampled_is_refused_clearly(shards: str) -> None:
    data = dataset(shards, resampled=True)
    _, state = stop_after(loader(data, 0), 2)
    with pytest.raises(ShardStateError, match="resampled"):
        _resumed(dataset(shards, resampled=True), 0, True, state)


@settings(max_examples=150, deadline=None)
@given(
    JSON_VALUES,
    st.sampled_from(["runs", "buffer", "rng", "layout", "epoch", "draining", "shards", "version"]),
)
def test_a_corrupted_state_is_refused_clearly(value: Any, field: str) -> None:
    data = ShardDataset([f"http://127.0.0.1:9/{i}.tar" for i in range(3)])
    good = {
        "format": "aioload.shard-stream",
        "version": 1,
        "shards": 3,
        "epoch": 0,
        "layout": {},
        "runs": [[0, 0, 0, -1]],
        "buffer": [],
        "draining": False,
        "rng": None,
    }
    try:
        data.load_state_dict({**good, field: value})
    except ShardStateError as error:
        assert str(error).startswith("shard stream state: ")


def test_exact_resume_over_s3(
    tmp_path: Path, seaweedfs: Any, s3_storage_options: dict[str, Any]
) -> None:
    import obstore

    from aioload.sources import open_store

    write_shards(tmp_path)

    async def upload() -> None:
        store, _ = open_store(seaweedfs.url, storage_options=s3_storage_options)
        for path in sorted(tmp_path.iterdir()):
            await obstore.put_async(store, f"resume/{path.name}", path.read_bytes())

    asyncio.run(upload())
    url = f"{seaweedfs.url}/resume/{PATTERN}"
    for split in ("shards", "samples"):
        options = {
            "split": split,
            "shards_in_flight": 2,
            "shuffle_buffer": 4,
            "storage_options": s3_storage_options,
        }
        full = flat(list(loader(dataset(url, **options), 2)))
        taken, state = stop_after(loader(dataset(url, **options), 2), 4)
        assert taken + flat(list(_resumed(dataset(url, **options), 2, True, state))) == full


@pytest.mark.parametrize("workers", [0, 2])
def test_a_sample_split_without_index_files_resumes_exactly(
    object_folder: Path, object_server: Any, workers: int
) -> None:
    # The indexes are built by reading the shards once; the resume still continues exactly.
    folder = object_folder / "resume-unindexed"
    folder.mkdir(exist_ok=True)
    write_shards(folder, index=False)
    assert not list(folder.glob("*.idx.json"))
    url = f"{object_server.url}/resume-unindexed/{PATTERN}"
    options = {"split": "samples", "shuffle_buffer": 4, "shards_in_flight": 2}
    whole = flat(list(loader(dataset(url, **options), workers)))
    taken, state = stop_after(loader(dataset(url, **options), workers), 4)
    rest = flat(list(_resumed(dataset(url, **options), workers, True, state)))
    assert taken + rest == whole
    assert sorted(whole) == list(range(TOTAL))


@pytest.mark.parametrize("stop", [1, 6, 20])
def test_a_mix_of_shard_datasets_resumes_exactly(shards: str, stop: int) -> None:
    def mix() -> MixDataset:
        first = dataset(shards, shuffle_buffer=5, shards_in_flight=2, seed=3)
        second = dataset(shards, split="samples", shuffle_shards=True, seed=4)
        return MixDataset([first, second], [0.7, 0.3], seed=1, stop="longest")

    full = flat(list(loader(mix(), 0)))
    assert Counter(full) == Counter(2 * list(range(TOTAL)))  # every sample of both, once
    taken, state = stop_after(loader(mix(), 0), stop)
    resumed = loader(mix(), 0)
    resumed.load_state_dict(state)
    assert taken + flat(list(resumed)) == full
