"""The keys torch gives: samplers, random_split and shuffled loaders against torch itself.

Where the randomness is torch's — a ``torch.Generator``, or ``torch.manual_seed`` with no
generator — every built-in sampler, ``random_split`` and a shuffled ``DataLoader`` must yield
torch's keys, epoch after epoch, drawn when torch draws them (a random sampler's first key, not
``iter()``), leaving the generators where torch leaves them; and a sampler stopped mid-epoch and
resumed from its state must yield the rest of torch's keys.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import textwrap
from collections.abc import Callable
from itertools import islice, product
from typing import Any

import numpy as np
import pytest

import aioload

pytestmark = pytest.mark.slow


@pytest.fixture
def torch() -> Any:
    return pytest.importorskip("torch")


def _data(torch: Any) -> Any:
    return torch.utils.data


def _epochs(sampler: Any, count: int = 3) -> list[list[Any]]:
    return [list(sampler) for _ in range(count)]


def _same_run(torch: Any, make: Callable[[Any, Any], Any], seed: int) -> None:
    """``make(module, generator)`` built from aioload and from torch gives the same epochs, with
    a torch.Generator and with torch.manual_seed, and leaves the generators alike."""
    ours_gen, theirs_gen = torch.Generator(), torch.Generator()
    ours_gen.manual_seed(seed)
    theirs_gen.manual_seed(seed)
    ours, theirs = make(aioload, ours_gen), make(_data(torch), theirs_gen)
    assert _epochs(ours) == _epochs(theirs)
    assert torch.equal(ours_gen.get_state(), theirs_gen.get_state())

    torch.manual_seed(seed)
    ours_keys = _epochs(make(aioload, None))
    after = torch.get_rng_state()
    torch.manual_seed(seed)
    assert ours_keys == _epochs(make(_data(torch), None))
    assert torch.equal(after, torch.get_rng_state())


SEEDS = (0, 1, 42)


@pytest.mark.parametrize("n", [1, 7, 32, 100])
@pytest.mark.parametrize("replacement", [False, True])
def test_random_sampler_gives_torchs_keys(torch: Any, n: int, replacement: bool) -> None:
    for seed, num_samples in product(SEEDS, [None, 1, 31, 32, 33, 3 * n + 1]):
        _same_run(
            torch,
            lambda m, g: m.RandomSampler(range(n), replacement, num_samples, generator=g),  # noqa: B023
            seed,
        )


@pytest.mark.parametrize("indices", [[7], [3, 5, 7, 9], list(range(0, 200, 3))])
def test_subset_random_sampler_gives_torchs_keys(torch: Any, indices: list[int]) -> None:
    for seed in SEEDS:
        _same_run(torch, lambda m, g: m.SubsetRandomSampler(indices, generator=g), seed)


@pytest.mark.parametrize("replacement", [True, False])
@pytest.mark.parametrize("num_samples", [1, 4, 6])
def test_weighted_random_sampler_gives_torchs_keys(
    torch: Any, replacement: bool, num_samples: int
) -> None:
    weights = [0.1, 0.9, 0.4, 0.7, 3.0, 0.6]
    for seed in SEEDS:
        _same_run(
            torch,
            lambda m, g: m.WeightedRandomSampler(weights, num_samples, replacement, generator=g),
            seed,
        )


@pytest.mark.parametrize("drop_last", [False, True])
def test_batch_sampler_over_random_samplers_gives_torchs_batches(
    torch: Any, drop_last: bool
) -> None:
    inner: list[Callable[[Any, Any], Any]] = [
        lambda m, g: m.RandomSampler(range(10), generator=g),
        lambda m, g: m.RandomSampler(range(10), True, 70, generator=g),
        lambda m, g: m.SubsetRandomSampler(range(3, 13), generator=g),
        lambda m, g: m.WeightedRandomSampler([1.0, 2.0, 0.5, 4.0], 9, generator=g),
    ]
    for make, seed in product(inner, SEEDS):
        _same_run(torch, lambda m, g: m.BatchSampler(make(m, g), 3, drop_last), seed)  # noqa: B023


@pytest.mark.parametrize(("n", "replicas"), [(1, 1), (10, 3), (11, 4), (64, 8)])
@pytest.mark.parametrize("drop_last", [False, True])
def test_distributed_sampler_gives_torchs_shares(
    torch: Any, n: int, replicas: int, drop_last: bool
) -> None:
    for seed, rank, epoch in product((0, 7, 2**33 + 5), range(replicas), range(3)):
        ours = aioload.DistributedSampler(range(n), replicas, rank, seed=seed, drop_last=drop_last)
        theirs = _data(torch).DistributedSampler(
            range(n), replicas, rank, seed=seed, drop_last=drop_last
        )
        ours.set_epoch(epoch)
        theirs.set_epoch(epoch)
        assert list(ours) == list(theirs)


def test_distributed_sampler_shuffles_as_torch_without_torch(torch: Any) -> None:
    cases = [(0, 0, 1), (3, 2, 10), (5, 1, 1000), (2**33 + 5, 4, 3001)]
    expected = []
    for seed, epoch, n in cases:
        theirs = _data(torch).DistributedSampler(range(n), 2, 1, seed=seed)
        theirs.set_epoch(epoch)
        expected.append(list(theirs))
    code = textwrap.dedent(
        f"""
        import json, sys
        import aioload
        keys = []
        for seed, epoch, n in {cases!r}:
            sampler = aioload.DistributedSampler(range(n), 2, 1, seed=seed)
            sampler.set_epoch(epoch)
            keys.append(list(sampler))
        assert "torch" not in sys.modules
        print(json.dumps(keys))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=60
    )
    assert json.loads(out.stdout) == expected


@pytest.mark.parametrize(
    "lengths", [[3, 7], [10], [0.5, 0.5], [0.1, 0.2, 0.3, 0.4], [0.33, 0.67], [2, 0, 8]]
)
def test_random_split_gives_torchs_splits(torch: Any, lengths: list[Any]) -> None:
    for seed, n in product(SEEDS, (10, 106)):
        if all(isinstance(x, int) for x in lengths) and sum(lengths) != n:
            continue
        ours_gen = torch.Generator().manual_seed(seed)
        theirs_gen = torch.Generator().manual_seed(seed)
        ours = aioload.random_split(range(n), lengths, generator=ours_gen)
        theirs = _data(torch).random_split(range(n), lengths, generator=theirs_gen)
        assert [s.indices for s in ours] == [s.indices for s in theirs]
        assert torch.equal(ours_gen.get_state(), theirs_gen.get_state())
        torch.manual_seed(seed)
        ours = aioload.random_split(range(n), lengths)
        torch.manual_seed(seed)
        assert [s.indices for s in ours] == [
            s.indices for s in _data(torch).random_split(range(n), lengths)
        ]


def test_the_split_a_torch_script_expects(torch: Any) -> None:
    split = aioload.random_split(range(10), [3, 7], generator=torch.Generator().manual_seed(1))
    reference = _data(torch).random_split(
        range(10), [3, 7], generator=torch.Generator().manual_seed(1)
    )
    assert [list(s) for s in split] == [list(s) for s in reference]


@pytest.mark.parametrize(
    "make",
    [
        lambda m: m.RandomSampler(range(12)),
        lambda m: m.RandomSampler(range(12), replacement=True, num_samples=40),
        lambda m: m.SubsetRandomSampler(range(12)),
        lambda m: m.WeightedRandomSampler([1.0, 2.0, 3.0], 8),
        lambda m: m.BatchSampler(m.RandomSampler(range(12)), 5, False),
    ],
    ids=["random", "replacement", "subset", "weighted", "batches"],
)
def test_a_random_sampler_draws_at_its_first_key_not_at_iter(
    torch: Any, make: Callable[[Any], Any]
) -> None:
    ours, theirs = iter(make(aioload)), iter(make(_data(torch)))
    torch.manual_seed(5)  # after iter(): torch has drawn nothing yet
    ours_keys = list(ours)
    torch.manual_seed(5)
    assert ours_keys == list(theirs)
    # Two iterations open at once, each seeded just before its first key.
    firsts: list[list[Any]] = []
    for sampler in (make(aioload), make(_data(torch))):
        iterators = (iter(sampler), iter(sampler))
        firsts.append([])
        for keys in iterators:
            torch.manual_seed(9)
            firsts[-1].append(next(keys))
    assert firsts[0] == firsts[1] and firsts[0][0] == firsts[0][1]


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("seeded", ["generator", "manual_seed"])
def test_a_shuffled_loader_gives_torchs_batches(torch: Any, num_workers: int, seeded: str) -> None:
    def run(module: Any) -> tuple[list[list[int]], Any]:
        generator = torch.Generator().manual_seed(3) if seeded == "generator" else None
        torch.manual_seed(0)
        loader = module.DataLoader(
            list(range(23)),
            batch_size=4,
            shuffle=True,
            num_workers=num_workers,
            generator=generator,
        )
        epochs = [[int(k) for batch in loader for k in batch] for _ in range(2)]
        return epochs, torch.get_rng_state()

    ours, ours_state = run(aioload)
    theirs, theirs_state = run(_data(torch))
    assert ours == theirs and torch.equal(ours_state, theirs_state)


@pytest.mark.parametrize(
    "make",
    [
        lambda m, g: m.RandomSampler(range(50), generator=g),
        lambda m, g: m.RandomSampler(range(9), True, 100, generator=g),
        lambda m, g: m.RandomSampler(range(9), False, 31, generator=g),
        lambda m, g: m.SubsetRandomSampler(range(5, 40), generator=g),
        lambda m, g: m.WeightedRandomSampler([1.0, 2.0, 0.0, 4.0], 30, generator=g),
        lambda m, g: m.WeightedRandomSampler([1.0, 2.0, 0.5, 4.0], 3, False, generator=g),
    ],
    ids=["random", "replacement", "partial", "subset", "weighted", "weighted-once"],
)
@pytest.mark.parametrize("seeded", ["generator", "manual_seed"])
def test_a_resumed_sampler_yields_the_rest_of_torchs_keys(
    torch: Any, make: Callable[[Any, Any], Any], seeded: str
) -> None:
    def generator() -> Any:
        return torch.Generator().manual_seed(11) if seeded == "generator" else None

    torch.manual_seed(4)
    reference = make(_data(torch), generator())
    expected = _epochs(reference, 2)
    for stop in (1, 2, len(expected[0]) // 2, len(expected[0])):
        torch.manual_seed(4)
        original = make(aioload, generator())
        keys = iter(original)
        head = list(islice(keys, stop))
        state = json.loads(json.dumps(original.state_dict()))
        torch.manual_seed(123)  # the resumed run's global state is another one
        resumed = make(aioload, torch.Generator() if seeded == "generator" else None)
        resumed.load_state_dict(state)
        assert head + list(resumed) == expected[0]
        if seeded == "generator":  # its generator goes on from where torch's was
            assert list(resumed) == expected[1]


def test_a_state_drawn_by_torchs_default_generator_needs_torch(torch: Any) -> None:
    torch.manual_seed(0)
    sampler = aioload.RandomSampler(range(10))
    next(iter(sampler))
    state = sampler.state_dict()
    assert state["generator"] is None and state["torch_generator"] is not None
    code = textwrap.dedent(
        f"""
        import json, aioload
        sampler = aioload.RandomSampler(range(10))
        try:
            sampler.load_state_dict(json.loads({json.dumps(json.dumps(state))}))
        except ValueError as error:
            assert "import torch" in str(error), error
        else:
            raise AssertionError("loaded")
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


class _WhatWorkersDraw(aioload.Dataset):
    """Sample ``i``: the worker's torch seed and its first draws from random, numpy and torch."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> list[Any]:
        import torch

        return [
            torch.initial_seed(),
            random.random(),
            int(np.random.randint(2**31)),
            torch.rand(()).item(),
        ]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("seeded", ["generator", "manual_seed"])
def test_workers_are_seeded_as_torchs(torch: Any, seeded: str) -> None:
    def run(module: Any) -> list[list[Any]]:
        torch.manual_seed(8)
        generator = torch.Generator().manual_seed(5) if seeded == "generator" else None
        loader = module.DataLoader(
            _WhatWorkersDraw(), batch_size=None, num_workers=2, generator=generator
        )
        return [[float(x) for x in sample] for sample in loader]

    ours, theirs = run(aioload), run(_data(torch))
    assert ours == theirs
    assert ours[0] != ours[1]  # two workers, two seeds
