"""A request budget: at most so many GET requests per second, shared by every process that
reads one dataset.

``max_requests_per_second=`` of the object-store datasets makes a :class:`RequestBudget`,
which travels with the dataset to its worker processes: every copy of the dataset on the
host takes its requests' turns from the same budget, so ``num_workers=8`` does not make the
store see eight times the rate.

How: the budget is one number, the time the next request may go (the "theoretical arrival
time" of GCRA, a token bucket without a burst), kept in an 8-byte file and updated under an
``flock`` of it. A request takes the later of that time and now, moves it on by
``1 / rate`` and waits until its turn: requests leave at most ``rate`` a second, evenly
spaced, whichever process sends them. The clock is ``CLOCK_MONOTONIC``, one for every process
of a host. The file is made by the process that made the dataset and removed when that
dataset is collected (a copy unpickled on another host makes its own budget there); a
process forked with a copy opens the file anew, since an ``flock`` belongs to an open file
and a forked process shares its parent's.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import struct
import tempfile
import threading
import time
import weakref
from typing import Any

from aioload.checks import is_real

__all__ = ["RequestBudget", "check_rate"]

_SLOT = struct.Struct("d")


def check_rate(rate: Any) -> float | None:
    """``max_requests_per_second`` checked: None (no budget) or a number of requests > 0.

    Example::

        >>> check_rate(None), check_rate(1000)
        (None, 1000.0)
    """
    if rate is None:
        return None
    if not is_real(rate) or not 0 < float(rate) < float("inf"):
        raise ValueError(
            f"max_requests_per_second should be a number of requests > 0 (or None: no "
            f"budget); got {rate!r}"
        )
    return float(rate)


def _folder() -> str | None:
    # Memory, not disk, where the host has it: every request reads and writes the file.
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


class RequestBudget:
    """At most ``rate`` requests a second, shared by the processes that hold a copy.

    Args:
        rate: requests per second (> 0).
        path: the file of a budget made elsewhere (what a copy is unpickled with).

    Example::

        >>> budget = RequestBudget(1000)
        >>> [round(budget.reserve(), 3) for _ in range(3)] < [0.001, 0.002, 0.003]
        True
        >>> budget.close()
    """

    def __init__(self, rate: float, *, path: str | None = None) -> None:
        checked = check_rate(rate)
        if checked is None:
            raise ValueError("a RequestBudget needs a rate")
        self.rate = checked
        if path is None:
            descriptor, path = tempfile.mkstemp(prefix="aioload-budget-", dir=_folder())
            owner = True
        else:  # a copy: the maker's file, or one of its own where there is none (another host)
            owner = not os.path.exists(path)
            descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        self.path = path
        self._descriptor = descriptor
        self._pid = os.getpid()
        # An flock excludes other open files, not the threads sharing this one (two loaders
        # of one process reading the dataset at once): they take this lock first.
        self._lock = threading.Lock()
        # The process that made the file removes it; the others only close theirs.
        self._finalizer = weakref.finalize(
            self, _close, descriptor, path if owner else None, self._pid
        )

    def reserve(self) -> float:
        """Takes the next request's turn; returns the seconds to wait for it (0: go now)."""
        if os.getpid() != self._pid:
            self._reopen()
        with self._lock:
            descriptor = self._descriptor
            fcntl.flock(descriptor, fcntl.LOCK_EX)
            try:
                now = time.monotonic()
                data = os.pread(descriptor, _SLOT.size, 0)
                turn = max(now, _SLOT.unpack(data)[0] if len(data) == _SLOT.size else 0.0)
                os.pwrite(descriptor, _SLOT.pack(turn + 1.0 / self.rate), 0)
            finally:
                fcntl.flock(descriptor, fcntl.LOCK_UN)
        return turn - now

    def _reopen(self) -> None:
        # A forked process shares its parent's open file, and with it the flock (a lock
        # belongs to the open file, not to the process): it opens the file anew.
        descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        self._descriptor, self._pid = descriptor, os.getpid()
        self._lock = threading.Lock()  # the parent's may have been held by another thread
        weakref.finalize(self, _close, descriptor, None, self._pid)

    async def acquire(self) -> None:
        """Waits for this request's turn."""
        wait = self.reserve()
        if wait > 0:
            await asyncio.sleep(wait)

    def close(self) -> None:
        """Closes the file now (the maker removes it), rather than when collected."""
        self._finalizer()

    def __reduce__(self) -> tuple[Any, ...]:
        return (_copy_of, (self.rate, self.path))

    def __repr__(self) -> str:
        return f"RequestBudget({self.rate:g} per second)"


def _copy_of(rate: float, path: str) -> RequestBudget:
    return RequestBudget(rate, path=path)


def _close(descriptor: int, path: str | None, pid: int) -> None:
    try:
        os.close(descriptor)
    except OSError:
        pass
    if path is not None and os.getpid() == pid:  # not a forked copy of the maker
        try:
            os.unlink(path)
        except OSError:
            pass
