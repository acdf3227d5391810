"""The scheduler: sequence numbers, the window of batches in flight, reordering.

One :class:`Epoch` is one pass over the data. Its driver coroutine draws batches
of keys from the (sync or async) batch sampler, numbers them 0, 1, 2, …, and
hands each to a backend. A batch holds a slot of the :class:`Window` from the
moment it is submitted until the consumer takes it out, so at most ``window``
batches are fetching, waiting in the reorder buffer or waiting for the
consumer: a slow consumer stops the sampler, and memory stays flat however
long the stream.

Reorder: with ``in_order=True`` finished batches wait in a dict keyed by
sequence number until every earlier one has gone out (the dict is bounded by
the window); with ``in_order=False`` they go out as they finish.

Outcomes: the backend reports each batch's
:class:`~aioload.backends.base.Outcome` to :meth:`Epoch.deliver` and a fatal
failure to :meth:`Epoch.fail` (the epoch is the backend's sink).

Skips: under ``on_error='skip'`` an outcome carries the items its batch
dropped; the epoch records them in its :class:`~aioload.faults.policy.SkipLog` (which
logs each once) as they arrive, and ends with the log's
:class:`~aioload.TooManySkippedError` once past ``max_skipped``; its
retries are added to the stats, and so are the dataset's counts of its reads
(:mod:`aioload.stats.source_counts`). A batch whose every item was dropped
completes with nothing to deliver, like a request past the end of a stream.

What was received (checkpoints): the consumer's iterator tells the epoch's
:class:`~aioload.pipeline.received.Received` the sequence number of every batch it takes out.
What the consumer *received* is what a checkpoint describes, not what the sampler
handed out (the producer runs up to a window ahead). A resumed epoch starts
numbering at the checkpoint's prefix, and with ``in_order=False`` does not
fetch the batches past it that were already received (``skip``): sequence
numbers are deterministic given the sampler's state, so a number names a
batch.

Stats: every batch's items ride in its :class:`Delivery` to the consumer, who
counts them, and its skips are counted; a sample of batches (the first 8 of
an epoch, then one in 32) is measured too: its fetch latency, from submission
to completion, and its bytes (:func:`~aioload.stats.recorder.batch_nbytes`), so that a
batch that is not measured costs nothing but a comparison. An iterable
dataset's batches are all walked: their length is their item count.
:meth:`Epoch.gauges` reads what is in flight when someone asks.

Lifecycle: the driver runs inside an anyio task group that owns every task the
backend starts, and the pin thread when pinning; what fails the task group
reaches the consumer as itself, not as an ``ExceptionGroup``. It returns after
the end marker has been delivered; :meth:`Epoch.cancel` (the consumer's
``aclose()``, a ``break``, garbage collection) cancels everything it started,
and its shielded ``finally`` stops the threads and processes before the driver
is done.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterable, Callable, Iterable
from itertools import chain, islice
from typing import Any

import anyio
import anyio.abc

from aioload.backends.base import Backend, BackendFactory, Outcome
from aioload.errors import LoaderTimeoutError
from aioload.faults.policy import SkipLog
from aioload.groups import reported, ungroup
from aioload.pipeline.handoff import END, Delivery, LoopOutput, ThreadOutput
from aioload.pipeline.pin_stage import PinThread
from aioload.pipeline.received import Received
from aioload.settings import LoaderSettings
from aioload.stats.recorder import EpochRecorder, Gauges, batch_nbytes

__all__ = ["Epoch", "LoaderTimeoutError", "Window"]

_DRY = object()  # a sampler ran out (while fast-forwarding, or before its first batch)
_clock = time.perf_counter
# Which batches are measured (fetch latency, bytes): the first _MEASURE_FIRST of an
# epoch, then one in _MEASURE_MASK + 1; the others cost a comparison or two.
_MEASURE_FIRST = 8
_MEASURE_MASK = 31
# Under a window's memory budget: the window before any batch was measured, and the least
# it is sized down to (so fetching still overlaps the consumer).
_FIRST_WINDOW = 4
_MIN_WINDOW = 2


class Window:
    """Counts the batches in flight; the producer waits when all slots are taken.

    ``acquire`` runs on the loop; ``release`` on the loop and
    ``release_threadsafe`` from the consumer's thread under the sync facade.
    :meth:`resize` (on the loop) changes the limit while batches are in flight:
    a smaller one holds the producer back until enough batches went out.
    """

    def __init__(self, size: int, loop: asyncio.AbstractEventLoop) -> None:
        self.size = size
        self._free = size
        self._loop = loop
        self._lock = threading.Lock()
        self._waiter: asyncio.Future[None] | None = None

    @property
    def free(self) -> int:
        """Slots free now (negative after a shrink, until enough batches went out)."""
        return self._free

    async def acquire(self) -> None:
        with self._lock:
            if self._free > 0:
                self._free -= 1
                return
            waiter = self._waiter = self._loop.create_future()
        await waiter  # the slot is handed over by release or resize

    def _take_waiter(self) -> asyncio.Future[None] | None:
        with self._lock:
            waiter = self._waiter
            if waiter is None or self._free < 0:
                self._free += 1
                return None
            self._waiter = None
            return waiter

    def release(self) -> None:
        waiter = self._take_waiter()
        if waiter is not None:
            _wake(waiter)

    def release_threadsafe(self) -> None:
        waiter = self._take_waiter()
        if waiter is None:
            return
        try:
            self._loop.call_soon_threadsafe(_wake, waiter)
        except RuntimeError:
            # The loop closed between the delivery and this release (an epoch that failed,
            # e.g. past max_skipped): the producer it would wake is gone with it.
            if not self._loop.is_closed():
                raise

    def resize(self, size: int) -> None:
        """Makes the limit ``size`` batches (call on the loop)."""
        with self._lock:
            self._free += size - self.size
            self.size = size
            waiter = self._waiter
            if waiter is None or self._free <= 0:
                return
            self._free -= 1  # the waiting producer's slot
            self._waiter = None
        _wake(waiter)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class Epoch:
    """One pass: sampler → scheduler → backend → reorder → (pin) → output.

    Args:
        settings: the loader's settings, of which the epoch reads: its
            ``index_sampler``, whose output it numbers (lists of keys, or single
            keys when automatic batching is off; sync or async; None for an
            iterable dataset, whose backend makes its own batches); its
            ``window``, the most batches in flight, and ``window_bytes``, a
            memory budget for it (None: none): the epoch then starts with a small
            window and, as it measures batches, sizes it to hold about this many
            bytes of batches (within 2 and ``window``); and ``in_order``: yield
            by sequence number rather than as finished.
        make_backend: builds the epoch's backend inside the epoch's scope.
        output: where deliveries go.
        pin: when given, each batch is passed through it in a dedicated thread.
        skips: where the items dropped under ``on_error='skip'`` are recorded.
        progress: what the consumer received; a resumed epoch's says where
            numbering starts and which batches not to fetch.
        on_iter: called once the sampler's iterator is open, after the first
            batch is drawn from a sync sampler (whose iteration may begin only at
            its first key, as torch's random samplers do) and before it is
            fetched, before any is drawn from an async one (the loader snapshots
            the sampler's state there).
        fast_forward: batches to draw from the sampler and drop before the
            first one (resuming over a sampler without ``state_dict``).
        stats: where the epoch records fetch latencies, skips and what each
            batch holds (see :mod:`aioload.stats`); a fresh recorder if None.
    """

    def __init__(
        self,
        settings: LoaderSettings,
        make_backend: BackendFactory,
        *,
        output: LoopOutput | ThreadOutput,
        loop: asyncio.AbstractEventLoop,
        pin: Callable[[Any], Any] | None = None,
        skips: SkipLog | None = None,
        progress: Received | None = None,
        on_iter: Callable[[], None] | None = None,
        fast_forward: int = 0,
        stats: EpochRecorder | None = None,
    ) -> None:
        self._settings = settings
        self.stats = stats if stats is not None else EpochRecorder()
        self.stats.attach(self)
        self._collated = self.stats.collated
        self._map_style = settings.index_sampler is not None
        self._plain = self._collated and self._map_style  # items = len(keys)
        self._submitted: dict[int, float] = {}  # seq -> when it went to the backend
        self.progress = progress if progress is not None else Received(settings.in_order)
        self._on_iter = on_iter
        self._fast_forward = fast_forward
        self._make_backend = make_backend
        # Under a budget the batches' size is unknown until one is measured: start small.
        window = settings.window
        first = window if settings.window_bytes is None else min(window, _FIRST_WINDOW)
        self.window = Window(first, loop)
        self._output = output
        self._pin = pin
        self._skips = skips
        self._pending: dict[int, Any] = {}
        self._ready: dict[int, Delivery | None] = {}
        self._next_out = self.progress.done
        self._produced = False
        self._finished = False
        self._failed = False
        self._producer_error: BaseException | None = None
        self._emit: Callable[[Delivery], None] = output.put
        self._all_delivered = asyncio.Event()
        self._scope = anyio.CancelScope()
        self.stop_requested = False
        # Read by the inline backend when it closes: leave running sync reads behind.
        self.abandoned = False

    def request_stop(self) -> None:
        """Asks the producer to draw no more batches (any thread); cancellation follows."""
        self.stop_requested = True

    def release(self, seq: int) -> None:
        """The consumer took batch ``seq`` out (call on the loop)."""
        self.window.release()
        self.progress.receive(seq)

    def release_threadsafe(self, seq: int) -> None:
        """The consumer took batch ``seq`` out (call from the consumer's thread)."""
        self.window.release_threadsafe()
        self.progress.receive(seq)

    def ended(self) -> None:
        """The consumer received the end marker (call from the consumer's thread)."""
        self.progress.finished = not self._failed

    def gauges(self) -> Gauges:
        """Batches and items in flight, reorder-buffer occupancy, batches ready (any thread).

        Read from another thread than the loop's: the dicts are copied in one
        C call each (atomic under the GIL), and retried if one changed size.
        """
        for _ in range(3):
            try:
                pending = list(self._pending.values())
                waiting = sum(1 for delivery in list(self._ready.values()) if delivery is not None)
                break
            except RuntimeError:  # changed size while being copied
                continue
        else:
            return (0, 0, 0, 0)
        items_of = self.stats.items_of
        held = self.window.size - self.window.free
        ready = max(0, held - len(pending) - waiting)
        return (len(pending), sum(items_of(keys) for keys in pending), waiting, ready)

    def stalled(self) -> tuple[int, Any]:
        """The batch the consumer is waiting for and its keys, for timeout messages."""
        pending = dict(self._pending)
        seq = self._next_out if self._settings.in_order else min(pending, default=self._next_out)
        return seq, pending.get(seq)

    def cancel(self) -> None:
        """Stops the epoch early (call on the loop); :meth:`run` then cleans up and returns.

        A cancel scope rather than ``Task.cancel()``: the cleanup awaits threads
        and processes, and only a scope lets it shield itself from the request.
        """
        self.stop_requested = True
        self._scope.cancel()

    def abandon(self) -> None:
        """Stops the epoch like :meth:`cancel`, without waiting for sync reads still running.

        For a consumer that timed out or was interrupted: a sync read cannot be
        interrupted, so one that hangs is left to finish in its daemon thread,
        its result dropped (call on the loop).
        """
        self.abandoned = True
        self.cancel()

    async def run(self) -> None:
        """The driver: runs the epoch until its end marker has been delivered.

        What fails the epoch's task group (a backend that cannot be built, say)
        goes to the consumer as itself, never as the task group's
        ``ExceptionGroup``, followed by the end marker; the driver itself
        returns normally, so not even a ``KeyboardInterrupt`` escapes through
        the event loop past the consumer.
        """
        try:
            with self._scope:
                await self._run()
        except BaseExceptionGroup as group:  # the task group's own (see _run)
            error = ungroup(group)
        else:
            return
        if self._finished:  # after the end marker: nobody would see it as a delivery
            raise error
        self._finished = self._failed = True
        self.stop_requested = True
        # Straight to the output: the pin thread has stopped with the task group.
        self._output.put(Delivery(-1, error=error))
        self._output.put(END)

    async def _run(self) -> None:
        pin_thread = None
        if self._pin is not None:
            pin_thread = PinThread(self._pin, self._output)
            self._emit = pin_thread.put
        backend: Backend | None = None
        try:
            async with anyio.create_task_group() as tg:
                backend = self._make_backend(tg, self)
                tg.start_soon(self._produce_all, backend)
                # Backends may complete from threads or processes, outside the task group.
                await self._all_delivered.wait()
                # A failed epoch ends before its producer does.
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                try:
                    if backend is not None:
                        await backend.aclose()
                finally:
                    if pin_thread is not None:
                        await pin_thread.stop()

    async def _produce_all(self, backend: Backend) -> None:
        try:
            await self._produce(backend)
        except BaseException as error:
            # A sampler's SystemExit too: escaping this task, it would stop the event
            # loop itself rather than reach the consumer.
            if not reported(error):
                raise
            error.add_note("raised while drawing keys from the sampler")
            self._producer_error = error
        self._produced = True
        self._maybe_finish()

    async def _produce(self, backend: Backend) -> None:
        acquire = self.window.acquire
        pending = self._pending
        submit = backend.submit
        submitted = self._submitted
        clock = _clock
        first, mask = _MEASURE_FIRST, _MEASURE_MASK
        seq = self.progress.done
        skip = self.progress.skip
        batches: Iterable[Any] | AsyncIterable[Any] | None = self._settings.index_sampler
        if batches is None:
            while not backend.exhausted:
                await acquire()
                if backend.exhausted:
                    self.window.release()
                    break
                pending[seq] = None
                if seq < first or not seq & mask:
                    submitted[seq] = clock()
                submit(seq, None)
                seq += 1
        elif isinstance(batches, AsyncIterable):
            keys_iter = aiter(batches)
            if self._on_iter is not None:
                self._on_iter()
            for _ in range(self._fast_forward):  # one key (or batch) at a time
                if await anext(keys_iter, _DRY) is _DRY:
                    break
            async for keys in keys_iter:
                if seq in skip:
                    self._nothing_to_deliver(seq)
                    seq += 1
                    continue
                await acquire()
                pending[seq] = keys
                if seq < first or not seq & mask:
                    submitted[seq] = clock()
                submit(seq, keys)
                seq += 1
        else:
            sync_keys = iter(batches)
            if self._on_iter is not None:
                # A random sampler begins its iteration (draws) at its first key, as torch's.
                first_keys = next(sync_keys, _DRY)
                if first_keys is not _DRY:
                    self._on_iter()
                    sync_keys = chain((first_keys,), sync_keys)
            if self._fast_forward:
                next(islice(sync_keys, self._fast_forward, self._fast_forward), None)
            for keys in sync_keys:
                if seq in skip:
                    self._nothing_to_deliver(seq)
                    seq += 1
                    continue
                await acquire()
                pending[seq] = keys
                if seq < first or not seq & mask:
                    submitted[seq] = clock()
                submit(seq, keys)
                seq += 1
                # A fetch that completes inside submit() never yields to the loop,
                # so a cancellation sent from the consumer's thread could only land
                # after the whole window; the flag stops the producer at once.
                if self.stop_requested:
                    return

    def deliver(self, outcome: Outcome) -> None:
        """Batch ``outcome.seq`` is done (the backend's side of the sink; on the loop)."""
        seq = outcome.seq
        keys = self._pending.pop(seq)
        if self._finished:
            return  # the epoch failed: nobody waits for this batch any more
        if outcome.retries:
            self.stats.add_retries(outcome.retries)
        if outcome.counts is not None:
            self.stats.add_counts(outcome.counts)
        if outcome.concurrency is not None or outcome.throttles:
            self.stats.tuned(outcome.worker, outcome.concurrency, outcome.throttles)
        skipped = outcome.skipped
        if skipped:
            self.stats.skipped += len(skipped)
            assert self._skips is not None, "a backend skipped items without on_error='skip'"
            too_many = self._skips.record(seq, skipped)
            if too_many is not None:
                self.fail(too_many)
                return
        delivery: Delivery | None
        error = outcome.error
        if error is not None:
            described = f"batch {seq}" if keys is None else f"batch {seq} (keys {keys!r})"
            error.add_note(f"raised while fetching {described}")
            delivery = Delivery(seq, error=error)
            self._record_latency(seq)
        elif outcome.empty or outcome.end:
            delivery = None
            self._submitted.pop(seq, None)
            self.window.release()
            if not self._settings.in_order:
                self.progress.nothing_for(seq)
        else:
            states = self.progress.stream_states
            if states is not None:  # read ahead of the consumer: the state as of this batch
                states[seq] = (outcome.worker, outcome.stream_state)
            batch = outcome.batch
            if self._plain and not skipped and seq & _MEASURE_MASK and seq >= _MEASURE_FIRST:
                # Most batches: the keys tell the items, and nothing is measured.
                delivery = Delivery(seq, batch, None, len(keys))
            else:
                delivery = Delivery(seq, batch, None, self._measure(seq, keys, batch, len(skipped)))
        if not self._settings.in_order:
            if delivery is not None:
                self._emit(delivery)
        else:
            self._in_order_out(seq, delivery)
        if self._produced:
            self._maybe_finish()

    def _measure(self, seq: int, keys: Any, batch: Any, skipped: int) -> int:
        """The items of batch ``seq``; records its bytes and latency if it is measured."""
        stats = self.stats
        if not self._map_style:  # a stream's batch: its length is its item count
            items, nbytes = stats.measure(keys, batch, 0)
            stats.sample(items, nbytes)
            self._fit_window(nbytes)
        else:
            items = len(keys) - skipped if self._collated else 1
            if seq < _MEASURE_FIRST or not seq & _MEASURE_MASK:
                nbytes = batch_nbytes(batch)
                stats.sample(items, nbytes)
                self._fit_window(nbytes)
        self._record_latency(seq)
        return items

    def _fit_window(self, nbytes: int) -> None:
        """Sizes the window to the budget by the bytes of a measured batch."""
        budget = self._settings.window_bytes
        if budget is None:
            return
        limit = self._settings.window
        size = limit if nbytes <= 0 else max(_MIN_WINDOW, min(limit, budget // nbytes))
        if size != self.window.size:
            self.window.resize(size)

    def _record_latency(self, seq: int) -> None:
        started = self._submitted.pop(seq, None)  # only measured batches are in it
        if started is not None:
            self.stats.fetched(_clock() - started)

    def _in_order_out(self, seq: int, delivery: Delivery | None) -> None:
        """Emits batch ``seq`` (None: nothing to emit) once every earlier one went out."""
        if seq != self._next_out:
            self._ready[seq] = delivery
            return
        if delivery is not None:
            self._emit(delivery)
        self._next_out += 1
        ready = self._ready
        while self._next_out in ready:
            waiting = ready.pop(self._next_out)
            if waiting is not None:
                self._emit(waiting)
            self._next_out += 1

    def _nothing_to_deliver(self, seq: int) -> None:
        """A resumed epoch skips batch ``seq``: the interrupted run delivered it."""
        if self._settings.in_order:
            self._in_order_out(seq, None)

    def fail(self, error: BaseException | None) -> None:
        """The backend cannot go on: deliver its error and end the epoch (on the loop)."""
        if self._finished:
            return
        self._finished = True
        self._failed = True
        self.stop_requested = True
        if error is not None:
            self._emit(Delivery(-1, error=error))
        self._emit(END)
        self._all_delivered.set()

    def _maybe_finish(self) -> None:
        if self._finished or self._pending or self._ready:
            return
        self._finished = True
        self._failed = self._producer_error is not None
        if self._producer_error is not None:
            self._emit(Delivery(-1, error=self._producer_error))
        self._emit(END)
        self._all_delivered.set()
