"""ShardDataset's local cache: a second epoch from the cache against the first one from a
latency-bound store, and against the same shards read from local files, in the same run.

Run by hand: ``python benchmarks/bench_cache.py [--quick] [--repeat 5]``.

256 tar shards of 16 samples of 64 KiB (about 1 MiB a shard, 256 MiB in all), served by an
:class:`~aioload.testing.ObjectServer` on 127.0.0.1 that answers every request after 20 ms
(one GET per shard). Every case reads one whole epoch through ``DataLoader`` (``for``, 0
workers, batch 32, ``shards_in_flight=4``, default collate of ``(uint8[65536], label)``
samples) and counts samples per second; every batch is checked.

- **store, no cache**: the shards from the store, as without this feature;
- **epoch 1 through the cache**: a fresh, empty cache folder every run: every shard is a
  miss, streamed from the store while it is written to the folder (and fsynced);
- **epoch 2 from the cache**: the same shards again, from a full cache folder: every shard
  a hit, no request to the store (checked on the server's request count);
- **local files, no cache**: ``file://`` URLs of the very files the server serves (warm in
  the page cache, as the cache's files are).

Targets: epoch 2 >= 5 x epoch 1, and >= 0.8 x local files. Each case runs once untimed,
then ``--repeat`` times in turn; medians, with the fastest and slowest run.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import numpy as np
from bench_workers import Check, Measured, print_table, version
from common import Rates, Run, Shared, Workload

from aioload import DataLoader
from aioload.sources import ShardDataset, ShardWriter
from aioload.testing import ObjectServer

SHARDS = 256
PER_SHARD = 16
SAMPLE_SIZE = 64 << 10
SAMPLES = SHARDS * PER_SHARD
LATENCY = 0.02  # seconds the ObjectServer waits before every answer
BATCH = 32
IN_FLIGHT = 4  # shards each reader streams at once

STORE = "aioload ShardDataset, 20 ms store, no cache"
EPOCH_1 = "aioload ShardDataset, epoch 1 through the cache (20 ms store)"
EPOCH_2 = "aioload ShardDataset, epoch 2 from the cache"
LOCAL = "aioload ShardDataset, local files, no cache"


def decode(sample: dict[str, Any]) -> tuple[np.ndarray, int]:
    """A sample as (its 64 KiB as uint8, its label), without a copy (the collate copies)."""
    return np.frombuffer(sample["bin"], np.uint8), int(sample["cls"])


def body(i: int) -> bytes:
    return i.to_bytes(4, "little") + bytes([i % 251]) * (SAMPLE_SIZE - 4)


@contextmanager
def shard_server() -> Iterator[tuple[ObjectServer, str]]:
    """The shards in a temporary folder, served after ``LATENCY``; removed at the end."""
    folder = tempfile.mkdtemp(prefix="aioload-bench-cache-")
    try:
        pattern = os.path.join(folder, "shards", "train-%04d.tar")
        with ShardWriter(pattern, maxcount=PER_SHARD) as writer:
            for i in range(SAMPLES):
                writer.write({"__key__": f"{i:06d}", "bin": body(i), "cls": i})
        assert len(writer.shards) == SHARDS
        with ObjectServer(folder, latency=LATENCY) as server:
            yield server, folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def pattern(root: str) -> str:
    return f"{root}/shards/train-{{0000..{SHARDS - 1:04d}}}.tar"


def epoch(dataset: ShardDataset) -> tuple[float, float]:
    """One whole epoch: (samples, seconds); every batch checked."""
    loader = DataLoader(dataset, batch_size=BATCH)
    seen = 0
    started = time.perf_counter()
    for data, labels in loader:
        if data.shape != (len(labels), SAMPLE_SIZE):
            raise RuntimeError(f"a batch of shape {data.shape}")
        found = np.ascontiguousarray(data[:, :4]).view(np.uint32).ravel()
        if not np.array_equal(found, labels):
            raise RuntimeError("a batch's samples do not match their labels")
        seen += len(labels)
    seconds = time.perf_counter() - started
    if seen != SAMPLES:
        raise RuntimeError(f"an epoch of {seen} samples, expected {SAMPLES}")
    return seen, seconds


def cases(server: ObjectServer, folder: str, stack: ExitStack) -> dict[str, Run]:
    """The four contenders against a running :func:`shard_server`."""
    store_urls = pattern(server.url)
    caches = tempfile.mkdtemp(prefix="aioload-bench-cache-dirs-")
    stack.callback(shutil.rmtree, caches, True)
    full = os.path.join(caches, "full")

    def dataset(urls: str, cache: str | None = None) -> ShardDataset:
        return ShardDataset(urls, decode=decode, shards_in_flight=IN_FLIGHT, cache_dir=cache)

    def store() -> tuple[float, float]:
        return epoch(dataset(store_urls))

    def first() -> tuple[float, float]:
        fresh = os.path.join(caches, "fresh")
        shutil.rmtree(fresh, ignore_errors=True)
        return epoch(dataset(store_urls, fresh))

    def second() -> tuple[float, float]:
        if not os.path.isdir(full):
            epoch(dataset(store_urls, full))  # fills the cache (untimed)
        before = server.stats()["requests"]
        result = epoch(dataset(store_urls, full))
        if server.stats()["requests"] != before:
            raise RuntimeError("epoch 2 sent requests to the store")
        return result

    def local() -> tuple[float, float]:
        return epoch(dataset(pattern("file://" + folder)))

    return {STORE: store, EPOCH_1: first, EPOCH_2: second, LOCAL: local}


def measure(runs: dict[str, Run], repeat: int) -> Measured:
    """Samples/s of every case: one untimed run each, then ``repeat`` rounds in turn."""
    for run in runs.values():
        run()
    rates = {name: Rates([]) for name in runs}
    for round_ in range(repeat):
        names = list(runs) if round_ % 2 == 0 else list(runs)[::-1]
        for name in names:
            done, seconds = runs[name]()
            rates[name].values.append(done / seconds)
    return Measured({name: rates[name] for name in runs}, {})


# -- the report's suite (benchmarks/run.py) -------------------------------------------


def workloads(quick: bool) -> list[Workload]:
    """The measurement as a workload of ``run.py`` (the server starts once)."""
    server = Shared(shard_server)

    def contenders(stack: ExitStack) -> dict[str, Run]:
        running, folder = server.get()
        return cases(running, folder, stack)

    return [
        Workload(
            f"{SHARDS} shards of {PER_SHARD} x {SAMPLE_SIZE >> 10} KiB, 20 ms store, "
            f"shards_in_flight={IN_FLIGHT}, batch {BATCH}",
            "samples/s",
            contenders,
            baseline=LOCAL,
            shared=(server,),
            note="epoch 2 from the cache should be >= 5x epoch 1 and >= 0.8x local files",
        )
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one repetition: a smoke run")
    parser.add_argument("--repeat", type=int, default=None, help="repetitions (default 5)")
    args = parser.parse_args()
    repeat = args.repeat or (1 if args.quick else 5)
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    print(
        f"Python {platform.python_version()}, numpy {np.__version__}, obstore "
        f"{version('obstore')}, uvloop {version('uvloop')}, aiohttp {version('aiohttp')}; "
        f"{os.cpu_count()} CPUs, load average {load}"
    )
    print(f"medians of {repeat} repetitions{' (--quick: smoke run, not figures)' * args.quick}")
    sys.stdout.flush()
    with shard_server() as (server, folder), ExitStack() as stack:
        runs = cases(server, folder, stack)
        measured = measure(runs, repeat)
    print(
        f"\n{SHARDS} shards of {PER_SHARD} x {SAMPLE_SIZE >> 10} KiB samples, ObjectServer "
        f"answering after {LATENCY * 1e3:.0f} ms; batch {BATCH}, shards_in_flight="
        f"{IN_FLIGHT}, 0 workers; one whole epoch ({SAMPLES} samples) per run"
    )
    print_table(
        measured,
        list(runs),
        "samples/s",
        ratios={
            "x epoch 1": {EPOCH_2: EPOCH_1, STORE: EPOCH_1, LOCAL: EPOCH_1},
            "x local": {EPOCH_2: LOCAL, EPOCH_1: LOCAL, STORE: LOCAL},
        },
    )
    checks = [
        check("epoch 2 from the cache vs epoch 1 through it", measured, EPOCH_2, EPOCH_1, 5.0),
        check("epoch 2 from the cache vs local files", measured, EPOCH_2, LOCAL, 0.8),
        check("epoch 1 through the cache vs the store alone", measured, EPOCH_1, STORE, None),
    ]
    print("\nSummary (medians; ratio = aioload / reference):\n")
    print("| measurement | unit | aioload | reference | ratio | target | result |")
    print("|---|---|---:|---:|---:|---|---|")
    for item in checks:
        print(item.row())


def check(title: str, measured: Measured, case: str, against: str, bound: float | None) -> Check:
    result = Check(
        title, "samples/s", measured.median(case), measured.median(against), against, bound
    )
    result.report()
    return result


if __name__ == "__main__":
    main()
