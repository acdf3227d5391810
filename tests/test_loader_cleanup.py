"""Leaving the loop early stops everything the iteration started.

After ``break``, an exception in the loop body, an explicit close, the iterator
being garbage-collected or Ctrl-C, no aioload thread is alive (checked by the
autouse fixture in ``conftest.py``, and here right away) and, under
``async for``, no task of the epoch is pending. An un-awaited coroutine would
fail the test too: the pytest configuration turns ``RuntimeWarning`` into errors.
"""

from __future__ import annotations

import _thread
import asyncio
import gc
import itertools
import signal
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from aioload import DataLoader, IterableDataset
from tests.conftest import aioload_threads, wait_until


class SyncSquares:
    def __init__(self, n: int, delay: float = 0.0) -> None:
        self.n = n
        self.delay = delay

    def __getitem__(self, i: int) -> int:
        if self.delay:
            time.sleep(self.delay)
        return i * i

    def __len__(self) -> int:
        return self.n


class CountingSquares(SyncSquares):
    def __init__(self, n: int, delay: float) -> None:
        super().__init__(n, delay)
        self.calls = 0

    def __getitem__(self, i: int) -> int:
        self.calls += 1
        return super().__getitem__(i)


class SlowAsyncSquares:
    """Every key but the first few hangs for 10 s: only cancellation can end the epoch quickly."""

    def __init__(self, n: int, fast: int = 4, delay: float = 10.0) -> None:
        self.n = n
        self.fast = fast
        self.delay = delay

    async def __getitem__(self, i: int) -> int:
        await asyncio.sleep(0 if i < self.fast else self.delay)
        return i * i

    def __len__(self) -> int:
        return self.n


class AsyncStream(IterableDataset[int]):
    def __init__(self, n: int | None) -> None:
        self.n = n

    async def __aiter__(self) -> AsyncIterator[int]:
        for i in itertools.count() if self.n is None else range(self.n):
            await asyncio.sleep(0)
            yield i


class EndlessStream(IterableDataset[int]):
    def __iter__(self) -> Iterator[int]:
        return itertools.count()


def make_dataset(kind: str) -> Any:
    if kind == "sync":
        return SyncSquares(100)
    if kind == "async-slow":
        return SlowAsyncSquares(100)
    return AsyncStream(100)


KINDS = ["sync", "async-slow", "async-iterable"]


def assert_stopped_now() -> None:
    """No aioload thread within a short wait (the fixture waits longer; cleanup must be prompt)."""
    assert wait_until(lambda: not aioload_threads(), timeout=1.0), aioload_threads()


async def assert_no_pending_tasks() -> None:
    current = asyncio.current_task()

    def others() -> set[asyncio.Task[Any]]:
        return {t for t in asyncio.all_tasks() if t is not current and not t.done()}

    deadline = time.monotonic() + 1.0
    while others() and time.monotonic() < deadline:
        await asyncio.sleep(0.005)
    assert not others(), others()
    assert_stopped_now()


# --- plain `for` ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_for_break(kind: str) -> None:
    start = time.monotonic()
    for i, _ in enumerate(DataLoader(make_dataset(kind), batch_size=2)):
        if i == 1:
            break
    assert_stopped_now()
    assert time.monotonic() - start < 2.0


@pytest.mark.parametrize("kind", KINDS)
def test_for_exception_in_body(kind: str) -> None:
    with pytest.raises(ZeroDivisionError):
        for _ in DataLoader(make_dataset(kind), batch_size=2):
            1 / 0  # noqa: B018
    assert_stopped_now()


@pytest.mark.parametrize("kind", KINDS)
def test_for_explicit_close(kind: str) -> None:
    it = iter(DataLoader(make_dataset(kind), batch_size=2))
    next(it)
    it.close()  # type: ignore[attr-defined]
    assert_stopped_now()
    with pytest.raises(StopIteration):
        next(it)


@pytest.mark.parametrize("kind", KINDS)
def test_for_iterator_garbage_collected(kind: str) -> None:
    it = iter(DataLoader(make_dataset(kind), batch_size=2))
    next(it)
    del it
    gc.collect()
    assert_stopped_now()


def test_for_keyboard_interrupt_raised_in_body() -> None:
    with pytest.raises(KeyboardInterrupt):
        for _ in DataLoader(SyncSquares(100), batch_size=2):
            raise KeyboardInterrupt
    assert_stopped_now()


def interrupt_main_thread() -> None:
    """A real SIGINT aimed at the main thread, as Ctrl-C in a terminal usually is."""
    main = threading.main_thread().ident
    assert main is not None
    signal.pthread_kill(main, signal.SIGINT)


@pytest.mark.parametrize("kind", ["sync", "async-slow"])
def test_for_keyboard_interrupt_while_waiting_for_a_batch(kind: str) -> None:
    # A running sync `__getitem__` cannot be interrupted: keep the sync dataset short.
    dataset = SyncSquares(4, delay=0.2) if kind == "sync" else SlowAsyncSquares(100, fast=0)
    timer = threading.Timer(0.1, interrupt_main_thread)
    start = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            timer.start()
            for _ in DataLoader(dataset, batch_size=2):
                pass
    finally:
        timer.cancel()
        timer.join()
    assert time.monotonic() - start < 2.0
    assert_stopped_now()


def test_for_keyboard_interrupt_from_interrupt_main_is_prompt() -> None:
    timer = threading.Timer(0.1, _thread.interrupt_main)
    start = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            timer.start()
            for _ in DataLoader(SlowAsyncSquares(100, fast=0, delay=1.5), batch_size=2):
                pass
    finally:
        timer.cancel()
        timer.join()
    assert time.monotonic() - start < 1.0


def test_for_break_stops_reading_a_slow_sync_dataset() -> None:
    dataset = CountingSquares(30, delay=0.02)
    for i, _ in enumerate(DataLoader(dataset, batch_size=1)):
        if i == 1:
            break
    assert_stopped_now()
    assert dataset.calls <= 10, f"{dataset.calls} of 30 items read after break at batch 1"


def test_for_endless_stream_break() -> None:
    loader = DataLoader(EndlessStream(), batch_size=4)
    for i, batch in enumerate(loader):
        assert batch.tolist() == list(range(4 * i, 4 * i + 4))
        if i == 5:
            break
    assert_stopped_now()


# --- `async for` ---------------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", KINDS)
async def test_async_for_break(kind: str) -> None:
    start = time.monotonic()
    async for i, _ in aenumerate(DataLoader(make_dataset(kind), batch_size=2)):
        if i == 1:
            break
    await assert_no_pending_tasks()
    assert time.monotonic() - start < 2.0


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", KINDS)
async def test_async_for_exception_in_body(kind: str) -> None:
    with pytest.raises(ZeroDivisionError):
        async for _ in DataLoader(make_dataset(kind), batch_size=2):
            1 / 0  # noqa: B018
    await assert_no_pending_tasks()


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", KINDS)
async def test_async_for_aclose(kind: str) -> None:
    it = aiter(DataLoader(make_dataset(kind), batch_size=2))
    await anext(it)
    start = time.monotonic()
    await it.aclose()  # type: ignore[attr-defined]
    assert time.monotonic() - start < 1.0
    await assert_no_pending_tasks()


@pytest.mark.asyncio
async def test_async_for_anext_after_aclose_ends() -> None:
    it = aiter(DataLoader(SyncSquares(10), batch_size=2))
    await anext(it)
    await it.aclose()  # type: ignore[attr-defined]
    with pytest.raises(StopAsyncIteration):
        async with asyncio.timeout(0.5):
            await anext(it)


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", KINDS)
async def test_async_for_iterator_garbage_collected(kind: str) -> None:
    it = aiter(DataLoader(make_dataset(kind), batch_size=2))
    await anext(it)
    del it
    gc.collect()
    await assert_no_pending_tasks()


@pytest.mark.asyncio
async def test_async_for_endless_stream_break() -> None:
    loader = DataLoader(AsyncStream(None), batch_size=4)
    async for i, batch in aenumerate(loader):
        assert batch.tolist() == list(range(4 * i, 4 * i + 4))
        if i == 5:
            break
    await assert_no_pending_tasks()


async def aenumerate(iterable: Any) -> AsyncIterator[tuple[int, Any]]:
    i = 0
    async for item in iterable:
        yield i, item
        i += 1
