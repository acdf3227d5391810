"""``set_epoch`` reaches the workers' copies of a dataset, persistent workers' too.

Persistent workers keep the copy of the dataset they started with. An epoch's
order must still be the one ``set_epoch`` asked for: each epoch with persistent
workers yields what the same epoch yields with workers started afresh, and
epochs differ from each other, for every dataset that has ``set_epoch`` — the
stream datasets, a mix of them, and a map-style dataset of the user's (also
inside a ``Subset``, whose wrapper has no ``set_epoch`` of its own).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from aioload import DataLoader, Dataset, Subset
from aioload.sources import (
    IterableParquetDataset,
    JsonLinesDataset,
    MixDataset,
    ShardDataset,
    ShardWriter,
    default_decode,
)

EPOCHS = 3
SAMPLES = 96


def label(raw: dict[str, Any]) -> int:
    """A shard sample's label (module level: runs in the workers)."""
    return int(default_decode(raw)["cls"])


def number(row: dict[str, Any]) -> int:
    return int(row["n"])


class Augmented(Dataset[int]):
    """A map-style dataset whose items depend on the epoch, as an augmentation's would."""

    def __init__(self) -> None:
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> int:
        return index + 1000 * self.epoch


def shards(folder: Path, first: int = 0) -> ShardDataset:
    folder.mkdir(parents=True)
    with ShardWriter(str(folder / "part-%03d.tar"), maxcount=12) as writer:
        for i in range(first, first + SAMPLES):
            writer.write({"__key__": f"{i:06d}", "cls": i})
    urls = [Path(shard).as_uri() for shard in writer.shards]
    return ShardDataset(urls, decode=label, shuffle_shards=True, shuffle_buffer=10, seed=1)


def json_lines(folder: Path) -> JsonLinesDataset:
    folder.mkdir(parents=True)
    urls = []
    for part in range(8):
        path = folder / f"part-{part}.jsonl"
        rows = range(part * 12, part * 12 + 12)
        path.write_text("".join(json.dumps({"n": n}) + "\n" for n in rows))
        urls.append(path.as_uri())
    return JsonLinesDataset(urls, decode=number, shuffle_files=True, shuffle_buffer=10, seed=2)


def parquet(folder: Path) -> IterableParquetDataset:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    folder.mkdir(parents=True)
    urls = []
    for part in range(4):
        path = folder / f"part-{part}.parquet"
        table = pa.table({"n": np.arange(part * 24, part * 24 + 24, dtype=np.int64)})
        pq.write_table(table, path, row_group_size=6)
        urls.append(path.as_uri())
    return IterableParquetDataset(
        urls, columns=["n"], shuffle_row_groups=True, shuffle_buffer=10, seed=3
    )


def mix(folder: Path) -> MixDataset:
    sources = [shards(folder / "a"), shards(folder / "b", first=SAMPLES)]
    return MixDataset(sources, [0.5, 0.5], seed=4, stop="longest")


def augmented(_folder: Path) -> Augmented:
    return Augmented()


def augmented_subset(_folder: Path) -> Subset[int]:
    return Subset(Augmented(), list(range(2, 14)))


def values(batch: Any) -> list[int]:
    if isinstance(batch, dict):  # a Parquet batch: {"n": array}
        batch = batch["n"]
    return [int(value) for value in np.asarray(batch).ravel()]


def set_epoch(dataset: Any, epoch: int) -> None:
    if isinstance(dataset, Subset):
        dataset.dataset.set_epoch(epoch)  # the wrapped dataset's, as a torch user does
    else:
        dataset.set_epoch(epoch)


def epochs(dataset: Any, *, persistent: bool) -> list[list[int]]:
    """Each epoch's values, ``set_epoch`` called before each, with 2 workers."""
    loader = DataLoader(dataset, batch_size=4, num_workers=2, persistent_workers=persistent)
    orders = []
    with loader:
        for epoch in range(EPOCHS):
            set_epoch(dataset, epoch)
            orders.append([value for batch in loader for value in values(batch)])
    return orders


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "make",
    [shards, json_lines, parquet, mix, augmented, augmented_subset],
    ids=lambda make: make.__name__,
)
def test_persistent_workers_see_every_epoch_set_epoch_gives(
    tmp_path: Path, make: Callable[[Path], Any]
) -> None:
    dataset = make(tmp_path / "data")
    fresh = epochs(dataset, persistent=False)
    assert len({tuple(order) for order in fresh}) == EPOCHS, "the epochs should differ"
    assert epochs(dataset, persistent=True) == fresh
