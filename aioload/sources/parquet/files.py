"""The Parquet files of a dataset: where they are, their footers, their row groups, reads.

:class:`ParquetFiles` is what :class:`~aioload.sources.ParquetDataset` and
:class:`~aioload.sources.IterableParquetDataset` share:

- the files: a list of URLs, a brace pattern (``part-{00..07}.parquet``) or a prefix ending
  in ``/``, whose ``*.parquet`` objects are listed (in the store's order, sorted);
- their footers (:mod:`aioload.sources.parquet.footer`), read once, several at a time,
  checked, and kept — they travel to worker processes with the dataset when they were
  loaded before the workers start (``len(dataset)``, or ``await dataset.load()``);
- the requested columns, checked against every file (a missing column or one whose type
  differs from the first file's is an error naming the file);
- with ``skip_unreadable``, the files whose footer cannot be read (missing, truncated, not
  Parquet: what every process reading the file sees alike) are left out, their errors kept
  in :attr:`ParquetFiles.unreadable` for the stream to raise or skip; otherwise the first
  such error fails :meth:`ParquetFiles.load`;
- the row groups of all files, numbered in order (a *unit*: file 0's row groups, then
  file 1's, ...), with their row counts;
- :meth:`ParquetFiles.read` of one unit: its columns' chunks by ranged GETs, decoded.
  Through the local cache when there is one, where every column chunk of every row
  group is an entry of its own (and each footer read): what a cache keeps does not
  depend on which row groups were read together, so an epoch in another order (shuffled
  row groups, other read-ahead) finds the chunks the last one read. The chunks not kept
  are still fetched with as few requests as their places allow (neighbours in one).

Example::

    files = ParquetFiles("s3://bucket/table/", ["text", "label"], None, None, options)
    await files.load()
    table = await files.read(0)    # file 0, row group 0
"""

from __future__ import annotations

import asyncio
import copy
import functools
import logging
import os
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from aioload.sources.cache.local import LocalCache, entry_identity
from aioload.sources.objects.listing import ObjectListing
from aioload.sources.parquet.footer import (
    Footer,
    ParquetFormatError,
    parse_footer,
    read_footer_bytes,
)
from aioload.sources.parquet.read import (
    Placed,
    fetch_coalesced,
    leaf_columns,
    read_row_groups,
)
from aioload.sources.stores.braces import expand_urls
from aioload.sources.stores.reads import read_buffer, read_bytes
from aioload.sources.stores.store import StoreLocations
from aioload.sources.stores.tasks import READS_AT_ONCE, bounded_gather, run_blocking
from aioload.stats.source_counts import SourceCounter
from aioload.urls import redact_url

__all__ = ["PARQUET_SUFFIXES", "ParquetFiles", "check_columns"]

logger = logging.getLogger("aioload")

PARQUET_SUFFIXES = (".parquet", ".parq", ".pq")
"""What a listed object's name ends with to be read as one of a prefix's Parquet files."""


def check_columns(columns: Sequence[str] | None) -> list[str] | None:
    """``columns`` as a list, checked: None (all) or distinct names."""
    if columns is None:
        return None
    if isinstance(columns, str) or not all(isinstance(name, str) for name in columns):
        raise TypeError(f"columns should be a list of column names (str); got {columns!r}")
    names = list(columns)
    if not names:
        raise ValueError("columns is empty: pass None for every column, or name some")
    if len(set(names)) != len(names):
        raise ValueError(f"columns names a column twice: {names!r}")
    return names


class ParquetFiles:
    """The files, footers and row groups of a Parquet dataset (see the module docstring).

    Args:
        urls_or_prefix: file URLs, one URL with a brace pattern, or a prefix ending in ``/``.
        columns: the columns to read (None: all), in this order.
        cache_dir: a local cache folder for the bytes read (None: none).
        cache_limit: its size limit.
        storage_options: the stores' options (see :func:`~aioload.sources.open_store`).
        skip_unreadable: leave out the files whose footer cannot be read (missing,
            truncated, not Parquet), keeping their errors in :attr:`unreadable`, instead
            of failing :meth:`load` with the first one (unless no file can be read).
        hedge: when a slow read is sent again (see :mod:`aioload.sources.stores.hedge`).
        max_requests_per_second: the request budget (see
            :mod:`aioload.sources.stores.budget`).
    """

    def __init__(
        self,
        urls_or_prefix: str | Sequence[str],
        columns: Sequence[str] | None,
        cache_dir: str | os.PathLike[str] | None,
        cache_limit: int | str | None,
        storage_options: Mapping[str, Any] | None,
        *,
        skip_unreadable: bool = False,
        hedge: bool | float = False,
        max_requests_per_second: float | None = None,
    ) -> None:
        self.columns = check_columns(columns)
        if cache_dir is None and cache_limit is not None:
            raise ValueError("cache_limit was given without cache_dir: name the cache's folder")
        self.cache = None if cache_dir is None else LocalCache(cache_dir, cache_limit)
        self.counts = SourceCounter()  # bytes from the store, cache hits: counted where read
        self._locations = StoreLocations(
            storage_options, hedge=hedge, max_requests_per_second=max_requests_per_second
        )
        self.prefix: str | None = None
        self._urls: list[str] | None = None
        if isinstance(urls_or_prefix, str) and urls_or_prefix.endswith("/"):
            self.prefix = urls_or_prefix
            self._locations.of(urls_or_prefix)  # a bad URL or option fails now
        else:
            urls = expand_urls(urls_or_prefix)
            if not urls:
                raise ValueError("a Parquet dataset needs at least one file URL (or a prefix/)")
            for url in urls:
                self._locations.of(url)
            self._urls = urls
        self.skip_unreadable = skip_unreadable
        # File number -> why its footer cannot be read (with skip_unreadable): no units.
        self.unreadable: dict[int, Exception] = {}
        self._footers: list[Footer | None] | None = None
        self._lock = threading.Lock()  # what load() sets, set once by whichever loop is first
        self._leaves: list[list[int]] = []
        self.schema: pa.Schema | None = None
        self.units: list[tuple[int, int]] = []  # (file, row group) of every unit
        self.unit_rows = np.zeros(0, dtype=np.int64)
        self.unit_starts = np.zeros(1, dtype=np.int64)  # a unit's first global row; then total
        self.unit_bytes: list[int] = []  # the column-chunk bytes of the columns read, per unit

    @property
    def urls(self) -> list[str]:
        """The files' URLs (a prefix's, once listed: see :meth:`load`)."""
        if self._urls is None:
            raise RuntimeError(
                f"the files under {redact_url(self.prefix or '')} are not listed yet"
            )
        return self._urls

    @property
    def loaded(self) -> bool:
        """Whether the footers are read."""
        return self._footers is not None

    def load_blocking(self) -> ParquetFiles:
        """:meth:`load`, from sync code (on a helper thread where a loop runs); returns self."""
        if self._footers is None:
            run_blocking(self.load)
        return self

    async def load(self, on_footer: Callable[[int, Footer | None], None] | None = None) -> None:
        """Lists a prefix's files and reads every footer, once; checks the columns.

        Loop-safe: loaders on several event loops (threads) may load one instance at
        once; each reads the footers, and the first to finish sets what every one uses.

        Args:
            on_footer: called with each file's number and footer as it arrives (None:
                one that cannot be read), before the others are in or checked: what a
                stream reads early (:mod:`aioload.sources.parquet.early`).
        """
        if self._footers is not None:
            return
        if self._urls is None:
            listed = await self._list()
            with self._lock:
                if self._urls is None:  # another loop's listing may have been first
                    self._urls = listed
        urls = self.urls
        read = self._footer_or_error if self.skip_unreadable else self._read_footer
        if on_footer is not None:
            read = functools.partial(self._reported, read, on_footer)
        found = await bounded_gather(
            [functools.partial(read, i) for i in range(len(urls))], READS_AT_ONCE
        )
        unreadable = {i: error for i, error in enumerate(found) if isinstance(error, Exception)}
        if len(unreadable) == len(found):
            raise copy.copy(unreadable[0])  # nothing to read at all: no schema, no rows
        footers = [None if isinstance(footer, Exception) else footer for footer in found]
        leaves, schema = self._check_schemas(footers)
        units = [
            (f, g)
            for f, footer in enumerate(footers)
            if footer is not None
            for g in range(len(footer.row_counts))
        ]
        readable: list[Footer] = footers  # type: ignore[assignment]  # at the units' files
        rows = np.array([readable[f].row_counts[g] for f, g in units], dtype=np.int64)
        unit_bytes = [
            sum(chunk.end - chunk.first for chunk in readable[f].chunks(g, leaves[f]))
            for f, g in units
        ]
        with self._lock:
            if self._footers is not None:
                return  # another loop loaded them first: its footers are the ones in use
            self._leaves, self.schema = leaves, schema
            self.units, self.unit_rows = units, rows
            self.unit_starts = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)
            self.unit_bytes = unit_bytes
            self.unreadable = unreadable
            self._footers = footers  # last: what tells every reader the rest is set
        if unreadable:
            logger.warning(
                "%d of %d Parquet files cannot be read and are left out (%s): %s",
                len(unreadable),
                len(found),
                ", ".join(redact_url(urls[i]) for i in list(unreadable)[:3]),
                next(iter(unreadable.values())),
            )

    async def _reported(
        self,
        read: Callable[[int], Awaitable[Footer | Exception]],
        on_footer: Callable[[int, Footer | None], None],
        file: int,
    ) -> Footer | Exception:
        footer = await read(file)
        on_footer(file, None if isinstance(footer, Exception) else footer)
        return footer

    async def _list(self) -> list[str]:
        assert self.prefix is not None
        location, path = self._locations.of(self.prefix)
        keys = await ObjectListing(location, path, 1000).collect()
        root = self.prefix[: len(self.prefix) - len(path)] if path else self.prefix
        urls = sorted(root + key for key in keys if key.lower().endswith(PARQUET_SUFFIXES))
        if not urls:
            raise FileNotFoundError(
                f"no Parquet file (a name ending in {', '.join(PARQUET_SUFFIXES)}) under "
                f"{redact_url(self.prefix)}"
            )
        return urls

    def _check_schemas(self, footers: list[Footer | None]) -> tuple[list[list[int]], pa.Schema]:
        """Checks the columns against every readable file (the first one is the model);
        returns every file's leaf columns to read and the schema of the columns read."""
        urls = self.urls
        readable = [(url, f) for url, f in zip(urls, footers, strict=True) if f is not None]
        model_url, model = readable[0]
        first = model.schema
        names = self.columns if self.columns is not None else list(first.names)
        leaves = [
            [] if footer is None else leaf_columns(footer, names, redact_url(url))
            for url, footer in zip(urls, footers, strict=True)
        ]
        for url, footer in readable[1:]:
            for name in names:
                field, expected = footer.schema.field(name), first.field(name)
                if not field.type.equals(expected.type):
                    raise ParquetFormatError(
                        f"{redact_url(url)}: column {name!r} is {field.type}, but "
                        f"{redact_url(model_url)} has it as {expected.type}: the files disagree"
                    )
            if self.columns is None and list(footer.schema.names) != names:
                raise ParquetFormatError(
                    f"{redact_url(url)} has columns {footer.schema.names}, but "
                    f"{redact_url(model_url)} has {names}: pass columns= to read the ones "
                    "they share"
                )
        return leaves, pa.schema([first.field(name) for name in names])

    def raise_unreadable(self) -> None:
        """Raises the error of the first file left out as unreadable, if any (a copy: the
        same error each time it is raised, its original type kept)."""
        if self.unreadable:
            raise copy.copy(next(iter(self.unreadable.values())))

    @property
    def footers(self) -> list[Footer | None]:
        """Every file's footer, None for one left out as unreadable (loads them first)."""
        self.load_blocking()
        assert self._footers is not None
        return self._footers

    @property
    def num_rows(self) -> int:
        """The rows of all files (loads the footers first)."""
        self.load_blocking()
        return int(self.unit_starts[-1])

    def describe(self, unit: int) -> str:
        """``"<file URL>, row group <n>"`` for messages."""
        file, group = self.units[unit]
        return f"{redact_url(self.urls[file])}, row group {group}"

    def file_of(self, unit: int) -> int:
        """The number of the file unit ``unit`` is in."""
        return self.units[unit][0]

    async def read(self, unit: int) -> pa.Table:
        """Unit ``unit``'s requested columns, as an Arrow table (see the module docstring)."""
        tables = await self.read_many([unit])
        return tables[0]

    async def read_many(self, units: Sequence[int]) -> list[pa.Table]:
        """The tables of ``units``, in order: the row groups of one file read together
        (neighbouring column chunks in one request), the files at once."""
        await self.load()
        footers = self._footers
        assert footers is not None
        by_file: dict[int, list[int]] = {}
        for unit in units:
            file, group = self.units[unit]
            by_file.setdefault(file, []).append(group)

        async def one_file(file: int, groups: list[int]) -> list[pa.Table]:
            footer = footers[file]
            assert footer is not None  # a unit's file was read
            return await self.read_groups(file, footer, groups)

        files = list(by_file)
        results = await asyncio.gather(*(one_file(file, by_file[file]) for file in files))
        tables = {
            (file, group): table
            for file, file_tables in zip(files, results, strict=True)
            for group, table in zip(by_file[file], file_tables, strict=True)
        }
        return [tables[self.units[unit]] for unit in units]

    async def read_groups(self, file: int, footer: Footer, groups: list[int]) -> list[pa.Table]:
        """Row groups ``groups`` of file ``file`` as :meth:`read_many` reads them, given its
        footer (before :meth:`load` is done: :mod:`aioload.sources.parquet.early`)."""
        fetch = functools.partial(self._fetch_chunks, file)
        url = redact_url(self.urls[file])
        return await read_row_groups(footer, url, groups, self.columns, fetch)

    async def _fetch_chunks(self, file: int, chunks: list[tuple[int, int]]) -> Placed:
        """The bytes of column chunks ``chunks`` of file ``file``: from the store, neighbours
        in one request; with a local cache, each chunk kept (and found) on its own."""
        cache = self.cache
        if cache is None:
            return await fetch_coalesced(chunks, functools.partial(self._read_from_store, file))
        url = self.urls[file]
        location, path = self._locations.of(url)
        identity = entry_identity(redact_url(url), location)
        name = path.rpartition("/")[2]
        entries = [(f"{identity} [chunk {a}:{b}]", f"{name}.{a}-{b}") for a, b in chunks]

        async def fetch(numbers: list[int]) -> list[memoryview]:
            wanted = [chunks[number] for number in numbers]
            placed = await fetch_coalesced(wanted, functools.partial(self._read_from_store, file))
            return _cut(placed, wanted)

        found = await cache.read_many(entries, fetch, self.counts)
        return [(first, data) for (first, _), data in zip(chunks, found, strict=True)]

    async def _read_from_store(self, file: int, first: int, end: int) -> memoryview:
        """Bytes ``first`` to ``end - 1`` of file ``file``, from the store (never the cache)."""
        location, path = self._locations.of(self.urls[file])
        shown = redact_url(self.urls[file])
        _, data = await read_buffer(location, path, shown, self.counts, (first, end))
        return data

    async def _read_bytes(self, file: int, byte_range: int | tuple[int, int]) -> tuple[int, bytes]:
        counts = self.counts
        url = self.urls[file]
        location, path = self._locations.of(url)
        shown = redact_url(url)
        cache = self.cache
        if cache is None:
            return await read_bytes(location, path, shown, counts, byte_range)
        # The file's size is kept with each entry: a suffix read needs it back.
        identity = f"{entry_identity(shown, location)} [{byte_range}]"
        name = path.rpartition("/")[2]

        async def fetch() -> bytes:
            size, data = await read_bytes(location, path, shown, counts, byte_range)
            return size.to_bytes(8, "little") + data

        kept = await cache.read(identity, name, fetch, counts)
        return int.from_bytes(kept[:8], "little"), kept[8:]

    async def _read_footer(self, file: int) -> Footer:
        url = redact_url(self.urls[file])
        read = functools.partial(self._read_bytes, file)
        size, tail = await read_footer_bytes(read, url)
        return parse_footer(size, tail, url)

    async def _footer_or_error(self, file: int) -> Footer | Exception:
        """The file's footer, or why it cannot be read where every process sees the same:
        no such file, or not Parquet (truncated, corrupt). Other errors (a store that does
        not answer) raise: a file left out by one process and read by another would break
        the split of the row groups."""
        try:
            return await self._read_footer(file)
        except (ParquetFormatError, FileNotFoundError) as error:
            return error

    def __getstate__(self) -> dict[str, Any]:
        # pyarrow's metadata objects travel as the footer bytes they were parsed from.
        state = dict(self.__dict__)
        del state["_lock"]  # each process (each copy) has its own
        if self._footers is not None:
            state["_footers"] = [None if f is None else (f.size, f.tail) for f in self._footers]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        footers = state["_footers"]
        self.__dict__.update(state)
        self._lock = threading.Lock()
        if footers is not None:
            self._footers = [
                None if footer is None else parse_footer(footer[0], footer[1], redact_url(url))
                for footer, url in zip(footers, state["_urls"], strict=True)
            ]


def _cut(placed: Placed, ranges: list[tuple[int, int]]) -> list[memoryview]:
    """The bytes of each of ``ranges`` (sorted), as views of the ``placed`` parts (sorted,
    each range within one) that hold them."""
    views = []
    parts = iter(placed)
    start, data = next(parts)
    for first, end in ranges:
        while first >= start + len(data):
            start, data = next(parts)
        views.append(memoryview(data)[first - start : end - start])
    return views
