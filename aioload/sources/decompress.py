"""Compressed bytes decompressed as they arrive: gzip, zstd, bz2 and xz streams.

:func:`decompressed` turns a stream of compressed chunks into a stream of decompressed
ones, never holding more than a chunk's worth (:data:`OUT_CHUNK` out of one step): gzip
through :mod:`zlib`, bz2 and xz through the standard library's :mod:`bz2` and
:mod:`lzma` (every member or stream of a concatenated file, and zero bytes between and
after them passed over, as ``gzip -d``, ``zcat`` and ``xz -d`` read them), zstd through
the ``zstandard`` package (every frame; the standard library has zstd only from Python
3.14). JSON-lines files (:mod:`aioload.sources.jsonl`) and compressed tar shards
(:mod:`aioload.sources.tar.dataset`) are read through it.

Example::

    >>> import asyncio, gzip
    >>> async def chunks():
    ...     yield gzip.compress(b"one ") + bytes(8) + gzip.compress(b"two")
    >>> async def read():
    ...     return b"".join([c async for c in decompressed(chunks(), "gzip", "memory:///a")])
    >>> asyncio.run(read())
    b'one two'
"""

from __future__ import annotations

import bz2
import lzma
import zlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing
from typing import Any, Literal

__all__ = ["COMPRESSIONS", "OUT_CHUNK", "Compression", "decompressed", "zstd_decompressor"]

Compression = Literal["none", "gzip", "zstd", "bz2", "xz"]
"""How a file is stored: as it is (``"none"``) or compressed as a whole."""

COMPRESSIONS: tuple[Compression, ...] = ("none", "gzip", "zstd", "bz2", "xz")
"""Every compression :func:`decompressed` reads."""

OUT_CHUNK = 1 << 20
"""The most decompressed bytes one step hands on."""


def zstd_decompressor() -> Any:
    """A ``zstandard.ZstdDecompressor``; a clear ImportError without the ``jsonl`` extra."""
    try:
        import zstandard
    except ImportError as error:
        raise ImportError(
            "reading zstd files (.zst) needs the zstandard package: "
            "pip install 'aioload-data[jsonl]'"
        ) from error
    return zstandard.ZstdDecompressor()


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
