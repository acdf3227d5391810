"""Test servers for aioload.sources, as pytest fixtures (a plugin loaded by conftest.py).

- ``seaweedfs``: a real S3-compatible server (SeaweedFS's ``weed mini``) on
  127.0.0.1, started once per session with free ports, a temporary data folder
  and static credentials, and stopped at the end. If it cannot start, every test
  that uses it fails with the reason: object-store tests never skip silently.
- ``s3_store_options``: endpoint, credentials and region for ``open_store``.
- ``s3_prefix``: a fresh ``s3://bucket/<name>`` URL per test, so tests share the
  server without seeing each other's objects.
- ``object_folder``, ``object_server``, ``flaky_server``: an ObjectServer over a
  folder of small objects, plain (2 ms of latency) and with 10% of 503 answers.

Everything listens on 127.0.0.1 only; nothing else is contacted.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

OBJECTS = 200  # objects in object_folder: objects/00000.bin ...
OBJECT_SIZE = 4096


def object_bytes(i: int) -> bytes:
    """The content of object ``i`` of ``object_folder``: its number, then a fill byte."""
    return i.to_bytes(4, "little") + bytes([i % 251]) * (OBJECT_SIZE - 4)


@pytest.fixture(scope="session")
def seaweedfs() -> Iterator[Any]:
    from aioload.testing import SeaweedFS

    with SeaweedFS(bucket="aioload-tests") as server:
        yield server


@pytest.fixture(scope="session")
def s3_store_options(seaweedfs: Any) -> dict[str, Any]:
    options: dict[str, Any] = seaweedfs.store_options
    return options


@pytest.fixture
def s3_prefix(seaweedfs: Any, request: pytest.FixtureRequest) -> str:
    name = re.sub(r"[^A-Za-z0-9_-]+", "-", request.node.name).strip("-")
    return f"{seaweedfs.url}/{name}"


@pytest.fixture(scope="session")
def object_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("objects")
    folder = root / "objects"
    folder.mkdir()
    for i in range(OBJECTS):
        (folder / f"{i:05d}.bin").write_bytes(object_bytes(i))
    return root


@pytest.fixture(scope="session")
def object_server(object_folder: Path) -> Iterator[Any]:
    from aioload.testing import ObjectServer

    with ObjectServer(object_folder, latency=0.002) as server:
        yield server


@pytest.fixture(scope="session")
def flaky_server(object_folder: Path) -> Iterator[Any]:
    from aioload.testing import ObjectServer

    with ObjectServer(object_folder, error_rate=0.1, seed=1) as server:
        yield server


@pytest.fixture
def no_cloud_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Removes cloud credentials and endpoints from the environment for one test."""
    for name in list(os.environ):
        if name.startswith(("AWS_", "GOOGLE_", "AZURE_")):
            monkeypatch.delenv(name)
