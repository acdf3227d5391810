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
- Iterable datasets are read in order, one batch after the other.
- What a batch is — read, fault policy, collate, its outcome — is the
  :class:`~aioload.backends.reader.BatchReader`'s business; this backend only
  decides where and when the reader runs.

A worker process runs this same backend on its own loop (see
:mod:`aioload.backends.worker_process`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from typing import Any

import anyio.abc

from aioload.backends.base import Outcome, OutcomeSink
from aioload.backends.reader import BatchReader
from aioload.backends.threads import when_done_on_loop
from aioload.eager import ItemPool

__all__ = ["THREADS_FOR_THREAD_SAFE", "InlineBackend"]

THREADS_FOR_THREAD_SAFE = 8
"""Fetch threads a ``thread_safe`` sync dataset is read by at most."""


class InlineBackend:
    """Runs an epoch's fetches on the running event loop (see the module docstring).

    Args:
        reader: reads and collates one batch.
        concurrency: the most async item fetches in flight.
        offload_sync: read sync datasets in a thread (the loop is the caller's,
            or a sync read's retries must not hold the loop up).
        task_group: the epoch's scope; every task this backend starts lives in it.
        sink: where outcomes go.
    """

    def __init__(
        self,
        reader: BatchReader,
        *,
        concurrency: int,
        offload_sync: bool,
        task_group: anyio.abc.TaskGroup,
        sink: OutcomeSink,
    ) -> None:
        self._reader = reader
        self._tg = task_group
        self._deliver = sink.deliver
        self._exhausted = False
        protocol = reader.protocol
        self._offload = offload_sync and not protocol.is_async
        self._pool = ItemPool(concurrency)
        self._loop = asyncio.get_running_loop()
        self._thread_count = (
            min(concurrency, THREADS_FOR_THREAD_SAFE)
            if protocol.thread_safe and not protocol.iterable
            else 1
        )
        # Created on first use; shut down (threads joined) in aclose().
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._in_thread: set[concurrent.futures.Future[Any]] = set()
        self._stream_lock = asyncio.Lock()
        self.submit: Callable[[int, Any], None]
        if protocol.iterable:
            self.submit = self._submit_stream
        elif protocol.is_async:
            self.submit = self._submit_async
        elif self._offload:
            self.submit = self._submit_threaded
        else:
            self.submit = self._submit_now

    @property
    def exhausted(self) -> bool:
        return self._exhausted

    async def aclose(self) -> None:
        self._reader.close()  # sync reads waiting to retry give up now
        await self._pool.aclose()
        await self._reader.aclose()
        executor = self._executor
        if executor is not None:
            # A sync fetch cannot be interrupted: wait (without blocking the loop)
            # for the ones running, drop the queued ones, then join the threads.
            executor.shutdown(wait=False, cancel_futures=True)
            running = [asyncio.wrap_future(f) for f in self._in_thread if not f.done()]
            if running:
                await asyncio.wait(running)
            executor.shutdown(wait=True)

    # -- map-style -------------------------------------------------------

    def _submit_now(self, seq: int, keys: Any) -> None:
        self._deliver(self._reader.read_sync(seq, keys))

    def _submit_threaded(self, seq: int, keys: Any) -> None:
        self._in_thread_call(seq, self._reader.read_sync, seq, keys)

    def _submit_async(self, seq: int, keys: Any) -> None:
        self._reader.read_async(seq, keys, self._pool, self._deliver)

    # -- iterable --------------------------------------------------------

    def _submit_stream(self, seq: int, keys: Any) -> None:
        if self._reader.protocol.is_async:
            self._tg.start_soon(self._stream_batch, seq)
        elif self._exhausted:
            self._deliver(Outcome(seq, end=True))
        elif self._offload:
            # One thread for a stream: its batches are read one after the other.
            self._in_thread_call(seq, self._reader.next_sync, seq)
        else:
            self._deliver_stream(self._reader.next_sync(seq))

    async def _stream_batch(self, seq: int) -> None:
        # The lock is FIFO, so batches leave the stream in submission order.
        async with self._stream_lock:
            if self._exhausted:
                self._deliver(Outcome(seq, end=True))
            else:
                self._deliver_stream(await self._reader.next_async(seq))

    def _deliver_stream(self, outcome: Outcome) -> None:
        if outcome.end:
            self._exhausted = True
        self._deliver(outcome)

    # -- threads ---------------------------------------------------------

    def _in_thread_call(self, seq: int, read: Callable[..., Outcome], *args: Any) -> None:
        """Runs ``read(*args)`` in the backend's threads; its outcome completes batch ``seq``."""
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                self._thread_count, thread_name_prefix="aioload-fetch"
            )
        future = self._executor.submit(read, *args)
        self._in_thread.add(future)
        when_done_on_loop(future, self._loop, self._thread_done, seq)

    def _thread_done(self, seq: int, future: concurrent.futures.Future[Outcome]) -> None:
        self._in_thread.discard(future)
        if future.cancelled():
            return
        error = future.exception()
        if error is not None:  # the reader returns its errors; this is anything else
            self._deliver(Outcome(seq, error=error))
        else:
            self._deliver_stream(future.result())
