"""The executor backend on a dask cluster against the process backend, and ranks side by side.

Run by hand: ``python benchmarks/bench_executor.py [--quick] [--repeat 5]``.

1. **Per-batch task overhead.** The same machine and workload through aioload's process
   backend (``num_workers=2``) and through a dask ``LocalCluster`` on 127.0.0.1 (2 worker
   processes, 1 thread each, no dashboard) via ``executor=client.get_executor(pure=False)``
   — and, for reference, a ``ProcessPoolExecutor(2)``:

   a. CPU-bound items (about 2 ms of numpy work each, calibrated as in ``bench_workers.py``),
      batch 32: items/s and CPU per item, and the ratios dask / process backend.
   b. Empty batches (one trivial item per batch), 8 per worker in flight so that round trips
      overlap: batches/s and CPU per batch, so what a batch costs beyond its items. The
      overhead of a dask task is the difference of the CPU per batch of (b) between dask and
      the process backend; from it and the CPU per item of (a), the batch size above which
      the dask backend costs under 5 %::

          batch_5% = overhead / (0.05 × CPU per item)

      Both in CPU time summed over every process involved (the loader, its workers, the
      cluster's scheduler, nannies and workers), which a busy machine disturbs much less than
      wall time.

2. **Two ranks.** One rank alone, then two ranks at once (``RANK``/``WORLD_SIZE`` set, each a
   separate process with ``DistributedSampler`` and ``num_workers=2``) reading the same
   dataset: each rank's items/s against one rank alone, for the CPU-bound items of 1a and for
   latency-bound items (an ``async def __getitem__`` that waits 10 ms, as a remote read does).

Throughput is counted for a fixed time after the first batch of every worker (starting workers
and the cluster is left out; the cluster is started once and reused, as a user's would be).
Medians of ``--repeat`` repetitions, with the fastest and slowest; the cases of a table run in
turn, repetition by repetition. Only 127.0.0.1 is contacted.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from functools import cache, partial
from typing import Any

import numpy as np
from bench_workers import calibrate, numpy_work
from common import Rates, Run, Shared, Workload, optional, replay

from aioload import DataLoader, DistributedSampler

distributed = optional("distributed")

BATCH = 32
WORKERS = 2
ENDLESS = 1 << 30
LATENCY = 0.01  # seconds each latency-bound item waits
LATENCY_BATCH = 64
LATENCY_CONCURRENCY = 128
# Empty batches in flight per worker in 1b: enough that a task's round trip is hidden and the
# rate is bound by what each batch costs the machine (CPU), not by its latency.
EMPTY_AHEAD = 8
PROCESS = "process backend (num_workers=2)"
DASK = "dask executor"
POOL = "ProcessPoolExecutor(2)"


# -- datasets (module level: worker processes unpickle them) ---------------------


class NumpyItems:
    """Item ``i`` is ``(numpy_work(rounds, i), i)``: about 2 ms of numpy work."""

    def __init__(self, rounds: int) -> None:
        self.rounds = rounds

    def __len__(self) -> int:
        return ENDLESS

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        return numpy_work(self.rounds, i), i


class TinyItems:
    """Item ``i`` is ``i``: no work at all, so a batch costs only its trip."""

    def __len__(self) -> int:
        return ENDLESS

    def __getitem__(self, i: int) -> int:
        return i


class RemoteItems:
    """Item ``i`` waits ``LATENCY`` seconds (a remote read), then is 1 KiB of ``i``."""

    def __len__(self) -> int:
        return ENDLESS

    async def __getitem__(self, i: int) -> np.ndarray:
        await asyncio.sleep(LATENCY)
        return np.full(1024, i % 251, np.uint8)


# -- timing ----------------------------------------------------------------------


def count_items(batch: Any) -> int:
    first = batch[0] if isinstance(batch, list | tuple) else batch
    return len(first)


def tree_cpu() -> float:
    """CPU seconds used so far by this process and every live descendant (Linux ``/proc``).

    The loader, its worker processes (children of the fork server, itself a child), and a
    ``LocalCluster``'s scheduler (a thread here), nannies and workers: everything a case runs.
    """
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as file:
                fields = file.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        # After the command's closing parenthesis: state, ppid, ..., utime (12th), stime (13th).
        parents[int(entry)] = int(fields[1])
        times[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    mine = {os.getpid()}
    while found := {pid for pid, parent in parents.items() if parent in mine} - mine:
        mine |= found
    return sum(times.get(pid, 0.0) for pid in mine)


def timed(loader: DataLoader, duration: float, skip: int) -> tuple[int, float, float]:
    """Items, seconds and CPU seconds (of every process involved) over ``duration`` after the
    first ``skip`` batches."""
    iterator = iter(loader)
    try:
        for _ in range(skip):
            next(iterator)
        start, cpu = time.perf_counter(), tree_cpu()
        items = 0
        for batch in iterator:
            items += count_items(batch)
            if time.perf_counter() - start >= duration:
                break
        return items, time.perf_counter() - start, tree_cpu() - cpu
    finally:
        iterator.close()


def measure(
    cases: dict[str, Callable[[], DataLoader]], repeat: int, duration: float, skip: int
) -> tuple[dict[str, Rates], dict[str, Rates]]:
    """Units per second, and CPU milliseconds per unit, of every case: one untimed run each,
    then ``repeat`` rounds in turn."""
    for make in cases.values():
        timed(make(), duration / 4, skip)
    rates = {name: Rates([]) for name in cases}
    costs = {name: Rates([]) for name in cases}
    for _ in range(repeat):
        for name, make in cases.items():
            done, seconds, cpu = timed(make(), duration, skip)
            rates[name].values.append(done / seconds)
            costs[name].values.append(cpu / done * 1e3)
    return rates, costs


def print_table(rates: dict[str, Rates], costs: dict[str, Rates], unit: str, per: str) -> None:
    width = max(len(name) for name in rates)
    for name, rate in rates.items():
        cost = costs[name]
        print(
            f"  {name:<{width}}  {rate.median:>8.0f} {unit} ({rate.spread()})"
            f"  {cost.median:>7.3f} ms CPU per {per} ({cost.spread(fmt='.3f')})"
        )
    sys.stdout.flush()


@contextmanager
def cluster() -> Iterator[Any]:
    """A dask client of a 2-process LocalCluster bound to 127.0.0.1, closed at the end."""
    with (
        distributed.LocalCluster(
            n_workers=WORKERS,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            # Not None: the scheduler's HTTP server would still listen, on port 8787.
            dashboard_address="127.0.0.1:0",
            scheduler_kwargs={"dashboard": False},
        ) as local,
        distributed.Client(local) as client,
    ):
        yield client


# -- 1. per-batch overhead ---------------------------------------------------------


@contextmanager
def executors() -> Iterator[tuple[Any, concurrent.futures.ProcessPoolExecutor]]:
    """The dask executor of a :func:`cluster` (None without dask.distributed) and a
    ``ProcessPoolExecutor(WORKERS)``, both closed at the end."""
    with ExitStack() as stack:
        dask = None
        if distributed is not None:
            dask = stack.enter_context(cluster()).get_executor(pure=False)
        pool = stack.enter_context(concurrent.futures.ProcessPoolExecutor(WORKERS))
        yield dask, pool


def overhead_cases(
    dataset: Any, batch: int, ahead: int, dask: Any, pool: Any
) -> dict[str, Callable[[], DataLoader]]:
    """The loaders of measurement 1: the process backend, dask's executor, the pool."""

    def process_backend() -> DataLoader:
        return DataLoader(dataset, batch_size=batch, num_workers=WORKERS, prefetch_factor=ahead)

    def executor(on: Any) -> Callable[[], DataLoader]:
        return lambda: DataLoader(dataset, batch_size=batch, executor=on, prefetch_factor=ahead)

    return {PROCESS: process_backend, DASK: executor(dask), POOL: executor(pool)}


def overhead(repeat: int, duration: float) -> dict[str, float]:
    rounds, item_cost = calibrate(numpy_work)
    print(f"\n1. dask executor against the process backend ({WORKERS} workers each)")
    print(f"   items: numpy work of {item_cost * 1e3:.2f} ms CPU each; batch {BATCH}")
    with executors() as (dask, pool):
        cpu, cpu_costs = measure(
            overhead_cases(NumpyItems(rounds), BATCH, 2, dask, pool),
            repeat,
            duration,
            skip=WORKERS,
        )
        print(f"\n a. CPU-bound items, batch {BATCH}:")
        print_table(cpu, cpu_costs, "items/s", "item")
        empty, empty_costs = measure(
            overhead_cases(TinyItems(), 1, EMPTY_AHEAD, dask, pool),
            repeat,
            duration,
            skip=WORKERS,
        )
        print(f"\n b. empty batches (one trivial item, {EMPTY_AHEAD} per worker in flight):")
        print_table(empty, empty_costs, "batches/s", "batch")
    # What a batch costs every process involved, beyond the process backend's, in CPU time:
    # other work on the machine stretches wall times, much less CPU times.
    overhead_ms = empty_costs[DASK].median - empty_costs[PROCESS].median
    # An item's CPU as measured in this run (a busy machine inflates CPU times too, alike).
    item_ms = cpu_costs[PROCESS].median
    batch_5 = overhead_ms / (0.05 * item_ms)
    figures = {
        "item_ms": item_cost * 1e3,
        "process_items_per_s": cpu[PROCESS].median,
        "dask_items_per_s": cpu[DASK].median,
        "pool_items_per_s": cpu[POOL].median,
        "ratio": cpu[DASK].median / cpu[PROCESS].median,
        "process_cpu_ms_per_item": cpu_costs[PROCESS].median,
        "dask_cpu_ms_per_item": cpu_costs[DASK].median,
        "cpu_ratio": cpu_costs[PROCESS].median / cpu_costs[DASK].median,
        "process_batches_per_s": empty[PROCESS].median,
        "dask_batches_per_s": empty[DASK].median,
        "pool_batches_per_s": empty[POOL].median,
        "process_cpu_ms_per_batch": empty_costs[PROCESS].median,
        "dask_cpu_ms_per_batch": empty_costs[DASK].median,
        "pool_cpu_ms_per_batch": empty_costs[POOL].median,
        "dask_overhead_cpu_ms": overhead_ms,
        "batch_5_percent": batch_5,
    }
    print(
        f"\n   dask / process backend at batch {BATCH}: {figures['ratio']:.2f}x the items/s, "
        f"{figures['cpu_ratio']:.2f}x the items per CPU second"
        f"\n   dask's extra CPU per batch (every process: client, scheduler, workers): "
        f"{overhead_ms:.2f} ms; with items of {item_ms:.2f} ms CPU (measured here) the dask "
        f"backend costs under 5 % from batch {batch_5:.0f} on (for items of t ms: "
        f"{overhead_ms / 0.05:.0f} / t)"
    )
    return figures


# -- 2. ranks ----------------------------------------------------------------------


def rank_child(kind: str, duration: float, rounds: int) -> None:
    """One rank (RANK/WORLD_SIZE in the environment): prints its items/s as JSON."""
    if kind == "cpu":
        dataset: Any = NumpyItems(rounds)
        options: dict[str, Any] = {"batch_size": BATCH}
    else:
        dataset = RemoteItems()
        options = {
            "batch_size": LATENCY_BATCH,
            "concurrency": LATENCY_CONCURRENCY,
            "prefetch_factor": 2 * LATENCY_CONCURRENCY // LATENCY_BATCH,
        }
    # A shorter "dataset" for the sampler: it materialises a permutation of its length.
    sampler = DistributedSampler(range(1 << 22), shuffle=False)
    loader = DataLoader(dataset, sampler=sampler, num_workers=WORKERS, **options)
    items, seconds, _ = timed(loader, duration, skip=WORKERS)
    json.dump({"rate": items / seconds, "items": items, "seconds": seconds}, sys.stdout)


def run_ranks(world: int, kind: str, duration: float, rounds: int) -> list[float]:
    """Each rank's items/s, ``world`` ranks at once."""
    return [rank["rate"] for rank in rank_results(world, kind, duration, rounds)]


def rank_results(world: int, kind: str, duration: float, rounds: int) -> list[dict[str, float]]:
    """What each of ``world`` ranks run at once reports: rate, items, seconds."""
    children = [
        subprocess.Popen(
            [sys.executable, __file__, "--rank-child", kind, str(duration), str(rounds)],
            env={**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world)},
            stdout=subprocess.PIPE,
            text=True,
        )
        for rank in range(world)
    ]
    results = []
    for child in children:
        out, _ = child.communicate(timeout=120)
        if child.returncode != 0:
            raise RuntimeError(f"a rank failed with exit code {child.returncode}")
        results.append(json.loads(out))
    return results


def ranks(repeat: int, duration: float) -> dict[str, float]:
    rounds, _ = calibrate(numpy_work)
    print(f"\n2. two ranks x num_workers={WORKERS} reading the same dataset (items/s per rank)")
    figures: dict[str, float] = {}
    for kind, label in (("cpu", "CPU-bound items"), ("latency", "latency-bound items")):
        alone, together = Rates([]), Rates([])
        for _ in range(repeat):
            alone.values.extend(run_ranks(1, kind, duration, rounds))
            together.values.extend(run_ranks(2, kind, duration, rounds))
        ratio = together.median / alone.median
        print(
            f"   {label}: one rank alone {alone.median:.0f} ({alone.spread()}); each of two "
            f"ranks {together.median:.0f} ({together.spread()}); ratio {ratio:.2f}, "
            f"both ranks together {2 * ratio:.2f}x one rank"
        )
        figures[f"ranks_{kind}_alone"] = alone.median
        figures[f"ranks_{kind}_each_of_two"] = together.median
        figures[f"ranks_{kind}_ratio"] = ratio
    sys.stdout.flush()
    return figures


# -- the report's suite (benchmarks/run.py) ---------------------------------------

# The report's names: "aioload..." is how its plots colour a contender.
CONTENDERS = {
    PROCESS: f"aioload, process backend (num_workers={WORKERS})",
    DASK: f"aioload, dask executor (LocalCluster, {WORKERS} workers)",
    POOL: f"aioload, executor=ProcessPoolExecutor({WORKERS})",
}
ALONE = "aioload, one rank alone"
EACH = "aioload, each of two ranks"


def recorded(make: Callable[[], DataLoader], duration: float, record: list[Any]) -> Run:
    """A run of a fresh loader (see :func:`timed`) that also records (units, CPU seconds)."""

    def run() -> tuple[float, float]:
        done, seconds, cpu = timed(make(), duration, skip=WORKERS)
        record.append((done, cpu))
        return done, seconds

    return run


def unavailable(why: str) -> Run:
    def run() -> tuple[float, float]:
        raise NotImplementedError(why)

    return run


def workloads(quick: bool) -> list[Workload]:
    """The two measurements as workloads of ``run.py``: throughput of the backends, then the
    CPU per item (or batch) of every process involved over the same runs; each rank's items/s,
    two ranks against one. The cluster and the pool start once, at the first workload that
    uses them, and stop after the suite."""
    duration = 0.5 if quick else 2.0
    running = Shared(executors)
    costs: dict[str, dict[str, list[tuple[float, float]]]] = {"cpu": {}, "empty": {}}

    @cache
    def rounds() -> int:
        return calibrate(numpy_work)[0]

    def backends(kind: str) -> Callable[[ExitStack], dict[str, Run]]:
        def make(_: ExitStack) -> dict[str, Run]:
            dask, pool = running.get()
            if kind == "cpu":
                cases = overhead_cases(NumpyItems(rounds()), BATCH, 2, dask, pool)
            else:
                cases = overhead_cases(TinyItems(), 1, EMPTY_AHEAD, dask, pool)
            runs: dict[str, Run] = {}
            for case, loader in cases.items():
                name = CONTENDERS[case]
                if case == DASK and dask is None:
                    runs[name] = unavailable("dask.distributed is not installed")
                else:
                    runs[name] = recorded(loader, duration, costs[kind].setdefault(name, []))
            return runs

        return make

    def cpu(kind: str) -> Callable[[ExitStack], dict[str, Run]]:
        def make(_: ExitStack) -> dict[str, Run]:
            return {
                name: replay(partial(costs[kind].__getitem__, name), name)
                for name in CONTENDERS.values()
                if costs[kind].get(name)
            }

        return make

    def ranks(kind: str) -> Callable[[ExitStack], dict[str, Run]]:
        def make(_: ExitStack) -> dict[str, Run]:
            def run(world: int) -> tuple[float, float]:
                results = rank_results(world, kind, duration, rounds())
                return sum(r["items"] for r in results), sum(r["seconds"] for r in results)

            return {ALONE: partial(run, 1), EACH: partial(run, 2)}

        return make

    process = CONTENDERS[PROCESS]
    cpu_items = f"CPU-bound items (~2 ms of numpy each), batch {BATCH}, {WORKERS} workers"
    empty = f"empty batches (one trivial item), {EMPTY_AHEAD} per worker in flight"
    found: list[Workload] = []
    # First, before the cluster starts. Every run of a rank is a fresh process (seconds to
    # start), which needs no warm-up run; the quick run keeps one kind.
    for kind, label in (("cpu", "CPU-bound items"), ("latency", "latency-bound items (10 ms)")):
        if quick and kind == "cpu":
            continue
        found.append(
            Workload(
                f"two ranks x num_workers={WORKERS}, {label}: items/s per rank",
                "items/s",
                ranks(kind),
                baseline=ALONE,
                warm_up=False,
            )
        )
    found += [
        Workload(cpu_items, "items/s", backends("cpu"), baseline=process, shared=(running,)),
        Workload(
            f"CPU per item, every process (CPU-bound items, batch {BATCH})",
            "ms",
            cpu("cpu"),
            baseline=process,
            scale=1e3,
            lower_is_better=True,
        ),
        Workload(empty, "batches/s", backends("empty"), baseline=process, shared=(running,)),
        Workload(
            "CPU per batch, every process (empty batches)",
            "ms",
            cpu("empty"),
            baseline=process,
            scale=1e3,
            lower_is_better=True,
        ),
    ]
    return found


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--rank-child":
        rank_child(sys.argv[2], float(sys.argv[3]), int(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short runs: a smoke run")
    parser.add_argument("--repeat", type=int, default=None, help="repetitions (default 5)")
    parser.add_argument(
        "--only", choices=["overhead", "ranks"], action="append", help="run only these"
    )
    args = parser.parse_args()
    only = set(args.only or ["overhead", "ranks"])
    repeat = args.repeat or (1 if args.quick else 5)
    duration = 0.5 if args.quick else 2.0
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    print(
        f"Python {platform.python_version()}, numpy {np.__version__}, dask.distributed "
        f"{getattr(distributed, '__version__', 'not installed')}; {os.cpu_count()} CPUs, "
        f"load average {load}; medians of {repeat} repetitions"
        f"{' (--quick: smoke run, not figures)' * args.quick}"
    )
    figures: dict[str, float] = {}
    if "overhead" in only:
        if distributed is None:
            print(
                "\n1. skipped: dask.distributed is not installed (pip install 'aioload-data[dask]')"
            )
        else:
            figures.update(overhead(repeat, duration))
    if "ranks" in only:
        figures.update(ranks(repeat, duration))
    print("\nfigures:", json.dumps({k: round(v, 4) for k, v in figures.items()}))


if __name__ == "__main__":
    main()
