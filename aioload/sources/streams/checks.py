"""What a stream state must hold true as a whole before a stream resumes from it.

A checkpoint is outside data, and a few KB of it can ask for much: the same samples many
times over, or more rows re-read at once than a stream ever holds. The format checks
(:func:`~aioload.sources.streams.state.check_state`,
:func:`~aioload.sources.parquet.state.check_rows_state`) see that every field has its type
and names units that exist; these see that what the state names could be true:

- **Each sample once.** The spans a state names — runs still to read, the samples its
  buffers hold — never overlap or repeat within a unit (a shard, a file, a row group); a
  run to the unit's end (``stop == -1``) is the last span of its unit. The states of one
  rank's workers are checked together, the same way.
- **Positions and bytes agree** (where a format records bytes): a unit's first sample
  starts at byte 0 and no other does, and of two spans of a unit the later one starts at
  a later byte — past the bytes the earlier one occupies where they are known (a buffered
  sample's end), with at least one byte for every sample between them.
- **No more than a stream holds.** A buffer holds no more samples than the layout's shuffle
  buffer (:func:`shuffle_bound`): an exact resume reads the buffered samples again at once.

Each check takes the format's ``fail`` (it raises the format's own error and prefix).

Example::

    >>> def fail(message): raise ValueError(message)
    >>> check_spans([Span(0, 0, 4, 0), Span(0, 3, 5, 1024)], "shard", fail)
    Traceback (most recent call last):
    ValueError: shard 0: samples 0 to 3 and 3 to 4 overlap: a sample named twice would come twice
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, NoReturn

from aioload.checks import is_int

__all__ = ["Span", "check_spans", "shuffle_bound"]

Fail = Callable[[str], NoReturn]


@dataclass(frozen=True, slots=True)
class Span:
    """Samples ``start`` to ``stop - 1`` of unit ``unit`` that a state names.

    ``stop == -1``: to the unit's end. ``first``: the byte its first sample starts at
    (None: the format records positions only); ``end``: the byte past its last sample,
    where the state knows it (a buffered sample).

    Example::

        >>> Span(2, 10, 11, 5120, 6144).empty
        False
    """

    unit: int
    start: int
    stop: int
    first: int | None = None
    end: int | None = None

    @property
    def empty(self) -> bool:
        """It names no sample."""
        return 0 <= self.stop <= self.start

    def __str__(self) -> str:
        if self.stop == self.start + 1:
            return str(self.start)
        last = "its end" if self.stop == -1 else str(self.stop - 1)
        return f"{self.start} to {last}"


def check_spans(spans: Iterable[Span], unit_name: str, fail: Fail) -> None:
    """Refuses spans that name a sample twice, or whose bytes run against their positions.

    Args:
        spans: every span of one state, or of the states of one rank's workers.
        unit_name: what a unit is called in messages (``"shard"``, ``"row group"``).
        fail: raises the format's error with the message.
    """
    by_unit: dict[int, list[Span]] = {}
    for span in spans:
        if not span.empty:
            by_unit.setdefault(span.unit, []).append(span)
    for unit, group in by_unit.items():
        group.sort(key=lambda span: span.start)
        for span in group:
            if span.first is not None and (
                (span.first == 0) != (span.start == 0) or span.first < span.start
            ):
                fail(
                    f"{unit_name} {unit}: sample {span.start} cannot start at byte {span.first} "
                    "(the first starts at byte 0, every one takes a byte at least)"
                )
        for before, after in pairwise(group):
            if before.stop == -1 or before.stop > after.start:
                fail(
                    f"{unit_name} {unit}: samples {before} and {after} overlap: a sample named "
                    "twice would come twice"
                )
            if before.first is None or after.first is None:
                continue
            if before.end is None:
                least = before.first + after.start - before.start
            else:
                least = before.end + after.start - before.stop
            if after.first < least:
                fail(
                    f"{unit_name} {unit}: sample {after.start} at byte {after.first} cannot "
                    f"come after sample {before.start} at byte {before.first}"
                    + ("" if before.end is None else f" (its bytes end at {before.end})")
                )


def shuffle_bound(layout: Mapping[str, Any], fail: Fail) -> int | None:
    """The most samples the shuffle buffer of a stream of ``layout`` holds (0: none, for a
    ``shuffle_buffer`` of 0 or 1); None: the layout does not say (a stream of another
    layout re-splits what is left, and reads no buffer again at once)."""
    if "shuffle_buffer" not in layout:
        return None
    size = layout["shuffle_buffer"]
    if not is_int(size) or not 0 <= size < 2**62:
        fail(f"the layout's 'shuffle_buffer' should be an int >= 0; got {size!r:.40}")
    return size if size > 1 else 0
