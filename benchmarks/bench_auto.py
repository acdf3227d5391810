"""``concurrency="auto"`` against the best fixed concurrency, in the same run.

Run by hand: ``python benchmarks/bench_auto.py [--quick] [--seconds 6] [--repeat 3]``.

64 KiB objects from an :class:`~aioload.testing.ObjectServer`, read by ``ObjectDataset``
through ``DataLoader`` (batch 32, 0 workers, ``async for``), for a fixed time each:

1. **Sweep**: the server answers after 20 ms, then after 80 ms; fixed concurrencies
   (16, 64, 256, 1024, 4096; fewer with ``--quick``) and ``"auto"``, ``--repeat`` times in
   turn. Printed: items/s over the second half of each run (the median of 0.5 s windows;
   the median over the repetitions), auto's ratio to the best fixed one, and when auto's
   throughput (0.5 s windows) first reached 0.9 x it (the median over the repetitions).
2. **Latency step**: 20 ms, then 80 ms from the middle of the run on; auto and the
   default 256, items/s before and after the step, against the sweep's best fixed value at
   80 ms, and how long after the step auto was back at 0.9 x that.
3. **Throttled**: the server caps requests at 2,000/s (beyond: 503 + Retry-After);
   obstore's own retries are off, so every 503 reaches the loader, whose
   ``RetryPolicy(retry_on=is_transient)`` retries it, ``on_error="skip"``. Auto and
   fixed 256: items/s, items failed (skipped), the share of requests answered 503.

The machine may be shared: quote the ratios within one run, not the absolute figures.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from aioload import DataLoader, RetryPolicy
from aioload.sources import ObjectDataset
from aioload.sources.stores.errors import is_transient
from aioload.testing import ObjectServer

OBJECT_SIZE = 64 << 10
WINDOW = 0.5  # seconds of each throughput window


def make_objects(folder: Path, count: int) -> list[str]:
    """``count`` objects of 64 KiB under ``folder``; their keys."""
    keys = [f"{i:05d}.bin" for i in range(count)]
    payload = bytes(range(256)) * (OBJECT_SIZE // 256)
    for key in keys:
        (folder / key).write_bytes(payload)
    return keys


async def timed_run(
    url: str,
    keys: list[str],
    concurrency: int | str,
    seconds: float,
    *,
    throttled: bool = False,
    on_start: Any = None,
) -> dict[str, Any]:
    """Reads for ``seconds``; items per window, the stats at the end."""
    options = {"retry_config": {"max_retries": 0}} if throttled else None
    dataset = ObjectDataset(url + "/", keys * 1000, storage_options=options)
    extra: dict[str, Any] = {}
    if throttled:
        extra = {
            "retry": RetryPolicy(attempts=20, backoff=0.02, max_backoff=1.0, retry_on=is_transient),
            "on_error": "skip",
        }
    loader = DataLoader(dataset, batch_size=32, concurrency=concurrency, collate_fn=list, **extra)
    windows: list[int] = [0]
    iterator = aiter(loader)
    start = time.perf_counter()
    if on_start is not None:
        on_start()
    edge = start + WINDOW
    async for batch in iterator:
        now = time.perf_counter()
        while now >= edge:
            windows.append(0)
            edge += WINDOW
        windows[-1] += len(batch)
        if now - start >= seconds:
            break
    await iterator.aclose()
    stats = loader.stats()
    return {"windows": windows[:-1], "stats": stats}


def rate(windows: list[int], first: float = 0.5, last: float = 1.0) -> float:
    """The median items/s of the windows between shares ``first`` and ``last`` of the run."""
    part = windows[int(len(windows) * first) : max(int(len(windows) * last), 1)]
    return statistics.median(part) / WINDOW if part else 0.0


def reached(windows: list[int], target: float) -> float | None:
    """Seconds until a window first reached ``target`` items/s."""
    for index, count in enumerate(windows):
        if count / WINDOW >= target:
            return (index + 1) * WINDOW
    return None


def median_reached(runs: list[list[int]], target: float, after: float = 0.0) -> float | None:
    """The median over ``runs`` of the seconds from ``after`` until a window reached
    ``target`` items/s (a run that never did counts as never: None beats every time)."""
    skip = int(after / WINDOW)
    times = [reached(windows[skip:], target) for windows in runs]
    known = sorted(t for t in times if t is not None)
    if len(known) * 2 <= len(times):
        return None
    return known[(len(times) - 1) // 2]


async def sweep(
    folder: Path, keys: list[str], points: list[int], seconds: float, repeat: int
) -> dict[float, float]:
    """The fixed sweep and auto at 20 and 80 ms, ``repeat`` times in turn; medians.

    Returns the best fixed items/s at each latency (the step compares with it)."""
    print("| latency | concurrency | items/s (median) | MB/s |")
    print("|---|---|---:|---:|")
    summary = []
    bests: dict[float, float] = {}
    for latency in (0.02, 0.08):
        with ObjectServer(folder, latency=latency) as server:
            fixed: dict[int, list[float]] = {point: [] for point in points}
            autos: list[float] = []
            auto_runs: list[list[int]] = []
            settled: list[int] = []
            for _ in range(repeat):  # the cases in turn: drift on the machine hits them alike
                for point in points:
                    run = await timed_run(server.url, keys, point, seconds)
                    fixed[point].append(rate(run["windows"]))
                run = await timed_run(server.url, keys, "auto", seconds)
                autos.append(rate(run["windows"]))
                auto_runs.append(run["windows"])
                settled.append(run["stats"].concurrency)
            medians = {point: statistics.median(rates) for point, rates in fixed.items()}
            for point, value in medians.items():
                print(
                    f"| {latency * 1e3:.0f} ms | {point} | {value:,.0f} | "
                    f"{value * OBJECT_SIZE / 1e6:,.0f} |"
                )
            auto = statistics.median(autos)
            print(
                f"| {latency * 1e3:.0f} ms | auto (settled {statistics.median(settled):.0f}) | "
                f"{auto:,.0f} | {auto * OBJECT_SIZE / 1e6:,.0f} |"
            )
            best_point = max(medians, key=medians.__getitem__)
            best = bests[latency] = medians[best_point]
            when = median_reached(auto_runs, 0.9 * best)
            summary.append((latency, best_point, best, auto, when))
    print()
    print(f"| latency | best fixed | auto / best | auto reached 0.9 x best after | ({repeat} runs)")
    print("|---|---|---:|---:|")
    for latency, point, best, auto, when in summary:
        after = "never" if when is None else f"{when:.1f} s"
        print(f"| {latency * 1e3:.0f} ms | {point} ({best:,.0f}/s) | {auto / best:.2f} | {after} |")
    return bests


async def step(
    folder: Path, keys: list[str], seconds: float, repeat: int, best_after: float
) -> None:
    """20 ms, then 80 ms from the middle of the run: auto and the default 256, medians; auto
    against ``best_after``, the sweep's best fixed items/s at 80 ms."""
    print(
        "| concurrency | items/s at 20 ms | items/s at 80 ms (2nd half after the step) | "
        "vs the best fixed at 80 ms | back at 0.9 x it after the step | settled |"
    )
    print("|---|---:|---:|---:|---:|---|")
    for concurrency in ("auto", 256):
        befores, afters, runs, settled = [], [], [], []
        for _ in range(repeat):
            with ObjectServer(folder, latency=0.02) as server:
                run = await timed_run(
                    server.url,
                    keys,
                    concurrency,
                    2 * seconds,
                    on_start=lambda server=server: server.schedule_latency([(seconds, 0.08)]),
                )
            befores.append(rate(run["windows"], 0.25, 0.5))
            afters.append(rate(run["windows"], 0.75, 1.0))
            runs.append(run["windows"])
            settled.append(run["stats"].concurrency)
        before, after = statistics.median(befores), statistics.median(afters)
        when = median_reached(runs, 0.9 * best_after, after=seconds)
        back = "never" if when is None else f"{when:.1f} s"
        tuned = f"{statistics.median(settled):.0f}" if concurrency == "auto" else "-"
        print(
            f"| {concurrency} | {before:,.0f} | {after:,.0f} | {after / best_after:.2f} | "
            f"{back} | {tuned} |"
        )


async def throttle(folder: Path, keys: list[str], seconds: float) -> None:
    print("| concurrency | items/s | vs the 2,000/s cap | items failed | 503 share | settled |")
    print("|---|---:|---:|---:|---:|---|")
    for concurrency in ("auto", 256):
        with ObjectServer(folder, latency=0.02, rate_limit=2000) as server:
            run = await timed_run(server.url, keys, concurrency, seconds, throttled=True)
            served = server.stats()
        got = rate(run["windows"])
        stats = run["stats"]
        share = served["throttled"] / max(1, served["requests"])
        settled = stats.concurrency if concurrency == "auto" else "-"
        print(
            f"| {concurrency} | {got:,.0f} | {got / 2000:.2f} | {stats.epoch.skipped} | "
            f"{share:.1%} | {settled} |"
        )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="fewer points, shorter runs")
    parser.add_argument("--seconds", type=float, default=6.0, help="each run's length")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each case (medians)")
    arguments = parser.parse_args()
    seconds = 3.0 if arguments.quick else arguments.seconds
    points = [16, 256, 4096] if arguments.quick else [16, 64, 256, 1024, 4096]
    repeat = 1 if arguments.quick else arguments.repeat
    print(f"bench_auto, {datetime.date.today()}, {seconds:g} s a run, {repeat} runs a case\n")
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        keys = make_objects(folder, 1024)
        bests = await sweep(folder, keys, points, seconds, repeat)
        print()
        await step(folder, keys, seconds, repeat, bests[0.08])
        print()
        await throttle(folder, keys, seconds)


if __name__ == "__main__":
    try:
        import uvloop

        uvloop.run(main())
    except ImportError:
        asyncio.run(main())
