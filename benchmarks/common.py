"""Helpers shared by the benchmark scripts: optional imports and per-case rates."""

from __future__ import annotations

import importlib
import statistics
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
