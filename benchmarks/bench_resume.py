"""Resuming a shard stream halfway through an epoch, against a fresh start, in the same run.

Run by hand: ``python benchmarks/bench_resume.py [--quick] [--repeat 5]``.

64 tar shards of 16 samples of 64 KiB, written by ``ShardWriter`` with their index files and
served by an :class:`~aioload.testing.ObjectServer` on 127.0.0.1 that answers every request
after 20 ms. ``ShardDataset(shards_in_flight=4, shuffle_buffer=64)`` through ``DataLoader``
(0 workers and 2 workers, batch 32):

- **fresh start**: a new loader's time to its first batch;
- **resumed halfway**: a loader is read for half the epoch and checkpointed
  (``loader.state_dict()``, through JSON); a new loader loads the state and the time to its
  first batch is taken, then it reads the rest of the epoch. The bytes the server sent for
  that rest are counted (its ``stats()["bytes"]``) against the bytes of the samples not yet
  consumed: nothing consumed is read again, so they may differ only by tar headers and the
  padding of the shards' last samples.

Targets: resumed first batch <= 2 x a fresh start's; bytes read after the resume <= the bytes
left (plus headers). Medians over ``--repeat`` runs, the two cases alternated.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from aioload import DataLoader
from aioload.sources import ShardDataset, ShardWriter
from aioload.testing import ObjectServer

SHARDS = 64
PER_SHARD = 16
SAMPLE_SIZE = 64 << 10
SAMPLES = SHARDS * PER_SHARD
LATENCY = 0.02
BATCH = 32


def decode(sample: dict[str, Any]) -> int:
    """A sample's label (its payload checked, not copied)."""
    label = int(sample["cls"])
    assert sample["bin"][:1] == bytes([label % 251])
    return label


@contextmanager
def shard_server(shards: int) -> Iterator[tuple[ObjectServer, str, float]]:
    """Writes the shards into a temporary folder and serves it; yields the server, the URLs
    and the bytes a sample takes in its shard (headers and the archive's end included)."""
    with tempfile.TemporaryDirectory() as folder:
        with ShardWriter(os.path.join(folder, "s-%04d.tar"), maxcount=PER_SHARD) as writer:
            for i in range(shards * PER_SHARD):
                writer.write(
                    {"__key__": f"{i:06d}", "cls": i, "bin": bytes([i % 251]) * SAMPLE_SIZE}
                )
        with ObjectServer(folder, latency=LATENCY) as server:
            per_sample = os.path.getsize(os.path.join(folder, "s-0000.tar")) / PER_SHARD
            yield server, f"{server.url}/s-{{0000..{shards - 1:04d}}}.tar", per_sample


def make_loader(urls: str, workers: int) -> DataLoader[Any]:
    dataset = ShardDataset(urls, decode=decode, shards_in_flight=4, shuffle_buffer=64)
    return DataLoader(dataset, batch_size=BATCH, num_workers=workers, collate_fn=list)


def fresh_first_batch(urls: str, workers: int) -> float:
    loader = make_loader(urls, workers)
    start = time.perf_counter()
    iterator = iter(loader)
    next(iterator)
    seconds = time.perf_counter() - start
    iterator.close()  # type: ignore[attr-defined]
    loader.close()
    return seconds


def resumed(
    server: ObjectServer, urls: str, workers: int, samples: int, per_sample: float
) -> dict[str, float]:
    """Half an epoch, a checkpoint, a new loader: its first batch and what it read."""
    first = make_loader(urls, workers)
    seen: list[int] = []
    iterator = iter(first)
    for batch in iterator:
        seen += batch
        if len(seen) >= samples // 2:
            break
    state = json.loads(json.dumps(first.state_dict()))
    iterator.close()  # type: ignore[attr-defined]
    first.close()
    time.sleep(0.3)  # what the server still sent the stopped loader is not the resumed one's
    loader = make_loader(urls, workers)
    loader.load_state_dict(state)
    before = server.stats()["bytes"]
    start = time.perf_counter()
    rest: list[int] = []
    for index, batch in enumerate(loader):
        if index == 0:
            first_batch = time.perf_counter() - start
        rest += batch
    read = server.stats()["bytes"] - before
    loader.close()
    assert sorted(seen + rest) == list(range(samples)), "a sample lost or repeated"
    left = len(rest) * per_sample
    return {"first": first_batch, "read": read, "left": left}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    shards = 16 if args.quick else SHARDS
    repeat = 1 if args.quick else args.repeat
    rows = [
        "| workers | fresh first batch | resumed first batch | ratio "
        "| bytes read after the resume ÷ bytes left | targets |",
        "|---|---:|---:|---:|---:|---|",
    ]
    with shard_server(shards) as (server, urls, per_sample):
        for workers in (0, 2):
            fresh_first_batch(urls, workers)  # untimed
            fresh, again, reads = [], [], []
            for _ in range(repeat):
                fresh.append(fresh_first_batch(urls, workers))
                result = resumed(server, urls, workers, shards * PER_SHARD, per_sample)
                again.append(result["first"])
                reads.append(result["read"] / result["left"])
            ratio = statistics.median(again) / statistics.median(fresh)
            read = max(reads)
            met = "met" if ratio <= 2 and read <= 1.0 else "MISSED"
            rows.append(
                f"| {workers} | {statistics.median(fresh) * 1e3:.1f} ms | "
                f"{statistics.median(again) * 1e3:.1f} ms | {ratio:.2f}× | {read:.3f} (most) | "
                f"≤ 2×, ≤ 1: {met} |"
            )
            print(rows[-1], flush=True)
    print(
        f"\n{shards} shards of {PER_SHARD} × 64 KiB, {LATENCY * 1e3:.0f} ms per request; "
        f"medians of {repeat}; Python {sys.version.split()[0]}\n"
    )
    print("\n".join(rows))


if __name__ == "__main__":
    main()
