"""Shared test fixtures: every test must leave no aioload thread behind."""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Iterator

import pytest

# Worker processes import the test modules to unpickle their datasets, and with
# them pytest (about 0.3 s of CPU per worker start). The fork server, started by
# the first worker test, imports pytest once for all of them. Only a server that
# is not running yet takes a preload list; aioload adds its own modules to it.
multiprocessing.set_forkserver_preload(["__main__", "pytest"])


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
