"""What the commands measure and how they show it: a live meter and a result table."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

__all__ = ["Meter", "Result", "format_table"]

_REFRESH = 0.25  # seconds between two redraws of the live line


@dataclass
class Result:
    """What one reader achieved on one run."""

    name: str
    samples: int
    nbytes: int
    seconds: float
    waited: float  # seconds the consumer spent waiting for data
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def samples_per_second(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    @property
    def megabytes_per_second(self) -> float:
        return self.nbytes / self.seconds / 1e6 if self.seconds > 0 else 0.0

    @property
    def waited_share(self) -> float:
        return self.waited / self.seconds if self.seconds > 0 else 0.0


class Meter:
    """Counts samples, bytes and waiting time, and redraws a progress line while it runs.

    The line shows samples/s (or another ``unit``: shards), MB/s and (with ``waits``)
    the share of time the consumer waited for data. It uses tqdm when it is installed,
    a plain ``\\r`` line otherwise, and nothing when ``show`` is false. Call
    :meth:`waiting` around the wait for the next batch and :meth:`add` once the batch is in.
    """

    def __init__(
        self,
        name: str,
        total: int | None,
        *,
        show: bool = True,
        stream: TextIO | None = None,
        unit: str = "samples",
        waits: bool = True,
    ) -> None:
        self.name = name
        self.unit = unit
        self._waits = waits  # whether the line shows the share of time waited for data
        self.total = total
        self.samples = 0
        self.nbytes = 0
        self.waited = 0.0
        self._show = show
        self._stream = stream or sys.stderr
        self._start = time.perf_counter()
        self._drawn = 0.0
        self._wait_start: float | None = None
        self._bar: Any = None
        if show:
            try:
                from tqdm import tqdm
            except ImportError:
                self._bar = None
            else:
                self._bar = tqdm(
                    total=total,
                    desc=f"{name:>12}",
                    unit=f" {unit}",
                    file=self._stream,
                    leave=True,
                    dynamic_ncols=True,
                    mininterval=_REFRESH,
                )

    def begin_wait(self) -> None:
        self._wait_start = time.perf_counter()

    def end_wait(self) -> None:
        if self._wait_start is not None:
            self.waited += time.perf_counter() - self._wait_start
            self._wait_start = None

    def add(self, samples: int, nbytes: int) -> None:
        self.samples += samples
        self.nbytes += nbytes
        if not self._show:
            return
        now = time.perf_counter()
        if self._bar is not None:
            self._bar.update(samples)
        if now - self._drawn >= _REFRESH:
            self._drawn = now
            self._draw(now)

    def _describe(self, now: float) -> str:
        elapsed = max(now - self._start, 1e-9)
        rate = f"{self.nbytes / elapsed / 1e6:6.1f} MB/s"
        if not self._waits:
            return rate
        return f"{rate}, waited on data {100 * self.waited / elapsed:3.0f}%"

    def _draw(self, now: float) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(self._describe(now), refresh=False)
            return
        elapsed = max(now - self._start, 1e-9)
        line = (
            f"\r{self.name:>12}: {self.samples} {self.unit}"
            + (f" of {self.total}" if self.total is not None else "")
            + f", {self.samples / elapsed:7.0f} {self.unit}/s, {self._describe(now)}"
        )
        self._stream.write(line)
        self._stream.flush()

    def finish(self, **extra: Any) -> Result:
        """Closes the progress line and returns what was measured."""
        now = time.perf_counter()
        if self._show:
            self._draw(now)
            if self._bar is not None:
                self._bar.refresh()
                self._bar.close()
            else:
                self._stream.write("\n")
                self._stream.flush()
        return Result(self.name, self.samples, self.nbytes, now - self._start, self.waited, extra)

    def close(self) -> None:
        """Closes the progress line without a result (after a failure)."""
        if self._bar is not None:
            self._bar.close()


def format_table(results: list[Result], baseline: str | None = None) -> str:
    """A text table of results; with ``baseline``, each row's speed-up over that row."""
    base = next((r for r in results if r.name == baseline), None)
    header = ["reader", "samples", "seconds", "samples/s", "MB/s", "waited on data"]
    if base is not None:
        header.append(f"vs {base.name}")
    rows = [header]
    for result in results:
        row = [
            result.name,
            f"{result.samples}",
            f"{result.seconds:.2f}",
            f"{result.samples_per_second:,.0f}",
            f"{result.megabytes_per_second:,.1f}",
            f"{100 * result.waited_share:.0f}%",
        ]
        if base is not None:
            ratio = result.samples_per_second / max(base.samples_per_second, 1e-9)
            row.append(f"{ratio:.1f}x")
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = []
    for number, row in enumerate(rows):
        cells = [row[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)
        ]
        lines.append("  ".join(cells))
        if number == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)
