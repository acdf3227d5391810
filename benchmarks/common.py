"""Helpers shared by the benchmark scripts: optional imports, per-case rates, workloads."""

from __future__ import annotations

import importlib
import statistics
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any


def optional(module: str) -> Any:
    """The module, or None where it is not installed."""
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


@dataclass
class Rates:
    """Units per second of one case, one value per repetition."""

    values: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    def spread(self, scale: float = 1.0, fmt: str = ".0f") -> str:
        low, high = min(self.values) * scale, max(self.values) * scale
        return f"{low:{fmt}}..{high:{fmt}}"


# One run of a contender: (units done, seconds taken).
Run = Callable[[], tuple[float, float]]


@dataclass
class Workload:
    """One workload of the benchmark report (``benchmarks/run.py``): the same work done by
    several contenders, timed in turn.

    ``contenders`` builds the contenders' runs when the workload is measured (not when the
    report is assembled), inside an ``ExitStack`` that closes after the workload: a server the
    runs need is entered into it. Name the contenders ``aioload...``, ``torch...`` and
    ``ceiling: ...`` (the same work without a loader), which is how the plots colour them;
    leave torch's out when torch is missing.
    """

    name: str
    unit: str  # of the figures: "items/s", "GB/s", "ms", ...
    contenders: Callable[[ExitStack], dict[str, Run]]
    baseline: str | None = None  # the contender ratios are taken against
    scale: float = 1.0  # figure = units per second x scale (or seconds per unit x scale)
    lower_is_better: bool = False  # the figure is seconds per unit (a latency), not a rate
    sweep: tuple[str, float] | None = None  # ("concurrency", 64): a point of a parameter sweep
    ideal: float | None = None  # the best rate the workload allows, in units per second
    note: str = ""
