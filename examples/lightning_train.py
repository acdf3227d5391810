"""PyTorch Lightning: ``Trainer.fit`` on an aioload loader, preempted mid-epoch and resumed.

Lightning checkpoints a training loader's position itself when the loader has ``state_dict``
and ``load_state_dict`` (its "stateful dataloader" support): every checkpoint holds
``loader.state_dict()`` under ``"loops"``, and ``trainer.fit(..., ckpt_path=...)`` hands it to
the new loader's ``load_state_dict`` before the first batch. An ``aioload.torch.DataLoader``
has both, so a run resumed from a mid-epoch checkpoint trains on exactly the batches the
interrupted run had not yet trained on, in the same order, and then on the same reshuffled
epochs — nothing is repeated, nothing skipped.

The first run checkpoints every few steps (``ModelCheckpoint(every_n_train_steps=...)``) and
is killed in the middle of its first epoch. The second builds the same model and loader and
calls ``trainer.fit(model, loader, ckpt_path=...)`` with the last checkpoint. The check at the
end: the samples trained on (those of the checkpoint, then those of the resumed run) are an
uninterrupted run's, in its order, and the weights are an uninterrupted run's, bit for bit.

What to keep in mind with Lightning:

- Give the loader a length (a map-style dataset, or a ``ShardDataset`` split by samples):
  for a loader without one, Lightning fetches one batch ahead to know which batch is the
  last, so a checkpoint's loader state is one batch further on than the model and that
  batch is never trained on after a resume.
- Lightning hands the states to the loaders of ``train_dataloader()`` (or the loader
  passed to ``fit``) in the order they were saved: build the same loaders on resume.
- Every ``iter(loader)`` is a new epoch, which is how Lightning iterates: one ``iter`` per
  epoch; with ``shuffle=True`` and a ``generator`` seed each epoch is reshuffled the same
  way in the resumed run. Lightning also calls ``iter(loader)`` once before training, to
  check that the loader is iterable, and drops it: aioload counts that as an epoch begun,
  so the epochs Lightning trains on are the loader's second, third, ... (the same in the
  resumed run: the checkpoint below says epoch 1).
- Reading ``self.trainer.estimated_stepping_batches`` in ``configure_optimizers`` (for
  ``OneCycleLR``, say) makes Lightning 2.6 drop the loader states of the checkpoint
  (Lightning-AI/pytorch-lightning#20550): the resumed epoch then starts over. Compute the
  total from ``len(loader)`` and ``max_epochs`` instead.

Run: ``python examples/lightning_train.py [--workers N]`` (``pip install torch
pytorch-lightning``; the CPU is enough). With the ``lightning`` package the same code imports
``lightning.pytorch as pl``.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Callback, ModelCheckpoint

from aioload.torch import ArrayDataset, DataLoader

SAMPLES = 320
BATCH = 32  # 10 steps an epoch
EPOCHS = 2
CHECKPOINT_EVERY = 4  # steps
PREEMPTED_AT = 7  # the step during which the first run is killed


class Regression(pl.LightningModule):
    """A linear model that also records the ids of the samples it trained on, in order."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(8, 1)
        self.seen: list[int] = []

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y, ids = batch  # tensors: aioload.torch's loader collates as torch's does
        self.seen += ids.tolist()
        return torch.nn.functional.mse_loss(self.layer(x).squeeze(1), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    # The "model" includes what it has trained on, so that the check below can compare.
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["seen"] = list(self.seen)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.seen = list(checkpoint["seen"])


class Preempted(Exception):
    """Stands in for the machine going away (SIGTERM, a spot instance reclaimed)."""


class PreemptAt(Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_step == self.step:
            raise Preempted(f"preempted at step {self.step}")


def make_loader(workers: int) -> DataLoader[Any]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(SAMPLES, 8)).astype(np.float32)
    y = (x @ rng.normal(size=8)).astype(np.float32)
    dataset = ArrayDataset(x, y, np.arange(SAMPLES))
    # A checkpoint resumes a loader built with the same dataset and arguments.
    return DataLoader(dataset, batch_size=BATCH, shuffle=True, generator=0, num_workers=workers)


def make_trainer(folder: Path, *callbacks: Callback) -> pl.Trainer:
    every = ModelCheckpoint(
        dirpath=folder, filename="{step}", every_n_train_steps=CHECKPOINT_EVERY, save_top_k=-1
    )
    return pl.Trainer(
        max_epochs=EPOCHS,
        accelerator="cpu",
        callbacks=[every, *callbacks],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=folder,
    )


def first_run(folder: Path, workers: int) -> Path:
    model = Regression()
    try:
        make_trainer(folder, PreemptAt(PREEMPTED_AT)).fit(model, make_loader(workers))
    except Preempted as why:
        print(f"first run: {why}, after {len(model.seen)} samples")
    last = max(folder.glob("step=*.ckpt"), key=lambda path: int(path.stem.split("=")[1]))
    checkpoint = torch.load(last, weights_only=False)
    loader_state = checkpoint["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]
    print(
        f"checkpoint {last.name}: {len(checkpoint['seen'])} samples trained on, the loader "
        f"state at batch {loader_state['batches']} of epoch {loader_state['epoch']}"
    )
    return last


def resumed_run(checkpoint: Path, folder: Path, workers: int) -> Regression:
    model = Regression()
    make_trainer(folder).fit(model, make_loader(workers), ckpt_path=checkpoint)
    return model


def uninterrupted_run(folder: Path, workers: int) -> Regression:
    model = Regression()
    make_trainer(folder).fit(model, make_loader(workers))
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=0, help="num_workers (default 0)")
    args = parser.parse_args()
    # Lightning's advice for a CPU run, and its notes on what it found, are not this demo's.
    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module="pytorch_lightning")

    with tempfile.TemporaryDirectory() as folder:
        checkpoint = first_run(Path(folder) / "run", args.workers)
        resumed = resumed_run(checkpoint, Path(folder) / "resumed", args.workers)
        reference = uninterrupted_run(Path(folder) / "reference", args.workers)

    print(f"resumed run: {len(resumed.seen)} samples in all, {EPOCHS} epochs")
    first_epoch = resumed.seen[:SAMPLES]
    if sorted(first_epoch) != list(range(SAMPLES)):
        raise SystemExit("FAILED: the resumed epoch is not every sample exactly once")
    if resumed.seen != reference.seen:
        raise SystemExit(
            "FAILED: the resumed run trained on other samples than an uninterrupted one"
        )
    if not torch.equal(resumed.layer.weight, reference.layer.weight):
        raise SystemExit("FAILED: the resumed run's weights differ from an uninterrupted run's")
    print(
        f"ok: every one of the {SAMPLES} samples exactly once per epoch, in the uninterrupted "
        "run's order, and the same weights"
    )


if __name__ == "__main__":
    main()
