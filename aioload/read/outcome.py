"""What reading one batch came to: the :class:`Outcome` every backend reports.

A leaf of its own so that both sides of the backend contract — the backends
and the scheduler above, the wire form (:mod:`aioload.backends.processes.wire`) below them —
share one type. See :mod:`aioload.backends.base` for the contract.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from aioload.faults.policy import SkippedItem
from aioload.stats.source_counts import SourceCounts

__all__ = ["Outcome"]


class Outcome(NamedTuple):
    """What reading one batch came to (immutable).

    A named tuple rather than a frozen dataclass: one is made for every batch, and
    a tuple is the cheapest immutable record Python builds.

    Attributes:
        seq: the batch's sequence number.
        batch: the collated batch (None when there is none: an error, nothing
            to deliver, the end of a stream).
        error: the exception that failed the batch, with its notes.
        skipped: the items the fault policy dropped from the batch
            (``on_error='skip'``); recorded whatever the batch's fate.
        retries: attempts the fault policy repeated for this batch (stats).
        stream_state: an iterable dataset's ``state_dict()`` right after this
            batch was read (None unless the loader tracks the stream).
        worker: the worker process that read it (None: the loader's loop, or
            an executor), which a tracked stream's state belongs to.
        empty: nothing to deliver: every item was skipped.
        end: the stream has no more batches (nothing to deliver either).
        counts: what the dataset's reads came to since the previous outcome
            (cache hits, bytes from the store: :mod:`aioload.stats.source_counts`);
            None when the dataset counts nothing or nothing changed.
        concurrency: ``concurrency="auto"``: the tuned limit of the loop that read it,
            when it changed since that loop's previous outcome (None: unchanged, or
            not tuned).
        throttles: reads the store throttled (503, 429) since that loop's previous
            outcome, as the tuner saw them.
    """

    seq: int
    batch: Any = None
    error: BaseException | None = None
    skipped: tuple[SkippedItem, ...] = ()
    retries: int = 0
    stream_state: Any = None
    worker: int | None = None
    empty: bool = False
    end: bool = False
    counts: SourceCounts | None = None
    concurrency: int | None = None
    throttles: int = 0
