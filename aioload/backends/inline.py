"""The inline backend (``num_workers=0``): fetches run on the loader's event loop.

- Async datasets are awaited on the loop; the items of every batch in the
  window run concurrently through one :class:`~aioload.read.eager.ItemPool`, capped
  at ``concurrency`` items in flight. Under ``concurrency="auto"`` that cap is tuned
  as items finish (:class:`~aioload.read.tuning.AutoConcurrency`), and the outcomes
  carry the new cap and the throttles seen to the loader's stats.
- Sync datasets are read in a worker thread when the loop belongs to the
  caller (``async for``), so the caller's loop never blocks: one fetch at a
  time, or up to ``concurrency`` threads' worth when the dataset declares
  ``thread_safe = True``. Under the sync facade the loop is aioload's own and
  nothing else runs on it, so a sync fetch is called right there, which is
  cheaper than a thread hop.
  The sync facade reads in a thread too when the loader has a ``timeout``,
  so that a read that never returns can be left behind (below).
- Iterable datasets are read in order, one batch after the other (an async stream by
  one task for the epoch, which takes the batches as they are submitted).
- Closing waits for the sync reads still running (they cannot be
  interrupted) — unless the epoch is *abandoned* (its consumer timed out, or
  was interrupted): then a running read is left to finish in its daemon
  thread, renamed ``aioload-abandoned``, its result dropped, as the fault
  policy's ``item_timeout`` does with a single item. Interpreter exit does not
  wait for it.
- What a batch is — read, fault policy, collate, its outcome — is the
  :class:`~aioload.read.reader.BatchReader`'s business; this backend only
  decides where and when the reader runs.

A worker process runs this same backend on its own loop (see
:mod:`aioload.backends.processes.worker`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import anyio.abc

from aioload.backends.base import Outcome, OutcomeSink
from aioload.backends.threads import when_done_on_loop
from aioload.read.eager import ItemPool
from aioload.read.reader import BatchReader
from aioload.read.tuning import AutoConcurrency
from aioload.settings.checks import AUTO_START_CONCURRENCY
from aioload.settings.window import THREADS_FOR_THREAD_SAFE

__all__ = ["InlineBackend"]

_ABANDONED = "aioload-abandoned"
_ABANDON_POLL = 0.05  # how often closing, waiting for running reads, checks for abandonment

_Work = tuple[concurrent.futures.Future[Any], Callable[..., Any], tuple[Any, ...]] | None


class _FetchThreads:
    """Daemon threads that run an epoch's sync reads, at most ``count`` at once.

    Not a ``ThreadPoolExecutor``: interpreter exit joins every executor's
    threads, so one read that never returns would keep the process from ever
    exiting. These threads are daemons and can be left behind
    (:meth:`abandon`); otherwise the epoch joins them (:meth:`join`).

    Example::

        threads = _FetchThreads(1)
        future = threads.submit(reader.read_sync, 0, [0, 1])
        threads.shutdown()     # queued reads are cancelled
        threads.join()         # after the running ones finished
    """

    def __init__(self, count: int) -> None:
        self._count = count
        self._work: queue.SimpleQueue[_Work] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._busy: set[threading.Thread] = set()
        self._idle = 0
        self._lock = threading.Lock()
        self._shut = False

    def submit(self, read: Callable[..., Any], *args: Any) -> concurrent.futures.Future[Any]:
        """Runs ``read(*args)`` in one of the threads (call from one thread: the loop's)."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._work.put((future, read, args))
        with self._lock:
            if self._idle:  # an idle thread takes it; reserve it for this read
                self._idle -= 1
                return future
            start = len(self._threads) < self._count
        if start:
            thread = threading.Thread(target=self._serve, name="aioload-fetch", daemon=True)
            self._threads.append(thread)
            thread.start()
        return future

    def _serve(self) -> None:
        me = threading.current_thread()
        work = self._work
        while True:
            item = work.get()
            if item is None:
                return
            future, read, args = item
            if not future.set_running_or_notify_cancel():
                continue
            with self._lock:
                self._busy.add(me)
            try:
                result = read(*args)
            except BaseException as error:
                future.set_exception(error)
            else:
                future.set_result(result)
            finally:
                with self._lock:
                    self._busy.discard(me)
                    self._idle += 1
            del future, read, args, item  # an abandoned result is dropped at once

    def shutdown(self) -> None:
        """Cancels the reads not started yet; each thread ends after its current read."""
        if self._shut:
            return
        self._shut = True
        while True:
            try:
                item = self._work.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item[0].cancel()
        for _ in self._threads:
            self._work.put(None)

    def join(self) -> None:
        """Waits for every thread to end (after :meth:`shutdown` and the running reads)."""
        for thread in self._threads:
            thread.join()

    def abandon(self) -> None:
        """Ends the idle threads and leaves the busy ones to finish their read alone.

        A busy thread is renamed ``aioload-abandoned``; once its read returns,
        its result goes nowhere and the thread ends.
        """
        self.shutdown()
        with self._lock:
            busy = set(self._busy)
        for thread in busy:
            thread.name = _ABANDONED
        for thread in self._threads:
            if thread not in busy:
                thread.join()


class InlineBackend:
    """Runs an epoch's fetches on the running event loop (see the module docstring).

    Args:
        reader: reads and collates one batch.
        concurrency: the most async item fetches in flight (under
            ``concurrency="auto"``, the most the tuner may set).
        auto: tune the limit (``concurrency="auto"``); None: the reader's setup says.
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
        auto: bool | None = None,
    ) -> None:
        self._reader = reader
        self._tg = task_group
        self._deliver = sink.deliver
        self._exhausted = False
        protocol = reader.protocol
        self._offload = offload_sync and not protocol.is_async
        if auto is None:
            auto = reader.auto_concurrency
        self._auto: AutoConcurrency | None = None
        self._reported: int | None = None  # the tuned limit the last outcome carried
        if auto and protocol.is_async and not protocol.iterable:
            self._auto = AutoConcurrency(most=concurrency, start=AUTO_START_CONCURRENCY)
            self._pool = ItemPool(self._auto.limit, observer=self._auto)
            self._deliver = self._deliver_tuned
        else:
            self._pool = ItemPool(concurrency)
        self._loop = asyncio.get_running_loop()
        self._thread_count = (
            min(concurrency, THREADS_FOR_THREAD_SAFE)
            if protocol.thread_safe and not protocol.iterable
            else 1
        )
        self._sink = sink
        self._closed = False
        # Created on first use; shut down (threads joined or abandoned) in aclose().
        self._threads: _FetchThreads | None = None
        self._in_thread: set[concurrent.futures.Future[Any]] = set()
        # An async stream's batches to read, in order, by one task (_pump_stream), which
        # waits on _stream_wake when there are none.
        self._stream_seqs: deque[int] = deque()
        self._stream_wake: asyncio.Future[None] | None = None
        self._pumping = False
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

    @property
    def concurrency(self) -> int:
        """The most item fetches in flight now (tuned under ``concurrency="auto"``)."""
        return self._pool.limit

    def _deliver_tuned(self, outcome: Outcome) -> None:
        """Delivers ``outcome`` with the tuned limit (when it moved) and the throttles seen."""
        auto = self._auto
        assert auto is not None
        limit = auto.limit
        throttles = auto.take_throttles()
        if limit != self._reported or throttles:
            self._reported = limit
            outcome = outcome._replace(concurrency=limit, throttles=throttles)
        self._sink.deliver(outcome)

    async def aclose(self) -> None:
        self._closed = True
        self._reader.close()  # sync reads waiting to retry give up now
        await self._pool.aclose()
        await self._reader.aclose()
        threads = self._threads
        if threads is not None:
            threads.shutdown()
            if _abandoning(self._sink):
                threads.abandon()
                return
            # A sync fetch cannot be interrupted: wait (without blocking the loop)
            # for the ones running, then join the threads; an epoch abandoned
            # meanwhile (a Ctrl-C while waiting) stops waiting.
            running = {asyncio.wrap_future(f) for f in self._in_thread if not f.done()}
            while running:
                _, running = await asyncio.wait(running, timeout=_ABANDON_POLL)
                if running and _abandoning(self._sink):
                    threads.abandon()
                    return
            threads.join()

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
            self._stream_seqs.append(seq)
            wake = self._stream_wake
            if wake is not None:
                self._stream_wake = None
                if not wake.done():
                    wake.set_result(None)
            elif not self._pumping:
                self._pumping = True
                self._tg.start_soon(self._pump_stream)
        elif self._exhausted:
            self._deliver(Outcome(seq, end=True))
        elif self._offload:
            # One thread for a stream: its batches are read one after the other.
            self._in_thread_call(seq, self._reader.next_sync, seq)
        else:
            self._deliver_stream(self._reader.next_sync(seq))

    async def _pump_stream(self) -> None:
        # One task reads an async stream's batches, in submission order, for the whole epoch
        # (the epoch's task group cancels it): a task for each batch cost more than a batch
        # of a stream that cuts its own (starting one is some 20 µs).
        seqs = self._stream_seqs
        while True:
            if not seqs:
                wake = self._stream_wake = self._loop.create_future()
                await wake
                continue
            seq = seqs.popleft()
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
        if self._threads is None:
            self._threads = _FetchThreads(self._thread_count)
        future = self._threads.submit(read, *args)
        self._in_thread.add(future)
        when_done_on_loop(future, self._loop, self._thread_done, seq)

    def _thread_done(self, seq: int, future: concurrent.futures.Future[Outcome]) -> None:
        self._in_thread.discard(future)
        if future.cancelled() or self._closed:
            return  # nobody waits for this batch any more (an abandoned read's, say)
        error = future.exception()
        if error is not None:  # the reader returns its errors; this is anything else
            self._deliver(Outcome(seq, error=error))
        else:
            self._deliver_stream(future.result())


def _abandoning(sink: OutcomeSink) -> bool:
    """Whether the epoch (the sink) is abandoned: its running sync reads are not waited for."""
    # Only the epoch says so (Epoch.abandon); a sink without the flag never abandons.
    return bool(getattr(sink, "abandoned", False))
