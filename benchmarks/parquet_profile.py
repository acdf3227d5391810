"""Where an ``IterableParquetDataset`` epoch's time goes: ``bench_parquet.py --profile``.

Two tables, so that the next regression shows where it is:

- **the epoch, stage by stage** (:func:`epoch_phases`): a fresh dataset's epoch through
  ``DataLoader`` (``for``, 0 workers) against the real server, its clock split at the
  footers (:meth:`ParquetFiles.load`), the first batch the consumer receives, and the last
  one; beside it the reads (every ``read_groups`` call, one file's row groups fetched and
  decoded: when the first starts and ends, from the first one's start to the last one's
  end, and their sum, which overlaps the loop).
- **a batch's way from a decoded row group to the caller** (:func:`batch_path`): the same
  epoch with every row group decoded already (the dataset's reads answered from memory),
  so that only the per-batch work is left, measured by adding one step at a time — the
  stream cutting its batches (``batch_stream``), collating each (``default_collate``), the
  checkpoint state after each (what the loader takes: ``state_snapshot()``), then the
  whole loader (``async for`` and ``for``): each step's cost is the difference to the one
  before, in CPU time (the process's), medians of runs taking turns.

Only public or documented names are used (``batch_stream``, ``state_snapshot``,
``files.load``/``files.read_groups``/``files.read_many``), so that a refactor of the stream
keeps the profile valid.

Example::

    phases = epoch_phases(lambda: IterableParquetDataset(urls, storage_options=options), 256, 5)
    print_table("the epoch", phases)
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aioload import DataLoader
from aioload.collate import default_collate


def _timed(record: list[tuple[float, float]], call: Callable[..., Awaitable[Any]]) -> Any:
    async def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return await call(*args, **kwargs)
        finally:
            record.append((start, time.perf_counter()))

    return timed


def epoch_phases(
    make: Callable[[], Any], batch_size: int, repeat: int
) -> list[tuple[str, float, str]]:
    """Medians over ``repeat`` epochs of fresh datasets from ``make()``: (stage, ms, note)."""
    rows: dict[str, list[float]] = {}
    batches = 0
    for run in range(repeat + 1):
        dataset = make()  # made before the clock starts, as in the benchmark's cases
        footers: list[tuple[float, float]] = []
        reads: list[tuple[float, float]] = []
        files = dataset.files
        files.load = _timed(footers, files.load)
        if hasattr(files, "read_groups"):  # one file's row groups, early reads too
            files.read_groups = _timed(reads, files.read_groups)
        else:  # (before read_groups: every read went through read_many)
            files.read_many = _timed(reads, files.read_many)
        start = time.perf_counter()
        first = None
        batches = 0
        for _ in DataLoader(dataset, batch_size=batch_size):
            batches += 1
            if first is None:
                first = time.perf_counter()
        end = time.perf_counter()
        if run == 0 or first is None:
            continue  # the first run warms imports, connections, the page cache
        footers_end = footers[0][1]
        stages = {
            "epoch (wall)": end - start,
            "footers: asked for (after the epoch's start)": footers[0][0] - start,
            "footers (before any data)": footers_end - start,
            "first batch, after the footers": first - footers_end,
            "the other batches": end - first,
            "first read starts (after the epoch's)": min(s for s, _ in reads) - start,
            "first read ends": min(e for _, e in reads) - start,
            "reads: first start to last end": max(e for _, e in reads) - min(s for s, _ in reads),
            "reads: sum of their spans": sum(e - s for s, e in reads),
        }
        for name, seconds in stages.items():
            rows.setdefault(name, []).append(seconds)
    per_batch = statistics.median(rows["the other batches"]) / max(batches - 1, 1)
    notes = {
        "the other batches": f"{per_batch * 1e6:.1f} µs a batch ({batches} batches)",
        "reads: sum of their spans": "one file's row groups each: fetch + decode, overlapping",
    }
    return [(name, statistics.median(v) * 1e3, notes.get(name, "")) for name, v in rows.items()]


def _answered_from_memory(make: Callable[[], Any]) -> Callable[[], Any]:
    """``make``, with the datasets' reads answered from row groups decoded once, here."""
    model = make()
    files = model.files
    files.load_blocking()
    tables = asyncio.run(files.read_many(list(range(len(files.units)))))

    async def read_many(units: list[int]) -> list[Any]:
        return [tables[unit] for unit in units]

    def made() -> Any:
        dataset = make()
        dataset.files = files  # footers loaded: only the per-batch work is timed
        dataset._counts = files.counts
        files.read_many = read_many
        return dataset

    return made


def batch_path(
    make: Callable[[], Any], batch_size: int, repeat: int
) -> list[tuple[str, float, str]]:
    """The per-batch work with the reads taken away, step by step: (stage, CPU µs a batch, note)."""
    made = _answered_from_memory(make)

    def stream(collate: bool, state: bool) -> Callable[[], int]:
        def run() -> int:
            dataset = made()

            async def epoch() -> int:
                count = 0
                # What the loader takes after each batch: a snapshot, where the dataset
                # makes one (made into JSON only if a checkpoint asks), else state_dict().
                take_state = getattr(dataset, "state_snapshot", dataset.state_dict)
                async for block in dataset.batch_stream(batch_size, False, None):
                    if collate:
                        default_collate(block)
                    if state:
                        take_state()
                    count += 1
                return count

            return asyncio.run(epoch())

        return run

    def loader(use_async: bool) -> Callable[[], int]:
        def run() -> int:
            dataset = made()
            if not use_async:
                return sum(1 for _ in DataLoader(dataset, batch_size=batch_size))

            async def epoch() -> int:
                return len([b async for b in DataLoader(dataset, batch_size=batch_size)])

            return asyncio.run(epoch())

        return run

    steps = {
        "stream: cutting (batch_stream)": stream(False, False),
        "+ collating (default_collate)": stream(True, False),
        "+ checkpoint state (as the loader takes it)": stream(True, True),
        "+ the loader's hand-off, async for": loader(True),
        "+ the loader's hand-off, for (not async for)": loader(False),
    }
    # CPU time (the process's: the loader's thread under ``for`` too), not the clock: on a
    # machine shared with other work, the clock counts their time as well. The steps take
    # turns, so that a change of the machine's load falls on all of them alike.
    times: dict[str, list[float]] = {name: [] for name in steps}
    batches = 1
    for turn in range(repeat + 1):
        for name, run in steps.items():
            start = time.process_time()
            batches = run()
            if turn:  # the first turn warms up
                times[name].append(time.process_time() - start)
    totals = {name: statistics.median(values) / batches for name, values in times.items()}
    rows = []
    names = list(totals)
    for number, name in enumerate(names):
        # async for and for both add to the same step: the state, before the loader.
        before = names[min(number - 1, 2)] if number else None
        step = totals[name] - (totals[before] if before else 0.0)
        rows.append((name, step * 1e6, f"total {totals[name] * 1e6:.1f} µs a batch"))
    return rows


def print_table(title: str, rows: list[tuple[str, float, str]], unit: str) -> None:
    """One profile table: stage, value in ``unit``, note."""
    print(f"\n{title}")
    print(f"{'stage':<48} {unit:>10}  note")
    for name, value, note in rows:
        print(f"{name:<48} {value:>10.2f}  {note}")
