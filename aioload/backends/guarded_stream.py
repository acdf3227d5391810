"""Reading a stream's batches under an active fault policy (see :mod:`aioload.stream_faults`).

:class:`GuardedStream` is what :class:`~aioload.backends.reader.BatchReader` reads an
iterable dataset through when the loader's policy is active: it opens the stream with
``dataset.guarded_stream(guard)``, drops the skip markers the stream yields (recording
them in the batch's outcome), reports the guard's retries, and fills each batch with
samples only, so that a skipped sample takes no place in it.

A batch's skips travel in its outcome. The skips met before a batch is full are
reported early, in an outcome with nothing to deliver (the samples already read wait
for the next batch), once there are :data:`SKIPS_PER_OUTCOME` of them or once this
stream alone is past ``max_skipped``: a stream that only skips (every shard missing,
say) is stopped by ``max_skipped``, and its records do not pile up unreported. The last
skips of a stream likewise come in an outcome of their own before its end.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from aioload.fetch import DatasetProtocol, Skip
from aioload.groups import reported
from aioload.outcome import Outcome
from aioload.policy import FaultPolicy, SkippedItem
from aioload.stream_faults import StreamGuard

__all__ = ["SKIPS_PER_OUTCOME", "GuardedStream"]

SKIPS_PER_OUTCOME = 64
"""The most skip records one outcome holds; more are reported in outcomes of their own."""

_END = object()


class GuardedStream:
    """One epoch's batches of a stream that opted in to the fault policy.

    Args:
        dataset: the iterable dataset (it has ``guarded_stream``).
        protocol: its protocol (async: read with :meth:`next_async`).
        policy: the loader's fault policy.
        worker: the worker process reading (None: the loader's loop), for skip records.
        batch_size: samples per batch (None: no automatic batching, one sample each).
        drop_last: drop the stream's last incomplete batch.
        collate: merges a batch's samples (or converts the one sample).
        state: the stream's state after a batch (a checkpoint's), or None.
        open_stream: opens the stream under the guard (default:
            ``dataset.guarded_stream``; a batch stream, see :mod:`aioload.row_block`,
            with ``batch_size`` None: each of its items is a whole batch).

    Example::

        stream = GuardedStream(dataset, inspect_dataset(dataset), policy, worker=None,
                               batch_size=32, drop_last=False, collate=default_collate,
                               state=lambda: None)
        outcome = stream.next_sync(0)   # outcome.batch, outcome.skipped, outcome.retries
    """

    def __init__(
        self,
        dataset: Any,
        protocol: DatasetProtocol,
        policy: FaultPolicy,
        *,
        worker: int | None,
        batch_size: int | None,
        drop_last: bool,
        collate: Callable[[Any], Any],
        state: Callable[[], Any],
        open_stream: Callable[[StreamGuard], Any] | None = None,
    ) -> None:
        self.guard = StreamGuard(policy, worker)
        self._batched = batch_size is not None
        self._want = batch_size or 1
        self._drop_last = drop_last and batch_size is not None
        self._collate = collate
        self._state = state
        limit = policy.max_skipped
        self._limit = limit if isinstance(limit, int) else None  # streams take counts only
        self._skipped = 0  # skips this stream met this epoch
        self._carry: list[Any] = []  # samples read for a batch whose skips went out first
        self._ended = False
        self._sync: Iterator[Any] | None = None
        self._async: AsyncIterator[Any] | None = None
        self._open_error: BaseException | None = None
        try:
            opened = dataset.guarded_stream if open_stream is None else open_stream
            stream = opened(self.guard)
            if protocol.is_async:
                self._async = stream if hasattr(stream, "__anext__") else _async(iter(stream))
            elif hasattr(stream, "__anext__"):
                raise TypeError(
                    f"{type(dataset).__name__}.guarded_stream returned an async iterator, but "
                    "the dataset is read as a sync stream (it has no __aiter__): return a "
                    "sync iterator, or give the dataset __aiter__"
                )
            else:
                self._sync = iter(stream)
        except BaseException as error:
            # As the first batch's outcome, as an unguarded stream that cannot be opened.
            error.add_note("raised while opening the dataset's stream (guarded_stream)")
            self._open_error = error
            self._ended = True

    def close(self) -> None:
        """The epoch is closing: backoff waits end (any thread)."""
        self.guard.close()

    async def aclose(self) -> None:
        """Closes an async stream (after every task reading it has ended)."""
        stream = self._async
        if stream is not None and hasattr(stream, "aclose"):
            await stream.aclose()

    def _place(
        self, seq: int, item: Any, samples: list[Any], skipped: list[SkippedItem]
    ) -> Outcome | None:
        """Puts ``item`` with the batch's samples or skips; an outcome to return early, if due."""
        if type(item) is not Skip:
            samples.append(item)
            return None
        skipped.append(item.record)
        if self._report_early(skipped) and len(samples) < self._want:
            return self._early(seq, samples, skipped)
        return None

    def next_sync(self, seq: int) -> Outcome:
        """Batch ``seq`` of a sync stream: samples only, its skips and retries beside them."""
        if self._sync is None:
            return self._not_opened(seq)
        stream = self._sync
        samples, self._carry = self._carry, []
        skipped: list[SkippedItem] = []
        want = self._want
        try:
            while len(samples) < want and not self._ended:
                item = next(stream, _END)
                if item is _END:
                    self._ended = True
                elif (early := self._place(seq, item, samples, skipped)) is not None:
                    return early
        except BaseException as error:
            return self._failed(seq, error, skipped)
        return self._batch(seq, samples, skipped)

    async def next_async(self, seq: int) -> Outcome:
        """Batch ``seq`` of a stream on the running loop (one call at a time, in order)."""
        if self._async is None:
            return self._not_opened(seq)
        stream = self._async
        samples, self._carry = self._carry, []
        skipped: list[SkippedItem] = []
        want = self._want
        try:
            while len(samples) < want and not self._ended:
                try:
                    item = await stream.__anext__()
                except StopAsyncIteration:
                    self._ended = True
                    break
                if (early := self._place(seq, item, samples, skipped)) is not None:
                    return early
        except BaseException as error:
            if not reported(error):
                raise  # the epoch is being cancelled
            return self._failed(seq, error, skipped)
        return self._batch(seq, samples, skipped)

    # -- outcomes ----------------------------------------------------------------

    def _report_early(self, skipped: list[SkippedItem]) -> bool:
        """Counts a skip; whether the skips so far go out before the batch is full."""
        self._skipped += 1
        limit = self._limit
        return len(skipped) >= SKIPS_PER_OUTCOME or (limit is not None and self._skipped > limit)

    def _early(self, seq: int, samples: list[Any], skipped: list[SkippedItem]) -> Outcome:
        """The skips so far, with nothing to deliver; the samples wait for the next batch."""
        self._carry = samples
        return Outcome(seq, skipped=tuple(skipped), retries=self.guard.take_retries(), empty=True)

    def _batch(self, seq: int, samples: list[Any], skipped: list[SkippedItem]) -> Outcome:
        retries = self.guard.take_retries()
        records = tuple(skipped)
        if not samples or (self._drop_last and len(samples) < self._want):
            if records or retries:
                # An end carries nothing across from a worker: the last skips go first.
                return Outcome(seq, skipped=records, retries=retries, empty=True)
            return Outcome(seq, end=True)
        try:
            batch = self._collate(samples if self._batched else samples[0])
        except BaseException as error:
            if records:
                error.add_note(f"the batch's skipped items: {[item.key for item in records]!r}")
            return Outcome(seq, error=error, skipped=records, retries=retries)
        # The stream reads ahead of the consumer: a checkpoint needs its state as of each batch.
        return Outcome(seq, batch, skipped=records, retries=retries, stream_state=self._state())

    def _failed(self, seq: int, error: BaseException, skipped: list[SkippedItem]) -> Outcome:
        return Outcome(seq, error=error, skipped=tuple(skipped), retries=self.guard.take_retries())

    def _not_opened(self, seq: int) -> Outcome:
        """A stream that could not be opened: its error once, then the end."""
        error, self._open_error = self._open_error, None
        return Outcome(seq, end=True) if error is None else Outcome(seq, error=error)


async def _async(iterator: Iterator[Any]) -> AsyncIterator[Any]:
    for item in iterator:
        yield item
