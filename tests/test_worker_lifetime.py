"""Worker processes never outlive the process that started them, however it ends.

- A ``multiprocessing`` child whose loader has persistent workers (and an
  epoch still fetching) leaves at once when its target returns: children skip
  ``atexit``, so the pool stops from multiprocessing's own exit function, and
  the workers are gone with it. The child may be forked from a process that
  already runs a fork server: the child starts its own.
- A process killed with SIGKILL leaves no worker behind, even one busy in a
  long sync read, or whose command socket another process still holds.

Every process a child starts carries a marker in its environment, so the test
finds them all — restarted workers and the child's fork server included —
without trusting the child to list them. A process counts as gone once it no
longer runs (an orphan's zombie waits for whoever reaps it).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from marked import marked_processes, running

from aioload import DataLoader
from tests.conftest import wait_until

ROOT = Path(__file__).resolve().parents[1]
GONE_WITHIN = 5.0  # seconds
MARK = "AIOLOAD_TEST_LIFETIME_MARK"


class SlowAfterTwo:
    """Keys 0 and 1 come at once, every other one takes ``delay`` seconds."""

    def __init__(self, n: int = 64, delay: float = 0.2) -> None:
        self.n, self.delay = n, delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        if index >= 2:
            time.sleep(self.delay)
        return os.getpid()


def _marked(mark: str) -> list[int]:
    """The running processes whose environment holds ``MARK=mark``."""
    return marked_processes(MARK, mark)


def _is_resource_tracker(pid: int) -> bool:
    try:
        return b"multiprocessing.resource_tracker" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _parent(pid: int) -> int:
    text = Path(f"/proc/{pid}/stat").read_text()
    return int(text[text.rindex(")") + 2 :].split()[1])


def _kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# -- a multiprocessing child ----------------------------------------------------------

_kept: list[Any] = []  # the child's loader and iterator: alive until the child exits


def _child(mark: str, report: Any) -> None:
    os.environ[MARK] = mark  # inherited by the child's fork server and workers
    loader = DataLoader(SlowAfterTwo(), batch_size=2, num_workers=2, persistent_workers=True)
    iterator = iter(loader)
    batch = next(iterator)  # the other workers' batches are still being read
    _kept.extend([loader, iterator])
    report.put(sorted({int(pid) for pid in batch.tolist()}))
    # Returning now: multiprocessing's exit runs while the epoch is mid-flight.


@pytest.mark.timeout(60)
@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_a_multiprocessing_child_with_persistent_workers_exits_at_once(method: str) -> None:
    # This process runs a fork server of its own first, as after any loader with workers:
    # a forked child inherits the server's state, which is no use to it.
    assert list(DataLoader(SlowAfterTwo(n=2), batch_size=2, num_workers=1))
    context = multiprocessing.get_context(method)
    mark = uuid.uuid4().hex
    report = context.Queue()
    child = context.Process(target=_child, args=(mark, report), name="loader-child")
    child.start()
    try:
        pids = report.get(timeout=30)
        assert pids, "the child's loader delivered no batch"
        started = time.monotonic()
        child.join(10)
        assert child.exitcode is not None, "the child hung at exit"
        assert child.exitcode == 0
        assert time.monotonic() - started < GONE_WITHIN
        assert wait_until(lambda: not _marked(mark), GONE_WITHIN), (
            f"left behind by the child: {_marked(mark)}"
        )
    finally:
        if child.exitcode is None:
            child.kill()
            child.join()
        _kill(_marked(mark))
        report.close()
        report.join_thread()


# -- a process killed with SIGKILL -------------------------------------------------------

_SCRIPT = """
import multiprocessing, os, sys, time
from aioload import DataLoader

class Slow:
    def __init__(self, delay):
        self.delay = delay
    def __len__(self):
        return 64
    def __getitem__(self, index):
        if index >= 2:
            time.sleep(self.delay)
        return os.getpid()

if __name__ == "__main__":
    how = sys.argv[1]
    if how == "template":  # obstore's runtime starts after the loader: the fork template
        import obstore
        from obstore.store import MemoryStore
    loader = DataLoader(
        Slow(60 if how == "busy" else 0), batch_size=2, num_workers=2, persistent_workers=True
    )
    if how == "template":
        obstore.put(MemoryStore(), "x", b"x")
        # Its threads name themselves as they start: wait until they have.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(
            open(f"/proc/self/task/{task}/comm").read().startswith("tokio")
            for task in os.listdir("/proc/self/task")
        ):
            time.sleep(0.01)
    iterator = iter(loader)
    next(iterator)
    time.sleep(0.5)  # busy: each worker is inside a 60 s read; else: all read, waiting
    workers = [
        p.pid for p in multiprocessing.active_children() if p.name.startswith("aioload-worker")
    ]
    holder = 0
    if how == "socket-held":
        holder = os.fork()  # holds copies of the loader's ends of the workers' sockets
        if holder == 0:
            time.sleep(60)
            os._exit(0)
    print(" ".join(map(str, workers)), holder, flush=True)
    time.sleep(60)
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["idle", "busy", "socket-held", "template"])
def test_a_process_killed_with_sigkill_leaves_no_worker(tmp_path: Path, how: str) -> None:
    script = tmp_path / "killed.py"
    script.write_text(textwrap.dedent(_SCRIPT))
    mark = uuid.uuid4().hex
    env = {**os.environ, "PYTHONPATH": str(ROOT), MARK: mark}
    process = subprocess.Popen(
        [sys.executable, str(script), how], env=env, stdout=subprocess.PIPE, text=True
    )
    holder = 0
    try:
        assert process.stdout is not None
        *workers, holder = map(int, process.stdout.readline().split())
        assert len(workers) == 2 and all(running(pid) for pid in workers)
        if how == "template":  # started by the template, not by the killed process
            assert all(_parent(pid) != process.pid for pid in workers)
        process.kill()
        process.wait()
        assert wait_until(lambda: not any(running(pid) for pid in workers), GONE_WITHIN), (
            f"workers left after SIGKILL: {[pid for pid in workers if running(pid)]}"
        )
        # Nothing else of the killed process stays either (its fork server or its fork
        # template, say), but the holder and multiprocessing's resource tracker, whose pipe
        # the holder holds.
        allowed = {holder, *(pid for pid in _marked(mark) if _is_resource_tracker(pid) and holder)}
        assert wait_until(lambda: set(_marked(mark)) <= allowed, GONE_WITHIN), _marked(mark)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if holder:
            _kill([holder])
        _kill([pid for pid in _marked(mark) if pid != holder])
        if process.stdout is not None:
            process.stdout.close()
