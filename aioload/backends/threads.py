"""Blocking work off the loop: a thread's or an executor's result back on the loop.

Two helpers every backend uses rather than each its own: :func:`in_thread`
runs one blocking call (starting or stopping processes, pickling a setup) in a
thread of its own and awaits it without blocking the loop, and
:func:`when_done_on_loop` hands a ``concurrent.futures.Future``'s completion
to the loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import anyio

from aioload.backends.processes.start_method import wait_until_gone

__all__ = ["in_thread", "when_done_on_loop"]

T = TypeVar("T")


def when_done_on_loop(
    future: concurrent.futures.Future[Any],
    loop: asyncio.AbstractEventLoop,
    callback: Callable[[int, concurrent.futures.Future[Any]], None],
    seq: int,
) -> None:
    """Calls ``callback(seq, future)`` on ``loop`` once ``future`` (run in a thread or an
    executor) is done; nothing when the loop has closed since (its epoch is gone)."""

    def finished(future: concurrent.futures.Future[Any]) -> None:
        try:
            loop.call_soon_threadsafe(callback, seq, future)
        except RuntimeError:  # the loop is closed: the epoch is gone
            pass

    future.add_done_callback(finished)


async def in_thread(function: Callable[[], T]) -> T:
    """Runs blocking ``function`` in a thread of its own without blocking the loop.

    The call always finishes, even when the awaiting task is cancelled (by a
    cancel scope or ``Task.cancel()``): the cancellation is re-raised once the
    thread is done, so nothing it started is left half-made.

    Example::

        pickled = await in_thread(lambda: pickle.dumps(setup))
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]

    def run() -> None:
        try:
            result = function()
        except BaseException as error:
            outcome: tuple[T | None, BaseException | None] = (None, error)
        else:
            outcome = (result, None)
        try:
            loop.call_soon_threadsafe(settle, *outcome)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass

    thread = threading.Thread(target=run, name="aioload-workers", daemon=True)
    thread.start()
    interrupted = False
    try:
        with anyio.CancelScope(shield=True):
            while True:
                try:
                    result = await asyncio.shield(future)
                    break
                except asyncio.CancelledError:
                    if future.cancelled():
                        raise
                    interrupted = True
    finally:
        thread.join()
        wait_until_gone(thread)
    if interrupted:
        raise asyncio.CancelledError
    return result
