"""A Parquet file's footer: read with one suffix GET (two for a large one), checked, parsed.

A Parquet file ends with its metadata (the footer: schema, row groups, and where every
column chunk of every row group lies), then the footer's length (4 bytes, little endian)
and the magic ``PAR1``. :func:`read_footer` asks for the last :data:`FOOTER_GUESS` bytes,
which hold the whole footer of most files, and for the rest of it when they do not.

A footer is outside data: :func:`check_footer` makes sure that everything a read will rely
on is true before anything else is read — the row groups' row counts add up, and every
column chunk lies inside the file's data, between the leading magic and the footer — so
a truncated file or a footer that lies about sizes fails here, naming the file (and row
group), with :class:`ParquetFormatError`, never later as wrong data.

Example::

    footer = await read_footer(location, "data/part-0.parquet", url, counts)
    footer.metadata.num_rows, footer.row_counts
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from aioload.errors import ParquetFormatError

__all__ = [
    "FOOTER_GUESS",
    "ColumnChunk",
    "Footer",
    "ParquetFormatError",
    "PartialFile",
    "check_footer",
    "footer_length",
    "parse_footer",
    "read_footer_bytes",
]

FOOTER_GUESS = 64 << 10
"""The bytes of a file's end asked for first: the footer of most files fits in them."""

_MAGIC = b"PAR1"
_TRAILER = 8  # the footer's length and the magic


@dataclass(frozen=True, slots=True)
class ColumnChunk:
    """Where one column of one row group lies in its file: bytes ``first`` to ``end - 1``."""

    first: int
    end: int


@dataclass(frozen=True)
class Footer:
    """A file's checked footer.

    Attributes:
        size: the file's size in bytes.
        metadata: pyarrow's ``FileMetaData`` of the file.
        schema: its Arrow schema.
        row_counts: the rows of every row group, in order.
        tail: the bytes read from the file's end (the footer and its trailer); a read
            of a row group serves pyarrow's look at them from here.
    """

    size: int
    metadata: Any
    schema: pa.Schema
    row_counts: tuple[int, ...]
    tail: bytes

    def chunks(self, row_group: int, leaves: list[int]) -> list[ColumnChunk]:
        """Where the column chunks ``leaves`` (leaf column numbers) of ``row_group`` lie."""
        group = self.metadata.row_group(row_group)
        return [_chunk(group.column(leaf)) for leaf in leaves]


def _chunk(column: Any) -> ColumnChunk:
    # Where pyarrow's reader starts a column chunk: at its dictionary page if it has one.
    first = column.data_page_offset
    dictionary = column.dictionary_page_offset
    if column.has_dictionary_page and dictionary is not None and 0 < dictionary < first:
        first = dictionary
    return ColumnChunk(int(first), int(first) + int(column.total_compressed_size))


async def read_footer_bytes(
    read: Callable[[int | tuple[int, int]], Awaitable[tuple[int, bytes]]], url: str
) -> tuple[int, bytes]:
    """The file's size and its footer with the trailer, read through ``read(byte_range)``.

    ``read`` takes :func:`~aioload.sources.stores.reads.open_read`'s byte ranges (``-n``:
    the last ``n`` bytes) and returns the object's size and the bytes.
    """
    size, tail = await read(-FOOTER_GUESS)
    length = footer_length(size, tail, url)
    if length + _TRAILER > len(tail):
        _, head = await read((size - _TRAILER - length, size - len(tail)))
        tail = head + tail
    return size, tail[len(tail) - length - _TRAILER :]


def footer_length(size: int, tail: bytes, url: str) -> int:
    """The footer's length its trailer states, checked against the file's size."""
    if size < len(_MAGIC) + _TRAILER or len(tail) < _TRAILER:
        raise ParquetFormatError(f"{url}: {size} bytes is too small for a Parquet file")
    if tail[-4:] != _MAGIC:
        raise ParquetFormatError(
            f"{url}: not a Parquet file, or truncated (it does not end with {_MAGIC!r})"
        )
    length = int.from_bytes(tail[-8:-4], "little")
    if length <= 0 or length + _TRAILER + len(_MAGIC) > size:
        raise ParquetFormatError(
            f"{url}: its footer says it is {length} bytes long, which does not fit in the "
            f"file's {size} bytes: the file is truncated or corrupt"
        )
    return length


def parse_footer(size: int, tail: bytes, url: str) -> Footer:
    """The checked :class:`Footer` of a file of ``size`` bytes ending with ``tail``."""
    try:
        metadata = pq.read_metadata(pa.BufferReader(tail))
        schema = metadata.schema.to_arrow_schema()
    except (pa.ArrowException, OSError, ValueError) as error:
        raise ParquetFormatError(f"{url}: its footer cannot be read: {error}") from error
    _check_chunk_metadata(metadata, size, url)
    footer = Footer(
        size,
        metadata,
        schema,
        tuple(int(metadata.row_group(i).num_rows) for i in range(metadata.num_row_groups)),
        tail,
    )
    check_footer(footer, url)
    return footer


class _NoData(OSError):
    pass


class PartialFile:
    """A read-only file object of ``size`` bytes that knows only ``parts`` of them (each
    ``(offset, bytes)``) and refuses a read anywhere else (``refused(first, end)`` makes the
    error): what pyarrow's reader is given where only some bytes were fetched."""

    def __init__(
        self,
        size: int,
        parts: list[tuple[int, bytes]],
        refused: Callable[[int, int], OSError],
    ) -> None:
        self._size, self._parts, self._refused = size, parts, refused
        self._position = 0
        self.closed = False

    def read(self, size: int = -1) -> bytes:
        first = self._position
        end = self._size if size < 0 else min(first + size, self._size)
        for start, data in self._parts:
            if start <= first and end <= start + len(data):
                self._position = end
                return data[first - start : end - start]
        raise self._refused(first, end)

    def seek(self, offset: int, whence: int = 0) -> int:
        self._position = (0, self._position, self._size)[whence] + offset
        return self._position

    def tell(self) -> int:
        return self._position

    def size(self) -> int:
        return self._size

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def close(self) -> None:
        self.closed = True


def _check_chunk_metadata(metadata: Any, size: int, url: str) -> None:
    # pyarrow's Python accessor of a column chunk's metadata (row_group(i).column(j))
    # aborts the process when the chunk's metadata does not validate (size statistics
    # that do not fit the schema, say): the C++ exception has no way out. Its reader
    # raises the same error as an exception, and with pre_buffer it builds every chunk's
    # metadata before its first read: a file that refuses every read tells the two apart.
    try:
        unread = PartialFile(size, [], lambda first, end: _NoData("no data"))
        pq.ParquetFile(unread, metadata=metadata, pre_buffer=True).read_row_groups(
            list(range(metadata.num_row_groups))
        )
    except _NoData as error:
        # pyarrow keeps the Python error a read raised (in its I/O cache): without this its
        # traceback would keep the frames that called it alive, the loop's among them.
        error.__traceback__ = None
        return
    except (pa.ArrowException, OSError, ValueError) as error:
        raise ParquetFormatError(f"{url}: its footer cannot be read: {error}") from error


def check_footer(footer: Footer, url: str) -> None:
    """Checks that ``footer`` describes a file of its size (see the module docstring)."""
    metadata = footer.metadata
    data_end = footer.size - len(footer.tail)
    total = 0
    for number, rows in enumerate(footer.row_counts):
        if rows < 0:
            raise ParquetFormatError(f"{url}: row group {number} has {rows} rows")
        total += rows
        group = metadata.row_group(number)
        if group.num_columns != metadata.num_columns:
            raise ParquetFormatError(
                f"{url}: row group {number} has {group.num_columns} columns, the schema "
                f"{metadata.num_columns}"
            )
        for leaf in range(group.num_columns):
            chunk = _chunk(group.column(leaf))
            if chunk.first < len(_MAGIC) or chunk.end > data_end or chunk.end < chunk.first:
                raise ParquetFormatError(
                    f"{url}: row group {number}'s column "
                    f"{group.column(leaf).path_in_schema!r} is said to lie at bytes "
                    f"{chunk.first} to {chunk.end}, outside the file's data (bytes "
                    f"{len(_MAGIC)} to {data_end}): the footer does not describe this file"
                )
    if total != metadata.num_rows:
        raise ParquetFormatError(
            f"{url}: its row groups hold {total} rows, its footer says {metadata.num_rows}"
        )
