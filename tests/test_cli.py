"""The command line: `aioload demo` and `aioload stream`: output, errors, exit codes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from marked import marked_processes
from servers import MetadataService

from aioload.cli import EXIT_CODES, main
from aioload.sources import ShardWriter
from aioload.testing import ObjectServer

pytestmark = pytest.mark.slow

QUICK_DEMO = ["--samples", "256", "--samples-per-shard", "16", "--latency-ms", "5", "--quiet"]


def _marked_processes(mark: str) -> list[int]:
    """The processes whose environment carries ``mark`` (a command and all it started)."""
    return marked_processes("AIOLOAD_TEST_MARK", mark)


def _command(args: list[str], tmp_path: Path) -> tuple[list[str], dict[str, str], str]:
    mark = uuid.uuid4().hex
    env = dict(os.environ, AIOLOAD_TEST_MARK=mark, TMPDIR=str(tmp_path))
    return [sys.executable, "-m", "aioload", *args], env, mark


@pytest.mark.timeout(120)
def test_demo_runs_from_the_command_line_and_leaves_nothing(tmp_path: Path) -> None:
    args, env, mark = _command(["demo", *QUICK_DEMO], tmp_path)
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=110)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "wrote 256 images" in out
    for reader in ("aioload", "serial"):
        assert any(line.startswith(reader) for line in out.splitlines()), out
    assert "vs serial" in out
    assert _marked_processes(mark) == []
    assert list(tmp_path.iterdir()) == []


@pytest.mark.timeout(120)
def test_demo_stops_cleanly_on_ctrl_c(tmp_path: Path) -> None:
    # Slow enough that the interrupt lands in the first aioload epoch (about 4 s here).
    slow = ["demo", "--samples", "2048", "--samples-per-shard", "8", "--latency-ms", "200"]
    args, env, mark = _command([*slow, "--no-torch"], tmp_path)
    process = subprocess.Popen(
        args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        assert "wrote" in process.stdout.readline()
        time.sleep(1.5)  # into the aioload run: server and workers up
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=30)
    finally:
        process.kill()
        process.wait()
    assert process.returncode == EXIT_CODES["interrupted"], err
    assert "Traceback" not in err
    deadline = time.monotonic() + 5
    while _marked_processes(mark) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _marked_processes(mark) == []
    assert list(tmp_path.iterdir()) == []


def test_demo_rejects_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--samples", "0"]) == EXIT_CODES["usage"]
    err = capsys.readouterr().err
    assert "--samples should be >= 1" in err
    assert "Traceback" not in err


@pytest.fixture(scope="module")
def shard_server(tmp_path_factory: pytest.TempPathFactory) -> object:
    folder = tmp_path_factory.mktemp("shards")
    with ShardWriter(str(folder / "part-%03d.tar"), maxcount=10) as writer:
        for i in range(40):
            writer.write({"__key__": f"{i:04d}", "npy": np.full(100, i, np.uint8), "cls": str(i)})
    raw = folder / "raw"
    raw.mkdir()
    for i in range(25):
        (raw / f"{i:03d}.bin").write_bytes(bytes(1000 + i))
    with ObjectServer(folder, latency=0.002) as server:
        yield server, folder


def test_stream_reads_tar_shards_over_http(
    shard_server: tuple[ObjectServer, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    server, _ = shard_server
    url = f"{server.url}/part-{{000..003}}.tar"
    assert main(["stream", url, "--batch-size", "8", "--json", "--quiet"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["samples"] == 40
    assert report["format"] == "tar"
    assert report["source"] == "4 tar shards"


def test_stream_reads_a_prefix_with_workers_and_a_limit(
    shard_server: tuple[ObjectServer, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    _, folder = shard_server
    url = (folder / "raw").as_uri() + "/"
    args = ["stream", url, "--workers", "2", "--batch-size", "4", "--limit", "10", "--quiet"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.startswith("read 10 objects")
    assert "read latency: p50" in out
    assert "--workers 2 --batch-size 4" in out


def test_stream_reports_every_object_of_a_prefix(
    shard_server: tuple[ObjectServer, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    _, folder = shard_server
    url = (folder / "raw").as_uri() + "/"
    assert main(["stream", url, "--json", "--quiet", "--concurrency", "4"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["samples"] == 25
    assert report["bytes"] == sum(1000 + i for i in range(25))
    assert report["concurrency"] == 4
    assert report["latency_p50_ms"] <= report["latency_p99_ms"]


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["ftp://host/x"], "usage", "unsupported URL"),
        (["s3://bucket/x", "--endpoint", "http://127.0.0.1:9"], "usage", "no credentials"),
        (["http://127.0.0.1:9/x", "--anonymous"], "usage", "--anonymous applies"),
        (["s3://b/x", "--batch-size", "0"], "usage", "--batch-size should be >= 1"),
    ],
)
def test_stream_explains_bad_arguments(
    args: list[str],
    code: str,
    message: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    assert main(["stream", *args]) == EXIT_CODES[code]
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_stream_explains_an_empty_prefix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["stream", tmp_path.as_uri() + "/", "--quiet"]) == EXIT_CODES["not_found"]
    assert "no objects found" in capsys.readouterr().err


def test_stream_explains_a_missing_shard(
    shard_server: tuple[ObjectServer, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    server, _ = shard_server
    url = f"{server.url}/missing.tar"
    assert main(["stream", url, "--quiet"]) == EXIT_CODES["not_found"]
    err = capsys.readouterr().err
    assert "missing.tar" in err
    assert "Traceback" not in err


@pytest.mark.timeout(60)
def test_stream_explains_an_unreachable_endpoint(
    capsys: pytest.CaptureFixture[str], unused_tcp_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint = f"http://127.0.0.1:{unused_tcp_port}"
    args = ["stream", "s3://bucket/prefix/", "--endpoint", endpoint, "--region", "us-east-1"]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    assert main([*args, "--quiet"]) == EXIT_CODES["unreachable"]
    assert main(args) == EXIT_CODES["unreachable"]
    err = capsys.readouterr().err
    assert "bucket" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("fmt", ["raw", "tar"])
def test_stream_reads_the_local_s3_server(
    fmt: str,
    seaweedfs: object,
    s3_storage_options: dict[str, object],
    s3_prefix: str,
    shard_server: tuple[ObjectServer, Path],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import obstore

    from aioload.sources import open_store

    _, folder = shard_server
    store, prefix = open_store(s3_prefix + "/", storage_options=s3_storage_options)
    files = (
        sorted(folder.glob("part-*.tar")) if fmt == "tar" else sorted((folder / "raw").iterdir())
    )
    for path in files:
        obstore.put(store, f"{prefix}{path.name}", path.read_bytes())
    # Credentials from the environment, as a user's shell would have them.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", str(s3_storage_options["access_key_id"]))
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", str(s3_storage_options["secret_access_key"]))
    endpoint = str(s3_storage_options["endpoint"])
    args = ["stream", s3_prefix + "/", "--format", fmt, "--endpoint", endpoint, "--json"]
    args += ["--region", str(s3_storage_options["region"]), "--quiet", "--workers", "2"]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["samples"] == (40 if fmt == "tar" else 25)
    if fmt == "tar":
        assert report["source"] == "4 tar shards"


def _raw_objects_at(s3_prefix: str, options: dict[str, object], folder: Path) -> list[str]:
    """The stream arguments for the raw objects of ``folder``, put under ``s3_prefix``."""
    import obstore

    from aioload.sources import open_store

    store, prefix = open_store(s3_prefix + "/", storage_options=options)
    for path in sorted((folder / "raw").iterdir()):
        obstore.put(store, f"{prefix}{path.name}", path.read_bytes())
    return [
        "stream",
        s3_prefix + "/",
        "--format",
        "raw",
        "--json",
        "--quiet",
        "--endpoint",
        str(options["endpoint"]),
    ]


def test_stream_takes_a_vm_role_only_with_metadata_credentials(
    metadata_service: MetadataService,
    s3_storage_options: dict[str, object],
    s3_prefix: str,
    shard_server: tuple[ObjectServer, Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    # No credentials in the environment: the VM's role (here, a stand-in for its
    # instance-metadata service on 127.0.0.1) is asked only when the flag allows it.
    args = _raw_objects_at(s3_prefix, s3_storage_options, shard_server[1])
    args += ["--region", str(s3_storage_options["region"])]
    assert main(args) == EXIT_CODES["usage"]
    err = capsys.readouterr().err
    assert "no credentials" in err and "--metadata-credentials on a cloud VM" in err
    assert metadata_service.requests == []
    assert main([*args, "--metadata-credentials"]) == EXIT_CODES["ok"]
    assert json.loads(capsys.readouterr().out)["samples"] == 25
    assert ("GET", "/latest/meta-data/iam/security-credentials/role") in metadata_service.requests
    assert main(["stream", "http://127.0.0.1:9/x/", "--metadata-credentials"]) == 2
    assert "--metadata-credentials applies to cloud URLs" in capsys.readouterr().err


def test_stream_reads_with_an_aws_profile(
    metadata_service: MetadataService,
    s3_storage_options: dict[str, object],
    s3_prefix: str,
    shard_server: tuple[ObjectServer, Path],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    pytest.importorskip("boto3")
    args = _raw_objects_at(s3_prefix, s3_storage_options, shard_server[1])
    (tmp_path / "config").write_text(
        f"[profile dev]\nregion = {s3_storage_options['region']}\n"
        f"aws_access_key_id = {s3_storage_options['access_key_id']}\n"
        f"aws_secret_access_key = {s3_storage_options['secret_access_key']}\n"
    )
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_PROFILE", "dev")
    assert main(args) == EXIT_CODES["ok"]  # the region too comes from the profile
    assert json.loads(capsys.readouterr().out)["samples"] == 25
    assert metadata_service.requests == []


def test_stream_names_boto3_for_an_aws_profile_without_it(
    metadata_service: MetadataService, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {**os.environ, "AWS_PROFILE": "dev"}
    code = (
        "import sys; sys.modules['boto3'] = None\n"
        "from aioload.cli import main\n"
        "sys.exit(main(['stream', 's3://bucket/x/', '--endpoint', 'http://127.0.0.1:9']))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert done.returncode == EXIT_CODES["usage"], done.stderr
    assert "AWS_PROFILE='dev'" in done.stderr
    assert "pip install 'aioload-data[aws]'" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert metadata_service.requests == []


SECRET = "s3cr3t-pa55"


def test_stream_hides_the_password_of_a_url(
    shard_server: tuple[ObjectServer, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    server, _ = shard_server
    base = server.url.replace("http://", f"http://reader:{SECRET}@")
    assert main(["stream", f"{base}/part-{{000..003}}.tar", "--json", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert SECRET not in out
    assert json.loads(out)["url"] == f"{base}/part-{{000..003}}.tar".replace(SECRET, "***")
    for first, args, code in (
        ([], [f"{base}/missing.tar"], "not_found"),
        (["--traceback"], [f"{base}/missing.tar"], "not_found"),
        ([], [f"file://reader:{SECRET}@localhost/data/"], "usage"),
    ):
        assert main([*first, "stream", *args, "--quiet"]) == EXIT_CODES[code]
        captured = capsys.readouterr()
        assert SECRET not in captured.err + captured.out
        assert "reader:***@" in captured.err


@pytest.mark.timeout(60)
def test_stream_hides_the_password_of_an_endpoint(
    capsys: pytest.CaptureFixture[str], unused_tcp_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint = f"http://key:{SECRET}@127.0.0.1:{unused_tcp_port}"
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    args = ["stream", "s3://bucket/prefix/", "--endpoint", endpoint, "--region", "us-east-1"]
    for first in ([], ["--traceback"]):
        assert main([*first, *args, "--quiet"]) == EXIT_CODES["unreachable"]
        captured = capsys.readouterr()
        assert SECRET not in captured.err + captured.out
        assert f"key:***@127.0.0.1:{unused_tcp_port}" in captured.err


# -- help, options and hints ------------------------------------------------------------


def _run_cli(args: list[str], prelude: str = "") -> subprocess.CompletedProcess[str]:
    """``aioload ARGS`` in a fresh process, after ``prelude`` (e.g. hiding a module)."""
    code = f"{prelude}\nimport sys\nfrom aioload.cli import main\nsys.exit(main({args!r}))\n"
    root = Path(__file__).resolve().parent.parent  # importable whether installed or not
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=root,
    )


@pytest.mark.timeout(60)
@pytest.mark.parametrize("command", ["demo", "stream"])
def test_command_help_is_plain_text(command: str) -> None:
    done = _run_cli([command, "--help"])
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for markup in (":class:", ":func:", "``", "**"):
        assert markup not in out, out
    assert "--traceback" in out
    if command == "demo":
        # the whole description, with its list of readers, not its first paragraph
        assert "ObjectServer on 127.0.0.1" in out
        assert "- torch (when torch is installed)" in out
        assert "every worker are gone when" in out


def test_top_level_help_lists_every_command_with_its_flags(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--latency-ms", "--no-torch", "--format", "--anonymous", "--endpoint"):
        assert flag in out
    assert "aioload demo [-h]" in out
    assert "aioload stream [-h]" in out
    assert "exit codes:" in out
    assert max(len(line) for line in out.splitlines()) <= 80


@pytest.mark.parametrize("where", ["before", "after"])
def test_traceback_works_before_and_after_the_command(
    where: str, shard_server: tuple[ObjectServer, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    server, _ = shard_server
    args = ["stream", f"{server.url}/missing.tar", "--quiet"]
    args = ["--traceback", *args] if where == "before" else [*args, "--traceback"]
    assert main(args) == EXIT_CODES["not_found"]
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err
    assert "aioload stream: error:" in err
    # and without it, no traceback either way
    assert main(["stream", f"{server.url}/missing.tar", "--quiet"]) == EXIT_CODES["not_found"]
    assert "Traceback" not in capsys.readouterr().err


def test_stream_detects_a_folder_of_tar_shards(
    shard_server: tuple[ObjectServer, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    _, folder = shard_server
    only_shards = folder.parent / "only-shards"
    only_shards.mkdir(exist_ok=True)
    for path in sorted(folder.glob("part-*.tar")):
        (only_shards / path.name).write_bytes(path.read_bytes())
    url = only_shards.as_uri() + "/"
    assert main(["stream", url, "--json", "--quiet"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["format"], report["samples"], report["source"]) == ("tar", 40, "4 tar shards")
    assert report["format_chosen"] == "auto, tar: every object under the prefix is a .tar shard"
    assert main(["stream", url, "--quiet"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("read 40 samples")
    assert "settings: --format tar" in out
    assert "format: auto, tar: every object under the prefix is a .tar shard" in out
    # --format raw still reads the shards as objects; a mixed folder is raw under auto
    assert main(["stream", url, "--json", "--quiet", "--format", "raw"]) == 0
    assert json.loads(capsys.readouterr().out)["samples"] == 4
    assert main(["stream", folder.as_uri() + "/", "--json", "--quiet"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["format"], report["format_chosen"]) == ("raw", "auto, raw")


@pytest.mark.parametrize(
    ("url", "names"),
    [
        ("s3://bucket/x/", ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"]),
        ("s3://bucket/train-{000..009}.tar", ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"]),
        ("gs://bucket/x/", ["GOOGLE_APPLICATION_CREDENTIALS"]),
    ],
)
def test_stream_explains_missing_credentials_in_terms_of_the_command_line(
    url: str,
    names: list[str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in list(os.environ):
        if name.startswith(("AWS_", "GOOGLE_")):
            monkeypatch.delenv(name)
    args = ["stream", url, "--endpoint", "http://127.0.0.1:9", "--quiet"]
    assert main(args) == EXIT_CODES["usage"]
    err = capsys.readouterr().err
    assert "no credentials" in err
    assert "--anonymous" in err
    for name in names:
        assert name in err
    # the Python options of aioload.sources mean nothing on a command line
    for option in ("skip_signature", "credential_provider", "metadata_credentials"):
        assert option not in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("args", "extra"),
    [(["stream", "s3://bucket/x/"], "s3"), (["demo", "--quiet"], "demo")],
)
def test_a_missing_extra_names_one_install_command(args: list[str], extra: str) -> None:
    done = _run_cli(args, prelude="import sys; sys.modules['obstore'] = None")
    assert done.returncode == EXIT_CODES["usage"], done.stderr
    err = done.stderr
    assert err.count("pip install") == 1, err
    assert f"pip install 'aioload-data[{extra}]'" in err
    assert len(err.strip().splitlines()) == 1
    assert "Traceback" not in err


def test_a_ctrl_c_during_the_demos_cleanup_still_removes_its_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A Ctrl-C can land while a scratch folder is being removed (the run just ended): the
    # removal is finished, and the interrupt still reaches the command.
    from aioload.cli import demo

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    remove = shutil.rmtree
    calls = []

    def interrupted(path: str, ignore_errors: bool = False) -> None:
        calls.append(path)
        if len(calls) == 1:
            os.remove(os.path.join(path, "a"))  # part of the folder is gone, then Ctrl-C
            raise KeyboardInterrupt
        remove(path, ignore_errors=ignore_errors)

    monkeypatch.setattr(shutil, "rmtree", interrupted)
    with pytest.raises(KeyboardInterrupt), demo.scratch_folder("aioload-demo-") as folder:
        for name in ("a", "b"):
            Path(folder, name).write_bytes(b"x")
    assert len(calls) == 2
    assert list(tmp_path.iterdir()) == []


def test_stream_tunes_its_concurrency_and_says_where_it_settled(
    shard_server: tuple[ObjectServer, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    _, folder = shard_server
    url = (folder / "raw").as_uri() + "/"
    assert main(["stream", url, "--json", "--quiet", "--concurrency", "auto"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["samples"] == 25
    assert report["concurrency"] == "auto"
    assert isinstance(report["concurrency_settled"], int)
    assert main(["stream", url, "--quiet", "--concurrency", "auto"]) == 0
    assert "--concurrency auto (settled on " in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["stream", url, "--concurrency", "many"])
