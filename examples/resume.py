"""Interrupt a training run in the middle of an epoch and resume it from a checkpoint.

The first run checkpoints every few steps — the "model" (here: the list of sample ids it has
trained on) together with ``loader.state_dict()`` as JSON in a file — and is preempted in the
middle of its first epoch. The second run builds the same loader, loads the checkpoint and
finishes the epoch. The check at the end: the samples the model saw (those of the checkpoint,
then those of the resumed run) are the epoch's exactly once, in the order an uninterrupted run
would have seen them; the next epoch is reshuffled exactly as it would have been.

Run: ``python examples/resume.py [--workers N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import numpy as np

from aioload import ArrayDataset, DataLoader

SAMPLES = 1_000
BATCH = 32
CHECKPOINT_EVERY = 5  # steps
PREEMPTED_AT = 17  # the step during which the first run is killed


class Preempted(Exception):
    """Stands in for the machine going away (SIGTERM, a spot instance reclaimed)."""


def make_loader(workers: int) -> DataLoader:
    ids = np.arange(SAMPLES)
    features = np.random.default_rng(0).random((SAMPLES, 8), dtype=np.float32)
    dataset = ArrayDataset(features, ids)
    # A checkpoint resumes a loader built with the same dataset and arguments.
    return DataLoader(dataset, batch_size=BATCH, shuffle=True, generator=0, num_workers=workers)


def save(path: Path, seen: list[int], loader: DataLoader) -> None:
    """Writes the checkpoint atomically: a crash while writing keeps the previous one."""
    partial = path.with_suffix(".tmp")
    partial.write_text(json.dumps({"model": seen, "loader": loader.state_dict()}))
    os.replace(partial, path)


def first_run(path: Path, workers: int) -> None:
    seen: list[int] = []  # the "model": what it has been trained on
    loader = make_loader(workers)
    try:
        for step, (_features, ids) in enumerate(loader):
            if step == PREEMPTED_AT:
                raise Preempted(f"preempted at step {step}")
            seen += ids.tolist()  # the training step
            if (step + 1) % CHECKPOINT_EVERY == 0:
                save(path, seen, loader)
    except Preempted as why:
        checkpoint = json.loads(path.read_text())
        print(
            f"first run: {why}, after {len(seen)} samples; the last checkpoint holds "
            f"{len(checkpoint['model'])} samples (batch {checkpoint['loader']['batches']})"
        )


def resumed_run(path: Path, workers: int) -> list[int]:
    checkpoint = json.loads(path.read_text())
    seen: list[int] = checkpoint["model"]
    loader = make_loader(workers)
    loader.load_state_dict(checkpoint["loader"])
    before = len(seen)
    for _features, ids in loader:  # the rest of the interrupted epoch
        seen += ids.tolist()
    print(f"resumed run: {len(seen) - before} more samples, {len(seen)} in the epoch")
    next_epoch = [i for _features, ids in loader for i in ids.tolist()]
    return seen + next_epoch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=0, help="num_workers (default 0)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "checkpoint.json"
        first_run(path, args.workers)
        print(f"checkpoint: {path.stat().st_size} bytes of JSON")
        resumed = resumed_run(path, args.workers)

    uninterrupted = make_loader(args.workers)
    expected = [i for _epoch in range(2) for _x, ids in uninterrupted for i in ids.tolist()]
    epoch = resumed[:SAMPLES]
    if sorted(epoch) != list(range(SAMPLES)):
        raise SystemExit("FAILED: the resumed epoch is not every sample exactly once")
    if resumed != expected:
        raise SystemExit("FAILED: the resumed run differs from an uninterrupted one")
    print(
        f"ok: every one of the {SAMPLES} samples exactly once, in the uninterrupted run's "
        "order, and the next epoch reshuffled as the uninterrupted run's"
    )


if __name__ == "__main__":
    main()
