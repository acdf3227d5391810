"""``aioload index URL...``: the index files of existing shards, and the warning that names it.

Shards are written by ShardWriter twice: once with their index files (the reference: what
the command must write, byte for byte) and once without (the shards another tool wrote).
The command runs against SeaweedFS (a real S3 server on 127.0.0.1) and local files.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import obstore
import pytest

from aioload import DataLoader
from aioload.cli import EXIT_CODES, main
from aioload.sources import ShardDataset, ShardIndex, ShardWriter, open_store
from aioload.sources.stores.braces import brace_pattern
from aioload.sources.tar.index import INDEX_SUFFIX
from aioload.sources.tar.indexes import index_command
from aioload.testing import ObjectServer

SHARDS = 6
PER_SHARD = 9


def write_shards(folder: Path, *, index: bool, count: int = SHARDS) -> list[Path]:
    """``count`` shards ``part-000.tar`` ... of samples of varied sizes, numbered on."""
    folder.mkdir(parents=True, exist_ok=True)
    with ShardWriter(str(folder / "part-%03d.tar"), maxcount=PER_SHARD, index=index) as writer:
        for number in range(count * PER_SHARD):
            writer.write({"__key__": f"{number:06d}", "cls": number, "txt": "x" * (number * 37)})
    return [Path(path) for path in writer.shards]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """Shard name -> the index file ShardWriter writes for it."""
    paths = write_shards(tmp_path_factory.mktemp("reference"), index=True)
    return {path.name: Path(f"{path}{INDEX_SUFFIX}").read_bytes() for path in paths}


def report_of(capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    report: dict[str, Any] = json.loads(capsys.readouterr().out)
    return report


def s3_arguments(options: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The flags a shell user passes (credentials in the environment)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", str(options["access_key_id"]))
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", str(options["secret_access_key"]))
    return ["--endpoint", str(options["endpoint"]), "--region", str(options["region"])]


def put_files(url: str, options: dict[str, Any], paths: list[Path]) -> None:
    store, prefix = open_store(url + "/", storage_options=options)

    async def put_all() -> None:
        await asyncio.gather(
            *(obstore.put_async(store, prefix + p.name, p.read_bytes()) for p in paths)
        )

    asyncio.run(put_all())


def stored_indexes(url: str, options: dict[str, Any]) -> dict[str, bytes]:
    """Shard name -> its index file, of every index file under ``url``."""
    store, prefix = open_store(url + "/", storage_options=options)
    found = {}
    for page in obstore.list(store, prefix):
        for meta in page:
            name = meta["path"].rpartition("/")[2]
            if name.endswith(INDEX_SUFFIX):
                data = bytes(obstore.get(store, meta["path"]).bytes())
                found[name.removesuffix(INDEX_SUFFIX)] = data
    return found


def test_it_writes_what_shard_writer_writes_and_a_second_run_reads_nothing(
    tmp_path: Path,
    s3_prefix: str,
    s3_storage_options: dict[str, Any],
    reference: dict[str, bytes],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    put_files(s3_prefix, s3_storage_options, write_shards(tmp_path, index=False))
    flags = s3_arguments(s3_storage_options, monkeypatch)
    pattern = f"{s3_prefix}/part-{{000..{SHARDS - 1:03d}}}.tar"
    assert main(["index", pattern, *flags, "--json", "--quiet"]) == 0
    first = report_of(capsys)
    assert (first["shards"], first["written"], first["kept"]) == (SHARDS, SHARDS, 0)
    assert first["samples"] == SHARDS * PER_SHARD and first["read_bytes"] > 0
    assert stored_indexes(s3_prefix, s3_storage_options) == reference
    # Again, over the prefix: every index is valid, no shard is read.
    assert main(["index", s3_prefix + "/", *flags, "--json", "--quiet", "--concurrency", "2"]) == 0
    again = report_of(capsys)
    assert (again["kept"], again["written"], again["read_bytes"]) == (SHARDS, 0, 0)
    # Two ranks split the samples with the files written: no shard is read whole.
    with caplog.at_level(logging.WARNING, logger="aioload"):
        ranks = [
            ShardDataset(pattern, rank=rank, world_size=2, storage_options=s3_storage_options)
            for rank in range(2)
        ]
        assert [len(rank) for rank in ranks] == [SHARDS * PER_SHARD // 2] * 2
    assert "no index file" not in caplog.text
    keys = [s["__key__"] for rank in ranks for s in DataLoader(rank, batch_size=None)]
    assert sorted(keys) == [f"{n:06d}" for n in range(SHARDS * PER_SHARD)]


def test_it_keeps_valid_indexes_and_rebuilds_damaged_and_stale_ones(
    tmp_path: Path, reference: dict[str, bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "shards"
    paths = write_shards(folder, index=True)
    Path(f"{paths[1]}{INDEX_SUFFIX}").unlink()  # none
    Path(f"{paths[2]}{INDEX_SUFFIX}").write_bytes(b'{"format": "aioload.sha')  # damaged
    # Stale: the shard rewritten (another size) under its old index.
    other = next(p for p in paths if p.stat().st_size != paths[3].stat().st_size)
    shutil.copy(other, paths[3])
    os.chdir(tmp_path)  # a path relative to the working folder, as a shell user gives one
    assert main(["index", "shards", "--json", "--quiet"]) == 0
    report = report_of(capsys)
    assert (report["written"], report["rebuilt"], report["kept"]) == (1, 2, SHARDS - 3)
    expected = dict(reference)
    expected[paths[3].name] = reference[other.name]  # its content is the other's now
    found = {
        p.name.removesuffix(INDEX_SUFFIX): p.read_bytes() for p in folder.glob(f"*{INDEX_SUFFIX}")
    }
    assert found == expected
    assert main(["index", str(folder / "part-000.tar"), "--overwrite", "--json", "--quiet"]) == 0
    assert report_of(capsys)["rebuilt"] == 1


def test_a_missing_or_broken_shard_is_reported_and_the_others_indexed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "shards"
    paths = write_shards(folder, index=False, count=2)
    missing = str(folder / "part-009.tar")
    assert main(["index", str(paths[0]), missing, "--quiet"]) == EXIT_CODES["not_found"]
    out, err = capsys.readouterr()
    assert "2 shards: 1 indexed" in out
    assert "part-009.tar" in err and "1 of 2 shards could not be indexed" in err
    assert Path(f"{paths[0]}{INDEX_SUFFIX}").exists()
    broken = folder / "broken.tar"
    broken.write_bytes(b"this is not a tar archive" * 40)
    assert main(["index", str(broken), str(paths[1]), "--quiet"]) == EXIT_CODES["failed"]
    assert "broken.tar" in capsys.readouterr().err
    assert Path(f"{paths[1]}{INDEX_SUFFIX}").exists()
    assert not Path(f"{broken}{INDEX_SUFFIX}").exists()
    assert main(["index", str(folder / "x.tar.gz")]) == EXIT_CODES["usage"]
    assert "compressed shard" in capsys.readouterr().err
    assert main(["index", str(paths[0]), "--concurrency", "0"]) == EXIT_CODES["usage"]
    assert main(["index", str(tmp_path / "empty") + "/"]) == EXIT_CODES["not_found"]
    assert main(["index", str(paths[0]), "--endpoint", "http://x"]) == EXIT_CODES["usage"]
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_an_interrupted_run_leaves_whole_index_files_and_the_next_one_finishes(
    tmp_path: Path,
    s3_prefix: str,
    s3_storage_options: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    count = 240
    put_files(s3_prefix, s3_storage_options, write_shards(tmp_path, index=False, count=count))
    flags = s3_arguments(s3_storage_options, monkeypatch)
    command = [sys.executable, "-m", "aioload", "index", s3_prefix + "/", *flags]
    process = subprocess.Popen(
        [*command, "--concurrency", "1", "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        deadline = time.monotonic() + 60
        while len(stored_indexes(s3_prefix, s3_storage_options)) < 10:
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=30)
    finally:
        process.kill()
        process.wait()
    assert process.returncode == EXIT_CODES["interrupted"], err
    assert "Traceback" not in err
    written = stored_indexes(s3_prefix, s3_storage_options)
    assert 10 <= len(written) < count  # stopped part of the way
    for name, data in written.items():  # every file there is whole and valid
        assert len(ShardIndex.from_json(data, name)) == PER_SHARD
    assert main(["index", s3_prefix + "/", *flags, "--json", "--quiet"]) == 0
    report = report_of(capsys)
    assert report["kept"] == len(written) and report["written"] == count - len(written)
    assert len(stored_indexes(s3_prefix, s3_storage_options)) == count


# -- the dataset's warning ---------------------------------------------------------------


def test_a_dataset_warns_before_it_reads_a_shard_whole_naming_the_command(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    paths = write_shards(tmp_path / "shards", index=False)
    shard_size = min(path.stat().st_size for path in paths)
    with ObjectServer(tmp_path) as server:
        served: list[int] = []

        class AtTheWarning(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                served.append(server.stats()["bytes"])  # what the store had sent by then

        handler = AtTheWarning(logging.WARNING)
        logging.getLogger("aioload").addHandler(handler)
        pattern = f"{server.url}/shards/part-{{000..{SHARDS - 1:03d}}}.tar"
        try:
            with caplog.at_level(logging.WARNING, logger="aioload"):
                dataset = ShardDataset(pattern, rank=0, world_size=2)
                assert len(dataset) == SHARDS * PER_SHARD // 2
        finally:
            logging.getLogger("aioload").removeHandler(handler)
    assert served[0] < shard_size  # the first warning came before any shard was read whole
    first = caplog.records[0].getMessage()
    assert "has no index file" in first and "reading it whole" in first
    assert f"aioload index '{pattern}'" in first
    assert f"{SHARDS} of {SHARDS} shards have no index file" in caplog.text  # the summary
    assert len([r for r in caplog.records if "reading it whole" in r.getMessage()]) == 1


def test_the_command_named_is_a_pattern_a_folder_or_the_first_url() -> None:
    run = [f"s3://b/train-{n:04d}.tar" for n in range(8, 12)]
    assert brace_pattern(run) == "s3://b/train-{0008..0011}.tar"
    assert index_command(run) == "aioload index 's3://b/train-{0008..0011}.tar'"
    assert index_command(["s3://b/x/a.tar", "s3://b/x/c.tar"]) == "aioload index s3://b/x/"
    assert index_command(["s3://b/x/a.tar", "s3://c/y.tar"]) == "aioload index s3://b/x/a.tar ..."
    secret = ["http://user:pw@host/a-1.tar", "http://user:pw@host/a-2.tar"]
    assert "pw" not in index_command(secret)
    assert brace_pattern(["a-1.tar", "a-3.tar"]) is None
    assert brace_pattern(["a-9.tar", "a-10.tar"]) == "a-{9..10}.tar"
    assert brace_pattern(["a-09.tar", "a-10.tar"]) == "a-{09..10}.tar"
    assert brace_pattern(["x{1}.tar", "x{2}.tar"]) is None
