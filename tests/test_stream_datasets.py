"""What the three stream datasets share (one StreamDataset base): arguments, epochs, layouts.

Their checks are one and torch's (a bool is not an int), and the layout a checkpoint
records is the one each has always recorded, so a state users saved resumes exactly.
"""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from aioload.sources import JsonLinesDataset, ShardDataset

pq = pytest.importorskip("pyarrow.parquet")

from aioload.sources import IterableParquetDataset  # noqa: E402

TARS = [f"http://127.0.0.1:9/{i}.tar" for i in range(3)]
LINES = [f"http://127.0.0.1:9/{i}.jsonl" for i in range(3)]
ROWS = [f"http://127.0.0.1:9/{i}.parquet" for i in range(3)]


def shards(**options: Any) -> ShardDataset:
    return ShardDataset(TARS, **options)


def lines(**options: Any) -> JsonLinesDataset:
    return JsonLinesDataset(LINES, **options)


def rows(**options: Any) -> IterableParquetDataset:
    return IterableParquetDataset(ROWS, **options)


MAKERS = {"shards": shards, "lines": lines, "rows": rows}
COUNTS = [
    *((name, argument) for name in MAKERS for argument in ("seed", "shuffle_buffer")),
    ("shards", "shards_in_flight"),
    ("lines", "files_in_flight"),
]


@pytest.mark.parametrize(("name", "argument"), COUNTS)
@pytest.mark.parametrize("value", [True, False, -1, 1.0, "1"])
def test_a_count_that_is_not_an_int_is_refused_by_every_stream(
    name: str, argument: str, value: Any
) -> None:
    with pytest.raises(ValueError, match=f"{argument} should be an int >= "):
        MAKERS[name](**{argument: value})


@pytest.mark.parametrize("name", sorted(MAKERS))
def test_set_epoch_takes_an_int_and_no_bool(name: str) -> None:
    dataset = MAKERS[name]()
    dataset.set_epoch(3)
    assert dataset.epoch == 3
    for value in (True, False, -1, 2.0, None):
        with pytest.raises(ValueError, match="epoch should be an int >= 0"):
            dataset.set_epoch(value)  # type: ignore[arg-type]
    assert dataset.epoch == 3


def test_the_layouts_are_the_ones_checkpoints_have() -> None:
    # What a state records: a state saved before resumes exactly where its layout is equal.
    assert shards(split="samples", world_size=2, rank=1, seed=4)._layout(1, 2, 0, 3, 8) == {
        "rank": 1,
        "world_size": 2,
        "worker": 0,
        "num_workers": 3,
        "batch_size": 8,
        "split": "samples",
        "shuffle_buffer": 0,
        "shards_in_flight": 1,
        "seed": 4,
        "shuffle_shards": False,
        "drop_last": False,
    }
    assert lines(shuffle_files=True, files_in_flight=2)._layout(0, 1, 1, 2) == {
        "rank": 0,
        "world_size": 1,
        "worker": 1,
        "num_workers": 2,
        "split": "files",
        "shuffle_buffer": 0,
        "files_in_flight": 2,
        "seed": 0,
        "shuffle_files": True,
    }
    assert rows(drop_last=True)._layout(0, 1, 0, 2, 16) == {
        "rank": 0,
        "world_size": 1,
        "worker": 0,
        "num_workers": 2,
        "batch_size": None,
        "split": "row_groups",
        "shuffle_buffer": 0,
        "seed": 0,
        "shuffle_row_groups": False,
        "drop_last": True,
    }


@pytest.mark.parametrize("name", sorted(MAKERS))
def test_the_split_is_checked_and_defaults_by_world_size(name: str) -> None:
    dataset = MAKERS[name]
    one, two = dataset(), dataset(rank=0, world_size=2)
    assert (one.split, two.split) == {
        "shards": ("shards", "samples"),
        "lines": ("files", "files"),
        "rows": ("row_groups", "rows"),
    }[name]
    if name != "lines":
        with pytest.raises(ValueError, match="split should be"):
            dataset(split="lines")
        with pytest.raises(TypeError, match="drop_last should be a bool"):
            dataset(drop_last=1)
    assert pickle.loads(pickle.dumps(two)).split == two.split
