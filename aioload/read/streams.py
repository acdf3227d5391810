"""Reading an iterable dataset's batches, with the fault policy or without it.

:class:`StreamReader` is what :class:`~aioload.read.reader.BatchReader` reads a
stream through, one per epoch (per worker). It opens the stream once — ``iter(dataset)``
or ``aiter(dataset)`` without a policy, ``dataset.guarded_stream(guard)`` under an
active one (see :mod:`aioload.faults.guard`), or a stream that cuts its own batches
(:mod:`aioload.data.row_block`) — and fills each batch with samples, collates it and takes
the stream's state after it (for checkpoints). A stream that cannot be opened fails its
first batch with the error, then has ended.

Under the policy the stream yields skip markers where it gave a sample up: they take no
place in a batch (the reader reads on until the batch is full); their records and the
guard's retries travel in the batch's outcome. The skips met before a batch is full are
reported early, in an outcome with nothing to deliver (the samples already read wait for
the next batch), once there are :data:`SKIPS_PER_OUTCOME` of them or once this stream
alone is past ``max_skipped``: a stream that only skips (every shard missing, say) is
stopped by ``max_skipped``, and its records do not pile up unreported. The last skips of
a stream likewise come in an outcome of their own before its end.

Every error of a batch — the stream's, the collate function's, the state's — is that
batch's outcome; only a cancellation propagates.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from aioload.data.protocol import DatasetProtocol
from aioload.faults.guard import StreamGuard
from aioload.faults.policy import Skip, SkippedItem
from aioload.groups import reported
from aioload.read.outcome import Outcome

__all__ = ["SKIPS_PER_OUTCOME", "StreamReader"]

SKIPS_PER_OUTCOME = 64
"""The most skip records one outcome holds; more are reported in outcomes of their own."""


class StreamReader:
    """One epoch's batches of an iterable dataset (see the module docstring).

    Args:
        dataset: the iterable dataset.
        protocol: its protocol (async: read with :meth:`next_async`, else :meth:`next_sync`).
        guard: the fault policy's guard the stream is opened with (it has
            ``guarded_stream``); None: no policy, the stream is iterated as usual.
        batch_size: samples per batch (None: no automatic batching, one sample each).
        drop_last: drop the stream's last incomplete batch.
        collate: merges a batch's samples (or converts the one sample).
        state: the stream's state after a batch (a checkpoint's), or None.
        open_batches: opens a stream that cuts its own batches, given the guard (see
            :mod:`aioload.data.row_block`; with ``batch_size`` None: each of its items is a
            whole batch).

    Example::

        stream = StreamReader(dataset, inspect_dataset(dataset), guard=None, batch_size=32,
                              drop_last=False, collate=default_collate, state=lambda: None)
        outcome = stream.next_sync(0)   # outcome.batch, outcome.skipped, outcome.retries
    """

    def __init__(
        self,
        dataset: Any,
        protocol: DatasetProtocol,
        *,
        guard: StreamGuard | None,
        batch_size: int | None,
        drop_last: bool,
        collate: Callable[[Any], Any],
        state: Callable[[], Any],
        open_batches: Callable[[StreamGuard | None], Any] | None = None,
    ) -> None:
        self.guard = guard
        self._batched = batch_size is not None
        self._want = batch_size or 1
        self._drop_last = drop_last and batch_size is not None
        self._collate = collate
        self._state = state
        self._carry: list[Any] = []  # samples read for a batch whose skips went out first
        self._ended = False
        self._sync: Iterator[Any] | None = None
        self._async: AsyncIterator[Any] | None = None
        self._open_error: BaseException | None = None
        try:
            self._open(dataset, protocol, open_batches)
        except BaseException as error:
            # Raised here it would fail the epoch's (or the worker's) task group as a
            # group; as the first batch's outcome it reaches the consumer as is.
            method = (
                "guarded_stream"
                if guard is not None
                else "__aiter__"
                if protocol.is_async
                else "__iter__"
            )
            error.add_note(f"raised while opening the dataset's stream ({method})")
            self._open_error = error
            self._ended = True

    def _open(
        self,
        dataset: Any,
        protocol: DatasetProtocol,
        open_batches: Callable[[StreamGuard | None], Any] | None,
    ) -> None:
        guard = self.guard
        if open_batches is not None:  # (an async dataset's)
            stream = open_batches(guard)
        elif guard is not None:
            stream = dataset.guarded_stream(guard)
        elif protocol.is_async:
            stream = aiter(dataset)
        else:
            self._sync = iter(dataset)
            return
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

    async def aclose(self) -> None:
        """Closes an async stream (after every task reading it has ended)."""
        stream = self._async
        if stream is not None and hasattr(stream, "aclose"):
            await stream.aclose()

    def next_sync(self, seq: int) -> Outcome:
        """Batch ``seq`` of a sync stream: samples only, its skips and retries beside them."""
        stream = self._sync
        if stream is None:
            return self._not_opened(seq)
        samples, self._carry = self._carry, []
        skipped: list[SkippedItem] = []
        want = self._want
        try:
            if self._ended:
                pass
            elif self.guard is None:
                # No policy, no markers: the samples as the stream gives them.
                samples = list(itertools.islice(stream, want))
                self._ended = len(samples) < want
            else:
                # (Fewer than ``want`` samples carried: the loop reads at least one item.)
                for item in stream:
                    if type(item) is not Skip:
                        samples.append(item)
                        if len(samples) == want:
                            break
                    elif (early := self._skipped(seq, item, samples, skipped)) is not None:
                        return early
                else:
                    self._ended = True
            return self._batch(seq, samples, skipped)
        except BaseException as error:  # a sync read is never cancelled
            return self._failed(seq, error, skipped)

    async def next_async(self, seq: int) -> Outcome:
        """Batch ``seq`` of a stream on the running loop (one call at a time, in order)."""
        stream = self._async
        if stream is None:
            return self._not_opened(seq)
        samples, self._carry = self._carry, []
        skipped: list[SkippedItem] = []
        want = self._want
        try:
            if not self._ended:
                # (Fewer than ``want`` samples carried: the loop reads at least one item.)
                async for item in stream:
                    if type(item) is not Skip:
                        samples.append(item)
                        if len(samples) == want:
                            break
                    elif (early := self._skipped(seq, item, samples, skipped)) is not None:
                        return early
                else:
                    self._ended = True
            return self._batch(seq, samples, skipped)
        except BaseException as error:
            if not reported(error):
                raise  # the epoch is being cancelled
            return self._failed(seq, error, skipped)

    # -- outcomes ----------------------------------------------------------------

    def _skipped(
        self, seq: int, marker: Skip, samples: list[Any], skipped: list[SkippedItem]
    ) -> Outcome | None:
        """Puts ``marker``'s record with the batch's skips; an outcome to return early, if due."""
        skipped.append(marker.record)
        assert self.guard is not None, "a skip marker from a stream read without the policy"
        past_limit = self.guard.count_skip()
        if (len(skipped) >= SKIPS_PER_OUTCOME or past_limit) and len(samples) < self._want:
            # The skips so far, with nothing to deliver; the samples wait for the next batch.
            self._carry = samples
            return Outcome(seq, skipped=tuple(skipped), retries=self._retries(), empty=True)
        return None

    def _batch(self, seq: int, samples: list[Any], skipped: list[SkippedItem]) -> Outcome:
        retries = self._retries()
        records = tuple(skipped)
        if not samples or (self._drop_last and len(samples) < self._want):
            if records or retries:
                # An end carries nothing across from a worker: the last skips go first.
                return Outcome(seq, skipped=records, retries=retries, empty=True)
            return Outcome(seq, end=True)
        try:
            batch = self._collate(samples if self._batched else samples[0])
            # The stream reads ahead of the consumer: a checkpoint needs its state as of
            # each batch.
            state = self._state()
        except BaseException as error:
            if records:
                error.add_note(f"the batch's skipped items: {[item.key for item in records]!r}")
            return Outcome(seq, error=error, skipped=records, retries=retries)
        return Outcome(seq, batch, skipped=records, retries=retries, stream_state=state)

    def _failed(self, seq: int, error: BaseException, skipped: list[SkippedItem]) -> Outcome:
        return Outcome(seq, error=error, skipped=tuple(skipped), retries=self._retries())

    def _retries(self) -> int:
        return 0 if self.guard is None else self.guard.take_retries()

    def _not_opened(self, seq: int) -> Outcome:
        """A stream that could not be opened: its error once, then the end."""
        error, self._open_error = self._open_error, None
        return Outcome(seq, end=True) if error is None else Outcome(seq, error=error)


async def _async(iterator: Iterator[Any]) -> AsyncIterator[Any]:
    for item in iterator:
        yield item
