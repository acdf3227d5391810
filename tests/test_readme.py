"""The README's Python snippets run: each ```python block of README.md, in a fresh process.

The snippets use placeholders (``features``, ``train_step``, ``store``, ...): a shared preamble
defines each as the smallest real thing of its kind, and the names that earlier snippets
import or define. A snippet with a top-level ``async for`` runs as a notebook cell runs it
(compiled with top-level await allowed, on an asyncio event loop).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
BLOCKS = re.findall(r"^```python\n(.*?)^```", (ROOT / "README.md").read_text(), re.M | re.S)

PREAMBLE = '''
import asyncio
import json

import numpy as np

from aioload import ArrayDataset, DataLoader, RetryPolicy

features = np.random.default_rng(0).normal(size=(256, 8)).astype(np.float32)
labels = np.arange(256) % 10
dataset = ArrayDataset(features, labels)
keys = [f"images/{i:05d}.bin" for i in range(256)]
steps = []


class ObjectStore:
    """An async object-store client: each read awaits, then returns the object's bytes."""

    async def get(self, key):
        await asyncio.sleep(0.001)
        return key.encode()


store = ObjectStore()


def decode(data):
    return np.frombuffer(data, np.uint8)


def train_step(*batch):
    steps.append(len(batch[0]))


async def serve(batch):
    steps.append(len(batch))


def save(text):
    global saved
    saved = text


class Images:  # what the async-service snippet defines, for the snippets after it
    async def __getitem__(self, i):
        return decode(await store.get(keys[i]))

    def __len__(self):
        return len(keys)


remote_images = Images()
'''

RUNNER = """
import ast, asyncio, inspect, sys
path = sys.argv[1]
with open(path) as file:
    code = compile(file.read(), path, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
namespace = {"__name__": "__main__"}
result = eval(code, namespace)
if inspect.iscoroutine(result):
    asyncio.run(result)
print("batches consumed:", len(namespace["steps"]))
"""


def test_the_readme_has_python_snippets() -> None:
    assert len(BLOCKS) >= 5


@pytest.mark.timeout(60)
@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_snippet_runs(index: int, tmp_path: Path) -> None:
    block = BLOCKS[index]
    script = tmp_path / f"readme_block_{index}.py"
    script.write_text(PREAMBLE + "\n# -- the README's snippet --\n" + block)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    result = subprocess.run(
        [sys.executable, "-c", RUNNER, str(script)],
        capture_output=True,
        text=True,
        timeout=50,
        cwd=tmp_path,
        env=env,
        check=False,
    )
    assert result.returncode == 0, f"README snippet {index}:\n{block}\n{result.stderr}"
    if "for " in block:  # a snippet with a loop consumed the loader's batches
        consumed = int(result.stdout.rsplit(":", 1)[1])
        assert consumed > 0, f"README snippet {index} consumed nothing:\n{block}"
