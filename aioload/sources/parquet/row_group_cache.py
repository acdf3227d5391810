"""Decoded row groups kept in memory, least recently used out first, bounded by bytes.

A map-style read of a batch needs a few rows of each of several row groups; the next
batch, drawn from the same files, likely needs the same row groups again. :class:`RowGroupCache`
keeps the decoded tables of a process (each worker has its own) up to ``limit`` bytes of
Arrow memory, and reads a row group wanted by several batches at once only once.

Loop-safe: one dataset may be read by several loaders at once, each on its own event loop
in its own thread (two ``DataLoader`` iterations in two threads, an ``async for`` on a
service's loop beside a sync loop). The tables kept are shared by all of them (a lock
guards them); a read in flight is a task, which belongs to the loop that made it, so the
reads are shared within a loop only: two loops that want one row group at the same moment
read it once each, and whichever finishes last keeps it.

Example::

    cache = RowGroupCache(files.read, limit=256 << 20)
    table = await cache.get(17)
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

import pyarrow as pa

__all__ = ["RowGroupCache"]


class _Read:
    """A read in flight on one loop, and the batches of that loop awaiting it."""

    __slots__ = ("task", "waiting")

    def __init__(self, task: asyncio.Task[pa.Table]) -> None:
        self.task = task
        self.waiting = 0


class RowGroupCache:
    """Unit number -> decoded table, within ``limit`` bytes (see the module docstring).

    Args:
        read: reads one unit (row group) from the store.
        limit: the most bytes of tables kept (0: none kept; a read is still shared by
            the batches of one loop waiting for it). The tables a batch is using stay
            alive while it does, whatever the cache drops.
    """

    def __init__(self, read: Callable[[int], Awaitable[pa.Table]], limit: int) -> None:
        self._read = read
        self.limit = limit
        self._lock = threading.Lock()  # the tables, their bytes and the reads' registry
        self._kept: OrderedDict[int, pa.Table] = OrderedDict()
        self._bytes = 0
        # Per loop (present while it has reads in flight): unit -> its read there.
        self._reads: dict[asyncio.AbstractEventLoop, dict[int, _Read]] = {}

    @property
    def size(self) -> int:
        """The bytes of the tables kept."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._kept)

    async def get(self, unit: int) -> pa.Table:
        """Unit ``unit``'s table: kept, being read for another batch, or read now."""
        loop = asyncio.get_running_loop()
        with self._lock:
            table = self._kept.get(unit)
            if table is not None:
                self._kept.move_to_end(unit)
                return table
            reads = self._reads.setdefault(loop, {})
            read = reads.get(unit)
            if read is None:
                read = reads[unit] = _Read(loop.create_task(self._fill(unit)))
            read.waiting += 1
        try:
            # Shielded: one batch cancelled must not cancel the read another batch awaits.
            return await asyncio.shield(read.task)
        finally:
            with self._lock:
                read.waiting -= 1
                abandoned = read.waiting == 0 and not read.task.done()
                if abandoned:
                    # Nobody waits for it: the read ends with its batches (a later batch
                    # that wants the unit starts a read of its own).
                    self._forget(loop, unit, read)
            if abandoned:
                read.task.cancel()

    async def _fill(self, unit: int) -> pa.Table:
        loop = asyncio.get_running_loop()
        try:
            table = await self._read(unit)
        finally:
            with self._lock:
                read = self._reads.get(loop, {}).get(unit)
                if read is not None and read.task is asyncio.current_task():
                    self._forget(loop, unit, read)
        size = int(table.nbytes)
        if size <= self.limit:
            with self._lock:
                if unit not in self._kept:  # another loop's read of it may have kept it
                    self._kept[unit] = table
                    self._bytes += size
                while self._bytes > self.limit:
                    _, dropped = self._kept.popitem(last=False)
                    self._bytes -= int(dropped.nbytes)
        return table

    def _forget(self, loop: asyncio.AbstractEventLoop, unit: int, read: _Read) -> None:
        """Drops ``read`` from ``loop``'s reads in flight (the lock held)."""
        reads = self._reads.get(loop)
        if reads is not None and reads.get(unit) is read:
            del reads[unit]
            if not reads:
                del self._reads[loop]  # no reference to a loop outlives its reads

    def clear(self) -> None:
        """Drops every table kept."""
        with self._lock:
            self._kept.clear()
            self._bytes = 0

    def __getstate__(self) -> dict[str, Any]:
        # Tables and reads stay in the process that made them: a copy starts empty.
        return {"_read": self._read, "limit": self.limit}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["_read"], state["limit"])  # type: ignore[misc]
