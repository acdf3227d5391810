"""DistributedSampler: one replica's (rank's) share of a dataset, as torch's.

The ranks and the world size default to ``torch.distributed``'s when its default process group
is initialised (as torch's sampler reads them), else to the ``RANK`` and ``WORLD_SIZE``
environment variables (as ``torchrun`` sets them; see :mod:`aioload.ranks`); the shuffle is
torch's permutation from ``seed + epoch`` (the same keys as torch's, with or without torch), the
same on every replica. Its checkpoints come from :class:`~aioload.samplers.state.ResumableSampler`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sized
from typing import Any, Generic, TypeVar

import numpy as np

from aioload.checks import is_integral
from aioload.ranks import launcher_rank, launcher_world_size
from aioload.samplers.draws import seeded_randperm
from aioload.samplers.state import ResumableSampler, SamplerIteration, state_count

__all__ = ["DistributedSampler"]

T_co = TypeVar("T_co", covariant=True)


class DistributedSampler(ResumableSampler, Generic[T_co]):
    """Restrict sampling to the share of the dataset that belongs to one replica (rank).

    Each of ``num_replicas`` replicas gets an equal number of indices; together they cover the
    dataset. Without ``drop_last`` the index list is padded by repeating indices from its start
    until it divides evenly; with ``drop_last`` its tail is dropped instead. With ``shuffle``
    the order is torch's permutation seeded by ``seed + epoch`` (``torch.randperm`` from
    ``torch.Generator().manual_seed(seed + epoch)``, replayed with numpy where torch is not
    imported): identical on every replica and to torch's, and different each epoch once
    :meth:`set_epoch` is called before each epoch.

    Its state (see :meth:`state_dict`) adds ``"epoch"`` (as set by :meth:`set_epoch`) and
    ``"iteration_epoch"``, the epoch the iteration in progress shuffles with (``None`` between
    iterations).

    As torch's, the class is generic (``DistributedSampler[int]`` in annotations); it yields
    the dataset's int indices.

    Args:
        dataset: the dataset (anything with ``__len__``), of constant size.
        num_replicas: number of replicas. Default: ``torch.distributed.get_world_size()``
            when torch's default process group is initialised, else the ``WORLD_SIZE``
            environment variable (as set by ``torchrun``).
        rank: this replica's rank in ``[0, num_replicas - 1]``. Default:
            ``torch.distributed.get_rank()`` likewise, else the ``RANK`` environment
            variable.
        shuffle: shuffle the indices. Default: ``True``.
        seed: shuffling seed, the same on every replica. Default: ``0``.
        drop_last: drop the tail instead of padding. Default: ``False``.

    Example:
        >>> [list(DistributedSampler(range(5), 2, r, shuffle=False)) for r in (0, 1)]
        [[0, 2, 4], [1, 3, 0]]
        >>> sampler = DistributedSampler(range(5), num_replicas=2, rank=0)
        >>> for epoch in range(3):
        ...     sampler.set_epoch(epoch)
        ...     keys = list(sampler)
    """

    def __init__(
        self,
        dataset: Sized,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        num_replicas = _given_or_launched("num_replicas", num_replicas, "WORLD_SIZE")
        rank = _given_or_launched("rank", rank, "RANK")
        if num_replicas <= 0:
            raise ValueError(
                f"num_replicas should be a positive integer value, but got "
                f"num_replicas={num_replicas}"
            )
        if rank >= num_replicas or rank < 0:
            raise ValueError(
                f"Invalid rank {rank}, rank should be in the interval [0, {num_replicas - 1}]"
            )
        if not isinstance(shuffle, bool):
            raise TypeError(f"shuffle should be a boolean value, but got shuffle={shuffle!r}")
        if not isinstance(drop_last, bool):
            raise TypeError(f"drop_last should be a boolean value, but got drop_last={drop_last!r}")
        self.dataset = dataset
        self.num_replicas = num_replicas
        self.rank = rank
        self.shuffle = shuffle
        self.seed = _non_negative_int("seed", seed)
        self.drop_last = drop_last
        self.epoch = 0
        n = len(dataset)
        if drop_last:
            self.num_samples = n // num_replicas
        else:
            self.num_samples = math.ceil(n / num_replicas)
        self.total_size = self.num_samples * num_replicas

    _state_type = "DistributedSampler"
    _state_version = 2  # 2: torch's shuffle (1 shuffled with numpy)

    def _begin(self) -> SamplerIteration:
        return SamplerIteration(self.epoch)

    def _keys(self, iteration: SamplerIteration) -> Iterator[int]:
        n = len(self.dataset)
        if self.shuffle:
            # torch's order: randperm from torch.Generator().manual_seed(seed + epoch).
            indices = np.asarray(seeded_randperm(self.seed + iteration.start, n), dtype=np.int64)
        else:
            indices = np.arange(n)
        # ``np.resize`` repeats the array cyclically (padding) or cuts it (drop_last).
        indices = np.resize(indices, self.total_size)
        mine = indices[self.rank :: self.num_replicas][iteration.position :]
        return iteration.track([mine.tolist()])

    def _state_fields(self, iteration: SamplerIteration | None) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "iteration_epoch": None if iteration is None else iteration.start,
        }

    def _load_fields(self, state: Mapping[str, Any], in_progress: bool) -> Any:
        epoch = state_count(state, self._state_type, "epoch")
        if not in_progress:
            self.epoch = epoch
            return None
        if state.get("iteration_epoch") is None:
            raise ValueError(
                "DistributedSampler state is in progress but has no 'iteration_epoch' (the "
                "epoch its iteration shuffles with)"
            )
        iteration_epoch = state_count(state, self._state_type, "iteration_epoch")
        self.epoch = epoch
        return iteration_epoch

    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch, which seeds the shuffle together with ``seed``.

        Call it at the start of every epoch, before iterating, on every replica; otherwise
        each epoch repeats the same order.

        Args:
            epoch: the epoch number, a non-negative integer.
        """
        self.epoch = _non_negative_int("epoch", epoch)


def _non_negative_int(name: str, value: object) -> int:
    if not is_integral(value):
        raise TypeError(f"{name} should be an integer, but got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} should be a non-negative integer, but got {name}={value}")
    return int(value)


def _given_or_launched(name: str, value: object, variable: str) -> int:
    """``value``, else what the launcher set up (torch.distributed, else ``variable``)."""
    if value is None:
        launched = launcher_rank() if variable == "RANK" else launcher_world_size()
        if launched is None:
            raise ValueError(
                f"{name} was not given and the {variable} environment variable is not set "
                f"(nor is torch.distributed initialised); pass {name}= explicitly, set "
                f"{variable} (torchrun sets it) or call torch.distributed.init_process_group "
                "first"
            )
        return launched
    if not is_integral(value):
        raise TypeError(f"{name} should be an integer, but got {type(value).__name__}")
    return int(value)
