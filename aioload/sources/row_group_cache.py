"""Decoded row groups kept in memory, least recently used out first, bounded by bytes.

A map-style read of a batch needs a few rows of each of several row groups; the next
batch, drawn from the same files, likely needs the same row groups again. :class:`RowGroupCache`
keeps the decoded tables of a process (each worker has its own) up to ``limit`` bytes of
Arrow memory, and reads a row group wanted by several batches at once only once.

Example::

    cache = RowGroupCache(files.read, limit=256 << 20)
    table = await cache.get(17)
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

import pyarrow as pa

__all__ = ["RowGroupCache"]


class RowGroupCache:
    """Unit number -> decoded table, within ``limit`` bytes (see the module docstring).

    Args:
        read: reads one unit (row group) from the store.
        limit: the most bytes of tables kept (0: none kept; a read is still shared by
            the batches waiting for it). The tables a batch is using stay alive while
            it does, whatever the cache drops.
    """

    def __init__(self, read: Callable[[int], Awaitable[pa.Table]], limit: int) -> None:
        self._read = read
        self.limit = limit
        self._kept: OrderedDict[int, pa.Table] = OrderedDict()
        self._bytes = 0
        self._reading: dict[int, asyncio.Future[pa.Table]] = {}
        self._waiting: dict[int, int] = {}  # the batches awaiting each read

    @property
    def size(self) -> int:
        """The bytes of the tables kept."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._kept)

    async def get(self, unit: int) -> pa.Table:
        """Unit ``unit``'s table: kept, being read for another batch, or read now."""
        table = self._kept.get(unit)
        if table is not None:
            self._kept.move_to_end(unit)
            return table
        reading = self._reading.get(unit)
        if reading is None:
            reading = asyncio.ensure_future(self._fill(unit))
            self._reading[unit] = reading
            self._waiting[unit] = 0
        self._waiting[unit] += 1
        try:
            # Shielded: one batch cancelled must not cancel the read another batch awaits.
            return await asyncio.shield(reading)
        finally:
            left = self._waiting.get(unit)
            if left is not None:
                self._waiting[unit] = left - 1
                if left == 1 and not reading.done():
                    # Nobody waits for it: the read ends with its batches (a later batch
                    # that wants the unit starts a read of its own).
                    del self._reading[unit], self._waiting[unit]
                    reading.cancel()

    async def _fill(self, unit: int) -> pa.Table:
        try:
            table = await self._read(unit)
        finally:
            if self._reading.get(unit) is asyncio.current_task():
                del self._reading[unit], self._waiting[unit]
        size = int(table.nbytes)
        if size <= self.limit:
            self._kept[unit] = table
            self._bytes += size
            while self._bytes > self.limit:
                _, dropped = self._kept.popitem(last=False)
                self._bytes -= int(dropped.nbytes)
        return table

    def clear(self) -> None:
        """Drops every table kept."""
        self._kept.clear()
        self._bytes = 0

    def __getstate__(self) -> dict[str, Any]:
        # Tables and reads stay in the process that made them: a copy starts empty.
        return {"_read": self._read, "limit": self.limit}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["_read"], state["limit"])  # type: ignore[misc]
