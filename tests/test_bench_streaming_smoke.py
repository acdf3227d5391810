"""benchmarks/bench_streaming.py runs: its aioload contenders, at a tiny size, no peer installed.

The script starts SeaweedFS and its latency proxy on 127.0.0.1, writes every format the
aioload contenders read, and runs each in processes of its own (epochs, resume, two ranks);
the test checks the report it writes, not its figures, and that it left no server running.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # SeaweedFS and a dozen fresh interpreters: about 30 s

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = 120


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as file:
            return file.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.timeout(600)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the benchmark reads /proc")
def test_the_aioload_part_runs_and_stops_its_servers(tmp_path: Path) -> None:
    out = tmp_path / "streaming.json"
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "bench_streaming.py"),
            "--aioload-only",
            "--samples",
            str(SAMPLES),
            "--no-plots",
            "--timeout",
            "120",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=540,
        cwd=tmp_path,
        env=environment,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    names = ["aioload-tar", "aioload-parquet", "aioload-parquet-text", "aioload-jsonl-text"]
    assert report["loaders"] == names
    assert report["unavailable"] == {}
    for latency in ("0", "20"):
        for name in names:
            result = report["epochs"][latency][name]
            assert "error" not in result, (latency, name, result)
            for epoch in result["epochs"]:  # every sample once per epoch, cold and warm
                assert (epoch["samples"], epoch["distinct"]) == (SAMPLES, SAMPLES), epoch
            assert len(result["epochs"]) == 2  # each has a cache: a warm second epoch
            assert result["peak_pss"] > 0 and result["first_batch_s"] > 0
    for name in names:
        resumed = report["resume"][name]
        assert resumed["resumed"] and resumed["exact"], (name, resumed)
    for name in ("aioload-tar", "aioload-parquet"):  # the image-like set's contenders
        ranks = report["ranks"][name]
        assert ranks["batches"][0] == ranks["batches"][1], (name, ranks)
        assert ranks["distinct"] == ranks["count"], (name, ranks)
    assert report["refused_connections"] == []
    assert report["server_pids"] and not any(_alive(pid) for pid in report["server_pids"])
    assert "| aioload ShardDataset (tar) | 0 ms |" in done.stdout
