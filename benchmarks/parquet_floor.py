"""The least a loader does for a Parquet epoch: ``bench_parquet.py --profile``'s floor.

A bare asyncio pipeline with nothing of a loader but the batches: the 8 files' footers by
suffix GETs at once (parsed, unchecked), each file then read whole with one GET and decoded
by pyarrow in a thread (as many at once as files), and every batch a dict of numpy views of
one row group (joined where a batch spans two), handed to the caller. No checks, no
checkpoint state, no stats, no fault policy, no window: whatever the loader adds is above
it. Two hand-offs, as a user meets them: ``async for`` on the pipeline's loop, and ``for``
in the caller's thread with the loop in another thread (a ``SimpleQueue`` between them,
unbounded).

The variant ``whole=True`` skips the footers' round trip: each file is read whole at once
and its footer parsed from the bytes — what a reader that knew it needs every byte of every
file could do.

:func:`cores_used` times any epoch on the clock and on both processes' CPU (this one's,
every thread; the server's): where the two cores go.

Example::

    rows = floor_epoch(store, keys, 256, threaded=True)
    wall, own, server = cores_used(lambda: floor_epoch(...), server_pid)
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
import obstore
import pyarrow as pa
import pyarrow.parquet as pq
import uvloop

FOOTER_GUESS = 64 << 10


async def _get(store: Any, key: str, suffix: int | None = None) -> bytes:
    options: dict[str, Any] = {} if suffix is None else {"range": {"suffix": suffix}}
    result = await obstore.get_async(store, key, options=options)
    return bytes(await result.bytes_async())


def _decode(body: bytes) -> list[dict[str, np.ndarray]]:
    """A file's row groups, each a dict of numpy arrays (views of Arrow's buffers)."""
    table = pq.read_table(pa.BufferReader(body))
    groups: list[dict[str, np.ndarray]] = []
    names = table.column_names
    chunks = [table.column(name).chunks for name in names]
    for index in range(len(chunks[0])):
        groups.append({name: chunks[i][index].to_numpy() for i, name in enumerate(names)})
    return groups


async def _batches(store: Any, keys: list[str], batch_size: int, whole: bool) -> AsyncIterator[Any]:
    if not whole:
        tails = await asyncio.gather(*(_get(store, key, FOOTER_GUESS) for key in keys))
        for tail in tails:  # the parse a loader needs for row counts; its result unused here
            pq.read_metadata(pa.BufferReader(tail))

    async def read(key: str) -> list[dict[str, np.ndarray]]:
        return await asyncio.to_thread(_decode, await _get(store, key))

    reads = [asyncio.ensure_future(read(key)) for key in keys]
    pending: list[dict[str, np.ndarray]] = []  # pieces of the batch being made
    held = 0
    for task in reads:
        for group in await task:
            rows, offset = len(next(iter(group.values()))), 0
            while offset < rows:
                take = min(batch_size - held, rows - offset)
                pending.append(
                    {name: array[offset : offset + take] for name, array in group.items()}
                )
                held, offset = held + take, offset + take
                if held == batch_size:
                    yield _join(pending)
                    pending, held = [], 0
    if pending:
        yield _join(pending)


def _join(pieces: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    if len(pieces) == 1:
        return pieces[0]
    return {name: np.concatenate([piece[name] for piece in pieces]) for name in pieces[0]}


async def _count(store: Any, keys: list[str], batch_size: int, whole: bool) -> int:
    rows = 0
    async for batch in _batches(store, keys, batch_size, whole):
        rows += len(batch["c0"])
    return rows


def floor_epoch(
    store: Any, keys: list[str], batch_size: int, *, threaded: bool, whole: bool = False
) -> int:
    """One epoch of the bare pipeline (``threaded``: consumed by ``for`` in this thread, the
    loop in another); the rows it yielded."""
    if not threaded:
        return uvloop.run(_count(store, keys, batch_size, whole))
    handoff: queue.SimpleQueue[Any] = queue.SimpleQueue()

    async def produce() -> None:
        async for batch in _batches(store, keys, batch_size, whole):
            handoff.put(batch)

    def run() -> None:
        try:
            uvloop.run(produce())
        finally:
            handoff.put(None)

    thread = threading.Thread(target=run)
    thread.start()
    rows = 0
    while (batch := handoff.get()) is not None:
        rows += len(batch["c0"])
    thread.join()
    return rows


def _process_cpu(pid: int) -> float:
    """CPU seconds (user and system) process ``pid`` has used (Linux's /proc)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cores_used(run: Callable[[], Any], server_pid: int) -> tuple[float, float, float]:
    """``run()``'s seconds on the clock, this process's CPU seconds in it (all threads) and
    the server process's (at the kernel's clock tick, 10 ms: sum several runs)."""
    server_before, own_before = _process_cpu(server_pid), time.process_time()
    start = time.perf_counter()
    run()
    wall = time.perf_counter() - start
    own = time.process_time() - own_before
    return wall, own, _process_cpu(server_pid) - server_before
