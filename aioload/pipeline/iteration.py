"""The two ways to iterate a loader, over one async pipeline.

- :class:`AsyncBatchIterator` (``async for``): the epoch's driver is a task on
  the caller's event loop; batches reach the caller through a
  :class:`~aioload.pipeline.handoff.LoopOutput`.
- :class:`SyncBatchIterator` (``for``): the same driver runs on aioload's own
  uvloop loop in a background thread, which lives exactly as long as the
  epoch; batches cross to the caller through a
  :class:`~aioload.pipeline.handoff.ThreadOutput`, so fetching overlaps the caller's
  compute.

Both tell the epoch the sequence number of every batch the caller takes out
(:class:`~aioload.pipeline.received.Received`): what a checkpoint describes. Both count
what the caller received and how long it waited for a batch that was not
ready (the epoch's :class:`~aioload.stats.recorder.EpochRecorder`): the clock is read
only when the caller has to wait.

Shutdown: leaving the loop early — ``break``, an exception in the loop body,
``aclose()``/``close()``, the iterator being garbage-collected, Ctrl-C — cancels
the driver, which cancels every task of the epoch and joins its threads; the
sync facade then joins its loop thread. Nothing the epoch started outlives it,
with one exception: a sync read that does not return.

- ``timeout``: a sync call cannot be interrupted, so when the consumer times
  out the epoch is *abandoned* (:meth:`~aioload.pipeline.scheduler.Epoch.abandon`):
  everything stops as usual except the reads still running, each left to
  finish in its daemon thread (renamed ``aioload-abandoned``), its result
  dropped; interpreter exit does not wait for it. The error is raised after
  that teardown, so it reaches the caller about when the timeout expires.
  To make this possible the sync facade reads a sync dataset in a fetch
  thread when ``timeout > 0`` (with no timeout it reads it on its loop, which
  is cheaper). Its loop thread itself, if something blocks the loop (an async
  dataset calling blocking code), is left behind the same way.
- Interpreter exit: a script may end while an epoch still runs (an iterator
  kept in a variable, persistent workers, a pin thread). An exit handler
  stops every such epoch as ``close()`` does, its sync reads waited for at
  most :data:`EXIT_GRACE` seconds, before the interpreter finalizes; the
  finalizer of an iterator collected later then has nothing left to wait for.
- Ctrl-C (``KeyboardInterrupt``) always reaches the program. Landing while
  the caller waits for a batch, during ``iter()`` or during the teardown, it
  stops the epoch, waiting at most :data:`INTERRUPT_GRACE` seconds for the
  reads still running before abandoning them as above, and is then raised.
  Python cannot raise from ``__del__`` (a ``break`` or garbage collection
  tears the iterator down there): the teardown completes the same way and
  the interrupt is then handed back to the main thread
  (``_thread.interrupt_main``, so the program's own SIGINT handler runs), to
  be raised at the program's next check for signals after the finalizer.

Iterable datasets: when ``len(loader)`` was asked, the loader passes what it
reported (:class:`ReportedLength`), and the iterator warns as torch does for
every batch past the dataset's reported length.
"""

from __future__ import annotations

import _thread
import asyncio
import atexit
import os
import queue
import signal
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# Imported before this module registers its exit handler: see _stop_every_loop_thread.
from aioload.backends.processes.pool import exit_began
from aioload.backends.processes.start_method import wait_until_gone
from aioload.errors import LoaderTimeoutError
from aioload.eventloop import new_event_loop
from aioload.pipeline.handoff import END, Delivery, LoopOutput, ThreadOutput
from aioload.pipeline.scheduler import Epoch

__all__ = [
    "EXIT_GRACE",
    "INTERRUPT_GRACE",
    "AsyncBatchIterator",
    "ReportedLength",
    "SyncBatchIterator",
]

_WAIT_SLICE = 0.1
INTERRUPT_GRACE = 1.0
"""Seconds a Ctrl-C waits for the sync reads still running before they are abandoned."""
# How long the loop thread may take to stop once its epoch is abandoned (its reads
# are not waited for) before it is left behind too.
_ABANDON_WAIT = 0.5
_ABANDONED = "aioload-abandoned"
EXIT_GRACE = 0.5
"""Seconds the interpreter's exit waits for the sync reads of epochs still running."""


@dataclass(frozen=True, slots=True)
class ReportedLength:
    """What ``len(loader)`` reported for an iterable dataset.

    torch keeps it as ``_IterableDataset_len_called``.
    The iterator warns, as torch does, for every batch past ``length``, the
    dataset's own ``len()`` (torch compares the batches yielded with it, not
    ``len(loader)``).

    Attributes:
        dataset: the dataset, named in the warning.
        length: ``len(dataset)`` when ``len(loader)`` was last called.
        num_workers: the loader's worker processes (the warning then suggests
            a cause).
    """

    dataset: Any
    length: int
    num_workers: int = 0

    def warn(self, yielded: int) -> None:
        """Warns that ``yielded`` batches came (called two frames below the caller's loop)."""
        message = (
            f"Length of IterableDataset {self.dataset} was reported to be {self.length}"
            f"(when accessing len(dataloader)), but {yielded} samples have been fetched. "
        )
        if self.num_workers > 0:
            message += (
                "For multiprocessing data-loading, this could be caused by not properly "
                "configuring the IterableDataset replica at each worker. Please see "
                "https://pytorch.org/docs/stable/data.html#torch.utils.data.IterableDataset "
                "for examples."
            )
        # This frame, the iterator's __next__/__anext__, then the caller's loop.
        warnings.warn(message, UserWarning, stacklevel=3)


def _warn_past(reported: ReportedLength | None) -> int:
    """The batch count past which the iterator warns (never, without a reported length)."""
    return sys.maxsize if reported is None else reported.length


EpochFactory = Callable[[asyncio.AbstractEventLoop, LoopOutput | ThreadOutput, bool], Epoch]


def _timeout_error(epoch: Epoch, timeout: float) -> LoaderTimeoutError:
    seq, keys = epoch.stalled()
    described = f"batch {seq}" if keys is None else f"batch {seq} (keys {keys!r})"
    return LoaderTimeoutError(
        f"DataLoader timed out after {timeout} seconds waiting for {described}"
    )


def _report_crash(driver: asyncio.Task[None], output: LoopOutput) -> None:
    if driver.cancelled():
        return
    error = driver.exception()
    if error is not None:
        output.put(Delivery(-1, error=error))
        output.put(END)


class AsyncBatchIterator:
    """One epoch of a loader, iterated with ``async for`` (see the module docstring).

    Example::

        async for batch in loader:   # loader.__aiter__() makes one of these
            ...
    """

    def __init__(
        self,
        new_epoch: EpochFactory,
        timeout: float,
        reported_length: ReportedLength | None = None,
    ) -> None:
        self._new_epoch = new_epoch
        self._timeout = timeout
        self._reported = reported_length
        self._warn_past = _warn_past(reported_length)
        self._yielded = 0
        self._epoch: Epoch | None = None
        self._output: LoopOutput | None = None
        self._driver: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._finished = False

    def __aiter__(self) -> AsyncBatchIterator:
        return self

    def _start(self) -> None:
        loop = self._loop = asyncio.get_running_loop()
        output = self._output = LoopOutput(loop)
        self._epoch = self._new_epoch(loop, output, True)
        self._driver = loop.create_task(self._epoch.run(), name="aioload-epoch")
        # The callback must not hold the iterator: the running task would keep
        # it alive, and a dropped iterator could never be collected and stopped.
        self._driver.add_done_callback(lambda driver: _report_crash(driver, output))

    async def __anext__(self) -> Any:
        if self._finished:
            raise StopAsyncIteration
        if self._driver is None:
            self._start()
        output, epoch = self._output, self._epoch
        assert output is not None and epoch is not None
        stats = epoch.stats
        delivery = output.get_nowait()
        if delivery is None:
            waited = time.perf_counter()
            try:
                if self._timeout > 0:
                    try:
                        async with asyncio.timeout(self._timeout):
                            await output.wait()
                    except TimeoutError:
                        error = _timeout_error(epoch, self._timeout)
                        await self._abandon()
                        del self, epoch, output  # see below: the error must not pin the epoch
                        raise error from None
                else:
                    await output.wait()
            finally:
                stats.stall += time.perf_counter() - waited
            delivery = output.get_nowait()
            assert delivery is not None
        if delivery is END:
            epoch.ended()
            stats.end()
            await self.aclose()
            raise StopAsyncIteration
        if delivery.seq >= 0:
            epoch.release(delivery.seq)
        if delivery.error is not None:
            # The traceback keeps this frame alive as long as the caller keeps the
            # error; it must not keep the iterator (and the running epoch) alive too.
            del self, epoch, output
            raise delivery.error
        stats.batches += 1
        stats.items += delivery.items
        self._yielded += 1
        if self._yielded > self._warn_past:
            assert self._reported is not None
            self._reported.warn(self._yielded)
        return delivery.batch

    async def _abandon(self) -> None:
        """Ends the epoch after a timeout, leaving its stuck sync reads behind."""
        self._finished = True
        driver, epoch = self._driver, self._epoch
        assert driver is not None and epoch is not None
        epoch.stats.end()
        if not driver.done():
            epoch.abandon()
            await asyncio.wait({driver})

    async def aclose(self) -> None:
        """Stops the epoch and waits until everything it started has ended."""
        self._finished = True
        driver, epoch = self._driver, self._epoch
        if epoch is not None:
            epoch.stats.end()
        if driver is not None and epoch is not None and not driver.done():
            epoch.cancel()
            await asyncio.wait({driver})

    def __del__(self) -> None:
        driver, loop, epoch = self._driver, self._loop, self._epoch
        if epoch is not None:
            epoch.stats.end()
        if driver is not None and loop is not None and epoch is not None and not driver.done():
            try:
                loop.call_soon_threadsafe(epoch.cancel)
            except RuntimeError:  # the loop is already closed
                pass


class _LoopThread:
    """aioload's event loop in a background thread, running one epoch's driver.

    Kept apart from :class:`SyncBatchIterator` so that the thread holds no
    reference to the iterator: a dropped iterator is collected at once, and its
    finalizer stops this thread.

    ``offload``: the epoch reads a sync dataset in a fetch thread rather than
    on this loop (so that a read that hangs can be abandoned).
    """

    def __init__(self, new_epoch: EpochFactory, output: ThreadOutput, offload: bool) -> None:
        self.output = output
        self.epoch: Epoch | None = None
        self._new_epoch = new_epoch
        self._offload = offload
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False
        self._given_up = False
        # Waited on instead of Thread.join: on Python 3.11 a join interrupted by
        # Ctrl-C marks the thread stopped while it still runs, and every later
        # join returns at once.
        self._ended = threading.Event()
        started = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(started,), name="aioload-loop", daemon=True
        )
        self._pid = os.getpid()
        _live_loop_threads.add(self)
        self._thread.start()
        try:
            started.wait()
        except BaseException:  # Ctrl-C during iter()
            self.give_up(INTERRUPT_GRACE)
            raise

    def _run(self, started: threading.Event) -> None:
        try:
            with asyncio.Runner(loop_factory=new_event_loop) as runner:
                runner.run(self._drive(started))
        except asyncio.CancelledError:
            pass  # stop() ended the epoch
        finally:
            started.set()
            self._ended.set()

    async def _drive(self, started: threading.Event) -> None:
        self._loop = asyncio.get_running_loop()
        try:
            self.epoch = self._new_epoch(self._loop, self.output, self._offload)
        except BaseException as error:
            self.output.put(Delivery(-1, error=error))
            self.output.put(END)
            return
        finally:
            started.set()
        if self._stopping:  # given up before the epoch existed
            return
        try:
            await self.epoch.run()
        except asyncio.CancelledError:
            raise
        except BaseException as error:
            self.output.put(Delivery(-1, error=error))
            self.output.put(END)

    def _request(self, abandon: bool) -> None:
        """Asks the epoch to stop (any thread); ``abandon``: without its running reads."""
        self._stopping = True
        epoch, loop = self.epoch, self._loop
        if epoch is not None and loop is not None:
            epoch.request_stop()
            try:
                loop.call_soon_threadsafe(epoch.abandon if abandon else epoch.cancel)
            except RuntimeError:  # the loop has already finished
                pass

    def stop(self) -> None:
        """Cancels the epoch and joins the thread, after the sync reads still running.

        A KeyboardInterrupt during the join gives up (:meth:`give_up`) and is
        then raised.
        """
        self._request(abandon=False)
        # Given up (at exit, say): what could stop has stopped. Finalizing: no other
        # thread runs any more, so this one would never end.
        if self._given_up or sys.is_finalizing() or threading.current_thread() is self._thread:
            return
        try:
            self._join(None)
        except KeyboardInterrupt:
            self.give_up(INTERRUPT_GRACE)
            raise

    def _join(self, timeout: float | None) -> bool:
        """Waits at most ``timeout`` seconds (None: forever) for the thread; whether it ended."""
        if not self._ended.wait(timeout):
            return False
        self._thread.join()  # past its last line: returns at once
        wait_until_gone(self._thread)  # the next epoch forks with no thread of ours left
        return True

    def give_up(self, grace: float) -> None:
        """Stops the epoch, waiting at most ``grace`` seconds for its running sync reads.

        Past that the epoch is abandoned: the reads still running are left to
        finish in their daemon threads, and this thread too if it does not
        end soon after (something blocks its loop). A KeyboardInterrupt
        during the wait abandons at once (and is raised). Once is enough: a
        second call returns at once.
        """
        if self._given_up:
            return
        self._given_up = True
        self._request(abandon=False)
        thread = self._thread
        if threading.current_thread() is thread:
            return
        ended = False
        try:
            ended = self._join(grace)
        finally:
            if not ended:
                self._request(abandon=True)
                try:
                    ended = self._join(_ABANDON_WAIT)
                finally:
                    if not ended:
                        thread.name = _ABANDONED


_live_loop_threads: weakref.WeakSet[_LoopThread] = weakref.WeakSet()


@atexit.register
def _stop_every_loop_thread() -> None:
    """Stops, when the interpreter exits, every epoch a sync iterator still runs.

    A script that ends mid-epoch (``it = iter(loader)``, a few ``next(it)``)
    leaves its iterator to the interpreter's finalization, where no other
    thread runs any more: the finalizer would wait forever for the loop
    thread. At exit, before finalization, the loop threads still run: each
    epoch stops as ``close()`` would stop it (its workers, pin thread and
    shared memory released by its own cleanup), all at once, their sync reads
    waited for at most :data:`EXIT_GRACE` seconds in all and then abandoned.
    Registered after :mod:`aioload.backends.processes.pool` is imported, so it runs
    before that module's handler (atexit runs handlers last-in, first-out):
    the epochs let go of their workers before every pool is stopped, and
    workers busy in a read are not waited for long (see
    :func:`~aioload.backends.processes.pool.exit_began`).
    """
    exit_began()
    # A process forked from this one holds copies of these, whose threads are not its own.
    threads = [thread for thread in list(_live_loop_threads) if thread._pid == os.getpid()]
    for thread in threads:
        thread._request(abandon=False)
    deadline = time.monotonic() + EXIT_GRACE
    for thread in threads:
        thread.give_up(max(0.0, deadline - time.monotonic()))


class _Interrupter:
    """``_INTERRUPT[signal.SIGINT]`` calls ``_thread.interrupt_main(SIGINT)`` from C.

    A finalizer cannot raise, and a signal tripped by a plain call inside one
    is handled right after the call returns — inside the finalizer, where the
    KeyboardInterrupt is swallowed again. A subscript is not followed by a
    check for signals, so tripped by the finalizer's last instruction the
    signal is handled at the next check in the program's own code (a Python
    function call, a loop, the return of a C call), as a real SIGINT would be;
    the program's own SIGINT handler runs.
    """

    __slots__ = ()
    __getitem__ = staticmethod(_thread.interrupt_main)


_INTERRUPT = _Interrupter()


class SyncBatchIterator:
    """One epoch of a loader, iterated with plain ``for`` (see the module docstring).

    Example::

        for batch in loader:   # loader.__iter__() makes one of these
            ...
    """

    def __init__(
        self,
        new_epoch: EpochFactory,
        timeout: float,
        reported_length: ReportedLength | None = None,
    ) -> None:
        self._closed = True  # until the thread runs: a half-made iterator has nothing to stop
        self._timeout = timeout
        self._reported = reported_length
        self._warn_past = _warn_past(reported_length)
        self._yielded = 0
        self._output = ThreadOutput()
        self._thread = _LoopThread(new_epoch, self._output, offload=timeout > 0)
        self._closed = False

    def __iter__(self) -> SyncBatchIterator:
        return self

    def __next__(self) -> Any:
        if self._closed:
            raise StopIteration
        epoch = self._thread.epoch
        delivery = self._output.get_nowait()
        if delivery is None:
            waited = time.perf_counter()
            try:
                delivery = self._wait_for_delivery()
            except BaseException:  # KeyboardInterrupt while waiting
                self._give_up(INTERRUPT_GRACE)
                raise
            finally:
                if epoch is not None:
                    epoch.stats.stall += time.perf_counter() - waited
        if delivery is None:
            assert epoch is not None
            error = _timeout_error(epoch, self._timeout)
            # The batch is stuck by definition: nothing to wait for.
            self._give_up(0.0)
            del self, epoch  # see AsyncBatchIterator.__anext__
            raise error
        if delivery is END:
            if epoch is not None:
                epoch.ended()
            self.close()
            raise StopIteration
        if delivery.seq >= 0 and epoch is not None:
            epoch.release_threadsafe(delivery.seq)
        if delivery.error is not None:
            del self, epoch  # see AsyncBatchIterator.__anext__
            raise delivery.error
        if epoch is not None:
            stats = epoch.stats
            stats.batches += 1
            stats.items += delivery.items
        self._yielded += 1
        if self._yielded > self._warn_past:
            assert self._reported is not None
            self._reported.warn(self._yielded)
        return delivery.batch

    def _wait_for_delivery(self) -> Delivery | None:
        """The next delivery, or None when the loader's timeout passed first."""
        # Wait in short slices: a KeyboardInterrupt raised in this thread by
        # other means than a signal (interrupt_main) is only seen between them.
        deadline = time.monotonic() + self._timeout if self._timeout > 0 else None
        while True:
            wait = _WAIT_SLICE
            if deadline is not None:
                wait = min(wait, deadline - time.monotonic())
                if wait <= 0:
                    return None
            try:
                return self._output.get(wait)
            except queue.Empty:
                continue

    def _give_up(self, grace: float) -> None:
        """Ends the epoch, abandoning the sync reads still running after ``grace`` seconds."""
        if not self._closed:
            self._closed = True
            epoch = self._thread.epoch
            if epoch is not None:
                epoch.stats.end()
            self._thread.give_up(grace)

    def close(self) -> None:
        """Stops the epoch and joins aioload's loop thread.

        It waits for the sync reads still running; a Ctrl-C meanwhile waits
        at most :data:`INTERRUPT_GRACE` seconds more, abandons what still
        runs, and is raised.
        """
        if not self._closed:
            self._closed = True
            epoch = self._thread.epoch
            if epoch is not None:
                epoch.stats.end()
            self._thread.stop()

    def __del__(self) -> None:
        try:
            self.close()
        except KeyboardInterrupt:
            pass
        else:
            return
        try:  # whatever close() had not done yet when the interrupt landed
            self._thread.give_up(INTERRUPT_GRACE)
        except KeyboardInterrupt:
            pass
        # Python cannot raise from a finalizer: with the teardown done (what was stuck
        # abandoned) the interrupt goes back to the main thread. Nothing of this object
        # may run Python code after that (a finalizer there would swallow it again).
        self.__dict__.clear()
        _INTERRUPT[signal.SIGINT]  # trips SIGINT from C: see _Interrupter
