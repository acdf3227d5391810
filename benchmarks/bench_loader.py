"""How much aioload's DataLoader costs per batch and per item, next to torch's.

Run by hand: ``python benchmarks/bench_loader.py [--quick] [--repeat 5]``.

Four measurements, each printed as a table of medians over ``--repeat`` repetitions (with the
fastest and slowest repetition, to show the noise), and checked against the targets of the
loader's design:

1. Per-batch overhead with a sync in-memory dataset (rows of float32[16] plus an int label,
   batch 64, a numpy collate_fn, ``num_workers=0``): items/s of a bare Python loop doing the
   same indexing and collate, torch's DataLoader, aioload with ``for`` and with ``async for``.
   Target: aioload ``for`` >= 0.8 x torch.
2. The same dataset with an ``async def __getitem__`` that returns at once.
   Target: >= 500k items/s where torch does ~1.1M items/s, i.e. >= 0.45 x torch.
3. The sync facade's hand-off: a dataset whose ``__getitems__`` returns prebuilt samples and
   an identity collate_fn, so a batch costs little more than the pipeline itself; the time per
   batch of ``for`` (batches cross from aioload's loop thread to the caller) minus that of
   ``async for`` on a uvloop loop (no thread crossing) is the hand-off. Target: <= 15 us.
4. A latency-bound async dataset (every item awaits ``asyncio.sleep(0.02)``) at several
   ``concurrency`` values: items/s as a fraction of the ideal ``concurrency / 0.02``.
   Targets: >= 80% up to 256, >= 50% at 1024.
5. What ``loader.stats()``'s recorder costs when nobody reads it, on measurement 3's pipeline:
   us per batch with the recorder as shipped (it measures the latency and bytes of the first
   8 batches of an epoch, then of one in 32) against the same loader measuring no batch, in
   the same run; and the recorder's whole per-batch work (what every batch pays and its share
   of the measured ones) timed on its own in CPU time, like a batch of ``async for``. Target:
   that work under 5% of a batch's CPU time under ``async for``.

Within a measurement the cases run in turn, repetition by repetition, so that drift on a busy
machine hits them alike; every case runs once untimed first. torch is optional
(``pip install torch``): without it the torch rows are skipped.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import importlib.metadata
import itertools
import os
import platform
import queue
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from functools import partial
from typing import Any

import numpy as np
import uvloop
from common import Rates, optional

import aioload.pipeline.scheduler
from aioload import DataLoader
from aioload.pipeline.handoff import Delivery
from aioload.stats.recorder import EpochRecorder, batch_nbytes

torch = optional("torch")
torch_data = optional("torch.utils.data")

BATCH = 64
DELAY = 0.02  # seconds each item of the latency-bound dataset waits
CONCURRENCIES = (1, 64, 256, 1024)
# What the targets were set against: torch's in-memory loop on the reference machine.
REFERENCE_TORCH_ITEMS_S = 1.1e6
ASYNC_TARGET_ITEMS_S = 500e3

Sample = tuple[np.ndarray, int]
Batch = tuple[np.ndarray, np.ndarray]


# -- datasets ------------------------------------------------------------


class Rows:
    """Rows of float32[16] with an int label, held in memory."""

    def __init__(self, n: int) -> None:
        rng = np.random.default_rng(0)
        self.x = rng.random((n, 16), dtype=np.float32)
        self.y = [int(v) for v in rng.integers(0, 10, n)]

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> Sample:
        return self.x[i], self.y[i]


class AsyncRows(Rows):
    """The same rows, read through an ``async def __getitem__`` that never waits."""

    async def __getitem__(self, i: int) -> Sample:  # type: ignore[override]
        return self.x[i], self.y[i]


def collate(samples: list[Sample]) -> Batch:
    """The numpy collate_fn of the in-memory cases: stack the rows, gather the labels."""
    rows, labels = zip(*samples, strict=True)
    return np.stack(rows), np.array(labels)


class Prebuilt:
    """Returns the same prebuilt samples for every batch: fetching costs next to nothing."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.samples = [(np.zeros(16, np.float32), 0)] * BATCH

    def __len__(self) -> int:
        return self.n

    async def __getitems__(self, keys: list[int]) -> list[Sample]:
        return self.samples

    def __getitem__(self, i: int) -> Sample:
        return self.samples[0]


class SyncPrebuilt(Prebuilt):
    """:class:`Prebuilt` with a sync ``__getitems__`` (read inline under ``for``)."""

    def __getitems__(self, keys: list[int]) -> list[Sample]:  # type: ignore[override]
        return self.samples


class SameKeys:
    """A batch sampler yielding one list of keys ``n`` times: drawing keys costs nothing."""

    batch_size = BATCH

    def __init__(self, n: int) -> None:
        self.n = n
        self.keys = list(range(BATCH))

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[list[int]]:
        return itertools.repeat(self.keys, self.n)


class Slow:
    """Every item waits ``DELAY`` seconds, as a remote read would."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    async def __getitem__(self, i: int) -> int:
        await asyncio.sleep(DELAY)
        return i


# -- timing --------------------------------------------------------------

# A case runs once and returns (units done, seconds taken).
Case = Callable[[], tuple[int, float]]


def sync_case(consume: Callable[[], int]) -> Case:
    def run() -> tuple[int, float]:
        start = time.perf_counter()
        done = consume()
        return done, time.perf_counter() - start

    return run


def async_case(consume: Callable[[], Coroutine[Any, Any, int]]) -> Case:
    async def timed() -> tuple[int, float]:
        start = time.perf_counter()
        done = await consume()
        return done, time.perf_counter() - start

    def run() -> tuple[int, float]:
        result: tuple[int, float] = uvloop.run(timed())
        return result

    return run


def measure(cases: dict[str, Case], repeat: int) -> dict[str, Rates]:
    """Rates of every case: one untimed warm-up each, then ``repeat`` rounds in turn."""
    for run in cases.values():
        run()
    rates: dict[str, Rates] = {name: Rates([]) for name in cases}
    for _ in range(repeat):
        for name, run in cases.items():
            done, seconds = run()
            rates[name].values.append(done / seconds)
    return rates


def verdict(ok: bool) -> str:
    return "ok" if ok else "MISSED"


# -- 1 and 2: items per second on an in-memory dataset --------------------


def count_for(loader: Any) -> int:
    items = 0
    for _, labels in loader:
        items += len(labels)
    return items


async def count_async_for(loader: DataLoader) -> int:
    items = 0
    async for _, labels in loader:
        items += len(labels)
    return items


def bare_loop(dataset: Rows) -> int:
    items = 0
    n = len(dataset)
    for start in range(0, n, BATCH):
        _, labels = collate([dataset[i] for i in range(start, min(start + BATCH, n))])
        items += len(labels)
    return items


async def bare_async_loop(dataset: AsyncRows) -> int:
    items = 0
    n = len(dataset)
    for start in range(0, n, BATCH):
        samples = [await dataset[i] for i in range(start, min(start + BATCH, n))]
        items += len(collate(samples)[1])
    return items


def in_memory(rows: int, repeat: int) -> None:
    """Measurements 1 and 2."""
    sync_rows, async_rows = Rows(rows), AsyncRows(rows)
    sync_loader = DataLoader(sync_rows, batch_size=BATCH, collate_fn=collate)
    async_loader = DataLoader(async_rows, batch_size=BATCH, collate_fn=collate)
    cases: dict[str, Case] = {
        "bare Python loop (sync)": sync_case(lambda: bare_loop(sync_rows)),
        "aioload, for (sync)": sync_case(lambda: count_for(sync_loader)),
        "aioload, async for (sync: read in a thread)": async_case(
            lambda: count_async_for(sync_loader)
        ),
        "bare Python loop (async, awaited in turn)": async_case(
            lambda: bare_async_loop(async_rows)
        ),
        "aioload, for (async)": sync_case(lambda: count_for(async_loader)),
        "aioload, async for (async)": async_case(lambda: count_async_for(async_loader)),
    }
    if torch_data is not None:
        torch_loader = torch_data.DataLoader(sync_rows, batch_size=BATCH, collate_fn=collate)
        cases = {"torch DataLoader (sync)": sync_case(lambda: count_for(torch_loader)), **cases}
    rates = measure(cases, repeat)
    torch_rate = rates["torch DataLoader (sync)"].median if torch_data is not None else None

    print(f"\n1-2. In-memory dataset: {rows} rows of float32[16] + int label, batch {BATCH},")
    print("     numpy collate_fn, num_workers=0")
    bare = rates["bare Python loop (sync)"].median
    header = f"{'':<46} {'items/s':>10} {'(min..max)':>19} {'x torch':>8} {'x bare':>7}"
    print(header)
    print("-" * len(header))
    for name, rate in rates.items():
        ratio = f"{rate.median / torch_rate:>8.2f}" if torch_rate else f"{'-':>8}"
        print(
            f"{name:<46} {rate.median:>10.0f} {rate.spread():>19} {ratio}"
            f" {rate.median / bare:>7.2f}"
        )

    sync_for = rates["aioload, for (sync)"].median
    async_for = rates["aioload, async for (async)"].median
    async_for_facade = rates["aioload, for (async)"].median
    if torch_rate:
        scaled = ASYNC_TARGET_ITEMS_S / REFERENCE_TORCH_ITEMS_S
        print(
            f"target 1: aioload for (sync) >= 0.8 x torch: {sync_for / torch_rate:.2f} "
            f"{verdict(sync_for >= 0.8 * torch_rate)}"
        )
        worst = min(async_for, async_for_facade)
        print(
            f"target 2: async dataset >= {ASYNC_TARGET_ITEMS_S / 1e3:.0f}k items/s where torch "
            f"does {REFERENCE_TORCH_ITEMS_S / 1e6:.1f}M, i.e. >= {scaled:.2f} x torch here: "
            f"for {async_for_facade / torch_rate:.2f}, async for {async_for / torch_rate:.2f} "
            f"{verdict(worst >= scaled * torch_rate)}"
        )
    else:
        print("(torch is not installed: no torch row; 'x bare' is relative to the bare loop)")


# -- 3: the sync facade's hand-off ----------------------------------------


def count_batches_for(loader: DataLoader) -> int:
    return sum(1 for _ in loader)


async def count_batches_async_for(loader: DataLoader) -> int:
    batches = 0
    async for _ in loader:
        batches += 1
    return batches


def queue_handoff(make: Callable[[], Any], n: int) -> int:
    """Passes ``n`` objects from a producer thread through a queue to this thread."""
    channel = make()
    item = object()

    def produce() -> None:
        for _ in range(n):
            channel.put(item)
        channel.put(None)

    producer = threading.Thread(target=produce)
    producer.start()
    got = 0
    while channel.get() is not None:
        got += 1
    producer.join()
    return got


def handoff(batches: int, repeat: int) -> None:
    """Measurement 3."""
    dataset = Prebuilt(batches * BATCH)
    loader = DataLoader(dataset, batch_sampler=SameKeys(batches), collate_fn=lambda b: b)
    sync_loader = DataLoader(
        SyncPrebuilt(batches * BATCH), batch_sampler=SameKeys(batches), collate_fn=lambda b: b
    )
    deep_loader = DataLoader(
        dataset, batch_sampler=SameKeys(batches), collate_fn=lambda b: b, prefetch_factor=16
    )
    window = loader.window
    cases: dict[str, Case] = {
        "aioload, async for on uvloop (no crossing)": async_case(
            lambda: count_batches_async_for(loader)
        ),
        "aioload, for (loop thread -> caller)": sync_case(lambda: count_batches_for(loader)),
        "aioload, for, sync __getitems__ (inline)": sync_case(
            lambda: count_batches_for(sync_loader)
        ),
        "aioload, for, prefetch_factor=16": sync_case(lambda: count_batches_for(deep_loader)),
        "reference: put+get, queue.SimpleQueue": sync_case(
            lambda: queue_handoff(queue.SimpleQueue, batches)
        ),
        f"reference: put+get, queue.Queue(maxsize={window})": sync_case(
            lambda: queue_handoff(lambda: queue.Queue(maxsize=window), batches)
        ),
    }
    rates = measure(cases, repeat)

    print(f"\n3. Hand-off: {batches} batches of {BATCH} prebuilt samples, identity collate_fn,")
    print(f"   window {window} batches (async __getitems__ unless said otherwise)")
    header = f"{'':<46} {'us/batch':>10} {'(min..max)':>19}"
    print(header)
    print("-" * len(header))
    for name, rate in rates.items():
        rev = Rates([1e6 / v for v in rate.values])
        print(f"{name:<46} {rev.median:>10.2f} {rev.spread(fmt='.2f'):>19}")
    on_loop = 1e6 / rates["aioload, async for on uvloop (no crossing)"].median
    crossing = 1e6 / rates["aioload, for (loop thread -> caller)"].median
    cost = crossing - on_loop
    print(f"target 3: hand-off = for - async for = {cost:.2f} us/batch <= 15 {verdict(cost <= 15)}")


# -- 4: a latency-bound async dataset --------------------------------------


async def bare_workers(concurrency: int, items: int) -> int:
    """The same reads without aioload: ``concurrency`` coroutines pulling keys in turn."""
    dataset = Slow(items)
    keys = iter(range(items))

    async def worker() -> None:
        for key in keys:
            await dataset[key]

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return items


def latency(duration: float, repeat: int) -> None:
    """Measurement 4."""
    cases: dict[str, Case] = {}
    loaders: dict[int, DataLoader] = {}
    for concurrency in CONCURRENCIES:
        # About `duration` seconds at the ideal rate, however high the concurrency.
        items = max(1, round(concurrency / DELAY * duration))
        loader = DataLoader(
            Slow(items), batch_size=BATCH, collate_fn=np.array, concurrency=concurrency
        )
        loaders[concurrency] = loader
        cases[f"{concurrency} bare"] = async_case(partial(bare_workers, concurrency, items))
        cases[f"{concurrency} async for"] = async_case(partial(count_items_async_for, loader))
        cases[f"{concurrency} for"] = sync_case(partial(count_items_for, loader))
    rates = measure(cases, repeat)

    print(f"\n4. Latency-bound async dataset: each item awaits asyncio.sleep({DELAY}),")
    print(
        f"   batch {BATCH}, default prefetch_factor "
        f"(window = max(16, 2*ceil(concurrency/{BATCH})))."
    )
    print("   'bare': the same reads by `concurrency` plain coroutines on uvloop, no aioload.")
    header = (
        f"{'concurrency':>11} {'items':>6} {'window':>6} {'ideal/s':>8} {'bare':>5}"
        f" {'async for/s':>12} {'% ideal':>8} {'for/s':>9} {'% ideal':>8}  target"
    )
    print(header)
    print("-" * len(header))
    for concurrency, loader in loaders.items():
        ideal = concurrency / DELAY
        bare = rates[f"{concurrency} bare"].median
        on_loop = rates[f"{concurrency} async for"].median
        facade = rates[f"{concurrency} for"].median
        target = 0.8 if concurrency <= 256 else 0.5
        ok = min(on_loop, facade) >= target * ideal
        print(
            f"{concurrency:>11} {len(loader.dataset):>6} {loader.window:>6} {ideal:>8.0f}"
            f" {bare / ideal:>5.0%} {on_loop:>12.0f} {on_loop / ideal:>8.0%} {facade:>9.0f}"
            f" {facade / ideal:>8.0%}  >= {target:.0%} {verdict(ok)}"
        )


def count_items_for(loader: DataLoader) -> int:
    return sum(len(batch) for batch in loader)


async def count_items_async_for(loader: DataLoader) -> int:
    items = 0
    async for batch in loader:
        items += len(batch)
    return items


# -- 5: what the stats recorder costs ---------------------------------------------


@contextlib.contextmanager
def measuring(every: bool) -> Iterator[None]:
    """Whether the scheduler measures its usual sample of batches (else only batch 0)."""
    saved = aioload.pipeline.scheduler._MEASURE_FIRST, aioload.pipeline.scheduler._MEASURE_MASK
    if not every:
        aioload.pipeline.scheduler._MEASURE_FIRST, aioload.pipeline.scheduler._MEASURE_MASK = (
            0,
            (1 << 62) - 1,
        )
    try:
        yield
    finally:
        aioload.pipeline.scheduler._MEASURE_FIRST, aioload.pipeline.scheduler._MEASURE_MASK = saved


def unmeasured(case: Case) -> Case:
    """``case`` with no batch measured but the first: the recorder's sampled work left out."""

    def run() -> tuple[int, float]:
        with measuring(False):
            return case()

    return run


def recorder_work(batches: int, batch: Any) -> int:
    """Everything the recorder does for ``batches`` batches, outside any loader."""
    stats = EpochRecorder(collated=True, batch_size=BATCH)
    keys = list(range(BATCH))
    submitted: dict[int, float] = {}
    clock = time.perf_counter
    first, mask = (
        aioload.pipeline.scheduler._MEASURE_FIRST,
        aioload.pipeline.scheduler._MEASURE_MASK,
    )
    for seq in range(batches):  # what the scheduler and the consumer do per batch
        if seq < first or not seq & mask:  # at submission
            submitted[seq] = clock()
        measured = seq < first or not seq & mask  # at completion
        started = submitted.pop(seq, None) if measured else None
        items = len(keys)
        if measured:
            stats.sample(items, batch_nbytes(batch))
        delivery = Delivery(seq, batch, None, items)
        if started is not None:
            stats.fetched(clock() - started)
        stats.batches += 1  # the consumer
        stats.items += delivery.items
    return batches


def cpu_case(consume: Callable[[], int]) -> Case:
    """A case timed in CPU seconds of this thread: a busy machine's preemptions left out."""

    def run() -> tuple[int, float]:
        start = time.thread_time()
        done = consume()
        return done, time.thread_time() - start

    return run


def bare_deliveries(batches: int, batch: Any) -> int:
    """The same loop without the recorder: only the deliveries."""
    for seq in range(batches):
        Delivery(seq, batch)
    return batches


def timed_stats(loader: DataLoader) -> float:
    """Seconds one ``loader.stats()`` snapshot takes."""
    start = time.perf_counter()
    loader.stats()
    return time.perf_counter() - start


def stats_overhead(batches: int, repeat: int) -> None:
    """Measurement 5."""

    def loader() -> DataLoader:
        return DataLoader(
            Prebuilt(batches * BATCH), batch_sampler=SameKeys(batches), collate_fn=lambda b: b
        )

    on, off = loader(), loader()
    samples = Prebuilt(BATCH).samples
    collated = collate(samples)  # what a numpy collate_fn makes of them
    cases: dict[str, Case] = {
        "async for, recorder on (as shipped)": async_case(lambda: count_batches_async_for(on)),
        "async for, nothing measured": unmeasured(async_case(lambda: count_batches_async_for(off))),
        "for, recorder on (as shipped)": sync_case(lambda: count_batches_for(on)),
        "for, nothing measured": unmeasured(sync_case(lambda: count_batches_for(off))),
        "CPU: async for, as shipped": cpu_case(lambda: uvloop.run(count_batches_async_for(on))),
        "CPU: recorder alone, list of 64 samples": cpu_case(
            lambda: recorder_work(batches, samples)
        ),
        "CPU: recorder alone, collated (x, y)": cpu_case(lambda: recorder_work(batches, collated)),
        "CPU: deliveries alone (no recorder)": cpu_case(lambda: bare_deliveries(batches, collated)),
    }
    rates = measure(cases, repeat)
    snapshot = min(timed_stats(on) for _ in range(5))

    print(f"\n5. Stats recorder: measurement 3's pipeline ({batches} batches of {BATCH} prebuilt")
    print("   samples): the recorder as shipped (measures the first 8 batches, then 1 in 32)")
    print("   vs measuring nothing; and the recorder's whole per-batch work on its own")
    header = f"{'':<46} {'us/batch':>10} {'(min..max)':>19}"
    print(header)
    print("-" * len(header))
    per_batch: dict[str, float] = {}
    for name, rate in rates.items():
        rev = Rates([1e6 / v for v in rate.values])
        per_batch[name] = rev.median
        print(f"{name:<46} {rev.median:>10.3f} {rev.spread(fmt='.3f'):>19}")
    print(
        "(the two loaders differ only by the measured batches' share, well under 1 us/batch: a "
        "larger gap is the machine's noise; compare the fastest repetitions too)"
    )
    for style in ("async for", "for"):
        shipped = per_batch[f"{style}, recorder on (as shipped)"]
        silenced = per_batch[f"{style}, nothing measured"]
        print(
            f"{style}: as shipped - nothing measured = {shipped - silenced:+.2f} us/batch "
            f"({(shipped - silenced) / silenced:+.1%})"
        )
    alone = max(per_batch[name] for name in per_batch if name.startswith("CPU: recorder alone"))
    work = alone - per_batch["CPU: deliveries alone (no recorder)"]
    share = work / per_batch["CPU: async for, as shipped"]
    print(
        f"target 5: the recorder's whole per-batch work {work * 1e3:.0f} ns of CPU = {share:.1%} "
        f"of a batch's CPU under async for (< 5%) {verdict(share < 0.05)}; one stats() call "
        f"{snapshot * 1e6:.0f} us"
    )


# -- main --------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument("--repeat", type=int, default=None, help="repetitions (default 5)")
    parser.add_argument(
        "--only",
        action="append",
        choices=["memory", "handoff", "latency", "stats"],
        help="run only these measurements (repeatable; default: all)",
    )
    args = parser.parse_args()
    only = set(args.only or ["memory", "handoff", "latency", "stats"])
    repeat = args.repeat or (1 if args.quick else 5)
    rows, batches, duration = (2_000, 200, 0.05) if args.quick else (100_000, 20_000, 0.5)

    torch_version = torch.__version__ if torch is not None else "not installed"
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    print(
        f"Python {platform.python_version()}, numpy {np.__version__}, uvloop "
        f"{importlib.metadata.version('uvloop')}, torch {torch_version}; {os.cpu_count()} CPUs, "
        f"load average {load}"
    )
    print(f"medians of {repeat} repetitions{' (--quick: smoke run, not figures)' * args.quick}")
    sys.stdout.flush()
    if "memory" in only:
        in_memory(rows, repeat)
    if "handoff" in only:
        handoff(batches, repeat)
    if "latency" in only:
        latency(duration, repeat)
    if "stats" in only:
        stats_overhead(batches, repeat)


if __name__ == "__main__":
    main()
