"""Equal steps on every rank cost nothing: ShardDataset split by samples against by whole shards.

Run by hand: ``python benchmarks/bench_shards.py [--quick] [--repeat 9]`` (about a minute).

``SHARDS`` (48) tar shards of unequal sizes (200 to 1,000 samples of 1 KiB each, drawn from
a fixed seed), written by ``ShardWriter`` with their index files, are served by an
:class:`~aioload.testing.ObjectServer` on 127.0.0.1, once answering every request after
20 ms (latency-bound, as a remote store) and once at once (what the client's CPU allows).
One repetition of a case reads one epoch of each of ``WORLD`` ranks in turn — ``rank=r,
world_size=3``, ``shuffle_shards=True`` with a new epoch each time, ``shards_in_flight=4``,
through a ``DataLoader`` (batch 32, ``num_workers=0``) — and its figure is the samples per
second over the three epochs:

- ``split="samples"``: every rank gets ``ceil(N / 3)`` samples, a rank's first and last
  shards cut at a sample and read with a byte-range request from the sample's offset, every
  sample's key checked against its shard's index;
- ``split="shards"``: every rank gets whole shards (and the samples they hold: the ranks'
  shares differ; printed).

Printed beside the rates: the slowest rank's epoch, what ranks running side by side would
all wait for (the ranks run here one after the other, so that they do not share the CPU).

The indexes are loaded once per dataset, before the timed epochs (what a training run pays
once; its time is printed on its own). The cases run in turn, repetition by repetition,
after one untimed epoch each, every other round in the reverse order; the median of the
repetitions' own ratios and this process's CPU per sample (the loader's loop and obstore's
threads; the server is another process) are printed too: on a busy machine they move less
than the rates.
Target: the sample split >= 0.95 x the shard split (ratio of the medians), at both
latencies.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from functools import partial

import numpy as np
from bench_workers import Check, Measured, print_table, version
from common import Rates, Run, Shared, Workload

from aioload import DataLoader
from aioload.sources import ShardDataset, ShardWriter
from aioload.testing import ObjectServer

SHARDS = 48
SAMPLE_BYTES = 1024
SMALLEST, LARGEST = 200, 1000  # samples per shard
WORLD = 3
BATCH = 32
IN_FLIGHT = 4
LATENCIES = (0.02, 0.0)
SAMPLES = "aioload ShardDataset, split='samples' (equal steps)"
WHOLE = "aioload ShardDataset, split='shards'"

Case = Callable[[float], tuple[int, float]]


def shard_sizes(count: int = SHARDS) -> list[int]:
    """The samples of every shard: unequal, the same in every run."""
    return [int(n) for n in np.random.default_rng(17).integers(SMALLEST, LARGEST + 1, size=count)]


@contextmanager
def shard_server() -> Iterator[ObjectServer]:
    """An ObjectServer over a temporary folder of the shards and their indexes."""
    folder = tempfile.mkdtemp(prefix="aioload-bench-shards-")
    try:
        number = 0
        for shard, size in enumerate(shard_sizes()):
            pattern = os.path.join(folder, "shards", "part-%03d.tar")
            with ShardWriter(pattern, maxcount=size, start_shard=shard) as writer:
                for _ in range(size):
                    body = number.to_bytes(4, "little") * (SAMPLE_BYTES // 4)
                    writer.write({"__key__": f"{number:07d}", "bin": body, "cls": number})
                    number += 1
        with ObjectServer(folder) as server:
            yield server
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def shard_url(server: ObjectServer) -> str:
    return f"{server.url}/shards/part-{{000..{SHARDS - 1:03d}}}.tar"


class Epochs:
    """One dataset per rank (indexes loaded once), read an epoch each per run."""

    def __init__(self, url: str, split: str) -> None:
        self.datasets = [
            ShardDataset(
                url,
                rank=rank,
                world_size=WORLD,
                split=split,  # type: ignore[arg-type]
                shuffle_shards=True,
                shards_in_flight=IN_FLIGHT,
            )
            for rank in range(WORLD)
        ]
        started = time.perf_counter()
        if split == "samples":
            for dataset in self.datasets:
                dataset.indexes()
        self.index_seconds = (time.perf_counter() - started) / WORLD
        self.epoch = 0
        self.shares: list[int] = []
        self.slowest: list[float] = []  # per run: the longest of the ranks' epochs
        self.cpu: list[float] = []  # per run: this process's CPU seconds per sample

    def run(self, _duration: float = 0.0) -> tuple[int, float]:
        """One epoch of every rank: (samples read, seconds)."""
        self.epoch += 1
        shares, times = [], []
        cpu = time.process_time()
        for dataset in self.datasets:
            started = time.perf_counter()
            dataset.set_epoch(self.epoch)
            loader = DataLoader(dataset, batch_size=BATCH, collate_fn=list)
            shares.append(sum(len(batch) for batch in loader))
            times.append(time.perf_counter() - started)
        self.cpu.append((time.process_time() - cpu) / sum(shares))
        self.shares = shares
        self.slowest.append(max(times))
        return sum(shares), sum(times)


def alternate(cases: dict[str, Case], repeat: int) -> Measured:
    """Rates of every case: one untimed run each, then ``repeat`` rounds, every other one in
    the reverse order (as run.py does), so that drift on a busy machine hits them alike."""
    for run in cases.values():
        run(0.0)
    rates = {name: Rates([]) for name in cases}
    names = list(cases)
    for round_number in range(repeat):
        for name in names if round_number % 2 == 0 else names[::-1]:
            gc.collect()  # the previous run's garbage is not collected in this one's time
            done, seconds = cases[name](0.0)
            rates[name].values.append(done / seconds)
    return Measured(rates, {})


def cases(server: ObjectServer, latency: float) -> tuple[dict[str, Case], dict[str, Epochs]]:
    server.configure(latency=latency)
    epochs = {
        SAMPLES: Epochs(shard_url(server), "samples"),
        WHOLE: Epochs(shard_url(server), "shards"),
    }
    return {name: epoch.run for name, epoch in epochs.items()}, epochs


def measurement(server: ObjectServer, latency: float, repeat: int, checks: list[Check]) -> None:
    found, epochs = cases(server, latency)
    measured = alternate(found, repeat)
    sizes = shard_sizes()
    print(
        f"\n{SHARDS} shards of {SMALLEST}..{LARGEST} samples ({sum(sizes)} in all, "
        f"{SAMPLE_BYTES >> 10} KiB "
        f"each) from an ObjectServer answering after {latency * 1e3:.0f} ms; {WORLD} ranks, "
        f"batch {BATCH}, shards_in_flight={IN_FLIGHT}"
    )
    print_table(measured, list(found), "samples/s", ratios={"x shards": {SAMPLES: WHOLE}})
    for name, epoch in epochs.items():
        slowest = statistics.median(epoch.slowest[1:])  # the untimed first run left out
        cpu = statistics.median(epoch.cpu[1:])
        print(
            f"{name}: samples per rank {epoch.shares}; CPU per sample {cpu * 1e6:.1f} us; "
            f"the slowest rank's epoch (what ranks side by side wait for) {slowest * 1e3:.0f} ms"
        )
    print(f"loading the {SHARDS} indexes, per rank: {epochs[SAMPLES].index_seconds * 1e3:.0f} ms")
    if SAMPLES in measured.rates and WHOLE in measured.rates:
        pairs = zip(measured.rates[SAMPLES].values, measured.rates[WHOLE].values, strict=True)
        paired = statistics.median(mine / theirs for mine, theirs in pairs)
        print(f"median of the repetitions' ratios (run side by side): {paired:.2f}")
    check = Check(
        f"sample split vs shard split, {latency * 1e3:.0f} ms",
        "samples/s",
        measured.median(SAMPLES),
        measured.median(WHOLE),
        WHOLE,
        0.95,
    )
    check.report()
    checks.append(check)


def workloads(quick: bool) -> list[Workload]:
    """The two latencies as workloads of ``run.py``, over one server started once."""
    server = Shared(shard_server)

    def contenders(latency: float, _: ExitStack) -> dict[str, Run]:
        found, _epochs = cases(server.get(), latency)
        return {name: partial(case, 0.0) for name, case in found.items()}

    return [
        Workload(
            f"{SHARDS} shards of unequal sizes, {WORLD} ranks: an epoch per rank, ObjectServer "
            f"answering after {latency * 1e3:.0f} ms",
            "samples/s",
            partial(contenders, latency),
            baseline=WHOLE,
            shared=(server,),
        )
        for latency in LATENCIES
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two repetitions: a smoke run")
    parser.add_argument("--repeat", type=int, default=None, help="repetitions (default 5)")
    args = parser.parse_args()
    # Runs of about a second on a shared machine: more repetitions than elsewhere.
    repeat = args.repeat or (2 if args.quick else 9)
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    print(
        f"Python {platform.python_version()}, numpy {np.__version__}, obstore "
        f"{version('obstore')}; {os.cpu_count()} CPUs, load average {load}"
    )
    print(f"medians of {repeat} repetitions{' (--quick: smoke run, not figures)' * args.quick}")
    sys.stdout.flush()
    checks: list[Check] = []
    with shard_server() as server:
        for latency in LATENCIES:
            measurement(server, latency, repeat, checks)
            sys.stdout.flush()
    print("\nSummary (medians; ratio = samples split / shards split):\n")
    print("| measurement | unit | aioload | reference | ratio | target | result |")
    print("|---|---|---:|---:|---:|---|---|")
    for check in checks:
        print(check.row())


if __name__ == "__main__":
    main()
