"""Shared test fixtures: every test must leave no aioload thread behind."""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from aioload.backends.pool import warm_forkserver

# The object-store servers (SeaweedFS, ObjectServer) as fixtures.
pytest_plugins = ["servers"]  # tests/servers.py (this folder is on sys.path)


# The skips CI allows: torch is absent on Python 3.12 and 3.13 (its tests importorskip it),
# and a doctest whose every example is marked +SKIP. With AIOLOAD_STRICT_SKIPS=1 (set by
# .ci/run) any other skip fails the run: it is a test CI should have run (a dependency
# missing from the `test` extra, a limit of the machine too low), not one to lose quietly.
ALLOWED_SKIPS = ("No module named 'torch'", "all tests skipped by +SKIP option")


def _fail_a_disallowed_skip(report: pytest.CollectReport | pytest.TestReport) -> None:
    if not report.skipped or hasattr(report, "wasxfail"):
        return
    if os.environ.get("AIOLOAD_STRICT_SKIPS") != "1":
        return
    longrepr: Any = report.longrepr
    reason = str(longrepr[2] if isinstance(longrepr, tuple) else longrepr)
    if any(allowed in reason for allowed in ALLOWED_SKIPS):
        return
    report.outcome = "failed"
    report.longrepr = (
        f"{reason}\nAIOLOAD_STRICT_SKIPS=1: this test may not skip (allowed: "
        f"{', '.join(ALLOWED_SKIPS)}; see tests/conftest.py)"
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    _fail_a_disallowed_skip(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Any:
    report = yield  # a module that skips itself (pytest.importorskip at its top)
    _fail_a_disallowed_skip(report)
    return report


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
