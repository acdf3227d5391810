"""How much default_collate costs over the bare numpy call that builds the same batch.

Run by hand: ``python benchmarks/bench_collate.py [--batch-size 64] [--repeat 31]``.

Each case times ``default_collate(batch)`` and a baseline that does only the numpy work
(``np.stack`` of the arrays, plus ``np.array`` of the labels for tuple samples). The two are
timed alternately, repetition by repetition, so drift on a busy machine hits both alike; the
table shows the median time per call and the ratio (below 1.0 means faster than the baseline).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from aioload.collate.core import default_collate


def _per_call_seconds(fn: Callable[[], Any], number: int) -> float:
    start = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - start) / number


def _calls_per_repetition(fn: Callable[[], Any], target_s: float = 0.005) -> int:
    # Enough calls that one repetition lasts a few milliseconds, well above timer resolution.
    return max(1, int(target_s / max(_per_call_seconds(fn, 3), 1e-9)))


def compare(
    collate: Callable[[], Any], baseline: Callable[[], Any], repeat: int
) -> tuple[float, float]:
    """Median seconds per call of ``collate`` and ``baseline``, timed alternately."""
    number = _calls_per_repetition(baseline)
    collate_times, baseline_times = [], []
    for _ in range(repeat):
        collate_times.append(_per_call_seconds(collate, number))
        baseline_times.append(_per_call_seconds(baseline, number))
    return statistics.median(collate_times), statistics.median(baseline_times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=31)
    args = parser.parse_args()
    n = args.batch_size
    rng = np.random.default_rng(0)

    small = [rng.random(16, dtype=np.float32) for _ in range(n)]
    images = [rng.random((3, 64, 64), dtype=np.float32) for _ in range(n)]
    labels = [int(x) for x in rng.integers(0, 10, n)]
    pairs = list(zip(small, labels, strict=True))

    cases: list[tuple[str, Callable[[], Any], Callable[[], Any], str]] = [
        (
            f"{n} x float32[16]",
            lambda: default_collate(small),
            lambda: np.stack(small),
            "np.stack",
        ),
        (
            f"{n} x float32[3,64,64]",
            lambda: default_collate(images),
            lambda: np.stack(images),
            "np.stack",
        ),
        (
            f"{n} x (float32[16], int)",
            lambda: default_collate(pairs),
            lambda: (np.stack(small), np.array(labels)),
            "np.stack + np.array",
        ),
    ]

    print(f"numpy {np.__version__}, median of {args.repeat} repetitions")
    header = f"{'batch':<26} {'default_collate':>16} {'baseline':>12}  {'ratio':>6}  baseline is"
    print(header)
    print("-" * len(header))
    for name, collate, baseline, baseline_name in cases:
        collate_s, baseline_s = compare(collate, baseline, args.repeat)
        print(
            f"{name:<26} {collate_s * 1e6:>13.1f} us {baseline_s * 1e6:>9.1f} us"
            f"  {collate_s / baseline_s:>6.2f}  {baseline_name}"
        )


if __name__ == "__main__":
    main()
