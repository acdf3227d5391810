"""Hedged reads: a request slower than most is sent a second time, and the first answer wins.

An object store's latency has a heavy tail: most GETs answer in tens of milliseconds, one in
a hundred takes a second (a busy disk, a lost packet, a slow replica). A batch waits for its
slowest item, so with 32 items a batch meets that tail about one time in four. Sending a
request again once it has taken longer than nearly every other (after the 95th percentile of
recent reads, "The Tail at Scale") turns most of those seconds into two ordinary reads, for
about 5 % more requests.

:class:`Hedge` keeps what that needs, per store, loop-free (a lock, no task): the seconds of
the last :data:`WINDOW` reads, their 95th percentile (the delay before a second request,
adapted as the store speeds up or slows down), or a fixed delay; and a token budget, so that
a store that slows down as a whole does not get every request twice: each read earns
:data:`SHARE` of a token (up to :data:`BURST`), each hedge costs one.

:func:`hedged` runs one request under it: the first attempt; after the delay, if the budget
has a token, a second; the first to answer wins and the other is cancelled and awaited (no
task outlives the call), and a late answer that lost is handed to ``discard`` (a stream
never read is closed). The hedges are counted in the dataset's
:class:`~aioload.stats.source_counts.SourceCounter`.
"""

from __future__ import annotations

import asyncio
import bisect
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from aioload.sources.stores.budget import RequestBudget
from aioload.stats.source_counts import SourceCounter

__all__ = ["BURST", "MIN_READS", "SHARE", "WINDOW", "Hedge", "check_hedge", "hedged"]

T = TypeVar("T")

WINDOW = 256  # reads whose seconds make the percentile
MIN_READS = 32  # reads seen before an adaptive hedge has a delay to go by
PERCENTILE = 0.95
SHARE = 0.05  # tokens a read earns: at most about five hedges per hundred reads
BURST = 10.0  # the most tokens kept (and the first ones)
WARM_UP_POLL = 0.05  # seconds between looks at the delay while it is not yet known


def check_hedge(hedge: Any) -> bool | float:
    """``hedge`` checked: False (off), True (after the adaptive p95) or seconds > 0.

    Example::

        >>> check_hedge(True), check_hedge(0.25)
        (True, 0.25)
    """
    if isinstance(hedge, bool):
        return hedge
    if isinstance(hedge, int | float) and hedge > 0 and hedge != float("inf"):
        return float(hedge)
    raise ValueError(
        f"hedge should be False, True (after the 95th percentile of recent reads) or a "
        f"delay in seconds > 0; got {hedge!r}"
    )


class Hedge:
    """When to send a read a second time, for one store: the delay and the budget.

    Args:
        setting: True (the 95th percentile of the last :data:`WINDOW` reads, once
            :data:`MIN_READS` were seen) or a fixed delay in seconds.
        share: tokens each read earns (a hedge costs one).
        burst: the most tokens kept; the budget starts full.
        clock: seconds, monotonic (a test passes a fake one).

    Thread-safe and free of any event loop: one instance serves every loop that reads the
    dataset. Pickles as a fresh one with the same settings (each process measures its own
    reads).

    Example::

        >>> ticks = iter(range(1000))
        >>> hedge = Hedge(True, clock=lambda: next(ticks) / 100)
        >>> for _ in range(40):
        ...     hedge.record(0.020)
        >>> hedge.delay()
        0.02
        >>> hedge.take_token()
        True
    """

    def __init__(
        self,
        setting: bool | float = True,
        *,
        share: float = SHARE,
        burst: float = BURST,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.setting = check_hedge(setting)
        self.share = share
        self.burst = burst
        self.clock = clock
        self._lock = threading.Lock()
        self._recent: deque[float] = deque(maxlen=WINDOW)
        self._sorted: list[float] = []
        self._tokens = burst

    def record(self, seconds: float) -> None:
        """One read took ``seconds`` (to its answer); it earns the budget its share."""
        with self._lock:
            recent, ordered = self._recent, self._sorted
            if len(recent) == recent.maxlen:
                del ordered[bisect.bisect_left(ordered, recent[0])]
            recent.append(seconds)
            bisect.insort(ordered, seconds)
            self._tokens = min(self.burst, self._tokens + self.share)

    def delay(self) -> float | None:
        """Seconds after which a read is sent again (None: not yet known, do not hedge)."""
        if self.setting is not True:
            return float(self.setting)
        with self._lock:
            ordered = self._sorted
            if len(ordered) < MIN_READS:
                return None
            return ordered[min(len(ordered) - 1, int(PERCENTILE * len(ordered)))]

    def take_token(self) -> bool:
        """Whether the budget allows one more hedge now (taking its token if so)."""
        with self._lock:
            if self._tokens < 1.0:
                return False
            self._tokens -= 1.0
            return True

    @property
    def tokens(self) -> float:
        """The tokens in the budget now."""
        return self._tokens

    def __reduce__(self) -> tuple[Any, ...]:
        return (_fresh_hedge, (self.setting, self.share, self.burst))

    def __repr__(self) -> str:
        return f"Hedge({self.setting!r}, delay={self.delay()!r}, tokens={self._tokens:.2f})"


def _fresh_hedge(setting: bool | float, share: float, burst: float) -> Hedge:
    return Hedge(setting, share=share, burst=burst)


async def hedged(
    hedge: Hedge | None,
    attempt: Callable[[], Awaitable[T]],
    counts: SourceCounter,
    discard: Callable[[T], Any] | None = None,
    budget: RequestBudget | None = None,
) -> T:
    """``await attempt()``, sent a second time if it is slow (see the module docstring).

    Args:
        hedge: the store's :class:`Hedge`; None: one attempt, as if unhedged.
        attempt: makes one request (each call a new one) and returns its answer.
        counts: where a hedge (and each request) is counted.
        discard: called with an answer that arrived but lost the race (e.g. to close it).
        budget: the dataset's :class:`~aioload.sources.stores.budget.RequestBudget`, whose
            turn each request waits for (before the hedge's clock starts, for the first).

    An attempt's error is the read's error, unless the other attempt is still running, which
    then decides. Cancelled, both attempts are cancelled and awaited.

    Example::

        result = await hedged(location.hedge, lambda: obstore.get_async(store, path), counts)
    """
    if budget is not None:
        await budget.acquire()
    counts.requested()
    if hedge is None:
        return await attempt()
    clock = hedge.clock
    began = clock()
    first = asyncio.ensure_future(attempt())
    try:
        delay = hedge.delay()
        while delay is None and not first.done():
            # Not enough reads seen yet to know what is slow: look again in a while, so
            # that a read that began while the store was new to us is hedged all the same.
            await asyncio.wait((first,), timeout=WARM_UP_POLL)
            delay = hedge.delay()
        if delay is not None and not first.done():
            left = delay - (clock() - began)
            done, _ = await asyncio.wait((first,), timeout=max(0.0, left))
            if not done and hedge.take_token():
                counts.hedged()
                counts.requested()
                second = asyncio.ensure_future(_after_turn(budget, attempt))
                return await _race(first, second, hedge, began, discard)
        result = await first
    except BaseException:
        await _cancel(first, discard)
        raise
    hedge.record(clock() - began)
    return result


async def _after_turn(budget: RequestBudget | None, attempt: Callable[[], Awaitable[T]]) -> T:
    if budget is not None:
        await budget.acquire()
    return await attempt()


async def _race(
    first: asyncio.Future[T],
    second: asyncio.Future[T],
    hedge: Hedge,
    began: float,
    discard: Callable[[T], Any] | None,
) -> T:
    """The answer of whichever attempt succeeds first; the other cancelled and awaited."""
    pending = {first, second}
    hedged_at = hedge.clock()
    try:
        while True:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            winner = next((task for task in done if task.exception() is None), None)
            if winner is not None or not pending:
                break
        for task in done - {winner}:
            if winner is not None and task.exception() is None:
                _discard(task, discard)
        if winner is None:
            return first.result() if first in done else second.result()
        now = hedge.clock()
        # The read as the caller saw it: from its first request, or from the hedge's own.
        hedge.record(now - (began if winner is first else hedged_at))
        return winner.result()
    finally:
        for task in pending:
            await _cancel(task, discard)


async def _cancel(task: asyncio.Future[Any], discard: Callable[[Any], Any] | None) -> None:
    """Cancels ``task`` and waits for it to end (its answer, if it had one, discarded)."""
    if not task.done():
        task.cancel()
        await asyncio.wait((task,))
    _discard(task, discard)


def _discard(task: asyncio.Future[Any], discard: Callable[[Any], Any] | None) -> None:
    if task.cancelled():
        return
    error = task.exception()  # retrieved: a lost attempt's error is no one's to raise
    if error is None and discard is not None:
        discard(task.result())
