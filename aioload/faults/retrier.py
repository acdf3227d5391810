"""The one retry loop of the fault policy, for map-style reads and streams alike.

A :class:`Retrier` is what reading under an active :class:`~aioload.faults.policy.FaultPolicy`
needs, once per reader (one per epoch, per worker):

- which errors get another attempt (``retry.retry_on``), how many attempts there are, and
  the backoff between them, its jitter drawn from a generator of the retrier's own;
- the closed-epoch event: once the epoch closes nothing is retried, a sync backoff wait
  ends at once, and a sync attempt bounded by ``item_timeout`` is abandoned;
- the attempt loop itself, sync (:meth:`Retrier.attempts_sync`) and async
  (:meth:`Retrier.attempts`), each attempt bounded by ``item_timeout`` where the caller
  asks (map-style items; nothing bounds one sample of a stream);
- the retries since the last outcome (:meth:`Retrier.take_retries`, for ``loader.stats()``);
- the skip markers (:class:`~aioload.faults.policy.Skip`), and the reader's own count of
  skips against a ``max_skipped`` count (:meth:`Retrier.count_skip`).

Map-style datasets are read through it by :class:`~aioload.read.fetch.GuardedFetcher`; a
stream is handed a :class:`~aioload.faults.guard.StreamGuard`, which is a retrier with
the methods a stream calls. Without a policy there is no retrier at all.

Example::

    >>> from aioload.faults.policy import FaultPolicy, RetryPolicy
    >>> retrier = Retrier(FaultPolicy(retry=RetryPolicy(attempts=3, backoff=0.0)))
    >>> calls = []
    >>> def read(key):
    ...     calls.append(key)
    ...     if len(calls) < 2:
    ...         raise ConnectionResetError("reset")
    ...     return key * 10
    >>> retrier.attempts_sync(read, (4,))
    Attempted(value=40, error=None, attempts=2)
    >>> retrier.take_retries()
    1
"""

from __future__ import annotations

import asyncio
import inspect
import random
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from aioload.faults.policy import FaultPolicy, ItemTimeoutError, Skip, SkippedItem

__all__ = ["Attempted", "Retrier"]

_ABANDON_SLICE = 0.05  # how often a wait for a sync attempt checks that the epoch still runs


class Attempted(NamedTuple):
    """What the attempts at one read came to.

    Attributes:
        value: the value read (None when every attempt failed).
        error: the last attempt's error (None: the read succeeded).
        attempts: how many attempts were made.
    """

    value: Any
    error: Exception | None
    attempts: int


class Retrier:
    """Retries, backoff, the closed epoch and skips of one reader (see the module docstring).

    It is used from the threads or the event loop that read; the retry count is safe to
    update from several threads (sync reads retry in the loader's fetch threads).

    Args:
        policy: the loader's fault policy.
        worker: the worker process reading (None: the loader's own loop), for the skip
            records.

    Example::

        retrier = Retrier(policy, worker=2)
        value, error, attempts = await retrier.attempts(dataset.__getitem__, (key,))
        if error is not None:
            marker = retrier.skipped(key, error, attempts)
    """

    def __init__(self, policy: FaultPolicy, worker: int | None = None) -> None:
        self.policy = policy
        self.worker = worker
        self._retry = policy.retry
        self._skip = policy.on_error == "skip"
        limit = policy.max_skipped
        # A fraction needs the epoch's length, which only the epoch's SkipLog knows.
        self._skip_limit = limit if isinstance(limit, int) else None
        self._skips = 0
        self._rng = random.Random()
        self._closed = threading.Event()
        self._retries = 0
        self._retries_lock = threading.Lock()

    @property
    def skipping(self) -> bool:
        """Whether an item that fails for good is skipped (``on_error='skip'``), not raised."""
        return self._skip

    def transient(self, error: BaseException) -> bool:
        """Whether ``error`` is worth another attempt under the policy (``retry.retry_on``)."""
        return self._retry is not None and self._retry.retries(error)

    def again(self, error: BaseException, attempt: int) -> bool:
        """Whether attempt number ``attempt`` (1-based), failed with ``error``, gets another.

        True for a transient error (``retry.retry_on``) with attempts left, while the
        epoch runs; each True is counted as a retry in the loader's stats. Wait
        :meth:`backoff` (or :meth:`backoff_sync`) before the next attempt.
        """
        retry = self._retry
        if (
            retry is None
            or attempt >= retry.attempts
            or self._closed.is_set()
            or not isinstance(error, Exception)
            or not retry.retries(error)
        ):
            return False
        with self._retries_lock:
            self._retries += 1
        return True

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (the policy's backoff)."""
        return 0.0 if self._retry is None else self._retry.delay(attempt, self._rng)

    def delay_after(self, error: BaseException, attempt: int) -> float:
        """Seconds to wait after attempt ``attempt`` failed with ``error``: the ``Retry-After``
        a throttling store asked for (the error's ``retry_after``, in seconds), when it
        says and that is longer than the policy's backoff; the backoff otherwise."""
        delay = self.delay(attempt)
        asked = getattr(error, "retry_after", None)
        if isinstance(asked, int | float) and not isinstance(asked, bool) and asked > delay:
            # Jittered like the backoff (between it and 1.5 times it): readers throttled
            # together must not come back together.
            return float(asked) * (1.0 + 0.5 * self._rng.random())
        return delay

    async def backoff(self, attempt: int, error: BaseException | None = None) -> None:
        """Waits the backoff after failed attempt number ``attempt`` (on an event loop)."""
        await asyncio.sleep(
            self.delay(attempt) if error is None else self.delay_after(error, attempt)
        )

    def backoff_sync(self, attempt: int, error: BaseException | None = None) -> bool:
        """Waits the backoff in a thread; False when the epoch closed meanwhile (give up)."""
        wait = self.delay(attempt) if error is None else self.delay_after(error, attempt)
        return not self._closed.wait(wait)

    def close(self) -> None:
        """The epoch is closing: sync backoff waits end, and nothing is retried (any thread)."""
        self._closed.set()

    def take_retries(self) -> int:
        """The retries counted since the last call (the loader reports them per batch)."""
        if not self._retries:
            return 0
        with self._retries_lock:
            retries, self._retries = self._retries, 0
        return retries

    # -- the loop ------------------------------------------------------------------

    def attempts_sync(
        self,
        read: Callable[..., Any],
        args: tuple[Any, ...],
        *,
        timeout: float | None = None,
        what: Callable[..., str] = repr,
    ) -> Attempted:
        """``read(*args)`` attempted under the policy, in a thread; never raises an Exception.

        Args:
            read: the read.
            args: its arguments.
            timeout: bounds each attempt (seconds; None: no bound). A sync call cannot
                be interrupted: each attempt runs in a thread of its own then, and is
                abandoned when the time is up or the epoch closes (the call finishes in
                the background, its result dropped; a retry may run while it does).
            what: ``what(*args)`` names what is read, for a timeout's message.

        The backoff blocks the calling thread and ends early when the epoch closes: the
        read gives up with its last error.
        """
        attempt = 0
        while True:
            attempt += 1
            try:
                if timeout is None:
                    return Attempted(read(*args), None, attempt)
                return Attempted(self._abandon_after(timeout, read, args, what), None, attempt)
            except Exception as error:
                if not self.again(error, attempt) or not self.backoff_sync(attempt, error):
                    return Attempted(None, error, attempt)

    async def attempts(
        self,
        read: Callable[..., Any],
        args: tuple[Any, ...],
        *,
        timeout: float | None = None,
        what: Callable[..., str] = repr,
    ) -> Attempted:
        """``read(*args)`` (awaited if it returns an awaitable) attempted under the policy.

        Each attempt is bounded by ``asyncio.timeout(timeout)`` when ``timeout`` is set
        (a late one fails with :class:`~aioload.ItemTimeoutError`, named by
        ``what(*args)``); the backoff is ``asyncio.sleep``. A cancellation is never
        retried: it propagates.
        """
        attempt = 0
        while True:
            attempt += 1
            try:
                if timeout is None:
                    value = read(*args)
                    if inspect.isawaitable(value):
                        value = await value
                else:
                    value = await self._timed(timeout, read, args, what)
                return Attempted(value, None, attempt)
            except Exception as error:
                if not self.again(error, attempt):
                    return Attempted(None, error, attempt)
                failed = error
            await self.backoff(attempt, failed)

    async def _timed(
        self,
        timeout: float,
        read: Callable[..., Any],
        args: tuple[Any, ...],
        what: Callable[..., str],
    ) -> Any:
        scope = asyncio.timeout(timeout)
        try:
            async with scope:
                value = read(*args)
                return await value if inspect.isawaitable(value) else value
        except TimeoutError:
            if not scope.expired():
                raise  # the read's own TimeoutError
            raise ItemTimeoutError(
                f"reading {what(*args)} took longer than item_timeout={timeout} s"
            ) from None

    def _abandon_after(
        self,
        timeout: float,
        read: Callable[..., Any],
        args: tuple[Any, ...],
        what: Callable[..., str],
    ) -> Any:
        """``read(*args)`` in a thread of its own, given up after ``timeout`` seconds.

        A sync call cannot be interrupted, so a hung one is abandoned: its daemon thread
        runs on until the call returns, and its result is dropped.
        """
        outcome: list[Any] = []
        finished = threading.Event()

        def attempt() -> None:
            try:
                outcome.append((read(*args), None))
            except BaseException as error:
                outcome.append((None, error))
            finally:
                finished.set()

        thread = threading.Thread(target=attempt, name="aioload-item", daemon=True)
        thread.start()
        deadline = time.monotonic() + timeout
        while not finished.wait(min(_ABANDON_SLICE, max(0.0, deadline - time.monotonic()))):
            if time.monotonic() >= deadline or self._closed.is_set():
                raise ItemTimeoutError(
                    f"reading {what(*args)} took longer than item_timeout={timeout} s; the "
                    "sync call was abandoned (it cannot be interrupted: it finishes in the "
                    "background and its result is dropped)"
                )
        value, error = outcome[0]
        if error is not None:
            raise error
        return value

    # -- skips ---------------------------------------------------------------------

    def skipped(
        self, key: Any, error: BaseException, attempts: int, where: str | None = None
    ) -> Skip:
        """The marker of ``key``, given up after ``attempts`` attempts (the last raised it)."""
        return Skip(SkippedItem.from_error(key, error, attempts, self.worker, where))

    def count_skip(self) -> bool:
        """Counts a skip this reader met; whether it alone is past a ``max_skipped`` count.

        A reader past the limit has its skips reported at once (the epoch's
        :class:`~aioload.faults.policy.SkipLog` then ends the epoch), however few samples it
        read meanwhile.
        """
        self._skips += 1
        limit = self._skip_limit
        return limit is not None and self._skips > limit
