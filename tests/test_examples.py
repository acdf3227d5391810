"""The examples run: each one as a user would, in a fresh Python process, and says what it should.

Adding an example is one line in ``EXAMPLES``: the script, its arguments (a small size, so
that it runs in seconds), and text its output must contain.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent

EXAMPLES = [
    ("quickstart.py", [], ["epoch 1:", "async for: 2048 remote reads", "worker processes:"]),
    ("async_service.py", ["--quick"], ["scored 8192 samples", "health answers, while loading"]),
    ("classic_script.py", ["--quick"], ["numpy model, epoch 1:", "torch model"]),
    (
        "object_store.py",
        [],
        ["each exactly once", "ObjectDataset with the listing as sampler: 512 objects"],
    ),
    (
        "parquet.py",
        [],
        [
            "ParquetDataset, shuffled: 10000 rows, each exactly once",
            "2 workers, stopped after 10 batches and resumed: 10000 rows, each exactly once",
        ],
    ),
    ("resume.py", [], ["ok: every one of the 1000 samples exactly once"]),
    ("resume.py", ["--workers", "2"], ["ok: every one of the 1000 samples exactly once"]),
]


@pytest.mark.timeout(150)
@pytest.mark.parametrize(
    ("script", "args", "expected"),
    EXAMPLES,
    ids=[" ".join([script, *args]) for script, args, _ in EXAMPLES],
)
def test_example_runs(script: str, args: list[str], expected: list[str]) -> None:
    # The package is importable from the checkout whether or not it is installed.
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / script), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=env,
        check=False,
    )
    assert result.returncode == 0, f"{script} failed:\n{result.stdout}\n{result.stderr}"
    for text in expected:
        assert text in result.stdout, f"{script} did not print {text!r}:\n{result.stdout}"
