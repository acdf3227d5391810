"""Shared test fixtures: every test must leave no aioload thread behind."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

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
