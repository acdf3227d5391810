"""Helpers shared by the benchmark scripts: optional imports, per-case rates, workloads."""

from __future__ import annotations

import importlib
import statistics
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")


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


def replay(recorded: Callable[[], list[tuple[float, float]]], what: str) -> Run:
    """A run that returns the ``(units, seconds)`` pairs another workload's runs recorded, one
    per call, in order: a second figure of the same runs (CPU seconds per item beside the
    items/s) without running them again. ``recorded`` is read at every call, so the
    workload that records must be measured first, and both alike (the same ``warm_up``), so
    that the calls line up with the records.
    """
    position = 0

    def run() -> tuple[float, float]:
        nonlocal position
        records = recorded()
        if position >= len(records):
            raise RuntimeError(f"{what}: {len(records)} runs recorded, call {position + 1} asked")
        position += 1
        return records[position - 1]

    return run


class Shared(Generic[T]):
    """A server or cluster that several workloads of a suite use: started by the first
    workload that asks for it (:meth:`get`), stopped by :meth:`close`, which ``run.py`` calls
    once the suite's last workload has run (list it in each :class:`Workload`'s ``shared``).

    Example::

        server = Shared(lambda: ObjectServer(folder, latency=0.02))
        def contenders(stack: ExitStack) -> dict[str, Run]:
            url = server.get().url  # started once, whichever workload comes first
            ...
    """

    def __init__(self, start: Callable[[], AbstractContextManager[T]]) -> None:
        self._start = start
        self._stack: ExitStack | None = None
        self._value: T | None = None

    def get(self) -> T:
        """The running resource, started at the first call."""
        if self._stack is None:
            stack = ExitStack()
            self._value = stack.enter_context(self._start())
            self._stack = stack
        return self._value  # type: ignore[return-value]

    def close(self) -> None:
        """Stops the resource if it was started; it starts again at the next :meth:`get`."""
        stack, self._stack, self._value = self._stack, None, None
        if stack is not None:
            stack.close()


@dataclass
class Workload:
    """One workload of the benchmark report (``benchmarks/run.py``): the same work done by
    several contenders, timed in turn.

    ``contenders`` builds the contenders' runs when the workload is measured (not when the
    report is assembled), inside an ``ExitStack`` that closes after the workload: a server the
    runs need is entered into it. Name the contenders ``aioload...``, ``torch...`` and
    ``ceiling: ...`` (the same work without a loader), which is how the plots colour them;
    leave torch's out when torch is missing. A server that several workloads of the suite
    use goes in ``shared`` instead (see :class:`Shared`): it is started once and stopped
    after the suite.
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
    shared: tuple[Shared[Any], ...] = ()  # started on demand, closed after the suite's last
    warm_up: bool = True  # False: every run starts cold anyway, the untimed first one counts
