"""Hand-off: how finished batches reach the consumer, on the loop or in another thread.

The scheduler (and the pin thread, when pinning) put :class:`Delivery` items
into an output; the consumer takes them. Two outputs, one per iteration style:

- :class:`LoopOutput` for ``async for``: a deque on the consumer's loop and one
  future to wake a waiting consumer — no thread crossing when nothing pins.
- :class:`ThreadOutput` for the sync facade: a ``queue.SimpleQueue`` between
  aioload's loop thread and the caller's thread (about a microsecond a put,
  against ~250 µs for ``run_coroutine_threadsafe``).

Neither is bounded by itself: the scheduler's window is their bound, because a
window slot is only freed when the consumer takes a batch out.
"""

from __future__ import annotations

import asyncio
import queue
from collections import deque
from typing import Any

__all__ = ["Delivery", "LoopOutput", "ThreadOutput"]


class Delivery:
    """One thing for the consumer: a batch, an error, or the end of the epoch.

    ``seq`` is -1 for the end and for errors that belong to no batch.
    ``items``: the samples the batch holds, for the loader's stats.
    """

    __slots__ = ("batch", "error", "items", "seq")

    def __init__(
        self, seq: int, batch: Any = None, error: BaseException | None = None, items: int = 0
    ) -> None:
        self.seq = seq
        self.batch = batch
        self.error = error
        self.items = items


END = Delivery(-1)


class LoopOutput:
    """Deliveries for a consumer on the event loop ``loop``."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._items: deque[Delivery] = deque()
        self._waiter: asyncio.Future[None] | None = None

    def put(self, item: Delivery) -> None:
        """Adds a delivery; call from the loop thread."""
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def put_threadsafe(self, item: Delivery) -> None:
        """Adds a delivery from any thread."""
        self._loop.call_soon_threadsafe(self.put, item)

    def get_nowait(self) -> Delivery | None:
        """The next delivery, or None when there is none yet."""
        return self._items.popleft() if self._items else None

    async def wait(self) -> None:
        """Returns once a delivery is available."""
        if self._items:
            return
        waiter = self._waiter = self._loop.create_future()
        try:
            await waiter
        finally:
            self._waiter = None


class ThreadOutput:
    """Deliveries for a consumer in another thread than the loop's."""

    def __init__(self) -> None:
        self._items: queue.SimpleQueue[Delivery] = queue.SimpleQueue()

    def put(self, item: Delivery) -> None:
        """Adds a delivery; call from any thread."""
        self._items.put(item)

    put_threadsafe = put

    def get_nowait(self) -> Delivery | None:
        """The next delivery, or None when there is none yet (one consumer only)."""
        items = self._items
        # No exception when empty: the consumer asks this before every wait.
        return None if items.empty() else items.get_nowait()

    def get(self, timeout: float | None) -> Delivery:
        """The next delivery; ``queue.Empty`` after ``timeout`` seconds without one."""
        return self._items.get(timeout=timeout)
