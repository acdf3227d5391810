"""ObjectServer: a small HTTP object server for tests, demos and benchmarks.

It serves the files under a folder by path (``GET``/``HEAD``, single byte
ranges with ``206``), and can inject a fixed latency before every answer and
answer a random share of requests with an error status (``503`` by default),
which is what latency and retry tests need. It can also delay a random share of
requests by much more (``tail=(0.01, 1.0)``: a heavy tail, for hedged reads), cap the
request rate (``rate_limit``: a token bucket; a request beyond it is answered ``503`` with a
``Retry-After``), as a throttling object store does, and change its latency on a schedule
(``latency_steps``), for self-tuning reads; it notes when each request arrived
(:meth:`ObjectServer.arrivals`, and :mod:`aioload.testing.arrivals` to count them), for
tests of a request budget.
obstore reads it as an ``http://`` store.

It runs in a child Python process with its own uvloop
loop, so that serving costs no CPU on the loader's loop or GIL, and the
process goes when the server is stopped, when the ``with`` block ends, or
when its parent dies.
"""

from __future__ import annotations

import array
import asyncio
import ctypes
import email.utils
import json
import math
import os
import random
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any
from urllib.parse import unquote

from aioload.checks import is_real

__all__ = [
    "LOOPBACK_OPENER",
    "RATE_BURST",
    "ObjectServer",
    "die_with_parent",
]

STATS_PATH = "/.aioload-stats"
CONTROL_PATH = "/.aioload-control"
ARRIVALS_PATH = "/.aioload-arrivals"
_START_TIMEOUT = 60.0
RATE_BURST = 0.05
"""Seconds of ``rate_limit`` requests the server's token bucket holds: its burst."""


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the child get SIGTERM when its parent dies (Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    set_death_signal = 1  # PR_SET_PDEATHSIG
    term = int(signal.SIGTERM)

    def preexec() -> None:
        prctl(set_death_signal, term)

    return preexec


# Requests to the server go straight to 127.0.0.1, whatever proxy the environment names
# (urllib's default opener would hand them to an HTTP_PROXY).
LOOPBACK_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class ObjectServer:
    """Serves the files under ``root_folder`` over HTTP on 127.0.0.1, in a child process.

    Args:
        root_folder: the folder whose files are served; ``GET /a/b.bin``
            answers the file ``root_folder/a/b.bin``. Files may be added while
            it runs.
        latency: seconds every request waits before it is answered.
        error_rate: the share of requests (0 to 1) answered with
            ``error_status`` instead, drawn from a generator seeded with ``seed``.
        seed: the seed of the error draws.
        error_status: the status of injected errors (503; 429, 500 ...).
        tail: ``(share, seconds)``: that share of requests (0 to 1) waits ``seconds``
            more before it is answered (a heavy tail), drawn from a generator of its own
            seeded with ``seed`` (the same requests are slow on every run with the same
            seed and order, and the error draws do not change with it).
        rate_limit: the most object requests answered per second (None: no cap);
            those beyond it are answered ``throttle_status`` with a ``Retry-After``
            header (whole seconds, as HTTP has it) and ``Retry-After-Ms``. A token
            bucket holding :data:`RATE_BURST` seconds' worth of requests.
        throttle_status: the status of a request beyond ``rate_limit`` (503 or 429).
        latency_steps: ``(seconds, latency)`` pairs: ``seconds`` after the server
            starts its latency becomes ``latency`` (see :meth:`schedule_latency`).

    Attributes:
        url: ``http://127.0.0.1:PORT`` once started.

    Example::

        with ObjectServer("data", latency=0.02, error_rate=0.1) as server:
            dataset = ObjectDataset(server.url + "/objects/", keys=keys)
            ...
            server.stats()   # {'requests': ..., 'errors': ..., 'bytes': ...}
            server.configure(error_rate=0.0)

        with ObjectServer("data", latency=0.005, tail=(0.01, 1.0)) as server:
            ...
            most_in_window(server.arrivals())   # the most requests in any 1 s

        with ObjectServer("data", rate_limit=2000, latency_steps=[(5.0, 0.08)]) as server:
            ...
            server.stats()["throttled"]   # requests answered 503 for the cap
    """

    def __init__(
        self,
        root_folder: str | os.PathLike[str],
        *,
        latency: float = 0.0,
        error_rate: float = 0.0,
        seed: int = 0,
        error_status: int = 503,
        tail: tuple[float, float] | None = None,
        rate_limit: float | None = None,
        throttle_status: int = 503,
        latency_steps: Sequence[tuple[float, float]] = (),
    ) -> None:
        root = os.fspath(root_folder)
        if not os.path.isdir(root):
            raise ValueError(f"root_folder should be an existing folder; got {root!r}")
        if not latency >= 0:
            raise ValueError(f"latency should be >= 0 seconds; got {latency!r}")
        if not 0.0 <= error_rate <= 1.0:
            raise ValueError(f"error_rate should be between 0 and 1; got {error_rate!r}")
        _check_status(error_status)
        self.tail = _check_tail(tail)
        self.root_folder = os.path.abspath(root)
        self.latency = float(latency)
        self.error_rate = float(error_rate)
        self.seed = seed
        self.error_status = error_status
        self.rate_limit = _check_rate_limit(rate_limit)
        _check_status(throttle_status)
        self.throttle_status = throttle_status
        self.latency_steps = _check_steps(latency_steps)
        self.port: int | None = None
        self._process: Any = None

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` (the server must be started)."""
        if self.port is None:
            raise RuntimeError("the ObjectServer is not running: use it in a with block")
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """The server process's id (None when not running)."""
        return None if self._process is None else int(self._process.pid)

    def start(self) -> ObjectServer:
        """Starts the server process and waits until it listens; returns self."""
        if self._process is not None:
            raise RuntimeError("the ObjectServer is already running")
        settings = {
            "root": self.root_folder,
            "latency": self.latency,
            "error_rate": self.error_rate,
            "seed": self.seed,
            "error_status": self.error_status,
            "tail": self.tail,
            "rate_limit": self.rate_limit,
            "throttle_status": self.throttle_status,
            "latency_steps": self.latency_steps,
            "parent": os.getpid(),
        }
        # A fresh interpreter running this file, not multiprocessing: no re-import of the
        # caller's main script, nothing inherited from a parent that runs threads, and no
        # import of aioload itself (this module needs only the standard library and aiohttp).
        process = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), json.dumps(settings)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            preexec_fn=die_with_parent(),
        )
        self._process = process
        assert process.stdout is not None
        try:
            ready, _, _ = select.select([process.stdout], [], [], _START_TIMEOUT)
            line = process.stdout.readline() if ready else b""
        except BaseException:
            self.stop()
            raise
        if not line.strip().isdigit():
            self.stop()
            reason = "timed out" if not ready else f"it said {line.decode(errors='replace')!r}"
            raise RuntimeError(f"the ObjectServer could not start ({reason})")
        self.port = int(line)
        return self

    def stop(self) -> None:
        """Stops the server process and waits for it to end."""
        process, self._process = self._process, None
        self.port = None
        if process is None:
            return
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()

    def stats(self) -> dict[str, int]:
        """What the server has answered so far.

        ``requests`` (object requests answered), ``errors`` (injected errors among
        them), ``throttled`` (those answered for ``rate_limit`` among
        them), ``bytes`` (body bytes sent) and ``most_in_flight`` (the most object
        requests it was answering at once, each counted from its arrival to its answer,
        latency included): how far a client's reads overlapped.
        """
        with LOOPBACK_OPENER.open(self.url + STATS_PATH, timeout=10) as answer:
            stats: dict[str, int] = json.loads(answer.read())
        return stats

    def arrivals(self) -> list[float]:
        """When each object request arrived, in seconds since the server started, in order.

        Example::

            most_in_window(server.arrivals())   # the most requests in any 1-second window
        """
        with LOOPBACK_OPENER.open(self.url + ARRIVALS_PATH, timeout=10) as answer:
            times: list[float] = json.loads(answer.read())
        return times

    def configure(
        self,
        *,
        latency: float | None = None,
        error_rate: float | None = None,
        error_status: int | None = None,
    ) -> None:
        """Changes the injected latency or errors of the running server (None: unchanged)."""
        changes: dict[str, Any] = {}
        if latency is not None:
            if not latency >= 0:
                raise ValueError(f"latency should be >= 0 seconds; got {latency!r}")
            changes["latency"] = self.latency = float(latency)
        if error_rate is not None:
            if not 0.0 <= error_rate <= 1.0:
                raise ValueError(f"error_rate should be between 0 and 1; got {error_rate!r}")
            changes["error_rate"] = self.error_rate = float(error_rate)
        if error_status is not None:
            _check_status(error_status)
            changes["error_status"] = self.error_status = error_status
        request = urllib.request.Request(
            self.url + CONTROL_PATH, data=json.dumps(changes).encode(), method="POST"
        )
        with LOOPBACK_OPENER.open(request, timeout=10) as answer:
            answer.read()

    def limit_rate(self, rate_limit: float | None) -> None:
        """Changes the running server's request-rate cap (None: no cap).

        Example::

            server.limit_rate(2000)   # requests/s; beyond: 503 + Retry-After
        """
        self.rate_limit = _check_rate_limit(rate_limit)
        self._control({"rate_limit": self.rate_limit})

    def schedule_latency(self, steps: Sequence[tuple[float, float]]) -> None:
        """Has the running server's latency change on a schedule, from now.

        Args:
            steps: ``(seconds, latency)`` pairs: ``seconds`` from now the latency
                becomes ``latency``; a new schedule replaces the one still pending.

        Example::

            server.schedule_latency([(2.0, 0.08)])   # 20 ms now, 80 ms from 2 s on
        """
        self.latency_steps = _check_steps(steps)
        self._control({"latency_steps": self.latency_steps})

    def _control(self, changes: dict[str, Any]) -> None:
        request = urllib.request.Request(
            self.url + CONTROL_PATH, data=json.dumps(changes).encode(), method="POST"
        )
        with LOOPBACK_OPENER.open(request, timeout=10) as answer:
            answer.read()

    def __enter__(self) -> ObjectServer:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        where = self.url if self.port is not None else "not running"
        return f"ObjectServer({self.root_folder!r}, {where})"


def _check_tail(tail: Any) -> tuple[float, float] | None:
    if tail is None:
        return None
    try:
        share, seconds = (float(value) for value in tail)
    except (TypeError, ValueError):
        raise ValueError(f"tail should be (share, seconds); got {tail!r}") from None
    if not 0.0 <= share <= 1.0 or not seconds >= 0:
        raise ValueError(f"tail should be (share 0 to 1, seconds >= 0); got {tail!r}")
    return share, seconds


def _check_rate_limit(rate_limit: Any) -> float | None:
    if rate_limit is None:
        return None
    if not is_real(rate_limit) or not float(rate_limit) > 0:
        raise ValueError(f"rate_limit should be a number of requests/s > 0; got {rate_limit!r}")
    return float(rate_limit)


def _check_steps(steps: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    checked = []
    for step in steps:
        at, latency = step
        if not at >= 0 or not latency >= 0:
            raise ValueError(f"a latency step should be (seconds >= 0, latency >= 0); got {step!r}")
        checked.append((float(at), float(latency)))
    return sorted(checked)


def _check_status(status: Any) -> None:
    if not isinstance(status, int) or not 400 <= status <= 599:
        raise ValueError(f"error_status should be an HTTP error status (4xx, 5xx); got {status!r}")


# -- the child process --------------------------------------------------------------


def _parse_range(header: str, size: int) -> tuple[int, int] | None:
    """``(start, end)`` (end exclusive) of a ``bytes=`` range; None when unsatisfiable."""
    unit, _, spec = header.partition("=")
    if unit.strip() != "bytes" or "," in spec:
        return None
    first, _, last = spec.strip().partition("-")
    if not first:  # a suffix: the last N bytes
        length = int(last)
        return (max(0, size - length), size) if length > 0 and size > 0 else None
    start = int(first)
    end = size if not last else min(size, int(last) + 1)
    return (start, end) if start < size and start < end else None


def _tail_delay(tail: Any, draws: random.Random) -> float:
    """The extra wait of one request: the tail's seconds for its share of them, else 0."""
    if not tail:
        return 0.0
    share, seconds = tail
    return float(seconds) if draws.random() < share else 0.0


class _TokenBucket:
    """The server's request-rate cap: ``settings["rate_limit"]`` tokens a second, a burst of
    :data:`RATE_BURST` seconds' worth; read from the settings at each request, so a change
    through the control path applies at once."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self._settings = settings
        self._tokens = 0.0
        self._at = time.monotonic()
        self._rate: float | None = None

    def take(self) -> float | None:
        """None: the request may be answered; else the seconds until a token is free."""
        rate: float | None = self._settings.get("rate_limit")
        now = time.monotonic()
        if not rate:
            self._rate = None
            return None
        burst = max(1.0, rate * RATE_BURST)
        if rate != self._rate:  # a new cap starts with a full bucket
            self._rate, self._tokens, self._at = rate, burst, now
        self._tokens = min(burst, self._tokens + (now - self._at) * rate)
        self._at = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return None
        return (1.0 - self._tokens) / rate


class _LatencySchedule:
    """``settings["latency_steps"]``, applied: from the start (or the last schedule's arrival),
    each step's latency replaces ``settings["latency"]`` once its time has come."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self._settings = settings
        self.restart()

    def restart(self) -> None:
        self._start = time.monotonic()
        self._pending = [tuple(step) for step in self._settings.get("latency_steps") or ()]

    def apply(self) -> None:
        pending = self._pending
        if not pending:
            return
        elapsed = time.monotonic() - self._start
        while pending and pending[0][0] <= elapsed:
            self._settings["latency"] = pending.pop(0)[1]


async def _main(
    settings: dict[str, Any],
) -> None:
    from aiohttp import web

    root = os.path.realpath(settings["root"])
    draws = random.Random(settings["seed"])
    slow_draws = random.Random(f"tail {settings['seed']}")  # apart: errors draw as before
    started = time.monotonic()
    arrived = array.array("d")  # seconds since the start of each object request
    counts = {"requests": 0, "errors": 0, "throttled": 0, "bytes": 0, "most_in_flight": 0}
    bucket = _TokenBucket(settings)
    steps = _LatencySchedule(settings)
    in_flight = 0
    # request path -> (file, mtime_ns, size, body, headers): a file is resolved, read and
    # described once, and only checked with one stat() per request after that.
    cache: dict[str, tuple[str, int, int, bytes, dict[str, str]]] = {}

    def read(request_path: str) -> tuple[bytes, dict[str, str]] | None:
        cached = cache.get(request_path)
        if cached is not None:
            path, mtime, size, body, headers = cached
            try:
                status = os.stat(path)
            except OSError:
                status = None
            if status is not None and (status.st_mtime_ns, status.st_size) == (mtime, size):
                return body, headers
        path = os.path.realpath(os.path.join(root, unquote(request_path).lstrip("/")))
        if not path.startswith(root + os.sep) or not os.path.isfile(path):
            return None
        try:
            status = os.stat(path)
            with open(path, "rb") as file:
                body = file.read()
        except OSError:
            return None
        headers = {
            "Last-Modified": email.utils.formatdate(status.st_mtime, usegmt=True),
            "ETag": f'"{status.st_mtime_ns:x}-{len(body):x}"',
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
        }
        cache[request_path] = (path, status.st_mtime_ns, len(body), body, headers)
        return body, headers

    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        nonlocal in_flight
        if request.path == STATS_PATH:
            return web.Response(text=json.dumps(counts), content_type="application/json")
        if request.path == ARRIVALS_PATH:
            return web.Response(text=json.dumps(arrived.tolist()), content_type="application/json")
        if request.path == CONTROL_PATH and request.method == "POST":
            changes = json.loads(await request.read())
            settings.update(changes)
            if "latency_steps" in changes:
                steps.restart()
            return web.Response(text="ok\n")
        in_flight += 1
        counts["most_in_flight"] = max(counts["most_in_flight"], in_flight)
        try:
            return await answer(request)
        finally:
            in_flight -= 1

    async def answer(request: web.BaseRequest) -> web.StreamResponse:
        counts["requests"] += 1
        arrived.append(time.monotonic() - started)
        wait = bucket.take()
        if wait is not None:  # beyond the cap: answered at once, as a throttling store does
            counts["throttled"] += 1
            headers = {
                "Retry-After": str(max(1, math.ceil(wait))),
                "Retry-After-Ms": str(max(1, math.ceil(wait * 1000))),
            }
            return web.Response(
                status=settings["throttle_status"], text="slow down\n", headers=headers
            )
        steps.apply()
        latency, error_rate = settings["latency"], settings["error_rate"]
        latency += _tail_delay(settings.get("tail"), slow_draws)
        if latency:
            await asyncio.sleep(latency)
        if error_rate and draws.random() < error_rate:
            counts["errors"] += 1
            return web.Response(status=settings["error_status"], text="injected error\n")
        if request.method not in ("GET", "HEAD"):
            return web.Response(status=405, headers={"Allow": "GET, HEAD"})
        found = read(request.path)
        if found is None:
            return web.Response(status=404, text="no such object\n")
        body, headers = found
        size = len(body)
        code = 200
        wanted = request.headers.get("Range")
        if wanted is not None:
            try:
                bounds = _parse_range(wanted, size)
            except ValueError:
                bounds = None
            if bounds is None:
                return web.Response(status=416, headers={"Content-Range": f"bytes */{size}"})
            start, end = bounds
            headers = {**headers, "Content-Range": f"bytes {start}-{end - 1}/{size}"}
            body, code = body[start:end], 206
        if request.method == "HEAD":
            headers = {**headers, "Content-Length": str(len(body))}
            return web.Response(status=code, headers=headers)
        counts["bytes"] += len(body)  # bodies answered: what a test of re-reads counts
        return web.Response(status=code, body=body, headers=headers)

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.setblocking(False)
    listener.listen(4096)
    server = web.Server(handle)
    runner = web.ServerRunner(server, handle_signals=False)
    await runner.setup()
    loop = asyncio.get_running_loop()
    connections: set[asyncio.Task[Any]] = set()

    def accept_all() -> None:
        # Every connection waiting, at each wake-up: uvloop's own accept, the loop busy,
        # left hundreds queued in the kernel for seconds (their requests starved).
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:  # none waiting (BlockingIOError), or the client gave up
                return
            connection.setblocking(False)
            task = loop.create_task(loop.connect_accepted_socket(server, connection))
            connections.add(task)
            task.add_done_callback(connections.discard)

    loop.add_reader(listener.fileno(), accept_all)
    sys.stdout.write(f"{listener.getsockname()[1]}\n")
    sys.stdout.flush()
    try:
        # A parent killed outright cannot stop us: notice that it is gone.
        while os.getppid() == settings["parent"]:
            await asyncio.sleep(0.5)
    finally:
        loop.remove_reader(listener.fileno())
        listener.close()
        await runner.cleanup()


def main() -> None:
    """The server process: serves until terminated or until its parent is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    settings = json.loads(sys.argv[1])
    try:
        import uvloop

        uvloop.run(_main(settings))
    except ImportError:  # pragma: no cover - uvloop is a dependency where it exists
        asyncio.run(_main(settings))


if __name__ == "__main__":
    # Run as a script: its folder heads sys.path, where its sibling modules would shadow
    # any top-level module of the same name.
    sys.path.pop(0)
    main()
