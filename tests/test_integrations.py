"""The framework examples run: Lightning, Accelerate and JAX, each fed by an aioload loader.

Each example trains a small model on the CPU in seconds, is interrupted in the middle of an
epoch after a checkpoint, resumes from it and checks, itself, that the resumed run trained on
exactly the batches an uninterrupted run would have (the same samples in the same order, the
same weights); the test runs it as a user would, in a fresh process, and reads its verdict.

The frameworks come from the ``integrations`` extra (with torch's CPU build first, as for the
tests). CI installs it on Python 3.11 only: elsewhere these tests skip with the one reason
conftest.py allows there, and on 3.11 a missing package fails the run under
``AIOLOAD_STRICT_SKIPS=1``.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a fresh interpreter per example, a framework imported in each

ROOT = Path(__file__).resolve().parent.parent

# conftest.py's INTEGRATIONS_ON_311_ONLY: the skip CI allows off Python 3.11 (and only there).
ON_311_ONLY = "the integrations extra is installed on Python 3.11 only"

# (script, its arguments, the modules it needs, its environment, what its output must hold)
EXAMPLES = [
    (
        "lightning_train.py",
        ["--workers", "2"],
        ["torch", "pytorch_lightning"],
        {},
        [
            "first run: preempted at step 7",
            "checkpoint step=4.ckpt: 128 samples trained on, the loader state at batch 4",
            "ok: every one of the 320 samples exactly once per epoch",
        ],
    ),
    (
        "accelerate_train.py",
        [],
        ["torch", "accelerate"],
        {},
        [
            "first run: preempted at step 7; the last state holds 128 samples",
            "ok: every one of the 320 samples of this process exactly once per epoch",
        ],
    ),
    (
        "jax_train.py",
        [],
        ["jax"],
        # two CPU devices, so that each batch is really split across devices
        {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"},
        [
            "2 cpu device(s)",
            "a batch on the devices: (64, 8), 2 shard(s)",
            "ok: the resumed run's parameters are the uninterrupted run's, bit for bit",
        ],
    ),
]


def needs(modules: list[str]) -> None:
    """Skips unless every module is installed, saying why in words conftest.py can judge."""
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if not missing:
        return
    names = ", ".join(f"No module named {name!r}" for name in missing)
    if sys.version_info[:2] != (3, 11):
        pytest.skip(f"{ON_311_ONLY} ({names})")
    pytest.skip(f"{names}: pip install -e '.[integrations]' (after torch's CPU build)")


@pytest.mark.timeout(150)
@pytest.mark.parametrize(
    ("script", "args", "modules", "env", "expected"),
    EXAMPLES,
    ids=[" ".join([script, *args]) for script, args, *_ in EXAMPLES],
)
def test_example_trains_and_resumes(
    script: str, args: list[str], modules: list[str], env: dict[str, str], expected: list[str]
) -> None:
    needs(modules)
    environment = {
        **os.environ,
        **env,
        # the package is importable from the checkout whether or not it is installed
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / script), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=environment,
        check=False,
    )
    assert result.returncode == 0, f"{script} failed:\n{result.stdout}\n{result.stderr}"
    for text in expected:
        assert text in result.stdout, f"{script} did not print {text!r}:\n{result.stdout}"


def test_the_skip_off_311_is_the_one_conftest_allows() -> None:
    # The reason above must stay conftest.py's, or CI's 3.12 and 3.13 runs would fail.
    conftest = (ROOT / "conftest.py").read_text()
    assert f'INTEGRATIONS_ON_311_ONLY = "{ON_311_ONLY}"' in conftest
