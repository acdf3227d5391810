"""Parquet from a real S3 server: aioload's two Parquet datasets against their baselines.

Run by hand: ``python benchmarks/bench_parquet.py [--repeat 5] [--torch-batches 20]``;
``--profile`` prints where the iterable epoch's time goes instead (the stages of
:mod:`parquet_profile`: the epoch split at its footers and first batch, and a batch's way
from a decoded row group to the caller, step by step), at batch 256 and 4096.

100,000 rows x 10 float64 columns in 8 files (4 row groups each), written by pyarrow and
served by SeaweedFS on 127.0.0.1 (its S3 gateway). Every case runs once untimed, then
``--repeat`` times in turn; medians (rows/s), with the slowest and fastest run.

- **iterable epoch**: ``IterableParquetDataset`` through ``DataLoader(batch_size=256)``
  (``for``, 0 workers, default collate: a dict of ten float64 arrays per batch), every
  batch checked; a new dataset each run (made before the clock starts, as pyarrow's
  filesystem is), so the footers are read within the epoch; against
  ``pyarrow.parquet.read_table`` of the same 8 files through pyarrow's own S3 client
  (threads, pre-buffered reads). Target >= 0.8x. The same with ``async for``, and with
  batches of 4096 rows (what the loader's per-batch work costs; target >= 1.0x).
- **map-style, shuffled**: ``ParquetDataset`` through ``DataLoader(batch_size=256,
  shuffle=True)`` (0 workers and 2), against torch's ``DataLoader`` (2 workers,
  ``shuffle=True``) over a dataset whose ``__getitem__`` reads one row with pyarrow (an
  open ``ParquetFile`` per worker, ``read_row_group`` of the row's row group, one row
  taken): what a torch user writes. torch reads ``--torch-batches`` batches per run (a
  whole epoch would take minutes); the rates compare. Target >= 10x.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import obstore
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from parquet_floor import cores_used, floor_epoch
from parquet_profile import batch_path, epoch_phases, print_table

from aioload import DataLoader
from aioload.sources import IterableParquetDataset, ParquetDataset, open_store
from aioload.testing import SeaweedFS

FILES = 8
ROWS = 100_000
COLUMNS = 10
ROW_GROUPS = 4  # per file
BATCH = 256


def write_files(server: SeaweedFS) -> list[str]:
    """The 8 files, put into the server's bucket; their keys."""
    store, _ = open_store(server.url, storage_options=server.storage_options)
    rng = np.random.default_rng(0)
    per_file = ROWS // FILES
    keys = []
    for number in range(FILES):
        first = number * per_file
        columns = {"c0": np.arange(first, first + per_file, dtype=np.float64)}
        columns.update({f"c{i}": rng.standard_normal(per_file) for i in range(1, COLUMNS)})
        out = io.BytesIO()
        pq.write_table(pa.table(columns), out, row_group_size=per_file // ROW_GROUPS)
        key = f"parquet/part-{number:02d}.parquet"
        obstore.put(store, key, out.getvalue())
        keys.append(key)
    return keys


def arrow_fs(server: SeaweedFS) -> Any:
    options = server.storage_options
    return pafs.S3FileSystem(
        access_key=options["access_key_id"],
        secret_key=options["secret_access_key"],
        endpoint_override=options["endpoint"],
        scheme="http",
        region=options["region"],
    )


def time_rows(run: Callable[[], int]) -> float:
    start = time.perf_counter()
    rows = run()
    return rows / (time.perf_counter() - start)


class OneRowPerItem:
    """torch's baseline: ``__getitem__`` reads the row group holding the row, takes one row."""

    def __init__(self, server: SeaweedFS, keys: list[str]) -> None:
        self.server, self.keys = server, keys
        self.per_file = ROWS // FILES
        self.per_group = self.per_file // ROW_GROUPS
        self.files: dict[int, Any] = {}

    def __len__(self) -> int:
        return ROWS

    def __getitem__(self, index: int) -> dict[str, Any]:
        number, within = divmod(index, self.per_file)
        handle = self.files.get(number)
        if handle is None:  # one open file per worker process
            fs = arrow_fs(self.server)
            handle = pq.ParquetFile(fs.open_input_file(f"{self.server.bucket}/{self.keys[number]}"))
            self.files[number] = handle
        group, row = divmod(within, self.per_group)
        table = handle.read_row_group(group).slice(row, 1)
        return {name: np.float64(table.column(name)[0].as_py()) for name in table.column_names}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "files": {}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--torch-batches", type=int, default=20)
    parser.add_argument(
        "--profile",
        action="store_true",
        help="print the iterable epoch's stages (parquet_profile.py) instead of the cases",
    )
    args = parser.parse_args()
    if args.profile:
        profile(args.repeat)
        return
    torch = None
    try:
        import torch
        import torch.utils.data
    except ImportError:
        print("torch is not installed: the map-style baseline is left out")

    with SeaweedFS(bucket="bench-parquet") as server:
        keys = write_files(server)
        urls = [f"{server.url}/{key}" for key in keys]
        options = server.storage_options
        fs = arrow_fs(server)

        def read_table() -> int:
            table = pq.read_table([f"{server.bucket}/{key}" for key in keys], filesystem=fs)
            return int(table.num_rows)

        # Made before the clock starts, as read_table's filesystem is: the epoch reads the
        # footers and the data, from nothing but the URLs and a client.
        fresh = [
            IterableParquetDataset(urls, storage_options=options) for _ in range(args.repeat + 1)
        ]

        fresh_big = [
            IterableParquetDataset(urls, storage_options=options) for _ in range(args.repeat + 1)
        ]

        def iterable_epoch(batch_size: int = BATCH, datasets: list[Any] = fresh) -> int:
            dataset = datasets.pop()
            rows = 0
            for batch in DataLoader(dataset, batch_size=batch_size):
                assert batch["c0"].dtype == np.float64 and len(batch) == COLUMNS
                rows += len(batch["c0"])
            assert rows == ROWS
            return rows

        fresh_async = [
            IterableParquetDataset(urls, storage_options=options) for _ in range(args.repeat + 1)
        ]

        def iterable_epoch_async() -> int:
            dataset = fresh_async.pop()

            async def epoch() -> int:
                rows = 0
                async for batch in DataLoader(dataset, batch_size=BATCH):
                    rows += len(batch["c0"])
                return rows

            rows = asyncio.run(epoch())
            assert rows == ROWS
            return rows

        def map_epoch(workers: int) -> Callable[[], int]:
            def run() -> int:
                dataset = ParquetDataset(urls, storage_options=options)
                loader = DataLoader(
                    dataset, batch_size=BATCH, shuffle=True, generator=0, num_workers=workers
                )
                seen = 0
                total = 0.0
                for batch in loader:
                    seen += len(batch["c0"])
                    total += float(batch["c0"].sum())
                assert seen == ROWS and total == sum(range(ROWS))
                return seen

            return run

        def torch_rows() -> int:
            assert torch is not None
            loader = torch.utils.data.DataLoader(
                OneRowPerItem(server, keys), batch_size=BATCH, shuffle=True, num_workers=2
            )
            rows = 0
            for number, batch in enumerate(loader):
                rows += len(batch["c0"])
                if number + 1 == args.torch_batches:
                    break
            return rows

        cases: dict[str, Callable[[], int]] = {
            "pyarrow.parquet.read_table (pyarrow's S3 client)": read_table,
            "aioload IterableParquetDataset, epoch, batch 256, 0 workers": iterable_epoch,
            "aioload IterableParquetDataset, epoch, batch 256, 0 workers, async for": (
                iterable_epoch_async
            ),
            "aioload IterableParquetDataset, epoch, batch 4096, 0 workers": lambda: iterable_epoch(
                4096, fresh_big
            ),
            "aioload ParquetDataset, shuffle, batch 256, 0 workers": map_epoch(0),
            "aioload ParquetDataset, shuffle, batch 256, 2 workers": map_epoch(2),
        }
        if torch is not None:
            batches = args.torch_batches
            torch_case = (
                f"torch DataLoader, one pyarrow row per item, 2 workers ({batches} batches)"
            )
            cases[torch_case] = torch_rows
        rates: dict[str, list[float]] = {name: [] for name in cases}
        for run in cases.values():
            run()  # untimed: imports, connections, the page cache
        for _ in range(args.repeat):
            for name, run in cases.items():
                rates[name].append(time_rows(run))

    print(f"Python {platform.python_version()}, {platform.machine()}, pyarrow {pa.__version__}")
    print(f"{'case':<86} {'rows/s (median)':>16}  range")
    for name, values in rates.items():
        print(
            f"{name:<86} {statistics.median(values):>16,.0f}  "
            f"{min(values):,.0f}..{max(values):,.0f}"
        )
    medians = {name: statistics.median(values) for name, values in rates.items()}
    names = list(cases)
    for name in names[1:4]:
        ratio = medians[name] / medians[names[0]]
        target = "1.0x" if "4096" in name else "0.8x"
        print(f"\n{name} / read_table: {ratio:.2f}x (target >= {target})")
    if torch is not None:
        baseline = medians[names[-1]]
        for name in names[4:6]:
            print(f"{name} / torch: {medians[name] / baseline:.1f}x (target >= 10x)")


def print_floor(keys: list[str], server: SeaweedFS, repeat: int, make: Callable[[], Any]) -> None:
    """Where the epoch's time and the two cores go: ``read_table``, the bare pipeline
    (:mod:`parquet_floor`) and aioload's epoch, taking turns, ``repeat`` rounds after an
    untimed one; medians of the clock, CPU summed over the rounds."""
    store, prefix = open_store(server.url, storage_options=server.storage_options)
    keys = [prefix + key for key in keys]
    fs = arrow_fs(server)
    paths = [f"{server.bucket}/{key}" for key in keys]

    def aioload_epoch(batch: int, threaded: bool) -> Callable[[], Callable[[], int]]:
        def prepare() -> Callable[[], int]:
            # Made before the clock starts, as read_table's filesystem and the floor's
            # store are: the epoch reads the footers and the data.
            loader = DataLoader(make(), batch_size=batch)
            if threaded:
                return lambda: sum(len(b["c0"]) for b in loader)

            async def epoch() -> int:
                return sum([len(b["c0"]) async for b in loader])

            return lambda: asyncio.run(epoch())

        return prepare

    def floor(batch: int, threaded: bool, whole: bool) -> Callable[[], Callable[[], int]]:
        return lambda: lambda: floor_epoch(store, keys, batch, threaded=threaded, whole=whole)

    cases: dict[str, Callable[[], Callable[[], Any]]] = {
        "read_table (pyarrow's S3 client, threads)": lambda: (
            lambda: pq.read_table(paths, filesystem=fs)
        ),
    }
    for batch in (BATCH, 4096):
        for threaded in (True, False):
            how = f"batch {batch}, {'for' if threaded else 'async for'}"
            cases[f"floor, {how}, footers then files"] = floor(batch, threaded, False)
            cases[f"floor, {how}, whole files at once"] = floor(batch, threaded, True)
            cases[f"aioload, {how}"] = aioload_epoch(batch, threaded)
    walls: dict[str, list[float]] = {name: [] for name in cases}
    cpu: dict[str, list[float]] = {name: [0.0, 0.0] for name in cases}
    pid = server.pid
    assert pid is not None
    for turn in range(repeat + 1):
        for name, prepare in cases.items():
            wall, own, served = cores_used(prepare(), pid)
            if turn:
                walls[name].append(wall)
                cpu[name][0] += own
                cpu[name][1] += served
    table = statistics.median(walls[next(iter(cases))])
    print("\nthe floor and the cores: ms on the clock (median), CPU ms a run (mean)")
    print(f"{'epoch':<48} {'clock':>7} {'vs table':>9} {'own CPU':>8} {'server':>7} {'cores':>6}")
    for name, times in walls.items():
        wall = statistics.median(times)
        own, served = (value / repeat for value in cpu[name])
        cores = (own + served) / statistics.mean(times)
        print(
            f"{name:<48} {wall * 1e3:>7.1f} {table / wall:>8.2f}x {own * 1e3:>8.1f} "
            f"{served * 1e3:>7.1f} {cores:>6.2f}"
        )


def profile(repeat: int) -> None:
    """The iterable epoch's stages (see :mod:`parquet_profile`), at batch 256 and 4096."""
    with SeaweedFS(bucket="bench-parquet") as server:
        keys = write_files(server)
        urls = [f"{server.url}/{key}" for key in keys]
        options = server.storage_options
        fs = arrow_fs(server)
        paths = [f"{server.bucket}/{key}" for key in keys]
        pq.read_table(paths, filesystem=fs)  # warm, as the cases are
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            pq.read_table(paths, filesystem=fs)
            times.append(time.perf_counter() - start)
        print(f"Python {platform.python_version()}, pyarrow {pa.__version__}, {repeat} runs")
        print(f"pyarrow.parquet.read_table, same files: {statistics.median(times) * 1e3:.1f} ms")

        def make() -> IterableParquetDataset:
            return IterableParquetDataset(urls, storage_options=options)

        print_floor(keys, server, repeat, make)
        for batch in (BATCH, 4096):
            rows = epoch_phases(make, batch, repeat)
            print_table(f"the epoch, batch {batch}, for, 0 workers (medians)", rows, "ms")
            steps = batch_path(make, batch, repeat)
            print_table(f"a batch's way, row groups decoded already, batch {batch}", steps, "µs")


if __name__ == "__main__":
    sys.exit(main())
