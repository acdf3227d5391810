"""A state loads only into a loader it fits, and a tampered state is refused whole.

A checkpoint names batches by number; a loader with another batch size, ``drop_last``,
dataset length, sampler or order would resume at the wrong place and silently lose or
repeat samples. Each mismatch must fail naming the field, before any batch is read and
before the loader is changed at all.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from aioload import ArrayDataset, DataLoader, SequentialSampler


def loader(n: int = 100, **kwargs: Any) -> DataLoader[Any]:
    options: dict[str, Any] = {"batch_size": 4, "shuffle": True, "generator": 3}
    options.update(kwargs)
    return DataLoader(ArrayDataset(np.arange(n)), **options)


def mid_epoch_state(make: Callable[[], DataLoader[Any]], taken: int = 6) -> dict[str, Any]:
    first = make()
    iterator = iter(first)
    for _ in range(taken):
        next(iterator)
    state: dict[str, Any] = json.loads(json.dumps(first.state_dict()))
    iterator.close()  # type: ignore[attr-defined]
    return state


def keys(make: DataLoader[Any]) -> list[int]:
    return [int(k) for (batch,) in make for k in batch]


@pytest.mark.parametrize(
    ("other", "field"),
    [
        ({"batch_size": 8}, "batch_size"),
        ({"drop_last": True}, "drop_last"),
        ({"n": 96}, "dataset_length"),
        ({"shuffle": False, "generator": None}, "sampler"),
        ({"in_order": False}, "in_order"),
    ],
)
def test_a_state_from_another_loader_is_refused_naming_the_field(
    other: dict[str, Any], field: str
) -> None:
    state = mid_epoch_state(loader)
    n = other.pop("n", 100)
    target = loader(n, **other)
    with pytest.raises(ValueError, match=rf"taken with {field}=.*this loader has {field}="):
        target.load_state_dict(state)
    # Nothing was half-used: the loader still runs its own first epoch.
    assert keys(target) == keys(loader(n, **other))


def test_a_state_between_epochs_checks_the_same_fields() -> None:
    state = loader().state_dict()
    with pytest.raises(ValueError, match="batch_size"):
        loader(batch_size=5).load_state_dict(state)


def test_the_sampler_length_is_part_of_the_fit() -> None:
    state = mid_epoch_state(lambda: loader(sampler=SequentialSampler(range(60)), shuffle=False))
    with pytest.raises(ValueError, match="sampler_length"):
        loader(sampler=SequentialSampler(range(50)), shuffle=False).load_state_dict(state)


def tampered(change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    state = copy.deepcopy(mid_epoch_state(loader))
    change(state)
    return state


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda s: s.update(batches=-1), "'batches' should be an int >= 0"),
        (lambda s: s.update(batches=10**9), "past this epoch's 25 batches"),
        (lambda s: s.update(batches="6"), "'batches' should be an int"),
        (lambda s: s.update(batches=True), "'batches' should be an int"),
        (lambda s: s.update(epoch=-3), "'epoch' should be an int >= 0"),
        (lambda s: s.update(received=[30]), "past this epoch's 25 batches"),
        (lambda s: s.update(received=[9, 8]), "sorted"),
        (lambda s: s.update(batches=7), "its sampler state says batches=6"),
        (lambda s: s.update(base_seed=-5), "base_seed"),
        (lambda s: s.update(base_seed=2**80), "base_seed"),
        (lambda s: s.update(base_seed=1.5), "base_seed"),
        (lambda s: s.update(in_progress="yes"), "'in_progress' should be a bool"),
        (lambda s: s.pop("fits"), "'fits' should be a dict"),
        (lambda s: s["fits"].update(batch_size="4"), "batch_size='4'"),
        (lambda s: s.update(in_progress=False), "between epochs"),
    ],
)
def test_a_tampered_state_is_refused_and_nothing_is_changed(
    change: Callable[[dict[str, Any]], None], words: str
) -> None:
    target = loader()
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        target.load_state_dict(tampered(change))
    assert keys(target) == keys(loader())


def test_a_fitting_state_still_resumes_exactly() -> None:
    first = loader()
    iterator = iter(first)
    taken = [int(k) for _ in range(6) for k in next(iterator)[0]]
    state = json.loads(json.dumps(first.state_dict()))
    rest = [int(k) for (batch,) in iterator for k in batch]
    resumed = loader()
    resumed.load_state_dict(state)
    assert keys(resumed) == rest
    assert sorted(taken + rest) == list(range(100))
