"""Worker start-up as users meet it: every case in a fresh interpreter, aioload next to torch.

Run by hand: ``python benchmarks/bench_startup.py [--quick] [--repeat 5] [--only CASE]``.

Each case is a short training-script loop run in a new Python process (``python -c``), so
nothing is warm: the first loader of the process, its workers started from nothing, the
dataset made in the script. The same process code runs for both libraries, with
``from torch.utils.data import DataLoader`` or ``from aioload import DataLoader``; the
process reports its times, and this script samples the proportional set size (PSS, from
``/proc/PID/smaps_rollup``) of the child's whole process tree every 10 ms while it runs, to
get the memory the iteration adds (peak minus the tree's PSS just before the loader is made;
Linux only). Batch 64 everywhere, each library's default collate.

Cases (targets from the worker start-up issue; ratios are aioload ÷ torch, lower is better
for times and memory):

1. ``small``: 2 workers, 20,000 x float32[16] rows. The first batch of the first loader, of a
   later epoch (no persistent workers) and of a second loader; items/s over the whole first
   epoch with start-up included (from ``DataLoader(...)`` to its last batch). Targets: first
   batch <= 1.0x, later epochs <= 1.5x, items/s >= 1.0x. ``small-tqdm``: the same, each epoch
   iterated as ``for batch in tqdm(loader)`` (tqdm's monitor thread runs when the workers
   start, as in most torch scripts; the bar writes to ``os.devnull``). Target: first batch
   <= 1.0x.
2. ``array``: 4 workers, a 1 GiB float32 array (8,192 rows of 128 KiB). First batch <= 1.5x,
   epoch <= 1.2x, memory added <= 1.3x. ``array-busy``: the same with 5 ms of "training" per
   batch, so that the consumer, not the workers, sets the pace (the memory a loader holds is
   the batches it has ready: with a consumer that takes no time, a slower loader holds fewer).
3. ``objects``: 4 workers, 800,000 small dicts, ``shuffle=True``; torch over a plain list,
   aioload over :class:`aioload.SharedList`. First batch <= 1.5x, epoch <= 1.2x, memory added
   <= 1.0x (torch's grows through the epoch, as reference counts touch the list's pages).
4. ``torch-imported``: 2 workers, a tiny dataset, in a script that imports torch (aioload's
   used to wait seconds for a fork server that preloaded torch). First batch <= 1.0x.

torch is optional (the CPU build: ``pip install torch==2.13.0 --index-url
https://download.pytorch.org/whl/cpu``); without it only aioload's figures are printed. So is
tqdm (``pip install 'aioload-data[progress]'``); without it ``small-tqdm`` is skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from common import Run, Workload, optional

BATCH = 64
_SAMPLE_EVERY = 0.01  # seconds between two PSS samples of the child's process tree
_CHILD_TIMEOUT = 600.0

# The script every case runs, once per library; {case} picks the dataset.
_SCRIPT = textwrap.dedent(
    """
    import json, os, sys, time
    import numpy as np
    LIBRARY, CASE, QUICK = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
    if LIBRARY == "torch" or CASE == "torch-imported":
        import torch
    if LIBRARY == "torch":
        from torch.utils.data import DataLoader, Dataset
    else:
        from aioload import DataLoader, Dataset

    class Rows(Dataset):
        def __init__(self, data):
            self.data = data

        def __len__(self):
            return len(self.data)

        def __getitem__(self, index):
            return self.data[index]

    def tree_pss():
        print("pss", flush=True)  # the parent answers with the tree's PSS
        return int(sys.stdin.readline())

    if CASE in ("small", "small-tqdm"):
        data, workers, shuffle = np.random.default_rng(0).random((20_000, 16), np.float32), 2, False
    elif CASE == "torch-imported":
        data, workers, shuffle = np.random.default_rng(0).random((512, 16), np.float32), 2, False
    elif CASE in ("array", "array-busy"):
        rows = 1024 if QUICK else 8192
        data, workers, shuffle = np.ones((rows, 32768), np.float32), 4, False
    elif CASE == "objects":
        count = 80_000 if QUICK else 800_000
        items = [{"id": i, "label": i % 10, "text": f"sample number {i}"} for i in range(count)]
        if LIBRARY != "torch":
            from aioload import SharedList

            items = SharedList(items)
        data = items
        del items
        workers, shuffle = 4, True
    dataset = Rows(data)
    result = {}
    before = tree_pss()
    made = time.perf_counter()
    loader = DataLoader(dataset, batch_size=BATCH, num_workers=workers, shuffle=shuffle)
    epochs = 1 if CASE in ("array", "array-busy", "objects") else 2
    busy = 0.005 if CASE == "array-busy" else 0.0  # seconds of "training" per batch
    bar = lambda loader: loader  # noqa: E731
    if CASE == "small-tqdm":
        from tqdm import tqdm

        bar = lambda loader: tqdm(loader, file=open(os.devnull, "w"))  # noqa: E731
    for epoch in range(epochs):
        start = time.perf_counter()
        items = 0
        for index, batch in enumerate(bar(loader)):
            if index == 0:
                result.setdefault("first", []).append(time.perf_counter() - start)
                if CASE == "small-tqdm":  # the bar's monitor thread runs
                    result.setdefault("monitor", []).append(tqdm.monitor.is_alive())
            items += len(batch["id"]) if isinstance(batch, dict) else len(batch)
            if busy:
                time.sleep(busy)
        result.setdefault("epoch", []).append(time.perf_counter() - start)
        if epoch == 0:
            result["items_per_s"] = items / (time.perf_counter() - made)
    if CASE in ("small", "small-tqdm"):
        start = time.perf_counter()
        for batch in bar(DataLoader(dataset, batch_size=BATCH, num_workers=workers)):
            result["second_loader_first"] = time.perf_counter() - start
            break
    result["added"] = tree_pss() - before  # replaced by the parent's peak
    print("result", json.dumps(result), flush=True)
    """
).replace("BATCH", str(BATCH))

CASES = ("small", "small-tqdm", "array", "array-busy", "objects", "torch-imported")


def _children(pid: int) -> list[int]:
    found = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as file:
                found += [int(child) for child in file.read().split()]
        except OSError:
            continue
    return found


def tree_pss(pid: int) -> int:
    """The PSS in bytes of process ``pid`` and all its descendants (0 for what has gone)."""
    total, pending = 0, [pid]
    while pending:
        current = pending.pop()
        try:
            with open(f"/proc/{current}/smaps_rollup") as file:
                for line in file:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
                        break
        except OSError:
            continue
        pending += _children(current)
    return total


@dataclass
class Sampler:
    """Samples the PSS of a process tree in a thread of this process until stopped."""

    pid: int
    peak: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self.peak = tree_pss(self.pid)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(_SAMPLE_EVERY):
            self.peak = max(self.peak, tree_pss(self.pid))

    def stop(self) -> int:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return self.peak


def run_case(library: str, case: str, quick: bool) -> dict[str, Any]:
    """One run of ``case`` with ``library`` in a fresh interpreter: its figures."""
    child = subprocess.Popen(
        [sys.executable, "-c", _SCRIPT, library, case, "1" if quick else "0"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdin is not None and child.stdout is not None
    sampler: Sampler | None = None
    before = 0
    result: dict[str, Any] = {}
    deadline = time.monotonic() + _CHILD_TIMEOUT
    try:
        for line in child.stdout:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{library} {case}: no result in {_CHILD_TIMEOUT} s")
            if line.startswith("pss"):
                pss = tree_pss(child.pid)
                if sampler is None:
                    before = pss
                    sampler = Sampler(child.pid)
                    sampler.start()
                child.stdin.write(f"{pss}\n")
                child.stdin.flush()
            elif line.startswith("result "):
                result = json.loads(line[len("result ") :])
        child.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        peak = sampler.stop() if sampler is not None else 0
    if child.returncode != 0 or not result:
        stderr = child.stderr.read() if child.stderr is not None else ""
        raise RuntimeError(f"{library} {case} failed ({child.returncode}):\n{stderr[-3000:]}")
    result["added"] = peak - before
    return result


def _figures(result: dict[str, Any], case: str) -> dict[str, float]:
    """The figures of one run of ``case``: first batch and epoch in ms, memory in MiB, items/s."""
    figures = {"first batch (ms)": result["first"][0] * 1e3, "epoch (ms)": result["epoch"][0] * 1e3}
    if case == "small-tqdm" and not all(result["monitor"]):
        raise RuntimeError("small-tqdm: tqdm's monitor thread did not run at the first batch")
    if case in ("small", "small-tqdm"):
        figures["later epoch's first batch (ms)"] = result["first"][1] * 1e3
        figures["second loader's first batch (ms)"] = result["second_loader_first"] * 1e3
        figures["items/s, start-up included"] = result["items_per_s"]
    if case in ("array", "array-busy", "objects"):
        figures["memory added (MiB)"] = result["added"] / 2**20
    return figures


TARGETS: dict[str, dict[str, tuple[str, float]]] = {
    # case -> figure -> ("<=" or ">=", the aioload ÷ torch ratio it must meet)
    "small": {
        "first batch (ms)": ("<=", 1.0),
        "later epoch's first batch (ms)": ("<=", 1.5),
        "second loader's first batch (ms)": ("<=", 1.0),
        "items/s, start-up included": (">=", 1.0),
    },
    "small-tqdm": {"first batch (ms)": ("<=", 1.0)},
    "array": {
        "first batch (ms)": ("<=", 1.5),
        "epoch (ms)": ("<=", 1.2),
        "memory added (MiB)": ("<=", 1.3),
    },
    "array-busy": {"memory added (MiB)": ("<=", 1.3)},
    "objects": {
        "first batch (ms)": ("<=", 1.5),
        "epoch (ms)": ("<=", 1.2),
        "memory added (MiB)": ("<=", 1.0),
    },
    "torch-imported": {"first batch (ms)": ("<=", 1.0)},
}


def measure(case: str, repeat: int, quick: bool, with_torch: bool) -> dict[str, dict[str, float]]:
    """Medians over ``repeat`` runs of each library, alternated: library -> figure -> median."""
    libraries = ["aioload", "torch"] if with_torch else ["aioload"]
    runs: dict[str, list[dict[str, float]]] = {library: [] for library in libraries}
    for round_ in range(repeat):
        for library in libraries if round_ % 2 == 0 else libraries[::-1]:
            runs[library].append(_figures(run_case(library, case, quick), case))
    return {
        library: {name: statistics.median(run[name] for run in figures) for name in figures[0]}
        for library, figures in runs.items()
    }


def report(case: str, medians: dict[str, dict[str, float]]) -> list[str]:
    """Markdown rows ``| case | figure | aioload | torch | ratio | target |`` for ``case``."""
    rows = []
    ours, theirs = medians["aioload"], medians.get("torch")
    for name, value in ours.items():
        ratio, target = "—", ""
        if theirs is not None and theirs.get(name):
            ratio_value = value / theirs[name]
            ratio = f"{ratio_value:.2f}×"
            wanted = TARGETS.get(case, {}).get(name)
            if wanted is not None:
                sense, bound = wanted
                met = ratio_value <= bound if sense == "<=" else ratio_value >= bound
                target = f"{sense} {bound}× {'met' if met else 'MISSED'}"
        torch_text = f"{theirs[name]:,.1f}" if theirs is not None else "—"
        rows.append(f"| {case} | {name} | {value:,.1f} | {torch_text} | {ratio} | {target} |")
    return rows


def workloads(quick: bool) -> list[Workload]:
    """The report's start-up workloads (``benchmarks/run.py``): first batches in fresh
    interpreters, aioload against torch (each run is one fresh process)."""
    with_torch = optional("torch") is not None
    libraries = ["aioload", "torch"] if with_torch else ["aioload"]

    def first_batch(case: str) -> Callable[[ExitStack], dict[str, Run]]:
        def contenders(_: ExitStack) -> dict[str, Run]:
            def run(library: str) -> tuple[float, float]:
                return 1, run_case(library, case, quick)["first"][0]

            return {
                f"{library} DataLoader" if library == "torch" else library: partial(run, library)
                for library in libraries
            }

        return contenders

    baseline = "torch DataLoader" if with_torch else None
    return [
        Workload(
            f"first batch of the first loader, fresh interpreter, {workers}",
            "ms",
            first_batch(case),
            baseline=baseline,
            scale=1e3,
            lower_is_better=True,
            warm_up=False,
        )
        for case, workers in (
            ("small", "2 workers, 20,000 rows"),
            ("small-tqdm", "2 workers, 20,000 rows, a tqdm bar open"),
            ("array", "4 workers, 1 GiB array"),
        )
        if case != "small-tqdm" or optional("tqdm") is not None
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller datasets, 1 repetition")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--only", choices=CASES, action="append", help="run only these cases")
    args = parser.parse_args()
    if not sys.platform.startswith("linux"):
        raise SystemExit("bench_startup.py reads /proc: Linux only")
    with_torch = optional("torch") is not None
    repeat = 1 if args.quick else args.repeat
    print(f"medians of {repeat} runs per library, each in a fresh interpreter; batch {BATCH}")
    rows = [
        "| case | figure | aioload | torch | aioload ÷ torch | target |",
        "|---|---|---:|---:|---:|---|",
    ]
    for case in args.only or CASES:
        if (case == "torch-imported" and not with_torch) or (
            case == "small-tqdm" and optional("tqdm") is None
        ):
            continue
        case_rows = report(case, measure(case, repeat, args.quick, with_torch))
        print("\n".join(case_rows), flush=True)
        rows += case_rows
    print("\n" + "\n".join(rows))


if __name__ == "__main__":
    main()
