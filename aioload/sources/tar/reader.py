"""A streaming tar reader over an async stream of byte chunks, and WebDataset grouping.

A shard is read as it arrives: headers and member bodies are cut out of the
chunks obstore's stream yields, so the first sample of a multi-gigabyte shard
is ready after its first chunk, and at most one chunk plus one member is held
in memory. Supports ustar, GNU long names and pax ``path`` records (what
Python's ``tarfile`` and GNU tar write).

Every malformed archive raises :class:`TarFormatError` naming the shard and
the byte offset of the bad header: the reader never trusts a size or a pax
record length that would make it stand still or step back (a corrupt shard
must fail, not spin, since nothing can interrupt a loop that never awaits).

WebDataset convention: the members of one sample are consecutive and share a
*key* (the path up to the first dot of the file name); the rest of the name is
the field (``000017.jpg``, ``000017.cls`` -> sample ``000017`` with fields
``jpg`` and ``cls``).

A shard compressed as a whole is told by its name (:func:`tar_compression`:
``.tar.gz``, ``.tar.zst``, ...) and decompressed before it reaches this reader
(:mod:`aioload.sources.decompress`).
"""

from __future__ import annotations

import tarfile
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Any, Protocol

from aioload.errors import TarFormatError
from aioload.sources.decompress import Compression

__all__ = [
    "TAR_SUFFIXES",
    "TarFormatError",
    "TarMember",
    "TarReader",
    "group_samples",
    "iter_tar",
    "iter_tar_spans",
    "split_name",
    "tar_compression",
    "walk_tar",
]

BLOCK = 512

TAR_SUFFIXES: dict[str, Compression] = {
    ".tar.gz": "gzip",
    ".tgz": "gzip",
    ".tar.zst": "zstd",
    ".tzst": "zstd",
    ".tar.bz2": "bz2",
    ".tbz2": "bz2",
    ".tbz": "bz2",
    ".tar.xz": "xz",
    ".txz": "xz",
}
"""The names of shards compressed as a whole, and the compression each one means."""


def tar_compression(path: str) -> Compression:
    """How a shard is stored, by its name (case ignored): ``"none"`` but for the names of
    :data:`TAR_SUFFIXES`.

    Example::

        >>> tar_compression("s3://b/train-0001.tar.gz"), tar_compression("a.tar")
        ('gzip', 'none')
    """
    name = path.lower()
    for suffix, compression in TAR_SUFFIXES.items():
        if name.endswith(suffix):
            return compression
    return "none"


class TarReader(Protocol):
    """What :func:`walk_tar` reads a tar stream through."""

    offset: int
    """Where in the archive the reader stands (counted from the archive's start)."""

    async def read(self, size: int) -> bytes:
        """``size`` bytes, or fewer at the end of the stream."""
        ...

    async def skip(self, size: int) -> int:
        """Steps over ``size`` bytes (fewer at the end of the stream); returns how many."""
        ...


class _ChunkReader:
    """Reads exact byte counts out of an async iterator of chunks."""

    def __init__(self, chunks: AsyncIterator[bytes], offset: int = 0) -> None:
        self._chunks = chunks
        self._buffer = b""
        self._position = 0
        self.offset = offset  # where in the shard the reader stands: named in errors

    async def read(self, size: int) -> bytes:
        """``size`` bytes, or fewer at the end of the stream."""
        buffer, position = self._buffer, self._position
        end = position + size
        if end <= len(buffer):
            self._position = end
            self.offset += size
            return buffer[position:end]
        parts = [buffer[position:]]
        have = len(parts[0])
        while have < size:
            try:
                chunk = await anext(self._chunks)
            except StopAsyncIteration:
                break
            parts.append(chunk)
            have += len(chunk)
        joined = b"".join(parts)
        taken = min(size, len(joined))
        self._buffer, self._position = joined, taken
        self.offset += taken
        return joined[:taken]

    async def skip(self, size: int) -> int:
        """Steps over ``size`` bytes (fewer at the end of the stream); returns how many."""
        buffer, position = self._buffer, self._position
        end = position + size
        if end <= len(buffer):
            self._position = end
            self.offset += size
            return size
        skipped = len(buffer) - position
        self._buffer, self._position = b"", 0
        while skipped < size:
            try:
                chunk = await anext(self._chunks)
            except StopAsyncIteration:
                break
            if skipped + len(chunk) > size:
                self._buffer, self._position = chunk, size - skipped
                skipped = size
                break
            skipped += len(chunk)
        self.offset += skipped
        return skipped


def _pax_path(data: bytes, where: str, offset: int) -> str | None:
    """The ``path`` record of a pax extended header (the header at byte ``offset``), if any.

    Records are ``"LENGTH KEY=VALUE\\n"``, LENGTH counting the whole record;
    the framing is checked as ``tarfile`` checks it, so that a bad length
    (0, not a number, past the end) raises instead of looping.
    """
    path = None
    position = 0
    end = len(data)
    while position < end and data[position] != 0:  # tarfile stops at NUL padding too
        space = data.find(b" ", position, min(end, position + 21))
        digits = data[position:space] if space > position else b""
        if not digits.isdigit():  # bytes.isdigit: ASCII digits only, no sign, no "_"
            raise TarFormatError(
                f"{where}: bad pax header at byte {offset}: a record at byte "
                f"{position} of its data should start with its length in decimal digits "
                f"and a space; got {data[position : position + 20]!r}"
            )
        length = int(digits)
        # The shortest record is "5 k=\n"; a shorter length would not move past it.
        if length < 5 or position + length > end:
            raise TarFormatError(
                f"{where}: bad pax header at byte {offset}: a record at byte {position} of "
                f"its data has length {length}; a record is at least 5 bytes long "
                f"('5 k=\\n') and fits in the {end - position} bytes left of the data"
            )
        record = data[space + 1 : position + length - 1]
        key, equals, value = record.partition(b"=")
        if not key or not equals or data[position + length - 1] != 0x0A:
            raise TarFormatError(
                f"{where}: bad pax header at byte {offset}: the record at byte {position} "
                "of its data should read 'LENGTH KEY=VALUE' and end with a newline"
            )
        if key == b"path":
            path = value.decode("utf-8", "surrogateescape")
        position += length
    return path


_POSIX_MAGIC = b"ustar\x0000"
_GNU_MAGIC = b"ustar  \x00"


def _parse_header(header: bytes) -> tuple[str, int, bytes] | None:
    """``(name, size, type)`` of a plain ustar or GNU header; None for anything else.

    The common case, about ten times cheaper than ``tarfile.TarInfo.frombuf``
    (which the caller falls back to for what this declines: base-256 sizes,
    other formats, bad checksums, so that its errors and rules apply there).
    """
    magic = header[257:265]
    if magic != _POSIX_MAGIC and magic != _GNU_MAGIC:
        return None
    size_field = header[124:136]
    checksum_field = header[148:156]
    if size_field[0] & 0x80:
        return None
    try:
        size = int(size_field.rstrip(b"\x00 ").strip() or b"0", 8)
        checksum = int(checksum_field.rstrip(b"\x00 ").strip() or b"0", 8)
    except ValueError:
        return None
    if checksum != sum(header[:148]) + 256 + sum(header[156:]):  # the field counts as spaces
        return None
    name = header[:100].split(b"\x00", 1)[0]
    if magic == _POSIX_MAGIC:
        prefix = header[345:500].split(b"\x00", 1)[0]
        if prefix:
            name = prefix + b"/" + name
    kind = header[156:157]
    return name.decode("utf-8", "surrogateescape"), size, kind if kind != b"\x00" else b"0"


# The headers whose bodies are always read: a long name, pax records to check.
_DESCRIBING = frozenset((tarfile.GNUTYPE_LONGNAME, tarfile.XHDTYPE, tarfile.XGLTYPE))
_REGULAR = frozenset(tarfile.REGULAR_TYPES)


TarMember = tuple[str, bytes, bytes | None, int, int, int]
"""A member of a tar stream, as :func:`walk_tar` yields it: ``(name, kind, body, first,
after, end)`` (a plain tuple: one per member, built as cheaply as can be).

``name`` is its name (from a GNU long-name or pax header before it, if any), ``kind`` its
type flag (``tarfile.REGTYPE``, ``tarfile.DIRTYPE``, ...), ``body`` its bytes (None where
the walk stepped over them), ``first`` its first header (a GNU long-name or pax header
that names it, or its own), ``after`` where the member before it ended (or the walk
started: the headers in between, long links and global pax headers included, belong to
it) and ``end`` the byte past its padding, all counted from the archive's start.
"""


async def walk_tar(
    reader: TarReader, where: str, *, read_bodies: bool = True
) -> AsyncGenerator[TarMember, None]:
    """Walks the headers of a tar stream, yielding every member but the headers that
    describe others (GNU long names and long links, pax extended and global headers).

    The one walk :func:`iter_tar_spans` and :func:`~aioload.sources.tar.scan.scan_tar`
    share, so that both apply the same header rules and raise the same errors.

    Args:
        reader: the archive's bytes; the walk starts at ``reader.offset`` (0, or a
            header's offset for a byte range from the middle of an archive).
        where: the archive's URL, for error messages (already redacted).
        read_bodies: read the bodies of the members yielded, or step over them
            (``reader.skip``, no copy) and yield None for them. The bodies of GNU
            long-name and pax headers are always read.

    Raises:
        TarFormatError: as :func:`iter_tar_spans` raises.
    """
    start = after = reader.offset
    long_name: str | None = None
    pending = 0  # where the GNU long-name or pax header that long_name came from starts
    while True:
        offset = reader.offset
        header = await reader.read(BLOCK)
        if not header:
            if offset == start:
                raise TarFormatError(f"{where}: empty file (a tar shard holds at least one block)")
            if long_name is not None:
                raise TarFormatError(
                    f"{where}: the archive ends after the long-name header at byte {pending}"
                )
            return  # no end-of-archive blocks: tolerated, as tarfile does
        if len(header) < BLOCK:
            raise TarFormatError(f"{where}: truncated tar header at byte {offset}")
        if header.count(0) == BLOCK:
            if long_name is not None:
                raise TarFormatError(
                    f"{where}: the long-name header at byte {pending} names no member "
                    f"(end of archive at byte {offset})"
                )
            return  # the end-of-archive marker
        parsed = _parse_header(header)
        if parsed is None:
            try:
                info = tarfile.TarInfo.frombuf(header, "utf-8", "surrogateescape")
            except (tarfile.HeaderError, ValueError) as error:
                raise TarFormatError(f"{where}: bad tar header at byte {offset}: {error}") from None
            parsed = info.name, info.size, info.type
        member_name, size, kind = parsed
        if size < 0:  # base-256 sizes can be negative: reading them would step back
            raise TarFormatError(
                f"{where}: bad tar header at byte {offset}: member {member_name!r} has a "
                f"negative size ({size}); a size is a count of bytes, 0 or more"
            )
        body: bytes | None
        if read_bodies or kind in _DESCRIBING:
            body = data = await reader.read(size)
            got = len(data)
        else:
            body, data = None, b""
            got = await reader.skip(size)
        if got < size:
            raise TarFormatError(
                f"{where}: the archive ends inside member {member_name!r} (header at byte "
                f"{offset} gives {size} bytes, {got} are left)"
            )
        padding = -size % BLOCK
        if padding and await reader.skip(padding) < padding:
            raise TarFormatError(
                f"{where}: the archive ends inside the padding of the member at byte {offset}"
            )
        if kind == tarfile.GNUTYPE_LONGNAME:
            long_name = data.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            pending = offset
            continue
        if kind == tarfile.XHDTYPE:
            path = _pax_path(data, where, offset)
            if path is not None or long_name is None:
                long_name, pending = path if path is not None else "", offset
            continue
        if kind == tarfile.GNUTYPE_LONGLINK:
            continue  # a link target; it must not drop a long name that came before it
        if kind == tarfile.XGLTYPE:
            _pax_path(data, where, offset)  # checked, as tarfile does; its records are unused
            continue
        name = long_name or member_name
        first = offset if long_name is None else pending
        long_name = None
        end = reader.offset
        yield name, kind, body, first, after, end
        after = end


async def iter_tar(
    chunks: AsyncIterator[bytes], where: str, *, start: int = 0
) -> AsyncGenerator[tuple[str, bytes], None]:
    """Yields ``(name, body)`` for every regular file of the tar stream ``chunks``.

    As :func:`iter_tar_spans`, without the members' byte spans.
    """
    async with aclosing(walk_tar(_ChunkReader(chunks, start), where)) as members:
        async for name, kind, body, _, _, _ in members:
            if kind in _REGULAR and body is not None:  # always read: read_bodies is set
                yield name, body


async def iter_tar_spans(
    chunks: AsyncIterator[bytes], where: str, *, start: int = 0
) -> AsyncGenerator[tuple[str, bytes, int, int], None]:
    """Yields ``(name, body, first, end)`` for every regular file of the tar stream ``chunks``.

    ``first`` is the member's first header (a GNU long-name or pax header before its own
    header included: a read can start there) and ``end`` the byte past its padding, both
    counted from the archive's start: what a checkpoint records of a partly read shard.

    Args:
        chunks: the archive's bytes, in chunks of any size.
        where: the archive's URL, for error messages (already redacted).
        start: where in the archive ``chunks`` starts: 0, or a header's offset for a
            byte range from the middle of an archive (which needs no end-of-archive
            blocks: its stream may end after any member). Error messages count from
            the archive's start.

    Raises:
        TarFormatError: an empty (0-byte) stream, a damaged header (a bad
            checksum, a negative size, a malformed pax record), or an archive
            that ends inside a header, a member or its padding; the message
            names ``where`` and the byte offset of the header.
    """
    async with aclosing(walk_tar(_ChunkReader(chunks, start), where)) as members:
        async for name, kind, body, first, _, end in members:
            if kind in _REGULAR and body is not None:  # always read: read_bodies is set
                yield name, body, first, end


def split_name(name: str) -> tuple[str, str]:
    """A member name's sample key and field (WebDataset's convention).

    Example::

        >>> split_name("train/000017.seg.png")
        ('train/000017', 'seg.png')
    """
    folder, _, base = name.rpartition("/")
    stem, _, field = base.partition(".")
    return (f"{folder}/{stem}" if folder else stem), field


async def group_samples(
    members: AsyncIterator[tuple[str, bytes]], url: str
) -> AsyncGenerator[dict[str, Any], None]:
    """Groups consecutive members with the same key into samples.

    Each sample is a dict ``{"__key__": key, "__url__": url, field: bytes, ...}``.
    Members whose file name starts with a dot, or has no field, are skipped.
    """
    sample: dict[str, Any] | None = None
    async for name, body in members:
        key, field = split_name(name)
        if not field or name.rpartition("/")[2].startswith("."):
            continue
        if sample is None or sample["__key__"] != key:
            if sample is not None:
                yield sample
            sample = {"__key__": key, "__url__": url}
        elif field in sample:
            raise TarFormatError(f"{url}: sample {key!r} has two members for field {field!r}")
        sample[field] = body
    if sample is not None:
        yield sample
