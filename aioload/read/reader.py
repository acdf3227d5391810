"""Reading one batch, the same way for every backend.

:class:`BatchReader` is the one piece of code that turns keys into a batch:
the inline backend calls it on the loader's loop or in its fetch threads, a
worker process on its own loop, an executor task wherever the executor runs
it. It

- reads the keys (``__getitems__`` or ``__getitem__`` per key, sync or async,
  through :class:`~aioload.read.fetch.Fetcher`), or the next samples of a stream
  (through :class:`~aioload.read.streams.StreamReader`);
- applies the fault policy (retries, item timeouts, skips) when one is active,
  through one :class:`~aioload.faults.retrier.Retrier`: a
  :class:`~aioload.read.fetch.GuardedFetcher` reads with it, or a stream that opted
  in is handed it as its :class:`~aioload.StreamGuard` (the default path pays
  nothing for either);
- collates what was kept (or the one sample, without automatic batching);
- and returns one :class:`~aioload.backends.base.Outcome` that says
  everything: the batch or the error, the skipped items, the retries, the
  stream's state after the batch, "nothing to deliver", "the stream ended",
  and what the dataset counted of its reads since the previous outcome (a
  dataset with the ``take_source_counts`` hook of :mod:`aioload.stats.source_counts`).

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aioload.collate.core import default_collate
from aioload.collate.errors import name_keys
from aioload.data.protocol import DatasetProtocol
from aioload.data.row_block import batch_stream_of, rows_for_collate, state_snapshot_of
from aioload.faults.guard import StreamGuard
from aioload.faults.policy import FaultPolicy, Skip
from aioload.faults.retrier import Retrier
from aioload.ranks import LauncherRanks
from aioload.read.eager import ItemPool
from aioload.read.fetch import Fetcher, GuardedFetcher
from aioload.read.outcome import Outcome
from aioload.read.streams import StreamReader
from aioload.stats.source_counts import SourceCounts

__all__ = ["BatchReader", "WorkerSetup"]


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
        auto_concurrency: ``concurrency="auto"``: the limit is tuned while reading
            (:mod:`aioload.read.tuning`), up to ``concurrency``.
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
    auto_concurrency: bool = False
    ranks: LauncherRanks | None = None


class BatchReader:
    """Reads batches of one dataset for one epoch of one backend (see the module docstring).

    Args:
        setup: the dataset, collate function and batching options.
        protocol: the dataset's :class:`~aioload.data.protocol.DatasetProtocol`.
        worker: the worker process reading (None: the loader's loop), for skip records.
        collate: collates instead of ``setup.collate_fn`` (a worker collates
            straight into shared memory through it).
        gather: ``gather(getitem, keys)`` reads and collates a batch of a sync map-style
            dataset in one go, instead of ``collate([getitem(key) for key in keys])``; used
            only where that is what it replaces: no fault policy, automatic batching,
            ``__getitem__`` per key, ``setup.collate_fn`` is ``default_collate`` (a worker
            stacks each sample into shared memory as it is read through it).

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
        gather: Callable[[Callable[[Any], Any], Sequence[Any]], Any] | None = None,
    ) -> None:
        self.protocol = protocol
        self.auto_concurrency = setup.auto_concurrency
        self._dataset = setup.dataset
        self._fetcher = fetcher = Fetcher(setup.dataset, protocol)
        self._collate = collate if collate is not None else setup.collate_fn
        if setup.collate_fn is not default_collate:
            # A columnar batch (aioload.data.row_block) reaches the user's collate_fn as torch's
            # list of samples; default_collate takes it by its columns.
            self._collate = rows_for_collate(self._collate)
        self._single = not setup.auto_collation
        getitem = fetcher.getitem_per_key
        self._gather: Callable[[Sequence[Any]], Any] | None = None
        if (
            gather is not None
            and getitem is not None
            and setup.collate_fn is default_collate
            and not self._single
            and not (setup.policy is not None and setup.policy.active)
        ):
            self._gather = functools.partial(gather, getitem)
        self._track = protocol.iterable and setup.track_stream_state
        # A stream's state after each batch: a snapshot made JSON only if a checkpoint asks
        # (aioload.data.row_block), where the dataset can take one.
        snapshot = state_snapshot_of(setup.dataset) if self._track else None
        self._snapshot: Callable[[], Any] | None = snapshot
        # The dataset's source-counts hook (aioload.stats.source_counts), if it has one: only then
        # does an outcome pay for a call.
        take = getattr(setup.dataset, "take_source_counts", None)
        self._take_counts: Callable[[], SourceCounts | None] | None = (
            take if callable(take) else None
        )
        policy = setup.policy
        # The one retrier of this reader's fault policy (None: no policy, nothing guarded).
        self._retrier: Retrier | None = None
        self._guard: GuardedFetcher | None = None
        self._stream: StreamReader | None = None
        if protocol.iterable:
            # A stream under an active policy is read through its guarded_stream (the loader
            # checked at construction that it has one): see aioload.faults.guard.
            guard = StreamGuard(policy, worker) if policy is not None and policy.active else None
            self._retrier = guard
            self._stream = self._open_stream(setup, protocol, guard)
        elif policy is not None and policy.active:
            self._retrier = Retrier(policy, worker)
            self._guard = GuardedFetcher(fetcher, self._retrier)

    def _open_stream(
        self, setup: WorkerSetup, protocol: DatasetProtocol, guard: StreamGuard | None
    ) -> StreamReader:
        batch_size = setup.batch_size if setup.auto_collation else None
        # A stream that cuts its own batches (aioload.data.row_block): one item, one batch.
        batches = (
            batch_stream_of(setup.dataset) if protocol.is_async and batch_size is not None else None
        )
        open_batches: Callable[[StreamGuard | None], Any] | None = None
        if batches is not None:
            open_batches = functools.partial(batches, batch_size, setup.drop_last)
            batch_size = None
        return StreamReader(
            setup.dataset,
            protocol,
            guard=guard,
            batch_size=batch_size,
            drop_last=setup.drop_last,
            collate=self._collate,
            state=self._state,
            open_batches=open_batches,
        )

    def close(self) -> None:
        """The epoch is closing: sync reads waiting to retry give up now (any thread)."""
        if self._retrier is not None:
            self._retrier.close()

    async def aclose(self) -> None:
        """Closes an async stream (after every task reading it has ended)."""
        if self._stream is not None:
            await self._stream.aclose()

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
                keys = _sequence(keys)
                if self._gather is not None:
                    return Outcome(seq, self._gather(keys))
                return Outcome(seq, self._collate(self._fetcher.fetch_sync(keys)))
            results: Sequence[Any]
            if self._single:
                results = [guard.fetch_one_sync(keys)]
            else:
                keys = _sequence(keys)
                results = guard.fetch_sync(keys)
        except BaseException as error:  # SystemExit too: a sync read is never cancelled
            if not self._single:
                name_keys(error, keys)  # a collate error says which key its entry is
            return self._failed(seq, error)
        return self._kept(seq, keys, results)

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

        if not single:
            keys = _sequence(keys)

        def finished(samples: Any, error: BaseException | None) -> None:
            if error is not None:
                done(self._failed(seq, error))
            elif guard is not None:
                done(self._kept(seq, keys, [samples] if single else samples))
            else:
                try:
                    batch = self._collate(samples)
                except BaseException as collate_error:
                    if not single:
                        name_keys(collate_error, keys)
                    done(Outcome(seq, error=collate_error))
                else:
                    done(Outcome(seq, batch))

        reader: Fetcher | GuardedFetcher = guard if guard is not None else self._fetcher
        try:
            if single:
                reader.fetch_one(keys, pool, finished)
            else:
                reader.fetch(keys, pool, finished)
        except BaseException as error:  # __getitem__ raised before returning a coroutine
            done(self._failed(seq, error))

    def _kept(self, seq: int, keys: Any, results: Sequence[Any]) -> Outcome:
        """Collates the samples the fault policy did not skip (``keys``: those of ``results``)."""
        retries = self._take_retries()
        skipped = tuple(result.record for result in results if type(result) is Skip)
        if skipped:
            if not self._single:
                keys = [
                    key
                    for key, result in zip(keys, results, strict=True)
                    if type(result) is not Skip
                ]
            results = [result for result in results if type(result) is not Skip]
            if not results:
                return Outcome(seq, skipped=skipped, retries=retries, empty=True)
        try:
            batch = self._collate(results[0] if self._single else results)
        except BaseException as error:
            if not self._single:
                name_keys(error, keys)
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
        assert self._stream is not None, "the next batch of a map-style dataset"
        outcome = self._stream.next_sync(seq)
        return outcome if self._take_counts is None else self._counted(outcome)

    async def next_async(self, seq: int) -> Outcome:
        """Batch ``seq`` of a stream on the running loop (call one at a time, in order)."""
        assert self._stream is not None, "the next batch of a map-style dataset"
        outcome = await self._stream.next_async(seq)
        return outcome if self._take_counts is None else self._counted(outcome)

    def _state(self) -> Any:
        if self._snapshot is not None:
            return self._snapshot()
        return self._dataset.state_dict() if self._track else None


def _sequence(keys: Any) -> Sequence[Any]:
    """A batch sampler's element as the sequence of keys it is (any iterable of keys)."""
    kind = type(keys)
    if kind is list or kind is tuple or isinstance(keys, Sequence):  # the ABC check is slower
        return keys  # type: ignore[no-any-return]
    return list(keys)
