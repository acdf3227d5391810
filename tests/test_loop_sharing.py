"""One dataset instance read by several loaders at once, each on its own event loop.

Two sync loaders (each in its own thread, so each on its own background loop) and two
``async for`` loaders (each in a thread running its own loop) iterate one instance of every
source at the same time, over SeaweedFS (a real S3 server on 127.0.0.1), with
``num_workers=0``: each must get exactly what a loader alone gets. A cache, a shared read
or a lock made on one loop and awaited on another fails there ("attached to a different
loop"). The same run in a subprocess must then exit cleanly (exit code 0, no abort).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from shared_sources import (
    LOADERS,
    SOURCE_NAMES,
    make_source,
    read_alone,
    read_at_once,
    upload,
    write_sources,
)

SCRIPT = Path(__file__).with_name("shared_sources.py")


def test_a_row_group_being_read_on_one_loop_is_read_on_another_too() -> None:
    import pyarrow as pa

    from aioload.sources.parquet.row_group_cache import RowGroupCache

    release = threading.Event()
    reads: list[int] = []

    async def read(unit: int) -> pa.Table:
        reads.append(unit)
        await asyncio.to_thread(release.wait, 10)
        return pa.table({"unit": [unit]})

    cache = RowGroupCache(read, 1 << 20)
    results: dict[str, Any] = {}

    def on_its_own_loop(name: str) -> None:
        try:
            results[name] = asyncio.run(cache.get(3)).column("unit").to_pylist()
        except Exception as error:
            results[name] = repr(error)

    first = threading.Thread(target=on_its_own_loop, args=("first",))
    first.start()
    while not reads:  # the first loop's read is in flight
        threading.Event().wait(0.001)
    second = threading.Thread(target=on_its_own_loop, args=("second",))
    second.start()
    while len(reads) < 2 and second.is_alive():
        threading.Event().wait(0.001)
    release.set()
    first.join(10)
    second.join(10)
    assert results == {"first": [3], "second": [3]}
    assert len(cache) == 1  # kept once, for both loops


@pytest.fixture(scope="module")
def records_url(
    tmp_path_factory: pytest.TempPathFactory, seaweedfs: Any, s3_storage_options: dict[str, Any]
) -> str:
    folder = tmp_path_factory.mktemp("records")
    write_sources(folder)
    url = f"{seaweedfs.url}/loop-sharing"
    upload(folder, url, s3_storage_options)
    return url


@pytest.mark.parametrize("name", SOURCE_NAMES)
def test_four_loaders_on_four_loops_read_one_instance_at_once(
    name: str, records_url: str, s3_storage_options: dict[str, Any], tmp_path: Path
) -> None:
    source = make_source(name, records_url, s3_storage_options, tmp_path / "cache")
    alone = read_alone(source)
    assert sorted(alone) == source.expected
    results = read_at_once(source)
    assert results == {loader: alone for loader in LOADERS}


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_process_whose_sources_were_shared_exits_cleanly(
    records_url: str, s3_storage_options: dict[str, Any], tmp_path: Path
) -> None:
    settings = {"url": records_url, "options": s3_storage_options, "cache": str(tmp_path)}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), json.dumps(settings)],
        capture_output=True,
        text=True,
        timeout=220,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert list(report) == list(SOURCE_NAMES)
    for name, result in report.items():
        assert result == {
            "alone_ok": True,
            "same_as_alone": dict.fromkeys(LOADERS, True),
        }, name
