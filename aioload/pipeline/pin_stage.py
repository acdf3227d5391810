"""The pin stage: a dedicated thread that pins each batch before the consumer gets it.

Pinning copies a batch into page-locked memory — a memcpy of the whole batch —
so it never runs on an event loop. The thread takes deliveries in the order the
reorder stage emits them, pins the batch (see :mod:`aioload.memory.pinned`) and puts
the delivery into the consumer's output, so order is kept. The input queue is
bounded by the scheduler's window like every other buffer.
"""

from __future__ import annotations

import asyncio
import queue
import sys
import threading
from collections.abc import Callable
from typing import Any

from aioload.pipeline.handoff import END, Delivery, LoopOutput, ThreadOutput

__all__ = ["PinThread", "Pinner"]

_STOP = Delivery(-1)


class Pinner:
    """A loader's pinning: one pool of page-locked buffers for all its epochs, made when
    first needed (pinning is optional, and the pool's buffers are locked memory).

    Example::

        pinner = Pinner()
        pin = pinner.for_device("")     # what a PinThread calls on each batch
    """

    def __init__(self) -> None:
        self._pool: Any = None
        self._lock = threading.Lock()

    def for_device(self, device: str) -> Callable[[Any], Any]:
        """What pins one batch for ``device`` (the loader's ``pin_memory_device``).

        Call it in the thread that iterates the loader: where torch pins for CUDA and has
        already set up CUDA there, the pin thread pins for that thread's current device, as
        torch's pin thread does (not for device 0, whose context every process would then
        create).
        """
        from aioload.memory.pinned import PinnedBufferPool, pin_batch

        with self._lock:  # two epochs may start at once, from two threads
            if self._pool is None:
                self._pool = PinnedBufferPool()
            pool = self._pool
        cuda_device = _current_cuda_device(device)
        unset = [cuda_device is not None]

        def pin(batch: Any) -> Any:
            if unset[0]:  # once, in the pin thread (a CUDA device is per thread)
                unset[0] = False
                sys.modules["torch"].cuda.set_device(cuda_device)
            return pin_batch(batch, pool, device=device)

        return pin


def _current_cuda_device(device: str) -> int | None:
    """The iterating thread's CUDA device, where torch pins for CUDA and CUDA is set up.

    Never sets CUDA up itself (that would keep forked workers from using it).
    """
    from aioload.memory.pinned import torch_pins

    if not (device == "" or device.startswith("cuda")) or not torch_pins(device):
        return None
    cuda = sys.modules["torch"].cuda
    if not cuda.is_initialized():
        return None
    index: int = cuda.current_device()
    return index


class PinThread:
    """Runs ``pin`` on every batch that passes through, in its own thread.

    Args:
        pin: makes the pinned copy of one batch.
        output: where pinned deliveries go (from this thread).
    """

    def __init__(self, pin: Callable[[Any], Any], output: LoopOutput | ThreadOutput) -> None:
        self._pin = pin
        self._output = output
        self._inbox: queue.SimpleQueue[Delivery] = queue.SimpleQueue()
        self._stopped: tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]
        self._thread = threading.Thread(target=self._run, name="aioload-pin", daemon=True)
        self._thread.start()

    def put(self, delivery: Delivery) -> None:
        """Queues a delivery for pinning (call from the loop)."""
        self._inbox.put(delivery)

    async def stop(self) -> None:
        """Ends the thread after what is queued, waiting without blocking the loop."""
        loop = asyncio.get_running_loop()
        stopped = loop.create_future()
        self._stopped = (loop, stopped)
        self._inbox.put(_STOP)
        await stopped
        self._thread.join()  # the thread has nothing left to do but exit

    def _run(self) -> None:
        while True:
            delivery = self._inbox.get()
            if delivery is _STOP:
                loop, stopped = self._stopped
                try:
                    loop.call_soon_threadsafe(_resolve, stopped)
                except RuntimeError:  # the loop closed while stop() was being cancelled
                    pass
                return
            if delivery.error is None and delivery is not END:
                try:
                    # In place: the delivery keeps what the stats counted of it.
                    delivery.batch = self._pin(delivery.batch)
                except Exception as error:
                    error.add_note(f"raised while pinning batch {delivery.seq}")
                    delivery = Delivery(delivery.seq, error=error)
            try:
                self._output.put_threadsafe(delivery)
            except RuntimeError:  # the consumer's loop is closed: nobody will read it
                pass


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
