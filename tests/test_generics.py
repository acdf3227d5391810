"""The public datasets and samplers are generic where torch's are: ``Dataset[int]`` works."""

# No ``from __future__ import annotations``: the annotations below are evaluated when the
# functions are defined, which is what this file checks.

import typing
from typing import Any

import pytest

import aioload

# torch.utils.data's generic classes (Generic subclasses with a type parameter) in 2.13.
GENERIC = ["Dataset", "IterableDataset", "Subset", "ConcatDataset", "StackDataset", "Sampler"]
GENERIC += ["DistributedSampler"]
# Subclasses of a concrete parametrisation (``Sampler[int]``): subscripting them is an error.
CONCRETE = ["TensorDataset", "ChainDataset", "SequentialSampler", "RandomSampler"]
CONCRETE += ["SubsetRandomSampler", "WeightedRandomSampler", "BatchSampler"]


@pytest.mark.parametrize("name", GENERIC)
def test_generic_classes_are_subscriptable(name: str) -> None:
    cls = getattr(aioload, name)
    alias = cls[tuple[int, ...]] if name == "StackDataset" else cls[int]
    assert typing.get_origin(alias) is cls


@pytest.mark.parametrize("name", CONCRETE)
def test_concrete_classes_are_not_subscriptable_as_in_torch(name: str) -> None:
    with pytest.raises(TypeError, match="not a generic class"):
        getattr(aioload, name)[int]


def test_annotations_are_evaluated_at_definition_time() -> None:
    class Batch:
        pass

    def make() -> aioload.Dataset[Batch]:
        return aioload.Dataset()

    def stack() -> aioload.StackDataset[dict[str, Any]]:
        return aioload.StackDataset(a=[1])

    def shard() -> aioload.DistributedSampler[int]:
        return aioload.DistributedSampler(range(4), num_replicas=2, rank=0)

    assert make.__annotations__["return"] == aioload.Dataset[Batch]
    assert typing.get_args(stack.__annotations__["return"]) == (dict[str, Any],)
    assert len(list(shard())) == 2


def test_stack_dataset_has_torchs_type_parameter() -> None:
    (param,) = aioload.StackDataset.__parameters__
    assert param.__constraints__ == (tuple[Any, ...], dict[str, Any])


def test_subscriptable_exactly_where_torch_is() -> None:
    torch_data = pytest.importorskip("torch.utils.data")
    for name in GENERIC + CONCRETE:
        theirs = getattr(torch_data, name).__dict__.get("__parameters__", ())
        ours = getattr(aioload, name).__dict__.get("__parameters__", ())
        assert len(ours) == len(theirs), name
        assert [p.__covariant__ for p in ours] == [p.__covariant__ for p in theirs], name
