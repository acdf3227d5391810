"""DistributedSampler pads and drops as torch's does, with and without a shuffle.

torch's rule, for ``n`` keys over ``replicas`` ranks: take the epoch's order (the keys in
order, or a permutation seeded by ``seed + epoch``), pad it to ``total_size`` by repeating
its own first keys (cyclically, when the padding is longer than the order), or with
``drop_last`` cut it to ``total_size``; rank ``r`` takes every ``replicas``-th key from ``r``.
So the ranks' keys, interleaved back, are the order followed by its own head. The shuffled
permutation is not torch's (aioload draws it with numpy), but the padding rule is, and each
case below is checked on aioload's sampler and, where torch is installed, on torch's.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import pytest

from aioload import DistributedSampler

SIZES = [1, 2, 5, 7, 10, 13]
REPLICAS = [1, 2, 3, 4, 8]
SEEDS = [0, 3]
EPOCHS = [0, 2]

Make = Callable[..., Any]


def torch_sampler() -> Make:
    torch = pytest.importorskip("torch")
    sampler: Make = torch.utils.data.DistributedSampler
    return sampler


def ranks_keys(make: Make, n: int, replicas: int, epoch: int, **kwargs: Any) -> list[list[int]]:
    """Every rank's keys for the epoch."""
    parts = []
    for rank in range(replicas):
        sampler = make(range(n), num_replicas=replicas, rank=rank, **kwargs)
        sampler.set_epoch(epoch)
        keys = [int(key) for key in sampler]
        assert len(keys) == len(sampler)
        parts.append(keys)
    return parts


def interleaved(parts: list[list[int]]) -> list[int]:
    """The global order the ranks took their keys from (rank ``r`` took every r-th key)."""
    assert len({len(part) for part in parts}) == 1, "the ranks got unequal shares"
    return [key for keys in zip(*parts, strict=True) for key in keys]


def check_torch_rule(
    make: Make, n: int, replicas: int, shuffle: bool, seed: int, epoch: int
) -> list[int]:
    """The padded and the cut global orders follow torch's rule; returns the padded one."""
    padded = interleaved(ranks_keys(make, n, replicas, epoch, shuffle=shuffle, seed=seed))
    total = math.ceil(n / replicas) * replicas
    assert len(padded) == total
    order = padded[:n]
    if shuffle:
        assert sorted(order) == list(range(n))  # a permutation of every key
    else:
        assert order == list(range(n))
    # The padding repeats the order's own head, cyclically: the first keys of the
    # (shuffled) order, not keys 0, 1, ... of the dataset.
    assert padded[n:] == list(itertools.islice(itertools.cycle(order), total - n))

    cut = interleaved(
        ranks_keys(make, n, replicas, epoch, shuffle=shuffle, seed=seed, drop_last=True)
    )
    # drop_last cuts the same order (the same permutation for the same seed and epoch).
    assert cut == order[: n // replicas * replicas]
    return padded


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("replicas", REPLICAS)
@pytest.mark.parametrize("n", SIZES)
def test_padding_repeats_the_head_of_the_epoch_order(n: int, replicas: int, shuffle: bool) -> None:
    for seed, epoch in itertools.product(SEEDS, EPOCHS):
        check_torch_rule(DistributedSampler, n, replicas, shuffle, seed, epoch)


def test_the_shuffled_order_depends_on_seed_plus_epoch() -> None:
    # 13 keys over 4 ranks: 3 keys of padding, taken from the shuffled head.
    first = check_torch_rule(DistributedSampler, 13, 4, True, seed=1, epoch=2)
    assert first[:13] != list(range(13))  # shuffled, so the padding is not keys 0, 1, 2
    assert check_torch_rule(DistributedSampler, 13, 4, True, seed=3, epoch=0) == first
    assert check_torch_rule(DistributedSampler, 13, 4, True, seed=1, epoch=3) != first


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("replicas", REPLICAS)
@pytest.mark.parametrize("n", SIZES)
def test_torch_follows_the_same_rule(n: int, replicas: int, shuffle: bool) -> None:
    # The rule the test above holds aioload to is torch's own.
    make = torch_sampler()
    for seed, epoch in itertools.product(SEEDS, EPOCHS):
        check_torch_rule(make, n, replicas, shuffle, seed, epoch)


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("replicas", REPLICAS)
@pytest.mark.parametrize("n", SIZES)
def test_same_keys_and_lengths_as_torch(n: int, replicas: int, drop_last: bool) -> None:
    make = torch_sampler()
    for epoch in EPOCHS:
        # Without a shuffle the keys are torch's, rank for rank.
        kwargs: dict[str, Any] = {"shuffle": False, "drop_last": drop_last}
        ours = ranks_keys(DistributedSampler, n, replicas, epoch, **kwargs)
        assert ours == ranks_keys(make, n, replicas, epoch, **kwargs)
        # With one, each rank's share is as long as torch's.
        kwargs["shuffle"] = True
        ours = ranks_keys(DistributedSampler, n, replicas, epoch, **kwargs)
        assert [len(keys) for keys in ours] == [
            len(keys) for keys in ranks_keys(make, n, replicas, epoch, **kwargs)
        ]
