"""The interface between the scheduler and the places where fetches run.

The scheduler numbers batches and hands each one to a backend with
:meth:`Backend.submit`; the backend reports back through the
:class:`Completion` callback it was opened with, exactly once per submitted
batch, from the loop thread — at once (a fetch that finished inside
``submit``) or later (a task, a thread, a worker process).

For a map-style dataset ``keys`` is the batch's list of keys (one key when
automatic batching is off). For an iterable dataset ``keys`` is None and means
"the next batch of your stream"; a backend whose stream has run dry answers
``exhausted=True`` and the scheduler stops asking once :attr:`Backend.exhausted`
is set.

Under a fault policy with ``on_error='skip'`` a completion also carries the
items its batch dropped (``skipped``, :class:`~aioload.policy.SkippedItem`
records); the batch holds the items that were read, and a batch whose every
item was dropped completes with ``exhausted=True``: there is nothing to
deliver for its sequence number (a map-style backend is never exhausted
otherwise). The scheduler records the skips, whatever the batch's outcome.

A backend that cannot go on at all (its worker processes cannot start, a
worker died past its restart limit) reports ``seq=-1`` with the error: the
scheduler delivers it to the consumer and ends the epoch.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from aioload.policy import SkippedItem

__all__ = ["Backend", "Completion", "when_done_on_loop"]


class Completion(Protocol):
    """Called once per submitted batch with its result, its error, or exhaustion.

    ``skipped``: the items the fault policy dropped from the batch (see the
    module docstring).
    """

    def __call__(
        self,
        seq: int,
        batch: Any = None,
        error: BaseException | None = None,
        exhausted: bool = False,
        skipped: Sequence[SkippedItem] = (),
    ) -> None: ...


class Backend(Protocol):
    """Where the fetches of one epoch run (see the module docstring)."""

    @property
    def exhausted(self) -> bool:
        """True once an iterable source will produce no more batches."""
        ...

    def submit(self, seq: int, keys: Any) -> None:
        """Starts fetching batch ``seq``; the result goes to the completion callback."""
        ...

    async def aclose(self) -> None:
        """Releases what the backend holds for this epoch (tasks end with the scope)."""
        ...


def when_done_on_loop(
    future: concurrent.futures.Future[Any],
    loop: asyncio.AbstractEventLoop,
    callback: Callable[[int, concurrent.futures.Future[Any]], None],
    seq: int,
) -> None:
    """Calls ``callback(seq, future)`` on ``loop`` once ``future`` (run in a thread or an
    executor) is done; nothing when the loop has closed since (its epoch is gone)."""

    def finished(future: concurrent.futures.Future[Any]) -> None:
        try:
            loop.call_soon_threadsafe(callback, seq, future)
        except RuntimeError:  # the loop is closed: the epoch is gone
            pass

    future.add_done_callback(finished)
