"""The job of tests/test_multirank_distributed.py: two ranks under ``torch.multiprocessing.spawn``.

``python distributed_rank_job.py FOLDER`` writes shards, JSON-lines files and Parquet files
into ``FOLDER``, then spawns two ranks that initialise ``torch.distributed`` (gloo, through a
file in ``FOLDER``: no port, no network) with no ``RANK`` or ``WORLD_SIZE`` in their
environment, as ``torch.multiprocessing.spawn`` leaves it. Each rank writes
``FOLDER/rank-R.json``: for every split (the stream datasets, ``DistributedSampler``,
``split_by_rank_and_worker`` in workers started by ``spawn``, and datasets given their rank
explicitly), the rank and world size it took and the samples it yielded.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

SAMPLES = 96
WORLD = 2


def label(raw: dict[str, Any]) -> int:
    """A shard sample's number (module level: runs in the workers)."""
    from aioload.sources import default_decode

    return int(default_decode(raw)["cls"])


def number(row: dict[str, Any]) -> int:
    return int(row["n"])


def write_data(folder: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from aioload.sources import ShardWriter

    with ShardWriter(str(folder / "part-%03d.tar"), maxcount=12) as writer:
        for i in range(SAMPLES):
            writer.write({"__key__": f"{i:06d}", "cls": i})
    for part in range(8):
        rows = range(part * 12, part * 12 + 12)
        (folder / f"part-{part}.jsonl").write_text(
            "".join(json.dumps({"n": n}) + "\n" for n in rows)
        )
    for part in range(4):
        table = pa.table({"n": np.arange(part * 24, part * 24 + 24, dtype=np.int64)})
        pq.write_table(table, folder / f"part-{part}.parquet", row_group_size=6)


def values(loader: Any) -> list[int]:
    found: list[int] = []
    for batch in loader:
        if isinstance(batch, dict):
            batch = batch["n"]
        found += [int(v) for v in np.asarray(batch).ravel()]
    return found


def run(rank: int, folder: str) -> None:
    import torch.distributed as dist
    from rank_job import RankedRange

    from aioload import ArrayDataset, DataLoader, DistributedSampler
    from aioload.sources import IterableParquetDataset, JsonLinesDataset, MixDataset, ShardDataset

    assert "RANK" not in os.environ and "WORLD_SIZE" not in os.environ
    root = Path(folder)
    dist.init_process_group(
        "gloo", init_method=(root / "store").as_uri(), rank=rank, world_size=WORLD
    )
    try:
        shard_urls = [p.as_uri() for p in sorted(root.glob("part-*.tar"))]
        jsonl_urls = [p.as_uri() for p in sorted(root.glob("part-*.jsonl"))]
        parquet_urls = [p.as_uri() for p in sorted(root.glob("part-*.parquet"))]
        report: dict[str, Any] = {}

        def stream(name: str, make: Callable[[], Any], **loader_options: Any) -> None:
            try:
                dataset = make()
                loader = DataLoader(dataset, batch_size=4, num_workers=2, **loader_options)
                report[name] = {
                    "ranks": [getattr(dataset, "rank", None), getattr(dataset, "world_size", None)],
                    "samples": values(loader),
                }
            except Exception as error:  # each split reports on its own
                report[name] = {"error": repr(error)}

        stream("shards", lambda: ShardDataset(shard_urls, decode=label, split="shards"))
        stream("jsonl", lambda: JsonLinesDataset(jsonl_urls, decode=number))
        stream("parquet", lambda: IterableParquetDataset(parquet_urls, columns=["n"]))
        shards = partial(ShardDataset, shard_urls, decode=label, split="shards")
        stream("mix", lambda: MixDataset([shards()], [1.0], stop="first"))
        # A rank given explicitly wins: this one reads everything.
        explicit = partial(ShardDataset, shard_urls, decode=label, rank=0, world_size=1)
        stream("shards-explicit", explicit)
        # The split runs in workers that spawn started: they have no process group.
        stream(
            "split-in-spawned-workers",
            lambda: RankedRange(SAMPLES),
            multiprocessing_context="spawn",
        )
        try:
            sampler = DistributedSampler(ArrayDataset(np.arange(SAMPLES)), seed=5)
            keys = DataLoader(ArrayDataset(np.arange(SAMPLES)), batch_size=4, sampler=sampler)
            report["sampler"] = {
                "ranks": [sampler.rank, sampler.num_replicas],
                "samples": [int(k) for (batch,) in keys for k in batch],
            }
        except Exception as error:
            report["sampler"] = {"error": repr(error)}
        (root / f"rank-{rank}.json").write_text(json.dumps(report))
    finally:
        dist.destroy_process_group()


def main() -> None:
    import torch.multiprocessing as mp

    folder = Path(sys.argv[1])
    write_data(folder)
    mp.spawn(run, args=(str(folder),), nprocs=WORLD, join=True)


if __name__ == "__main__":
    main()
