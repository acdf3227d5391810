"""A read that never returns, and Ctrl-C at any moment, never hang the program.

- ``timeout=``: the :class:`~aioload.LoaderTimeoutError` reaches the caller about
  when the timeout expires, whatever the dataset does; the stuck sync call is
  abandoned (its daemon thread is named ``aioload-abandoned``), nothing else is
  left, interpreter exit does not wait for it, and a later epoch works.
- Ctrl-C: the KeyboardInterrupt reaches the program while it waits for a batch,
  during ``iter()``, during the teardown after ``break`` and during garbage
  collection of the iterator, and the program does not carry on. Tested on a
  subprocess, sent a real SIGINT once it says it is at the chosen moment.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aioload import DataLoader, LoaderTimeoutError
from tests.conftest import aioload_threads, wait_until

ROOT = Path(__file__).resolve().parents[1]


class Blocks:
    """Keys from ``stuck_at`` on block (sleeping, or spinning) until ``release`` is set."""

    def __init__(self, n: int, stuck_at: int, spin: bool = False) -> None:
        self.n = n
        self.stuck_at = stuck_at
        self.spin = spin
        self.release = threading.Event()
        self.blocking = True

    def __getitem__(self, i: int) -> int:
        if self.blocking and i >= self.stuck_at:
            if self.spin:
                while not self.release.is_set():
                    pass
            else:
                self.release.wait()
        return i

    def __len__(self) -> int:
        return self.n


@pytest.fixture
def blocks(request: pytest.FixtureRequest) -> Iterator[Blocks]:
    dataset = Blocks(8, stuck_at=2, spin=request.param == "spin")
    yield dataset
    dataset.release.set()  # the abandoned call ends, and so does its thread


def names() -> list[str]:
    return sorted(t.name for t in aioload_threads())


def assert_only_the_abandoned_thread_is_left(dataset: Blocks) -> None:
    # Idle fetch threads end as the epoch closes: give them a moment.
    assert wait_until(lambda: names() == ["aioload-abandoned"], timeout=1.0), names()
    dataset.release.set()
    assert wait_until(lambda: not aioload_threads(), timeout=2.0), names()


@pytest.mark.timeout(20)
@pytest.mark.parametrize("blocks", ["sleep", "spin"], indirect=True)
def test_for_timeout_is_raised_while_a_sync_read_blocks(blocks: Blocks) -> None:
    loader: DataLoader[Any] = DataLoader(blocks, batch_size=2, timeout=0.5)
    got = []
    start = time.monotonic()
    with pytest.raises(LoaderTimeoutError, match=r"batch 1 \(keys \[2, 3\]\)"):
        for batch in loader:
            got.append(batch.tolist())
    assert time.monotonic() - start < 1.5
    assert got == [[0, 1]]
    assert_only_the_abandoned_thread_is_left(blocks)
    blocks.blocking = False
    assert [batch.tolist() for batch in loader] == [[0, 1], [2, 3], [4, 5], [6, 7]]


@pytest.mark.timeout(20)
@pytest.mark.parametrize("blocks", ["sleep", "spin"], indirect=True)
def test_async_for_timeout_is_raised_while_a_sync_read_blocks(blocks: Blocks) -> None:
    loader: DataLoader[Any] = DataLoader(blocks, batch_size=2, timeout=0.5)

    async def consume() -> list[list[int]]:
        return [batch.tolist() async for batch in loader]

    start = time.monotonic()
    with pytest.raises(LoaderTimeoutError, match=r"batch 1 \(keys \[2, 3\]\)"):
        asyncio.run(consume())  # returns only once the epoch's tasks are done
    assert time.monotonic() - start < 1.5
    assert_only_the_abandoned_thread_is_left(blocks)
    blocks.blocking = False
    assert asyncio.run(consume()) == [[0, 1], [2, 3], [4, 5], [6, 7]]


@pytest.mark.timeout(20)
@pytest.mark.parametrize("blocks", ["sleep"], indirect=True)
def test_the_iterator_ends_after_a_timeout(blocks: Blocks) -> None:
    iterator = iter(DataLoader(blocks, batch_size=2, timeout=0.3))
    assert next(iterator).tolist() == [0, 1]
    with pytest.raises(LoaderTimeoutError):
        next(iterator)
    with pytest.raises(StopIteration):
        next(iterator)
    assert_only_the_abandoned_thread_is_left(blocks)


def run_script(code: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


EXITS = """
    import asyncio, sys, time
    from aioload import DataLoader, LoaderTimeoutError

    class Hangs:
        def __getitem__(self, i):
            if i >= 2:
                if sys.argv[1] == "spin":
                    while True:
                        pass
                time.sleep(60)
            return i

        def __len__(self):
            return 8

    loader = DataLoader(Hangs(), batch_size=2, timeout=0.5)

    async def consume():
        async for _ in loader:
            pass

    try:
        if sys.argv[2] == "for":
            for _ in loader:
                pass
        else:
            asyncio.run(consume())
    except LoaderTimeoutError:
        print("caught", flush=True)
"""


@pytest.mark.timeout(30)
@pytest.mark.parametrize("style", ["for", "async for"])
@pytest.mark.parametrize("hang", ["sleep", "spin"])
def test_interpreter_exit_does_not_wait_for_an_abandoned_read(hang: str, style: str) -> None:
    start = time.monotonic()
    done = run_script(EXITS.replace("sys.argv[1]", repr(hang)).replace("sys.argv[2]", repr(style)))
    assert time.monotonic() - start < 10
    assert done.returncode == 0, done.stderr
    assert done.stdout == "caught\n"


# --- Ctrl-C --------------------------------------------------------------------------------

INTERRUPTED = """
    import gc, sys, threading, time
    from aioload import DataLoader
    from aioload.pipeline.iteration import SyncBatchIterator

    MOMENT, TIMEOUT = {moment!r}, {timeout!r}

    reading = threading.Event()

    class Slow:
        def __getitem__(self, i):
            if i == 1:
                reading.set()
                print("ready", flush=True)
                time.sleep(60)
            return i

        def __len__(self):
            return 8

    def carry_on():
        print("carried on", flush=True)

    loader = DataLoader(Slow(), batch_size=1, timeout=TIMEOUT)
    if MOMENT == "waiting":
        for _ in loader:
            pass
    elif MOMENT == "break":
        for _ in loader:
            reading.wait()  # the teardown has a read to wait for
            break
    elif MOMENT == "del":
        iterator = iter(loader)
        next(iterator)
        reading.wait()
        del iterator
    elif MOMENT == "gc":
        iterator = iter(loader)
        next(iterator)
        reading.wait()
        iterator.cycle = iterator
        del iterator
        gc.collect()
    elif MOMENT == "iter":
        def slow_epoch(loop, output, offload):
            print("ready", flush=True)
            time.sleep(60)
            return loader._new_epoch(loop, output, offload)

        iter(SyncBatchIterator(slow_epoch, TIMEOUT))
    carry_on()
"""


@pytest.mark.timeout(30)
@pytest.mark.parametrize("timeout", [0, 30])
@pytest.mark.parametrize("moment", ["waiting", "iter", "break", "del", "gc"])
def test_ctrl_c_reaches_the_program(moment: str, timeout: float) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    code = textwrap.dedent(INTERRUPTED).format(moment=moment, timeout=timeout)
    process = subprocess.Popen(
        [sys.executable, "-c", code],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline() == "ready\n"
        time.sleep(0.3)  # into the wait: the consumer's, or the teardown's
        sent = time.monotonic()
        os.kill(process.pid, signal.SIGINT)
        out, err = process.communicate(timeout=15)
    finally:
        process.kill()
        process.wait()
    # The interrupt waits a grace second for the stuck read, then abandons it.
    assert time.monotonic() - sent < 5
    assert process.returncode in (130, -signal.SIGINT), err
    assert err.rstrip().endswith("KeyboardInterrupt"), err
    assert "Exception ignored" not in err
    assert out == "", out  # nothing after the interrupt: the program did not carry on
