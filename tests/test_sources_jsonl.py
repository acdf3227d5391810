"""JsonLinesDataset: JSON-lines files (plain, gzip, zstd, bz2, xz) streamed, split, skipped,
resumed.

Files are written with the standard library (and zstandard) into a temporary folder and
read through ``file://`` URLs, through the ObjectServer (which counts the bytes it sends
and injects errors) and from SeaweedFS (a real S3 server).
"""

from __future__ import annotations

import asyncio
import bz2
import gzip
import itertools
import json
import lzma
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from aioload import DataLoader, RetryPolicy
from aioload.sources import JsonLinesDataset, MixDataset, ShardDataset, ShardWriter
from aioload.sources.decompress import decompressed
from aioload.sources.jsonl.lines import LineSplitter, compression_of, numbered_lines
from aioload.sources.streams.state import ShardStateError
from tests.strategies import JSON_VALUES

SIZES = [7, 3, 11, 0, 5, 9]  # lines per file: 35 in all
TOTAL = sum(SIZES)
KINDS = ["none", "gzip", "zstd", "bz2", "xz"]
SUFFIX = {
    "none": ".jsonl",
    "gzip": ".jsonl.gz",
    "zstd": ".jsonl.zst",
    "bz2": ".jsonl.bz2",
    "xz": ".jsonl.xz",
}
FAST = RetryPolicy(attempts=3, backoff=0.0)


def number(row: dict[str, Any]) -> int:
    """A row's number (module level: runs in the workers)."""
    return int(row["n"])


def compress(data: bytes, kind: str) -> bytes:
    """``data`` stored as ``kind``: in two gzip members, zstd frames, bz2 or xz streams
    (split mid-line)."""
    if kind == "none":
        return data
    half = len(data) // 2
    if kind == "gzip":
        return gzip.compress(data[:half]) + gzip.compress(data[half:])
    if kind == "bz2":
        return bz2.compress(data[:half]) + bz2.compress(data[half:])
    if kind == "xz":
        return lzma.compress(data[:half]) + lzma.compress(data[half:])
    compressor = zstandard.ZstdCompressor()
    packed: bytes = compressor.compress(data[:half]) + compressor.compress(data[half:])
    return packed


def row(n: int) -> bytes:
    return json.dumps({"n": n, "text": "x" * (n * 7 % 23)}).encode()


def write_files(folder: Path, kinds: list[str]) -> list[str]:
    """The files of SIZES (kinds in turn), rows numbered across them; their URLs."""
    folder.mkdir(parents=True, exist_ok=True)
    urls, n = [], 0
    for i, size in enumerate(SIZES):
        kind = kinds[i % len(kinds)]
        data = b"".join(row(n + j) + b"\n" for j in range(size))
        n += size
        path = folder / f"part-{i:03d}{SUFFIX[kind]}"
        path.write_bytes(compress(data, kind))
        urls.append(path.as_uri())
    return urls


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Files of every kind."""
    return write_files(tmp_path_factory.mktemp("mixed"), KINDS)


def flat(batches: list[Any]) -> list[int]:
    return [int(x) for batch in batches for x in batch]


def loader(data: Any, workers: int = 0, **options: Any) -> DataLoader[Any]:
    return DataLoader(data, batch_size=3, num_workers=workers, **options)


def stop_after(run: DataLoader[Any], count: int) -> tuple[list[int], dict[str, Any]]:
    """The samples of the first ``count`` batches and the state then, through JSON."""
    it = iter(run)
    taken = [next(it) for _ in range(count)]
    state = json.loads(json.dumps(run.state_dict()))
    it.close()
    return flat(taken), state


async def collect(dataset: JsonLinesDataset) -> list[Any]:
    return [sample async for sample in dataset]


# -- the line splitter ----------------------------------------------------------------


def reference_lines(data: bytes) -> list[tuple[bytes, int, int]]:
    """What the splitter should give: split at ``\\n``, ``\\r`` before it dropped, BOM too."""
    lines, start = [], 0
    for piece in data.split(b"\n"):
        end = min(start + len(piece) + 1, len(data))
        if start < len(data):
            content = piece[:-1] if piece.endswith(b"\r") else piece
            if start == 0 and content.startswith(b"\xef\xbb\xbf"):
                content = content[3:]
            lines.append((content, start, end))
        start = end
    return lines


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from([b"a", b"{}", b"\n", b"\r", b"\r\n", b" ", b"\xef\xbb\xbf", b"\xff"]),
        max_size=40,
    ).map(b"".join),
    st.lists(st.integers(0, 80), max_size=12),
)
def test_the_splitter_gives_the_lines_of_any_chunking(data: bytes, cuts: list[int]) -> None:
    bounds = sorted({0, len(data), *(min(c, len(data)) for c in cuts)})
    splitter = LineSplitter()
    got = []
    for first, end in itertools.pairwise(bounds):
        got += splitter.feed(data[first:end])
    got += splitter.finish()
    assert got == reference_lines(data)
    # The lines' bytes cover the stream, each from where the one before ends.
    assert [first for _, first, _ in got] == [0, *(end for _, _, end in got)][: len(got)]
    assert not got or got[-1][2] == len(data)


def test_compression_is_told_by_the_name() -> None:
    assert compression_of("a/b.JSONL") == compression_of("b.ndjson") == "none"
    assert compression_of("b.jsonl.gz") == compression_of("c4/en.00001-of-01024.json.gz")
    assert compression_of("b.jsonl.gz") == compression_of("b.ndjson.gz") == "gzip"
    assert compression_of("b.jsonl.zst") == "zstd"
    assert compression_of("b.jsonl.bz2") == compression_of("b.json.bz2") == "bz2"
    assert compression_of("b.jsonl.xz") == "xz"
    assert compression_of("b.json") is None and compression_of("b.jsonl.lz4") is None


@pytest.mark.asyncio
async def test_the_formats_users_have_are_read(tmp_path: Path) -> None:
    data = b"".join(row(n) + b"\n" for n in range(9))
    files = {
        "c4-train.00000-of-01024.json.gz": gzip.compress(data),
        "part.ndjson": data,
        "part.ndjson.gz": gzip.compress(data),
        "part.jsonl.bz2": bz2.compress(data),
        "part.json.xz": lzma.compress(data),
        "part.jsonl.xz": lzma.compress(data, format=lzma.FORMAT_XZ, check=lzma.CHECK_SHA256),
    }
    for name, stored in files.items():
        (tmp_path / name).write_bytes(stored)
        got = await collect(JsonLinesDataset((tmp_path / name).as_uri(), decode=number))
        assert got == list(range(9)), name


@pytest.mark.asyncio
@pytest.mark.parametrize("chunk_size", [1, 7, 1 << 20])
async def test_zero_padded_gzip_reads_as_gzip_does(tmp_path: Path, chunk_size: int) -> None:
    # Padded to a block, as tape and some writers leave them: gzip -d and zcat read on.
    data = b"".join(row(n) + b"\n" for n in range(50))
    stored = gzip.compress(data[:300]) + bytes(50) + gzip.compress(data[300:]) + bytes(1000)
    assert gzip.GzipFile(fileobj=__import__("io").BytesIO(stored)).read() == data
    path = tmp_path / "padded.jsonl.gz"
    path.write_bytes(stored)
    dataset = JsonLinesDataset(path.as_uri(), decode=number, chunk_size=chunk_size)
    assert await collect(dataset) == list(range(50))
    # xz allows stream padding between streams too.
    xz = tmp_path / "padded.jsonl.xz"
    xz.write_bytes(lzma.compress(data[:300]) + bytes(8) + lzma.compress(data[300:]) + bytes(4))
    assert await collect(JsonLinesDataset(xz.as_uri(), decode=number)) == list(range(50))


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", ["gzip", "bz2", "xz"])
async def test_bytes_after_the_last_member_that_are_not_one_fail(tmp_path: Path, kind: str) -> None:
    path = tmp_path / f"tail{SUFFIX[kind]}"
    path.write_bytes(compress(row(1) + b"\n", kind) + b"trailing garbage")
    with pytest.raises(ValueError, match=rf"not {kind} data"):
        await collect(JsonLinesDataset(path.as_uri(), decode=number))


@pytest.mark.asyncio
async def test_compression_is_given_for_any_name(tmp_path: Path) -> None:
    data = b"".join(row(n) + b"\n" for n in range(4))
    for name, stored, compression in (
        ("rows.gz", gzip.compress(data), "gzip"),
        ("rows.data", bz2.compress(data), "bz2"),
        ("rows.json", data, None),  # one JSON value per line, named .json
        ("rows.txt.lzma", lzma.compress(data, format=lzma.FORMAT_ALONE), "xz"),
    ):
        (tmp_path / name).write_bytes(stored)
        url = (tmp_path / name).as_uri()
        with pytest.raises(ValueError, match="or pass compression="):
            JsonLinesDataset(url)
        got = await collect(JsonLinesDataset(url, decode=number, compression=compression))
        assert got == list(range(4)), name
    # A name that says otherwise is read as compression= says.
    (tmp_path / "plain.jsonl.gz").write_bytes(data)
    url = (tmp_path / "plain.jsonl.gz").as_uri()
    assert await collect(JsonLinesDataset(url, decode=number, compression=None)) == [0, 1, 2, 3]
    for bad in ("gz", "none", "lz4", 1):
        with pytest.raises(ValueError, match=r"compression should be 'infer'.*'bz2'"):
            JsonLinesDataset(url, compression=bad)  # type: ignore[arg-type]


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", KINDS)
async def test_lines_come_while_the_file_is_still_arriving(kind: str) -> None:
    data = compress(b"".join(row(n) + b"\n" for n in range(400)), kind)
    arrived = asyncio.Event()
    sent = 0

    async def chunks() -> Any:
        nonlocal sent
        for at in range(0, len(data), 64):
            sent = at + 64
            yield data[at : at + 64]
            if at >= len(data) * 3 // 5:  # past the first zstd frame (a block, here)
                await arrived.wait()  # the rest waits until a line has come out

    lines = numbered_lines(decompressed(chunks(), kind, "memory:///a"))  # type: ignore[arg-type]
    number, content, first, _ = await anext(lines)
    assert (number, content, first) == (0, row(0), 0)
    assert sent < len(data)  # before the file's end was sent
    arrived.set()
    assert [n async for n, *_ in lines] == list(range(1, 400))


# -- reading ------------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("chunk_size", [5, 1 << 20])
async def test_every_line_comes_in_order(tmp_path: Path, kind: str, chunk_size: int) -> None:
    urls = write_files(tmp_path, [kind])
    dataset = JsonLinesDataset(urls, decode=number, chunk_size=chunk_size)
    assert await collect(dataset) == list(range(TOTAL))
    raw = await collect(JsonLinesDataset(urls[:1]))  # no decode: the parsed values
    assert raw == [json.loads(row(n)) for n in range(SIZES[0])]


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", KINDS)
async def test_crlf_bom_blank_lines_and_no_final_newline(tmp_path: Path, kind: str) -> None:
    data = b'\xef\xbb\xbf{"n": 0}\r\n\r\n   \n{"n": 1}\n\t\n{"n": 2}\r\n{"n": 3}'
    path = tmp_path / f"odd{SUFFIX[kind]}"
    path.write_bytes(compress(data, kind))
    assert await collect(JsonLinesDataset(path.as_uri(), decode=number, chunk_size=3)) == [
        0,
        1,
        2,
        3,
    ]


@pytest.mark.asyncio
async def test_large_compressed_file_streams_in_bounded_chunks(tmp_path: Path) -> None:
    lines = 20_000
    data = b"".join(row(n) + b"\n" for n in range(lines))
    path = tmp_path / "big.jsonl.gz"
    path.write_bytes(gzip.compress(data, compresslevel=1))
    dataset = JsonLinesDataset(path.as_uri(), decode=number, chunk_size=4096)
    assert await collect(dataset) == list(range(lines))


# -- splitting and shuffling --------------------------------------------------------


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_every_line_once_across_ranks_and_workers(mixed: list[str], workers: int) -> None:
    seen: list[int] = []
    for rank in range(2):
        dataset = JsonLinesDataset(mixed, decode=number, rank=rank, world_size=2)
        got = flat(list(loader(dataset, workers)))
        expected_files = set(dataset.files()) if workers == 0 else None
        if expected_files is not None:
            assert expected_files == set(mixed[rank::2])
        seen += got
    assert sorted(seen) == list(range(TOTAL))


def test_worker_files_partition_the_rank(mixed: list[str]) -> None:
    dataset = JsonLinesDataset(mixed, shuffle_files=True, seed=2)
    parts = [dataset.files(w, 3) for w in range(3)]
    assert sorted(url for part in parts for url in part) == sorted(mixed)


def test_shuffles_are_seeded_by_seed_and_epoch(mixed: list[str]) -> None:
    def run(epoch: int, **options: Any) -> list[int]:
        dataset = JsonLinesDataset(mixed, decode=number, **options)
        dataset.set_epoch(epoch)
        return flat(list(loader(dataset)))

    plain = run(0)
    assert plain == list(range(TOTAL))
    shuffled = run(0, shuffle_files=True, shuffle_buffer=6, seed=5)
    assert sorted(shuffled) == plain and shuffled != plain
    assert run(0, shuffle_files=True, shuffle_buffer=6, seed=5) == shuffled
    assert run(1, shuffle_files=True, shuffle_buffer=6, seed=5) != shuffled
    interleaved = run(0, files_in_flight=3)
    assert sorted(interleaved) == plain and interleaved != plain


# -- errors ---------------------------------------------------------------------------


def test_bad_arguments_are_refused_at_construction(tmp_path: Path) -> None:
    url = (tmp_path / "a.jsonl").as_uri()
    with pytest.raises(ValueError, match=r"not a JSON-lines file.*\.jsonl\.gz"):
        JsonLinesDataset((tmp_path / "a.csv").as_uri())
    with pytest.raises(ValueError, match="shuffle_buffer should be an int >= 0"):
        JsonLinesDataset(url, shuffle_buffer=-1)
    with pytest.raises(ValueError, match="files_in_flight should be an int >= 1"):
        JsonLinesDataset(url, files_in_flight=0)
    with pytest.raises(ValueError, match="at least one"):
        JsonLinesDataset([])
    with pytest.raises(TypeError, match="decode should be a callable"):
        JsonLinesDataset(url, decode="json")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cache_limit was given without cache_dir"):
        JsonLinesDataset(url, cache_limit="1GB")


def test_zstd_without_its_package_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "zstandard", None)
    with pytest.raises(ImportError, match=r"aioload-data\[jsonl\]"):
        JsonLinesDataset((tmp_path / "a.jsonl.zst").as_uri())


def _bad_line_files(folder: Path, bad: bool = True) -> list[str]:
    """Two files with a bad line each (``bad``; else a good line ``{"n": -1}`` there)."""
    folder.mkdir()
    first, second = (b'{"n": 1', b"not json") if bad else (b'{"n": -1}', b'{"n": -1}')
    plain = folder / "a.jsonl"
    plain.write_bytes(b'{"n": 0}\n\n' + first + b'\n{"n": 2}\n')  # line 3, byte 10
    packed = folder / "b.jsonl.gz"
    packed.write_bytes(gzip.compress(b'{"n": 3}\n' + second + b'\n{"n": 4}\n'))  # line 2
    return [plain.as_uri(), packed.as_uri()]


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_a_bad_line_is_skipped_alone(tmp_path: Path, workers: int) -> None:
    urls = _bad_line_files(tmp_path / "bad")
    dataset = JsonLinesDataset(urls, decode=number, shuffle_buffer=3, seed=1)
    skipping = loader(dataset, workers, on_error="skip")
    got = flat(list(skipping))
    assert sorted(got) == [0, 2, 3, 4]
    report = sorted(skipping.skipped, key=lambda item: item.key)
    assert [item.key for item in report] == [f"{urls[0]}:3", f"{urls[1]}:2"]
    assert report[0].where == f"{urls[0]}, line 3, byte 10"
    assert report[1].where == f"{urls[1]}, line 2"
    assert {item.error_type for item in report} == {"json.decoder.JSONDecodeError"}
    # The others keep the order they have where the bad lines are good ones.
    fixed = _bad_line_files(tmp_path / "good", bad=False)
    good = JsonLinesDataset(fixed, decode=number, shuffle_buffer=3, seed=1)
    assert [n for n in flat(list(loader(good, workers))) if n != -1] == got


@pytest.mark.asyncio
async def test_a_bad_line_raises_naming_file_and_line_without_the_policy(
    tmp_path: Path,
) -> None:
    urls = _bad_line_files(tmp_path / "bad")
    with pytest.raises(json.JSONDecodeError) as info:
        await collect(JsonLinesDataset(urls))
    assert f"{urls[0]}, line 3, byte 10" in "".join(info.value.__notes__)
    with pytest.raises(json.JSONDecodeError) as info:
        await collect(JsonLinesDataset(urls[1:]))
    assert f"{urls[1]}, line 2" in "".join(info.value.__notes__)


def test_a_bad_line_raises_under_a_raising_policy(tmp_path: Path) -> None:
    urls = _bad_line_files(tmp_path / "bad")
    run = loader(JsonLinesDataset(urls, decode=number), retry=FAST, on_error="raise")
    with pytest.raises(json.JSONDecodeError) as info:
        list(run)
    assert f"{urls[0]}, line 3, byte 10" in "".join(info.value.__notes__)


@pytest.mark.parametrize("kind", ["gzip", "zstd", "bz2", "xz"])
def test_a_truncated_file_is_skipped_from_where_it_fails(tmp_path: Path, kind: str) -> None:
    data = b"".join(row(n) + b"\n" for n in range(200))
    cut = tmp_path / f"cut{SUFFIX[kind]}"
    whole = compress(data, kind)
    cut.write_bytes(whole[: len(whole) * 3 // 4])  # inside the second member
    after = tmp_path / "after.jsonl"
    after.write_bytes(row(1000) + b"\n")
    urls = [cut.as_uri(), after.as_uri()]
    skipping = loader(JsonLinesDataset(urls, decode=number), on_error="skip")
    got = flat(list(skipping))
    assert got[-1] == 1000 and got[:-1] == list(range(len(got) - 1))
    assert len(got) - 1 < 200
    (item,) = skipping.skipped
    assert item.key == urls[0] and item.error_type == "builtins.EOFError"
    assert item.where == f"{urls[0]}: the rest of the file, from line {len(got)}"
    with pytest.raises(EOFError, match="ends early"):
        list(loader(JsonLinesDataset(urls, decode=number)))


def test_a_read_that_fails_midway_keeps_the_lines_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "a.jsonl"
    path.write_bytes(b"")
    dataset = JsonLinesDataset(path.as_uri(), decode=number)

    async def failing(number: int, byte_range: Any = 0) -> Any:
        yield row(0) + b"\n\n" + row(1) + b"\n" + row(2)[:4]
        raise ConnectionError("the connection dropped")

    monkeypatch.setattr(dataset, "_open", failing)
    skipping = loader(dataset, retry=RetryPolicy(attempts=1), on_error="skip")
    assert flat(list(skipping)) == [0, 1]
    (item,) = skipping.skipped
    first_lost = len(row(0)) + len(row(1)) + 3
    assert item.where == f"{path.as_uri()}: the rest of the file, from line 4 (byte {first_lost})"
    assert item.error_type == "builtins.ConnectionError"


def test_a_missing_file_is_skipped_or_raises(tmp_path: Path) -> None:
    present = tmp_path / "here.jsonl"
    present.write_bytes(row(1) + b"\n")
    urls = [(tmp_path / "gone.jsonl").as_uri(), present.as_uri()]
    skipping = loader(JsonLinesDataset(urls, decode=number), retry=FAST, on_error="skip")
    assert flat(list(skipping)) == [1]
    (item,) = skipping.skipped
    assert item.where == f"{urls[0]}: the rest of the file, from line 1 (byte 0)"
    with pytest.raises(FileNotFoundError, match=r"gone\.jsonl"):
        list(loader(JsonLinesDataset(urls, decode=number)))


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from aioload.testing import ObjectServer

    root = tmp_path_factory.mktemp("served")
    write_files(root / "plain", ["none"])
    write_files(root / "packed", ["gzip"])
    with ObjectServer(root, latency=0.001) as server:
        yield server


@pytest.fixture(scope="module")
def flaky(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from aioload.testing import ObjectServer

    root = tmp_path_factory.mktemp("flaky")
    write_files(root / "plain", ["none", "gzip"])
    with ObjectServer(root, error_rate=0.3, seed=4) as server:
        yield server


def served_urls(base: str, folder: str, kind: str) -> list[str]:
    return [f"{base}/{folder}/part-{i:03d}{SUFFIX[kind]}" for i in range(len(SIZES))]


def test_transient_errors_are_retried_from_the_next_line(flaky: Any) -> None:
    urls = [
        f"{flaky.url}/plain/part-{i:03d}{SUFFIX[['none', 'gzip'][i % 2]]}"
        for i in range(len(SIZES))
    ]
    options: dict[str, Any] = {"retry_config": {"max_retries": 0}}  # 503s reach the policy
    dataset = JsonLinesDataset(urls, decode=number, storage_options=options)
    patient = RetryPolicy(attempts=12, backoff=0.001, max_backoff=0.01)
    run = loader(dataset, retry=patient)
    assert flat(list(run)) == list(range(TOTAL))
    assert run.stats().epoch.retries > 0 and not run.skipped


# -- checkpoints ------------------------------------------------------------------------


def _resumed(data: JsonLinesDataset, workers: int, state: Any) -> DataLoader[Any]:
    run = loader(data, workers)
    run.load_state_dict(state)
    return run


CASES = [
    # workers, files_in_flight, shuffle_buffer
    (0, 1, 0),
    (0, 2, 5),
    pytest.param(2, 2, 4, marks=pytest.mark.slow),
]


@pytest.mark.parametrize(("workers", "in_flight", "buffer"), CASES)
def test_exact_resume_continues_with_the_lines_left(
    mixed: list[str], workers: int, in_flight: int, buffer: int
) -> None:
    options: dict[str, Any] = {"files_in_flight": in_flight, "shuffle_buffer": buffer, "seed": 3}
    full = flat(list(loader(JsonLinesDataset(mixed, decode=number, **options), workers)))
    assert sorted(full) == list(range(TOTAL))
    for stop in (1, 4, 9):
        data = JsonLinesDataset(mixed, decode=number, **options)
        taken, state = stop_after(loader(data, workers), stop)
        rest = flat(
            list(_resumed(JsonLinesDataset(mixed, decode=number, **options), workers, state))
        )
        assert taken + rest == full, stop


@pytest.mark.parametrize("kind", ["gzip", "zstd", "bz2", "xz"])
def test_a_compressed_file_resumes_by_its_line_count(tmp_path: Path, kind: str) -> None:
    # Stops inside a file's first and second member: read again from the start, decompressed.
    urls = write_files(tmp_path, [kind])
    full = flat(list(loader(JsonLinesDataset(urls, decode=number))))
    assert full == list(range(TOTAL))
    for stop in (1, 2, 4, 8):
        taken, state = stop_after(loader(JsonLinesDataset(urls, decode=number)), stop)
        rest = flat(list(_resumed(JsonLinesDataset(urls, decode=number), 0, state)))
        assert taken + rest == full, stop


@pytest.mark.parametrize("folder", ["plain", "packed"])
def test_a_resume_reads_plain_files_from_the_next_line(served: Any, folder: str) -> None:
    kind = "none" if folder == "plain" else "gzip"
    urls = served_urls(served.url, folder, kind)
    full = flat(list(loader(JsonLinesDataset(urls, decode=number))))
    taken, state = stop_after(loader(JsonLinesDataset(urls, decode=number)), 3)  # in file 1
    left_bytes = sum(len(row(n)) + 1 for n in range(len(taken), TOTAL))
    before = _settled(served)
    rest = flat(list(_resumed(JsonLinesDataset(urls, decode=number), 0, state)))
    sent = _settled(served)["bytes"] - before["bytes"]
    assert taken + rest == full
    if kind == "none":  # one ranged GET from the byte before the next line
        assert sent == left_bytes + 1
    else:  # the file begun is read again from its start
        assert sent > 0


def _settled(server: Any) -> dict[str, int]:
    """The server's counts once the requests of a closed loader have all been answered."""
    stats = server.stats()
    while True:
        time.sleep(0.05)
        again = server.stats()
        if again == stats:
            return dict(again)
        stats = again


@pytest.mark.slow
def test_elastic_resume_from_two_workers_to_one(mixed: list[str]) -> None:
    options: dict[str, Any] = {"shuffle_buffer": 4, "files_in_flight": 2, "seed": 1}
    taken, state = stop_after(loader(JsonLinesDataset(mixed, decode=number, **options), 2), 3)
    rest = flat(list(_resumed(JsonLinesDataset(mixed, decode=number, **options), 0, state)))
    assert Counter(taken + rest) == Counter(range(TOTAL))


def test_resume_streams_resplits_other_worker_counts(mixed: list[str]) -> None:
    data = JsonLinesDataset(mixed, decode=number, shuffle_buffer=3)
    assert data.resume_streams([None, None], 1, None) == [None]
    fresh = [data._plan(0, 0, 1, w, 2) for w in range(2)]  # what two workers start with
    recorded = [
        {
            "format": "aioload.jsonl-stream",
            "version": 1,
            "shards": len(mixed),
            "epoch": 0,
            "layout": data._layout(0, 1, w, 2),
            "runs": [[r.shard, r.start, r.offset, r.stop] for r in fresh[w]],
            "buffer": [],
            "draining": False,
            "rng": None,
        }
        for w in range(2)
    ]
    assert data.resume_streams(recorded, 2, None) == recorded  # the same split: as they are
    (one,) = data.resume_streams(recorded, 1, None)
    assert sorted(run[0] for run in one["runs"]) == list(range(len(mixed)))


def test_a_mix_with_a_shard_dataset_resumes_exactly(mixed: list[str], tmp_path: Path) -> None:
    with ShardWriter(str(tmp_path / "s-%03d.tar"), maxcount=6) as writer:
        for n in range(12):
            writer.write({"__key__": f"{n:04d}", "json": {"n": 100 + n}})
    shards = [Path(p).as_uri() for p in writer.shards]

    def shard_number(sample: dict[str, Any]) -> int:
        return int(json.loads(sample["json"])["n"])

    def mix() -> MixDataset:
        rows = JsonLinesDataset(mixed, decode=number, shuffle_buffer=4, seed=2)
        other = JsonLinesDataset(mixed, decode=number, files_in_flight=2)
        tars = ShardDataset(shards, decode=shard_number, shuffle_buffer=3)
        return MixDataset([rows, other, tars], [0.5, 0.3, 0.2], seed=1, stop="longest")

    full = flat(list(loader(mix())))
    assert Counter(full) == Counter([*range(TOTAL), *range(TOTAL), *range(100, 112)])
    for stop in (2, 11):
        taken, state = stop_after(loader(mix()), stop)
        resumed = loader(mix())
        resumed.load_state_dict(state)
        assert taken + flat(list(resumed)) == full


def test_a_mix_with_a_sync_source(mixed: list[str]) -> None:
    mix = MixDataset(
        [JsonLinesDataset(mixed, decode=number), range(100, 110)], [1, 1], stop="longest"
    )

    async def read() -> list[int]:
        return [sample async for sample in mix]

    got = asyncio.run(read())
    assert sorted(got) == [*range(TOTAL), *range(100, 110)]
    assert [n for n in got if n < 100] == list(range(TOTAL))
    assert flat(list(loader(mix))) == got


def test_states_of_other_datasets_are_refused(mixed: list[str], tmp_path: Path) -> None:
    data = JsonLinesDataset(mixed, decode=number)
    _, state = stop_after(loader(data), 2)
    stream = state["dataset"]
    assert stream["format"] == "aioload.jsonl-stream"
    json.dumps(stream)  # plain JSON, no line in it
    tars = ShardDataset([f"file:///nowhere/{i}.tar" for i in range(len(mixed))])
    with pytest.raises(ShardStateError, match=r"'format' should be 'aioload\.shard-stream'"):
        tars.load_state_dict(stream)
    with pytest.raises(ShardStateError, match=r"'format' should be 'aioload\.jsonl-stream'"):
        data.load_state_dict({**stream, "format": "aioload.shard-stream"})
    with pytest.raises(ShardStateError, match="shards"):
        JsonLinesDataset(mixed[:2]).load_state_dict(stream)


@pytest.mark.asyncio
async def test_a_state_of_rewritten_files_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_bytes(b"".join(row(n) + b"\n" for n in range(5)))
    data = JsonLinesDataset(path.as_uri(), shuffle_buffer=3)
    samples = aiter(data)
    await anext(samples)
    state = data.state_dict()
    await samples.aclose()  # type: ignore[attr-defined]
    assert state is not None and state["buffer"]
    path.write_bytes(b"".join(row(n + 50) + b"\n" for n in range(5)))
    again = JsonLinesDataset(path.as_uri(), shuffle_buffer=3)
    again.load_state_dict(state)
    with pytest.raises(ShardStateError, match=r"rewritten|other files"):
        await collect(again)
    moved = JsonLinesDataset(path.as_uri())
    moved.load_state_dict({**state, "buffer": [], "runs": [[0, 2, 7, -1]]})
    with pytest.raises(ShardStateError, match="other files"):
        await collect(moved)


@settings(max_examples=150, deadline=None)
@given(
    JSON_VALUES,
    st.sampled_from(
        ["runs", "buffer", "rng", "layout", "epoch", "draining", "shards", "version", "format"]
    ),
)
def test_a_corrupted_state_is_refused_clearly(value: Any, field: str) -> None:
    data = JsonLinesDataset([f"http://127.0.0.1:9/{i}.jsonl" for i in range(3)])
    good = {
        "format": "aioload.jsonl-stream",
        "version": 1,
        "shards": 3,
        "epoch": 0,
        "layout": {},
        "runs": [[0, 0, 0, -1]],
        "buffer": [],
        "draining": False,
        "rng": None,
    }
    try:
        data.load_state_dict({**good, field: value})
    except ShardStateError as error:
        assert str(error).startswith("shard stream state: ")
    try:
        data.resume_streams([{**good, field: value}, None], 1, None)
    except ShardStateError as error:
        assert str(error).startswith("shard stream state: ")


# -- the cache ---------------------------------------------------------------------------


def test_the_cache_serves_the_second_epoch(served: Any, tmp_path: Path) -> None:
    urls = served_urls(served.url, "packed", "gzip")
    dataset = JsonLinesDataset(urls, decode=number, cache_dir=tmp_path / "cache")
    run = loader(dataset)
    assert flat(list(run)) == list(range(TOTAL))
    first = run.stats().epoch
    assert (first.cache_hits, first.cache_misses) == (0, len(SIZES))
    assert first.store_bytes > 0
    assert flat(list(run)) == list(range(TOTAL))
    again = run.stats().epoch
    assert (again.cache_hits, again.cache_misses, again.store_bytes) == (len(SIZES), 0, 0)


# -- a real S3 server ----------------------------------------------------------------------


def test_reads_and_resumes_over_s3(
    tmp_path: Path, seaweedfs: Any, s3_storage_options: dict[str, Any], s3_prefix: str
) -> None:
    import obstore

    from aioload.sources import open_store

    kinds = ["none", "gzip"]
    local = write_files(tmp_path, kinds)
    store, prefix = open_store(s3_prefix, storage_options=s3_storage_options)

    async def upload() -> None:
        for url in local:
            name = url.rpartition("/")[2]
            await obstore.put_async(store, f"{prefix}/{name}", Path(url[7:]).read_bytes())

    asyncio.run(upload())
    urls = [f"{s3_prefix}/{url.rpartition('/')[2]}" for url in local]
    options: dict[str, Any] = {
        "shuffle_buffer": 4,
        "files_in_flight": 2,
        "storage_options": s3_storage_options,
    }
    full = flat(list(loader(JsonLinesDataset(urls, decode=number, **options))))
    assert sorted(full) == list(range(TOTAL))
    taken, state = stop_after(loader(JsonLinesDataset(urls, decode=number, **options)), 4)
    rest = flat(list(_resumed(JsonLinesDataset(urls, decode=number, **options), 0, state)))
    assert taken + rest == full
