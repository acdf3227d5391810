"""One training rank of tests/test_multirank_shards.py: run with RANK and WORLD_SIZE set.

``python shard_rank_job.py URL`` prints, as JSON, what this rank's ``ShardDataset`` (split
at sample granularity, the default with several ranks) gave through a ``DataLoader`` of
batch 4: for each ``num_workers`` (0, 2) and ``drop_last`` (False, True), two epochs (with
``set_epoch`` and shuffled shards) of ``len(dataset)``, ``len(loader)``, the batches yielded
and the samples' numbers.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from aioload import DataLoader
from aioload.sources import ShardDataset, default_decode


def label(raw: dict[str, Any]) -> int:
    """A sample's number (module level: runs in the workers)."""
    return int(default_decode(raw)["cls"])


def main() -> None:
    url = sys.argv[1]
    report: dict[str, list[dict[str, Any]]] = {}
    for workers in (0, 2):
        for drop_last in (False, True):
            # Rank and world size from the environment, as torchrun sets them.
            dataset = ShardDataset(url, decode=label, shuffle_shards=True, drop_last=drop_last)
            loader = DataLoader(dataset, batch_size=4, num_workers=workers, collate_fn=list)
            epochs = []
            for epoch in range(2):
                dataset.set_epoch(epoch)
                batches = list(loader)
                epochs.append(
                    {
                        "rank": dataset.rank,
                        "len": len(dataset),
                        "batches": len(loader),
                        "yielded": len(batches),
                        "samples": [n for batch in batches for n in batch],
                    }
                )
            report[f"{workers}-{drop_last}"] = epochs
    json.dump(report, sys.stdout)


if __name__ == "__main__":
    main()
