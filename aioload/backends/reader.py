"""Reading one batch, the same way for every backend.

:class:`BatchReader` is the one piece of code that turns keys into a batch:
the inline backend calls it on the loader's loop or in its fetch threads, a
worker process on its own loop, an executor task wherever the executor runs
it. It

- reads the keys (``__getitems__`` or ``__getitem__`` per key, sync or async,
  through :class:`~aioload.fetch.Fetcher`), or the next samples of a stream;
- applies the fault policy (retries, item timeouts, skips) through a
  :class:`~aioload.fetch.GuardedFetcher` (over the one retry loop,
  :class:`~aioload.retrier.Retrier`) when one is active, or for a stream
  that opted in through a :class:`~aioload.backends.guarded_stream.GuardedStream`
  (the default path pays nothing for either);
- collates what was kept (or the one sample, without automatic batching);
- and returns one :class:`~aioload.backends.base.Outcome` that says
  everything: the batch or the error, the skipped items, the retries, the
  stream's state after the batch, "nothing to deliver", "the stream ended",
  and what the dataset counted of its reads since the previous outcome (a
  dataset with the ``take_source_counts`` hook of :mod:`aioload.source_stats`).

Every error of a read is its batch's outcome, ``SystemExit`` and
``KeyboardInterrupt`` raised by the dataset included (only cancellations
propagate): the consumer gets it as itself, and a worker process or an
executor's task lives on. A stream that cannot even be opened (its
``__iter__`` or ``__aiter__`` raised) fails its first batch the same way and
then has ended.

One key or many: with automatic batching (a batch sampler) every element the
sampler yields is a sequence of keys; without it every element is one key,
whatever its type (a tuple or a list is one key then), as in torch.

:class:`WorkerSetup` is what it needs (and what every worker receives once).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from aioload.backends.base import Outcome
from aioload.backends.guarded_stream import GuardedStream
from aioload.collate import default_collate
from aioload.eager import ItemPool
from aioload.fetch import DatasetProtocol, Fetcher, GuardedFetcher
from aioload.groups import reported
from aioload.policy import FaultPolicy
from aioload.ranks import LauncherRanks
from aioload.retrier import Retrier, Skip
from aioload.row_block import batch_stream_of, rows_for_collate
from aioload.source_stats import SourceCounts

__all__ = ["BatchReader", "WorkerSetup"]

_END = object()  # a stream ran dry


@dataclass(frozen=True)
class WorkerSetup:
    """What reading a loader's batches needs; every worker receives it once per start.

    Attributes:
        dataset: the dataset (each worker process works on its own copy).
        collate_fn: merges samples into a batch, where they were read.
        worker_init_fn: called with the worker id after seeding, or None.
        batch_size: samples per batch of an iterable dataset (None: no
            automatic batching).
        auto_collation: automatic batching: a map-style dataset's keys come in
            sequences (from a batch sampler), an iterable's samples are batched.
        drop_last: drop each worker's last incomplete batch (iterable datasets).
        concurrency: the most item fetches in flight on one event loop.
        num_workers: how many workers the loader has.
        policy: the loader's fault policy (None: torch's behaviour).
        track_stream_state: an iterable dataset with ``state_dict``: take its
            state after each batch (for checkpoints).
        ranks: the loader process's rank and world size as its launcher set them
            up (:func:`~aioload.ranks.launcher_ranks`), what a worker answers for
            them (a worker started by ``spawn`` or a fork server has no
            ``torch.distributed`` group of its own); None: the worker reads its
            own environment.
    """

    dataset: Any
    collate_fn: Callable[[Any], Any]
    worker_init_fn: Callable[[int], None] | None
    batch_size: int | None
    auto_collation: bool
    drop_last: bool
    concurrency: int
    num_workers: int
    policy: FaultPolicy | None = None
    track_stream_state: bool = False
    ranks: LauncherRanks | None = None


class BatchReader:
    """Reads batches of one dataset for one epoch of one backend (see the module docstring).

    Args:
        setup: the dataset, collate function and batching options.
        protocol: the dataset's :class:`~aioload.fetch.DatasetProtocol`.
        worker: the worker process reading (None: the loader's loop), for skip records.
        collate: collates instead of ``setup.collate_fn`` (a worker collates
            straight into shared memory through it).

    Map-style: :meth:`read_sync` (sync datasets) and :meth:`read_async` (any,
    on a running loop). Iterable: :meth:`next_sync` (sync streams) and
    :meth:`next_async` (any, on a running loop); the stream is opened here.

    Example::

        reader = BatchReader(setup, inspect_dataset(setup.dataset))
        outcome = reader.read_sync(0, [0, 1, 2, 3])
        outcome.batch        # the collated batch, or outcome.error
    """

    def __init__(
        self,
        setup: WorkerSetup,
        protocol: DatasetProtocol,
        *,
        worker: int | None = None,
        collate: Callable[[Any], Any] | None = None,
    ) -> None:
        self.protocol = protocol
        self._dataset = setup.dataset
        self._fetcher = fetcher = Fetcher(setup.dataset, protocol)
        self._collate = collate if collate is not None else setup.collate_fn
        if setup.collate_fn is not default_collate:
            # A columnar batch (aioload.row_block) reaches the user's collate_fn as torch's
            # list of samples; default_collate takes it by its columns.
            self._collate = rows_for_collate(self._collate)
        self._single = not setup.auto_collation
        self._batch_size = setup.batch_size if setup.auto_collation else None
        self._drop_last = setup.drop_last
        # A stream that cuts its own batches (aioload.row_block): one item, one batch.
        batches = (
            batch_stream_of(setup.dataset)
            if protocol.iterable and protocol.is_async and self._batch_size is not None
            else None
        )
        open_batches: Callable[[Any], Any] | None = None
        if batches is not None:
            open_batches = functools.partial(batches, self._batch_size, self._drop_last)
            self._batch_size = None
        self._track = protocol.iterable and setup.track_stream_state
        # The dataset's source-counts hook (aioload.source_stats), if it has one: only then
        # does an outcome pay for a call.
        take = getattr(setup.dataset, "take_source_counts", None)
        self._take_counts: Callable[[], SourceCounts | None] | None = (
            take if callable(take) else None
        )
        policy = setup.policy
        # The one retrier of a map-style dataset's fault policy (None: nothing guarded).
        self._retrier: Retrier | None = None
        self._guard: GuardedFetcher | None = None
        if policy is not None and policy.active and not protocol.iterable:
            self._retrier = Retrier(policy, worker)
            self._guard = GuardedFetcher(fetcher, self._retrier)
        self._sync_stream: Iterator[Any] | None = None
        self._async_stream: AsyncIterator[Any] | None = None
        # Why the stream could not be opened: the first batch's error, then the end.
        self._open_error: BaseException | None = None
        self._open_failed = False
        # A stream under an active policy is read through its guarded_stream (the loader
        # checked at construction that it has one): see aioload.stream_faults.
        self._guarded: GuardedStream | None = None
        if protocol.iterable and policy is not None and policy.active:
            self._guarded = GuardedStream(
                setup.dataset,
                protocol,
                policy,
                worker=worker,
                batch_size=self._batch_size,
                drop_last=self._drop_last and open_batches is None,
                collate=self._collate,
                state=self._state,
                open_stream=open_batches,
            )
        elif protocol.iterable:
            try:
                if open_batches is not None:
                    self._async_stream = open_batches(None)
                elif protocol.is_async:
                    self._async_stream = fetcher.stream()
                else:
                    self._sync_stream = fetcher.stream_sync()
            except BaseException as error:
                # Raised here it would fail the epoch's (or the worker's) task group
                # as a group; as the first batch's outcome it reaches the consumer as is.
                method = "__aiter__" if protocol.is_async else "__iter__"
                error.add_note(f"raised while opening the dataset's stream ({method})")
                self._open_error, self._open_failed = error, True

    def close(self) -> None:
        """The epoch is closing: sync reads waiting to retry give up now (any thread)."""
        if self._retrier is not None:
            self._retrier.close()
        if self._guarded is not None:
            self._guarded.close()

    async def aclose(self) -> None:
        """Closes an async stream (after every task reading it has ended)."""
        if self._guarded is not None:
            await self._guarded.aclose()
        stream = self._async_stream
        if stream is not None and hasattr(stream, "aclose"):
            await stream.aclose()

    # -- map-style ------------------------------------------------------------

    def read_sync(self, seq: int, keys: Any) -> Outcome:
        """Batch ``seq`` of a sync map-style dataset, read and collated here."""
        outcome = self._read_sync(seq, keys)
        return outcome if self._take_counts is None else self._counted(outcome)

    def _read_sync(self, seq: int, keys: Any) -> Outcome:
        guard = self._guard
        try:
            if guard is None:
                if self._single:
                    return Outcome(seq, self._collate(self._fetcher.fetch_one_sync(keys)))
                return Outcome(seq, self._collate(self._fetcher.fetch_sync(_sequence(keys))))
            results: Sequence[Any]
            if self._single:
                results = [guard.fetch_one_sync(keys)]
            else:
                results = guard.fetch_sync(_sequence(keys))
        except BaseException as error:  # SystemExit too: a sync read is never cancelled
            return self._failed(seq, error)
        return self._kept(seq, results)

    def read_async(
        self, seq: int, keys: Any, pool: ItemPool, done: Callable[[Outcome], None]
    ) -> None:
        """Reads batch ``seq`` on the running loop through ``pool``; ``done(outcome)`` once.

        ``done`` may be called before this returns (items that did not suspend).
        """
        if self._take_counts is not None:
            done = functools.partial(self._deliver_counted, done)
        guard = self._guard
        single = self._single

        def finished(samples: Any, error: BaseException | None) -> None:
            if error is not None:
                done(self._failed(seq, error))
            elif guard is not None:
                done(self._kept(seq, [samples] if single else samples))
            else:
                try:
                    batch = self._collate(samples)
                except BaseException as collate_error:
                    done(Outcome(seq, error=collate_error))
                else:
                    done(Outcome(seq, batch))

        reader: Fetcher | GuardedFetcher = guard if guard is not None else self._fetcher
        try:
            if single:
                reader.fetch_one(keys, pool, finished)
            else:
                reader.fetch(_sequence(keys), pool, finished)
        except BaseException as error:  # __getitem__ raised before returning a coroutine
            done(self._failed(seq, error))

    def _kept(self, seq: int, results: Sequence[Any]) -> Outcome:
        """Collates the samples the fault policy did not skip."""
        retries = self._take_retries()
        skipped = tuple(result.record for result in results if type(result) is Skip)
        if skipped:
            results = [result for result in results if type(result) is not Skip]
            if not results:
                return Outcome(seq, skipped=skipped, retries=retries, empty=True)
        try:
            batch = self._collate(results[0] if self._single else results)
        except BaseException as error:
            if skipped:
                error.add_note(f"the batch's skipped items: {[item.key for item in skipped]!r}")
            return Outcome(seq, error=error, skipped=skipped, retries=retries)
        return Outcome(seq, batch, skipped=skipped, retries=retries)

    def _failed(self, seq: int, error: BaseException) -> Outcome:
        return Outcome(seq, error=error, retries=self._take_retries())

    def _counted(self, outcome: Outcome) -> Outcome:
        """``outcome`` with the dataset's source counts since the previous one."""
        assert self._take_counts is not None
        try:
            counts = self._take_counts()
        except Exception:  # a broken hook must not cost a batch: its counts are lost
            return outcome
        return outcome if counts is None else outcome._replace(counts=counts)

    def _deliver_counted(self, done: Callable[[Outcome], None], outcome: Outcome) -> None:
        done(self._counted(outcome))

    def _take_retries(self) -> int:
        """The retries since the last outcome, which this outcome reports."""
        return 0 if self._retrier is None else self._retrier.take_retries()

    # -- iterable -------------------------------------------------------------

    def next_sync(self, seq: int) -> Outcome:
        """Batch ``seq``: the next batch of a sync stream (``end`` once there is none)."""
        outcome = self._next_sync(seq)
        return outcome if self._take_counts is None else self._counted(outcome)

    def _next_sync(self, seq: int) -> Outcome:
        if self._guarded is not None:
            return self._guarded.next_sync(seq)
        stream = self._sync_stream
        if stream is None:
            return self._not_opened(seq)
        try:
            if self._batch_size is None:
                sample = next(stream, _END)
                if sample is _END:
                    return Outcome(seq, end=True)
                state = self._state()
                return Outcome(seq, self._collate(sample), stream_state=state)
            samples = list(itertools.islice(stream, self._batch_size))
            return self._stream_batch(seq, samples)
        except BaseException as error:
            return Outcome(seq, error=error)

    async def next_async(self, seq: int) -> Outcome:
        """Batch ``seq`` of a stream on the running loop (call one at a time, in order)."""
        outcome = await self._next_async(seq)
        return outcome if self._take_counts is None else self._counted(outcome)

    async def _next_async(self, seq: int) -> Outcome:
        if self._guarded is not None:
            return await self._guarded.next_async(seq)
        stream = self._async_stream
        if stream is None:
            return self._not_opened(seq)
        try:
            if self._batch_size is None:
                sample = await anext(stream, _END)
                if sample is _END:
                    return Outcome(seq, end=True)
                state = self._state()
                return Outcome(seq, self._collate(sample), stream_state=state)
            samples = []
            async for sample in stream:
                samples.append(sample)
                if len(samples) == self._batch_size:
                    break
            return self._stream_batch(seq, samples)
        except BaseException as error:
            if not reported(error):
                raise  # the epoch is being cancelled
            return Outcome(seq, error=error)

    def _not_opened(self, seq: int) -> Outcome:
        """A stream that could not be opened: its error once, then the end."""
        assert self._open_failed, "next batch of a stream that was never opened"
        error, self._open_error = self._open_error, None
        return Outcome(seq, end=True) if error is None else Outcome(seq, error=error)

    def _stream_batch(self, seq: int, samples: list[Any]) -> Outcome:
        if not samples or (self._drop_last and len(samples) < (self._batch_size or 0)):
            return Outcome(seq, end=True)
        # The stream reads ahead of the consumer: a checkpoint needs its state as of each batch.
        state = self._state()
        return Outcome(seq, self._collate(samples), stream_state=state)

    def _state(self) -> Any:
        return self._dataset.state_dict() if self._track else None


def _sequence(keys: Any) -> Sequence[Any]:
    """A batch sampler's element as the sequence of keys it is (any iterable of keys)."""
    kind = type(keys)
    if kind is list or kind is tuple or isinstance(keys, Sequence):  # the ABC check is slower
        return keys  # type: ignore[no-any-return]
    return list(keys)
