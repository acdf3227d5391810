"""aioload's DataLoader with worker processes next to torch's, in the same run.

Run by hand: ``python benchmarks/bench_workers.py [--quick] [--repeat 5]``.

Three measurements, each printed as a table of medians over ``--repeat`` repetitions (with the
fastest and slowest repetition, to show the noise), checked against the targets of the
worker-process backend, and gathered at the end in a markdown table for the README:

1. CPU-bound items, batch 16, 2 workers: (a) about 2 ms of numpy work per item (FFT round
   trips), (b) about 2 ms of pure-Python work holding the GIL, both calibrated at startup.
   Targets: aioload with 2 workers >= 1.0 x torch with 2 workers, and >= 1.8 x aioload with
   ``num_workers=0``.
2. 16 MiB batches of 1 MiB uint8 items, 2 workers, each library's default collate (torch's
   sends tensors through shared memory, its best case), next to a plain single-process loop
   of the same reads and ``np.stack`` (:func:`plain_loop`). GB/s; targets: >= 1.5 x torch,
   >= 1.2 x the plain loop. ``profile_big_batches.py`` breaks this case down stage by stage.
3. Latency-bound items: 64 KiB objects from an HTTP server on 127.0.0.1 that answers every
   request after 20 ms. aioload reads them with ``async def __getitem__`` and aiohttp, many
   at once per worker; torch with blocking ``http.client`` calls. Targets: >= 20 x torch with
   2 workers, >= 5 x torch with 16 workers.

Start-up (the first batch, memory, whole short epochs) is measured in ``bench_startup.py``, with
every case in a fresh interpreter.

Throughput is counted for a fixed time from the moment every worker has delivered a batch, so
that starting the workers is left out (``bench_startup.py`` is about that); every repetition starts
fresh workers. Within a measurement the cases run in turn, repetition by repetition, so that
drift on a busy machine hits them alike; every case runs once, shorter and untimed, first.
torch and aiohttp are optional (``pip install torch aiohttp``): without them their rows are
skipped. A loader that raises ``NotImplementedError`` is reported as "not available".
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import importlib
import importlib.metadata
import math
import multiprocessing
import multiprocessing.connection
import os
import platform
import signal
import sys
import time
import warnings
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import uvloop
from common import Rates, optional

from aioload import DataLoader
from aioload.backends.processes.worker import keep_freed_memory

# aiohttp is imported here, as a user's script would, so that aioload's fork server preloads it
# with this module and the workers forked from it do not import it each. Without it,
# measurement 3 has no aioload rows. torch, in contrast, is imported in main(): the worker
# processes import this module too, to unpickle the datasets, and need no torch.
aiohttp = optional("aiohttp")

BATCH = 16
WORKERS = 2
ENDLESS = 1 << 30  # items in the throughput datasets: runs stop on time, never at the end
ITEM_COST = 0.002  # seconds of CPU work per item in measurement 1
FEATURES = 64  # float32 values per item in measurement 1
SIGNAL = 1024  # samples of the signal the numpy work transforms
BIG_ITEM = 1 << 20  # bytes per item in measurement 2
PLAIN = "plain loop, 1 process (no loader)"  # measurement 2's single-process bar
PLAIN_TUNED = "plain loop, allocator tuned"
PLAIN_PAIR = "ceiling: 2 tuned plain loops at once"
PAGE = 4096
DELAY = 0.02  # seconds the object server waits before every answer
OBJECT_SIZE = 64 << 10
# Item fetches in flight per aioload worker in measurement 3: 256 with 2 workers; 64 with 16,
# 1024 in all, which already asks for 50k objects/s, far more than 2 cores can serve.
HTTP_CONCURRENCY = {2: 256, 16: 64}
WORKER_TIMEOUT = 60.0  # seconds; a stuck worker fails the run instead of hanging it

Sample = tuple[np.ndarray, int]


# -- datasets (module level: aioload's forkserver workers unpickle them) ----


def numpy_work(rounds: int, seed: int) -> np.ndarray:
    """``rounds`` FFT round trips on a signal of ``SIGNAL`` samples; the first values."""
    wave = np.linspace(0.0, 1.0, SIGNAL) + seed
    for _ in range(rounds):
        # The conjugate reverses the wave in time: the values stay bounded however many rounds.
        wave = np.fft.irfft(np.fft.rfft(wave).conj(), n=SIGNAL)
    return wave[:FEATURES].astype(np.float32)


def python_work(loops: int, seed: int) -> int:
    """A pure-Python loop of ``loops`` steps: holds the GIL all along."""
    acc = seed
    for step in range(loops):
        acc = (acc * 1103515245 + step) & 0x7FFFFFFF
    return acc


class NumpyItems:
    """Item ``i`` is ``(numpy_work(rounds, i), i)``: about 2 ms of numpy work."""

    def __init__(self, rounds: int) -> None:
        self.rounds = rounds

    def __len__(self) -> int:
        return ENDLESS

    def __getitem__(self, i: int) -> Sample:
        return numpy_work(self.rounds, i), i


class PythonItems:
    """Item ``i`` is ``(float32[64] from python_work(loops, i), i)``: about 2 ms under the GIL."""

    def __init__(self, loops: int) -> None:
        self.loops = loops

    def __len__(self) -> int:
        return ENDLESS

    def __getitem__(self, i: int) -> Sample:
        return np.full(FEATURES, python_work(self.loops, i), np.float32), i


class BigItems:
    """Item ``i`` is 1 MiB of the byte ``i % 251``: cheap to make, costly to move."""

    def __len__(self) -> int:
        return ENDLESS

    def __getitem__(self, i: int) -> np.ndarray:
        return np.full(BIG_ITEM, i % 251, np.uint8)


def object_array(body: bytes, i: int) -> np.ndarray:
    """The object's bytes as a writable uint8 array (torch warns on read-only ones)."""
    if len(body) != OBJECT_SIZE:
        raise RuntimeError(f"object {i}: {len(body)} bytes, expected {OBJECT_SIZE}")
    return np.frombuffer(bytearray(body), np.uint8)


_connections: dict[int, http.client.HTTPConnection] = {}


class BlockingObjects:
    """Object ``i`` read with a blocking ``http.client`` call, one keep-alive connection per
    process (torch's way: one item at a time per worker).

    The object of item ``i`` is at ``prefix + name(i)`` (``name``: module level, so that
    the dataset pickles).
    """

    def __init__(self, port: int, prefix: str = "/obj/", name: Callable[[int], str] = str) -> None:
        self.port = port
        self.prefix = prefix
        self.name = name

    def __len__(self) -> int:
        return ENDLESS

    def __getitem__(self, i: int) -> np.ndarray:
        # Keyed by process: a forked worker must not share its parent's socket.
        connection = _connections.get(os.getpid())
        if connection is None:
            connection = http.client.HTTPConnection("127.0.0.1", self.port)
            _connections[os.getpid()] = connection
        connection.request("GET", self.prefix + self.name(i))
        response = connection.getresponse()
        body = response.read()
        if response.status != 200:
            raise RuntimeError(f"object {i}: HTTP {response.status}")
        return object_array(body, i)


# One aiohttp session per event loop, made on first use. It lives in a module global, not on
# the dataset, so that a worker process exits without finalizing (and warning about) it.
_sessions: dict[asyncio.AbstractEventLoop, Any] = {}


def http_session() -> Any:
    """The running loop's aiohttp ``ClientSession`` (no connection limit)."""
    loop = asyncio.get_running_loop()
    session = _sessions.get(loop)
    if session is None:
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        _sessions[loop] = session
    return session


async def close_http_session() -> None:
    """Closes the running loop's session, if it has one."""
    session = _sessions.pop(asyncio.get_running_loop(), None)
    if session is not None:
        await session.close()


class AsyncObjects:
    """Object ``i`` read with aiohttp in an ``async def __getitem__``: many at once per loop."""

    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}/obj/"

    def __len__(self) -> int:
        return ENDLESS

    async def __getitem__(self, i: int) -> np.ndarray:
        async with http_session().get(f"{self.url}{i}") as response:
            if response.status != 200:
                raise RuntimeError(f"object {i}: HTTP {response.status}")
            body = await response.read()
        return object_array(body, i)


# A minimal keep-alive HTTP/1.1 GET over asyncio streams, one pool of connections per event
# loop. aiohttp spends about 0.5 ms of CPU on each 64 KiB response here, three times what this
# client does, so with aiohttp two cores cap every loader near 2k objects/s, whatever its
# concurrency; this client shows what the loader itself sustains (obstore, the client of
# aioload.sources, is in the same range as this one). Both are measured.
_idle: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]] = {}


async def lean_get(port: int, path: str) -> bytes:
    """The body of ``GET path`` from 127.0.0.1:``port`` (status 200 expected)."""
    idle = _idle.setdefault(asyncio.get_running_loop(), [])
    reader, writer = idle.pop() if idle else await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    head = await reader.readuntil(b"\r\n\r\n")
    status = head.split(b" ", 2)[1]
    length = int(head.lower().split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
    body = await reader.readexactly(length)
    idle.append((reader, writer))
    if status != b"200":
        raise RuntimeError(f"{path}: HTTP {status.decode()}")
    return body


class LeanObjects:
    """Object ``i`` read with :func:`lean_get` in an ``async def __getitem__``."""

    def __init__(self, port: int) -> None:
        self.port = port

    def __len__(self) -> int:
        return ENDLESS

    async def __getitem__(self, i: int) -> np.ndarray:
        return object_array(await lean_get(self.port, f"/obj/{i}"), i)


# -- the object server (a separate process) --------------------------------


def serve_objects(port_out: multiprocessing.connection.Connection, parent: int) -> None:
    """Serves ``GET /obj/<i>`` on 127.0.0.1: ``OBJECT_SIZE`` bytes after ``DELAY`` seconds.

    The object starts with ``i`` as 8 little-endian bytes. Sends its port through
    ``port_out``; runs until terminated or until ``parent`` exits. Ctrl-C is left to the
    parent, which stops the server on its way out.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    uvloop.run(_serve_objects(port_out, parent))


async def _serve_objects(port_out: multiprocessing.connection.Connection, parent: int) -> None:
    head = (
        f"HTTP/1.1 200 OK\r\nContent-Length: {OBJECT_SIZE}\r\n"
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()
    not_found = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"
    tail = bytes(OBJECT_SIZE - 8)

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:  # keep-alive: requests one after the other on a connection
                request = await reader.readuntil(b"\r\n\r\n")
                target = request.split(b"\r\n", 1)[0].split(b" ")[1:2]
                key = target[0].removeprefix(b"/obj/") if target else b""
                await asyncio.sleep(DELAY)
                if key.isdigit():
                    writer.writelines([head, int(key).to_bytes(8, "little"), tail])
                else:
                    writer.write(not_found)
                await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass  # the client went away
        finally:
            writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0, backlog=4096)
    port_out.send(server.sockets[0].getsockname()[1])
    async with server:
        # A parent killed outright cannot terminate us: notice that it is gone.
        while os.getppid() == parent:
            await asyncio.sleep(0.5)


@contextmanager
def object_server() -> Iterator[int]:
    """Runs :func:`serve_objects` in a separate process; yields its port, stops it on exit."""
    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    server = context.Process(
        target=serve_objects, args=(send, os.getpid()), name="object-server", daemon=True
    )
    server.start()
    send.close()
    try:
        if not receive.poll(60):
            raise RuntimeError("the object server did not start within 60 s")
        port: int = receive.recv()
        yield port
    finally:
        receive.close()
        server.terminate()
        server.join(5)
        if server.is_alive():
            server.kill()
            server.join()


# -- timing --------------------------------------------------------------

# A case runs for about the given seconds and returns (units done, seconds taken).
Case = Callable[[float], tuple[int, float]]
# Reads a batch, checks it holds the items from the given key on, returns its item count.
Touch = Callable[[Any, int], int]


def close_iterator(iterator: Any) -> None:
    """Stops an epoch now: aioload's iterators have ``close()``; torch's stop when dropped."""
    close = getattr(iterator, "close", None)
    if close is not None:
        close()


class Tally:
    """Counts one timed run. The first ``skip`` batches (one per worker: by then every worker
    has started) are checked but not counted; the clock starts after them and the items of
    the batches that follow are counted until ``duration`` seconds have passed."""

    def __init__(self, touch: Touch, skip: int, duration: float) -> None:
        self.touch = touch
        self.skip = skip
        self.duration = duration
        self.items = 0  # every item seen so far: the key of the next one
        self.counted = 0
        self.start = 0.0
        self.elapsed = 0.0

    def add(self, batch: Any) -> bool:
        """Takes the next batch; True once the run has lasted long enough."""
        done = self.touch(batch, self.items)
        self.items += done
        if self.skip > 0:
            self.skip -= 1
            self.start = time.perf_counter()
            return False
        self.counted += done
        self.elapsed = time.perf_counter() - self.start
        return self.elapsed >= self.duration


def throughput(make_loader: Callable[[], Any], touch: Touch, skip: int, scale: int = 1) -> Case:
    """A case iterating a fresh loader with ``for`` (see :class:`Tally`); units are items
    times ``scale`` (bytes per item, for GB/s)."""

    def run(duration: float) -> tuple[int, float]:
        tally = Tally(touch, skip, duration)
        iterator = iter(make_loader())
        try:
            for batch in iterator:
                if tally.add(batch):
                    break
        finally:
            close_iterator(iterator)
            del iterator
        return tally.counted * scale, tally.elapsed

    return run


def async_throughput(make_loader: Callable[[], Any], touch: Touch) -> Case:
    """:func:`throughput` with ``async for`` on a uvloop loop of its own (0 workers)."""

    async def timed(duration: float) -> tuple[int, float]:
        tally = Tally(touch, 1, duration)
        iterator: AsyncIterator[Any] = aiter(make_loader())
        try:
            async for batch in iterator:
                if tally.add(batch):
                    break
        finally:
            await iterator.aclose()  # type: ignore[attr-defined]
            await close_http_session()
        return tally.counted, tally.elapsed

    def run(duration: float) -> tuple[int, float]:
        result: tuple[int, float] = uvloop.run(timed(duration))
        return result

    return run


@dataclass
class Measured:
    """The rates of a measurement's cases, and the cases that could not run, with why."""

    rates: dict[str, Rates]
    missing: dict[str, str]

    def median(self, case: str) -> float | None:
        return self.rates[case].median if case in self.rates else None


def measure(cases: dict[str, Case], repeat: int, duration: float) -> Measured:
    """Rates of every case: one shorter untimed run each, then ``repeat`` rounds in turn.

    A case whose first run raises ``NotImplementedError`` (a loader option that this version
    of aioload does not have) is left out and reported as missing.
    """
    missing: dict[str, str] = {}
    for name, run in cases.items():
        try:
            run(duration / 4)
        except NotImplementedError as error:
            missing[name] = str(error)
    rates = {name: Rates([]) for name in cases if name not in missing}
    for _ in range(repeat):
        for name, rate in rates.items():
            done, seconds = cases[name](duration)
            if seconds <= 0:
                raise RuntimeError(f"{name}: the loader ended before any batch was timed")
            rate.values.append(done / seconds)
    return Measured(rates, missing)


def print_table(
    measured: Measured,
    names: list[str],
    unit: str,
    scale: float = 1.0,
    fmt: str = ".0f",
    ratios: dict[str, dict[str, str]] | None = None,
) -> None:
    """One row per case in ``names``; ``ratios`` maps a column title to {case: reference}."""
    ratios = ratios or {}
    header = f"{'':<44} {unit:>9} {'(min..max)':>17}" + "".join(f" {t:>13}" for t in ratios)
    print(header)
    print("-" * len(header))
    for name in names:
        rate = measured.rates.get(name)
        if rate is None:
            if name in measured.missing:
                print(f"{name:<44} {'not available':>27}")
            continue
        row = f"{name:<44} {rate.median * scale:>9{fmt}} {rate.spread(scale, fmt):>17}"
        for column in ratios.values():
            reference = measured.median(column[name]) if name in column else None
            row += f" {rate.median / reference:>13.2f}" if reference else f" {'-':>13}"
        print(row)


@dataclass
class Check:
    """One aioload figure against a reference, with the bound its ratio should respect."""

    name: str
    unit: str
    value: float | None  # aioload's median; None: could not run
    reference: float | None  # None: no reference (torch not installed)
    against: str
    bound: float | None = None  # None: reported, not checked
    at_most: bool = False  # the ratio should stay <= bound (times), not >= bound
    fmt: str = ".0f"

    @property
    def ratio(self) -> float | None:
        if self.value is None or not self.reference:
            return None
        return self.value / self.reference

    @property
    def target(self) -> str:
        if self.bound is None:
            return "-"
        return f"{'<=' if self.at_most else '>='} {self.bound:g} x"

    @property
    def result(self) -> str:
        if self.value is None:
            return "not available"
        ratio = self.ratio
        if ratio is None:
            return "no reference"
        if self.bound is None:
            return "-"
        ok = ratio <= self.bound if self.at_most else ratio >= self.bound
        return "ok" if ok else "MISSED"

    def report(self) -> None:
        ratio = f"{self.ratio:.2f}" if self.ratio is not None else "-"
        print(f"target {self.name}: {self.target} {self.against}: {ratio} {self.result}")

    def row(self) -> str:
        def figure(value: float | None) -> str:
            return "n/a" if value is None else f"{value:{self.fmt}}"

        ratio = f"{self.ratio:.2f}" if self.ratio is not None else "-"
        return (
            f"| {self.name} | {self.unit} | {figure(self.value)} | "
            f"{figure(self.reference)} ({self.against}) | {ratio} | {self.target} | "
            f"{self.result} |"
        )


# -- loaders ---------------------------------------------------------------


def aioload_loader(dataset: Any, workers: int, **options: Any) -> DataLoader:
    options.setdefault("batch_size", BATCH)
    if workers > 0:
        options.setdefault("timeout", WORKER_TIMEOUT)
    return DataLoader(dataset, num_workers=workers, **options)


def torch_loader(torch_data: Any, dataset: Any, workers: int, **options: Any) -> Any:
    options.setdefault("batch_size", BATCH)
    # fork is torch's default on Linux up to Python 3.13; said explicitly so it stays so.
    if "fork" in multiprocessing.get_all_start_methods():
        options.setdefault("multiprocessing_context", "fork")
    return torch_data.DataLoader(dataset, num_workers=workers, **options)


def check_keys(found: Any, expected: np.ndarray) -> None:
    """Raises unless a batch holds the expected items: a fast loader must also be right."""
    found = np.asarray(found)
    if not np.array_equal(found, expected):
        raise RuntimeError(f"a batch holds {found[:4]}..., expected {expected[:4]}...")


def touch_labelled(batch: Any, first: int) -> int:
    _, labels = batch
    check_keys(labels, np.arange(first, first + len(labels)))
    return len(labels)


def touch_pages(batch: Any, first: int) -> int:
    """Reads one byte per page of every item (``np.asarray`` views torch tensors as well)."""
    data = np.asarray(batch)
    data[:, ::PAGE].sum()
    check_keys(data[:, 0], np.arange(first, first + len(data)) % 251)
    return len(data)


def touch_objects(batch: Any, first: int) -> int:
    """Reads one byte per page of every object and checks the key each one starts with."""
    data = np.asarray(batch)
    data[:, ::PAGE].sum()
    keys = np.ascontiguousarray(data[:, :8]).view("<u8").ravel()
    check_keys(keys, np.arange(first, first + len(data)))
    return len(data)


# -- 1: CPU-bound items ------------------------------------------------------


def calibrate(work: Callable[[int, int], object]) -> tuple[int, float]:
    """The ``units`` for which ``work(units, seed)`` takes about ``ITEM_COST`` seconds of CPU,
    and the CPU seconds it takes.

    CPU time, not wall time: on a busy machine the wall time of a call includes the time other
    processes had the core. The least of 5 calls, the one least disturbed by cache misses.
    """

    def cost(units: int) -> float:
        times = []
        for seed in range(5):
            start = time.thread_time()
            work(units, seed)
            times.append(time.thread_time() - start)
        return min(times)

    units = 1
    while (seconds := cost(units)) < ITEM_COST / 8:
        units *= 2
    # Scale to the target, then again from there: a single short timing is easily disturbed.
    for _ in range(3):
        units = max(1, round(units * ITEM_COST / seconds))
        seconds = cost(units)
        if abs(seconds / ITEM_COST - 1) < 0.05:
            break
    return units, seconds


def _read_for(dataset: Any, duration: float, counts: Any) -> None:
    start = time.perf_counter()
    done = 0
    while time.perf_counter() - start < duration:
        dataset[done]
        done += 1
    counts.put(done)


def bare_processes(dataset: Any, processes: int) -> Case:
    """The same items read in ``processes`` plain processes, no loader: what the cores allow."""

    def run(duration: float) -> tuple[int, float]:
        context = multiprocessing.get_context("fork")
        counts = context.SimpleQueue()
        workers = [
            context.Process(target=_read_for, args=(dataset, duration, counts))
            for _ in range(processes)
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        return sum(counts.get() for _ in workers), duration

    return run


def _plain_loop(duration: float, tuned: bool, out: multiprocessing.connection.Connection) -> None:
    if tuned:
        keep_freed_memory()
    dataset = BigItems()
    tally = Tally(touch_pages, 1, duration)
    key = 0
    while True:
        batch = np.stack([dataset[key + i] for i in range(BATCH)])
        key += BATCH
        if tally.add(batch):
            break
    out.send((tally.counted * BIG_ITEM, tally.elapsed))


def plain_loop(tuned: bool = False, processes: int = 1) -> Case:
    """Measurement 2's reads and stacking in a plain loop, no loader, in a fresh process.

    The bar a loader with workers should clear: the consumer does the same reads and
    ``np.stack`` itself and touches every batch as the loader's consumer does. Fresh
    (``spawn``), so its allocator starts as a script's does, whatever ran here before: glibc
    serves the 16 MiB stack from fresh pages or from its heap depending on what it freed
    earlier. ``tuned``: the allocator set as aioload's workers set theirs
    (:func:`~aioload.backends.processes.worker.keep_freed_memory`), the loop's best case.
    ``processes``: that many loops at once, their bytes summed: what the cores (and their
    shared memory bandwidth) allow at most, with nothing handed over.
    """

    def run(duration: float) -> tuple[int, float]:
        context = multiprocessing.get_context("spawn")
        pipes = [context.Pipe(duplex=False) for _ in range(processes)]
        loops = [
            context.Process(target=_plain_loop, args=(duration, tuned, sender))
            for _, sender in pipes
        ]
        for loop in loops:
            loop.start()
        results = []
        try:
            for receiver, sender in pipes:
                sender.close()
                results.append(receiver.recv())
        finally:
            for loop in loops:
                loop.join()
        return sum(done for done, _ in results), max(seconds for _, seconds in results)

    return run


def cpu_bound(torch_data: Any, repeat: int, duration: float, checks: list[Check]) -> None:
    """Measurement 1."""
    rounds, numpy_cost = calibrate(numpy_work)
    loops, python_cost = calibrate(python_work)
    kinds = {
        "a": (NumpyItems(rounds), f"numpy: {rounds} FFT round trips of {SIGNAL} samples"),
        "b": (PythonItems(loops), f"pure Python: a loop of {loops} steps holding the GIL"),
    }
    costs = {"a": numpy_cost, "b": python_cost}
    for kind, (dataset, work) in kinds.items():
        cases: dict[str, Case] = {}
        if torch_data is not None:
            cases["torch, 2 workers (fork)"] = throughput(
                partial(torch_loader, torch_data, dataset, WORKERS), touch_labelled, WORKERS
            )
        cases["aioload, 0 workers"] = throughput(
            partial(aioload_loader, dataset, 0), touch_labelled, 1
        )
        cases["aioload, 2 workers"] = throughput(
            partial(aioload_loader, dataset, WORKERS), touch_labelled, WORKERS
        )
        # What two cores give two CPU-bound processes here, loader or not.
        cases["1 bare process (no loader)"] = bare_processes(dataset, 1)
        cases["2 bare processes (no loader)"] = bare_processes(dataset, WORKERS)
        measured = measure(cases, repeat, duration)

        print(f"\n1{kind}. CPU-bound items, {work} ({costs[kind] * 1e3:.2f} ms per item),")
        print(f"    batch {BATCH}, default collate_fn, `for`, {duration:g} s per run")
        print_table(
            measured,
            list(cases),
            "items/s",
            ratios={
                "x torch 2w": {"aioload, 2 workers": "torch, 2 workers (fork)"},
                "x aioload 0w": {"aioload, 2 workers": "aioload, 0 workers"},
                "x 1 process": {"2 bare processes (no loader)": "1 bare process (no loader)"},
            },
        )
        mine = measured.median("aioload, 2 workers")
        name = f"1{kind}. {'numpy' if kind == 'a' else 'pure Python'} ~2 ms/item, 2 workers"
        for check in (
            Check(
                name,
                "items/s",
                mine,
                measured.median("torch, 2 workers (fork)"),
                "torch, 2 workers",
                1.0,
            ),
            Check(
                name,
                "items/s",
                mine,
                measured.median("aioload, 0 workers"),
                "aioload, 0 workers",
                1.8,
            ),
        ):
            check.report()
            checks.append(check)
        report_missing(measured)


def report_missing(measured: Measured) -> None:
    """One line per reason some cases could not run (the same reason is usually shared)."""
    reasons: dict[str, list[str]] = {}
    for name, why in measured.missing.items():
        reasons.setdefault(why.splitlines()[0], []).append(name)
    for why, names in reasons.items():
        print(f"not available ({why}): {'; '.join(names)}")


# -- 2: big batches ------------------------------------------------------------


def big_batches(torch_data: Any, repeat: int, duration: float, checks: list[Check]) -> None:
    """Measurement 2."""
    dataset = BigItems()
    cases: dict[str, Case] = {}
    if torch_data is not None:
        cases["torch, 2 workers (fork)"] = throughput(
            lambda: torch_loader(torch_data, dataset, WORKERS), touch_pages, WORKERS, BIG_ITEM
        )
    cases["aioload, 0 workers"] = throughput(
        lambda: aioload_loader(dataset, 0), touch_pages, 1, BIG_ITEM
    )
    cases["aioload, 2 workers"] = throughput(
        lambda: aioload_loader(dataset, WORKERS), touch_pages, WORKERS, BIG_ITEM
    )
    cases[PLAIN] = plain_loop()
    cases[PLAIN_TUNED] = plain_loop(tuned=True)
    cases[PLAIN_PAIR] = plain_loop(tuned=True, processes=WORKERS)
    measured = measure(cases, repeat, duration)

    print(f"\n2. Big batches: {BATCH} items of {BIG_ITEM >> 20} MiB (np.full), default collate_fn")
    print(
        f"   (torch: tensors in shared memory), `for`, the consumer reads a byte per page,"
        f" {duration:g} s per run"
    )
    print_table(
        measured,
        list(cases),
        "GB/s",
        1e-9,
        ".2f",
        ratios={
            "x torch 2w": {
                "aioload, 0 workers": "torch, 2 workers (fork)",
                "aioload, 2 workers": "torch, 2 workers (fork)",
            },
            "x plain loop": {
                "aioload, 0 workers": PLAIN,
                "aioload, 2 workers": PLAIN,
                PLAIN_TUNED: PLAIN,
            },
            "x tuned loop": {"aioload, 2 workers": PLAIN_TUNED, PLAIN_PAIR: PLAIN_TUNED},
        },
    )
    check = Check(
        f"2. {BIG_ITEM * BATCH >> 20} MiB batches, 2 workers",
        "GB/s",
        scaled(measured.median("aioload, 2 workers"), 1e-9),
        scaled(measured.median("torch, 2 workers (fork)"), 1e-9),
        "torch, 2 workers",
        1.5,
        fmt=".2f",
    )
    check.report()
    checks.append(check)
    versus_plain = Check(
        f"2. {BIG_ITEM * BATCH >> 20} MiB batches, 2 workers",
        "GB/s",
        scaled(measured.median("aioload, 2 workers"), 1e-9),
        scaled(measured.median(PLAIN), 1e-9),
        "plain loop, 1 process",
        1.2,
        fmt=".2f",
    )
    versus_plain.report()
    checks.append(versus_plain)
    report_missing(measured)


def scaled(value: float | None, scale: float) -> float | None:
    return None if value is None else value * scale


# -- 3: latency-bound items over HTTP ------------------------------------------


def latency_bound(torch_data: Any, repeat: int, duration: float, checks: list[Check]) -> None:
    """Measurement 3."""
    has_aiohttp = aiohttp is not None
    with object_server() as port:
        blocking, lean = BlockingObjects(port), LeanObjects(port)
        nonblocking = AsyncObjects(port)
        cases: dict[str, Case] = {}
        for workers, concurrency in HTTP_CONCURRENCY.items():
            prefetch = 2 * math.ceil(concurrency / BATCH)  # batches: twice what concurrency needs
            if torch_data is not None:
                cases[f"torch, {workers} workers"] = throughput(
                    partial(torch_loader, torch_data, blocking, workers), touch_objects, workers
                )
            clients = {"": lean, ", aiohttp": nonblocking} if has_aiohttp else {"": lean}
            for client, dataset in clients.items():
                name = f"aioload{client}, {workers} workers, concurrency {concurrency}"
                cases[name] = throughput(
                    partial(
                        aioload_loader,
                        dataset,
                        workers,
                        concurrency=concurrency,
                        prefetch_factor=prefetch,
                    ),
                    touch_objects,
                    workers,
                )
        cases["aioload, 0 workers (async for), concurrency 256"] = async_throughput(
            lambda: aioload_loader(lean, 0, concurrency=256), touch_objects
        )
        measured = measure(cases, repeat, duration)

    print(
        f"\n3. Latency-bound items: {OBJECT_SIZE >> 10} KiB objects over HTTP on 127.0.0.1,"
        f" {DELAY * 1e3:.0f} ms per request,"
    )
    print(
        f"   batch {BATCH}; torch: blocking http.client; aioload: an async __getitem__ with a"
        " lean asyncio HTTP client (lean_get), and with aiohttp,"
    )
    print(f"   prefetch_factor 2*ceil(concurrency/{BATCH}), {duration:g} s per run")
    if not has_aiohttp:
        print("   (aiohttp is not installed: no aiohttp rows)")
    versus = {
        f"aioload{client}, {w} workers, concurrency {c}": f"torch, {w} workers"
        for w, c in HTTP_CONCURRENCY.items()
        for client in ("", ", aiohttp")
    }
    versus["aioload, 0 workers (async for), concurrency 256"] = f"torch, {WORKERS} workers"
    print_table(measured, list(cases), "items/s", ratios={"x torch": versus})
    for workers, concurrency in HTTP_CONCURRENCY.items():
        mine = measured.median(f"aioload, {workers} workers, concurrency {concurrency}")
        check = Check(
            f"3. HTTP {DELAY * 1e3:.0f} ms, {workers} workers, concurrency {concurrency}/worker",
            "items/s",
            mine,
            measured.median(f"torch, {workers} workers"),
            f"torch, {workers} workers",
            20.0 if workers == 2 else 5.0,
        )
        check.report()
        checks.append(check)
        if has_aiohttp:
            checks.append(
                Check(
                    f"3. HTTP {DELAY * 1e3:.0f} ms, {workers} workers, aiohttp",
                    "items/s",
                    measured.median(
                        f"aioload, aiohttp, {workers} workers, concurrency {concurrency}"
                    ),
                    measured.median(f"torch, {workers} workers"),
                    f"torch, {workers} workers",
                )
            )
    checks.append(
        Check(
            f"3. HTTP {DELAY * 1e3:.0f} ms, 0 workers (async for), concurrency 256",
            "items/s",
            measured.median("aioload, 0 workers (async for), concurrency 256"),
            measured.median(f"torch, {WORKERS} workers"),
            f"torch, {WORKERS} workers",
        )
    )
    report_missing(measured)


# -- main --------------------------------------------------------------------


def version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short runs: a smoke run")
    parser.add_argument("--repeat", type=int, default=None, help="repetitions (default 5)")
    parser.add_argument(
        "--only",
        choices=["cpu", "big", "http"],
        action="append",
        help="run only these measurements (repeatable; default: all)",
    )
    args = parser.parse_args()
    only = set(args.only or ["cpu", "big", "http"])
    repeat = args.repeat or (1 if args.quick else 5)
    # Seconds per timed run: CPU-bound and big batches, then the HTTP case (slower batches).
    cpu_duration, http_duration = (0.3, 0.6) if args.quick else (0.8, 1.2)

    torch_data = optional("torch.utils.data")
    # torch finds 16 workers too many for a small machine; measurement 3 wants them anyway.
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    print(
        f"Python {platform.python_version()}, numpy {np.__version__}, uvloop "
        f"{version('uvloop')}, torch {version('torch')}, aiohttp {version('aiohttp')}; "
        f"{os.cpu_count()} CPUs, load average {load}"
    )
    print(f"medians of {repeat} repetitions{' (--quick: smoke run, not figures)' * args.quick}")
    sys.stdout.flush()
    checks: list[Check] = []
    if "cpu" in only:
        cpu_bound(torch_data, repeat, cpu_duration, checks)
        sys.stdout.flush()
    if "big" in only:
        big_batches(torch_data, repeat, cpu_duration, checks)
        sys.stdout.flush()
    if "http" in only:
        latency_bound(torch_data, repeat, http_duration, checks)
        sys.stdout.flush()

    print("\nSummary (medians; ratio = aioload / reference):\n")
    print("| measurement | unit | aioload | reference | ratio | target | result |")
    print("|---|---|---:|---:|---:|---|---|")
    for check in checks:
        print(check.row())


if __name__ == "__main__":
    main()
