"""Reads that start before every footer is in: a stream's first row groups, read early.

A stream whose row groups are the files' in their order (``split="row_groups"``, no
``shuffle_row_groups``, not resumed: every ``stride``-th unit from ``offset``, the rank's and
worker's) knows its first read before the footers of the later files are in: its row groups
of the first files, as many as its read-ahead takes (at least one), each file's together —
what :class:`~aioload.sources.parquet.stream.RowStream`'s first refill asks for. So while the
footers arrive (:meth:`ParquetFiles.load <aioload.sources.parquet.files.ParquetFiles.load>`
reports each one), :class:`EarlyReads` starts the read of each file whose footer and those
of every file before it are in (a file's first unit is then known), in the files' order,
:data:`~aioload.sources.parquet.stream.FILES_AT_ONCE` at a time.

Nothing read early is used unless it is exactly what the stream asks for: the stream's
first refill takes a read only for the same units, which must be the same files' same row
groups once every footer is checked (:meth:`EarlyReads.take`); what it does not take is
cancelled. A read that failed is read again by the stream, under its fault policy. So the
batches, the states and the errors are those of a stream that waited for every footer.

Example::

    early = EarlyReads(files, read_ahead)
    await files.load(on_footer=early.footer_in)
    stream = RowStream(..., early=early)      # its first refill takes the reads started
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from aioload.sources.parquet.footer import Footer
from aioload.sources.parquet.read import leaf_columns

if TYPE_CHECKING:
    from aioload.sources.parquet.files import ParquetFiles

__all__ = ["EarlyReads"]

logger = logging.getLogger("aioload")


class EarlyReads:
    """The reads of a stream's first refill, started as the footers arrive (see above).

    Args:
        files: the files (not loaded yet).
        read_ahead: the stream's read-ahead, in column-chunk bytes (at least one row group).
        files_at_once: the most files read at once (the stream shares the limit).
        offset: the stream's first unit (``rank + world_size * worker``).
        stride: it reads every ``stride``-th unit from there (``world_size * workers``).
    """

    def __init__(
        self,
        files: ParquetFiles,
        read_ahead: int,
        files_at_once: int,
        offset: int = 0,
        stride: int = 1,
    ) -> None:
        self._files = files
        self._offset, self._stride = offset, stride
        self._budget = read_ahead
        self._arrived: dict[int, Footer | None] = {}
        self._next_file = 0  # the first file whose footer the known prefix waits for
        self._next_unit = 0  # that file's first unit
        self._bytes = 0
        self._done = False  # the first refill is planned whole (or guessing stopped)
        self._reads: dict[tuple[int, ...], tuple[list[tuple[int, int]], asyncio.Task[Any]]] = {}
        self.files_at_once = asyncio.Semaphore(files_at_once)

    def footer_in(self, file: int, footer: Footer | None) -> None:
        """File ``file``'s footer arrived (None: it cannot be read): reads what it allows."""
        self._arrived[file] = footer
        try:
            while not self._done and self._next_file in self._arrived:
                number = self._next_file
                self._next_file += 1
                self._plan_file(number, self._arrived.pop(number))
        except Exception:  # a footer the checks will refuse: load() says why, not this
            logger.debug("early Parquet reads stop", exc_info=True)
            self._done = True

    def _plan_file(self, file: int, footer: Footer | None) -> None:
        if footer is None:
            return  # left out: no units
        files = self._files
        leaves = leaf_columns(footer, files.columns, files.urls[file])
        units: list[int] = []
        groups: list[int] = []
        for group, rows in enumerate(footer.row_counts):
            unit = self._next_unit + group
            if unit % self._stride != self._offset or not rows:
                continue  # another stream's, or empty (a stream reads no empty range)
            size = sum(chunk.end - chunk.first for chunk in footer.chunks(group, leaves))
            # The refill's rule (RowStream._top_up): the first row group, then while the
            # bytes stay within the read-ahead.
            if (units or self._reads) and self._bytes + size > self._budget:
                self._done = True
                break
            self._bytes += size
            units.append(unit)
            groups.append(group)
        self._next_unit += len(footer.row_counts)
        if groups:
            task = asyncio.ensure_future(self._read(file, footer, groups))
            self._reads[tuple(units)] = ([(file, group) for group in groups], task)

    async def _read(self, file: int, footer: Footer, groups: list[int]) -> list[Any]:
        async with self.files_at_once:
            return await self._files.read_groups(file, footer, groups)

    def take(self, units: list[int]) -> asyncio.Task[Any] | None:
        """The read started for exactly ``units`` (one file's), if it is still theirs."""
        found = self._reads.pop(tuple(units), None)
        if found is None:
            return None
        places, task = found
        if [self._files.units[unit] for unit in units] != places:
            task.cancel()  # numbered otherwise once every footer was in: not these rows
            return None
        return task

    def cancel(self) -> None:
        """Cancels the reads not taken (the stream's first refill is planned)."""
        self._done = True
        for _, task in self._reads.values():
            if task.done() and not task.cancelled():
                task.exception()  # a failed read nobody took: nothing to report
            task.cancel()
        self._reads.clear()
