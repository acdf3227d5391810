"""Several training ranks on this machine, each with its own loader, cover a dataset once.

Each rank is a separate Python process (``tests/rank_job.py``) started with ``RANK`` and
``WORLD_SIZE`` set as ``torchrun`` sets them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import aioload

pytestmark = pytest.mark.slow

ITEMS = 51  # as in rank_job.py
WORLD = 2
JOB = Path(__file__).with_name("rank_job.py")
ROOT = JOB.parent.parent


@pytest.fixture(scope="module")
def reports() -> list[dict[str, Any]]:
    """What each of ``WORLD`` concurrent ranks yielded."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    ranks = [
        subprocess.Popen(
            [sys.executable, str(JOB)],
            env={**os.environ, "RANK": str(rank), "WORLD_SIZE": str(WORLD), "PYTHONPATH": path},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(WORLD)
    ]
    found = []
    for rank in ranks:
        out, err = rank.communicate(timeout=50)
        assert rank.returncode == 0, err
        found.append(json.loads(out))
    return found


@pytest.mark.parametrize("workers", [0, 2])
def test_distributed_sampler_shards_cover_the_dataset_once(
    reports: list[dict[str, Any]], workers: int
) -> None:
    for epoch in range(2):
        shards = [report[f"map-{workers}"][epoch] for report in reports]
        # Equal lengths: ceil(51 / 2) = 26 per rank, the last one padded from the start.
        assert [len(shard) for shard in shards] == [26] * WORLD
        counts = Counter(key for shard in shards for key in shard)
        assert set(counts) == set(range(ITEMS))
        assert sum(counts.values()) - ITEMS == 1  # the padding
    # set_epoch reshuffles: each rank's shard changes from one epoch to the next.
    assert all(r[f"map-{workers}"][0] != r[f"map-{workers}"][1] for r in reports)


def test_ranks_agree_whatever_their_workers(reports: list[dict[str, Any]]) -> None:
    # The sampler, not the workers, decides a rank's keys: the same with 0 or 2 workers.
    for report in reports:
        assert report["map-0"] == report["map-2"]


@pytest.mark.parametrize("workers", [0, 2])
def test_iterable_split_by_rank_then_worker(reports: list[dict[str, Any]], workers: int) -> None:
    keys = [k for report in reports for k in report[f"iterable-{workers}"][0]]
    assert sorted(keys) == list(range(ITEMS))
    # Rank r keeps items r, r + 2, ... whatever its number of workers.
    for rank, report in enumerate(reports):
        assert sorted(report[f"iterable-{workers}"][0]) == list(range(rank, ITEMS, WORLD))


def test_split_by_rank_and_worker_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert list(aioload.split_by_rank_and_worker(range(5))) == [0, 1, 2, 3, 4]
    assert list(aioload.split_by_rank_and_worker(range(7), rank=2, world_size=3)) == [2, 5]
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert aioload.rank_and_world_size() == (1, 2)
    with pytest.raises(ValueError, match=r"rank should be an integer in \[0, 1\]"):
        aioload.rank_and_world_size(rank=2)
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(ValueError, match="WORLD_SIZE environment variable"):
        aioload.rank_and_world_size()
