"""The fault policy for streams: how an iterable dataset retries and skips without ending.

The loader reads a map-style dataset key by key, so it can read a key again or leave it
out of its batch. A stream reads its samples itself, and an exception raised inside a
generator ends the generator: the loader cannot retry or skip past it. So the loader's
fault policy (``retry``, ``on_error='skip'``, ``max_skipped``) applies to an iterable
dataset only where the dataset opts in, with one method::

    def guarded_stream(self, guard: StreamGuard) -> Iterator[Any] | AsyncIterator[Any]

When its policy is active the loader (or each worker) opens the stream with
``dataset.guarded_stream(guard)`` instead of ``iter(dataset)`` / ``aiter(dataset)``
(an async iterator where the dataset has ``__aiter__``, else a sync one); without a
policy it iterates the dataset as usual. The stream reads as it always does, and where a
sample fails it asks its :class:`StreamGuard`:

- ``await guard.retry(read, *args)`` (``guard.retry_sync`` in a sync stream) calls
  ``read(*args)`` again after the policy's backoff while it raises an error that
  ``retry.retry_on`` calls transient, and raises the last error when the attempts are
  used up (any other error at once);
- ``yield guard.skip(key, error)`` stands in the stream for the sample it gave up on.
  Under ``on_error='skip'`` it returns a marker that the loader drops and records as a
  :class:`~aioload.SkippedItem` (logged, counted in ``loader.stats()``, listed in
  ``loader.skipped``, held to ``max_skipped``); under ``on_error='raise'`` it raises
  ``error`` with a note naming the key, which fails the batch as without a policy.

A skipped sample takes no place in a batch: the loader reads on until the batch is full,
so the batches hold what the stream yields without its bad samples, in the same order.
Skips and retries travel with the batch they were met in, from worker processes too.

Datasets without ``guarded_stream`` keep torch's behaviour, and a loader with an active
policy refuses them at construction (:func:`check_stream_policy`): a plain generator
cannot go on after an error. :class:`~aioload.sources.ShardDataset` and
:class:`~aioload.sources.MixDataset` (over sources that have one) opt in.
``item_timeout`` stays map-style only: nothing bounds one sample of a stream.

Example::

    class Records(IterableDataset):
        def __init__(self, paths):
            self.paths = paths

        def __iter__(self):                 # no policy: the first error ends the stream
            for path in self.paths:
                yield parse(read(path))

        def guarded_stream(self, guard):    # retry=..., on_error="skip"
            for path in self.paths:
                try:
                    sample = parse(guard.retry_sync(read, path))
                except Exception as error:
                    yield guard.skip(path, error)
                    continue
                yield sample

    loader = DataLoader(Records(paths), batch_size=32, retry=RetryPolicy(attempts=3),
                        on_error="skip", max_skipped=10)
"""

from __future__ import annotations

import asyncio
import inspect
import random
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from aioload.fetch import Skip
from aioload.policy import FaultPolicy, SkippedItem

__all__ = ["StreamGuard", "can_guard", "check_stream_policy"]

T = TypeVar("T")

_ATTEMPTS = "_aioload_attempts"  # set on an error that retry() gave up on: its attempts


class StreamGuard:
    """What a stream that opts in to the loader's fault policy is given (see the module docstring).

    One guard per opened stream (per epoch, per worker). It is used from the thread or
    the event loop that reads the stream.

    Args:
        policy: the loader's fault policy.
        worker: the worker process reading the stream (None: the loader's own loop),
            for the skip records.

    Example::

        async def read_shard(guard, url):
            try:
                return await guard.retry(fetch, url)      # transient errors retried
            except Exception as error:
                return guard.skip(url, error, where=url)  # a marker to yield (or raises)
    """

    def __init__(self, policy: FaultPolicy, worker: int | None = None) -> None:
        self.policy = policy
        self.worker = worker
        self._retry = policy.retry
        self._skip = policy.on_error == "skip"
        self._rng = random.Random()
        self._closed = threading.Event()
        self._retries = 0

    @property
    def skipping(self) -> bool:
        """Whether :meth:`skip` skips (``on_error='skip'``) rather than raises."""
        return self._skip

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
        self._retries += 1
        return True

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (the policy's backoff)."""
        return 0.0 if self._retry is None else self._retry.delay(attempt, self._rng)

    async def backoff(self, attempt: int) -> None:
        """Waits the backoff after failed attempt number ``attempt`` (async streams)."""
        await asyncio.sleep(self.delay(attempt))

    def backoff_sync(self, attempt: int) -> bool:
        """Waits the backoff in a sync stream; False when the epoch closed meanwhile (give up)."""
        return not self._closed.wait(self.delay(attempt))

    async def retry(self, read: Callable[..., Any], *args: Any) -> Any:
        """``read(*args)`` (awaited if it returns an awaitable), retried under the policy.

        Raises:
            Exception: the last attempt's error (with a note saying how many were
                made); an error that is not transient at once.
        """
        attempt = 0
        while True:
            attempt += 1
            try:
                value = read(*args)
                if inspect.isawaitable(value):
                    value = await value
                return value
            except Exception as error:
                if not self.again(error, attempt):
                    _gave_up(error, attempt)
                    raise
            await self.backoff(attempt)

    def retry_sync(self, read: Callable[..., T], *args: Any) -> T:
        """``read(*args)`` retried under the policy, in a sync stream (see :meth:`retry`).

        The backoff blocks the stream's thread (the loader reads a sync stream in a
        thread of its own when it retries) and ends early when the epoch closes.
        """
        attempt = 0
        while True:
            attempt += 1
            try:
                return read(*args)
            except Exception as error:
                if not self.again(error, attempt) or not self.backoff_sync(attempt):
                    _gave_up(error, attempt)
                    raise

    def skip(
        self,
        key: Any,
        error: BaseException,
        *,
        attempts: int | None = None,
        where: str | None = None,
    ) -> Skip:
        """The marker to yield in place of the sample ``key`` that failed with ``error``.

        Under ``on_error='raise'`` it raises ``error`` instead, with a note naming the
        key (and ``where``).

        Args:
            key: what names the sample in the skip record (its key, a path...).
            error: why it failed.
            attempts: how many attempts were made (default: as :meth:`retry` counted
                them for this error, else 1).
            where: where in the stream it was (e.g. a shard's URL and byte offset).
        """
        if attempts is None:
            attempts = getattr(error, _ATTEMPTS, 1)
        if not self._skip:
            place = "" if where is None else f" ({where})"
            error.add_note(f"raised while reading key {key!r}{place} of the stream")
            raise error
        return Skip(SkippedItem.from_error(key, error, attempts, self.worker, where))

    def take_retries(self) -> int:
        """The retries counted since the last call (the loader reports them per batch)."""
        retries, self._retries = self._retries, 0
        return retries

    def close(self) -> None:
        """The epoch is closing: backoff waits of sync streams end, and nothing is retried."""
        self._closed.set()


def _gave_up(error: Exception, attempts: int) -> None:
    """Records on ``error`` how many attempts it ended (for :meth:`StreamGuard.skip`)."""
    if attempts > 1:
        error.add_note(f"the last of {attempts} attempts")
    try:
        setattr(error, _ATTEMPTS, attempts)
    except AttributeError:  # an exception type without a __dict__: the count is lost
        pass


def can_guard(dataset: Any) -> bool:
    """Whether an iterable dataset opts in to the fault policy (it has ``guarded_stream``)."""
    try:
        method = getattr(dataset, "guarded_stream", None)
    except AttributeError:  # a property that says why not (a MixDataset's)
        return False
    return callable(method)


def check_stream_policy(dataset: Any, policy: FaultPolicy) -> None:
    """Refuses an active fault policy that an iterable dataset cannot apply, saying why.

    Raises:
        ValueError: ``item_timeout`` (map-style only), a fraction ``max_skipped`` (a
            stream's length is unknown), or a dataset without ``guarded_stream``.
    """
    name = type(dataset).__name__
    if policy.item_timeout is not None:
        raise ValueError(
            f"item_timeout applies to map-style datasets only: the loader does not read the "
            f"samples of an iterable dataset ({name}) one by one, so it cannot time one out; "
            "leave item_timeout=None"
        )
    if isinstance(policy.max_skipped, float):
        raise ValueError(
            f"max_skipped={policy.max_skipped!r} is a fraction of the epoch's items, but the "
            f"epoch of an iterable dataset ({name}) has no known length; give a count (an int)"
        )
    if can_guard(dataset):
        return
    reason = ""
    if hasattr(type(dataset), "guarded_stream"):  # a property that says why not
        try:
            getattr(dataset, "guarded_stream")  # noqa: B009
        except AttributeError as error:
            reason = f" ({error})"
    raise ValueError(
        f"retry and on_error='skip' apply to map-style datasets, and to iterable datasets "
        f"that can skip a sample without ending their stream; {name} cannot{reason}. An "
        "error raised inside a generator ends it, so the loader could not go on past it: "
        "a stream opts in with a guarded_stream(guard) method (see aioload.stream_faults; "
        "ShardDataset has one). Otherwise leave retry=None and on_error='raise'"
    )
