"""One check of stream resumes for every stream format: stop, save, resume, count.

A :class:`Format` builds a stream dataset of one format (tar shards, JSON lines, Parquet)
over small local files whose samples are numbered 0 to ``total - 1``. :func:`check_resume`
runs a job of ``world_size`` ranks (simulated in this process: each rank is a dataset built
with ``rank=``/``world_size=``), stops each rank's loader after some batches, saves its
state through JSON, and resumes:

- without ``new_world_size``: each rank from its own state, with ``workers_after`` workers
  (the elastic resume of one rank's own state);
- with it: a job of ``new_world_size`` ranks, each loading the states of every old rank
  merged (``merge_states``).

It asserts what users rely on: the union of what the resumed ranks yield is exactly what
the old ranks had left, each sample once (a sample left twice by the padding of a sized
split: once; where no rank had delivered anything, the new job's own epoch), and, resumed
with the same split, in the order an uninterrupted epoch has.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from aioload import DataLoader

BATCH = 3


@dataclass(frozen=True)
class Format:
    """One stream format over local files: how to build its dataset, and its options."""

    name: str
    build: Callable[..., Any]
    total: int
    splits: tuple[str, ...]  # the whole split first, then the sized one if it has one
    shuffle: str  # the argument that shuffles the units
    in_flight: str | None = None  # the argument of the units read at once
    options: dict[str, Any] = field(default_factory=dict)

    def dataset(self, rank: int, world_size: int, **options: Any) -> Any:
        return self.build(rank=rank, world_size=world_size, **{**self.options, **options})


# -- the formats' files ---------------------------------------------------------------------

UNIT_SIZES = [9, 4, 13, 0, 6, 11]  # samples per shard or file (43 in all; one empty file)
ROW_GROUPS = [[10, 7], [5], [12, 3, 6]]  # rows per row group, by file (43 in all)


def tar_number(raw: dict[str, Any]) -> int:
    """A tar sample's number (module level: runs in the workers)."""
    return int(raw["cls"])


def line_number(row: Any) -> int:
    """A JSON line's number (module level: runs in the workers)."""
    return int(row["n"])


def write_tar(folder: Path) -> Format:
    from aioload.sources import ShardDataset, ShardWriter

    folder.mkdir(parents=True, exist_ok=True)
    number = 0
    for shard, size in enumerate(UNIT_SIZES[:3] + UNIT_SIZES[4:]):
        pattern = str(folder / "part-%03d.tar")
        with ShardWriter(pattern, maxcount=max(size, 1), start_shard=shard) as writer:
            for _ in range(size):
                writer.write({"__key__": f"{number:06d}", "cls": number, "txt": "x" * number})
                number += 1
    urls = [path.as_uri() for path in sorted(folder.glob("*.tar"))]

    def build(**options: Any) -> Any:
        return ShardDataset(urls, decode=tar_number, **options)

    return Format("tar", build, number, ("shards", "samples"), "shuffle_shards", "shards_in_flight")


def write_jsonl(folder: Path) -> Format:
    from aioload.sources import JsonLinesDataset

    folder.mkdir(parents=True, exist_ok=True)
    number, urls = 0, []
    for file, size in enumerate(UNIT_SIZES):
        lines = []
        for _ in range(size):
            lines.append(json.dumps({"n": number}).encode())
            if number % 5 == 1:
                lines.append(b"  ")  # a blank line: no sample, but a line
            number += 1
        path = folder / f"part-{file:03d}.jsonl"
        path.write_bytes(b"\n".join(lines) + (b"\n" if file % 2 else b""))
        urls.append(path.as_uri())

    def build(**options: Any) -> Any:
        return JsonLinesDataset(urls, decode=line_number, **options)

    return Format("jsonl", build, number, ("files",), "shuffle_files", "files_in_flight")


def write_parquet(folder: Path) -> Format:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from aioload.sources import IterableParquetDataset

    folder.mkdir(parents=True, exist_ok=True)
    number = 0
    for file, groups in enumerate(ROW_GROUPS):
        with pq.ParquetWriter(
            folder / f"part-{file:03d}.parquet", pa.schema([("id", pa.int64())])
        ) as w:
            for size in groups:
                w.write_table(pa.table({"id": list(range(number, number + size))}))
                number += size
    prefix = f"{folder.as_uri()}/"

    def build(**options: Any) -> Any:
        return IterableParquetDataset(prefix, **options)

    return Format("parquet", build, number, ("row_groups", "rows"), "shuffle_row_groups")


# -- the check ------------------------------------------------------------------------------


def numbers(batches: Sequence[Any]) -> list[int]:
    """The sample numbers of collated batches (arrays, or Parquet's dicts of arrays)."""
    found: list[int] = []
    for batch in batches:
        values = batch["id"] if isinstance(batch, dict) else batch
        found += [int(x) for x in np.asarray(values).reshape(-1)]
    return found


def loader(dataset: Any, workers: int) -> DataLoader[Any]:
    return DataLoader(dataset, batch_size=BATCH, num_workers=workers)


def stop_after(run: DataLoader[Any], count: int) -> tuple[list[int], dict[str, Any]]:
    """The samples of the first ``count`` batches and the loader's state then, via JSON."""
    it = iter(run)
    try:
        taken = [next(it) for _ in range(count)]
        state = json.loads(json.dumps(run.state_dict()))
    finally:
        it.close()  # type: ignore[attr-defined]
    return numbers(taken), state


def resumed(run: DataLoader[Any], state: dict[str, Any]) -> list[int]:
    run.load_state_dict(state)
    return numbers(list(run))


def check_resume(
    fmt: Format,
    *,
    world_size: int,
    workers_before: int,
    workers_after: int,
    stops: Sequence[float],
    new_world_size: int | None = None,
    **options: Any,
) -> None:
    """Stops every rank after a share ``stops[rank]`` (0 to 1) of its batches, resumes
    (see the module docstring) and checks that exactly what was left comes, each once."""
    left: Counter[int] = Counter()
    states, exact, taken_by = [], [], []
    for rank in range(world_size):
        # What the rank's epoch holds, and its batches without workers (the fewest: a
        # stop there never runs past the end, whatever the workers).
        whole = list(loader(fmt.dataset(rank, world_size, **options), 0))
        full = numbers(whole)
        count = round(stops[rank] * len(whole))
        taken, state = stop_after(
            loader(fmt.dataset(rank, world_size, **options), workers_before), count
        )
        rank_left = Counter(full) - Counter(taken)
        assert Counter(taken) + rank_left == Counter(full), (rank, "took what it did not have")
        left += rank_left
        states.append(state)
        taken_by.append(taken)
        if new_world_size is None:
            data = fmt.dataset(rank, world_size, **options)
            rest = resumed(loader(data, workers_after), state)
            assert Counter(rest) == rank_left, (rank, _diff(rest, rank_left))
            if workers_after == workers_before == 0:
                exact.append((taken + rest, full))
    for got, full in exact:
        assert got == full  # the same split: the same order as an uninterrupted epoch
    if new_world_size is None:
        return
    rest, fresh = [], []
    for rank in range(new_world_size):
        data = fmt.dataset(rank, new_world_size, **options)
        merged = json.loads(json.dumps(data.merge_states(states)))
        rest += resumed(loader(data, workers_after), merged)
        fresh += numbers(list(loader(fmt.dataset(rank, new_world_size, **options), 0)))
    # Each sample left once; if nothing was delivered, the new job's own epoch (its padding too).
    expected = Counter(set(left.elements())) if any(taken_by) else Counter(fresh)
    assert Counter(rest) == expected, _diff(rest, expected)


def _diff(rest: list[int], expected: Counter[int]) -> str:
    got = Counter(rest)
    missing, extra = sorted((expected - got).elements()), sorted((got - expected).elements())
    return f"missing {missing}, extra {extra}"
