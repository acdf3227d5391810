"""The benchmark report: every workload of the project in one run, contenders side by side.

Run by hand from the repository root: ``python benchmarks/run.py [--quick] [--repeat 5]
[--only loader --only workers ...] [--out FILE] [--plots DIR]``.

For every workload the contenders — aioload (with ``for`` and ``async for``, with and
without workers), torch's ``DataLoader`` when torch is installed, and a ceiling that does the
same work with no loader at all (a plain loop, plain asyncio coroutines, bare processes) —
each run once untimed, then ``--repeat`` times in turn, the order reversed every other round
so that drift on a busy machine hits them alike. The report is a table of medians (with the
fastest and slowest repetition) and ratios to the workload's baseline, written as JSON
(default ``benchmarks/results/latest.json``) and drawn as two PNG plots (default in
``docs/img/``): the figure of every contender per workload, and throughput against
``concurrency`` for the latency-bound workload.

The workloads come from suites, one per benchmark module: ``SUITES`` maps a suite's name to
a function returning its :class:`~common.Workload` list. A new benchmark module plugs in with
a ``workloads(quick: bool) -> list[Workload]`` function and one line in ``SUITES``
(``"sources": module_suite("bench_sources"),``). The benchmark modules keep their own command
lines, with their targets and longer tables.

``--quick`` runs smaller workloads with two repetitions: a check that everything runs (about
four minutes), not figures to quote.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import gc
import importlib
import importlib.metadata
import json
import math
import os
import platform
import queue
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any

import bench_collate
import bench_loader
import bench_workers
import numpy as np
import uvloop
from common import Rates, Run, Workload, optional

from aioload import DataLoader, default_collate

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "results" / "latest.json"
DEFAULT_PLOTS = HERE.parent / "docs" / "img"
LATENCY_SWEEP = (1, 16, 64, 256, 1024, 4096)
QUICK_LATENCY_SWEEP = (1, 64, 1024)


# -- the suites ----------------------------------------------------------------


def loader_workloads(quick: bool) -> list[Workload]:
    """``bench_loader.py``: what the loader costs on one event loop (``num_workers=0``)."""
    bl = bench_loader
    torch_data = optional("torch.utils.data")
    rows, batches, duration = (20_000, 2_000, 0.2) if quick else (100_000, 20_000, 0.5)
    sweep = QUICK_LATENCY_SWEEP if quick else LATENCY_SWEEP

    def in_memory(_: ExitStack) -> dict[str, Run]:
        data = bl.Rows(rows)
        loader = DataLoader(data, batch_size=bl.BATCH, collate_fn=bl.collate)
        runs: dict[str, Run] = {}
        if torch_data is not None:
            torch_loader = torch_data.DataLoader(data, batch_size=bl.BATCH, collate_fn=bl.collate)
            runs["torch DataLoader"] = bl.sync_case(partial(bl.count_for, torch_loader))
        runs["aioload, for"] = bl.sync_case(partial(bl.count_for, loader))
        runs["aioload, async for"] = bl.async_case(partial(bl.count_async_for, loader))
        runs["ceiling: plain loop"] = bl.sync_case(partial(bl.bare_loop, data))
        return runs

    def async_items(_: ExitStack) -> dict[str, Run]:
        data = bl.AsyncRows(rows)
        loader = DataLoader(data, batch_size=bl.BATCH, collate_fn=bl.collate)
        runs: dict[str, Run] = {}
        if torch_data is not None:
            # torch cannot await items: its figure is the same rows read synchronously.
            torch_loader = torch_data.DataLoader(
                bl.Rows(rows), batch_size=bl.BATCH, collate_fn=bl.collate
            )
            runs["torch DataLoader (sync rows)"] = bl.sync_case(partial(bl.count_for, torch_loader))
        runs["aioload, for"] = bl.sync_case(partial(bl.count_for, loader))
        runs["aioload, async for"] = bl.async_case(partial(bl.count_async_for, loader))
        runs["ceiling: plain asyncio loop"] = bl.async_case(partial(bl.bare_async_loop, data))
        return runs

    def handoff(_: ExitStack) -> dict[str, Run]:
        identity: Callable[[Any], Any] = lambda batch: batch  # noqa: E731
        loader = DataLoader(
            bl.Prebuilt(batches * bl.BATCH), batch_sampler=bl.SameKeys(batches), collate_fn=identity
        )
        runs: dict[str, Run] = {}
        if torch_data is not None:
            torch_loader = torch_data.DataLoader(
                bl.SyncPrebuilt(batches * bl.BATCH),
                batch_sampler=bl.SameKeys(batches),
                collate_fn=identity,
            )
            runs["torch DataLoader"] = bl.sync_case(partial(bl.count_batches_for, torch_loader))
        runs["aioload, for"] = bl.sync_case(partial(bl.count_batches_for, loader))
        runs["aioload, async for"] = bl.async_case(partial(bl.count_batches_async_for, loader))
        runs["ceiling: queue.Queue between two threads"] = bl.sync_case(
            partial(bl.queue_handoff, partial(queue.Queue, maxsize=loader.window), batches)
        )
        return runs

    def latency(concurrency: int) -> Callable[[ExitStack], dict[str, Run]]:
        def make(_: ExitStack) -> dict[str, Run]:
            items = max(1, round(concurrency / bl.DELAY * duration))
            loader = DataLoader(
                bl.Slow(items), batch_size=bl.BATCH, collate_fn=np.array, concurrency=concurrency
            )
            return {
                "aioload, for": bl.sync_case(partial(bl.count_items_for, loader)),
                "aioload, async for": bl.async_case(partial(bl.count_items_async_for, loader)),
                "ceiling: plain asyncio coroutines": bl.async_case(
                    partial(bl.bare_workers, concurrency, items)
                ),
            }

        return make

    baseline = "torch DataLoader" if torch_data is not None else "ceiling: plain loop"
    workloads = [
        Workload(
            f"in-memory rows, sync __getitem__, batch {bl.BATCH}",
            "items/s",
            in_memory,
            baseline=baseline,
        ),
        Workload(
            f"in-memory rows, async def __getitem__, batch {bl.BATCH}",
            "items/s",
            async_items,
            baseline="torch DataLoader (sync rows)"
            if torch_data is not None
            else "ceiling: plain asyncio loop",
        ),
        Workload(
            "hand-off: prebuilt batches, identity collate",
            "batches/s",
            handoff,
            baseline="torch DataLoader" if torch_data is not None else "aioload, async for",
        ),
    ]
    for concurrency in sweep:
        workloads.append(
            Workload(
                f"latency-bound items (20 ms each), concurrency {concurrency}",
                "items/s",
                latency(concurrency),
                baseline="ceiling: plain asyncio coroutines",
                sweep=("concurrency", concurrency),
                ideal=concurrency / bl.DELAY,
            )
        )
    return workloads


def workers_workloads(quick: bool) -> list[Workload]:
    """``bench_workers.py``: worker processes, CPU-bound, big batches, HTTP."""
    bw = bench_workers
    torch_data = optional("torch.utils.data")
    cpu_s, http_s = (0.3, 0.6) if quick else (0.8, 1.2)
    workers = bw.WORKERS
    torch_name = f"torch DataLoader, {workers} workers"
    baseline = torch_name if torch_data is not None else None

    def cpu(kind: str) -> Callable[[ExitStack], dict[str, Run]]:
        def make(_: ExitStack) -> dict[str, Run]:
            if kind == "numpy":
                rounds, _cost = bw.calibrate(bw.numpy_work)
                data: Any = bw.NumpyItems(rounds)
            else:
                loops, _cost = bw.calibrate(bw.python_work)
                data = bw.PythonItems(loops)
            cases: dict[str, bw.Case] = {}
            if torch_data is not None:
                cases[torch_name] = bw.throughput(
                    partial(bw.torch_loader, torch_data, data, workers), bw.touch_labelled, workers
                )
            cases["aioload, 0 workers"] = bw.throughput(
                partial(bw.aioload_loader, data, 0), bw.touch_labelled, 1
            )
            cases[f"aioload, {workers} workers"] = bw.throughput(
                partial(bw.aioload_loader, data, workers), bw.touch_labelled, workers
            )
            cases[f"ceiling: {workers} bare processes"] = bw.bare_processes(data, workers)
            return {name: partial(case, cpu_s) for name, case in cases.items()}

        return make

    def big(_: ExitStack) -> dict[str, Run]:
        data = bw.BigItems()
        cases: dict[str, bw.Case] = {}
        if torch_data is not None:
            cases[torch_name] = bw.throughput(
                partial(bw.torch_loader, torch_data, data, workers),
                bw.touch_pages,
                workers,
                bw.BIG_ITEM,
            )
        cases["aioload, 0 workers"] = bw.throughput(
            partial(bw.aioload_loader, data, 0), bw.touch_pages, 1, bw.BIG_ITEM
        )
        cases[f"aioload, {workers} workers"] = bw.throughput(
            partial(bw.aioload_loader, data, workers), bw.touch_pages, workers, bw.BIG_ITEM
        )
        # The single-process bar: the same reads and stacking in a plain loop, no loader.
        cases["ceiling: plain loop, 1 process"] = bw.plain_loop()
        return {name: partial(case, cpu_s) for name, case in cases.items()}

    def http(processes: int) -> Callable[[ExitStack], dict[str, Run]]:
        concurrency = bw.HTTP_CONCURRENCY[processes]

        def make(stack: ExitStack) -> dict[str, Run]:
            port = stack.enter_context(bw.object_server())
            lean = bw.LeanObjects(port)
            prefetch = 2 * math.ceil(concurrency / bw.BATCH)
            cases: dict[str, bw.Case] = {}
            if torch_data is not None:
                cases[f"torch DataLoader, {processes} workers"] = bw.throughput(
                    partial(bw.torch_loader, torch_data, bw.BlockingObjects(port), processes),
                    bw.touch_objects,
                    processes,
                )
            cases[f"aioload, {processes} workers"] = bw.throughput(
                partial(
                    bw.aioload_loader,
                    lean,
                    processes,
                    concurrency=concurrency,
                    prefetch_factor=prefetch,
                ),
                bw.touch_objects,
                processes,
            )
            if processes == workers:
                cases["aioload, 0 workers, async for"] = bw.async_throughput(
                    partial(bw.aioload_loader, lean, 0, concurrency=concurrency * processes),
                    bw.touch_objects,
                )
                cases["ceiling: plain asyncio coroutines"] = asyncio_http_ceiling(
                    port, concurrency * processes
                )
            return {name: partial(case, http_s) for name, case in cases.items()}

        return make

    workloads = [
        Workload(
            f"CPU-bound items, ~2 ms of numpy each, {workers} workers",
            "items/s",
            cpu("numpy"),
            baseline=baseline,
        ),
        Workload(
            f"CPU-bound items, ~2 ms of pure Python each, {workers} workers",
            "items/s",
            cpu("python"),
            baseline=baseline,
        ),
        Workload(
            f"16 MiB batches of 1 MiB items, {workers} workers",
            "GB/s",
            big,
            baseline=baseline,
            scale=1e-9,
        ),
        Workload(
            f"64 KiB over loopback HTTP behind 20 ms, {workers} workers",
            "items/s",
            http(workers),
            baseline=baseline,
        ),
    ]
    if not quick:
        workloads.append(
            Workload(
                "64 KiB over loopback HTTP behind 20 ms, 16 workers",
                "items/s",
                http(16),
                baseline="torch DataLoader, 16 workers" if torch_data is not None else None,
            )
        )
    return workloads


def collate_workloads(quick: bool) -> list[Workload]:
    """``bench_collate.py``: ``default_collate`` against the bare numpy call (and torch's)."""
    torch_data = optional("torch.utils.data")
    rng = np.random.default_rng(0)
    images = [rng.random((3, 64, 64), dtype=np.float32) for _ in range(64)]
    small = [rng.random(16, dtype=np.float32) for _ in range(64)]
    labels = [int(x) for x in rng.integers(0, 10, 64)]
    pairs = list(zip(small, labels, strict=True))
    target = 0.02 if quick else 0.1  # seconds per timed run

    def timed(fn: Callable[[], Any]) -> Run:
        calls = max(1, round(target / max(bench_collate._per_call_seconds(fn, 3), 1e-9)))

        def run() -> tuple[float, float]:
            return calls, bench_collate._per_call_seconds(fn, calls) * calls

        return run

    def cases(batch: list[Any], reference: Callable[[], Any], name: str) -> Workload:
        def make(_: ExitStack) -> dict[str, Run]:
            runs: dict[str, Run] = {}
            if torch_data is not None:
                runs["torch default_collate (to tensors)"] = timed(
                    partial(torch_data.default_collate, batch)
                )
            runs["aioload default_collate"] = timed(partial(default_collate, batch))
            runs[f"reference: {name}"] = timed(reference)
            return runs

        return Workload(
            "default_collate, "
            + ("64 x float32[3,64,64]" if batch is images else "64 x (float32[16], int)"),
            "batches/s",
            make,
            baseline=f"reference: {name}",
        )

    return [
        cases(images, partial(np.stack, images), "np.stack"),
        cases(pairs, lambda: (np.stack(small), np.array(labels)), "np.stack + np.array"),
    ]


def module_suite(module: str) -> Callable[[bool], list[Workload]]:
    """The suite of a benchmark module that defines ``workloads(quick: bool) ->
    list[Workload]``, imported only when the suite runs (so its optional dependencies are
    needed only then)."""

    def workloads(quick: bool) -> list[Workload]:
        found: list[Workload] = importlib.import_module(module).workloads(quick)
        return found

    return workloads


# The suites of the report, in the order they run (``--only NAME`` picks some). A benchmark
# module plugs in with one line: ``"sources": module_suite("bench_sources"),``.
SUITES: dict[str, Callable[[bool], list[Workload]]] = {
    "loader": loader_workloads,
    "workers": workers_workloads,
    "collate": collate_workloads,
    "sources": module_suite("bench_sources"),
    "cache": module_suite("bench_cache"),
    "shards": module_suite("bench_shards"),
    "executor": module_suite("bench_executor"),
    "startup": module_suite("bench_startup"),
}


# -- the plain asyncio ceiling of the HTTP workload -----------------------------


def asyncio_http_ceiling(port: int, concurrency: int) -> bench_workers.Case:
    """``concurrency`` plain coroutines on one uvloop loop reading objects with
    ``lean_get``, no loader: the most one process gets out of the same client."""

    async def timed(duration: float) -> tuple[int, float]:
        next_key = 0
        done = 0
        start = time.perf_counter()
        end = start + duration

        async def reader() -> None:
            nonlocal next_key, done
            while time.perf_counter() < end:
                key, next_key = next_key, next_key + 1
                body = await bench_workers.lean_get(port, f"/obj/{key}")
                bench_workers.object_array(body, key)
                done += 1

        try:
            await asyncio.gather(*(reader() for _ in range(concurrency)))
        finally:
            for _reader, writer in bench_workers._idle.pop(asyncio.get_running_loop(), []):
                writer.close()
        return done, time.perf_counter() - start

    def run(duration: float) -> tuple[int, float]:
        result: tuple[int, float] = uvloop.run(timed(duration))
        return result

    return run


# -- measuring -------------------------------------------------------------------


def measure(workload: Workload, repeat: int) -> dict[str, Any]:
    """The workload's contenders: one untimed run each, then ``repeat`` rounds in turn (the
    first run counting as the first round where the workload has no warm-up)."""
    with ExitStack() as stack:
        runs = workload.contenders(stack)
        missing: dict[str, str] = {}
        first: dict[str, tuple[float, float]] = {}
        for name, run in runs.items():
            try:
                first[name] = run()
            except NotImplementedError as error:
                missing[name] = str(error).splitlines()[0]
        names = [name for name in runs if name not in missing]
        rates: dict[str, list[float]] = {name: [] for name in names}

        def add(name: str, units: float, seconds: float) -> None:
            if units <= 0 or seconds <= 0:
                raise RuntimeError(f"{workload.name}: {name} timed nothing")
            rates[name].append(units / seconds)

        done = 0
        if not workload.warm_up:
            # Every run starts cold (fresh processes): the first one counts like the others.
            for name in names:
                add(name, *first[name])
            done = 1
        for round_ in range(done, repeat):
            # Every other round in reverse, so that no contender always runs first.
            for name in names if round_ % 2 == 0 else names[::-1]:
                add(name, *runs[name]())
            gc.collect()
    figures: dict[str, dict[str, Any]] = {}
    for name, values in rates.items():
        shown = [figure(workload, v) for v in values]
        figures[name] = {
            "median": figure(workload, Rates(values).median),
            "min": min(shown),
            "max": max(shown),
            "values": shown,
        }
    base = figures.get(workload.baseline or "")
    for entry in figures.values():
        # A ratio above 1 is always "better than the baseline", for rates and latencies alike.
        if base is None:
            entry["ratio"] = None
        elif workload.lower_is_better:
            entry["ratio"] = base["median"] / entry["median"]
        else:
            entry["ratio"] = entry["median"] / base["median"]
    return {
        "name": workload.name,
        "unit": workload.unit,
        "baseline": workload.baseline if base is not None else None,
        "lower_is_better": workload.lower_is_better,
        "sweep": list(workload.sweep) if workload.sweep else None,
        "ideal": figure(workload, workload.ideal) if workload.ideal else None,
        "note": workload.note,
        "contenders": figures,
        "missing": missing,
    }


def figure(workload: Workload, rate: float) -> float:
    """A rate (units per second) as the workload shows it."""
    return workload.scale / rate if workload.lower_is_better else rate * workload.scale


def fmt(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def md(text: str) -> str:
    """Text for a markdown table cell: ``__getitem__`` must not turn bold."""
    return text.replace("_", "\\_").replace("|", "\\|")


def markdown_table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| workload | contender | median | (min..max) | ratio |",
        "|---|---|---:|---:|---:|",
    ]
    for result in results:
        first = True
        for name, entry in result["contenders"].items():
            ratio = entry["ratio"]
            shown = "—" if ratio is None else f"{ratio:.2f}×"
            if name == result["baseline"]:
                shown = "1 (baseline)"
            unit = result["unit"] + (" (lower is better)" if result["lower_is_better"] else "")
            workload = md(result["name"]) if first else ""
            lines.append(
                f"| {workload} | {md(name)} | {fmt(entry['median'])} {unit} | "
                f"{fmt(entry['min'])}..{fmt(entry['max'])} | {shown} |"
            )
            first = False
        for name, why in result["missing"].items():
            lines.append(f"| | {md(name)} | not available ({md(why)}) | | |")
    return "\n".join(lines)


def summary_table(results: list[dict[str, Any]]) -> str:
    """One row per workload: aioload's contenders, torch's, the ceiling's (or reference's), and
    each aioload contender's ratio to the baseline (the README's table)."""
    lines = [
        "| workload | unit | aioload | torch | ceiling / reference | aioload ÷ baseline |",
        "|---|---|---|---:|---:|---|",
    ]
    for result in results:
        contenders = result["contenders"]
        mine = {
            md(n.removeprefix("aioload").lstrip(", ") or "aioload"): e
            for n, e in contenders.items()
            if n.startswith("aioload")
        }
        torch = [e for n, e in contenders.items() if n.startswith("torch")]
        other = [e for n, e in contenders.items() if not n.startswith(("aioload", "torch"))]
        baseline = result["baseline"] or ""
        against = next(
            (w for w in ("torch", "ceiling", "reference") if w in baseline),
            md(baseline.removeprefix("aioload").lstrip(", ")),
        )
        ratios = " · ".join(f"{e['ratio']:.2f}×" for e in mine.values() if e["ratio"] is not None)
        unit = result["unit"] + (" (lower is better)" if result["lower_is_better"] else "")
        lines.append(
            f"| {md(result['name'])} | {unit} | "
            + " · ".join(f"{n} {fmt(e['median'])}" for n, e in mine.items())
            + f" | {fmt(torch[0]['median']) if torch else '—'} | "
            + (" · ".join(fmt(e["median"]) for e in other) or "—")
            + f" | {ratios + f' ({against})' if ratios else '—'} |"
        )
    return "\n".join(lines)


# -- plots ---------------------------------------------------------------------------


def colour(name: str) -> str:
    if name.startswith("aioload"):
        return "#1f77b4"
    if name.startswith("torch"):
        return "#ee6c2b"
    return "#7f7f7f"


def plot(results: list[dict[str, Any]], folder: Path, title: str) -> list[Path]:
    """Draws the two plots; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    paths = []

    shown = [r for r in results if r["sweep"] is None and r["contenders"]]
    columns = 2
    rows = math.ceil(len(shown) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(13, 2.1 * rows + 0.8), squeeze=False)
    for ax, result in zip(axes.flat, shown, strict=False):
        names = list(result["contenders"])
        medians = [result["contenders"][n]["median"] for n in names]
        lows = [result["contenders"][n]["median"] - result["contenders"][n]["min"] for n in names]
        highs = [result["contenders"][n]["max"] - result["contenders"][n]["median"] for n in names]
        y = np.arange(len(names))
        ax.barh(y, medians, xerr=[lows, highs], color=[colour(n) for n in names], capsize=2)
        ax.set_yticks(y, names, fontsize=7)
        ax.invert_yaxis()
        unit = result["unit"] + (", lower is better" if result["lower_is_better"] else "")
        ax.set_title(f"{result['name']} ({unit})", fontsize=8)
        ax.tick_params(axis="x", labelsize=7)
        tops = [result["contenders"][n]["max"] for n in names]
        for position, value, top in zip(y, medians, tops, strict=True):
            ax.text(top, position, f"  {fmt(value)}", va="center", fontsize=7)
        ax.set_xlim(0, max(tops) * 1.3)
    for ax in list(axes.flat)[len(shown) :]:
        ax.axis("off")
    fig.suptitle(f"aioload benchmark report: medians, bars from fastest to slowest run\n{title}")
    fig.tight_layout()
    path = folder / "throughput.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    paths.append(path)

    sweep = [r for r in results if r["sweep"] and r["sweep"][0] == "concurrency"]
    if sweep:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        xs = [r["sweep"][1] for r in sweep]
        ax.plot(xs, [r["ideal"] for r in sweep], "k--", label="ideal: concurrency / 20 ms")
        for name in sweep[0]["contenders"]:
            ys = [r["contenders"][name]["median"] for r in sweep if name in r["contenders"]]
            style = "o-" if name.startswith("aioload") else "s:"
            ax.plot(xs[: len(ys)], ys, style, label=name)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_xlabel("concurrency (item fetches in flight)")
        ax.set_ylabel("items/s")
        ax.set_title(f"Latency-bound items (each awaits 20 ms), batch 64\n{title}", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = folder / "concurrency.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


# -- main ------------------------------------------------------------------------------


def version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def machine() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "load_average_at_start": [round(v, 2) for v in os.getloadavg()],
        "packages": {p: version(p) for p in ("numpy", "uvloop", "torch", "aiohttp")},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small workloads: a smoke run")
    parser.add_argument("--repeat", type=int, default=None, help="repetitions (default 5; 2)")
    parser.add_argument("--only", choices=list(SUITES), action="append", help="these suites")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the JSON report")
    parser.add_argument("--plots", type=Path, default=DEFAULT_PLOTS, help="folder of the PNGs")
    parser.add_argument("--no-plots", action="store_true", help="skip drawing")
    args = parser.parse_args()
    repeat = args.repeat or (2 if args.quick else 5)
    suites = args.only or list(SUITES)
    # torch finds 16 workers too many for a small machine; the HTTP workload wants them anyway.
    import warnings

    warnings.filterwarnings("ignore", message="This DataLoader will create")

    info = machine()
    started = datetime.datetime.now(datetime.UTC)
    print(
        f"Python {info['python']}, {info['cpus']} CPUs, load average "
        f"{', '.join(map(str, info['load_average_at_start']))}; "
        + ", ".join(f"{p} {v}" for p, v in info["packages"].items())
    )
    print(f"medians of {repeat} repetitions{' (--quick: a smoke run, not figures)' * args.quick}")
    results = []
    failed: list[dict[str, str]] = []
    for suite in suites:
        try:
            workloads = SUITES[suite](args.quick)
        except ImportError as error:  # a suite's optional dependency is missing
            print(f"  {suite}: skipped ({error})", flush=True)
            failed.append({"suite": suite, "workload": "", "error": repr(error)})
            continue
        with ExitStack() as suite_scope:
            # The suite's shared servers and clusters stop after its last workload (or on an
            # error, or Ctrl-C), each once.
            for shared in dict.fromkeys(s for w in workloads for s in w.shared):
                suite_scope.callback(shared.close)
            for workload in workloads:
                began = time.perf_counter()
                try:
                    result = measure(workload, repeat)
                except Exception as error:
                    # One broken workload must not cost the figures of all the others.
                    print(f"  {suite}: {workload.name}  FAILED: {error!r}", flush=True)
                    failed.append({"suite": suite, "workload": workload.name, "error": repr(error)})
                    continue
                result["suite"] = suite
                results.append(result)
                print(
                    f"  {suite}: {workload.name}  ({time.perf_counter() - began:.1f} s)",
                    flush=True,
                )
    elapsed = (datetime.datetime.now(datetime.UTC) - started).total_seconds()

    table = markdown_table(results)
    summary = summary_table(results)
    print()
    print(table)
    print()
    print(summary)
    print(
        "\nratio: the median against the workload's baseline, above 1 meaning better "
        "(for latencies: baseline / median)"
    )
    report = {
        "date": started.isoformat(timespec="seconds"),
        "seconds": round(elapsed, 1),
        "quick": args.quick,
        "repeat": repeat,
        "machine": info,
        "workloads": results,
        "failed": failed,
        "table": table,
        "summary": summary,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"\nwrote {args.out}")
    if failed:
        print(f"{len(failed)} workloads or suites did not run (see 'failed' in the JSON)")
    if not args.no_plots:
        title = (
            f"{started:%Y-%m-%d}, Python {info['python']}, {info['cpus']} CPUs, "
            f"medians of {repeat}" + (" (quick run)" if args.quick else "")
        )
        for path in plot(results, args.plots, title):
            print(f"wrote {path}")
    sys.stdout.flush()
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
