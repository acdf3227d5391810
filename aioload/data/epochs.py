"""The epochs a dataset was given with ``set_epoch``, to give a worker's copy the same.

A stream dataset (and any dataset whose items depend on the epoch) is told the
epoch with ``dataset.set_epoch(epoch)`` before each epoch, in the loader's
process. A worker process holds a copy of the dataset made when it started;
persistent workers keep theirs across epochs, so the loader reads the epochs
here when an epoch starts (:func:`dataset_epochs`) and sends them with the
epoch's start to every worker, which sets them on its copy before the epoch's
work begins (:func:`set_dataset_epochs`).

Which datasets: the loader's dataset and every dataset inside it, found
through torch's wrapper attributes (``.dataset`` of ``Subset``, ``.datasets``
of ``ConcatDataset``, ``ChainDataset`` and ``MixDataset``), that has a callable
``set_epoch`` and an ``epoch`` attribute holding an int — what ``set_epoch``
records (aioload's stream datasets, ``DistributedSampler``'s convention).
Outer datasets come first, so each copy ends with the epoch its original has
(a ``MixDataset`` passes its epoch on to its sources; a source set apart
afterwards keeps its own).
"""

from __future__ import annotations

from typing import Any

from aioload.checks import is_int

__all__ = ["DatasetEpochs", "dataset_epochs", "set_dataset_epochs"]

Step = str | int
"""``"dataset"`` (the ``.dataset`` attribute) or an index into ``.datasets``."""

DatasetEpochs = tuple[tuple[tuple[Step, ...], int], ...]
"""Each dataset's place inside the loader's dataset (its path of steps) and its epoch."""

_MAX_DEPTH = 8  # wrappers nest a few levels deep; a deeper structure is not a wrapper chain


def _epoch_of(dataset: Any) -> int | None:
    if not callable(getattr(dataset, "set_epoch", None)):
        return None
    epoch = getattr(dataset, "epoch", None)
    return epoch if is_int(epoch) else None


def _inner(dataset: Any) -> list[tuple[Step, Any]]:
    inner: list[tuple[Step, Any]] = []
    wrapped = getattr(dataset, "dataset", None)
    if wrapped is not None and wrapped is not dataset:
        inner.append(("dataset", wrapped))
    datasets = getattr(dataset, "datasets", None)
    if isinstance(datasets, list | tuple):
        inner.extend(enumerate(datasets))
    return inner


def dataset_epochs(dataset: Any) -> DatasetEpochs:
    """The epoch of ``dataset`` and of every dataset inside it that has ``set_epoch``.

    Example::

        >>> from aioload import ConcatDataset, Dataset
        >>> class Augmented(Dataset):
        ...     epoch = 0
        ...     def set_epoch(self, epoch): self.epoch = epoch
        ...     def __len__(self): return 4
        ...     def __getitem__(self, index): return index + self.epoch
        >>> first, second = Augmented(), Augmented()
        >>> second.set_epoch(3)
        >>> dataset_epochs(ConcatDataset([first, second]))
        (((0,), 0), ((1,), 3))
    """
    found: list[tuple[tuple[Step, ...], int]] = []
    seen: set[int] = set()

    def visit(node: Any, path: tuple[Step, ...]) -> None:
        if id(node) in seen or len(path) > _MAX_DEPTH:
            return
        seen.add(id(node))
        epoch = _epoch_of(node)
        if epoch is not None:
            found.append((path, epoch))
        for step, inner in _inner(node):
            visit(inner, (*path, step))

    visit(dataset, ())
    return tuple(found)


def set_dataset_epochs(dataset: Any, epochs: DatasetEpochs) -> None:
    """Gives ``dataset`` (a worker's copy) the epochs :func:`dataset_epochs` read from its original.

    Example::

        >>> from aioload import ConcatDataset, Dataset
        >>> class Augmented(Dataset):
        ...     epoch = 0
        ...     def set_epoch(self, epoch): self.epoch = epoch
        ...     def __len__(self): return 4
        ...     def __getitem__(self, index): return index + self.epoch
        >>> copy = ConcatDataset([Augmented(), Augmented()])
        >>> set_dataset_epochs(copy, (((0,), 0), ((1,), 3)))
        >>> copy.datasets[1][0]
        3
    """
    for path, epoch in epochs:
        node = dataset
        for step in path:
            node = node.dataset if step == "dataset" else node.datasets[step]
        node.set_epoch(epoch)
