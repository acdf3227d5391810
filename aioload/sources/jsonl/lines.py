"""The lines of a JSON-lines file as its bytes arrive: decompression, then lines with bytes.

:func:`compression_of` tells a file's compression by its name (``.jsonl``, ``.ndjson``,
``.jsonl.gz``, ``.json.gz``, ``.jsonl.zst``, ``.jsonl.bz2``, ``.jsonl.xz`` ...); the bytes
are decompressed as they arrive by :func:`~aioload.sources.decompress.decompressed`;
:func:`numbered_lines` splits chunks into lines with :class:`LineSplitter`.

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

from collections.abc import AsyncGenerator, AsyncIterator

from aioload.sources.decompress import Compression

__all__ = ["SUFFIXES", "LineSplitter", "compression_of", "is_blank", "numbered_lines"]

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
