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

from collections.abc import Callable
from typing import Any, TypeVar

from aioload.faults.policy import FaultPolicy, Skip
from aioload.faults.retrier import Retrier

__all__ = ["StreamGuard", "can_guard", "check_stream_policy"]

T = TypeVar("T")

_ATTEMPTS = "_aioload_attempts"  # set on an error that retry() gave up on: its attempts


class StreamGuard(Retrier):
    """What a stream that opts in to the loader's fault policy is given (see the module docstring).

    One guard per opened stream (per epoch, per worker). It is used from the thread or
    the event loop that reads the stream. It is the reader's
    :class:`~aioload.faults.retrier.Retrier` (attempts, backoff, the closed epoch, the retry
    count: :meth:`again`, :meth:`backoff`, :meth:`backoff_sync` for a stream's own retry
    loop) with the two calls most streams need: :meth:`retry` and :meth:`skip`.

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

    async def retry(self, read: Callable[..., Any], *args: Any) -> Any:
        """``read(*args)`` (awaited if it returns an awaitable), retried under the policy.

        Raises:
            Exception: the last attempt's error (with a note saying how many were
                made); an error that is not transient at once.
        """
        value, error, attempts = await self.attempts(read, args)
        if error is not None:
            raise _gave_up(error, attempts)
        return value

    def retry_sync(self, read: Callable[..., T], *args: Any) -> T:
        """``read(*args)`` retried under the policy, in a sync stream (see :meth:`retry`).

        The backoff blocks the stream's thread (the loader reads a sync stream in a
        thread of its own when it retries) and ends early when the epoch closes.
        """
        value, error, attempts = self.attempts_sync(read, args)
        if error is not None:
            raise _gave_up(error, attempts)
        return value  # type: ignore[no-any-return]

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
        if not self.skipping:
            place = "" if where is None else f" ({where})"
            error.add_note(f"raised while reading key {key!r}{place} of the stream")
            raise error
        return self.skipped(key, error, attempts, where)


def _gave_up(error: Exception, attempts: int) -> Exception:
    """``error``, with how many attempts it ended recorded on it (for :meth:`StreamGuard.skip`)."""
    if attempts > 1:
        error.add_note(f"the last of {attempts} attempts")
    try:
        setattr(error, _ATTEMPTS, attempts)
    except AttributeError:  # an exception type without a __dict__: the count is lost
        pass
    return error


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
        "a stream opts in with a guarded_stream(guard) method (see aioload.faults.guard; "
        "ShardDataset has one). Otherwise leave retry=None and on_error='raise'"
    )
