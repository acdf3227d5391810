"""ParquetDataset and IterableParquetDataset: rows of Parquet files, read, split, resumed.

Files are written by pyarrow with small row groups (several per file, files of uneven
sizes) holding nulls, strings and nested lists, and read through ``file://`` URLs; the
cache test runs against SeaweedFS (a real S3 server on 127.0.0.1). Every row has a unique
``id`` (its global row number), so "every row exactly once" is a ``Counter`` of ids.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aioload import DataLoader, DistributedSampler, RetryPolicy, WeightedRandomSampler
from aioload.sources import IterableParquetDataset, JsonLinesDataset, MixDataset, ParquetDataset
from aioload.sources.parquet.footer import (
    FOOTER_GUESS,
    Footer,
    ParquetFormatError,
    parse_footer,
    read_footer_bytes,
)
from aioload.sources.parquet.state import check_rows_state
from aioload.sources.streams.state import ShardStateError
from tests.strategies import JSON_VALUES

SIZES = [23, 7, 31]  # rows per file: 61 in all, row groups of 5 (the last ones shorter)
TOTAL = sum(SIZES)
ROW_GROUP = 5
FAST = RetryPolicy(attempts=2, backoff=0.0)
FORKSERVER: dict[str, Any] = {"multiprocessing_context": "forkserver"}


def rows_as_list(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A user's collate_fn: the rows as they come (module level: runs in the workers)."""
    assert isinstance(rows, list) and all(isinstance(row, dict) for row in rows)
    return rows


def table_of(first: int, count: int) -> pa.Table:
    """Rows ``first`` to ``first + count - 1``: ids, nulls, strings, nested lists."""
    ids = list(range(first, first + count))
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "small": pa.array([i % 100 for i in ids], pa.int8()),
            "score": pa.array([None if i % 5 == 0 else i * 0.25 for i in ids], pa.float64()),
            "name": pa.array([None if i % 7 == 3 else f"row-{i}" * (i % 4) for i in ids]),
            "tags": pa.array(
                [None if i % 11 == 0 else list(range(i, i + i % 3)) for i in ids],
                pa.list_(pa.int32()),
            ),
            "vec": pa.array([[i, -i, 2 * i] for i in ids], pa.list_(pa.float32())),
            "flag": pa.array([i % 2 == 0 for i in ids]),
        }
    )


def write_files(folder: Path, sizes: list[int] = SIZES, name: str = "part") -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths, first = [], 0
    for number, size in enumerate(sizes):
        path = folder / f"{name}-{number:03d}.parquet"
        pq.write_table(table_of(first, size), path, row_group_size=ROW_GROUP)
        paths.append(path)
        first += size
    return paths


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("parquet")
    write_files(root / "table")
    # Not Parquet: a listing of the prefix leaves them out.
    (root / "table" / "README.txt").write_text("not a table")
    (root / "table" / "part-000.parquet.crc").write_bytes(b"\0" * 8)
    return root / "table"


@pytest.fixture(scope="module")
def prefix(folder: Path) -> str:
    return f"file://{folder}/"


@pytest.fixture(scope="module")
def expected(folder: Path) -> list[dict[str, Any]]:
    """Every row as pyarrow reads it, by id."""
    tables = [pq.read_table(path) for path in sorted(folder.glob("*.parquet"))]
    rows = pa.concat_tables(tables).to_pylist()
    assert [row["id"] for row in rows] == list(range(TOTAL))
    return rows


def plain(value: Any) -> Any:
    """A row's value as ``to_pylist`` has it (numpy scalars and arrays, NaN for null)."""
    if isinstance(value, np.ndarray):
        return [plain(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def ids(batches: list[Any]) -> list[int]:
    """The ids of default-collated batches (dicts of arrays) or of lists of rows."""
    got: list[int] = []
    for batch in batches:
        if isinstance(batch, dict):
            got += [int(x) for x in np.asarray(batch["id"]).reshape(-1)]
        else:
            got += [int(row["id"]) for row in batch]
    return got


def stop_after(loader: DataLoader[Any], count: int) -> tuple[list[int], dict[str, Any]]:
    """The ids of the first ``count`` batches and the state then, through JSON."""
    it = iter(loader)
    taken = [next(it) for _ in range(count)]
    state = json.loads(json.dumps(loader.state_dict()))
    it.close()
    return ids(taken), state


def resumed(loader: DataLoader[Any], state: dict[str, Any]) -> list[int]:
    loader.load_state_dict(state)
    return ids(list(loader))


# -- map-style ----------------------------------------------------------------------


def test_a_prefix_lists_only_parquet_files_sorted(prefix: str, folder: Path) -> None:
    dataset = ParquetDataset(prefix)
    assert dataset.urls == [f"file://{path}" for path in sorted(folder.glob("*.parquet"))]
    assert len(dataset) == TOTAL
    assert dataset.schema.names == ["id", "small", "score", "name", "tags", "vec", "flag"]
    assert dataset.row_group_of(0) == (dataset.urls[0], 0, 0)
    assert dataset.row_group_of(24) == (dataset.urls[1], 0, 1)  # 23 rows in file 0
    assert dataset.row_group_of(-1) == (dataset.urls[2], 6, 0)  # 31 = 6 * 5 + 1


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_every_row_once_with_shuffle_and_values_match_pyarrow(
    prefix: str, expected: list[dict[str, Any]], workers: int
) -> None:
    loader = DataLoader(
        ParquetDataset(prefix),
        batch_size=4,
        shuffle=True,
        num_workers=workers,
        collate_fn=rows_as_list,
        **(FORKSERVER if workers else {}),
    )
    batches = list(loader)
    got = [row for batch in batches for row in batch]
    assert Counter(int(row["id"]) for row in got) == Counter(range(TOTAL))
    assert ids(batches) != list(range(TOTAL))  # shuffled
    for row in got:
        want = expected[int(row["id"])]
        assert list(row) == list(want)
        assert {key: plain(value) for key, value in row.items()} == want
    # What a row holds, by type (arrow_rows' table).
    row = next(r for r in got if int(r["id"]) == 5)
    assert isinstance(row["id"], np.int64) and isinstance(row["small"], np.int8)
    assert isinstance(row["score"], np.float64) and math.isnan(row["score"])  # a null
    assert isinstance(row["tags"], np.ndarray) and row["tags"].dtype == np.int32
    assert row["vec"].dtype == np.float32 and row["vec"].tolist() == [5, -5, 10]
    assert next(r for r in got if int(r["id"]) == 11)["tags"] is None
    assert next(r for r in got if int(r["id"]) == 3)["name"] is None


def test_default_collate_of_a_batch_is_arrays(prefix: str) -> None:
    dataset = ParquetDataset(prefix, columns=["id", "score", "vec", "flag", "small"])
    batch = next(iter(DataLoader(dataset, batch_size=6)))
    assert list(batch) == ["id", "score", "vec", "flag", "small"]
    assert batch["id"].tolist() == list(range(6))
    assert batch["id"].dtype == np.int64 and batch["small"].dtype == np.int8
    assert batch["score"].dtype == np.float64 and np.isnan(batch["score"][[0, 5]]).all()
    assert batch["vec"].shape == (6, 3) and batch["vec"].dtype == np.float32
    assert batch["flag"].dtype == np.bool_ and batch["flag"].tolist() == [True, False] * 3
    assert batch["id"].flags.writeable


@pytest.mark.asyncio
async def test_projection_reads_only_the_columns_asked_for_in_that_order(
    tmp_path: Path, expected: list[dict[str, Any]]
) -> None:
    # A file bigger than the first footer read, so that the bytes read tell columns apart.
    path = tmp_path / "wide.parquet"
    count = 4000
    table = pa.table(
        {
            "id": pa.array(range(count), pa.int64()),
            "text": pa.array([f"{i:08d}" * 40 for i in range(count)]),
            "score": pa.array(np.arange(count) * 0.5),
        }
    )
    pq.write_table(table, path, row_group_size=1000, compression="none")
    size = path.stat().st_size
    assert size > 4 * FOOTER_GUESS

    async def read_all(columns: list[str] | None) -> tuple[Any, int]:
        dataset = ParquetDataset(f"file://{path}", columns=columns)
        await dataset.load()
        dataset.take_source_counts()  # the footer's read
        block = await dataset.__getitems__(list(range(0, count, 7)))
        counts = dataset.take_source_counts()
        assert counts is not None
        return block, counts.store_bytes

    block, projected = await read_all(["score", "id"])
    row = block[3]
    assert list(row) == ["score", "id"] and int(row["id"]) == 21 and float(row["score"]) == 10.5
    assert list(block.collate()) == ["score", "id"]
    _, everything = await read_all(None)
    assert everything > size // 2
    assert projected < everything // 4  # the text column's bytes were never fetched

    # And through the loader's stats.
    loader = DataLoader(ParquetDataset(f"file://{path}", columns=["id"]), batch_size=500)
    assert ids([batch async for batch in loader]) == list(range(count))
    assert 0 < loader.stats().epoch.store_bytes < size // 4


@pytest.mark.asyncio
async def test_names_with_dots_and_nested_columns_are_projected(tmp_path: Path) -> None:
    # A top-level name may hold a dot: "x.y" is not field y of x.
    table = pa.table(
        {
            "x.y": [1, 2],
            "x": [3, 4],
            "s": pa.array([{"a": 1, "b": "u"}, {"a": 2, "b": "v"}]),
            "m": pa.array([[("k", 1)], []], pa.map_(pa.string(), pa.int64())),
            "ls": pa.array([[{"a": 1, "b": [1]}], []]),
        }
    )
    path = tmp_path / "dots.parquet"
    pq.write_table(table, path)
    url = f"file://{path}"
    every = await ParquetDataset(url).__getitems__([0, 1])
    assert [plain_row(row) for row in every.rows()] == table.to_pylist()
    for columns in (["x.y"], ["x"], ["s", "x.y"], ["ls", "m"]):
        block = await ParquetDataset(url, columns=columns).__getitems__([1, 0])
        assert [plain_row(row) for row in block.rows()] == table.select(columns).to_pylist()[::-1]


def plain_row(row: dict[str, Any]) -> dict[str, Any]:
    return {key: plain(value) for key, value in row.items()}


@pytest.mark.asyncio
async def test_indices_negative_and_out_of_range(prefix: str, expected: list[Any]) -> None:
    dataset = ParquetDataset(prefix, columns=["id", "name"])
    assert int((await dataset[-1])["id"]) == TOTAL - 1
    assert int((await dataset[-TOTAL])["id"]) == 0
    row = await dataset[30]
    assert list(row) == ["id", "name"] and row["name"] == expected[30]["name"]
    for bad in (TOTAL, -TOTAL - 1, 10**12):
        with pytest.raises(IndexError, match="out of range"):
            await dataset[bad]
    with pytest.raises(TypeError):
        await dataset["3"]  # type: ignore[index]
    block = await dataset.__getitems__([60, 0, -2, 22, 23, 0])
    assert [int(row["id"]) for row in block] == [60, 0, 59, 22, 23, 0]
    assert len(await dataset.__getitems__([])) == 0


def test_distributed_sampler_over_three_ranks_partitions_the_rows(prefix: str) -> None:
    seen: list[int] = []
    lengths = set()
    for rank in range(3):
        dataset = ParquetDataset(prefix, columns=["id"])
        sampler = DistributedSampler(dataset, num_replicas=3, rank=rank, seed=4, drop_last=True)
        got = ids(list(DataLoader(dataset, batch_size=4, sampler=sampler)))
        lengths.add(len(got))
        seen += got
    assert lengths == {TOTAL // 3}
    assert len(set(seen)) == len(seen) == TOTAL - TOTAL % 3


def test_a_brace_pattern_without_a_row_group_cache(folder: Path) -> None:
    url = f"file://{folder}/part-{{000..002}}.parquet"
    dataset = ParquetDataset(url, columns=["id", "small"], row_group_cache=0)
    assert len(dataset.urls) == 3
    batches = list(DataLoader(dataset, batch_size=7, shuffle=True))
    assert Counter(ids(batches)) == Counter(range(TOTAL))
    assert all((batch["small"] == batch["id"] % 100).all() for batch in batches)
    with pytest.raises(ValueError, match="row_group_cache"):
        ParquetDataset(url, row_group_cache=-1)


def test_weighted_random_sampler(prefix: str) -> None:
    dataset = ParquetDataset(prefix, columns=["id", "score"])
    weights = [1.0 if i % 2 else 0.0 for i in range(TOTAL)]  # odd rows only
    sampler = WeightedRandomSampler(weights, num_samples=100, replacement=True)
    batches = list(DataLoader(dataset, batch_size=8, sampler=sampler))
    got = ids(batches)
    assert len(got) == 100 and all(i % 2 for i in got)
    for batch in batches:  # the values belong to their rows
        want = np.where(batch["id"] % 5 == 0, np.nan, batch["id"] * 0.25)
        assert np.array_equal(batch["score"], want, equal_nan=True)


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_map_style_checkpoint_resume_gives_the_rest_exactly(prefix: str, workers: int) -> None:
    def loader() -> DataLoader[Any]:
        return DataLoader(
            ParquetDataset(prefix, columns=["id"]),
            batch_size=4,
            shuffle=True,
            num_workers=workers,
            generator=np.random.default_rng(3),
            **(FORKSERVER if workers else {}),
        )

    full = ids(list(loader()))
    assert sorted(full) == list(range(TOTAL))
    for stop in (1, 7):
        taken, state = stop_after(loader(), stop)
        assert taken + resumed(loader(), state) == full, stop


def test_a_user_collate_fn_gets_row_dicts_and_batch_size_none_gives_rows(prefix: str) -> None:
    seen: list[Any] = []

    def collate(rows: Any) -> int:
        seen.append(rows)
        return len(rows)

    dataset = ParquetDataset(prefix, columns=["name", "id"])
    assert list(DataLoader(dataset, batch_size=25, collate_fn=collate)) == [25, 25, 11]
    assert all(type(rows) is list and all(type(r) is dict for r in rows) for rows in seen)
    assert list(seen[0][4]) == ["name", "id"]
    rows = list(DataLoader(dataset, batch_size=None))
    assert len(rows) == TOTAL and all(type(row) is dict for row in rows)
    assert [int(row["id"]) for row in rows] == list(range(TOTAL))
    assert rows[9]["name"] == "row-9"


def test_map_style_default_collate_of_ragged_lists_raises_as_for_the_rows(prefix: str) -> None:
    # Ragged lists cannot stack: the block's batch fails as default_collate of rows does.
    from aioload.collate.core import default_collate

    dataset = ParquetDataset(prefix, columns=["tags"])
    block = asyncio.run(dataset.__getitems__([1, 2]))
    with pytest.raises(RuntimeError) as ours:
        default_collate(block)
    with pytest.raises(type(ours.value)):
        default_collate(block.rows())


def test_an_epoch_with_null_strings_finishes_whatever_the_shuffle(tmp_path: Path) -> None:
    # The first row of a batch null or not: every batch collates, nulls as None.
    names = [None if i % 3 == 0 else f"n{i}" for i in range(30)]
    flags = [None if i % 4 == 1 else i % 2 == 0 for i in range(30)]
    table = pa.table({"id": list(range(30)), "name": names, "flag": flags})
    pq.write_table(table, tmp_path / "nulls.parquet", row_group_size=7)
    url = f"file://{tmp_path}/nulls.parquet"
    for seed in range(3):
        loader = DataLoader(
            ParquetDataset(url), batch_size=4, shuffle=True, generator=np.random.default_rng(seed)
        )
        seen = {}
        for batch in loader:
            assert isinstance(batch["name"], list)  # flag: a list where a null is, else bools
            flag = batch["flag"]
            assert isinstance(flag, list) == any(value is None for value in flag)
            values = zip(batch["name"], list(flag), strict=True)
            seen.update(zip(batch["id"].tolist(), values, strict=True))
        assert seen == {i: (names[i], flags[i]) for i in range(30)}
    streamed = DataLoader(IterableParquetDataset(url), batch_size=4)
    assert [name for batch in streamed for name in batch["name"]] == names


@pytest.mark.asyncio
async def test_a_nanosecond_timestamp_column_with_nulls_reads(tmp_path: Path) -> None:
    # What pandas writes: datetime64[ns], NaT for a missing time.
    times = pa.array([0, None, 2 * 10**18], pa.timestamp("ns"))
    pq.write_table(pa.table({"t": times, "id": [0, 1, 2]}), tmp_path / "t.parquet")
    dataset = ParquetDataset(f"file://{tmp_path}/t.parquet")
    rows = (await dataset.__getitems__([0, 1, 2])).rows()
    assert np.isnat(rows[1]["t"]) and rows[2]["t"] == np.datetime64(2 * 10**18, "ns")
    (batch,) = [batch async for batch in DataLoader(dataset, batch_size=3)]
    assert batch["t"].dtype == np.dtype("datetime64[ns]") and np.isnat(batch["t"][1])


# -- iterable -------------------------------------------------------------------------


def stream(url: str, **options: Any) -> IterableParquetDataset:
    return IterableParquetDataset(url, columns=["id"], **options)


def run(data: Any, workers: int, batch_size: int | None = 4, **options: Any) -> DataLoader[Any]:
    return DataLoader(
        data,
        batch_size=batch_size,
        num_workers=workers,
        **(FORKSERVER if workers else {}),
        **options,
    )


@pytest.mark.parametrize("split", ["rows", "row_groups"])
@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_iterable_every_row_once_across_ranks_and_workers(
    prefix: str, split: str, world_size: int, workers: int
) -> None:
    per_rank: list[list[int]] = []
    batches: list[int] = []
    lengths = set()
    for rank in range(world_size):
        data = stream(prefix, rank=rank, world_size=world_size, split=split, seed=2)
        loader = run(data, workers)
        got = list(loader)
        per_rank.append(ids(got))
        batches.append(len(got))
        if split == "rows":
            lengths.add((len(data), len(loader)))
    everything = Counter(i for part in per_rank for i in part)
    if split == "row_groups":
        assert everything == Counter(range(TOTAL))
        return
    share = -(-TOTAL // world_size)
    # Every rank: the same rows, len(loader) batches, the tail padded with the first rows.
    assert lengths == {(share, -(-share // 4))}
    assert all(len(part) == share for part in per_rank)
    assert batches == [-(-share // 4)] * world_size
    assert set(everything) == set(range(TOTAL))
    assert sum(everything.values()) == share * world_size
    assert all(count == 1 for i, count in everything.items() if i >= world_size)


@pytest.mark.parametrize("world_size", [2, 3])
def test_drop_last_drops_the_tail_rows(prefix: str, world_size: int) -> None:
    got: list[int] = []
    for rank in range(world_size):
        data = stream(prefix, rank=rank, world_size=world_size, split="rows", drop_last=True)
        assert len(data) == TOTAL // world_size
        rows = ids(list(run(data, 0, drop_last=True)))
        assert len(rows) == (TOTAL // world_size) // 4 * 4  # the loader's drop_last too
        got += rows
    assert len(set(got)) == len(got)


def test_split_rows_uneven_files_same_length_on_every_rank(tmp_path: Path) -> None:
    # One big file and two small ones: ranks still get the same rows and batches.
    write_files(tmp_path, [40, 3, 2])
    url = f"file://{tmp_path}/"
    counts = []
    for rank in range(2):
        data = stream(url, rank=rank, world_size=2, split="rows")
        loader = run(data, 0, batch_size=5)
        got = list(loader)
        counts.append((len(data), len(loader), len(got), len(ids(got))))
    assert counts == [(23, 5, 5, 23)] * 2


def test_shuffle_row_groups_changes_the_order_per_epoch_deterministically(prefix: str) -> None:
    def order(epoch: int) -> list[int]:
        data = stream(prefix, shuffle_row_groups=True, seed=7)
        data.set_epoch(epoch)
        return ids(list(run(data, 0)))

    first, second = order(0), order(1)
    assert sorted(first) == sorted(second) == list(range(TOTAL))
    assert first != second and first != list(range(TOTAL))
    assert order(0) == first and order(1) == second
    # Row groups stay whole: runs of consecutive ids.
    starts = [i for n, i in enumerate(first) if n == 0 or first[n - 1] != i - 1]
    assert len(starts) <= 13  # 5 + 2 + 7 row groups, 14 of them, one may follow another


def test_shuffle_buffer_mixes_rows_and_keeps_every_row_once(prefix: str) -> None:
    def rows(seed: int, buffer: int) -> list[int]:
        return ids(list(run(stream(prefix, shuffle_buffer=buffer, seed=seed), 0)))

    mixed = rows(1, 16)
    assert Counter(mixed) == Counter(range(TOTAL))
    assert mixed != list(range(TOTAL))
    assert rows(1, 16) == mixed  # a function of the seed
    assert rows(2, 16) != mixed
    # Rows leave their row groups: some row is more than one row group away from its place.
    assert max(abs(i - n) for n, i in enumerate(mixed)) > ROW_GROUP


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
@pytest.mark.parametrize("split", ["rows", "row_groups"])
def test_iterable_exact_resume_mid_epoch_with_a_shuffle_buffer(
    prefix: str, workers: int, split: str
) -> None:
    def loader() -> DataLoader[Any]:
        data = stream(
            prefix, shuffle_buffer=9, shuffle_row_groups=True, seed=5, split=split, read_ahead=1
        )
        return run(data, workers, batch_size=3)

    full = ids(list(loader()))
    assert Counter(full) == Counter(range(TOTAL))
    for stop in (1, 4, 9):
        taken, state = stop_after(loader(), stop)
        assert taken + resumed(loader(), state) == full, stop


@pytest.mark.slow
def test_elastic_resume_from_two_workers_to_one(prefix: str) -> None:
    def loader(workers: int) -> DataLoader[Any]:
        return run(stream(prefix, shuffle_buffer=6, seed=1), workers, batch_size=3)

    for stop in (2, 5):
        taken, state = stop_after(loader(2), stop)
        rest = resumed(loader(0), state)
        assert Counter(taken + rest) == Counter(range(TOTAL)), stop


@pytest.mark.asyncio
async def test_async_for_yields_row_dicts(prefix: str, expected: list[dict[str, Any]]) -> None:
    data = IterableParquetDataset(prefix, columns=["tags", "id", "name"])
    got = [row async for row in data]
    assert [int(row["id"]) for row in got] == list(range(TOTAL))
    assert all(type(row) is dict and list(row) == ["tags", "id", "name"] for row in got)
    assert [plain(row["tags"]) for row in got] == [row["tags"] for row in expected]
    assert [row["name"] for row in got] == [row["name"] for row in expected]


def test_batch_size_none_yields_row_dicts(prefix: str) -> None:
    rows = list(run(stream(prefix, shuffle_buffer=4), 0, batch_size=None))
    assert all(type(row) is dict and list(row) == ["id"] for row in rows)
    assert Counter(int(row["id"]) for row in rows) == Counter(range(TOTAL))


def test_a_user_collate_fn_of_an_iterable_gets_row_dicts(prefix: str) -> None:
    data = IterableParquetDataset(prefix, columns=["name", "id"])
    batches = list(run(data, 0, batch_size=10, collate_fn=rows_as_list))
    assert [len(batch) for batch in batches] == [10] * 6 + [1]
    assert ids(batches) == list(range(TOTAL))


@pytest.fixture(scope="module")
def lines(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("lines") / "lines.jsonl"
    path.write_text("".join(json.dumps({"id": 1000 + n}) + "\n" for n in range(20)))
    return f"file://{path}"


@pytest.mark.parametrize("stop", [1, 6, 15])
def test_a_mix_with_another_source_yields_both_and_resumes(
    prefix: str, lines: str, stop: int
) -> None:
    def loader() -> DataLoader[Any]:
        first = stream(prefix, shuffle_buffer=5, seed=3)
        second = JsonLinesDataset(lines)
        mix = MixDataset([first, second], [0.7, 0.3], seed=1, stop="longest")
        return run(mix, 0, batch_size=3, collate_fn=rows_as_list)

    full = ids(list(loader()))
    assert Counter(full) == Counter([*range(TOTAL), *range(1000, 1020)])
    taken, state = stop_after(loader(), stop)
    assert taken + resumed(loader(), state) == full


def test_state_is_small_json(prefix: str) -> None:
    _, state = stop_after(run(stream(prefix, shuffle_buffer=8), 0), 3)
    stream_state = state["dataset"]
    assert stream_state["format"] == "aioload.parquet-stream"
    assert len(json.dumps(stream_state)) < 4000


def test_the_local_cache_serves_the_second_epoch_from_disk(
    tmp_path: Path, seaweedfs: Any, s3_storage_options: dict[str, Any], s3_prefix: str
) -> None:
    import obstore

    from aioload.sources import open_store

    paths = write_files(tmp_path / "files")

    async def upload() -> None:
        store, root = open_store(s3_prefix + "/", storage_options=s3_storage_options)
        for path in paths:
            await obstore.put_async(store, f"{root}{path.name}", path.read_bytes())

    asyncio.run(upload())
    url = s3_prefix + "/"
    cache = tmp_path / "cache"
    data = stream(url, cache_dir=cache, storage_options=s3_storage_options)
    assert len(list(data.files.load_blocking().urls)) == 3
    loader = run(data, 0)
    assert ids(list(loader)) == list(range(TOTAL))
    first = loader.stats().epoch
    assert first.store_bytes > 0 and first.cache_misses > 0
    assert ids(list(loader)) == list(range(TOTAL))
    second = loader.stats().epoch
    assert second.store_bytes == 0 and second.cache_hits > 0
    # A new dataset over the same cache (another process, another run) reads nothing.
    again = stream(url, cache_dir=cache, storage_options=s3_storage_options)
    loader = run(again, 0)
    assert ids(list(loader)) == list(range(TOTAL))
    assert loader.stats().epoch.store_bytes == 0
    leftover = again.take_source_counts()
    assert leftover is None or leftover.store_bytes == 0


# -- bad input -------------------------------------------------------------------------


def good_bytes(tmp_path: Path) -> bytes:
    path = tmp_path / "good.parquet"
    pq.write_table(table_of(0, 23), path, row_group_size=ROW_GROUP)
    return path.read_bytes()


def footer_start(data: bytes) -> int:
    return len(data) - 8 - int.from_bytes(data[-8:-4], "little")


def load_error(path: Path, **options: Any) -> BaseException:
    dataset = ParquetDataset(f"file://{path}", **options)
    with pytest.raises(Exception) as info:
        len(dataset)
    return info.value


def test_a_truncated_file_is_named(tmp_path: Path) -> None:
    data = good_bytes(tmp_path)
    for cut in (len(data) - 3, len(data) // 2, 10, 0):
        path = tmp_path / f"cut-{cut}.parquet"
        path.write_bytes(data[:cut])
        error = load_error(path)
        assert isinstance(error, ParquetFormatError), cut
        assert path.name in str(error)


def test_a_file_that_is_not_parquet_is_named(tmp_path: Path) -> None:
    path = tmp_path / "text.parquet"
    path.write_text("id,name\n1,a\n" * 50)
    error = load_error(path)
    assert isinstance(error, ParquetFormatError)
    assert "text.parquet" in str(error) and "not a Parquet file" in str(error)


def test_a_footer_length_too_large_is_named(tmp_path: Path) -> None:
    data = good_bytes(tmp_path)
    path = tmp_path / "long.parquet"
    path.write_bytes(data[:-8] + (len(data) + 1).to_bytes(4, "little") + b"PAR1")
    error = load_error(path)
    assert isinstance(error, ParquetFormatError) and "long.parquet" in str(error)
    assert "footer says" in str(error)


def test_a_footer_that_lies_about_column_chunks_is_named_with_its_row_group(
    tmp_path: Path,
) -> None:
    # The data region cut short, the footer kept: the last row groups' chunks now lie
    # where the footer is, or past the file.
    data = good_bytes(tmp_path)
    start = footer_start(data)
    path = tmp_path / "lies.parquet"
    path.write_bytes(data[: start - 300] + data[start:])
    error = load_error(path)
    assert isinstance(error, ParquetFormatError)
    assert "lies.parquet: row group 4" in str(error)  # the last one (23 rows: 5 groups)


def corrupt_data(data: bytes) -> bytes:
    """``data`` with every byte of its column chunks overwritten: the footer intact."""
    start = footer_start(data)
    return b"PAR1" + bytes((7 * i + 3) % 256 for i in range(4, start)) + data[start:]


def error_text(error: BaseException) -> str:
    return " ".join([str(error), *getattr(error, "__notes__", [])])


@pytest.mark.asyncio
async def test_data_that_does_not_decode_is_named_with_its_row_group(tmp_path: Path) -> None:
    path = tmp_path / "garbled.parquet"
    path.write_bytes(corrupt_data(good_bytes(tmp_path)))
    dataset = ParquetDataset(f"file://{path}")
    assert len(dataset) == 23  # the footer is fine
    with pytest.raises(ParquetFormatError) as info:
        await dataset[12]
    assert "garbled.parquet, row group 2" in error_text(info.value)


def test_a_missing_column_lists_the_columns(prefix: str) -> None:
    dataset = ParquetDataset(prefix, columns=["id", "nope"])
    with pytest.raises(KeyError) as info:
        len(dataset)
    assert "'nope'" in str(info.value) and "id, small, score, name" in str(info.value)
    assert "part-000.parquet" in str(info.value)
    with pytest.raises(KeyError, match="nope"):
        list(run(IterableParquetDataset(prefix, columns=["nope"]), 0))


def test_files_whose_schemas_disagree_are_named(tmp_path: Path) -> None:
    pq.write_table(
        pa.table({"id": pa.array([1, 2], pa.int64()), "x": [1, 2]}), tmp_path / "a.parquet"
    )
    pq.write_table(pa.table({"id": ["1", "2"], "x": [1, 2]}), tmp_path / "b.parquet")
    three = {"id": pa.array([3], pa.int64()), "x": [1], "y": [1]}
    pq.write_table(pa.table(three), tmp_path / "c.parquet")
    url = f"file://{tmp_path}/"
    with pytest.raises(ParquetFormatError, match=r"b\.parquet: column 'id' is string"):
        len(ParquetDataset(url))
    with pytest.raises(ParquetFormatError, match=r"c\.parquet has columns"):
        len(ParquetDataset([f"{url}a.parquet", f"{url}c.parquet"]))
    # A column one of them lacks is a KeyError naming it; the columns they share read.
    with pytest.raises(KeyError, match=r"a\.parquet has no column 'y'"):
        len(ParquetDataset([f"{url}a.parquet", f"{url}c.parquet"], columns=["y"]))
    dataset = ParquetDataset([f"{url}a.parquet", f"{url}c.parquet"], columns=["id"])
    assert len(dataset) == 3


@pytest.fixture
def with_a_bad_file(tmp_path: Path) -> str:
    paths = write_files(tmp_path)
    paths[1].write_bytes(corrupt_data(paths[1].read_bytes()))  # ids 23 to 29
    return f"file://{tmp_path}/"


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_an_unreadable_file_is_skipped_under_the_policy(with_a_bad_file: str, workers: int) -> None:
    loader = run(stream(with_a_bad_file, shuffle_buffer=4), workers, retry=FAST, on_error="skip")
    got = ids(list(loader))
    assert Counter(got) == Counter([*range(23), *range(30, TOTAL)])
    where = sorted(str(item.where) for item in loader.skipped)
    assert len(where) == 2  # the file's two row groups
    assert all("part-001.parquet, row group" in text for text in where)
    assert any("row group 0" in text for text in where) and any(
        "row group 1" in text for text in where
    )


def test_a_skipping_stream_resumes_exactly(with_a_bad_file: str) -> None:
    def loader() -> DataLoader[Any]:
        data = stream(with_a_bad_file, shuffle_buffer=6, shuffle_row_groups=True, seed=2)
        return run(data, 0, batch_size=4, retry=FAST, on_error="skip")

    full = ids(list(loader()))
    assert Counter(full) == Counter([*range(23), *range(30, TOTAL)])
    for stop in (1, 5, 10):
        taken, state = stop_after(loader(), stop)
        assert taken + resumed(loader(), state) == full, stop


def test_without_a_policy_data_that_does_not_decode_is_a_format_error(
    with_a_bad_file: str,
) -> None:
    # Not an OSError (pyarrow's own type for it): a retry policy must not read it again.
    with pytest.raises(ParquetFormatError) as info:
        list(run(stream(with_a_bad_file), 0))
    assert isinstance(info.value.__cause__, pa.ArrowException | OSError)
    assert "part-001.parquet, row group 0" in error_text(info.value)


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_map_style_skips_only_the_rows_that_do_not_decode(
    with_a_bad_file: str, workers: int
) -> None:
    dataset = ParquetDataset(with_a_bad_file, columns=["id"])
    loader = DataLoader(dataset, batch_size=8, num_workers=workers, retry=FAST, on_error="skip")
    got = ids(list(loader))
    assert Counter(got) == Counter([*range(23), *range(30, TOTAL)])
    assert sorted(int(item.key) for item in loader.skipped) == list(range(23, 30))
    assert loader.stats().total.retries == 0  # a format error is not retried


@pytest.fixture
def with_a_truncated_file(tmp_path: Path) -> str:
    paths = write_files(tmp_path)
    data = paths[1].read_bytes()
    paths[1].write_bytes(data[: len(data) // 2])  # ids 23 to 29: the footer gone
    return f"file://{tmp_path}/"


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_a_file_whose_footer_cannot_be_read_is_skipped_under_the_policy(
    with_a_truncated_file: str, workers: int
) -> None:
    data = stream(with_a_truncated_file, shuffle_buffer=4)
    loader = run(data, workers, on_error="skip")
    for _ in range(2):  # every epoch: skipped and recorded once
        got = ids(list(loader))
        assert Counter(got) == Counter([*range(23), *range(30, TOTAL)])
        (item,) = loader.skipped
        assert item.key == f"{with_a_truncated_file}part-001.parquet"
        assert item.error_type.endswith("ParquetFormatError")
        assert "its footer cannot be read" in str(item.where)
    # Without the policy the stream fails at that footer, as it did, naming the file.
    with pytest.raises(ParquetFormatError, match=r"part-001\.parquet: not a Parquet file"):
        list(run(stream(with_a_truncated_file), 0))


def test_a_missing_file_is_skipped_and_the_rows_split_over_the_readable_ones(
    with_a_truncated_file: str,
) -> None:
    urls = [f"{with_a_truncated_file}part-{i:03d}.parquet" for i in (0, 2)]
    urls.insert(1, f"{with_a_truncated_file}gone.parquet")
    seen: list[int] = []
    for rank in range(2):
        data = stream(urls, rank=rank, world_size=2)
        assert len(data) == (23 + 31) // 2  # the readable files' rows, split
        loader = run(data, 0, on_error="skip")
        seen += ids(list(loader))
        (item,) = loader.skipped
        assert item.key == urls[1] and item.error_type == "builtins.FileNotFoundError"
    assert sorted(seen) == [*range(23), *range(30, TOTAL)]
    with pytest.raises(FileNotFoundError, match=r"gone\.parquet"):
        list(run(stream(urls), 0))


def test_map_style_needs_every_footer_whatever_the_policy(with_a_truncated_file: str) -> None:
    # Its length, and so every row's index, counts every file's rows: a file whose footer
    # cannot be read fails it, naming the file, as without the policy.
    dataset = ParquetDataset(with_a_truncated_file, columns=["id"])
    loader = DataLoader(dataset, batch_size=8, on_error="skip")
    with pytest.raises(ParquetFormatError, match=r"part-001\.parquet"):
        list(loader)


# -- fuzz ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_file(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    path = tmp_path_factory.mktemp("small") / "small.parquet"
    pq.write_table(table_of(0, 12), path, row_group_size=4)
    return path.read_bytes()


def footer_of(data: bytes) -> Footer | None:
    """Reads ``data``'s footer as a file of a store would; None when it is refused."""

    async def read(byte_range: int | tuple[int, int]) -> tuple[int, bytes]:
        if isinstance(byte_range, int):
            return len(data), data[max(len(data) + byte_range, 0) :]
        first, end = byte_range
        assert 0 <= first <= end <= len(data), byte_range  # asks only for bytes that exist
        return len(data), data[first:end]

    async def read_and_parse() -> Footer:
        size, tail = await read_footer_bytes(read, "mem://x.parquet")
        return parse_footer(size, tail, "mem://x.parquet")

    try:
        return asyncio.run(read_and_parse())
    except ParquetFormatError as error:
        assert str(error).startswith("mem://x.parquet")
        return None


def test_the_real_file_parses(small_file: bytes) -> None:
    footer = footer_of(small_file)
    assert footer is not None and footer.row_counts == (4, 4, 4)


def test_a_bit_flipped_anywhere_in_the_footer_never_aborts(small_file: bytes) -> None:
    # pyarrow aborts the process on some column chunk metadata that does not validate
    # (size statistics that do not fit the schema) when its Python accessor builds it;
    # parse_footer has pyarrow's reader check it first. One bit of every footer byte.
    start = footer_start(small_file)
    outcomes: Counter[str] = Counter()
    for at in range(start, len(small_file) - 8):
        mangled = bytearray(small_file)
        mangled[at] ^= 1 << (at % 8)
        try:
            parse_footer(len(mangled), bytes(mangled[start:]), "mem://x.parquet")
            outcomes["footer"] += 1
        except ParquetFormatError as error:
            outcomes["histogram" if "histogram" in str(error) else "refused"] += 1
    assert outcomes["footer"] and outcomes["refused"]
    assert outcomes["histogram"]  # the case that aborted


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_mangled_tails_give_a_footer_or_a_parquet_format_error(
    small_file: bytes, data: st.DataObject
) -> None:
    kind = data.draw(st.sampled_from(["cut", "flip", "overwrite", "random", "length"]))
    mangled = bytearray(small_file)
    tail = min(len(mangled), 600)
    if kind == "cut":
        mangled = mangled[: data.draw(st.integers(0, len(mangled)))]
    elif kind == "flip":
        for _ in range(data.draw(st.integers(1, 8))):
            at = len(mangled) - 1 - data.draw(st.integers(0, tail - 1))
            mangled[at] ^= 1 << data.draw(st.integers(0, 7))
    elif kind == "overwrite":
        at = len(mangled) - data.draw(st.integers(1, tail))
        chunk = data.draw(st.binary(min_size=1, max_size=32))
        mangled[at : at + len(chunk)] = chunk
    elif kind == "random":
        mangled = bytearray(data.draw(st.binary(max_size=300)))
        if data.draw(st.booleans()):
            mangled += b"PAR1"
    else:
        length = data.draw(st.integers(0, 2**32 - 1))
        mangled[-8:-4] = length.to_bytes(4, "little")
    footer = footer_of(bytes(mangled))
    if footer is not None:  # what a footer that passes says holds of the file
        assert footer.size == len(mangled)
        assert sum(footer.row_counts) == footer.metadata.num_rows


@settings(max_examples=150, deadline=None)
@given(
    JSON_VALUES,
    st.sampled_from(
        ["runs", "buffer", "ready", "rng", "layout", "epoch", "draining", "units", "version"]
    ),
)
def test_a_malformed_stream_state_is_refused_clearly(value: Any, field: str) -> None:
    rows = [5, 5, 3]
    good = {
        "format": "aioload.parquet-stream",
        "version": 1,
        "units": 3,
        "epoch": 0,
        "layout": {},
        "runs": [[0, 0, 5], [2, 1, 3]],
        "buffer": [[1, 0, 2]],
        "ready": [],
        "rng": None,
        "draining": False,
    }
    check_rows_state(good, rows)
    try:
        check_rows_state({**good, field: value}, rows)
    except ShardStateError as error:
        assert str(error).startswith("Parquet stream state: ")


@pytest.mark.parametrize(
    "change",
    [
        {"runs": [[0, 0, 6]]},  # past the unit's rows
        {"runs": [[3, 0, 1]]},  # past the units
        {"buffer": [[0, 2, 2]]},  # an empty run
        {"units": 4},
        {"format": "aioload.shard-stream"},
        {"epoch": -1},
        {"draining": 1},
    ],
)
def test_a_state_of_other_files_is_refused(change: dict[str, Any]) -> None:
    good = {
        "format": "aioload.parquet-stream",
        "version": 1,
        "units": 3,
        "epoch": 0,
        "layout": {},
        "runs": [],
        "buffer": [],
        "ready": [],
        "rng": None,
        "draining": False,
    }
    with pytest.raises(ShardStateError):
        check_rows_state({**good, **change}, [5, 5, 3])


def test_a_loader_refuses_a_state_of_other_files(prefix: str, tmp_path: Path) -> None:
    _, state = stop_after(run(stream(prefix), 0), 2)
    write_files(tmp_path, [4, 4])
    with pytest.raises(ShardStateError, match="row groups"):
        run(stream(f"file://{tmp_path}/"), 0).load_state_dict(state)


# -- what pyarrow reads -----------------------------------------------------------------


@pytest.mark.parametrize(
    "columns", [None, ["id"], ["name", "tags"], ["vec", "score", "small"]], ids=str
)
def test_pyarrow_reads_only_the_bytes_fetched(
    prefix: str, expected: list[dict[str, Any]], columns: list[str] | None, monkeypatch: Any
) -> None:
    # Decoding goes through a sparse in-memory file, where a byte not fetched reads as 0;
    # the strict file object refuses such a read instead: the same rows come through it.
    from aioload.sources.parquet import read as parquet_read

    monkeypatch.setattr(parquet_read, "STRICT_READS", True)
    loader = DataLoader(ParquetDataset(prefix, columns=columns), batch_size=7, collate_fn=list)
    got = [row for batch in loader for row in batch]
    names = columns or list(expected[0])
    assert [plain_row(row) for row in got] == [
        {name: row[name] for name in names} for row in expected
    ]


# -- the decoded row groups' cache ------------------------------------------------------


@pytest.mark.asyncio
async def test_a_row_group_read_nobody_waits_for_any_more_is_cancelled() -> None:
    from aioload.sources.parquet.row_group_cache import RowGroupCache

    started: list[int] = []
    release = asyncio.Event()

    async def read(unit: int) -> pa.Table:
        started.append(unit)
        await release.wait()
        return pa.table({"id": [unit]})

    cache = RowGroupCache(read, 1 << 20)
    first = asyncio.ensure_future(cache.get(3))
    second = asyncio.ensure_future(cache.get(3))
    await asyncio.sleep(0)
    first.cancel()  # one of two batches gone: the read goes on for the other
    await asyncio.sleep(0)
    release.set()
    assert (await second).column("id").to_pylist() == [3]
    assert started == [3] and len(cache) == 1
    release.clear()
    cache.clear()
    alone = asyncio.ensure_future(cache.get(5))
    await asyncio.sleep(0)
    alone.cancel()  # its only batch gone: the read is cancelled, no task outlives it
    for _ in range(3):  # the cancellations land
        await asyncio.sleep(0)
    assert not [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    again = asyncio.ensure_future(cache.get(5))  # a later batch reads it afresh
    await asyncio.sleep(0)
    release.set()
    assert (await again).column("id").to_pylist() == [5]
    assert started == [3, 5, 5]
