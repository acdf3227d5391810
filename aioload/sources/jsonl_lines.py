"""The lines of a JSON-lines file as its bytes arrive: decompression, then lines with bytes.

:func:`compression_of` tells a file's compression by its name (``.jsonl``, ``.ndjson``,
``.jsonl.gz``, ``.json.gz``, ``.jsonl.zst``, ``.jsonl.bz2``, ``.jsonl.xz`` ...);
:func:`decompressed` turns a stream of compressed chunks into a stream of decompressed
ones, never holding more than a chunk's worth: gzip through :mod:`zlib`, bz2 and xz
through :mod:`bz2` and :mod:`lzma` (every member or stream of a concatenated file, zero
bytes between and after them skipped, as ``gzip``, ``zcat`` and ``xz`` do), zstd through
the ``zstandard`` package (every frame). :func:`numbered_lines` splits chunks into lines
with :class:`LineSplitter`.

A line ends with ``\\n`` (a ``\\r`` before it is dropped too); the last one may have no
newline. A line's bytes, ``first`` to ``end - 1``, are positions in the (decompressed)
stream, its terminator included: ``end`` is where the next line starts. A UTF-8 byte
order mark at the stream's first byte is left out of the first line's content.

Example::

    >>> splitter = LineSplitter()
    >>> splitter.feed(b'{"a": 1}\\r\\n{"a"') + splitter.feed(b": 2}") + splitter.finish()
    [(b'{"a": 1}', 0, 10), (b'{"a": 2}', 10, 18)]
"""

from __future__ import annotations

import bz2
import lzma
import zlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing
from typing import Any, Literal

__all__ = [
    "COMPRESSIONS",
    "SUFFIXES",
    "Compression",
    "LineSplitter",
    "compression_of",
    "decompressed",
    "is_blank",
    "numbered_lines",
    "zstd_decompressor",
]

Compression = Literal["none", "gzip", "zstd", "bz2", "xz"]
"""How a JSON-lines file is stored."""

COMPRESSIONS: tuple[Compression, ...] = ("none", "gzip", "zstd", "bz2", "xz")
"""Every compression a JSON-lines file may have."""

_BASES = (".jsonl", ".ndjson", ".json")  # .json: C4's layout (one JSON value per line)
_PACKED: dict[str, Compression] = {".gz": "gzip", ".zst": "zstd", ".bz2": "bz2", ".xz": "xz"}
SUFFIXES: dict[str, Compression] = {
    **{base: "none" for base in _BASES if base != ".json"},
    **{base + end: kind for base in _BASES for end, kind in _PACKED.items()},
}
"""The names a JSON-lines file may end with, and the compression each one means.

A plain ``.json`` file is not among them: it is mostly one JSON document, not lines (pass
``compression=None`` to read one as lines).
"""

BOM = b"\xef\xbb\xbf"
OUT_CHUNK = 1 << 20  # the most decompressed bytes gzip hands on at once
_BLANK = b" \t\r\n"  # JSON's whitespace


def compression_of(path: str) -> Compression | None:
    """The compression a file's name says (case ignored); None: not a JSON-lines name.

    Example::

        >>> compression_of("s3://b/part-0.jsonl.gz"), compression_of("x.json")
        ('gzip', None)
    """
    name = path.lower()
    for suffix in sorted(SUFFIXES, key=len, reverse=True):
        if name.endswith(suffix):
            return SUFFIXES[suffix]
    return None


def is_blank(content: bytes) -> bool:
    """Whether a line holds only whitespace (such a line is no sample)."""
    return not content.strip(_BLANK)


def zstd_decompressor() -> Any:
    """A ``zstandard.ZstdDecompressor``; a clear ImportError without the ``jsonl`` extra."""
    try:
        import zstandard
    except ImportError as error:
        raise ImportError(
            "reading .jsonl.zst files needs the zstandard package: "
            "pip install 'aioload-data[jsonl]'"
        ) from error
    return zstandard.ZstdDecompressor()


class LineSplitter:
    """Splits a byte stream fed in chunks of any size into lines, with their positions.

    Args:
        position: the stream position of the first byte fed (a read from an offset).
            At position 0 a UTF-8 byte order mark is left out of the first line.

    Example::

        >>> LineSplitter(100).feed(b"[1]\\n[2]\\n")
        [(b'[1]', 100, 104), (b'[2]', 104, 108)]
    """

    __slots__ = ("_pending", "_start")

    def __init__(self, position: int = 0) -> None:
        self._pending = bytearray()  # the start of a line not ended yet
        self._start = position  # where that line starts

    def feed(self, chunk: bytes) -> list[tuple[bytes, int, int]]:
        """The lines ``chunk`` ends: ``(content, first, end)``, terminators left out."""
        lines = []
        at = 0
        while True:
            newline = chunk.find(b"\n", at)
            if newline < 0:
                break
            if self._pending:
                self._pending += chunk[at : newline + 1]
                raw = bytes(self._pending)
                self._pending.clear()
            else:
                raw = chunk[at : newline + 1]
            lines.append(self._line(raw))
            at = newline + 1
        if at < len(chunk):
            self._pending += chunk[at:]
        return lines

    def finish(self) -> list[tuple[bytes, int, int]]:
        """The last line, if the stream ended without a newline after it."""
        if not self._pending:
            return []
        raw = bytes(self._pending)
        self._pending.clear()
        return [self._line(raw)]

    def _line(self, raw: bytes) -> tuple[bytes, int, int]:
        first = self._start
        end = first + len(raw)
        self._start = end
        content = raw[:-1] if raw.endswith(b"\n") else raw
        if content.endswith(b"\r"):
            content = content[:-1]
        if first == 0 and content.startswith(BOM):
            content = content[len(BOM) :]
        return content, first, end


async def numbered_lines(
    chunks: AsyncIterator[bytes], line: int = 0, position: int = 0
) -> AsyncGenerator[tuple[int, bytes, int, int], None]:
    """``(number, content, first, end)`` for every line of ``chunks``, blank ones too.

    Args:
        chunks: the (decompressed) bytes, from ``position`` on.
        line: the number of the first line (0-based).
        position: the stream position of the first byte.
    """
    splitter = LineSplitter(position)
    async for chunk in chunks:
        for content, first, end in splitter.feed(chunk):
            yield line, content, first, end
            line += 1
    for content, first, end in splitter.finish():
        yield line, content, first, end


async def decompressed(
    chunks: AsyncGenerator[bytes, None], compression: Compression, url: str
) -> AsyncGenerator[bytes, None]:
    """The bytes of ``chunks`` decompressed, as they arrive (``"none"``: as they are).

    Raises:
        EOFError: the file ends inside a gzip member, bz2 or xz stream, or zstd frame
            (truncated).
        ValueError: the bytes are not data of that compression (or corrupt, or other bytes
            follow its last member).
        ImportError: a zstd file without the ``zstandard`` package.
    """
    async with aclosing(chunks):
        if compression == "none":
            async for chunk in chunks:
                yield chunk
        elif compression == "zstd":
            async for chunk in _unzstd(chunks, url):
                yield chunk
        else:
            async for chunk in _members(chunks, url, compression):
                yield chunk


class _Member:
    """One gzip member, bz2 stream or xz stream being decompressed, a bounded step at a time."""

    __slots__ = ("_decompressor", "_zlib")

    def __init__(self, compression: Compression) -> None:
        self._zlib = compression == "gzip"
        factory: Callable[[], Any] = _FACTORIES[compression]
        self._decompressor = factory()

    def step(self, data: bytes) -> tuple[bytes, bytes, bool, bool]:
        """``(out, rest, more, ended)``: at most :data:`OUT_CHUNK` bytes out; the input left
        (after the member's end, when ``ended``); whether output is still held (call again
        with ``b""``)."""
        decompressor = self._decompressor
        out: bytes = decompressor.decompress(data, OUT_CHUNK)
        if decompressor.eof:
            return out, decompressor.unused_data, False, True
        if self._zlib:
            rest = decompressor.unconsumed_tail
            return out, rest, not rest and len(out) == OUT_CHUNK, False
        return out, b"", not decompressor.needs_input, False


_FACTORIES: dict[str, Callable[[], Any]] = {
    "gzip": lambda: zlib.decompressobj(wbits=31),
    "bz2": bz2.BZ2Decompressor,
    "xz": lambda: lzma.LZMADecompressor(format=lzma.FORMAT_AUTO),
}
# bz2 says "Invalid data stream" with an OSError.
_ERRORS: tuple[type[Exception], ...] = (zlib.error, OSError, lzma.LZMAError)


async def _members(
    chunks: AsyncIterator[bytes], url: str, compression: Compression
) -> AsyncGenerator[bytes, None]:
    """Concatenated members (gzip) or streams (bz2, xz), zero bytes between them skipped
    (the padding ``gzip``, ``zcat`` and ``xz`` accept); other bytes after one fail."""
    name = compression
    member: _Member | None = None  # None: between members (zero bytes are passed over)
    async for chunk in chunks:
        data, more = chunk, False
        while data or more:
            if member is None:
                data = data.lstrip(b"\0")
                if not data:
                    break
                member = _Member(compression)
            try:
                out, data, more, ended = member.step(data)
            except _ERRORS as error:
                raise ValueError(f"{url}: not {name} data, or corrupt: {error}") from error
            if out:
                yield out
            if ended:
                member, more = None, False  # another may follow (a concatenated file)
    if member is not None:
        raise EOFError(f"{url}: the {name} data ends early (a truncated file)")


async def _unzstd(chunks: AsyncIterator[bytes], url: str) -> AsyncGenerator[bytes, None]:
    import zstandard

    decompressor = zstd_decompressor()
    frame = decompressor.decompressobj()
    started = False  # the current frame has had bytes
    async for chunk in chunks:
        data = chunk
        while data:
            started = True
            try:
                out = frame.decompress(data)
            except zstandard.ZstdError as error:
                raise ValueError(f"{url}: not zstd data, or corrupt: {error}") from error
            if out:
                yield out
            if not frame.eof:
                break
            data = frame.unused_data  # a frame ended: another may follow
            frame, started = decompressor.decompressobj(), False
    if started:
        raise EOFError(f"{url}: the zstd data ends early (a truncated file)")
