"""Clear errors from object stores, and retries that lose nothing."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from servers import OBJECTS

from aioload import DataLoader, RetryPolicy
from aioload.sources import ObjectDataset, ShardDataset, is_transient, open_store


def first_word(data: Any) -> np.ndarray:
    return np.frombuffer(bytes(data[:4]), np.uint32).copy()


KEYS = [f"{i:05d}.bin" for i in range(OBJECTS)]


def read_all(dataset: Any, workers: int = 0, **options: Any) -> list[int]:
    loader = DataLoader(dataset, batch_size=25, num_workers=workers, **options)
    return np.concatenate([batch.ravel() for batch in loader]).tolist()


@pytest.mark.parametrize("workers", [0, 2])
def test_missing_key_names_url_and_key(
    seaweedfs: Any, s3_storage_options: dict[str, Any], workers: int
) -> None:
    dataset = ObjectDataset(
        seaweedfs.url + "/nothing-here/", ["a.bin"], storage_options=s3_storage_options
    )
    with pytest.raises(FileNotFoundError, match=r"s3://aioload-tests/nothing-here/a\.bin"):
        list(DataLoader(dataset, num_workers=workers))


@pytest.mark.asyncio
async def test_missing_bucket_and_missing_shard(s3_storage_options: dict[str, Any]) -> None:
    with pytest.raises(FileNotFoundError, match=r"s3://no-such-bucket/x\.bin"):
        await ObjectDataset("s3://no-such-bucket/", storage_options=s3_storage_options)["x.bin"]
    shards = ShardDataset(
        "s3://aioload-tests/none/shard-{0..1}.tar", storage_options=s3_storage_options
    )
    with pytest.raises(FileNotFoundError, match=r"s3://aioload-tests/none/shard-0\.tar"):
        [s async for s in shards]


@pytest.mark.asyncio
async def test_denied_fails_at_once(seaweedfs: Any, s3_storage_options: dict[str, Any]) -> None:
    wrong = {**s3_storage_options, "secret_access_key": "not-the-secret"}
    dataset = ObjectDataset(seaweedfs.url + "/x/", storage_options=wrong)
    start = time.monotonic()
    with pytest.raises(PermissionError, match=r"s3://aioload-tests/x/a\.bin: access denied"):
        await dataset["a.bin"]
    with pytest.raises(PermissionError, match="s3://aioload-tests/x"):
        await dataset.listing().collect()
    assert time.monotonic() - start < 1.0  # not retried


@pytest.mark.asyncio
async def test_unreachable_endpoint() -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dataset = ObjectDataset(
        "s3://bucket/",
        storage_options={
            "endpoint": f"http://127.0.0.1:{port}",
            "skip_signature": True,
            "retry_config": {"max_retries": 1},
        },
    )
    with pytest.raises(ConnectionError, match=rf"s3://bucket/k\.bin: cannot reach.*{port}"):
        await dataset["k.bin"]


def test_bad_urls_and_options_fail_at_construction(no_cloud_env: None) -> None:
    with pytest.raises(ValueError, match="unsupported URL 'ftp://x/y'"):
        ObjectDataset("ftp://x/y")
    with pytest.raises(ValueError, match="names no bucket"):
        ObjectDataset("s3:///key", storage_options={"skip_signature": True})
    # No credentials: refused before any request (obstore would ask the cloud's
    # instance-metadata address).
    with pytest.raises(ValueError, match=r"no credentials.*\{'skip_signature': True\}"):
        ObjectDataset("s3://bucket/prefix/", storage_options={"endpoint": "http://127.0.0.1:9"})
    with pytest.raises(ValueError, match="no credentials"):
        ShardDataset("gs://bucket/a.tar")
    with pytest.raises(TypeError, match="not_an_option"):
        open_store("s3://bucket", storage_options={"skip_signature": True, "not_an_option": 1})
    with pytest.raises(TypeError, match="str"):
        ObjectDataset("memory:///", keys="abc")


def test_a_tenth_of_503_answers_loses_nothing(flaky_server: Any) -> None:
    dataset = ObjectDataset(flaky_server.url + "/objects", KEYS, decode=first_word)
    before = flaky_server.stats()
    for workers in (0, 2):
        assert read_all(dataset, workers) == list(range(OBJECTS))
    stats = flaky_server.stats()
    assert stats["errors"] - before["errors"] > OBJECTS // 10  # errors happened, were retried


@pytest.fixture
def misbehaving(flaky_server: Any) -> Iterator[Any]:
    """The flaky server, to be reconfigured by the test; back to 10% of 503 afterwards."""
    yield flaky_server
    flaky_server.configure(latency=0.0, error_rate=0.1, error_status=503)


def test_loader_retry_policy_on_top(misbehaving: Any) -> None:
    # 429 (SlowDown) is transient: obstore retries it by itself (5 times: at 30% of errors,
    # some one of the 200 objects fails all six tries in about one run in seven; at 10%, in
    # one run in five thousand)...
    misbehaving.configure(error_rate=0.1, error_status=429)
    retried = ObjectDataset(misbehaving.url + "/objects", KEYS, decode=first_word)
    assert read_all(retried) == list(range(OBJECTS))
    misbehaving.configure(error_rate=0.3)
    # ... and with obstore's retries off, the loader's RetryPolicy with is_transient does.
    dataset = ObjectDataset(
        misbehaving.url + "/objects",
        KEYS,
        decode=first_word,
        storage_options={"retry_config": {"max_retries": 0}},
    )
    with pytest.raises(ConnectionError, match=r"HTTP 429"):
        read_all(dataset)
    policy = RetryPolicy(attempts=20, backoff=0.0, retry_on=is_transient)
    assert read_all(dataset, retry=policy) == list(range(OBJECTS))


@pytest.mark.asyncio
async def test_4xx_is_not_retried(misbehaving: Any) -> None:
    misbehaving.configure(error_rate=1.0, error_status=403)
    dataset = ObjectDataset(misbehaving.url + "/objects", KEYS)
    before = misbehaving.stats()
    with pytest.raises(PermissionError, match=r"/objects/00003\.bin: access denied"):
        await dataset[3]
    after = misbehaving.stats()
    assert after["requests"] - before["requests"] == 1  # no retry
    assert not is_transient(PermissionError()) and is_transient(ConnectionResetError())


@pytest.mark.asyncio
async def test_a_slow_server_times_out(misbehaving: Any) -> None:
    misbehaving.configure(latency=0.5, error_rate=0.0)
    dataset = ObjectDataset(
        misbehaving.url + "/objects",
        KEYS,
        storage_options={"client_options": {"timeout": "50ms"}, "retry_config": {"max_retries": 1}},
    )
    with pytest.raises(TimeoutError, match=r"/objects/00001\.bin: timed out"):
        await dataset[1]


def test_sources_need_obstore_but_aioload_does_not() -> None:
    code = (
        "import sys; sys.modules['obstore'] = None\n"
        "import aioload\n"
        "try:\n"
        "    import aioload.sources\n"
        "except ImportError as error:\n"
        "    print(error)\n"
    )
    root = str(Path(__file__).resolve().parent.parent)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=root, check=True
    )
    assert "pip install 'aioload-data[s3]'" in result.stdout
