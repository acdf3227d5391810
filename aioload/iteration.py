"""The two ways to iterate a loader, over one async pipeline.

- :class:`AsyncBatchIterator` (``async for``): the epoch's driver is a task on
  the caller's event loop; batches reach the caller through a
  :class:`~aioload.handoff.LoopOutput`.
- :class:`SyncBatchIterator` (``for``): the same driver runs on aioload's own
  uvloop loop in a background thread, which lives exactly as long as the
  epoch; batches cross to the caller through a
  :class:`~aioload.handoff.ThreadOutput`, so fetching overlaps the caller's
  compute.

Both tell the epoch the sequence number of every batch the caller takes out
(:class:`~aioload.received.Received`): what a checkpoint describes. Both count
what the caller received and how long it waited for a batch that was not
ready (the epoch's :class:`~aioload.stats.EpochRecorder`): the clock is read
only when the caller has to wait.

Shutdown: leaving the loop early — ``break``, an exception in the loop body,
``aclose()``/``close()``, the iterator being garbage-collected, Ctrl-C — cancels
the driver, which cancels every task of the epoch and joins its threads; the
sync facade then joins its loop thread. Nothing the epoch started outlives it.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from aioload.errors import LoaderTimeoutError
from aioload.eventloop import new_event_loop
from aioload.handoff import END, Delivery, LoopOutput, ThreadOutput
from aioload.scheduler import Epoch

__all__ = ["AsyncBatchIterator", "SyncBatchIterator"]

_WAIT_SLICE = 0.1

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

    def __init__(self, new_epoch: EpochFactory, timeout: float) -> None:
        self._new_epoch = new_epoch
        self._timeout = timeout
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
        return delivery.batch

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
    """

    def __init__(self, new_epoch: EpochFactory, output: ThreadOutput) -> None:
        self.output = output
        self.epoch: Epoch | None = None
        self._new_epoch = new_epoch
        self._loop: asyncio.AbstractEventLoop | None = None
        started = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(started,), name="aioload-loop", daemon=True
        )
        self._thread.start()
        started.wait()

    def _run(self, started: threading.Event) -> None:
        try:
            with asyncio.Runner(loop_factory=new_event_loop) as runner:
                runner.run(self._drive(started))
        except asyncio.CancelledError:
            pass  # stop() ended the epoch
        finally:
            started.set()

    async def _drive(self, started: threading.Event) -> None:
        self._loop = asyncio.get_running_loop()
        try:
            self.epoch = self._new_epoch(self._loop, self.output, False)
        except BaseException as error:
            self.output.put(Delivery(-1, error=error))
            self.output.put(END)
            return
        finally:
            started.set()
        try:
            await self.epoch.run()
        except asyncio.CancelledError:
            raise
        except BaseException as error:
            self.output.put(Delivery(-1, error=error))
            self.output.put(END)

    def stop(self) -> None:
        """Cancels the epoch and joins the thread."""
        epoch, loop = self.epoch, self._loop
        if epoch is not None and loop is not None:
            epoch.request_stop()
            try:
                loop.call_soon_threadsafe(epoch.cancel)
            except RuntimeError:  # the loop has already finished
                pass
        if threading.current_thread() is not self._thread:
            self._thread.join()


class SyncBatchIterator:
    """One epoch of a loader, iterated with plain ``for`` (see the module docstring).

    Example::

        for batch in loader:   # loader.__iter__() makes one of these
            ...
    """

    def __init__(self, new_epoch: EpochFactory, timeout: float) -> None:
        self._timeout = timeout
        self._output = ThreadOutput()
        self._closed = False
        self._thread = _LoopThread(new_epoch, self._output)

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
                self.close()
                raise
            finally:
                if epoch is not None:
                    epoch.stats.stall += time.perf_counter() - waited
        if delivery is None:
            assert epoch is not None
            error = _timeout_error(epoch, self._timeout)
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

    def close(self) -> None:
        """Stops the epoch and joins aioload's loop thread."""
        if not self._closed:
            self._closed = True
            epoch = self._thread.epoch
            if epoch is not None:
                epoch.stats.end()
            self._thread.stop()

    def __del__(self) -> None:
        self.close()
