"""A script that ends mid-epoch exits at once, as under torch, and leaves nothing running.

A step-based script (``it = iter(loader)``, a few ``next(it)``) ends with its
iterator still alive: workers reading ahead, persistent workers, a pin thread.
Each script here runs in its own interpreter, so the test sees what a user
sees: the exit code, stderr (no traceback, no leak warning), how long the
interpreter takes to leave after the script's last line, and that no process
it started (workers, a fork server) is still running afterwards — every one
carries a mark in its environment, so the test finds them all.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from marked import marked_processes

from tests.conftest import wait_until

ROOT = Path(__file__).resolve().parents[1]
MARK = "AIOLOAD_TEST_EXIT_MARK"
EXIT_WITHIN = 2.5  # seconds from the script's last line to the interpreter's exit
GONE_WITHIN = 5.0  # seconds for what the script started to be gone after that

# The loader's dataset is aioload's own class: nothing the loop thread holds refers to
# the script's globals, so the iterator is collected while the interpreter finalizes.
_MID_EPOCH = """
import os, sys
import numpy as np
import aioload

workers = int(sys.argv[1])
loader = aioload.DataLoader(
    aioload.TensorDataset(np.arange(100_000)),
    batch_size=4,
    num_workers=workers,
    persistent_workers="persistent" in sys.argv,
    pin_memory="pin" in sys.argv,
)
it = iter(loader)
for _ in range(3):
    batch = next(it)
print("ready", flush=True)
"""

# The torch spelling: torch's own dataset, tensors out.
_TORCH_MID_EPOCH = """
import sys
import torch
from aioload.torch import DataLoader

loader = DataLoader(
    torch.utils.data.TensorDataset(torch.arange(100_000)),
    batch_size=8,
    num_workers=int(sys.argv[1]),
)
it = iter(loader)
for _ in range(3):
    (batch,) = next(it)
assert isinstance(batch, torch.Tensor)
print("ready", flush=True)
"""

# A script that fails mid-epoch: the iterator stays alive in the traceback the
# interpreter keeps (sys.last_traceback) until it finalizes.
_FAILS_MID_EPOCH = """
import sys
import numpy as np
import aioload

def main():
    loader = aioload.DataLoader(
        aioload.TensorDataset(np.arange(100_000)), batch_size=4, num_workers=int(sys.argv[1])
    )
    it = iter(loader)
    for _ in range(3):
        next(it)
    print("ready", flush=True)
    raise ValueError("the training step failed")

main()
"""

# The dataset's reads never return after the first batches: the epoch still runs them.
# The class lives in a module of its own (as a project's dataset would), written next
# to the script.
_STUCK_DATASET = """
import time
import numpy as np
import aioload

class StuckAfterEight(aioload.Dataset):
    def __len__(self):
        return 1000
    def __getitem__(self, index):
        if index >= 8:
            time.sleep(60)
        return np.full(2, index)
"""
_STUCK_READS = """
import sys
import aioload
from stuck import StuckAfterEight

it = iter(aioload.DataLoader(StuckAfterEight(), batch_size=4, num_workers=int(sys.argv[1])))
next(it)
print("ready", flush=True)
"""


def _kill_marked(mark: str) -> None:
    for pid in marked_processes(MARK, mark):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _run_to_exit(tmp_path: Path, script: str, *args: str) -> tuple[int, str, float]:
    """Runs ``script``; its exit code, stderr and the seconds it took to exit after "ready".

    Fails (and kills what is left) when the interpreter is still running
    :data:`EXIT_WITHIN` seconds after the script's last line, or when anything it
    started outlives it.
    """
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(script))
    mark = uuid.uuid4().hex
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)]), MARK: mark}
    env.pop("PYTHONFAULTHANDLER", None)
    process = subprocess.Popen(
        [sys.executable, str(path), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None and process.stderr is not None
        line = process.stdout.readline()
        ready = time.monotonic()
        try:
            code = process.wait(EXIT_WITHIN)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            pytest.fail(
                f"the interpreter was still running {EXIT_WITHIN} s after the script's "
                f"last line; stderr: {process.stderr.read()!r}"
            )
        took = time.monotonic() - ready
        print(f"exit took {took:.2f}s")
        assert line == "ready\n", f"the script failed: {process.stderr.read()!r}"
        stderr = process.stderr.read()
        assert wait_until(lambda: not marked_processes(MARK, mark), GONE_WITHIN), (
            f"left running after the script exited: {marked_processes(MARK, mark)}"
        )
        return code, stderr, took
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        _kill_marked(mark)
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "args",
    [("0",), ("2",), ("2", "persistent"), ("0", "pin"), ("2", "pin"), ("2", "persistent", "pin")],
    ids=lambda args: "-".join(args),
)
def test_a_script_that_ends_mid_epoch_exits_at_once(tmp_path: Path, args: tuple[str, ...]) -> None:
    code, stderr, took = _run_to_exit(tmp_path, _MID_EPOCH, *args)
    assert code == 0
    assert stderr == ""
    assert took < EXIT_WITHIN


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_torch_script_that_ends_mid_epoch_exits_at_once(tmp_path: Path, workers: str) -> None:
    pytest.importorskip("torch")
    code, stderr, took = _run_to_exit(tmp_path, _TORCH_MID_EPOCH, workers)
    assert code == 0
    assert stderr == ""
    assert took < EXIT_WITHIN


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_script_that_fails_mid_epoch_exits_with_its_error_only(
    tmp_path: Path, workers: str
) -> None:
    code, stderr, took = _run_to_exit(tmp_path, _FAILS_MID_EPOCH, workers)
    assert code == 1
    assert stderr.count("Traceback") == 1, stderr
    assert stderr.rstrip().endswith("ValueError: the training step failed"), stderr
    assert took < EXIT_WITHIN


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_script_whose_reads_hang_still_exits_at_once(tmp_path: Path, workers: str) -> None:
    (tmp_path / "stuck.py").write_text(textwrap.dedent(_STUCK_DATASET))
    code, stderr, took = _run_to_exit(tmp_path, _STUCK_READS, workers)
    assert code == 0
    assert stderr == ""
    assert took < EXIT_WITHIN
