"""One training rank of tests/test_multirank.py: run as a script with RANK and WORLD_SIZE set.

Prints, as JSON, the keys this rank's loaders yielded: a map-style dataset under
``DistributedSampler`` (two epochs, ``set_epoch`` before each) and an iterable one split
with ``split_by_rank_and_worker``, each with ``num_workers`` 0 and 2.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator

import numpy as np

import aioload
from aioload import ArrayDataset, DataLoader, DistributedSampler

ITEMS = 51


class RankedRange(aioload.IterableDataset):
    """0..n-1, each rank's and each worker's share only."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[int]:
        return aioload.split_by_rank_and_worker(range(self.n))


def main() -> None:
    report: dict[str, list[list[int]]] = {}
    dataset = ArrayDataset(np.arange(ITEMS))
    for workers in (0, 2):
        sampler = DistributedSampler(dataset, seed=5)  # rank and world size from the env
        loader = DataLoader(dataset, batch_size=4, sampler=sampler, num_workers=workers)
        epochs = []
        for epoch in range(2):
            sampler.set_epoch(epoch)
            epochs.append([int(k) for (batch,) in loader for k in batch])
        report[f"map-{workers}"] = epochs
        stream = DataLoader(RankedRange(ITEMS), batch_size=4, num_workers=workers)
        report[f"iterable-{workers}"] = [[int(k) for batch in stream for k in batch]]
    json.dump(report, sys.stdout)


if __name__ == "__main__":
    main()
