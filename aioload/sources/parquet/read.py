"""Reading some columns of one row group: ranged GETs of their chunks, decoded by pyarrow.

:func:`read_row_groups` asks only for the column chunks of the requested columns of some
row groups of a file (:func:`chunk_ranges`), through a :data:`FetchChunks` that gets them
from the store — neighbours closer than :data:`COALESCE_GAP` in one request, several
requests in flight (:func:`fetch_coalesced`) — or from a local cache that keeps each chunk
on its own (:class:`~aioload.sources.parquet.files.ParquetFiles`), and hands them to
pyarrow's Parquet reader at their offsets — in one buffer of the file's size where they are
most of the file (a scan of its columns), else in a sparse in-memory file (a memfd holding
only the bytes fetched: a few columns of a wide file) — which pyarrow reads natively, in a
thread: the event loop goes on while it decodes.

pyarrow reads exactly the column chunks the footer places, which is what was fetched (the
footer was checked against the file's size before: :mod:`aioload.sources.parquet.footer`),
so the holes are never read; a test decodes through :func:`_fetched`
(:data:`STRICT_READS`) instead, a file object that refuses a read of any byte not fetched,
to keep that true.

Example::

    fetch_chunks = functools.partial(fetch_coalesced, fetch=fetch)  # fetch(first, end) -> bytes
    tables = await read_row_groups(footer, url, [3, 4], ["text", "label"], fetch_chunks)
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from aioload.sources.parquet.footer import Footer, ParquetFormatError, PartialFile

__all__ = [
    "COALESCE_GAP",
    "Fetch",
    "FetchChunks",
    "Placed",
    "chunk_ranges",
    "coalesce",
    "fetch_coalesced",
    "leaf_columns",
    "plan_ranges",
    "read_row_groups",
]

COALESCE_GAP = 256 << 10
"""Column chunks closer than this are fetched with one request (the bytes between too)."""

_OLD_WRITER_PAD = 100  # pyarrow reads this past a chunk for files of old parquet-mr writers

Fetch = Callable[[int, int], Awaitable[bytes | memoryview]]
"""Reads bytes ``first`` to ``end - 1`` of the file."""

Placed = list[tuple[int, bytes | memoryview]]
"""Bytes of a file at their offsets: ``(first, data)`` holds bytes ``first`` on."""

FetchChunks = Callable[[list[tuple[int, int]]], Awaitable[Placed]]
"""Gets the bytes of every range ``(first, end)`` given (each within one part returned)."""


def leaf_columns(footer: Footer, columns: Sequence[str] | None, url: str) -> list[int]:
    """The leaf column numbers (in the file) that make up the top-level ``columns``.

    Raises:
        KeyError: a column the file does not have (the message lists those it has).
    """
    metadata = footer.metadata
    if columns is None:
        return list(range(metadata.num_columns))
    # The leaves are in the order of the top-level fields, each field's in a row: a
    # field's count tells where its leaves end (a leaf's dotted path cannot, where a
    # name holds a dot).
    by_name: dict[str, list[int]] = {}
    first = 0
    for field in footer.schema:
        count = _leaf_count(field.type)
        by_name[field.name] = list(range(first, first + count))
        first += count
    if first != metadata.num_columns:  # a type counted otherwise than the file: by path
        by_name = {}
        for leaf in range(metadata.num_columns):
            top = metadata.schema.column(leaf).path.split(".", 1)[0]
            by_name.setdefault(top, []).append(leaf)
    leaves = []
    for name in columns:
        if name not in by_name:
            raise KeyError(
                f"{url} has no column {name!r}; its columns are {', '.join(footer.schema.names)}"
            )
        leaves += by_name[name]
    return sorted(leaves)


def _leaf_count(kind: pa.DataType) -> int:
    """The Parquet leaf columns a field of Arrow type ``kind`` is stored in."""
    if isinstance(kind, pa.ExtensionType):
        return _leaf_count(kind.storage_type)
    if pa.types.is_struct(kind):
        return sum(_leaf_count(kind.field(i).type) for i in range(kind.num_fields))
    if pa.types.is_map(kind):
        return _leaf_count(kind.key_type) + _leaf_count(kind.item_type)
    if (
        pa.types.is_list(kind)
        or pa.types.is_large_list(kind)
        or pa.types.is_fixed_size_list(kind)
        or pa.types.is_list_view(kind)
        or pa.types.is_large_list_view(kind)
    ):
        return _leaf_count(kind.value_type)
    return 1


def chunk_ranges(
    footer: Footer, row_groups: Sequence[int], leaves: list[int]
) -> list[tuple[int, int]]:
    """The byte range of each column chunk ``leaves`` of ``row_groups``, in file order.

    A chunk's range does not depend on what else is read with it: what a cache keeps a
    chunk under (a shuffled epoch asks for the same chunks in other company).
    """
    data_end = footer.size - len(footer.tail)
    chunks = {
        (chunk.first, min(chunk.end + _OLD_WRITER_PAD, data_end))
        for group in row_groups
        for chunk in footer.chunks(group, leaves)
    }
    return sorted(chunks)


def coalesce(ranges: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """``ranges`` (sorted by their first byte) merged where closer than :data:`COALESCE_GAP`."""
    merged: list[tuple[int, int]] = []
    for first, end in ranges:
        if merged and first - merged[-1][1] <= COALESCE_GAP:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((first, end))
    return merged


def plan_ranges(
    footer: Footer, row_groups: Sequence[int], leaves: list[int]
) -> list[tuple[int, int]]:
    """The byte ranges to fetch for ``leaves`` of ``row_groups``: chunks, merged when close."""
    return coalesce(chunk_ranges(footer, row_groups, leaves))


async def fetch_coalesced(ranges: Sequence[tuple[int, int]], fetch: Fetch) -> Placed:
    """The bytes of ``ranges`` (sorted), neighbours fetched together: one request each
    merged range (see :func:`coalesce`), all at once."""
    merged = coalesce(ranges)
    parts = await asyncio.gather(*(fetch(first, end) for first, end in merged))
    return list(zip((first for first, _ in merged), parts, strict=True))


async def read_row_groups(
    footer: Footer,
    url: str,
    row_groups: Sequence[int],
    columns: Sequence[str] | None,
    fetch_chunks: FetchChunks,
) -> list[pa.Table]:
    """The ``columns`` (all: None) of each of ``row_groups`` (of one file), as Arrow tables.

    Their column chunks (:func:`chunk_ranges`) are got together through ``fetch_chunks``,
    then decoded one row group after the other in a thread.

    Raises:
        ParquetFormatError: the chunks are not where the footer says, or pyarrow cannot
            decode them (its error chained); the message names the file and row group.
    """
    leaves = leaf_columns(footer, columns, url)
    placed = await fetch_chunks(chunk_ranges(footer, row_groups, leaves))
    return await asyncio.to_thread(_decode_all, placed, footer, url, row_groups, columns)


def _decode_all(
    placed: Placed,
    footer: Footer,
    url: str,
    row_groups: Sequence[int],
    columns: Sequence[str] | None,
) -> list[pa.Table]:
    source, close = _source(footer, placed)
    try:
        reader = pq.ParquetFile(source, metadata=footer.metadata, pre_buffer=False)
        return [
            _decode(reader, footer, group, columns, f"{url}, row group {group}")
            for group in row_groups
        ]
    finally:
        close()


def _source(footer: Footer, placed: Placed) -> tuple[Any, Callable[[], None]]:
    """What pyarrow reads the fetched bytes from, and how to let it go.

    Where the bytes fetched are most of the file (a scan of every column, say: at least
    :data:`DENSE_SHARE` of it), one buffer of the file's size holding them at their offsets,
    which pyarrow reads natively (half the cost of the memfd below, 1 ms against 2.4 ms to
    decode a MiB file's four row groups). Otherwise a sparse in-memory file (a memfd: the
    bytes fetched written at their offsets, nothing else allocated), which pyarrow reads
    natively too: through a Python file object every read would wait for the event loop's
    thread to let the GIL go. Where there is no memfd (or under :data:`STRICT_READS`),
    :func:`_fetched`, which refuses a read of bytes that were not fetched.
    """
    if STRICT_READS:
        return _fetched(footer, placed), lambda: None
    parts = [*placed, (footer.size - len(footer.tail), footer.tail)]
    if sum(len(data) for _, data in parts) >= DENSE_SHARE * footer.size:
        whole = np.empty(footer.size, np.uint8)  # the holes are never read (see above)
        for first, data in parts:
            whole[first : first + len(data)] = np.frombuffer(data, np.uint8)
        return pa.BufferReader(pa.py_buffer(whole)), lambda: None
    if not hasattr(os, "memfd_create"):
        return _fetched(footer, placed), lambda: None
    fd = os.memfd_create("aioload-parquet", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, footer.size)
        for first, data in parts:
            _write_all(fd, data, first)
        source = pa.memory_map(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)  # the mapping keeps the file
    return source, source.close


def _write_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


DENSE_SHARE = 0.5
"""The share of a file's bytes fetched from which they are decoded from one buffer of the
file's size (below it, from a sparse memfd: a few columns of a wide file)."""

STRICT_READS = False
"""Decode through :func:`_fetched` always: a read of bytes not fetched raises (tests)."""


def _decode(
    reader: pq.ParquetFile,
    footer: Footer,
    row_group: int,
    columns: Sequence[str] | None,
    where: str,
) -> pa.Table:
    try:
        # use_threads=False: the file object is Python's, and pyarrow's own threads reading
        # it would take turns at the GIL with the event loop; the row groups of several
        # files decode in parallel anyway, one thread each.
        names = None if columns is None else list(columns)
        table = reader.read_row_group(row_group, columns=names, use_threads=False)
    except _Outside as error:
        error.__traceback__ = None  # pyarrow may keep it: not the frames it passed through
        raise ParquetFormatError(
            f"{where}: pyarrow read bytes {error.first} to {error.end}, which are not where "
            "the footer puts the row group's column chunks: the footer does not describe the "
            "file"
        ) from None
    except (pa.ArrowException, OSError) as error:
        # The bytes are in memory already: what fails here is their format, never a read,
        # so it is not an OSError a retry policy would try again.
        raise ParquetFormatError(f"{where}: pyarrow cannot decode it: {error}") from error
    if table.num_rows != footer.row_counts[row_group]:
        raise ParquetFormatError(
            f"{where}: it decoded to {table.num_rows} rows, the footer says "
            f"{footer.row_counts[row_group]}"
        )
    return table if columns is None else table.select(list(columns))


class _Outside(OSError):
    def __init__(self, first: int, end: int) -> None:
        super().__init__(f"bytes {first} to {end} were not fetched")
        self.first, self.end = first, end


def _fetched(footer: Footer, parts: Placed) -> PartialFile:
    """The file of ``footer`` as far as ``parts`` (and the footer) know it: a read of any
    other byte raises :class:`_Outside`."""
    known = [(first, bytes(data)) for first, data in parts]
    known.append((footer.size - len(footer.tail), footer.tail))
    return PartialFile(footer.size, known, _Outside)
