"""The inline backend (``num_workers=0``): fetches run on the loader's event loop.

- Async datasets are awaited on the loop; the items of every batch in the
  window run concurrently through one :class:`~aioload.eager.ItemPool`, capped
  at ``concurrency`` items in flight.
- Sync datasets are read in a worker thread when the loop belongs to the
  caller (``async for``), so the caller's loop never blocks: one fetch at a
  time, or up to ``concurrency`` threads' worth when the dataset declares
  ``thread_safe = True``. Under the sync facade the loop is aioload's own and
  nothing else runs on it, so a sync fetch is called right there, which is
  cheaper than a thread hop.
- ``collate_fn`` runs where the fetch ran.
- Iterable datasets are read in order, one batch after the other. When the
  loader tracks the stream's state (a dataset with ``state_dict``), the
  dataset's state is taken right after each batch is read, where it was read,
  and handed to ``record_state`` with the batch's number: the stream reads
  ahead of the consumer, so a checkpoint needs the state as of each batch.
- Under an active fault policy (map-style only) a
  :class:`~aioload.fetch.GuardedFetcher` reads instead of the plain fetcher:
  items it skipped travel with their batch's completion (``skipped=``), a
  batch whose every item was skipped completes with nothing to deliver.
  Without a policy none of this is on the path.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, NamedTuple

import anyio.abc

from aioload.backends.base import Completion, when_done_on_loop
from aioload.eager import ItemPool
from aioload.fetch import Fetcher, GuardedFetcher, Skip
from aioload.policy import FaultPolicy, SkippedItem

__all__ = ["InlineBackend"]

_THREADS_FOR_THREAD_SAFE = 8
_END = object()  # a stream ran dry (StopIteration cannot cross a thread's future)
_NOTHING = object()  # every item of a batch was skipped


class _Partial(NamedTuple):
    """A guarded read's result: the batch (or ``_NOTHING``), its skips, or the collate error."""

    batch: Any
    skipped: list[SkippedItem]
    error: BaseException | None


class InlineBackend:
    """Runs an epoch's fetches on the running event loop (see the module docstring).

    Args:
        fetcher: reads the dataset.
        collate_fn: turns a list of samples (or one sample when automatic
            batching is off) into the batch.
        batch_size: samples per batch for iterable datasets, or None when
            automatic batching is off.
        drop_last: drop an iterable dataset's last incomplete batch.
        concurrency: the most async item fetches in flight.
        offload_sync: read sync datasets in a thread (the loop is the caller's).
        task_group: the epoch's scope; every task this backend starts lives in it.
        complete: where results go.
        policy: the fault policy of a map-style dataset (None or inactive:
            torch's behaviour, the first error fails the batch).
        worker_id: the worker process this backend runs in, for skip records.
        record_state: for an iterable dataset, called with each batch's number
            right after the batch was read (see the module docstring).
        on_retry: called (from the thread that reads) each time the fault
            policy tries an item again, for the loader's stats.
    """

    def __init__(
        self,
        fetcher: Fetcher,
        collate_fn: Callable[[Any], Any],
        *,
        batch_size: int | None,
        drop_last: bool,
        concurrency: int,
        offload_sync: bool,
        task_group: anyio.abc.TaskGroup,
        complete: Completion,
        policy: FaultPolicy | None = None,
        worker_id: int | None = None,
        record_state: Callable[[int], None] | None = None,
        on_retry: Callable[[], None] | None = None,
    ) -> None:
        self._fetcher = fetcher
        self._record_state = record_state
        self._collate = collate_fn
        self._batch_size = batch_size
        self._drop_last = drop_last
        self._tg = task_group
        self._complete = complete
        self._exhausted = False
        protocol = fetcher.protocol
        self._is_async = protocol.is_async
        self._guard: GuardedFetcher | None = None
        if policy is not None and policy.active and not protocol.iterable:
            self._guard = GuardedFetcher(fetcher, policy, worker_id, on_retry=on_retry)
        self._offload = offload_sync and not protocol.is_async
        self._pool = ItemPool(concurrency)
        self._loop = asyncio.get_running_loop()
        self._thread_count = (
            min(concurrency, _THREADS_FOR_THREAD_SAFE)
            if protocol.thread_safe and not protocol.iterable
            else 1
        )
        # Created on first use; shut down (threads joined) in aclose().
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._in_thread: set[concurrent.futures.Future[Any]] = set()
        self._sync_stream: Iterator[Any] | None = None
        self._async_stream: AsyncIterator[Any] | None = None
        self._stream_lock = asyncio.Lock()
        if protocol.iterable:
            if protocol.is_async:
                self._async_stream = fetcher.stream()
            else:
                self._sync_stream = fetcher.stream_sync()
            self._submit: Callable[[int, Any], None] = self._submit_stream
        elif self._guard is not None:
            if self._is_async:
                self._submit = self._submit_guarded_async
            elif self._offload:
                self._submit = self._submit_guarded_threaded
            else:
                self._submit = self._submit_guarded_now
        elif self._is_async:
            self._submit = self._submit_async
        elif self._offload:
            self._submit = self._submit_threaded
        else:
            self._submit = self._submit_now

    @property
    def exhausted(self) -> bool:
        return self._exhausted

    def submit(self, seq: int, keys: Any) -> None:
        self._submit(seq, keys)

    async def aclose(self) -> None:
        if self._guard is not None:
            self._guard.close()  # sync reads waiting to retry give up now
        await self._pool.aclose()
        stream = self._async_stream
        if stream is not None and hasattr(stream, "aclose"):
            await stream.aclose()
        executor = self._executor
        if executor is not None:
            # A sync fetch cannot be interrupted: wait (without blocking the loop)
            # for the ones running, drop the queued ones, then join the threads.
            executor.shutdown(wait=False, cancel_futures=True)
            running = [asyncio.wrap_future(f) for f in self._in_thread if not f.done()]
            if running:
                await asyncio.wait(running)
            executor.shutdown(wait=True)

    def _in_thread_call(self, seq: int, read: Callable[..., Any], *args: Any) -> None:
        """Runs ``read(*args)`` in the backend's threads; its result completes batch ``seq``."""
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                self._thread_count, thread_name_prefix="aioload-fetch"
            )
        future = self._executor.submit(read, *args)
        self._in_thread.add(future)
        when_done_on_loop(future, self._loop, self._thread_done, seq)

    def _thread_done(self, seq: int, future: concurrent.futures.Future[Any]) -> None:
        self._in_thread.discard(future)
        if future.cancelled():
            return
        error = future.exception()
        if error is not None:
            self._complete(seq, error=error)
        elif self._fetcher.protocol.iterable:
            self._deliver_stream_batch(seq, future.result())
        elif self._guard is not None:
            self._deliver_guarded(seq, future.result())
        else:
            self._complete(seq, future.result())

    # -- map-style -------------------------------------------------------

    def _single(self, keys: Any) -> bool:
        """Whether ``keys`` is one key (automatic batching off)."""
        return self._batch_size is None and not isinstance(keys, list)

    def _read_sync(self, keys: Any) -> Any:
        if self._single(keys):
            return self._collate(self._fetcher.fetch_one_sync(keys))
        return self._collate(self._fetcher.fetch_sync(keys))

    def _submit_now(self, seq: int, keys: Any) -> None:
        try:
            batch = self._read_sync(keys)
        except Exception as error:
            self._complete(seq, error=error)
        else:
            self._complete(seq, batch)

    def _submit_threaded(self, seq: int, keys: Any) -> None:
        self._in_thread_call(seq, self._read_sync, keys)

    def _submit_async(self, seq: int, keys: Any) -> None:
        def done(samples: Any, error: BaseException | None) -> None:
            if error is None:
                try:
                    batch = self._collate(samples)
                except Exception as collate_error:
                    error = collate_error
                else:
                    self._complete(seq, batch)
                    return
            self._complete(seq, error=error)

        try:
            if self._single(keys):
                self._fetcher.fetch_one(keys, self._pool, done)
            else:
                self._fetcher.fetch(keys, self._pool, done)
        except Exception as error:  # __getitem__ itself raised before returning a coroutine
            self._complete(seq, error=error)

    # -- map-style under a fault policy -------------------------------------

    def _read_guarded_sync(self, keys: Any) -> _Partial:
        guard = self._guard
        assert guard is not None
        if self._single(keys):
            return self._collate_kept([guard.fetch_one_sync(keys)], single=True)
        return self._collate_kept(guard.fetch_sync(keys), single=False)

    def _collate_kept(self, results: list[Any], single: bool) -> _Partial:
        """Collates the samples that were not skipped (where the read ran)."""
        skipped = [result.record for result in results if type(result) is Skip]
        if skipped:
            results = [result for result in results if type(result) is not Skip]
            if not results:
                return _Partial(_NOTHING, skipped, None)
        try:
            batch = self._collate(results[0] if single else results)
        except Exception as error:
            return _Partial(None, skipped, error)
        return _Partial(batch, skipped, None)

    def _deliver_guarded(self, seq: int, partial: _Partial) -> None:
        if partial.error is not None:
            self._complete(seq, error=partial.error, skipped=partial.skipped)
        elif partial.batch is _NOTHING:
            self._complete(seq, exhausted=True, skipped=partial.skipped)
        else:
            self._complete(seq, partial.batch, skipped=partial.skipped)

    def _submit_guarded_now(self, seq: int, keys: Any) -> None:
        try:
            partial = self._read_guarded_sync(keys)
        except Exception as error:  # on_error='raise': the item's error
            self._complete(seq, error=error)
        else:
            self._deliver_guarded(seq, partial)

    def _submit_guarded_threaded(self, seq: int, keys: Any) -> None:
        self._in_thread_call(seq, self._read_guarded_sync, keys)

    def _submit_guarded_async(self, seq: int, keys: Any) -> None:
        guard = self._guard
        assert guard is not None
        single = self._single(keys)

        def done(samples: Any, error: BaseException | None) -> None:
            if error is not None:
                self._complete(seq, error=error)
            else:
                self._deliver_guarded(
                    seq, self._collate_kept([samples] if single else samples, single)
                )

        if single:
            guard.fetch_one(keys, self._pool, done)
        else:
            guard.fetch(keys, self._pool, done)

    # -- iterable --------------------------------------------------------

    def _submit_stream(self, seq: int, keys: Any) -> None:
        if self._async_stream is not None:
            self._tg.start_soon(self._stream_batch, seq)
        elif self._offload:
            # One thread for a stream: its batches are read one after the other.
            self._in_thread_call(seq, self._next_sync_batch, seq)
        else:
            self._finish_stream(seq)

    async def _stream_batch(self, seq: int) -> None:
        # The lock is FIFO, so batches leave the stream in submission order.
        async with self._stream_lock:
            if self._exhausted:
                self._complete(seq, exhausted=True)
            else:
                await self._finish_stream_async(seq)

    def _finish_stream(self, seq: int) -> None:
        if self._exhausted:
            self._complete(seq, exhausted=True)
            return
        try:
            batch = self._next_sync_batch(seq)
        except Exception as error:
            self._complete(seq, error=error)
        else:
            self._deliver_stream_batch(seq, batch)

    def _deliver_stream_batch(self, seq: int, batch: Any) -> None:
        if batch is _END:
            self._exhausted = True
            self._complete(seq, exhausted=True)
        else:
            self._complete(seq, batch)

    def _next_sync_batch(self, seq: int) -> Any:
        """Batch ``seq``: the next batch of a sync stream, or ``_END`` when there is none."""
        stream = self._sync_stream
        assert stream is not None
        if self._batch_size is None:
            sample = next(stream, _END)
            if sample is _END:
                return _END
            if self._record_state is not None:
                self._record_state(seq)
            return self._collate(sample)
        samples = []
        for sample in stream:
            samples.append(sample)
            if len(samples) == self._batch_size:
                break
        if self._record_state is not None and samples:
            self._record_state(seq)
        return self._collate_stream_batch(samples)

    async def _finish_stream_async(self, seq: int) -> None:
        stream = self._async_stream
        assert stream is not None
        try:
            if self._batch_size is None:
                sample = await anext(stream, _END)
                if sample is not _END and self._record_state is not None:
                    self._record_state(seq)
                batch = sample if sample is _END else self._collate(sample)
            else:
                samples = []
                async for sample in stream:
                    samples.append(sample)
                    if len(samples) == self._batch_size:
                        break
                if self._record_state is not None and samples:
                    self._record_state(seq)
                batch = self._collate_stream_batch(samples)
        except Exception as error:
            self._complete(seq, error=error)
        else:
            self._deliver_stream_batch(seq, batch)

    def _collate_stream_batch(self, samples: list[Any]) -> Any:
        if not samples or (self._drop_last and len(samples) < (self._batch_size or 0)):
            return _END
        return self._collate(samples)
