"""The contract between the scheduler and the places where fetches run.

The scheduler numbers batches and hands each one to a backend with
:meth:`Backend.submit`; the backend reports back to the :class:`OutcomeSink`
it was opened with, from the loop thread — at once (a read that finished
inside ``submit``) or later (a task, a thread, a worker process):

- :meth:`OutcomeSink.deliver` exactly once per submitted batch, with its
  :class:`Outcome`, whose fields say everything about it: the batch or the
  error, the items the fault policy skipped, its retries, the stream's state
  after it, and whether there is nothing to deliver (every item skipped) or
  the stream has ended;
- :meth:`OutcomeSink.fail` when the backend cannot go on at all (its worker
  processes cannot start, a worker died past its restart limit): the epoch
  delivers the error to the consumer and ends.

For a map-style dataset ``keys`` is the batch's sequence of keys, or one key
when automatic batching is off. For an iterable dataset ``keys`` is None and
means "the next batch of your stream"; the scheduler stops asking once
:attr:`Backend.exhausted` is set.

:class:`Outcome` itself lives in :mod:`aioload.read.outcome` (the wire, below the
backends, needs it too) and is re-exported here. Every backend builds its
outcomes with one reader
(:class:`~aioload.read.reader.BatchReader`); what crosses a process or
pickle boundary is the outcome's wire form (:mod:`aioload.backends.processes.wire`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import anyio.abc

from aioload.read.outcome import Outcome

__all__ = ["Backend", "BackendFactory", "Outcome", "OutcomeSink", "StartPlan"]


class OutcomeSink(Protocol):
    """Where a backend reports: one outcome per batch, or the end of everything."""

    def deliver(self, outcome: Outcome) -> None:
        """Batch ``outcome.seq`` is done (call on the loop)."""
        ...

    def fail(self, error: BaseException) -> None:
        """The backend cannot go on: end the epoch with ``error`` (call on the loop)."""
        ...


class Backend(Protocol):
    """Where the fetches of one epoch run (see the module docstring)."""

    @property
    def exhausted(self) -> bool:
        """True once the backend will produce no more batches (a stream ran dry)."""
        ...

    def submit(self, seq: int, keys: Any) -> None:
        """Starts fetching batch ``seq``; its outcome goes to the sink."""
        ...

    async def aclose(self) -> None:
        """Releases what the backend holds for this epoch (tasks end with the scope)."""
        ...


BackendFactory = Callable[[anyio.abc.TaskGroup, OutcomeSink], Backend]
"""Builds an epoch's backend inside the epoch's scope (its task group), reporting to the sink."""


class StartPlan(Protocol):
    """What the backends read of how an epoch starts (the pipeline's ``EpochPlan`` is one).

    Attributes:
        base_seed: the seed of the epoch's workers (``base_seed + id``).
    """

    @property
    def base_seed(self) -> int: ...

    def worker_streams(self) -> tuple[list[Any] | None, int]:
        """A resumed stream's state per worker (None: start afresh) and whose turn is first."""
        ...
