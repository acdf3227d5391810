"""Sampler checkpoints: stop anywhere, save the state through JSON, restore, compare.

One helper, :func:`check_resume`, runs every sampler the same way: an uninterrupted reference
run of three epochs, and a run stopped after some keys of one epoch whose state goes through
``json.dumps``/``json.loads`` into a sampler built with the same arguments. The resumed
sampler must yield the rest of the interrupted epoch and then the reference's next epochs.
"""

from __future__ import annotations

import asyncio
import json
import pickle
from collections.abc import AsyncIterator, Callable, Iterator
from itertools import islice
from typing import Any, cast

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import aioload.samplers.builtin as samplers_module
from aioload.samplers.builtin import (
    BatchSampler,
    DistributedSampler,
    RandomSampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

EXAMPLES = settings(max_examples=40, deadline=None)

Hook = Callable[[Any, int], None]

# --- helpers -------------------------------------------------------------------------------


def roundtrip(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` through JSON; it must come back equal, i.e. hold plain JSON types only."""
    back: dict[str, Any] = json.loads(json.dumps(state))
    assert back == state
    return back


def run_epoch(sampler: Any, epoch: int, before_epoch: Hook | None) -> list[Any]:
    if before_epoch is not None:
        before_epoch(sampler, epoch)
    return list(sampler)


def check_resume(
    make: Callable[[], Any],
    stop: int | None,
    *,
    done_epochs: int = 0,
    before_epoch: Hook | None = None,
    deterministic: bool = True,
) -> None:
    """Interrupt epoch ``done_epochs`` after ``stop`` keys (``None``: before it starts), resume.

    With ``deterministic=False`` (no generator) epochs cannot be compared with another run: the
    rest of the interrupted epoch is compared with the original's own, and later epochs are
    only checked to have the reference's lengths.
    """
    reference = make()
    expected = [run_epoch(reference, e, before_epoch) for e in range(done_epochs + 3)]
    original = make()
    for e in range(done_epochs):
        run_epoch(original, e, before_epoch)
    if stop is None:
        state = roundtrip(original.state_dict())
        head: list[Any] = []
        keys: Iterator[Any] = iter(())
        resumed = make()
        resumed.load_state_dict(state)
        first_resumed = done_epochs
    else:
        if before_epoch is not None:
            before_epoch(original, done_epochs)
        keys = iter(original)
        head = list(islice(keys, stop))
        state = roundtrip(original.state_dict())
        # An iteration of torch's generator-function samplers begins at its first key.
        started = stop > 0 or not isinstance(original, LAZY)
        assert state["in_progress"] is started
        resumed = make()
        resumed.load_state_dict(state)
        rest = list(resumed)
        continued = list(keys)  # the original, left alone, goes on as if nothing happened
        if deterministic or started:
            assert head + rest == head + continued
        else:  # neither had drawn: each draws from fresh entropy
            assert len(rest) == len(continued)
        if deterministic:
            assert head + rest == expected[done_epochs]
        first_resumed = done_epochs + 1
    later = [run_epoch(resumed, e, before_epoch) for e in range(first_resumed, done_epochs + 3)]
    if deterministic:
        assert later == expected[first_resumed:]
    else:
        assert list(map(len, later)) == list(map(len, expected[first_resumed:]))


# torch's samplers whose ``__iter__`` is a generator function: nothing drawn before the first key.
LAZY = (RandomSampler, SubsetRandomSampler, WeightedRandomSampler, BatchSampler)


def stops(length: int) -> st.SearchStrategy[int | None]:
    """Where to stop: before the epoch (``None``) or after 0..length keys."""
    return st.none() | st.integers(0, length)


GENERATOR_KINDS = ["seed", "PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64"]


def generator(kind: str, seed: int) -> np.random.Generator | int:
    """A fresh generator argument: an int seed, or a Generator over the named bit generator."""
    if kind == "seed":
        return seed
    return np.random.Generator(getattr(np.random, kind)(seed))


class Reshuffling:
    """A user sampler with its own state_dict (not a built-in): reshuffles on every pass."""

    def __init__(self, n: int, seed: int) -> None:
        self.n = n
        self.seed = seed
        self.passes = 0

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[int]:
        order = np.random.default_rng([self.seed, self.passes]).permutation(self.n).tolist()
        self.passes += 1
        return iter(order)

    def state_dict(self) -> dict[str, Any]:
        return {"passes": self.passes}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.passes = state["passes"]


class AsyncReshuffling(Reshuffling):
    """The async twin of :class:`Reshuffling`: keys come from ``async for``."""

    def __aiter__(self) -> AsyncIterator[int]:
        return self._keys(iter(self))

    @staticmethod
    async def _keys(keys: Iterator[int]) -> AsyncIterator[int]:
        for key in keys:
            await asyncio.sleep(0)
            yield key


class AsyncRange:
    """An async sampler without state: ``0..n-1`` on every pass."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    async def __aiter__(self) -> AsyncIterator[int]:
        for key in range(self.n):
            await asyncio.sleep(0)
            yield key


# --- every sampler through check_resume ----------------------------------------------------


@EXAMPLES
@given(n=st.integers(0, 30), data=st.data())
def test_sequential_resumes(n: int, data: st.DataObject) -> None:
    stop = data.draw(stops(n))
    check_resume(
        lambda: SequentialSampler(range(n)), stop, done_epochs=data.draw(st.integers(0, 1))
    )


@EXAMPLES
@given(
    n=st.integers(1, 20),
    replacement=st.booleans(),
    num_samples=st.none() | st.integers(1, 70),
    kind=st.sampled_from(GENERATOR_KINDS),
    seed=st.integers(0, 2**32),
    chunk=st.sampled_from([3, 1024]),
    data=st.data(),
)
def test_random_resumes(
    n: int,
    replacement: bool,
    num_samples: int | None,
    kind: str,
    seed: int,
    chunk: int,
    data: st.DataObject,
) -> None:
    # A small chunk makes a few dozen draws with replacement span several chunks.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(samplers_module, "_CHUNK", chunk)

        def make() -> RandomSampler:
            return RandomSampler(range(n), replacement, num_samples, generator(kind, seed))

        stop = data.draw(stops(len(make())))
        check_resume(make, stop, done_epochs=data.draw(st.integers(0, 1)))


def test_random_resumes_across_default_sized_chunks() -> None:
    # 2.5 chunks of draws with replacement; stop inside the second chunk.
    make = lambda: RandomSampler(range(7), True, 2560, generator=3)  # noqa: E731
    check_resume(make, 1500)
    check_resume(make, 2048)


@EXAMPLES
@given(
    n=st.integers(1, 20),
    replacement=st.booleans(),
    num_samples=st.none() | st.integers(1, 50),
    data=st.data(),
)
def test_random_without_generator_resumes_its_epoch(
    n: int, replacement: bool, num_samples: int | None, data: st.DataObject
) -> None:
    def make() -> RandomSampler:
        return RandomSampler(range(n), replacement, num_samples)

    stop = data.draw(st.integers(0, len(make())))
    check_resume(make, stop, deterministic=False)


@EXAMPLES
@given(
    indices=st.lists(st.integers(-100, 100), max_size=20),
    form=st.sampled_from([list, tuple, np.array]),
    kind=st.sampled_from(GENERATOR_KINDS),
    seed=st.integers(0, 2**32),
    data=st.data(),
)
def test_subset_random_resumes(
    indices: list[int], form: Any, kind: str, seed: int, data: st.DataObject
) -> None:
    def make() -> SubsetRandomSampler:
        return SubsetRandomSampler(form(indices), generator(kind, seed))

    check_resume(make, data.draw(stops(len(indices))), done_epochs=data.draw(st.integers(0, 1)))


@EXAMPLES
@given(
    weights=st.lists(st.sampled_from([0.0, 0.5, 1.0, 3.0]), min_size=1, max_size=15).filter(any),
    replacement=st.booleans(),
    kind=st.sampled_from(GENERATOR_KINDS),
    seed=st.integers(0, 2**32),
    chunk=st.sampled_from([4, 1024]),
    data=st.data(),
)
def test_weighted_random_resumes(
    weights: list[float],
    replacement: bool,
    kind: str,
    seed: int,
    chunk: int,
    data: st.DataObject,
) -> None:
    limit = 40 if replacement else int(np.count_nonzero(weights))
    num_samples = data.draw(st.integers(1, limit))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(samplers_module, "_CHUNK", chunk)

        def make() -> WeightedRandomSampler:
            return WeightedRandomSampler(weights, num_samples, replacement, generator(kind, seed))

        check_resume(make, data.draw(stops(num_samples)), done_epochs=data.draw(st.integers(0, 1)))


@EXAMPLES
@given(
    n=st.integers(0, 30),
    replicas=st.integers(1, 4),
    shuffle=st.booleans(),
    seed=st.integers(0, 1000),
    drop_last=st.booleans(),
    set_epoch=st.booleans(),
    data=st.data(),
)
def test_distributed_resumes(
    n: int,
    replicas: int,
    shuffle: bool,
    seed: int,
    drop_last: bool,
    set_epoch: bool,
    data: st.DataObject,
) -> None:
    rank = data.draw(st.integers(0, replicas - 1))

    def make() -> DistributedSampler:
        return DistributedSampler(range(n), replicas, rank, shuffle, seed, drop_last)

    hook: Hook | None = (lambda sampler, epoch: sampler.set_epoch(epoch)) if set_epoch else None
    stop = data.draw(stops(len(make())))
    check_resume(make, stop, done_epochs=data.draw(st.integers(0, 1)), before_epoch=hook)


def test_distributed_state_keeps_the_epoch_of_the_interrupted_iteration() -> None:
    # A training loop may call set_epoch for the next epoch before the state is saved.
    original = DistributedSampler(range(20), 2, 1, seed=5)
    original.set_epoch(3)
    keys = iter(original)
    head = list(islice(keys, 4))
    original.set_epoch(4)
    state = roundtrip(original.state_dict())
    assert (state["epoch"], state["iteration_epoch"]) == (4, 3)
    resumed = DistributedSampler(range(20), 2, 1, seed=5)
    resumed.load_state_dict(state)
    assert head + list(resumed) == head + list(keys)
    assert resumed.epoch == 4
    assert list(resumed) == list(original)


# --- BatchSampler --------------------------------------------------------------------------

INNER: dict[str, Callable[[int, int], Any]] = {
    "random": lambda n, seed: RandomSampler(range(n), generator=seed),
    "random-replacement": lambda n, seed: RandomSampler(range(n), True, 2 * n, seed),
    "sequential": lambda n, seed: SequentialSampler(range(n)),
    "distributed": lambda n, seed: DistributedSampler(range(n), 2, 1, seed=seed),
    "list": lambda n, seed: list(range(n))[::-1],
    "user-stateful": lambda n, seed: Reshuffling(n, seed),
}


@EXAMPLES
@given(
    inner=st.sampled_from(list(INNER)),
    n=st.integers(1, 30),
    batch_size=st.integers(1, 7),
    drop_last=st.booleans(),
    seed=st.integers(0, 1000),
    data=st.data(),
)
def test_batch_sampler_resumes(
    inner: str, n: int, batch_size: int, drop_last: bool, seed: int, data: st.DataObject
) -> None:
    def make() -> BatchSampler:
        return BatchSampler(INNER[inner](n, seed), batch_size, drop_last)

    check_resume(make, data.draw(stops(len(make()))), done_epochs=data.draw(st.integers(0, 1)))


@EXAMPLES
@given(n=st.integers(1, 30), batch_size=st.integers(1, 7), data=st.data())
def test_batch_sampler_over_random_without_generator_resumes_its_epoch(
    n: int, batch_size: int, data: st.DataObject
) -> None:
    drop_last = data.draw(st.booleans())
    sampler = BatchSampler(RandomSampler(range(n)), batch_size, drop_last)
    check_resume(
        lambda: BatchSampler(RandomSampler(range(n)), batch_size, drop_last),
        data.draw(st.integers(0, len(sampler))),
        deterministic=False,
    )


def test_batch_sampler_positions_a_built_in_inner_sampler_at_once() -> None:
    batches = BatchSampler(RandomSampler(range(100), generator=1), 8, False)
    it = iter(batches)
    head = list(islice(it, 5))
    state = roundtrip(batches.state_dict())
    assert state["batches"] == 5
    assert state["sampler"]["type"] == "RandomSampler"
    resumed = BatchSampler(RandomSampler(range(100), generator=1), 8, False)
    resumed.load_state_dict(state)
    # Loaded at once: the inner sampler already stands after 5 * 8 keys.
    inner_state = resumed.sampler.state_dict()  # type: ignore[union-attr]
    assert (inner_state["in_progress"], inner_state["yielded"]) == (True, 40)
    assert head + list(resumed) == head + list(it)


def test_batch_sampler_fast_forwards_a_sampler_without_state() -> None:
    drawn: list[int] = []

    class Recorded:
        def __iter__(self) -> Iterator[int]:
            for key in range(10):
                drawn.append(key)
                yield key

    batches = BatchSampler(Recorded(), 3, False)
    it = iter(batches)
    next(it), next(it)
    state = roundtrip(batches.state_dict())
    assert state == {
        "type": "BatchSampler",
        "version": 1,
        "in_progress": True,
        "batches": 2,
        "sampler": None,
    }
    drawn.clear()
    resumed = BatchSampler(Recorded(), 3, False)
    resumed.load_state_dict(state)
    assert list(resumed) == [[6, 7, 8], [9]]
    assert drawn == list(range(10))  # the 6 skipped keys were drawn, then dropped


# --- async BatchSampler --------------------------------------------------------------------


async def collect(batches: Any) -> list[list[int]]:
    return [batch async for batch in batches]


@settings(max_examples=30, deadline=None)
@given(
    stateful=st.booleans(),
    n=st.integers(1, 20),
    batch_size=st.integers(1, 5),
    drop_last=st.booleans(),
    seed=st.integers(0, 1000),
    data=st.data(),
)
def test_async_batch_sampler_resumes(
    stateful: bool, n: int, batch_size: int, drop_last: bool, seed: int, data: st.DataObject
) -> None:
    def make() -> BatchSampler:
        inner = AsyncReshuffling(n, seed) if stateful else AsyncRange(n)
        return BatchSampler(inner, batch_size, drop_last)

    stop = data.draw(st.integers(0, len(make())))

    async def main() -> None:
        reference = make()
        expected = [await collect(reference) for _ in range(3)]
        original = make()
        it: Any = aiter(cast(Any, original))
        head = [await anext(it) for _ in range(stop)]
        state = roundtrip(original.state_dict())
        assert state["batches"] == stop
        assert (state["sampler"] is not None) is stateful
        resumed = make()
        resumed.load_state_dict(state)
        assert head + await collect(resumed) == expected[0]
        assert [await collect(resumed), await collect(resumed)] == expected[1:]
        await it.aclose()

    asyncio.run(main())


# --- chained resumes, rewinds, pickling ----------------------------------------------------

MAKERS: dict[str, Callable[[], Any]] = {
    "sequential": lambda: SequentialSampler(range(23)),
    "random": lambda: RandomSampler(range(9), num_samples=23, generator=4),
    "subset": lambda: SubsetRandomSampler(list(range(100, 123)), generator=4),
    "weighted": lambda: WeightedRandomSampler([1.0, 2.0, 0.0, 5.0], 23, generator=4),
    "distributed": lambda: DistributedSampler(range(46), 2, 0, seed=4),
    "batch": lambda: BatchSampler(RandomSampler(range(23), generator=4), 1, False),
}


@pytest.mark.parametrize("name", list(MAKERS))
def test_a_resumed_iteration_can_be_interrupted_and_resumed_again(name: str) -> None:
    make = MAKERS[name]
    expected = list(make())
    first = make()
    head = list(islice(iter(first), 5))
    second = make()
    second.load_state_dict(roundtrip(first.state_dict()))
    middle = list(islice(iter(second), 7))
    third = make()
    third.load_state_dict(roundtrip(second.state_dict()))
    assert head + middle + list(third) == expected
    reference = make()
    list(reference)
    assert list(third) == list(reference)


@pytest.mark.parametrize("name", list(MAKERS))
def test_lowering_the_count_resumes_earlier_in_the_same_iteration(name: str) -> None:
    make = MAKERS[name]
    reference = make()
    expected = [list(reference), list(reference)]
    original = make()
    list(islice(iter(original), 15))
    state = roundtrip(original.state_dict())
    count = "batches" if name == "batch" else "yielded"
    assert state[count] == 15
    state[count] = 6  # a loader that delivered only 6 of the 15 items it drew
    resumed = make()
    resumed.load_state_dict(state)
    assert list(resumed) == expected[0][6:]
    assert list(resumed) == expected[1]


@pytest.mark.parametrize("name", list(MAKERS))
def test_state_of_a_fresh_or_finished_sampler_is_between_iterations(name: str) -> None:
    sampler = MAKERS[name]()
    state = roundtrip(sampler.state_dict())
    assert state["in_progress"] is False
    list(sampler)
    state = roundtrip(sampler.state_dict())
    assert state["in_progress"] is False
    resumed = MAKERS[name]()
    resumed.load_state_dict(state)
    assert list(resumed) == list(sampler)


@pytest.mark.parametrize("name", list(MAKERS))
def test_a_sampler_pickled_mid_iteration_keeps_its_state(name: str) -> None:
    sampler = MAKERS[name]()
    keys = iter(sampler)
    list(islice(keys, 4))
    copy = pickle.loads(pickle.dumps(sampler))
    assert copy.state_dict() == sampler.state_dict()


def test_state_describes_the_latest_iteration() -> None:
    sampler = SequentialSampler(range(10))
    older, newer = iter(sampler), iter(sampler)
    list(islice(older, 7))
    list(islice(newer, 2))
    assert sampler.state_dict()["yielded"] == 2


def test_state_loaded_but_not_yet_run_is_reported_as_loaded() -> None:
    sampler = RandomSampler(range(10), generator=0)
    list(islice(iter(sampler), 3))
    state = roundtrip(sampler.state_dict())
    resumed = RandomSampler(range(10), generator=0)
    resumed.load_state_dict(state)
    assert resumed.state_dict() == state


# --- bad states ----------------------------------------------------------------------------


def state_of(sampler: Any, keys: int = 2) -> dict[str, Any]:
    list(islice(iter(sampler), keys))
    return roundtrip(sampler.state_dict())


RANDOM_STATE = state_of(RandomSampler(range(10), generator=0))


DROP = object()  # as a value in edited(): remove the field


def edited(state: dict[str, Any], **changes: Any) -> dict[str, Any]:
    new = {**state, **changes}
    return {key: value for key, value in new.items() if value is not DROP}


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ([1, 2], "should be a dict from state_dict"),
        (None, "should be a dict from state_dict"),
        (edited(RANDOM_STATE, type="SequentialSampler"), "expected a state from a RandomSampler"),
        (edited(RANDOM_STATE, type=DROP), r"got one from something else \(type=None\)"),
        (edited(RANDOM_STATE, version=1), "version=1, but this aioload reads version 2"),
        (edited(RANDOM_STATE, yielded=DROP), "missing the field 'yielded'"),
        (edited(RANDOM_STATE, yielded="2"), "'yielded' should be int, but got str"),
        (edited(RANDOM_STATE, yielded=True), "'yielded' should be int, but got bool"),
        (edited(RANDOM_STATE, yielded=2.0), "'yielded' should be int, but got float"),
        (edited(RANDOM_STATE, yielded=-1), "'yielded' should be non-negative"),
        (edited(RANDOM_STATE, yielded=11), "yielded=11, more than the 10 keys"),
        (edited(RANDOM_STATE, in_progress=1), "'in_progress' should be bool, but got int"),
        (edited(RANDOM_STATE, generator=DROP), "missing the field 'generator'"),
        (edited(RANDOM_STATE, generator=[1]), "'generator' should be dict or None"),
        (edited(RANDOM_STATE, generator=None), r"has generator=None \(its sampler had no numpy"),
        (edited(RANDOM_STATE, generator={"bit_generator": "Nope"}), "bit_generator='Nope'"),
        (
            edited(RANDOM_STATE, generator={"bit_generator": "PCG64", "state": {}}),
            "not a valid PCG64 state",
        ),
        (
            edited(RANDOM_STATE, generator=state_of(RandomSampler(range(10), generator=0))),
            "bit_generator=None",
        ),
        (
            edited(RANDOM_STATE, generator=np.random.MT19937(0).state | {"state": None}),
            "holds a MT19937 generator state, but this sampler's generator is a PCG64",
        ),
    ],
)
def test_bad_states_raise_value_error(state: Any, message: str) -> None:
    sampler = RandomSampler(range(10), generator=0)
    with pytest.raises(ValueError, match=message):
        sampler.load_state_dict(state)
    # A refused state leaves the sampler as it was.
    assert list(sampler) == list(RandomSampler(range(10), generator=0))


def test_states_from_another_sampler_class_are_refused_by_name() -> None:
    batch_state = state_of(BatchSampler(SequentialSampler(range(9)), 2, False))
    with pytest.raises(ValueError, match="expected a state from a RandomSampler, but got one from"):
        RandomSampler(range(10), generator=0).load_state_dict(batch_state)
    with pytest.raises(ValueError, match="expected a state from a BatchSampler, but got one from"):
        BatchSampler(SequentialSampler(range(9)), 2, False).load_state_dict(RANDOM_STATE)
    with pytest.raises(ValueError, match="from a WeightedRandomSampler, but got one from a Random"):
        WeightedRandomSampler([1.0, 1.0], 10, generator=0).load_state_dict(RANDOM_STATE)


def test_generator_presence_must_match_the_sampler() -> None:
    seeded_between = RandomSampler(range(10), generator=0).state_dict()
    unseeded_between = RandomSampler(range(10)).state_dict()
    assert unseeded_between["generator"] is None
    with pytest.raises(ValueError, match="has generator=None"):
        RandomSampler(range(10)).load_state_dict(seeded_between)
    with pytest.raises(ValueError, match="but this sampler has one"):
        RandomSampler(range(10), generator=0).load_state_dict(unseeded_between)


def test_bad_distributed_states() -> None:
    state = state_of(DistributedSampler(range(10), 2, 0))
    sampler = DistributedSampler(range(10), 2, 0)
    with pytest.raises(ValueError, match="has no 'iteration_epoch'"):
        sampler.load_state_dict(edited(state, iteration_epoch=None))
    with pytest.raises(ValueError, match="'epoch' should be non-negative"):
        sampler.load_state_dict(edited(state, epoch=-1))
    with pytest.raises(ValueError, match="missing the field 'epoch'"):
        sampler.load_state_dict(edited(state, epoch=DROP))


def test_bad_batch_sampler_states() -> None:
    state = state_of(BatchSampler(RandomSampler(range(10), generator=0), 3, False))
    batches = BatchSampler(RandomSampler(range(10), generator=0), 3, False)
    with pytest.raises(ValueError, match="no inner sampler state, but the inner RandomSampler"):
        batches.load_state_dict(edited(state, sampler=None))
    with pytest.raises(ValueError, match="an inner sampler state, but the inner list has no"):
        BatchSampler(list(range(10)), 3, False).load_state_dict(state)
    with pytest.raises(ValueError, match="batches=5, more than the 4 batches"):
        batches.load_state_dict(edited(state, batches=5))
    with pytest.raises(ValueError, match="'batches' should be int"):
        batches.load_state_dict(edited(state, batches="1"))
    with pytest.raises(ValueError, match="expected a state from a RandomSampler") as info:
        batches.load_state_dict(edited(state, sampler=edited(state["sampler"], type="X")))
    assert "inner sampler state" in " ".join(getattr(info.value, "__notes__", []))
    assert list(batches) == list(BatchSampler(RandomSampler(range(10), generator=0), 3, False))
