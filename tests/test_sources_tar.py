"""The streaming tar reader on damaged shards: a TarFormatError naming shard and byte, never a hang.

The reader runs on an in-memory stream that never suspends, so it is driven
here without an event loop (:func:`parse`), and a parse that spins is stopped
by a CPU-time alarm (:func:`cpu_deadline`: ``SIGVTALRM``, which leaves
pytest-timeout's ``SIGALRM`` alone).

The fuzz test runs a few seconds in the suite. For a long run, set
``AIOLOAD_TAR_FUZZ_EXAMPLES`` (e.g. ``200000``): it then draws that many
random cases instead of the fixed, derandomized short series.
"""

from __future__ import annotations

import asyncio
import gc
import io
import os
import signal
import tarfile
from collections.abc import AsyncGenerator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aioload.sources import ShardDataset, ShardWriter, TarFormatError
from aioload.sources.tar.reader import group_samples, iter_tar

WHERE = "file:///data/shard-0007.tar"


class Hang(Exception):
    """The parse used up its CPU-time budget: it is spinning."""


@contextmanager
def cpu_deadline(seconds: float) -> Iterator[None]:
    """Raises :class:`Hang` inside the block once it has used ``seconds`` of CPU time."""

    def expire(signum: int, frame: Any) -> None:
        raise Hang(f"no result after {seconds} s of CPU time")

    previous = signal.signal(signal.SIGVTALRM, expire)
    # No collection inside the block: a full one, late in a long run, costs a second of CPU
    # and would be taken for a hang (raised in a gc callback, where it is ignored).
    collecting = gc.isenabled()
    gc.disable()
    signal.setitimer(signal.ITIMER_VIRTUAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_VIRTUAL, 0)
        signal.signal(signal.SIGVTALRM, previous)
        if collecting:
            gc.enable()


async def in_chunks(data: bytes, size: int) -> AsyncGenerator[bytes, None]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


def drive(step: Any) -> Any:
    """The result of an awaitable that never suspends (the reader on an in-memory stream)."""
    try:
        step.send(None)
    except StopIteration as done:
        return done.value
    step.close()
    raise AssertionError("the reader awaited something else than the in-memory stream")


def parse(data: bytes, chunk: int = 1 << 20, samples: bool = False) -> list[Any]:
    """The members (or with ``samples`` the grouped samples) of the tar bytes ``data``."""
    chunks = in_chunks(data, max(chunk, 1))
    members: Any = iter_tar(chunks, WHERE)
    if samples:
        members = group_samples(members, WHERE)
    found = []
    try:
        while True:
            try:
                found.append(drive(members.__anext__()))
            except StopAsyncIteration:
                return found
    finally:
        drive(members.aclose())
        drive(chunks.aclose())


# -- building headers --------------------------------------------------------------------


def header(name: bytes, kind: bytes, size_field: bytes, magic: bytes = b"ustar\x0000") -> bytes:
    """A 512-byte tar header with these fields and a valid checksum."""
    block = bytearray(512)
    block[: len(name[:100])] = name[:100]
    block[100:108] = b"0000444\x00"
    block[124:136] = size_field.ljust(12, b"\x00")[:12]
    block[156:157] = kind
    block[257:265] = magic
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\x00 " % sum(block)
    return bytes(block)


def octal(size: int) -> bytes:
    """``size`` as a 12-byte octal number field (cut to 12 bytes if it is too large)."""
    return (b"%011o\x00" % size)[:12]


def base256(size: int) -> bytes:
    """``size`` in the GNU base-256 encoding of a 12-byte number field (negative ones too)."""
    if size >= 0:
        return b"\x80" + size.to_bytes(11, "big")
    return b"\xff" + (256**11 + size).to_bytes(11, "big")


def member(name: bytes, kind: bytes, body: bytes, size: int | None = None) -> bytes:
    """A header and its padded body; ``size`` overrides the size written in the header."""
    declared = len(body) if size is None else size
    size_field = octal(declared) if 0 <= declared < 8**11 else base256(declared)
    return header(name, kind, size_field) + body + b"\x00" * (-len(body) % 512)


def pax(records: bytes) -> bytes:
    return member(b"././@PaxHeader", tarfile.XHDTYPE, records)


END = b"\x00" * 1024
PLAIN = member(b"0001.txt", tarfile.REGTYPE, b"hello")


# -- the known hangs and their neighbours ------------------------------------------------


@pytest.mark.timeout(10)
def test_a_pax_record_of_length_0_raises() -> None:
    with pytest.raises(TarFormatError, match=r"0007\.tar: bad pax header at byte 1024: .*length 0"):
        parse(PLAIN + pax(b"0 path=x\n") + PLAIN + END)


@pytest.mark.timeout(10)
def test_a_long_name_with_a_negative_base256_size_raises() -> None:
    shard = PLAIN + header(b"././@LongLink", tarfile.GNUTYPE_LONGNAME, base256(-512)) + END
    with pytest.raises(TarFormatError, match=r"shard-0007\.tar: .*byte 1024: .*negative size"):
        parse(shard)


@pytest.mark.timeout(10)
def test_a_pax_record_length_that_is_not_a_number_raises() -> None:
    for records in (b"xx path=x\n", b"-9 path=x\n", b"1_2 path=abcd\n", b" 9 path=x\n"):
        with pytest.raises(TarFormatError, match=r"shard-0007\.tar: bad pax header at byte 0"):
            parse(pax(records) + PLAIN + END)


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("shard", "message"),
    [
        (pax(b"3 a\n") + PLAIN + END, r"at byte 0: .*length 3"),  # under the shortest record
        (pax(b"99 path=x\n") + PLAIN + END, r"at byte 0: .*length 99"),  # past the data
        (pax(b"9 pathx\n\n") + PLAIN + END, r"at byte 0: .*KEY=VALUE"),  # no '='
        (pax(b"10 path=xy") + PLAIN + END, r"at byte 0: .*newline"),
        (PLAIN + member(b"a.txt", b"0", b"", size=-1) + END, r"at byte 1024: .*negative size"),
        (PLAIN + header(b"a.txt", b"0", b"-0000001\x00") + END, r"at byte 1024: .*negative size"),
        (PLAIN + member(b"a.txt", b"0", b"x", size=4000) + END, r"ends inside member 'a\.txt'"),
        (PLAIN + member(b"a.txt", b"0", b"", size=2**80) + END, r"'a\.txt' \(header at byte 1024"),
        (PLAIN + PLAIN[:300], r"truncated tar header at byte 1024"),
        (PLAIN[:512] + b"hel", r"ends inside member '0001\.txt'"),
        (PLAIN[:512] + b"hello" + b"\x00" * 7, r"padding of the member at byte 0"),
        (PLAIN + b"\x01" + PLAIN[1:] + END, r"bad tar header at byte 1024: bad checksum"),
        (PLAIN + pax(b"13 path=long\n") + END, r"header at byte 1024 names no member"),
        (PLAIN + pax(b"13 path=long\n"), r"ends after the long-name header at byte 1024"),
        (member(b"././@LongLink", b"L", b"name\x00"), r"ends after the long-name header at byte 0"),
    ],
)
def test_malformed_headers_name_shard_and_byte(shard: bytes, message: str) -> None:
    for chunk in (1, 512, 1 << 20):
        with pytest.raises(TarFormatError, match=r"shard-0007\.tar: .*" + message):
            parse(shard, chunk)


def test_pax_records_are_read_after_the_checks() -> None:
    path = _record(b"path", b"deep/0001.txt")
    assert path == b"22 path=deep/0001.txt\n"
    shard = pax(_record(b"comment", b"ignored") + path) + PLAIN + END
    assert parse(shard) == [("deep/0001.txt", b"hello")]
    padded = pax(path + b"\x00" * 30) + PLAIN + END  # NUL padding ends the records
    assert parse(padded) == [("deep/0001.txt", b"hello")]
    link_then_name = (
        member(b"././@LongLink", b"L", b"long/0002.txt\x00")
        + member(b"././@LongLink", b"K", b"target\x00")
        + PLAIN
    )
    assert parse(link_then_name + END) == [("long/0002.txt", b"hello")]


def test_an_empty_file_is_an_error_and_an_empty_archive_is_not(tmp_path: Path) -> None:
    with pytest.raises(TarFormatError, match=r"shard-0007\.tar: empty file"):
        parse(b"")
    assert parse(END) == []  # only the end-of-archive marker: tarfile opens it too
    with tarfile.open(fileobj=io.BytesIO(END)) as archive:
        assert archive.getnames() == []
    empty = tmp_path / "empty.tar"
    empty.write_bytes(b"")
    with pytest.raises(tarfile.ReadError, match="empty file"), tarfile.open(empty):
        pass
    with pytest.raises(TarFormatError, match=r"empty\.tar: empty file"):
        collect(ShardDataset(empty.as_uri()))


def collect(dataset: ShardDataset) -> list[Any]:
    async def run() -> list[Any]:
        return [sample async for sample in dataset]

    return asyncio.run(run())


# -- the fuzz test -----------------------------------------------------------------------


def _seeds() -> list[tuple[bytes, list[tuple[str, bytes]]]]:
    """Valid shards in the formats the reader supports, and the members each holds."""
    import tempfile

    seeds = []
    deep = "/".join(["folder"] * 20)  # past ustar's 100 + 155 characters: a pax path record
    with tempfile.TemporaryDirectory() as folder:
        with ShardWriter(os.path.join(folder, "w-%d.tar")) as writer:
            writer.write({"__key__": f"{deep}/0001", "txt": "deep", "cls": 1})
            writer.write({"__key__": "0002", "bin": bytes(range(256)) * 3, "json": {"a": [1]}})
        data = Path(writer.shards[0]).read_bytes()
    seeds.append(data)
    for fmt in (tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT, tarfile.PAX_FORMAT):
        buffer = io.BytesIO()
        headers = {"comment": "global"} if fmt == tarfile.PAX_FORMAT else None
        with tarfile.open(fileobj=buffer, mode="w", format=fmt, pax_headers=headers) as archive:
            long = "x" * 90 + "/" + "y" * 60 + "/0003"  # GNU: a long name; ustar: a prefix
            for name, body in ((f"{long}.txt", b"long"), ("0004.cls", b"4"), ("0004.txt", b"")):
                info = tarfile.TarInfo(name)
                info.size = len(body)
                archive.addfile(info, io.BytesIO(body))
            if fmt != tarfile.USTAR_FORMAT:
                link = tarfile.TarInfo("0005.lnk")
                link.type, link.linkname = tarfile.SYMTYPE, "t" * 150
                archive.addfile(link)
            folder_info = tarfile.TarInfo("dir")
            folder_info.type = tarfile.DIRTYPE
            archive.addfile(folder_info)
        seeds.append(buffer.getvalue())
    return [(data, _tarfile_members(data)) for data in seeds]


def _tarfile_members(data: bytes) -> list[tuple[str, bytes]]:
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        found = []
        for info in archive:
            if info.isreg():
                file = archive.extractfile(info)
                assert file is not None
                found.append((info.name, file.read()))
        return found


SEEDS = _seeds()


def _record(key: bytes, value: bytes) -> bytes:
    """A well-framed pax record (its length counts its own digits)."""
    rest = len(key) + len(value) + 3  # the space, the '=' and the newline
    length = rest + len(str(rest))
    length = rest + len(str(length))
    return b"%d %s=%s\n" % (length, key, value)


_NUMBER_FIELDS = st.one_of(
    st.integers(0, 2**33).map(octal),
    st.integers(-(2**87), 2**87).map(base256),
    st.sampled_from([b"-1", b"-00001000", b" 1_0 ", b"+7", b"", b"\x00" * 12, b"9" * 12]),
    st.binary(min_size=12, max_size=12),
).map(lambda field: field.ljust(12, b"\x00")[:12])
_KINDS = st.sampled_from([b"0", b"\x00", b"L", b"K", b"x", b"g", b"5", b"S", b"2", b"7", b"\xff"])
_PAX_RECORD = st.one_of(
    st.builds(
        _record,
        st.sampled_from([b"path", b"size", b"comment", b"linkpath", b"hdrcharset", b""]),
        st.binary(max_size=30),
    ),
    st.builds(
        lambda length, rest: length + b" " + rest,
        st.one_of(
            st.integers(-20, 2**70).map(lambda n: str(n).encode()),
            st.sampled_from([b"", b"x", b"0", b"00", b"5", b" "]),
        ),
        st.binary(max_size=20),
    ),
)


@st.composite
def _crafted(draw: st.DrawFn) -> bytes:
    """A header with random (often hostile) fields, and maybe a body of pax-like records."""
    magic = draw(st.sampled_from([b"ustar\x0000", b"ustar  \x00", b"\x00" * 8, b"garbage!"]))
    block = bytearray(header(draw(st.binary(max_size=100)), draw(_KINDS), b"", magic))
    block[124:136] = draw(_NUMBER_FIELDS)
    if draw(st.booleans()):
        block[345:500] = draw(st.binary(min_size=155, max_size=155))
    block[148:156] = b" " * 8
    block[148:156] = draw(st.sampled_from([b"%06o\x00 " % sum(block), b"%07o\x00" % sum(block)]))
    body = b"".join(draw(st.lists(_PAX_RECORD, max_size=4)))
    return bytes(block) + body + b"\x00" * (-len(body) % 512)


# One corruption of a shard, for ``mutate``: a flipped byte, a cut, a crafted header spliced
# over a block or inserted before one.
SHARD_MUTATION = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 2**20), st.integers(1, 255)),
    st.tuples(st.just("truncate"), st.integers(0, 2**20), st.just(0)),
    st.tuples(st.just("splice"), st.integers(0, 64), _crafted()),
    st.tuples(st.just("insert"), st.integers(0, 64), _crafted()),
)


def mutate(data: bytes, operations: list[tuple[str, int, Any]]) -> bytes:
    """``data`` (a shard) with ``operations`` (drawn from ``SHARD_MUTATION``) applied in turn."""
    shard = bytearray(data)
    for kind, where, what in operations:
        if kind == "flip" and shard:
            shard[where % len(shard)] ^= what
        elif kind == "truncate":
            del shard[where % (len(shard) + 1) :]
        elif kind in ("splice", "insert"):
            start = 512 * (where % (len(shard) // 512 + 1))
            end = start + (len(what) if kind == "splice" else 0)
            shard[start:end] = what
    return bytes(shard)


_LONG_RUN = int(os.environ.get("AIOLOAD_TAR_FUZZ_EXAMPLES", "0"))
# The suite's run keeps no example database; a long run keeps its findings to replay them.
_DATABASE: dict[str, Any] = {} if _LONG_RUN else {"database": None}


@pytest.mark.timeout(0 if _LONG_RUN else 120)  # 0: none for a long run
@settings(
    max_examples=_LONG_RUN or 600,
    derandomize=not _LONG_RUN,  # the suite's run is the same series every time
    deadline=2000,  # ms; a hang is caught by the CPU-time alarm below, not by this
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    **_DATABASE,
)
@given(
    seed=st.sampled_from(range(len(SEEDS))),
    operations=st.lists(SHARD_MUTATION, min_size=1, max_size=4),
    chunk=st.sampled_from([1, 7, 511, 512, 513, 4096, 1 << 20]),
    samples=st.booleans(),
)
def test_damaged_shards_raise_tar_format_error_or_parse(
    seed: int, operations: list[tuple[str, int, Any]], chunk: int, samples: bool
) -> None:
    data = mutate(SEEDS[seed][0], operations)
    try:
        with cpu_deadline(2.0):
            found = parse(data, chunk, samples)
    except (TarFormatError, OSError):
        return
    # Every member takes at least a header block: more members would mean re-reading.
    assert len(found) <= len(data) // 512


def test_the_fuzzed_seeds_parse_as_tarfile_reads_them() -> None:
    for data, members in SEEDS:
        for chunk in (1, 513, 1 << 20):
            assert parse(data, chunk) == members
