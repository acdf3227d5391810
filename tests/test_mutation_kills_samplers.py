"""Samplers with a torch.Generator: states and resume (aioload/samplers/builtin.py).

Written for the survivors of the mutation run (docs/testing/mutation.md), which the
focused sampler tests let through because they never use torch: a state taken in the
middle of an iteration, or between two, resumes the keys *and* the generator, so the
epochs after a resume are the uninterrupted run's; a torch state is refused by a
sampler without a torch generator.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from aioload import RandomSampler, SubsetRandomSampler, WeightedRandomSampler

pytestmark = pytest.mark.slow  # real torch


def roundtrip(state: dict[str, Any]) -> dict[str, Any]:
    back: dict[str, Any] = json.loads(json.dumps(state))
    return back


def make(kind: str, seed: int) -> Any:
    torch = pytest.importorskip("torch")
    generator = torch.Generator().manual_seed(seed)
    if kind == "random":
        return RandomSampler(range(20), generator=generator)
    if kind == "subset":
        return SubsetRandomSampler(list(range(100, 120)), generator=generator)
    return WeightedRandomSampler([1.0 + k % 3 for k in range(20)], 20, generator=generator)


KINDS = ["random", "subset", "weighted"]


@pytest.mark.parametrize("kind", KINDS)
def test_the_sampler_draws_from_the_torch_generator_it_was_given(kind: str) -> None:
    torch = pytest.importorskip("torch")
    generator = torch.Generator().manual_seed(3)
    sampler = RandomSampler(range(5), generator=generator)
    assert sampler.generator is generator
    assert [list(make(kind, 1)) for _ in range(2)] == [list(make(kind, 1)) for _ in range(2)]


@pytest.mark.parametrize("kind", KINDS)
def test_a_state_in_mid_iteration_resumes_the_keys_and_the_epochs_after(kind: str) -> None:
    reference = make(kind, 0)
    epochs = [list(reference) for _ in range(3)]
    interrupted = make(kind, 0)
    iterator = iter(interrupted)
    head = [next(iterator) for _ in range(7)]
    state = roundtrip(interrupted.state_dict())
    resumed = make(kind, 99)  # another seed: the state decides
    resumed.load_state_dict(state)
    assert head + list(resumed) == epochs[0]
    assert [list(resumed), list(resumed)] == epochs[1:]


@pytest.mark.parametrize("kind", KINDS)
def test_a_state_between_iterations_resumes_the_next_epoch(kind: str) -> None:
    reference = make(kind, 0)
    epochs = [list(reference) for _ in range(2)]
    interrupted = make(kind, 0)
    assert list(interrupted) == epochs[0]
    state = roundtrip(interrupted.state_dict())
    assert "torch_generator" in state
    resumed = make(kind, 99)
    resumed.load_state_dict(state)
    assert list(resumed) == epochs[1]


def test_a_torch_state_is_refused_by_a_sampler_without_a_torch_generator() -> None:
    state = roundtrip(make("random", 0).state_dict())
    refusals = {
        None: r"has a generator state, but this sampler has generator=None",
        5: r"holds a torch\.Generator state",
    }
    for generator, refusal in refusals.items():
        with pytest.raises(ValueError, match=refusal):
            RandomSampler(range(20), generator=generator).load_state_dict(state)
    numpy_state = roundtrip(RandomSampler(range(20), generator=5).state_dict())
    with pytest.raises(ValueError, match="holds a numpy generator state"):
        make("random", 0).load_state_dict(numpy_state)
