"""Shared test fixtures: every test must leave no aioload thread behind."""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import threading
import time
from collections.abc import Iterator

import pytest

from aioload.backends.processes.pool import warm_forkserver

# The object-store servers (SeaweedFS, ObjectServer) as fixtures.
pytest_plugins = ["servers"]  # tests/servers.py (this folder is on sys.path)


def aioload_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("aioload")]


def wait_until(condition: object, timeout: float = 5.0) -> bool:
    """Polls ``condition()`` until it is true or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return True
        time.sleep(0.005)
    return bool(condition())  # type: ignore[operator]


@pytest.fixture(autouse=True)
def no_leaked_threads() -> Iterator[None]:
    yield
    assert wait_until(lambda: not aioload_threads()), f"threads left: {aioload_threads()}"


@pytest.fixture(scope="module")
def process_pool() -> Iterator[concurrent.futures.ProcessPoolExecutor]:
    """A process pool of 2 on the fork server aioload starts for its own workers.

    The server has aioload's modules preloaded, so the pool's processes start in
    milliseconds; the pool is the test's, not aioload's.
    """
    context = multiprocessing.get_context("forkserver")
    warm_forkserver(context)
    with concurrent.futures.ProcessPoolExecutor(2, mp_context=context) as pool:
        yield pool
