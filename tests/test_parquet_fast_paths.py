"""The Parquet stream's fast paths against the plain ones: the same batches, states, resumes.

- a batch cut as a window of a decoded row group (the stream moves an offset) against the
  rows pyarrow reads, batch by batch, with the state after every batch resuming exactly;
- reads started while the footers arrive (``EarlyReads``) against a stream whose footers
  were all read first: the same batches and the same ``state_dict`` after every batch, the
  early reads really taken (and one that fails read again);
- the checkpoint state taken after each batch as the loader takes it (a snapshot, made
  into JSON only when a checkpoint asks), against ``state_dict()`` asked at the same point,
  resolved long after, pickled, and resumed from;
- the loader over such streams (one task reading the stream), resumed exactly.

Files are written by pyarrow (uneven sizes, several row groups) and read
through ``file://`` URLs.
"""

from __future__ import annotations

import asyncio
import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from aioload import DataLoader
from aioload.data.row_block import LazyState, resolve_state
from aioload.sources import IterableParquetDataset
from aioload.sources.parquet import early as early_module
from aioload.sources.parquet import read as parquet_read
from aioload.sources.parquet.early import EarlyReads
from aioload.worker_info import WorkerInfo, set_thread_worker_info

SIZES = [23, 7, 31, 12]  # rows per file, row groups of 5 (the last ones shorter)
ROW_GROUP = 5
TOTAL = sum(SIZES)


@pytest.fixture(scope="module")
def urls(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    folder = tmp_path_factory.mktemp("fast")
    found, first = [], 0
    for number, size in enumerate(SIZES):
        ids = np.arange(first, first + size, dtype=np.int64)
        table = pa.table({"id": ids, "x": ids * 0.5, "s": [f"r{i}" for i in ids.tolist()]})
        path = folder / f"part-{number}.parquet"
        pq.write_table(table, path, row_group_size=ROW_GROUP)
        found.append(f"file://{path}")
        first += size
    return found


def epoch(
    dataset: IterableParquetDataset, batch_size: int, stop: int | None = None
) -> tuple[list[dict[str, Any]], list[Any]]:
    """The batches (as lists) and the state after each, through the stream alone."""
    batches: list[dict[str, Any]] = []
    states: list[Any] = []

    async def run() -> None:
        stream = dataset.batch_stream(batch_size, False, None)
        try:
            async for block in stream:
                batch = block.collate()
                batches.append({k: np.asarray(v).tolist() for k, v in batch.items()})
                states.append(json.loads(json.dumps(dataset.state_dict())))
                if stop is not None and len(batches) == stop:
                    return
        finally:
            await stream.aclose()

    asyncio.run(run())
    return batches, states


def make(urls: list[str], loaded: bool, **options: Any) -> IterableParquetDataset:
    dataset = IterableParquetDataset(urls, **options)
    if loaded:
        asyncio.run(dataset.load())  # the footers first: no early reads
    return dataset


@pytest.mark.parametrize("batch_size", [1, 4, 5, 7, 64])
def test_windows_are_the_rows_pyarrow_reads_and_resume_exactly(
    urls: list[str], batch_size: int
) -> None:
    table = pa.concat_tables([pq.read_table(url[len("file://") :]) for url in urls])
    rows = table.to_pydict()
    batches, states = epoch(make(urls, True, read_ahead=1), batch_size)
    at = 0
    for batch in batches:
        end = min(at + batch_size, TOTAL)
        assert batch == {name: rows[name][at:end] for name in rows}
        at = end
    assert at == TOTAL
    for number in (0, len(batches) // 2, len(batches) - 1):
        dataset = make(urls, True, read_ahead=1)
        dataset.load_state_dict(states[number])
        rest, rest_states = epoch(dataset, batch_size)
        assert rest == batches[number + 1 :]
        assert rest_states == states[number + 1 :]


@pytest.mark.parametrize("read_ahead", [1, 200, 10**9])
@pytest.mark.parametrize("batch_size", [3, 16])
def test_early_reads_give_the_batches_and_states_of_footers_read_first(
    urls: list[str], read_ahead: int, batch_size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    taken: list[tuple[int, ...]] = []
    take = EarlyReads.take

    def counted(self: EarlyReads, units: list[int]) -> Any:
        task = take(self, units)
        if task is not None:
            taken.append(tuple(units))
        return task

    monkeypatch.setattr(EarlyReads, "take", counted)
    plain = epoch(make(urls, True, read_ahead=read_ahead), batch_size)
    assert not taken  # footers read first: nothing early
    fast = epoch(make(urls, False, read_ahead=read_ahead), batch_size)
    assert taken and taken[0][0] == 0  # the first refill's reads were the early ones
    assert fast == plain
    if read_ahead == 1:
        assert taken == [(0,)]  # one row group: what the read-ahead takes first
    if read_ahead == 10**9:  # each file's row groups together
        assert taken[0] == tuple(range(5))


def test_a_failed_early_read_is_read_again(
    urls: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    read = early_module.EarlyReads._read

    async def failing(self: EarlyReads, file: int, footer: Any, groups: list[int]) -> Any:
        calls.append(file)
        if len(calls) == 1:
            raise OSError("the store went away for a moment")
        return await read(self, file, footer, groups)

    monkeypatch.setattr(early_module.EarlyReads, "_read", failing)
    plain = epoch(make(urls, True), 8)
    assert epoch(make(urls, False), 8) == plain
    assert calls  # the early reads ran (the first failed and was read by the stream)


@pytest.mark.parametrize("workers", [2, 3])
def test_early_reads_of_one_worker_of_several(urls: list[str], workers: int) -> None:
    """Every ``workers``-th row group from the worker's: what the split gives it."""
    for worker in range(workers):
        info = WorkerInfo(id=worker, num_workers=workers, seed=0, dataset=None, batch_size=4)
        set_thread_worker_info(info)
        try:
            plain = epoch(make(urls, True, read_ahead=200), 4)
            fast = epoch(make(urls, False, read_ahead=200), 4)
        finally:
            set_thread_worker_info(None)
        assert fast == plain


def test_early_reads_are_left_out_where_the_split_needs_every_footer(urls: list[str]) -> None:
    for options in ({"shuffle_row_groups": True}, {"split": "rows", "world_size": 2, "rank": 0}):
        dataset = make(urls, False, **options)
        assert dataset._early_reads(0, 1) is None
    resumed = make(urls, False)
    _, states = epoch(make(urls, True), 4, stop=2)
    resumed.load_state_dict(states[-1])
    assert resumed._early_reads(0, 1) is None


@pytest.mark.parametrize("in_loader", ["for", "async for"])
def test_the_loader_resumes_early_read_streams_exactly(urls: list[str], in_loader: str) -> None:
    def loader() -> DataLoader[Any]:
        return DataLoader(make(urls, False, read_ahead=1), batch_size=6)

    def ids(source: DataLoader[Any]) -> list[list[int]]:
        if in_loader == "for":
            return [np.asarray(batch["id"]).tolist() for batch in source]

        async def collect() -> list[list[int]]:
            return [np.asarray(batch["id"]).tolist() async for batch in source]

        return asyncio.run(collect())

    full = ids(loader())
    assert [i for batch in full for i in batch] == list(range(TOTAL))
    for stop in (1, 5, len(full) - 1):
        first = loader()
        it = iter(first)
        for _ in range(stop):
            next(it)
        state = json.loads(json.dumps(first.state_dict()))
        del it
        resumed = loader()
        resumed.load_state_dict(state)
        assert full[:stop] + ids(resumed) == full, stop


@pytest.mark.parametrize(
    "options",
    [
        {"read_ahead": 1},
        {"read_ahead": 200},
        {"shuffle_buffer": 9, "seed": 3, "read_ahead": 1},
        {"shuffle_buffer": 40, "shuffle_row_groups": True, "seed": 1},
    ],
)
@pytest.mark.parametrize("rows", [False, True])
def test_a_snapshot_resolves_later_to_the_state_of_its_moment(
    urls: list[str], options: dict[str, Any], rows: bool
) -> None:
    """What the loader takes after each batch (``state_snapshot``), resolved only at the end,
    is ``state_dict()`` as it was then, and resumes exactly; pickled, it is that JSON."""
    dataset = make(urls, False, **options)
    snapshots: list[Any] = []
    states: list[Any] = []
    taken: list[int] = []

    async def run() -> None:
        if rows:  # row by row (the loader without automatic batching)
            async for row in dataset:
                taken.append(int(row["id"]))
                snapshots.append(dataset.state_snapshot())
                states.append(json.loads(json.dumps(dataset.state_dict())))
            return
        stream = dataset.batch_stream(4, False, None)
        async for block in stream:
            taken.extend(np.asarray(block.collate()["id"]).tolist())
            snapshots.append(dataset.state_snapshot())
            states.append(json.loads(json.dumps(dataset.state_dict())))
        await stream.aclose()

    asyncio.run(run())
    assert sorted(taken) == list(range(TOTAL))
    assert all(isinstance(snapshot, LazyState) for snapshot in snapshots)
    resolved = [resolve_state(snapshot) for snapshot in snapshots]
    assert resolved == states
    assert resolve_state(snapshots[0]) is not resolve_state(snapshots[0])  # a new one each time
    assert [pickle.loads(pickle.dumps(snapshot)) for snapshot in snapshots[:3]] == states[:3]
    for number in (0, len(states) // 2):
        again = make(urls, True, **options)
        again.load_state_dict(resolved[number])
        rest: list[int] = []

        async def finish(source: IterableParquetDataset = again, into: list[int] = rest) -> None:
            async for row in source:
                into.append(int(row["id"]))

        asyncio.run(finish())
        done = number + 1 if rows else sum(min(4, TOTAL - 4 * i) for i in range(number + 1))
        assert taken[:done] + rest == taken, number


def test_early_reads_through_the_local_cache(urls: list[str], tmp_path: Path) -> None:
    """Early reads keep and find their chunks in the cache as the stream's own reads do."""
    plain = epoch(make(urls, True), 8)
    for _ in range(2):  # the first epoch fills the cache, the second reads from it
        dataset = make(urls, False, cache_dir=tmp_path / "cache")
        assert epoch(dataset, 8) == plain
    counts = dataset.take_source_counts()  # the second epoch's: all from the cache
    assert counts is not None and counts.cache_hits and not counts.store_bytes


def test_a_snapshot_keeps_no_rows_alive(urls: list[str]) -> None:
    """A state kept by the loader (the last one, between epochs too) holds labels only."""
    dataset = make(urls, True, read_ahead=10**9, shuffle_buffer=6)
    kept: list[Any] = []

    async def run() -> None:
        stream = dataset.batch_stream(4, False, None)
        async for _ in stream:
            kept.append(dataset.state_snapshot())
            break
        await stream.aclose()

    asyncio.run(run())
    frame = kept[0]._make.args  # what the snapshot holds: segments, labels, no tables
    pieces = [p for p in frame if hasattr(p, "labels")] + [
        p for part in frame if isinstance(part, tuple) for p in part if hasattr(p, "labels")
    ]
    assert pieces and all(piece.make_table().num_columns == 0 for piece in pieces)
    parts = [part for held in frame if isinstance(held, tuple) for part in held]
    assert not any(isinstance(part, asyncio.Task | tuple) for part in parts)


def test_early_reads_in_worker_processes(urls: list[str]) -> None:
    """Two worker processes, each reading its own row groups early: the batches and the
    loader's state (each worker's snapshot, pickled as its JSON) of footers read first."""

    def run(loaded: bool) -> tuple[list[list[int]], Any]:
        loader = DataLoader(
            make(urls, loaded, read_ahead=200),
            batch_size=4,
            num_workers=2,
            multiprocessing_context="forkserver",
            generator=0,  # the same base seed in both loaders
        )
        it = iter(loader)
        batches = [np.asarray(next(it)["id"]).tolist() for _ in range(5)]
        state = json.loads(json.dumps(loader.state_dict()))
        batches += [np.asarray(batch["id"]).tolist() for batch in it]
        return batches, state

    plain, plain_state = run(True)
    fast, fast_state = run(False)
    assert fast == plain and fast_state == plain_state
    assert sorted(i for batch in fast for i in batch) == list(range(TOTAL))


@pytest.mark.parametrize("share", [0.0, 2.0])
def test_the_dense_and_sparse_decodes_give_the_rows_of_strict_reads(
    urls: list[str], share: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One buffer of the file's size (every read) or a sparse memfd (none), against the
    file object that refuses a read of any byte not fetched; a column subset too."""
    for columns in (None, ["x"], ["s", "id"]):
        monkeypatch.setattr(parquet_read, "STRICT_READS", True)
        strict = epoch(make(urls, True, columns=columns), 8)
        monkeypatch.setattr(parquet_read, "STRICT_READS", False)
        monkeypatch.setattr(parquet_read, "DENSE_SHARE", share)
        assert epoch(make(urls, False, columns=columns), 8) == strict
