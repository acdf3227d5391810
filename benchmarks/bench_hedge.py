"""Hedged reads against a heavy tail, and one request budget across worker processes.

Run by hand: ``python benchmarks/bench_hedge.py [--quick] [--repeat 3]``.

**Hedge.** 2,000 objects of 4 KiB behind an :class:`~aioload.testing.ObjectServer` on
127.0.0.1 that answers after 10 ms, and 1 % of requests (seeded) after 1 s more. One epoch
of ``ObjectDataset`` through ``DataLoader`` (batch 16, concurrency 64, 0 workers, ``for``)
with ``hedge=False`` and with ``hedge=True``, in turn, a fresh dataset (and server) for each
run; per case the median over the runs of: the batch latency's p50 and p99
(``loader.stats()``'s fetch latency: from a batch's submission to its last item), the
epoch's seconds, and the requests the server answered beyond one per object (the extra
share). Every object's bytes are checked.

**Budget.** 4,000 objects of 64 bytes, 2 ms latency; one epoch with 4 worker processes
(batch 10), with ``max_requests_per_second=1000`` and without: the most requests the server
saw in any 1-second window (from its arrival times), and the mean rate.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

from aioload import DataLoader
from aioload.sources import ObjectDataset
from aioload.testing import ObjectServer
from aioload.testing.arrivals import most_in_window

LATENCY = 0.010
TAIL = (0.01, 1.0)
BATCH = 16
CONCURRENCY = 64
RATE = 1000.0
WORKERS = 4


def body(i: int, size: int) -> bytes:
    return i.to_bytes(4, "little") * (size // 4)


def write_objects(folder: Path, count: int, size: int) -> list[str]:
    (folder / "objects").mkdir(parents=True, exist_ok=True)
    keys = [f"{i:06d}.bin" for i in range(count)]
    for i, key in enumerate(keys):
        (folder / "objects" / key).write_bytes(body(i, size))
    return keys


def hedge_run(folder: Path, keys: list[str], hedge: bool, seed: int) -> dict[str, float]:
    with ObjectServer(folder, latency=LATENCY, tail=TAIL, seed=seed) as server:
        dataset = ObjectDataset(server.url + "/objects/", keys=keys, hedge=hedge)
        loader = DataLoader(dataset, batch_size=BATCH, collate_fn=list, concurrency=CONCURRENCY)
        began = time.perf_counter()
        got = [item for batch in loader for item in batch]
        seconds = time.perf_counter() - began
        requests = server.stats()["requests"]
    assert got == [body(i, 4096) for i in range(len(keys))], "wrong bytes"
    stats = loader.stats()
    return {
        "p50": stats.fetch_p50 or 0.0,
        "p99": stats.fetch_p99 or 0.0,
        "seconds": seconds,
        "extra": requests / len(keys) - 1,
        "hedges": stats.epoch.hedges,
    }


def budget_run(folder: Path, keys: list[str], rate: float | None) -> dict[str, float]:
    with ObjectServer(folder, latency=0.002) as server:
        dataset = ObjectDataset(server.url + "/objects/", keys=keys, max_requests_per_second=rate)
        loader = DataLoader(dataset, batch_size=10, num_workers=WORKERS, collate_fn=list)
        got = sum(len(batch) for batch in loader)
        arrivals = server.arrivals()
    assert got == len(keys) == len(arrivals)
    span = arrivals[-1] - arrivals[0]
    return {"most": most_in_window(arrivals), "mean": len(arrivals) / span if span else 0.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small runs: a check, not figures")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each case (default 3)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", "This DataLoader will create")  # 4 workers, few cores
    objects = 400 if args.quick else 2000
    budget_objects = 1000 if args.quick else 4000
    repeat = 1 if args.quick else args.repeat
    print(f"python {platform.python_version()}, {os.cpu_count()} cores, load {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as temporary:
        folder = Path(temporary) / "hedge"
        keys = write_objects(folder, objects, 4096)
        runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
        for round_ in range(repeat):
            order = (False, True) if round_ % 2 == 0 else (True, False)
            for hedge in order:
                runs[hedge].append(hedge_run(folder, keys, hedge, seed=round_))
        print(
            f"\nheavy tail: {objects} objects, {LATENCY * 1e3:g} ms, {TAIL[0]:.0%} of requests "
            f"+{TAIL[1]:g} s; batch {BATCH}, concurrency {CONCURRENCY}; medians of {repeat}"
        )
        print("| hedge | batch p50 | batch p99 | epoch | extra requests | hedges |")
        print("|---|---|---|---|---|---|")
        medians = {}
        for hedge, results in runs.items():
            median = {name: statistics.median(r[name] for r in results) for name in results[0]}
            medians[hedge] = median
            print(
                f"| {hedge} | {median['p50'] * 1e3:.0f} ms | {median['p99'] * 1e3:.0f} ms | "
                f"{median['seconds']:.2f} s | {median['extra']:.1%} | {median['hedges']:.0f} |"
            )
        print(
            f"p99 with hedge=True: {medians[True]['p99'] / medians[False]['p99']:.2f}x that without"
        )
        budget_folder = Path(temporary) / "budget"
        budget_keys = write_objects(budget_folder, budget_objects, 64)
        print(f"\nbudget: {budget_objects} objects, {WORKERS} workers")
        print("| max_requests_per_second | most in any 1 s | mean rate |")
        print("|---|---|---|")
        for rate in (RATE, None):
            result = budget_run(budget_folder, budget_keys, rate)
            print(f"| {rate} | {result['most']:.0f} | {result['mean']:.0f}/s |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
