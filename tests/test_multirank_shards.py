"""Three training ranks, each its own process, stream shards of unequal sizes in equal steps.

Each rank runs ``tests/shard_rank_job.py`` with ``RANK`` and ``WORLD_SIZE`` set as
``torchrun`` sets them, over shards served by the ObjectServer: every rank's loader yields
the same number of batches (``len(loader)``, true for 0 and 2 workers), and together they
yield every sample exactly once (``drop_last=True``: but the epoch's last) or once plus the
epoch's first samples again (the padding).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_sources_shard_split import SIZES, write_shards

pytestmark = pytest.mark.slow

WORLD = 3
TOTAL = sum(SIZES)
JOB = Path(__file__).with_name("shard_rank_job.py")
ROOT = JOB.parent.parent


@pytest.fixture(scope="module")
def reports(object_folder: Path, object_server: Any) -> list[dict[str, Any]]:
    """What each of the ``WORLD`` concurrent ranks yielded."""
    folder = object_folder / "ranks"
    folder.mkdir(exist_ok=True)
    write_shards(folder)
    url = f"{object_server.url}/ranks/part-{{000..{len(SIZES) - 1:03d}}}.tar"
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    ranks = [
        subprocess.Popen(
            [sys.executable, str(JOB), url],
            env={**os.environ, "RANK": str(rank), "WORLD_SIZE": str(WORLD), "PYTHONPATH": path},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(WORLD)
    ]
    found = []
    try:
        for rank in ranks:
            out, err = rank.communicate(timeout=50)
            assert rank.returncode == 0, err
            found.append(json.loads(out))
    finally:
        for rank in ranks:
            if rank.poll() is None:
                rank.kill()
                rank.wait()
    return found


def sequence(epoch: int) -> list[int]:
    """The samples in epoch ``epoch``'s shard order (seed 0)."""
    starts = np.cumsum([0, *SIZES])
    order = np.random.default_rng([0, epoch]).permutation(len(SIZES))
    return [n for shard in order for n in range(starts[shard], starts[shard + 1])]


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("workers", [0, 2])
def test_equal_batches_and_every_sample_once(
    reports: list[dict[str, Any]], workers: int, drop_last: bool
) -> None:
    share = TOTAL // WORLD if drop_last else -(-TOTAL // WORLD)
    batches = -(-share // 4)
    for epoch in range(2):
        ranks = [report[f"{workers}-{drop_last}"][epoch] for report in reports]
        assert [r["rank"] for r in ranks] == list(range(WORLD))
        for rank in ranks:
            assert (rank["len"], rank["batches"], rank["yielded"]) == (share, batches, batches)
        counts = Counter(n for rank in ranks for n in rank["samples"])
        order = sequence(epoch)
        if drop_last:
            assert counts == Counter(order[: share * WORLD])  # the last one left out
        else:
            assert counts == Counter(order) + Counter(order[: share * WORLD - TOTAL])
    # set_epoch reshuffles the shards: a rank's samples change from one epoch to the next.
    first = reports[0][f"{workers}-{drop_last}"]
    assert first[0]["samples"] != first[1]["samples"]


def test_the_workers_do_not_change_what_a_rank_reads(reports: list[dict[str, Any]]) -> None:
    for report in reports:
        for drop_last in (False, True):
            with_workers = report[f"2-{drop_last}"]
            alone = report[f"0-{drop_last}"]
            for epoch in range(2):
                assert sorted(with_workers[epoch]["samples"]) == sorted(alone[epoch]["samples"])
