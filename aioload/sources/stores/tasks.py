"""Running a dataset's small store reads: many at once, in order, or from sync code.

A dataset of thousands of shards or files reads thousands of small objects before its
first sample (index files, Parquet footers) and, on resume, a shuffle buffer's samples
again: one after the other that is thousands of round trips. :func:`bounded_gather` runs
such reads :data:`READS_AT_ONCE` at a time and returns their results in order;
:func:`run_blocking` runs one from sync code (``len(dataset)``), also where an event loop
already runs on the calling thread. Neither knows what is read: every format uses them.

Example::

    >>> import asyncio
    >>> async def square(n: int) -> int:
    ...     await asyncio.sleep(0)
    ...     return n * n
    >>> calls = [lambda n=n: square(n) for n in range(5)]
    >>> run_blocking(lambda: bounded_gather(calls, limit=2))
    [0, 1, 4, 9, 16]
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from aioload.eventloop import new_event_loop

__all__ = ["READS_AT_ONCE", "bounded_gather", "run_blocking"]

T = TypeVar("T")

READS_AT_ONCE = 32
"""Small reads a dataset runs at once: index files, shards being indexed, Parquet footers,
the groups of a shuffle buffer's samples read again on resume."""


async def bounded_gather(calls: Sequence[Callable[[], Awaitable[T]]], limit: int) -> list[T]:
    """The results of ``calls``, in their order, ``limit`` of them running at once.

    Unlike :func:`asyncio.gather`, at most ``limit`` calls are started at a time (each
    call is made only when a slot is free), and the first failure cancels the rest and
    is raised as it is (not in a group).

    Args:
        calls: what to run: each makes one awaitable when called.
        limit: the most running at once.

    Example::

        footers = await bounded_gather([partial(read_footer, url) for url in urls], 32)
    """
    results: list[Any] = [None] * len(calls)
    numbers = iter(range(len(calls)))

    async def run() -> None:
        for number in numbers:
            results[number] = await calls[number]()

    tasks = [asyncio.ensure_future(run()) for _ in range(min(limit, len(calls)))]
    try:
        if tasks:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                error = task.exception()
                if error is not None:
                    raise error
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return results


def run_blocking(make: Callable[[], Awaitable[T]]) -> T:
    """Runs the coroutine ``make()`` to its end on a new event loop and returns its result.

    From sync code: on this thread, or, where an event loop already runs on this thread
    (sync code called from a coroutine), on a helper thread this call waits for, so that
    the running loop is not re-entered (it is held up for the time, as by any sync call).

    Example::

        indexes = run_blocking(dataset.load_indexes)   # in __len__, say
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return _run(make)
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = _run(make)
        except BaseException as error:  # handed to the caller's thread
            outcome["error"] = error

    thread = threading.Thread(target=target, name="aioload-blocking", daemon=True)
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]  # type: ignore[no-any-return]


def _run(make: Callable[[], Awaitable[T]]) -> T:
    async def main() -> T:
        return await make()

    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(main())
