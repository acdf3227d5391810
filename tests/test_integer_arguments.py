"""Integer arguments and state fields: any integer is one, a bool never is.

Every check goes through ``aioload.checks`` (``is_int`` where JSON or Python's own ints are
meant, ``is_integral`` where numpy's integers are accepted too). Where numpy's are accepted,
so is any other ``numbers.Integral`` (an arbitrary-precision integer type, say); and wherever
an integer is expected, ``True`` is refused with the error it always had (the torch parity
tests compare those messages with torch's).
"""

from __future__ import annotations

import numbers
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from aioload import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    FaultPolicy,
    RandomSampler,
    RetryPolicy,
    SequentialSampler,
    random_split,
    rank_and_world_size,
)
from aioload.data.epochs import dataset_epochs
from aioload.memory.pinned import PinnedBufferPool
from aioload.samplers.generators import check_torch_generator_state


class BigInt:
    """An integer that is neither a Python ``int`` nor numpy's (as ``gmpy2.mpz`` is)."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __int__(self) -> int:
        return self.value

    def __index__(self) -> int:
        return self.value

    def __lt__(self, other: Any) -> bool:
        return self.value < other

    def __le__(self, other: Any) -> bool:
        return self.value <= other

    def __gt__(self, other: Any) -> bool:
        return self.value > other

    def __ge__(self, other: Any) -> bool:
        return self.value >= other

    def __eq__(self, other: object) -> bool:
        return self.value == other

    def __hash__(self) -> int:
        return hash(self.value)

    def __add__(self, other: Any) -> Any:
        return self.value + other

    __radd__ = __add__

    def __repr__(self) -> str:
        return f"BigInt({self.value})"


numbers.Integral.register(BigInt)


def _sampler_batches(batch_size: Any) -> Any:
    return list(BatchSampler(SequentialSampler(range(5)), batch_size, False))


def _num_samples(num_samples: Any) -> Any:
    return len(list(RandomSampler(range(5), replacement=True, num_samples=num_samples)))


def _seed(seed: Any) -> Any:
    return list(RandomSampler(range(5), generator=seed))


def _replicas(num_replicas: Any) -> Any:
    return list(DistributedSampler(range(4), num_replicas=num_replicas, rank=0))


def _rank(rank: Any) -> Any:
    return list(DistributedSampler(range(4), num_replicas=2, rank=rank))


def _epoch(epoch: Any) -> Any:
    sampler = DistributedSampler(range(4), num_replicas=2, rank=0, seed=1)
    sampler.set_epoch(epoch)
    return list(sampler)


def _lengths(first: Any) -> Any:
    return [list(split) for split in random_split(range(5), [first, 3], generator=0)]


# Each site that takes numpy's integers: the call, an integer it accepts.
INTEGRAL_SITES: dict[str, tuple[Callable[[Any], Any], int]] = {
    "BatchSampler batch_size": (_sampler_batches, 2),
    "RandomSampler num_samples": (_num_samples, 7),
    "generator seed": (_seed, 3),
    "DistributedSampler num_replicas": (_replicas, 2),
    "DistributedSampler rank": (_rank, 1),
    "DistributedSampler.set_epoch": (_epoch, 2),
    "random_split lengths": (_lengths, 2),
}


@pytest.mark.parametrize("site", INTEGRAL_SITES)
def test_any_integral_counts_as_the_int_it_equals(site: str) -> None:
    call, value = INTEGRAL_SITES[site]
    expected = call(value)
    assert call(np.int64(value)) == expected
    assert call(BigInt(value)) == expected


def _loader_state(**fields: Any) -> None:
    loader = DataLoader(list(range(6)), batch_size=2)
    state = {**loader.state_dict(), **fields}
    loader.load_state_dict(state)


# Each site that takes an integer: the call with True, the error it raises.
BOOL_REFUSALS: dict[str, tuple[Callable[[], Any], type[Exception], str]] = {
    "BatchSampler batch_size": (
        lambda: _sampler_batches(True),
        ValueError,
        "batch_size should be a positive integer value, but got batch_size=True",
    ),
    "RandomSampler num_samples": (
        lambda: _num_samples(True),
        ValueError,
        "num_samples should be a positive integer value, but got num_samples=True",
    ),
    "generator seed": (
        lambda: _seed(True),
        TypeError,
        "generator should be None, a numpy.random.Generator, a torch.Generator or an int "
        "seed, but got bool",
    ),
    "DistributedSampler num_replicas": (
        lambda: _replicas(True),
        TypeError,
        "num_replicas should be an integer, but got bool",
    ),
    "DistributedSampler rank": (
        lambda: _rank(True),
        TypeError,
        "rank should be an integer, but got bool",
    ),
    "DistributedSampler.set_epoch": (
        lambda: _epoch(True),
        TypeError,
        "epoch should be an integer, but got bool",
    ),
    "random_split lengths": (
        lambda: _lengths(True),
        TypeError,
        "lengths must be all ints or all fractions; got [True, 3]",
    ),
    "rank_and_world_size rank": (
        lambda: rank_and_world_size(True, 2),
        ValueError,
        "rank should be an integer in [0, 1]; got True",
    ),
    "rank_and_world_size world_size": (
        lambda: rank_and_world_size(0, True),
        ValueError,
        "world_size should be a positive integer; got True",
    ),
    "RetryPolicy attempts": (
        lambda: RetryPolicy(attempts=True),
        ValueError,
        "RetryPolicy.attempts should be a positive integer (attempts in all, the first one "
        "included; 1 means no retries); got True",
    ),
    "RetryPolicy backoff": (
        lambda: RetryPolicy(backoff=True),
        ValueError,
        "RetryPolicy.backoff should be a finite number of seconds >= 0; got True",
    ),
    "FaultPolicy item_timeout": (
        lambda: FaultPolicy(item_timeout=True),
        ValueError,
        "item_timeout should be a positive number of seconds or None; got True",
    ),
    "FaultPolicy max_skipped": (
        lambda: FaultPolicy(on_error="skip", max_skipped=True),
        TypeError,
        "max_skipped should be None, a count (int >= 0) or a fraction of the epoch (a float "
        "between 0 and 1); got True",
    ),
    "PinnedBufferPool max_bytes": (
        lambda: PinnedBufferPool(max_bytes=True),
        TypeError,
        "max_bytes should be an integer number of bytes, but got max_bytes=True of type bool",
    ),
    "a loader state's epoch": (
        lambda: _loader_state(epoch=True),
        ValueError,
        "DataLoader state field 'epoch' should be an int >= 0",
    ),
    "a loader state's received batches": (
        lambda: _loader_state(in_progress=True, base_seed=0, received=[True]),
        ValueError,
        "DataLoader state field 'received' should be a list of the batch numbers past "
        "'batches' that were received",
    ),
    "a loader state's base seed": (
        lambda: _loader_state(in_progress=True, base_seed=True),
        ValueError,
        "DataLoader state in progress needs an int 'base_seed' in [0, 2**63); got True",
    ),
    "a torch generator state's bytes": (
        lambda: check_torch_generator_state(
            {"bit_generator": "torch.Generator", "state": [True]}, "RandomSampler", "generator"
        ),
        ValueError,
        "RandomSampler state field 'generator' should be a torch.Generator state",
    ),
}


@pytest.mark.parametrize("site", BOOL_REFUSALS)
def test_a_bool_is_refused_where_an_integer_is_expected(site: str) -> None:
    call, kind, message = BOOL_REFUSALS[site]
    with pytest.raises(kind, match=re.escape(message)):
        call()


def test_a_bool_epoch_is_no_epoch_to_send_the_workers() -> None:
    class Epoched:
        def __init__(self, epoch: Any) -> None:
            self.epoch = epoch

        def set_epoch(self, epoch: int) -> None:
            self.epoch = epoch

        def __len__(self) -> int:
            return 1

        def __getitem__(self, index: int) -> int:
            return index

    assert dataset_epochs(Epoched(1)) == (((), 1),)
    assert dataset_epochs(Epoched(True)) == ()
