"""Eager, bounded execution of many item coroutines on one event loop.

Why not one task per item: an ``async def __getitem__`` that returns without
waiting (an in-memory cache hit, a decoded sample) would pay for a task, a
loop iteration and a wake-up per item — about 5 µs under uvloop, more than the
item itself. So :class:`ItemPool` steps each item's coroutine directly inside
the task that asks for it and only pays for concurrency when an item really
suspends.

Why the item then stays in that task: ``asyncio.timeout``, anyio cancel scopes
and task groups remember the task they were entered in. An item that enters
one before its first suspension must be resumed in the same task, or its scope
would be exited "in a different task". So a *runner* task that sees its item
suspend keeps driving that item to the end itself, and hands the batch's
remaining items to a new runner task. Every item runs start to finish inside
one task; tasks are only created for items that suspend; and at most
``limit`` items are in flight on the loop at once.
"""

from __future__ import annotations

import asyncio
import types
from collections import deque
from collections.abc import Callable, Generator, Sequence
from typing import Any

__all__ = ["ItemPool"]

_PENDING = object()


@types.coroutine
def _resume(step: Any, yielded: Any) -> Generator[Any, Any, Any]:
    """Continues a coroutine that was stepped by hand up to its first suspension.

    Re-yields what the coroutine yielded (a future, or None for a bare
    reschedule) to the running task, then forwards every value and exception
    the task sends back, exactly as ``await`` would have.
    """
    while True:
        try:
            sent = yield yielded
        except GeneratorExit:
            step.close()
            raise
        except BaseException as exc:
            try:
                yielded = step.throw(exc)
            except StopIteration as stop:
                return stop.value
        else:
            try:
                yielded = step.send(sent)
            except StopIteration as stop:
                return stop.value


class _Gather:
    """The items of one batch, their results, and who waits for them."""

    __slots__ = ("error", "failed_index", "items", "next", "remaining", "results", "waiter")

    def __init__(self, items: Sequence[Any]) -> None:
        self.items = items
        self.results: list[Any] = [_PENDING] * len(items)
        self.next = 0
        self.remaining = len(items)
        self.error: BaseException | None = None
        self.failed_index = -1
        self.waiter: asyncio.Future[None] | None = None

    def finish(self, index: int, value: Any) -> None:
        self.results[index] = value
        self._count_down()

    def fail(self, index: int, error: BaseException) -> None:
        if self.error is None:
            self.error = error
            self.failed_index = index
            # Items not started yet never will be.
            self.remaining -= len(self.items) - self.next
            self.next = len(self.items)
        self._count_down()

    def _count_down(self) -> None:
        self.remaining -= 1
        if self.remaining == 0 and self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)


class ItemPool:
    """Runs item awaitables concurrently on the current loop, at most ``limit`` in flight.

    Args:
        limit: the most items started and not yet finished at any moment,
            across every batch that uses this pool.
        spawn: starts a new task for a coroutine in the scope that owns the
            iteration (so helper runners are cancelled with it).

    Example::

        pool = ItemPool(256, spawn=task_group.start_soon)
        samples = await pool.gather([dataset[k] for k in keys])
    """

    def __init__(self, limit: int, spawn: Callable[..., None]) -> None:
        if limit < 1:
            raise ValueError(f"the item concurrency limit must be >= 1; got {limit}")
        self._free = limit
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._spawn = spawn
        self.in_flight = 0

    async def gather(self, items: Sequence[Any]) -> list[Any]:
        """Resolves every awaitable in ``items`` (plain values pass through) and returns the results in order.

        Raises the first item's exception, with a note naming the position of
        the failed item; the items not started by then are never started.
        """
        group = _Gather(items)
        await self._run(group)
        if group.remaining:
            group.waiter = asyncio.get_running_loop().create_future()
            await group.waiter
        if group.error is not None:
            raise group.error
        return group.results

    async def _acquire(self) -> None:
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self._release()  # granted and cancelled at once: pass it on
            else:
                self._waiters.remove(waiter)
            raise

    def _release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1

    async def _run(self, group: _Gather) -> None:
        """One runner: starts the group's items one after the other until they run out."""
        items = group.items
        while group.next < len(items):
            await self._acquire()
            if group.next >= len(items):
                self._release()
                return
            index = group.next
            group.next += 1
            item = items[index]
            self.in_flight += 1
            try:
                step = _stepper(item)
                if step is None:
                    group.finish(index, item)
                    continue
                try:
                    yielded = step.send(None)
                except StopIteration as stop:
                    group.finish(index, stop.value)
                    continue
                if group.next < len(items):
                    # This item suspended: a new runner carries on with the rest
                    # (waiting for a free slot first, so runners stay bounded).
                    self._spawn(self._run, group)
                value = await _resume(step, yielded)
            except asyncio.CancelledError:
                raise
            except Exception as error:
                group.fail(index, error)
            else:
                group.finish(index, value)
            finally:
                self.in_flight -= 1
                self._release()


def _stepper(item: Any) -> Any:
    """What to ``send`` into to step ``item``, or None when it is a plain value."""
    if type(item) is types.CoroutineType:
        return item
    await_ = getattr(type(item), "__await__", None)
    if await_ is None:
        return None
    return await_(item)
