"""One dataset instance read by several loaders at once, each on its own event loop.

For tests/test_loop_sharing.py, and a script it runs in a subprocess (``python
shared_sources.py SETTINGS_JSON``: every source, then a clean exit, its exit code checked).
Every source gets the same data: ``COUNT`` records numbered 0 .. COUNT - 1, written as
Parquet files, tar shards, JSON-lines files and one object each, uploaded to a store.
:func:`read_at_once` iterates one instance with two sync loaders (``for``, each in its own
thread and so on its own background loop) and two ``async for`` loaders (each in a thread
running its own event loop), all at the same time, with ``num_workers=0``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from aioload import (
    ArrayDataset,
    ChainDataset,
    ConcatDataset,
    DataLoader,
    IterableDataset,
    StackDataset,
    Subset,
)

COUNT = 120
FILES = 3  # Parquet and JSON-lines files, of COUNT // FILES records each
PER_SHARD = 20  # 6 tar shards
LOADERS = ("sync-0", "sync-1", "async-0", "async-1")


def number_of_object(data: Any) -> int:
    return int.from_bytes(bytes(data[:4]), "little")


def number_of_sample(sample: dict[str, Any]) -> int:
    return int(bytes(sample["cls"]).decode())


def write_sources(folder: Path) -> None:
    """Every source's files under ``folder``: the same ``COUNT`` numbered records."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from aioload.sources import ShardWriter

    per_file = COUNT // FILES
    (folder / "parquet").mkdir(parents=True)
    (folder / "jsonl").mkdir()
    (folder / "objects").mkdir()
    (folder / "shards").mkdir()
    for number in range(FILES):
        ids = np.arange(number * per_file, (number + 1) * per_file, dtype=np.int64)
        table = pa.table({"id": ids, "text": [f"row {i}" for i in ids]})
        pq.write_table(table, folder / "parquet" / f"part-{number}.parquet", row_group_size=8)
        lines = "".join(json.dumps({"id": int(i)}) + "\n" for i in ids)
        (folder / "jsonl" / f"rows-{number}.jsonl").write_text(lines)
    for i in range(COUNT):
        (folder / "objects" / f"{i:04d}.bin").write_bytes(i.to_bytes(4, "little") * 64)
    with ShardWriter(str(folder / "shards" / "shard-%02d.tar"), maxcount=PER_SHARD) as writer:
        for i in range(COUNT):
            writer.write({"__key__": f"{i:06d}", "cls": str(i).encode()})


def upload(folder: Path, url: str, options: dict[str, Any]) -> None:
    """Puts every file under ``folder`` at ``url`` + its relative path."""
    import obstore

    from aioload.sources import open_store

    store, prefix = open_store(url + "/", storage_options=options)

    async def put_all() -> None:
        files = [path for path in sorted(folder.rglob("*")) if path.is_file()]
        await asyncio.gather(
            *(
                obstore.put_async(store, prefix + str(path.relative_to(folder)), path.read_bytes())
                for path in files
            )
        )

    asyncio.run(put_all())


class Numbers(IterableDataset[int]):
    """0 .. n - 1, sync (a plain iterable member of a ChainDataset)."""

    def __init__(self, first: int, count: int) -> None:
        self.first, self.count = first, count

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.first, self.first + self.count))


@dataclass
class Source:
    """A dataset over the records, how a loader reads it, and each batch's record numbers."""

    dataset: Any
    numbers: Callable[[Any], list[int]]
    expected: list[int] = field(default_factory=lambda: list(range(COUNT)))
    options: dict[str, Any] = field(default_factory=dict)


def _ids(batch: Any) -> list[int]:
    return [int(i) for i in np.asarray(batch["id"]).reshape(-1)]


def _rows(batch: Any) -> list[int]:
    return [int(row["id"]) for row in batch]


def _plain(batch: Any) -> list[int]:
    return [int(n) for n in np.asarray(batch).reshape(-1)]


SOURCE_NAMES = (
    "ParquetDataset",
    "IterableParquetDataset",
    "ShardDataset",
    "JsonLinesDataset",
    "ObjectDataset",
    "MixDataset",
    "ArrayDataset",
    "StackDataset",
    "ConcatDataset",
    "ChainDataset",
)


def make_source(name: str, url: str, options: dict[str, Any], cache: Path) -> Source:
    """Source ``name`` over the records uploaded at ``url`` (a local cache in ``cache``)."""
    from aioload.sources import (
        IterableParquetDataset,
        JsonLinesDataset,
        MixDataset,
        ObjectDataset,
        ParquetDataset,
        ShardDataset,
    )

    parquet = [f"{url}/parquet/part-{n}.parquet" for n in range(FILES)]
    jsonl = [f"{url}/jsonl/rows-{n}.jsonl" for n in range(FILES)]
    shards = f"{url}/shards/shard-{{00..{COUNT // PER_SHARD - 1:02d}}}.tar"
    keys = [f"{i:04d}.bin" for i in range(COUNT)]
    shuffled = {"shuffle": True, "generator": 7}
    if name == "ParquetDataset":
        # A row-group cache of 3 row groups: row groups are kept, dropped and read again.
        dataset = ParquetDataset(
            parquet, ["id"], row_group_cache=200, cache_dir=cache, storage_options=options
        )
        return Source(dataset, _ids, options=shuffled)
    if name == "IterableParquetDataset":
        dataset = IterableParquetDataset(
            parquet,
            shuffle_row_groups=True,
            shuffle_buffer=16,
            cache_dir=cache,
            storage_options=options,
        )
        return Source(dataset, _ids)
    if name == "ShardDataset":
        dataset = ShardDataset(
            shards,
            decode=number_of_sample,
            shuffle_shards=True,
            shuffle_buffer=10,
            shards_in_flight=2,
            cache_dir=cache,
            storage_options=options,
        )
        return Source(dataset, _plain)
    if name == "JsonLinesDataset":
        dataset = JsonLinesDataset(
            jsonl, shuffle_files=True, shuffle_buffer=10, storage_options=options
        )
        return Source(dataset, _rows, options={"collate_fn": list})
    if name == "ObjectDataset":
        dataset = ObjectDataset(
            f"{url}/objects/",
            keys,
            decode=number_of_object,
            cache_dir=cache,
            storage_options=options,
        )
        return Source(dataset, _plain, options=shuffled)
    if name == "MixDataset":
        rows = JsonLinesDataset(jsonl, decode=lambda row: row["id"], storage_options=options)
        samples = ShardDataset(
            shards, decode=lambda s: COUNT + number_of_sample(s), storage_options=options
        )
        dataset = MixDataset([rows, samples], [0.5, 0.5], seed=3, stop="longest")
        return Source(dataset, _plain, expected=list(range(2 * COUNT)))
    objects = ObjectDataset(
        f"{url}/objects/", keys, decode=number_of_object, storage_options=options
    )
    if name == "ArrayDataset":
        return Source(ArrayDataset(np.arange(COUNT)), _plain, options=shuffled)
    if name == "StackDataset":
        stack = StackDataset(objects, ArrayDataset(np.arange(COUNT)))
        return Source(stack, _stacked, options={**shuffled, "collate_fn": list})
    if name == "ConcatDataset":
        half = COUNT // 2
        concat = ConcatDataset([Subset(objects, range(half)), list(range(half, COUNT))])
        return Source(concat, _plain, options=shuffled)
    if name == "ChainDataset":
        first = COUNT // FILES  # the first JSON-lines file's records, then the rest counted
        rows = JsonLinesDataset(jsonl[:1], decode=lambda row: row["id"], storage_options=options)
        return Source(ChainDataset([rows, Numbers(first, COUNT - first)]), _plain)
    raise ValueError(f"no source {name!r}")


def _stacked(batch: Any) -> list[int]:
    """An object's number, checked against its row of the array stacked beside it."""
    numbers = []
    for number, (row,) in batch:
        assert number == int(row), (number, row)
        numbers.append(number)
    return numbers


def read_alone(source: Source) -> list[int]:
    """The record numbers one loader yields over ``source``, with nothing else running."""
    return _read(DataLoader(source.dataset, batch_size=8, **source.options), source)


def _read(loader: DataLoader[Any], source: Source) -> list[int]:
    got: list[int] = []
    batches = iter(loader)
    try:  # closed whatever happens: a failed read leaves no loop thread behind
        for batch in batches:
            got += source.numbers(batch)
    finally:
        batches.close()
    return got


async def _read_async(loader: DataLoader[Any], source: Source) -> list[int]:
    got: list[int] = []
    batches = aiter(loader)
    try:
        async for batch in batches:
            got += source.numbers(batch)
    finally:
        await batches.aclose()
    return got


def read_at_once(source: Source) -> dict[str, list[int] | str]:
    """What each of :data:`LOADERS` yields over one instance, all reading at the same time.

    A loader's value is its record numbers in order, or the error that ended it (its type
    and message).
    """
    start = threading.Barrier(len(LOADERS), timeout=30)
    results: dict[str, list[int] | str] = {}

    def loader() -> DataLoader[Any]:
        return DataLoader(source.dataset, batch_size=8, **source.options)

    def sync(name: str) -> None:
        start.wait()
        results[name] = _read(loader(), source)

    def async_(name: str) -> None:
        async def main() -> list[int]:
            start.wait()  # every loop made: all four read at once
            return await _read_async(loader(), source)

        results[name] = asyncio.run(main())

    def run(name: str) -> None:
        try:
            (sync if name.startswith("sync") else async_)(name)
        except BaseException as error:  # reported, not raised: the other loaders go on
            results[name] = f"{type(error).__name__}: {error}"

    threads = [threading.Thread(target=run, args=(name,)) for name in LOADERS]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    alive = [name for name, thread in zip(LOADERS, threads, strict=True) if thread.is_alive()]
    for name in alive:
        results[name] = "still running after 60 s"
    return results


def main() -> None:
    """Reads every source shared by the four loaders; prints a JSON report."""
    settings = json.loads(sys.argv[1])
    report: dict[str, Any] = {}
    for number, name in enumerate(SOURCE_NAMES):
        cache = Path(settings["cache"]) / str(number)
        source = make_source(name, settings["url"], settings["options"], cache)
        alone = read_alone(source)
        report[name] = {
            "alone_ok": sorted(alone) == source.expected,
            "same_as_alone": {loader: got == alone for loader, got in read_at_once(source).items()},
        }
    json.dump(report, sys.stdout)


if __name__ == "__main__":
    main()
