"""Where a 16 MiB batch spends its time: measurement 2 of ``bench_workers.py``, stage by stage.

Run by hand: ``python benchmarks/profile_big_batches.py [--batches 200]``.

Two tables, so that the next regression shows where it is:

1. **Stages, in one process**, each timed alone over the same 16 MiB batches of 1 MiB items
   (milliseconds per batch, median): the worker's reads (``__getitem__``), stacking them as the
   plain loop does (``np.stack`` on the heap) and into a worker's reused shared segment (or a
   fresh one, whose pages fault), reading and stacking each sample as it is read (what a
   worker does, ``collate_as_read``), writing the result's layout (the pickle),
   the consumer reading the batch from a segment it has mapped before or from a fresh mapping,
   and a bare copy of the same bytes as the floor.
2. **The loader, end to end**, with 0 and 2 workers, next to the plain single-process loop:
   wall time per batch, the consumer's time waiting for batches and touching them, CPU time per
   batch of the consumer and of every worker (from ``/proc``), page faults per batch on each
   side, and how many distinct buffers the batches came in (with workers, segments: a
   handful, as they are reused).
   The CPU a batch needs in all, set against the cores, says what bounds the rate; two plain
   loops at once (``bench_workers.plain_loop``) say what the cores give with nothing handed over.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import bench_workers
import numpy as np
from bench_workers import BATCH, BIG_ITEM, PAGE, BigItems, aioload_loader, touch_pages

from aioload import default_collate
from aioload.backends.processes.worker import keep_freed_memory
from aioload.collate.core import collate_into
from aioload.collate.streamed import collate_as_read
from aioload.memory.segments import SegmentReader, SegmentWriter


def batches(first: int = 0) -> Iterator[list[np.ndarray]]:
    """The items of consecutive batches of measurement 2."""
    dataset = BigItems()
    key = first
    while True:
        yield [dataset[key + i] for i in range(BATCH)]
        key += BATCH


def per_batch(stage: Callable[[int], Any], count: int) -> float:
    """Median milliseconds of ``stage(batch number)`` over ``count`` calls (after 3 untimed)."""
    for number in range(3):
        stage(number)
    times = []
    for number in range(count):
        start = time.perf_counter()
        stage(number)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def stages(count: int) -> dict[str, float]:
    """Milliseconds per batch of each stage alone (see the module docstring).

    The process's allocator is first tuned as a worker's is (freed memory kept for the next
    batch), so the reads cost what they cost in a worker.
    """
    keep_freed_memory()
    dataset = BigItems()
    items = next(batches())
    out: dict[str, float] = {}
    out["reads: 16 x __getitem__ (np.full, 1 MiB)"] = per_batch(
        lambda n: [dataset[n * BATCH + i] for i in range(BATCH)], count
    )
    out["stack, plain loop (np.stack, heap)"] = per_batch(lambda n: np.stack(items), count)
    warm = np.empty((BATCH, BIG_ITEM), np.uint8)
    out["floor: copy 16 MiB into warm memory"] = per_batch(
        lambda n: np.stack(items, out=warm), count
    )

    writer = SegmentWriter()

    def stack_in_segment(writer: SegmentWriter) -> tuple[Any, Any]:
        arena = writer.arena()
        with collate_into(arena.allocate):
            batch = default_collate(items)
        return batch, arena

    def reused(n: int) -> None:
        _, arena = stack_in_segment(writer)
        arena.release()  # back to the free list: the next batch reuses the segment

    out["stack, worker (into a reused shared segment)"] = per_batch(reused, count)

    def as_read(n: int) -> None:
        arena = writer.arena()
        with collate_into(arena.allocate):
            collate_as_read(dataset.__getitem__, range(n * BATCH, (n + 1) * BATCH))
        arena.release()

    out["reads + stack as read, worker (reused segment)"] = per_batch(as_read, count)

    def fresh(n: int) -> None:
        own = SegmentWriter()
        batch, arena = stack_in_segment(own)
        del batch
        arena.release()
        own.drop(list(own._segments))

    out["stack, worker (into a fresh shared segment)"] = per_batch(fresh, max(10, count // 4))

    batch, arena = stack_in_segment(writer)
    written = writer.write(batch, arena)  # the first write hands out the descriptor
    reader = SegmentReader(keep_free=4)
    reader.read(written.segment, written.size, written.layout_at, written.fd)
    out["write the layout (pickle, header; arrays in place)"] = per_batch(
        lambda n: writer.write(batch, arena), count
    )

    def read_reused(n: int) -> None:
        got = reader.read(written.segment, written.size, written.layout_at, None)
        touch_pages(got, 0)

    out["consumer: read + touch, segment mapped before"] = per_batch(read_reused, count)

    def read_fresh(n: int) -> None:
        own = SegmentWriter()
        arena = own.arena()
        with collate_into(arena.allocate):
            stacked = default_collate(items)
        done = own.write(stacked, arena)
        del stacked
        start = time.perf_counter()
        got = SegmentReader(keep_free=0).read(done.segment, done.size, done.layout_at, done.fd)
        touch_pages(got, 0)
        fresh_times.append(time.perf_counter() - start)
        del got
        own.drop(list(own._segments))

    fresh_times: list[float] = []
    per_batch(read_fresh, max(10, count // 4))
    out["consumer: read + touch, fresh mapping (faults)"] = statistics.median(fresh_times[3:]) * 1e3
    out["consumer: touch a byte per page (heap batch)"] = per_batch(lambda n: _touch(warm), count)
    return out


def _touch(batch: np.ndarray) -> None:
    batch[:, ::PAGE].sum()


# -- end to end ----------------------------------------------------------------


def descendants() -> list[int]:
    """Pids of this process's descendants (the workers, a fork server's children too)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as file:
                    rest = file.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents[int(entry)] = int(rest[1])
    found: list[int] = []
    frontier = [os.getpid()]
    while frontier:
        pid = frontier.pop()
        children = [child for child, parent in parents.items() if parent == pid]
        found += children
        frontier += children
    return found


def process_counters(pid: int) -> tuple[float, int]:
    """(CPU seconds of its main thread, minor faults) of ``pid`` so far; zeros once it is gone.

    The CPU time is the scheduler's, in nanoseconds (``stat``'s is in 10 ms ticks, too coarse
    for a run of a second); a worker's other threads (the loader watch) sleep.
    """
    try:
        with open(f"/proc/{pid}/stat") as file:
            rest = file.read().rsplit(")", 1)[1].split()
        with open(f"/proc/{pid}/schedstat") as file:
            nanoseconds = int(file.read().split()[0])
    except OSError:
        return 0.0, 0
    return nanoseconds * 1e-9, int(rest[7])


def own_counters() -> tuple[float, int]:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime, usage.ru_minflt


def plain_loop() -> Iterator[np.ndarray]:
    """The single-process plain loop: the same reads, stacked, in the consumer's process."""
    for items in batches():
        yield np.stack(items)


def end_to_end(name: str, source: Callable[[], Any], count: int) -> dict[str, Any]:
    """One run of ``count`` timed batches (after one per worker, untimed) and its counters."""
    iterator = iter(source())
    try:
        key = 0
        for _ in range(4):  # every worker has delivered, segments are in steady state
            key += touch_pages(next(iterator), key)
        workers = [pid for pid in descendants() if process_counters(pid)[0] > 0]
        before = {pid: process_counters(pid) for pid in workers}
        cpu0, faults0 = own_counters()
        waiting = touching = 0.0
        addresses = set()
        start = time.perf_counter()
        for _ in range(count):
            t0 = time.perf_counter()
            batch = next(iterator)
            t1 = time.perf_counter()
            key += touch_pages(batch, key)
            touching += time.perf_counter() - t1
            waiting += t1 - t0
            addresses.add(np.asarray(batch).__array_interface__["data"][0])
        wall = time.perf_counter() - start
        cpu1, faults1 = own_counters()
        after = {pid: process_counters(pid) for pid in workers}
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:
            close()
    busy = [(after[p][0] - before[p][0], after[p][1] - before[p][1]) for p in workers]
    busy = [b for b in busy if b[0] > 0.01 * wall]  # the workers, not an idle fork server
    return {
        "name": name,
        "GB/s": count * BATCH * BIG_ITEM / wall / 1e9,
        "wall ms": wall / count * 1e3,
        "wait ms": waiting / count * 1e3,
        "touch ms": touching / count * 1e3,
        "consumer CPU ms": (cpu1 - cpu0) / count * 1e3,
        "workers CPU ms": [b[0] / count * 1e3 for b in busy],
        "consumer faults": (faults1 - faults0) / count,
        "worker faults": [b[1] / count for b in busy],
        "segments": len(addresses),
    }


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Field by field, the median of the repetitions of one run."""
    out: dict[str, Any] = {"name": runs[0]["name"]}
    for field, first in runs[0].items():
        if field == "name":
            continue
        if isinstance(first, list):
            width = min(len(run[field]) for run in runs)
            out[field] = [statistics.median(run[field][i] for run in runs) for i in range(width)]
        else:
            out[field] = statistics.median(run[field] for run in runs)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=300, help="timed batches per run")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions of each run")
    args = parser.parse_args()
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    print(f"{os.cpu_count()} CPUs, load average {load}; {BATCH} x {BIG_ITEM >> 20} MiB items")
    sources: dict[str, Callable[[], Any]] = {
        "plain loop, 1 process": plain_loop,
        "aioload, 0 workers": lambda: aioload_loader(BigItems(), 0),
        "aioload, 2 workers": lambda: aioload_loader(BigItems(), 2),
    }
    # The runs in turn, repetition by repetition, so that drift hits them alike; the plain
    # loop before anything tunes this process's allocator (the stages do, below).
    repeated: dict[str, list[dict[str, Any]]] = {name: [] for name in sources}
    for _ in range(args.repeat):
        for name, source in sources.items():
            repeated[name].append(end_to_end(name, source, args.batches))
    runs = [median_run(each) for each in repeated.values()]
    seconds = runs[-1]["wall ms"] * args.batches / 1e3
    pairs = [bench_workers.plain_loop(tuned=True, processes=2)(seconds) for _ in range(args.repeat)]
    ceiling = statistics.median(done / elapsed for done, elapsed in pairs) / 1e9

    measured = stages(args.batches)
    print("\n1. Stages alone, ms per 16 MiB batch (median)\n")
    print("| stage | ms | GB/s |")
    print("|---|---:|---:|")
    for stage, ms in measured.items():
        print(f"| {stage} | {ms:.2f} | {BATCH * BIG_ITEM / ms / 1e6:.1f} |")

    print(f"\n2. End to end, per batch, medians of {args.repeat} runs of {args.batches} batches")
    print("   (CPU and faults per batch delivered: each worker's counts over all batches)\n")
    print(
        "| run | GB/s | wall ms | waiting ms | touching ms | consumer CPU ms | workers CPU ms"
        " | CPU ms in all | consumer faults | worker faults | buffers |"
    )
    print("|---|---:|---:|---:|---:|---:|---|---:|---:|---|---:|")
    for run in runs:
        workers_cpu = " · ".join(f"{ms:.2f}" for ms in run["workers CPU ms"]) or "—"
        faults = " · ".join(f"{n:.0f}" for n in run["worker faults"]) or "—"
        total = run["consumer CPU ms"] + sum(run["workers CPU ms"])
        print(
            f"| {run['name']} | {run['GB/s']:.2f} | {run['wall ms']:.2f} | {run['wait ms']:.2f}"
            f" | {run['touch ms']:.2f} | {run['consumer CPU ms']:.2f} | {workers_cpu}"
            f" | {total:.2f} | {run['consumer faults']:.0f} | {faults} | {run['segments']:.0f} |"
        )
    cores = len(os.sched_getaffinity(0))
    two = runs[-1]
    workers = two["workers CPU ms"]
    total = two["consumer CPU ms"] + sum(workers)
    # Each of n workers makes 1/n of the batches: its CPU per batch of its own is n times its
    # CPU per batch delivered, so on average the sum of the workers' per-batch figures.
    own = sum(workers)
    alone = ("reads + stack as read", "write")
    work = sum(ms for stage, ms in measured.items() if stage.startswith(alone))
    print(
        f"\nA worker spends {own:.2f} ms of CPU per batch it makes; its stages alone take"
        f" {work:.2f} (reads stacked as read into a reused segment, the layout), with warm"
        f" caches: the rest is the worker's own overhead and the caches it shares."
        f" 2 workers need {total:.2f} ms of CPU per batch in all: on"
        f" {cores} cores at most {BATCH * BIG_ITEM / (total / cores) / 1e6:.2f} GB/s if nothing"
        f" else runs (measured {two['GB/s']:.2f}; the plain loop {runs[0]['GB/s']:.2f},"
        f" ratio {two['GB/s'] / runs[0]['GB/s']:.2f}). Two plain loops at once, allocators"
        f" tuned, nothing handed over (what the cores and their memory bandwidth give):"
        f" {ceiling:.2f} GB/s, so 2 workers get {two['GB/s'] / ceiling:.0%} of it."
    )


if __name__ == "__main__":
    main()
