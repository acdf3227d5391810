"""Eager, bounded execution of many item coroutines on one event loop.

Why not one task per item (or per batch): an ``async def __getitem__`` that
returns without waiting (an in-memory cache hit, a decoded sample) would pay
for a task, a loop iteration and a wake-up per item — several microseconds
under uvloop, more than the item itself. So :class:`ItemPool` steps each
item's coroutine directly inside a long-lived *runner* task and only pays for
concurrency when an item really suspends.

Why a suspended item stays in its runner: ``asyncio.timeout``, anyio cancel
scopes and task groups remember the task they were entered in. An item that
enters one before its first suspension must be resumed in the same task, or
its scope would be exited "in a different task". So a runner that sees its
item suspend keeps driving that item to the end itself, and another runner
takes over the free slots. Every item runs start to finish inside one task;
at most ``limit`` items are in flight.

Why a runner keeps its slot: when its item finishes and items are queued, the
runner starts the next one itself, in the same step. Under steady load every
completion starts the next item at once: no task is created and no hand-off
waits for another loop iteration, which at a high ``limit`` would cap the rate
at which items start.

Calling runners: free slots (all of them at the start, those given back when
the queue ran dry) are taken by the one runner *called* for them: the runner
waiting for work if there is one, else a new task. When the item it started
suspends while slots are free and items are queued, it calls the next one. So
tasks are created only while free slots are being filled (one when work arrives
and no runner waits for it, then at most one per item that suspends), none
under steady load. A runner that finds no work (or no free slot) waits
for work if no other runner does, and otherwise ends; a stream of
never-suspending items costs no task at all beyond that one runner.

Why the limit may move: ``concurrency="auto"`` tunes it while items run
(:mod:`aioload.read.tuning`). An *observer* is told when each item that suspended
finishes, and may answer a new limit; :meth:`ItemPool.set_limit` takes it. A lower
limit takes effect as items finish (none is interrupted); a higher one calls a
runner for the new slots at once.
"""

from __future__ import annotations

import asyncio
import time
import types
from collections import deque
from collections.abc import Callable, Generator, Sequence
from typing import Any, Protocol

from aioload.groups import reported

__all__ = ["ItemObserver", "ItemPool"]

Done = Callable[[Sequence[Any] | None, BaseException | None], None]


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


class _Group:
    """The items of one submission, their results, and whom to tell."""

    __slots__ = ("done", "items", "next", "remaining", "results")

    def __init__(self, items: Sequence[Any], done: Done) -> None:
        self.items = items
        self.results: list[Any] = [None] * len(items)
        self.next = 0
        self.remaining = len(items)
        self.done: Done | None = done

    def finish(self, index: int, value: Any) -> None:
        self.results[index] = value
        self.remaining -= 1
        if self.remaining == 0 and self.done is not None:
            done, self.done = self.done, None
            done(self.results, None)

    def fail(self, error: BaseException) -> None:
        self.close_unstarted()  # items not started yet never will be
        if self.done is not None:
            done, self.done = self.done, None
            done(None, error)

    def close_unstarted(self) -> None:
        """Closes the coroutines that were never started, so none warns it was never awaited."""
        for item in self.items[self.next :]:
            if type(item) is types.CoroutineType:
                item.close()
        self.next = len(self.items)


class ItemObserver(Protocol):
    """Told of each item that suspended when it finishes (see :mod:`aioload.read.tuning`)."""

    clock: Callable[[], float]

    def item_done(self, started: float) -> int | None:
        """The item started at ``started`` (``clock()``) finished: the limit from now on
        (None: unchanged)."""


class ItemPool:
    """Runs item awaitables concurrently on the current loop, at most ``limit`` in flight.

    The pool owns its runner tasks: :meth:`aclose` (called when the epoch
    ends, however it ends) cancels them and waits for them.

    Args:
        limit: the most items started and not yet finished at any moment,
            across every submission.
        observer: told of each item that suspended when it finishes; the limit it
            answers replaces the pool's (None: the limit is fixed).

    Example::

        pool = ItemPool(256)
        pool.submit([dataset[k] for k in keys], on_done)  # on_done(results, error)
        ...
        await pool.aclose()
    """

    def __init__(self, limit: int, observer: ItemObserver | None = None) -> None:
        if limit < 1:
            raise ValueError(f"the item concurrency limit must be >= 1; got {limit}")
        self._limit = limit
        self._observer = observer
        self._clock = time.monotonic if observer is None else observer.clock
        # Free slots; below zero after the limit was lowered under the items running.
        self._free = limit
        self._groups: deque[_Group] = deque()
        self._calling = False  # a runner was called for the free slots and has not run yet
        self._idle: asyncio.Future[None] | None = None  # the runner waiting for work
        self._runners: set[asyncio.Task[None]] = set()
        self._closed = False

    @property
    def limit(self) -> int:
        """The most items in flight at once, now."""
        return self._limit

    def set_limit(self, limit: int) -> None:
        """Changes the limit: lower, running items go on and no new one starts until
        fewer run; higher, the new slots are filled at once.

        Example::

            pool.set_limit(512)
        """
        if limit < 1:
            raise ValueError(f"the item concurrency limit must be >= 1; got {limit}")
        self._free += limit - self._limit
        self._limit = limit
        if self._free > 0 and not self._calling and self._queued():
            self._call()

    def submit(self, items: Sequence[Any], done: Done) -> None:
        """Resolves every awaitable in ``items`` (plain values pass through).

        ``done(results, None)`` gets the results in order once all are in, or
        ``done(None, error)`` the first item's exception; either is called
        exactly once, from the loop.
        """
        if not items:
            done([], None)
            return
        self._groups.append(_Group(items, done))
        # With no free slot, the runner whose item finishes first starts these.
        if self._free > 0 and not self._calling:
            self._call()

    def _call(self) -> None:
        """Gets a runner to take the free slots: the idle one, else a new one."""
        if self._closed:
            return
        self._calling = True
        idle = self._idle
        if idle is not None:
            self._idle = None
            idle.set_result(None)
            return
        runner = asyncio.get_running_loop().create_task(self._run(), name="aioload-item-runner")
        self._runners.add(runner)
        runner.add_done_callback(self._ended)

    def _ended(self, runner: asyncio.Task[None]) -> None:
        self._runners.discard(runner)
        # A runner that died (cancelled, done() raised, or a cancellation raised
        # in an item) gave its slot back without starting the next item.
        if self._free > 0 and not self._calling and self._queued():
            self._call()

    def _queued(self) -> bool:
        """Whether an item waits to be started (finished submissions are dropped)."""
        groups = self._groups
        while groups:
            if groups[0].next < len(groups[0].items):
                return True
            groups.popleft()
        return False

    async def aclose(self) -> None:
        """Ends the pool: queued items are dropped, running ones cancelled and awaited."""
        self._closed = True
        while self._groups:
            self._groups.popleft().close_unstarted()
        runners = list(self._runners)
        for runner in runners:
            runner.cancel()
        if runners:
            await asyncio.wait(runners)

    async def _run(self) -> None:
        groups = self._groups
        loop = asyncio.get_running_loop()
        self._calling = False
        while True:
            if self._free <= 0 or not self._queued():
                if self._closed or self._idle is not None:
                    return
                idle = self._idle = loop.create_future()
                try:
                    await idle
                finally:
                    # Cancelled while waiting: later calls must not count on this runner.
                    if self._idle is idle:
                        self._idle = None
                    self._calling = False
                continue
            group = groups[0]
            self._free -= 1
            index = group.next
            group.next += 1
            item = group.items[index]
            step = _stepper(item)
            started = self._clock() if self._observer is not None else 0.0
            if step is None:
                self._free += 1
                group.finish(index, item)
                continue
            try:
                yielded = step.send(None)
            except StopIteration as stop:
                self._free += 1
                group.finish(index, stop.value)
                continue
            except BaseException as error:
                # SystemExit from an item too: escaping this task, it would stop the loop.
                if not reported(error):
                    raise
                self._free += 1
                group.fail(error)
                continue
            # The item suspended: this runner drives it to its end, so another
            # runner is called for the free slots.
            if self._free > 0 and not self._calling and self._queued():
                self._call()
            try:
                value = await _resume(step, yielded)
            except BaseException as error:
                if not reported(error):
                    raise  # the pool is closing
                group.fail(error)
            else:
                group.finish(index, value)
            finally:
                # The slot is released after done() ran, so work submitted from
                # done() is started by this runner, not by a newly called one.
                self._free += 1
            observer = self._observer
            if observer is not None:
                limit = observer.item_done(started)
                if limit is not None and limit != self._limit:
                    self.set_limit(limit)


def _stepper(item: Any) -> Any:
    """What to ``send`` into to step ``item``, or None when it is a plain value."""
    if type(item) is types.CoroutineType:
        return item
    await_ = getattr(type(item), "__await__", None)
    if await_ is None:
        return None
    return await_(item)
