"""Shard indexes: the file format (validated, fuzzed), ShardWriter's, and the tar-header scan.

The scan is checked against the reader it stands for: on valid shards and on the damaged
ones of ``test_sources_tar``'s fuzz test, ``scan_tar`` raises exactly when reading the
whole shard raises, and otherwise every sample's byte range, read on its own, gives the
very sample the whole read gives.
"""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_sources_tar import SEEDS, SHARD_MUTATION, cpu_deadline, drive, in_chunks, mutate, parse
from test_sources_tar import WHERE as SHARD

from aioload.sources import ShardIndex, ShardIndexError, ShardWriter, TarFormatError
from aioload.sources.tar.index import INDEX_FORMAT, INDEX_SUFFIX
from aioload.sources.tar.reader import group_samples, iter_tar
from aioload.sources.tar.scan import scan_tar

WHERE = "s3://bucket/shard-0003.tar.idx.json"


def valid() -> dict[str, Any]:
    return {
        "format": INDEX_FORMAT,
        "version": 1,
        "shard_size": 10240,
        "keys": ["a", "b", "c"],
        "offsets": [0, 1024, 2048],
        "sizes": [1024, 1024, 3072],
    }


def load(document: Any) -> ShardIndex:
    return ShardIndex.from_json(json.dumps(document).encode(), WHERE)


def test_round_trip_and_the_small_api() -> None:
    index = load(valid())
    assert len(index) == 3
    assert index.keys == ("a", "b", "c")
    assert index.offsets.tolist() == [0, 1024, 2048] and index.sizes.tolist() == [1024, 1024, 3072]
    assert index.shard_size == 10240
    assert index.byte_range(0, 3) == (0, 5120)
    assert index.byte_range(1, 2) == (1024, 2048)
    with pytest.raises(IndexError):
        index.byte_range(2, 2)
    assert ShardIndex.from_json(index.to_json(), WHERE) == index
    assert ShardIndex.from_json(index.to_json().decode(), WHERE) == index
    with pytest.raises(ValueError, match="read-only"):
        index.offsets[0] = 512
    # Extra fields are ignored; an empty shard has an empty index.
    assert load({**valid(), "written_by": "someone"}) == index
    empty = load({**valid(), "keys": [], "offsets": [], "sizes": []})
    assert len(empty) == 0
    # A key that was not UTF-8 in the tar (decoded with surrogateescape) survives.
    odd = ShardIndex(["caf\udce9"], [0], [512], 512)
    assert ShardIndex.from_json(odd.to_json(), WHERE).keys == ("caf\udce9",)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"format": "webdataset"}, "'format' should be"),
        ({"version": 2}, "version 2; this aioload reads version 1"),
        ({"version": True}, "version True"),
        ({"shard_size": -1}, "'shard_size' should be an int >= 0"),
        ({"shard_size": "10240"}, "'shard_size'"),
        ({"keys": "abc"}, "'keys' should be a list"),
        ({"keys": ["a", "", "c"]}, "non-empty str"),
        ({"keys": ["a", 2, "c"]}, "non-empty str"),
        ({"offsets": [0, 1024]}, "one entry per sample"),
        ({"offsets": [0, 1024.0, 2048]}, "'offsets' should hold ints"),
        ({"offsets": [0, True, 2048]}, "'offsets' should hold ints"),
        ({"sizes": [1024, -512, 3072]}, "'sizes' should hold ints >= 0"),
        ({"offsets": [0, 1000, 2048]}, "whole 512-byte"),
        ({"sizes": [1024, 0, 3072]}, "sizes >= 512"),
        ({"offsets": [0, 512, 2048]}, "sample 0 .* overlaps the next one"),
        ({"offsets": [0, 2048, 1024]}, "overlaps"),
        ({"shard_size": 4096}, "ends at byte 5120, past the shard's 4096 bytes"),
        ({"offsets": [0, 1024, 2**63]}, "below 2\\*\\*63"),
        ({"shard_size": 2**63}, "below 2\\*\\*63"),
        ({"offsets": [0, 1024, 2**63 - 512], "shard_size": 2**63 - 1}, "past the shard's"),
    ],
)
def test_bad_fields_raise_naming_the_file(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ShardIndexError, match=r"shard-0003\.tar\.idx\.json: bad shard index: "):
        load({**valid(), **change})
    with pytest.raises(ShardIndexError, match=message):
        load({**valid(), **change})


def test_missing_fields_and_other_documents() -> None:
    for name in valid():
        document = valid()
        del document[name]
        with pytest.raises(ShardIndexError):
            load(document)
    for data in (b"", b"\xff\xfe", b"[1, 2]", b"null", b"{", b"[" * 100_000, b'{"a": 1e999}'):
        with pytest.raises(ShardIndexError, match="bad shard index"):
            ShardIndex.from_json(data, WHERE)
    assert isinstance(ShardIndexError("x"), ValueError)


# -- fuzzing: index files are outside data -----------------------------------------------

_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
_FIELDS = st.sampled_from(["format", "version", "shard_size", "keys", "offsets", "sizes"])


@st.composite
def _altered(draw: st.DrawFn) -> bytes:
    """A valid index file with some fields replaced, removed or its bytes damaged."""
    document: dict[str, Any] = valid()
    for _ in range(draw(st.integers(1, 3))):
        field = draw(_FIELDS)
        if draw(st.booleans()):
            document.pop(field, None)
        else:
            document[field] = draw(_JSON)
    data = bytearray(json.dumps(document).encode())
    for _ in range(draw(st.integers(0, 2))):
        data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    return bytes(data)


@pytest.mark.timeout(120)
@settings(
    max_examples=400,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    data=st.one_of(st.binary(max_size=200), _JSON.map(lambda v: json.dumps(v).encode()), _altered())
)
def test_any_bytes_give_an_index_or_a_shard_index_error(data: bytes) -> None:
    try:
        index = ShardIndex.from_json(data, WHERE)
    except ShardIndexError:
        return
    # What was accepted is a consistent index: it round-trips and its ranges are in order.
    assert ShardIndex.from_json(index.to_json(), WHERE) == index
    ends = index.offsets + index.sizes
    assert all(ends[:-1] <= index.offsets[1:]) and (not len(index) or ends[-1] <= index.shard_size)


@settings(max_examples=100, derandomize=True, deadline=None, database=None)
@given(
    sizes=st.lists(st.integers(1, 40), max_size=20),
    gaps=st.lists(st.integers(0, 3), min_size=21, max_size=21),
    tail=st.integers(0, 30),
)
def test_valid_indexes_round_trip(sizes: list[int], gaps: list[int], tail: int) -> None:
    offsets, position = [], gaps[-1] * 512
    for size, gap in zip(sizes, gaps, strict=False):
        offsets.append(position)
        position += (size + gap) * 512
    keys = [f"k{i}" for i in range(len(sizes))]
    index = ShardIndex(keys, offsets, [size * 512 for size in sizes], position + tail * 512)
    assert ShardIndex.from_json(index.to_json(), WHERE) == index


# -- ShardWriter's indexes and the scan --------------------------------------------------


def run_scan(data: bytes, chunk: int) -> ShardIndex:
    chunks = in_chunks(data, chunk)
    try:
        return drive(scan_tar(chunks, SHARD))  # type: ignore[no-any-return]
    finally:
        drive(chunks.aclose())


def read_range(data: bytes, first: int, end: int) -> list[dict[str, Any]]:
    """The samples of bytes ``first:end`` of a shard, read on their own."""

    async def only(piece: bytes) -> AsyncGenerator[bytes, None]:
        yield piece

    samples = group_samples(iter_tar(only(data[first:end]), SHARD, start=first), SHARD)
    found = []
    while True:
        try:
            found.append(drive(samples.__anext__()))
        except StopAsyncIteration:
            return found


def check_ranges(data: bytes, index: ShardIndex) -> None:
    """Every sample's range, and the range of all of them, read alone as a whole read reads."""
    whole = parse(data, samples=True)
    assert [sample["__key__"] for sample in whole] == list(index.keys)
    for number, sample in enumerate(whole):
        assert read_range(data, *index.byte_range(number, number + 1)) == [sample]
    if len(index) > 1:
        assert read_range(data, *index.byte_range(1, len(index))) == whole[1:]


def test_writer_indexes_match_the_scan_and_the_shards(tmp_path: Path) -> None:
    deep = "/".join(["folder"] * 30)  # pax headers for the long names
    with ShardWriter(str(tmp_path / "s-%03d.tar"), maxcount=4) as writer:
        for i in range(10):
            key = f"{deep}/{i:04d}" if i % 3 == 0 else f"{i:04d}"
            writer.write({"__key__": key, "cls": i, "txt": "x" * (i * 200), "bin": b"\x00" * i})
    assert writer.indexes == [shard + INDEX_SUFFIX for shard in writer.shards]
    for shard, index_file in zip(writer.shards, writer.indexes, strict=True):
        data = Path(shard).read_bytes()
        index = ShardIndex.from_json(Path(index_file).read_bytes(), index_file)
        assert index.shard_size == len(data)
        for chunk in (1, 700, 1 << 20):
            assert run_scan(data, chunk) == index
        check_ranges(data, index)
    assert [len(ShardIndex.from_json(Path(f).read_bytes(), f)) for f in writer.indexes] == [4, 4, 2]
    with ShardWriter(str(tmp_path / "n-%03d.tar"), index=False) as plain:
        plain.write({"__key__": "a", "cls": 1})
    assert plain.indexes == [] and not Path(plain.shards[0] + INDEX_SUFFIX).exists()


def test_scan_follows_the_grouping_rules() -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as archive:
        long = "x" * 120 + "/0003"  # a GNU long-name header before its member

        def add(name: str, body: bytes = b"1", kind: bytes = tarfile.REGTYPE) -> None:
            info = tarfile.TarInfo(name)
            info.type = kind
            info.size = len(body) if kind == tarfile.REGTYPE else 0
            archive.addfile(info, io.BytesIO(body) if kind == tarfile.REGTYPE else None)

        add("0001.cls")
        add("dir", kind=tarfile.DIRTYPE)  # not a sample, inside sample 0001: kept open
        add("0001.txt", b"a" * 600)
        add(".hidden.txt")  # skipped
        add("README")  # no field: skipped
        add(f"{long}.cls")
        add(f"{long}.txt")
        add("0001.bin")  # the key again, after another: a sample of its own
    data = buffer.getvalue()
    index = run_scan(data, 100)
    assert index.keys == ("0001", long, "0001")
    assert index.offsets[0] == 0 and index.shard_size == len(data)
    check_ranges(data, index)


def test_scan_raises_on_duplicate_fields_as_grouping_does() -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name in ("0001.txt", "0001.txt"):
            info = tarfile.TarInfo(name)
            info.size = 1
            archive.addfile(info, io.BytesIO(b"1"))
    with pytest.raises(TarFormatError, match="two members for field 'txt'"):
        run_scan(buffer.getvalue(), 512)
    with pytest.raises(TarFormatError, match="two members for field 'txt'"):
        parse(buffer.getvalue(), samples=True)


@pytest.mark.timeout(120)
@settings(
    max_examples=300,
    derandomize=True,
    deadline=2000,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    seed=st.sampled_from(range(len(SEEDS))),
    operations=st.lists(SHARD_MUTATION, max_size=3),
    chunk=st.sampled_from([1, 511, 512, 4096, 1 << 20]),
)
def test_the_scan_fails_where_reading_fails_and_its_ranges_read_alike(
    seed: int, operations: list[tuple[str, int, Any]], chunk: int
) -> None:
    data = mutate(SEEDS[seed][0], operations)
    with cpu_deadline(2.0):
        try:
            whole = parse(data, chunk, samples=True)
        except (TarFormatError, OSError):
            with pytest.raises((TarFormatError, OSError)):
                run_scan(data, chunk)
            return
        index = run_scan(data, chunk)
    assert [sample["__key__"] for sample in whole] == list(index.keys)
    for number, sample in enumerate(whole):
        assert read_range(data, *index.byte_range(number, number + 1)) == [sample]
