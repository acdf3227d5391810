"""Ranks come from ``torch.distributed`` when it is initialised, as torch's samplers take them.

``torch.multiprocessing.spawn`` starts ranks with no ``RANK`` or ``WORLD_SIZE``; each
initialises ``torch.distributed`` itself. Every split (the stream datasets, a mix,
``DistributedSampler``, ``split_by_rank_and_worker`` inside workers that ``spawn`` started)
must then take its rank from the process group: the two ranks read disjoint halves that
cover the data once. A rank given explicitly still wins. The job is
``tests/distributed_rank_job.py``; the process group is real (gloo, through a file: no
network).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import aioload
from aioload import DistributedSampler

pytestmark = pytest.mark.slow

JOB = Path(__file__).with_name("distributed_rank_job.py")
ROOT = JOB.parent.parent
SAMPLES = 96  # as in the job
WORLD = 2
SPLITS = ["shards", "jsonl", "parquet", "mix", "sampler", "split-in-spawned-workers"]


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """What each rank of the job took and read."""
    pytest.importorskip("torch")
    pytest.importorskip("pyarrow")
    folder = tmp_path_factory.mktemp("distributed")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(JOB.parent)])
    done = subprocess.run(
        [sys.executable, str(JOB), str(folder)],
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert done.returncode == 0, done.stderr
    return [json.loads((folder / f"rank-{rank}.json").read_text()) for rank in range(WORLD)]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("split", SPLITS)
def test_ranks_from_torch_distributed_read_disjoint_halves(
    reports: list[dict[str, Any]], split: str
) -> None:
    for report in reports:
        assert "error" not in report[split], report[split]["error"]
    halves = [report[split]["samples"] for report in reports]
    for rank, report in enumerate(reports):
        took_rank, took_world_size = report[split]["ranks"]
        assert took_rank in (rank, None) and took_world_size in (WORLD, None)
    assert [len(half) for half in halves] == [SAMPLES // WORLD] * WORLD
    assert sorted(halves[0] + halves[1]) == list(range(SAMPLES))


@pytest.mark.timeout(180)
def test_a_rank_given_explicitly_wins(reports: list[dict[str, Any]]) -> None:
    for report in reports:
        assert "error" not in report["shards-explicit"], report["shards-explicit"]["error"]
        assert report["shards-explicit"]["ranks"] == [0, 1]
        assert sorted(report["shards-explicit"]["samples"]) == list(range(SAMPLES))


@pytest.mark.timeout(60)
def test_an_initialised_process_group_wins_over_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch = pytest.importorskip("torch")
    dist = torch.distributed
    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    assert not dist.is_initialized()
    monkeypatch.setenv("RANK", "1")  # what a launcher left behind: the group says otherwise
    monkeypatch.setenv("WORLD_SIZE", "2")
    dist.init_process_group("gloo", init_method=(tmp_path / "store").as_uri(), rank=0, world_size=1)
    try:
        assert aioload.rank_and_world_size() == (0, 1)
        assert aioload.rank_and_world_size(rank=1, world_size=3) == (1, 3)  # given: they win
        sampler = DistributedSampler(range(10), shuffle=False)
        assert (sampler.rank, sampler.num_replicas) == (0, 1)
        assert list(sampler) == list(range(10))
        assert list(aioload.split_by_rank_and_worker(range(5))) == [0, 1, 2, 3, 4]
    finally:
        dist.destroy_process_group()
    assert aioload.rank_and_world_size() == (1, 2)  # without a group: the environment
