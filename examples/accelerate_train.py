"""Hugging Face Accelerate: a training loop on an aioload loader, checkpointed mid-epoch.

``accelerator.prepare`` wraps torch's own ``DataLoader`` only; an aioload loader is used as
it is, next to the prepared model and optimizer:

- **ranks**: under ``accelerate launch`` each process reads its share through a
  ``DistributedSampler(dataset, num_replicas=accelerator.num_processes,
  rank=accelerator.process_index)`` (a stream dataset such as ``ShardDataset`` splits
  itself by rank, from the environment ``accelerate launch`` sets);
- **devices**: batches come as CPU tensors (``aioload.torch.DataLoader``); move them with
  ``.to(accelerator.device)`` (``pin_memory=True`` makes that copy asynchronous on a GPU);
- **checkpoints**: ``accelerator.register_for_checkpointing(loader)`` makes
  ``accelerator.save_state()`` store ``loader.state_dict()`` with the model, the optimizer
  and the random states, and ``accelerator.load_state()`` give it back to the new loader's
  ``load_state_dict``: the resumed loader yields exactly the batches not yet trained on.
  Accelerate writes these states from the main process only, and every process loads that
  one: right for a loader over a ``DistributedSampler``, whose state is the same on every
  rank (the epoch and the batches received). A stream dataset's state (``ShardDataset``,
  ``JsonLinesDataset``, ...) is each rank's own: write ``loader.state_dict()`` per process
  instead (``f"loader-{accelerator.process_index}.json"``).

The first run saves a state every few steps and is killed in the middle of its first epoch;
the second builds the same objects, loads the last state and finishes. The check at the end:
the samples trained on are an uninterrupted run's, in its order, and so are the weights.

Run: ``python examples/accelerate_train.py [--workers N]`` (``pip install torch
accelerate``; one process, on the CPU). Under ``accelerate launch`` on several devices the
same code gives each process its share through the sampler, and each process saves and
loads its own loader state.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from accelerate import Accelerator

from aioload.torch import ArrayDataset, DataLoader, DistributedSampler

SAMPLES = 320
BATCH = 32  # 10 steps an epoch on one process
EPOCHS = 2
CHECKPOINT_EVERY = 4  # steps
PREEMPTED_AT = 7  # the step during which the first run is killed


class Preempted(Exception):
    """Stands in for the machine going away (SIGTERM, a spot instance reclaimed)."""


class Progress:
    """What the loop itself must remember: the epoch, the step, the samples trained on."""

    def __init__(self) -> None:
        self.epoch = self.step = 0
        self.seen: list[int] = []

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "step": self.step, "seen": list(self.seen)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.step, self.seen = state["epoch"], state["step"], list(state["seen"])


def train(
    accelerator: Accelerator,
    workers: int,
    folder: Path,
    *,
    resume: bool = False,
    stop_at: int | None = None,
) -> tuple[Progress, torch.nn.Linear]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(SAMPLES, 8)).astype(np.float32)
    y = (x @ rng.normal(size=8)).astype(np.float32)
    dataset = ArrayDataset(x, y, np.arange(SAMPLES))
    sampler: DistributedSampler[Any] = DistributedSampler(
        dataset, num_replicas=accelerator.num_processes, rank=accelerator.process_index, seed=0
    )
    loader: DataLoader[Any] = DataLoader(
        dataset, batch_size=BATCH, sampler=sampler, num_workers=workers
    )
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    progress = Progress()
    accelerator.register_for_checkpointing(loader, progress)
    if resume:
        accelerator.load_state(folder)  # the loader continues where the state was saved

    for epoch in range(progress.epoch, EPOCHS):
        progress.epoch = epoch
        sampler.set_epoch(epoch)
        for features, targets, ids in loader:
            if progress.step == stop_at:
                raise Preempted(f"preempted at step {stop_at}")
            features = features.to(accelerator.device)
            targets = targets.to(accelerator.device)
            loss = torch.nn.functional.mse_loss(model(features).squeeze(1), targets)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            progress.seen += ids.tolist()
            progress.step += 1
            if progress.step % CHECKPOINT_EVERY == 0:
                accelerator.save_state(folder)  # the loader's state_dict among the rest
    progress.epoch = EPOCHS
    return progress, accelerator.unwrap_model(model)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=0, help="num_workers (default 0)")
    args = parser.parse_args()
    logging.getLogger("accelerate").setLevel(logging.ERROR)

    with tempfile.TemporaryDirectory() as folder:
        state = Path(folder) / "state"
        try:
            train(Accelerator(), args.workers, state, stop_at=PREEMPTED_AT)
        except Preempted as why:
            saved = torch.load(state / "custom_checkpoint_1.pkl", weights_only=False)
            print(f"first run: {why}; the last state holds {len(saved['seen'])} samples")
        resumed, model = train(Accelerator(), args.workers, state, resume=True)
        reference, reference_model = train(Accelerator(), args.workers, Path(folder) / "other")

    print(f"resumed run: {len(resumed.seen)} samples in all, {EPOCHS} epochs")
    per_epoch = len(reference.seen) // EPOCHS
    if sorted(resumed.seen[:per_epoch]) != sorted(reference.seen[:per_epoch]):
        raise SystemExit("FAILED: the resumed epoch is not every sample exactly once")
    if resumed.seen != reference.seen:
        raise SystemExit(
            "FAILED: the resumed run trained on other samples than an uninterrupted one"
        )
    if not torch.equal(model.weight, reference_model.weight):
        raise SystemExit("FAILED: the resumed run's weights differ from an uninterrupted run's")
    print(
        f"ok: every one of the {per_epoch} samples of this process exactly once per epoch, in "
        "the uninterrupted run's order, and the same weights"
    )


if __name__ == "__main__":
    main()
