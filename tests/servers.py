"""Test servers for aioload.sources, as pytest fixtures (a plugin loaded by conftest.py).

- ``seaweedfs``: a real S3-compatible server (SeaweedFS's ``weed mini``) on
  127.0.0.1, started once per session with free ports, a temporary data folder
  and static credentials, and stopped at the end. If it cannot start, every test
  that uses it fails with the reason: object-store tests never skip silently.
- ``s3_storage_options``: endpoint, credentials and region for ``open_store``.
- ``s3_prefix``: a fresh ``s3://bucket/<name>`` URL per test, so tests share the
  server without seeing each other's objects.
- ``object_folder``, ``object_server``, ``flaky_server``: an ObjectServer over a
  folder of small objects, plain (2 ms of latency) and with 10% of 503 answers.
- ``metadata_service``: a stand-in for a cloud VM's instance-metadata service, handing
  out the S3 server's keys, in an environment without other credentials.

Everything listens on 127.0.0.1 only; nothing else is contacted.
"""

from __future__ import annotations

import datetime
import json
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
def s3_storage_options(seaweedfs: Any) -> dict[str, Any]:
    options: dict[str, Any] = seaweedfs.storage_options
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


class MetadataService:
    """A stand-in for a cloud VM's instance-metadata service (IMDSv2), on 127.0.0.1.

    It hands out ``keys`` (access key id, secret; no session token) as the VM role
    ``"role"``'s credentials, the way EC2's service does, and records every request in
    ``requests``. obstore finds it through ``AWS_METADATA_ENDPOINT`` and botocore through
    ``AWS_EC2_METADATA_SERVICE_ENDPOINT`` (:meth:`environment`), so a test that would ask
    the link-local address asks this server instead.
    """

    def __init__(self) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        service = self
        self.keys = ("", "")
        self.requests: list[tuple[str, str]] = []

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self, body: str) -> None:
                data = body.encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_PUT(self) -> None:  # the IMDSv2 session token
                service.requests.append(("PUT", self.path))
                self._answer("metadata-token")

            def do_GET(self) -> None:
                service.requests.append(("GET", self.path))
                if self.path.endswith("/security-credentials/"):
                    self._answer("role")
                    return
                expires = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=6)
                self._answer(
                    json.dumps(
                        {
                            "Code": "Success",
                            "LastUpdated": expires.strftime("%Y-%m-%dT%H:%M:%SZ"),
                            "Type": "AWS-HMAC",
                            "AccessKeyId": service.keys[0],
                            "SecretAccessKey": service.keys[1],
                            "Token": "",
                            "Expiration": expires.strftime("%Y-%m-%dT%H:%M:%SZ"),
                        }
                    )
                )

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def environment(self) -> dict[str, str]:
        """The variables that point obstore and botocore at this server."""
        return {"AWS_METADATA_ENDPOINT": self.url, "AWS_EC2_METADATA_SERVICE_ENDPOINT": self.url}

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)


@pytest.fixture
def metadata_service(
    no_cloud_env: None, monkeypatch: pytest.MonkeyPatch, s3_storage_options: dict[str, Any]
) -> Iterator[MetadataService]:
    """A :class:`MetadataService` handing out the S3 server's keys, in a cloud-free
    environment that points obstore and botocore at it (no other credentials)."""
    service = MetadataService()
    service.keys = (s3_storage_options["access_key_id"], s3_storage_options["secret_access_key"])
    for name, value in service.environment().items():
        monkeypatch.setenv(name, value)
    try:
        yield service
    finally:
        service.close()
