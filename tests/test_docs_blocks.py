"""The Python blocks of README.md and docs/ run: each one as a script, in a fresh process.

A block uses names it does not define (``dataset``, ``train_step``, ``store``, ...): its page's
preamble (``PREAMBLES``) defines each as the smallest real thing of its kind, and runs before
the block, in a temporary folder; ``SETUPS`` adds what one block needs (a loader stopped
mid-epoch, a rank's environment), ``REWRITES`` points a page's absolute folders into the
temporary one, and ``EXPECTED`` is output a block's comments promise. docs/object-stores.md
reads ``s3://bucket/`` from a SeaweedFS server on 127.0.0.1 (``docs_bucket``) holding the
objects, shards, JSON lines and Parquet files its blocks name. A block with a top-level
``async for`` runs as a notebook cell runs it (compiled with top-level await allowed, on an
asyncio event loop). A block that hands batches to a placeholder sink (``train_step``,
``score``, ...) must have handed it some.

Markers, an HTML comment on the line before a block's fence (the rendered page does not show
it), for what a block cannot do as a script:

- ``<!-- not-run: REASON -->``: the block is not run; its test skips, saying why.
- ``<!-- continues -->``: the block goes on from the page's block before it, and runs after it.

A block that names torch (``import torch``, ``aioload.torch``, ``to_torch``) skips where torch is
not installed, and one that moves tensors to ``"cuda"`` skips where no CUDA device is.
"""

from __future__ import annotations

import ast
import asyncio
import importlib.util
import io
import json
import os
import re
import subprocess
import sys
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow  # a fresh interpreter per block

ROOT = Path(__file__).resolve().parent.parent
PAGES = ["README.md", *sorted(p.relative_to(ROOT).as_posix() for p in ROOT.glob("docs/**/*.md"))]

_FENCE = "```python"
_MARKER = re.compile(r"<!--\s*(?P<kind>not-run|continues)\s*(?::\s*(?P<reason>.*?))?\s*-->")
# Placeholders that record what they are handed, in the preamble's ``steps``.
SINKS = frozenset({"train_step", "score", "serve", "model.step", "wandb.log"})


@dataclass(frozen=True)
class Block:
    """A ```python block of a page."""

    page: str
    line: int  # of its opening fence, counting from 1
    code: str
    not_run: str | None = None  # the marker's reason
    continues: Block | None = None  # the page's block before it, which it goes on from

    @property
    def source(self) -> str:
        """Its code after the code of the blocks it continues."""
        before = self.continues.source if self.continues is not None else ""
        return before + self.code

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def blocks_of(page: str) -> list[Block]:
    """The page's ```python blocks, with their markers."""
    lines = (ROOT / page).read_text().splitlines(keepends=True)
    blocks: list[Block] = []
    for number, line in enumerate(lines):
        if line.rstrip() != _FENCE:
            continue
        end = next(i for i in range(number + 1, len(lines)) if lines[i].rstrip() == "```")
        code = "".join(lines[number + 1 : end])
        above = next((lines[i].strip() for i in range(number - 1, -1, -1) if lines[i].strip()), "")
        marker = _MARKER.fullmatch(above)
        if marker is None and above.startswith("<!--"):
            raise ValueError(f"{page}:{number + 1}: unknown marker {above!r} above the block")
        if marker is None:
            blocks.append(Block(page, number + 1, code))
        elif marker["kind"] == "not-run":
            if not marker["reason"]:
                raise ValueError(f"{page}:{number + 1}: a not-run marker needs a reason")
            blocks.append(Block(page, number + 1, code, not_run=marker["reason"]))
        else:
            if not blocks:
                raise ValueError(f"{page}:{number + 1}: the first block continues nothing")
            blocks.append(Block(page, number + 1, code, continues=blocks[-1]))
    return blocks


BLOCKS = [block for page in PAGES for block in blocks_of(page)]


def names_torch(code: str) -> bool:
    """Whether the code names torch: a module, function or attribute with torch in its name."""
    tokens = tokenize.generate_tokens(io.StringIO(code).readline)
    return any(t.type == tokenize.NAME and "torch" in t.string for t in tokens)


def moves_to_cuda(code: str) -> bool:
    tokens = tokenize.generate_tokens(io.StringIO(code).readline)
    return any(t.type == tokenize.STRING and t.string.strip("\"'") == "cuda" for t in tokens)


def feeds_a_sink(code: str) -> bool:
    """Whether the code calls a sink placeholder outside a def (where the calls run)."""
    pending = list(ast.parse(code).body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        if isinstance(node, ast.Call) and ast.unparse(node.func) in SINKS:
            return True
        pending.extend(ast.iter_child_nodes(node))
    return False


def needs_top_level_await(code: str) -> bool:
    try:
        compile(code, "<block>", "exec")
    except SyntaxError:
        compile(code, "<block>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        return True
    return False


# What every block can use. ``steps``: what the sinks were handed.
COMMON = """
import asyncio
import json
import os

import numpy as np

import aioload
from aioload import ArrayDataset, DataLoader, RetryPolicy

steps = []


def train_step(*batch):
    steps.append(batch)


features = np.random.default_rng(0).normal(size=(256, 8)).astype(np.float32)
labels = np.arange(256) % 10
dataset = ArrayDataset(features, labels)
epochs = 2
"""

# An async object-store client and the async dataset over it, for the async-service blocks.
ASYNC_STORE = '''
keys = [f"images/{i:05d}.bin" for i in range(256)]


class ObjectStore:
    """An async object-store client: each read awaits, then returns the object's bytes."""

    async def get(self, key):
        await asyncio.sleep(0.001)
        return key.encode()


store = client = ObjectStore()


def decode(data):
    return np.frombuffer(data, np.uint8)


async def score(batch):
    steps.append(batch)


class Images:  # an async map-style dataset reading the store
    async def __getitem__(self, i):
        return decode(await store.get(keys[i]))

    def __len__(self):
        return len(keys)


remote_images = Images()
'''

PREAMBLES = {
    "README.md": ASYNC_STORE
    + """
serve = score


def save(text):
    global saved
    saved = text
""",
    "docs/index.md": ASYNC_STORE,
    "docs/migrating.md": """
with open("index.json", "w") as file:
    json.dump([{"path": f"{i:05d}.jpg", "label": i % 10} for i in range(100)], file)
""",
    "docs/observability.md": '''
loader = DataLoader(dataset, batch_size=64)


class Run:
    """A metrics logger's run, as ``wandb.init()`` returns."""

    def log(self, data):
        steps.append(data)


wandb = Run()
''',
    "docs/resilience.md": ASYNC_STORE
    + """
def checkpoint_exists():
    return os.path.exists("checkpoint.json")


def save_checkpoint(model_state, loader_state):
    with open("checkpoint.json", "w") as file:
        json.dump({"model": model_state, "loader": loader_state}, file)


def load_checkpoint():
    with open("checkpoint.json") as file:
        saved = json.load(file)
    return saved["model"], saved["loader"]


class Model:
    def state_dict(self):
        return {"weights": [0.0]}


model = Model()
start_epoch = 0
paths = [f"records/{i:03d}.json" for i in range(8)]


def read(path):
    return path.encode()


def parse(data):
    return {"path": data.decode()}
""",
    "docs/scaling.md": """
os.environ.setdefault("RANK", "0")  # as torchrun sets them
os.environ.setdefault("WORLD_SIZE", "2")
""",
    "docs/guides/async-services.md": ASYNC_STORE,
    "docs/guides/classic-scripts.md": '''
rng = np.random.default_rng(0)
features = rng.normal(size=(512, 20)).astype(np.float32)
labels = (features @ rng.normal(size=20) > 0).astype(np.float32)


class NumpyModel:
    """A linear model with a gradient step in numpy."""

    def __init__(self):
        self.weights = np.zeros(20, np.float32)

    def predict(self, x):
        return x @ self.weights

    def step(self, x, y):
        error = self.predict(x) - y
        self.weights -= 0.01 * x.T @ error / len(x)
        steps.append(len(x))
        return float((error**2).mean())


def evaluate(model, loader):
    return float(np.mean([((model.predict(x) > 0.5) == y).mean() for x, y in loader]))


model = NumpyModel()
loader = DataLoader(ArrayDataset(features, labels), batch_size=64, shuffle=True)
max_steps = 3
''',
}

# docs/object-stores.md reads s3://bucket/ from a local SeaweedFS server (``docs_bucket``).
PREAMBLES["docs/object-stores.md"] = '''
import io

from PIL import Image

from aioload.sources import ObjectDataset, ShardDataset, decode_image, default_decode

options = credentials = same_options = json.loads(os.environ["DOCS_BUCKET_OPTIONS"])
keys = [f"2024-{month:02d}/{i:05d}.jpg" for month in (1, 2) for i in range(16)]  # in images/
urls = [f"s3://bucket/train-{i:06d}.tar" for i in range(100)]
dataset = ShardDataset(urls, decode=default_decode, storage_options=options)
steps_per_epoch = 4


def decode_jpeg(data):
    return decode_image(data)


def label_of(data):
    return len(data) % 10


def encode_jpeg(image):
    out = io.BytesIO()
    Image.fromarray(image).save(out, "JPEG")
    return out.getvalue()


samples = [(np.full((8, 8, 3), i, np.uint8), i % 10) for i in range(24)]


async def fetch(key):
    await asyncio.sleep(0.001)
    return {"key": key}


url = "https://catalogue.example/items"  # never read: CatalogueKeys counts


class CatalogueKeys:
    """A catalogue's keys, an async iterable (as a paginated listing is)."""

    def __init__(self, url):
        self.url = url

    async def __aiter__(self):
        for key in range(100):
            await asyncio.sleep(0)
            yield key


class ShuffledKeys:
    """The keys of an async iterable, collected, in an order drawn from ``generator``."""

    def __init__(self, keys, generator):
        self.keys, self.generator = keys, generator

    async def __aiter__(self):
        collected = [key async for key in self.keys]
        for i in self.generator.permutation(len(collected)):
            yield collected[i]
'''

# docs/migrating-from.md reads the same bucket (its image shards: imagenet/train-*.tar).
PREAMBLES["docs/migrating-from.md"] = """
options = json.loads(os.environ["DOCS_BUCKET_OPTIONS"])
"""
BUCKET_PAGES = {"docs/object-stores.md", "docs/migrating-from.md"}

# What runs before a block holding the key (after its page's preamble).
SETUPS = {
    "# 3 ranks over shards of 17, 3, 25, 1, 11, 8 and 14 samples": """
os.environ.update(RANK="1", WORLD_SIZE="3")  # as torchrun sets them
""",
    "saved = json.dumps(loader.state_dict())            # mid-epoch": """
loader = DataLoader(ShardDataset(urls, storage_options=same_options), batch_size=32, num_workers=2)
batches = iter(loader)
next(batches)
batches.close()  # the run that saved the state (the state stays mid-epoch)
""",
    "retry=RetryPolicy(attempts=3, retry_on=is_transient)": """
dataset = ObjectDataset(
    "s3://bucket/images/", keys=keys, decode=decode_jpeg, storage_options=options
)
""",
    'states = [json.load(open(f"ckpt-rank{r}.json")) for r in range(old_world_size)]': """
old_world_size = 2
for r in range(old_world_size):
    old = ShardDataset(urls, rank=r, world_size=old_world_size, storage_options=options)
    old_loader = DataLoader(old, batch_size=32)
    for _ in zip(range(3), old_loader):
        pass
    with open(f"ckpt-rank{r}.json", "w") as file:
        json.dump(old_loader.state_dict(), file)
dataset = ShardDataset(urls, storage_options=options)  # rank 0 of 1, the new job
loader = DataLoader(dataset, batch_size=32)
""",
}

# Strings replaced in a page's blocks: their folders, in the block's temporary folder.
REWRITES = {"docs/object-stores.md": {'"/scratch/': '"scratch/'}}


def write_bucket(folder: Path) -> None:
    """What docs/object-stores.md and docs/migrating-from.md read from s3://bucket/, as files
    under ``folder``."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard
    from PIL import Image

    from aioload.sources import ShardWriter

    for month in (1, 2):
        (folder / f"images/2024-{month:02d}").mkdir(parents=True)
        for i in range(16):
            out = io.BytesIO()
            Image.new("RGB", (8, 8), (16 * i, 100 * month, 0)).save(out, "JPEG")
            (folder / f"images/2024-{month:02d}/{i:05d}.jpg").write_bytes(out.getvalue())

    def shards(pattern: str, counts: list[int], *, index: bool = True) -> None:
        for number, count in enumerate(counts):
            with ShardWriter(str(folder / pattern), count, start_shard=number, index=index) as w:
                for i in range(count):
                    w.write({"__key__": f"{number:04d}{i:04d}", "cls": i % 10, "txt": "x" * i})

    # train-000000..000099 hold 20 samples each (indexes()[17].byte_range(10, 20)), and
    # train-000100..000999 (the cache's block) one each
    shards("train-%06d.tar", [20] * 100 + [1] * 900)
    shards("part-%03d.tar", [17, 3, 25, 1, 11, 8, 14])
    shards("web-%04d.tar", [2] * 1000, index=False)
    shards("books-%03d.tar", [2] * 100, index=False)
    shards("code-%03d.tar", [2] * 200, index=False)
    for number in range(100):
        lines = "".join(json.dumps({"text": f"{number}-{i}"}) + "\n" for i in range(10))
        data = zstandard.ZstdCompressor().compress(lines.encode())
        (folder / f"chat-{number:04d}.jsonl.zst").write_bytes(data)
    # docs/migrating-from.md: 8 image shards of 16 samples, an 8x8 JPEG and its class each
    (folder / "imagenet").mkdir()
    for number in range(8):
        pattern = str(folder / "imagenet/train-%06d.tar")
        with ShardWriter(pattern, 16, start_shard=number) as writer:
            for i in range(16):
                out = io.BytesIO()
                Image.new("RGB", (8, 8), (16 * i, 30 * number, 0)).save(out, "JPEG")
                writer.write({"__key__": f"{number:04d}{i:04d}", "jpg": out.getvalue(), "cls": i})
    (folder / "table").mkdir()
    for number in range(2):
        rows = range(500 * number, 500 * (number + 1))
        table = pa.table({"text": [f"row {i}" for i in rows], "label": [i % 10 for i in rows]})
        pq.write_table(table, folder / f"table/part-{number}.parquet", row_group_size=100)


async def upload(folder: Path, options: dict[str, Any]) -> None:
    import obstore

    from aioload.sources import open_store

    store, _ = open_store("s3://bucket/", storage_options=options)
    slots = asyncio.Semaphore(64)

    async def put(path: Path) -> None:
        async with slots:
            await obstore.put_async(store, path.relative_to(folder).as_posix(), path.read_bytes())

    await asyncio.gather(*(put(path) for path in folder.rglob("*") if path.is_file()))


@pytest.fixture(scope="module")
def docs_bucket(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The store options of a SeaweedFS server whose bucket "bucket" holds the page's data."""
    from aioload.testing import SeaweedFS

    folder = tmp_path_factory.mktemp("bucket")
    write_bucket(folder)
    with SeaweedFS(bucket="bucket") as s3:
        asyncio.run(upload(folder, s3.storage_options))
        yield s3.storage_options


# Defined for a block that names torch (after the page's preamble).
TORCH_PREAMBLES = {
    "docs/migrating.md": """
import torch
import torch.nn.functional as F

model = torch.nn.Linear(8, 10)
""",
    "docs/guides/classic-scripts.md": """
import torch

model = torch.nn.Linear(20, 1)
optimiser = torch.optim.SGD(model.parameters(), lr=0.1)
loss_fn = torch.nn.MSELoss()
train = DataLoader(ArrayDataset(features, labels), batch_size=64, shuffle=True)
""",
}

# What the output of a block holding the key must hold.
EXPECTED = {
    "print(len(dataset), len(loader))   # 27 7 on every rank": "27 7",
    'print(f"data-bound {loader.stats().epoch.stall_fraction:.0%} of the epoch")': "data-bound",
}

# Runs its arguments, files of code, as notebook cells: one after the other in __main__, each
# compiled with top-level await allowed, a cell that awaits on an asyncio event loop.
RUNNER = """
import ast, asyncio, inspect, sys
namespace = sys.modules["__main__"].__dict__
for path in sys.argv[1:]:
    with open(path) as file:
        code = compile(file.read(), path, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    result = eval(code, namespace)
    if inspect.iscoroutine(result):
        asyncio.run(result)
print("batches consumed:", len(namespace["steps"]))
"""


def rewritten(block: Block) -> str:
    code = block.code
    for old, new in REWRITES.get(block.page, {}).items():
        code = code.replace(old, new)
    return f"# -- {block} --\n{code}"


def test_the_pages_have_python_blocks() -> None:
    assert len([b for b in BLOCKS if b.page == "README.md"]) >= 5
    assert len([b for b in BLOCKS if b.page.startswith("docs/")]) >= 40
    assert all(page in PAGES for page in [*PREAMBLES, *TORCH_PREAMBLES, *REWRITES])
    for key in [*EXPECTED, *SETUPS]:  # each still names a block
        assert any(key in block.code for block in BLOCKS), key


@pytest.mark.timeout(120)
@pytest.mark.parametrize("block", BLOCKS, ids=str)
def test_block_runs(block: Block, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    if block.not_run is not None:
        pytest.skip(f"not run: {block.not_run}")
    source = block.source
    preamble = COMMON + PREAMBLES.get(block.page, "")
    preamble += "".join(setup for key, setup in SETUPS.items() if key in block.code)
    if names_torch(source):
        if importlib.util.find_spec("torch") is None:  # the message importorskip gives
            pytest.skip("the block needs torch: No module named 'torch'")
        preamble += TORCH_PREAMBLES.get(block.page, "")
    if moves_to_cuda(source):
        # no NVIDIA driver, no CUDA device: known without importing torch
        torch = pytest.importorskip("torch") if Path("/dev/nvidiactl").exists() else None
        if torch is None or not torch.cuda.is_available():
            pytest.skip('the block moves tensors to "cuda", and there is no CUDA device')
    chain = [block]  # the blocks it continues, then itself
    while chain[0].continues is not None:
        chain.insert(0, chain[0].continues)
    cells = [preamble, *(rewritten(b) for b in chain)]
    if any(needs_top_level_await(cell) for cell in cells):
        paths = [tmp_path / f"cell_{i}.py" for i in range(len(cells))]
        for path, cell in zip(paths, cells, strict=True):
            path.write_text(cell)
        command = [sys.executable, "-c", RUNNER, *map(str, paths)]
    else:  # a script, as users run it (its workers may run it again, as __mp_main__)
        script = tmp_path / "block.py"
        script.write_text("".join(cells) + '\nprint("batches consumed:", len(steps))\n')
        command = [sys.executable, str(script)]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    if block.page in BUCKET_PAGES:
        env["DOCS_BUCKET_OPTIONS"] = json.dumps(request.getfixturevalue("docs_bucket"))
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=100, cwd=tmp_path, env=env, check=False
    )
    assert result.returncode == 0, f"{block}:\n{source}\n{result.stdout}\n{result.stderr}"
    if feeds_a_sink(source):
        consumed = int(result.stdout.rsplit(":", 1)[1])
        assert consumed > 0, f"{block} handed its sink nothing:\n{source}"
    for key, text in EXPECTED.items():
        if key in block.code:
            assert text in result.stdout, f"{block} did not print {text!r}:\n{result.stdout}"
