"""An asyncio service that scores a stream of remote samples and stays responsive.

The service runs one event loop. On it, ``async for batch in loader`` reads samples from a
(simulated) remote feature store, hundreds of reads in flight at once, and scores each batch
with a small numpy model; the same loop answers ``GET /health`` over plain asyncio streams. A
client pings the health endpoint every few milliseconds while the loader runs and reports how
long the answers took, idle and while loading: the loader never blocks the loop, so the
answers stay within a few milliseconds.

What still delays them is CPU work done *on* the loop: every item coroutine that resumes runs
there, so items that cost real CPU (decoding) belong in worker processes. ``--workers 2``
moves the fetches to two worker processes, each with its own event loop; the service's loop
then only receives finished batches.

Run: ``python examples/async_service.py [--quick] [--workers N]``. Everything binds
127.0.0.1 and stops when the script ends.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import numpy as np

from aioload import DataLoader

FEATURES = 32
LATENCY = 0.02  # seconds each remote read waits


class RemoteFeatures:
    """A stand-in for a remote feature store: every read waits ``LATENCY`` seconds."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.rows = np.random.default_rng(0).standard_normal((1024, FEATURES), dtype=np.float32)

    def __len__(self) -> int:
        return self.n

    async def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        await asyncio.sleep(LATENCY)  # the network round trip
        return self.rows[i % len(self.rows)], i


class Service:
    """The service's state: what it has scored so far, answered on ``/health``."""

    def __init__(self) -> None:
        self.batches = 0
        self.samples = 0
        self.positive = 0

    async def answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Answers HTTP/1.1 requests on one keep-alive connection."""
        try:
            while True:
                request = await reader.readuntil(b"\r\n\r\n")
                path = request.split(b" ", 2)[1]
                if path == b"/health":
                    status = b"200 OK"
                    body = json.dumps(
                        {"status": "ok", "batches": self.batches, "samples": self.samples}
                    ).encode()
                else:
                    status, body = b"404 Not Found", b"{}"
                writer.write(
                    b"HTTP/1.1 " + status + b"\r\nContent-Type: application/json\r\n"
                    b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client went away
        finally:
            writer.close()

    async def score(self, loader: DataLoader) -> float:
        """Scores every sample of one epoch; returns the seconds it took."""
        weights = np.random.default_rng(0).standard_normal(FEATURES).astype(np.float32)
        start = time.perf_counter()
        async for features, _keys in loader:
            probability = 1.0 / (1.0 + np.exp(-(features @ weights)))
            self.positive += int((probability > 0.5).sum())
            self.batches += 1
            self.samples += len(features)
        return time.perf_counter() - start


async def ping(port: int, every: float, stop: asyncio.Event) -> list[float]:
    """Asks ``/health`` every ``every`` seconds until ``stop``; the answer times, in seconds."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    times: list[float] = []
    try:
        while not stop.is_set():
            start = time.perf_counter()
            writer.write(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            body = json.loads(await reader.readexactly(length))
            times.append(time.perf_counter() - start)
            if body["status"] != "ok":
                raise RuntimeError(f"unhealthy: {body}")
            await asyncio.sleep(every)
    finally:
        writer.close()
        await writer.wait_closed()
    return times


async def main(samples: int, workers: int) -> None:
    service = Service()
    server = await asyncio.start_server(service.answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    loader = DataLoader(
        RemoteFeatures(samples), batch_size=64, concurrency=512, in_order=False, num_workers=workers
    )
    async with server:
        # Health latency of the idle service, as the reference.
        stop = asyncio.Event()
        idle_pings = asyncio.create_task(ping(port, 0.002, stop))
        await asyncio.sleep(0.3)
        stop.set()
        idle = await idle_pings

        stop = asyncio.Event()
        busy_pings = asyncio.create_task(ping(port, 0.002, stop))
        try:
            seconds = await service.score(loader)
        finally:
            stop.set()
            busy = await busy_pings
    serial = samples * LATENCY
    print(
        f"scored {service.samples} samples in {service.batches} batches in {seconds:.2f} s "
        f"({service.samples / seconds:,.0f} samples/s; reading them one by one would take "
        f"{serial:.0f} s); {service.positive} scored positive"
    )
    for name, times in (("idle service", idle), ("while loading", busy)):
        p50, p99, worst = np.percentile(np.array(times) * 1e3, [50, 99, 100])
        print(
            f"health answers, {name}: {len(times)} requests, p50 {p50:.2f} ms, "
            f"p99 {p99:.2f} ms, max {worst:.2f} ms"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples: about a second")
    parser.add_argument("--workers", type=int, default=0, help="num_workers (default 0)")
    args = parser.parse_args()
    asyncio.run(main(8_192 if args.quick else 32_768, args.workers))
