"""Loader checkpoints: stop at any batch, save the state through JSON, resume, compare.

One helper, :func:`check_resume`, runs every case the same way: an uninterrupted reference
run of ``EPOCHS`` epochs, and a run stopped after ``stop`` batches of epoch ``stop_epoch``
whose ``loader.state_dict()`` goes through ``json.dumps``/``json.loads`` into a new loader
built by the same factory. The samples the interrupted run yielded followed by those of the
resumed run must be the reference's: batch for batch with ``in_order=True``, as a multiset
per epoch with ``in_order=False``.

Datasets live at module level: workers start with ``forkserver``, which pickles them.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import aioload
from aioload import (
    DataLoader,
    DistributedSampler,
    RandomSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

EPOCHS = 3
N = 23
EXAMPLES = settings(max_examples=15, deadline=None)
FEW = settings(max_examples=3, deadline=None)  # worker cases: a pool start costs ~0.1 s

Factory = Callable[[], DataLoader]
Hook = Callable[[DataLoader, int], None]

# -- datasets and samplers -----------------------------------------------------------------


class Keys(aioload.Dataset):
    """Sample ``k`` is ``k``."""

    def __init__(self, n: int = N) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, key: int) -> int:
        return key


class SlowKeys(aioload.Dataset):
    """Async; every third key sleeps, so later batches finish first with ``in_order=False``."""

    def __init__(self, n: int = N) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    async def __getitem__(self, key: int) -> int:
        await asyncio.sleep(0.003 if key % 3 == 0 else 0)
        return key


class Reversed:
    """A user sampler without ``state_dict``: the same keys every pass."""

    def __init__(self, n: int = N) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.n - 1, -1, -1))


class AsyncEvens:
    """An async user sampler without ``state_dict``."""

    def __aiter__(self) -> AsyncIterator[int]:
        return self._keys()

    async def _keys(self) -> AsyncIterator[int]:
        for key in range(0, N, 2):
            yield key


class Stream:
    """An iterable dataset that can say where its stream stands."""

    def __init__(self, n: int = N) -> None:
        self.n = n
        self.taken = 0  # samples taken from the current iter()
        self._resume_at = 0

    def __iter__(self) -> Iterator[int]:
        start, self._resume_at = self._resume_at, 0
        for sample in range(start, self.n):
            self.taken = sample + 1
            yield sample * 10

    def state_dict(self) -> dict[str, int]:
        return {"taken": self.taken}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._resume_at = state["taken"]


class AsyncStream(Stream):
    """:class:`Stream` with ``__aiter__`` only."""

    __iter__ = None  # type: ignore[assignment]

    def __aiter__(self) -> AsyncIterator[int]:
        return self._samples()

    async def _samples(self) -> AsyncIterator[int]:
        start, self._resume_at = self._resume_at, 0
        for sample in range(start, self.n):
            await asyncio.sleep(0)
            self.taken = sample + 1
            yield sample * 10


class PlainStream:
    """An iterable dataset without ``state_dict``."""

    def __iter__(self) -> Iterator[int]:
        return iter(range(N))


# -- the helper ----------------------------------------------------------------------------


def flat(batch: Any) -> list[int]:
    return [int(x) for x in np.asarray(batch).reshape(-1)]


def samples(epoch: list[list[int]]) -> list[int]:
    """An epoch's samples as a sorted list: what ``in_order=False`` keeps."""
    return sorted(sample for batch in epoch for sample in batch)


def roundtrip(state: dict[str, Any]) -> dict[str, Any]:
    back: dict[str, Any] = json.loads(json.dumps(state))
    assert back == state
    return back


def run_sync(
    make: Factory, stop_epoch: int, stop: int, hook: Hook | None, reference: Factory | None
) -> Any:
    """Reference epochs, interrupted epochs (with the state) and resumed epochs, with ``for``.

    ``reference`` builds the uninterrupted run's loader (default: ``make``).
    """
    reference = (reference or make)()
    expected = []
    for epoch in range(EPOCHS):
        if hook:
            hook(reference, epoch)
        expected.append([flat(b) for b in reference])

    interrupted = make()
    before: list[list[list[int]]] = []
    for epoch in range(stop_epoch):
        if hook:
            hook(interrupted, epoch)
        before.append([flat(b) for b in interrupted])
    if hook:
        hook(interrupted, stop_epoch)
    it = iter(interrupted)
    partial = []
    ended = False  # the stop was past the epoch's end: the state is between epochs
    for _ in range(stop):
        try:
            partial.append(flat(next(it)))
        except StopIteration:
            ended = True
            break
    state = roundtrip(interrupted.state_dict())
    it.close()
    if partial:  # (before the first batch the state may or may not know the epoch began)
        assert roundtrip(interrupted.state_dict()) == state  # a break changes nothing

    resumed = make()
    resumed.load_state_dict(state)
    assert resumed.state_dict() == state
    after: list[list[list[int]]] = [[]] if ended else []
    for epoch in range(stop_epoch + ended, EPOCHS):
        if hook:
            hook(resumed, epoch)
        after.append([flat(b) for b in resumed])
    return expected, before, partial, after, state


async def run_async(make: Factory, stop_epoch: int, stop: int, hook: Hook | None) -> Any:
    """:func:`run_sync` with ``async for``."""

    async def epoch_of(loader: DataLoader) -> list[list[int]]:
        return [flat(b) async for b in loader]

    reference = make()
    expected = []
    for epoch in range(EPOCHS):
        if hook:
            hook(reference, epoch)
        expected.append(await epoch_of(reference))

    interrupted = make()
    before = []
    for epoch in range(stop_epoch):
        if hook:
            hook(interrupted, epoch)
        before.append(await epoch_of(interrupted))
    if hook:
        hook(interrupted, stop_epoch)
    it = aiter(interrupted)
    partial = []
    ended = False  # the stop was past the epoch's end: the state is between epochs
    for _ in range(stop):
        try:
            partial.append(flat(await anext(it)))
        except StopAsyncIteration:
            ended = True
            break
    state = roundtrip(interrupted.state_dict())
    await it.aclose()

    resumed = make()
    resumed.load_state_dict(state)
    after: list[list[list[int]]] = [[]] if ended else []
    for epoch in range(stop_epoch + ended, EPOCHS):
        if hook:
            hook(resumed, epoch)
        after.append(await epoch_of(resumed))
    return expected, before, partial, after, state


def compare(result: Any, in_order: bool) -> dict[str, Any]:
    expected, before, partial, after, state = result
    got = [*before, partial + after[0], *after[1:]]
    if in_order:
        assert got == expected
    else:
        assert [samples(e) for e in got] == [samples(e) for e in expected]
    state_: dict[str, Any] = state
    return state_


def check_resume(
    make: Factory,
    stop_epoch: int,
    stop: int,
    *,
    in_order: bool = True,
    hook: Hook | None = None,
    reference: Factory | None = None,
) -> dict[str, Any]:
    return compare(run_sync(make, stop_epoch, stop, hook, reference), in_order)


def set_epoch(loader: DataLoader, epoch: int) -> None:
    loader.sampler.set_epoch(epoch)


# -- map-style datasets, every sampler -----------------------------------------------------

SAMPLERS: dict[str, tuple[Callable[[int], dict[str, Any]], Hook | None]] = {
    "sequential": (lambda seed: {"batch_size": 4}, None),
    "shuffle": (lambda seed: {"batch_size": 4, "shuffle": True, "generator": seed}, None),
    "replacement": (
        lambda seed: {
            "batch_size": 3,
            "sampler": RandomSampler(Keys(), replacement=True, num_samples=20, generator=seed),
        },
        None,
    ),
    "weighted": (
        lambda seed: {
            "batch_size": 4,
            "sampler": WeightedRandomSampler(
                [1.0 + k % 4 for k in range(N)], num_samples=19, generator=seed
            ),
            "generator": seed + 1,
        },
        None,
    ),
    "subset": (
        lambda seed: {
            "batch_size": 2,
            "sampler": SubsetRandomSampler(list(range(3, N, 2)), generator=seed),
        },
        None,
    ),
    "distributed": (
        lambda seed: {
            "batch_size": 3,
            "sampler": DistributedSampler(Keys(), num_replicas=2, rank=1, seed=seed),
        },
        set_epoch,
    ),
    "user sampler (fast-forward)": (lambda seed: {"batch_size": 4, "sampler": Reversed()}, None),
    "user sampler, batch_size None": (
        lambda seed: {"batch_size": None, "sampler": Reversed()},
        None,
    ),
    "user batch sampler": (
        lambda seed: {"batch_sampler": [[k, k + 1] for k in range(0, N - 1, 3)]},
        None,
    ),
    "batch_size None, shuffled": (
        lambda seed: {"batch_size": None, "shuffle": True, "generator": seed},
        None,
    ),
    "drop_last": (
        lambda seed: {"batch_size": 5, "drop_last": True, "shuffle": True, "generator": seed},
        None,
    ),
}


@pytest.mark.parametrize("in_order", [True, False], ids=["in_order", "any_order"])
@pytest.mark.parametrize("name", list(SAMPLERS))
@EXAMPLES
@given(stop_epoch=st.integers(0, EPOCHS - 1), stop=st.integers(0, 13), seed=st.integers(0, 99))
def test_resume_every_sampler(
    name: str, in_order: bool, stop_epoch: int, stop: int, seed: int
) -> None:
    kwargs, hook = SAMPLERS[name]
    dataset = Keys() if in_order else SlowKeys()
    check_resume(
        lambda: DataLoader(dataset, in_order=in_order, prefetch_factor=3, **kwargs(seed)),
        stop_epoch,
        stop,
        in_order=in_order,
        hook=hook,
    )


@EXAMPLES
@given(stop=st.integers(0, 6))
def test_resume_async_sampler_without_state(stop: int) -> None:
    check_resume(lambda: DataLoader(Keys(), batch_size=None, sampler=AsyncEvens()), 1, stop)


@pytest.mark.asyncio
@pytest.mark.parametrize("in_order", [True, False], ids=["in_order", "any_order"])
@pytest.mark.parametrize("name", ["shuffle", "distributed", "user sampler (fast-forward)"])
@settings(max_examples=10, deadline=None)
@given(stop_epoch=st.integers(0, EPOCHS - 1), stop=st.integers(0, 8), seed=st.integers(0, 99))
async def test_resume_async_for(
    name: str, in_order: bool, stop_epoch: int, stop: int, seed: int
) -> None:
    kwargs, hook = SAMPLERS[name]
    result = await run_async(
        lambda: DataLoader(SlowKeys(), in_order=in_order, prefetch_factor=3, **kwargs(seed)),
        stop_epoch,
        stop,
        hook,
    )
    compare(result, in_order)


def test_out_of_order_checkpoint_records_batches_past_the_prefix() -> None:
    # Key 0 is slow: batches 1.. arrive before batch 0, and the state must list them.
    def make() -> DataLoader:
        return DataLoader(
            SlowKeys(), batch_size=1, in_order=False, prefetch_factor=6, shuffle=False
        )

    state = check_resume(make, 0, 2, in_order=False)
    assert state["batches"] == 0 and state["received"], state


def test_state_between_epochs_resumes_the_next_epoch() -> None:
    loader = DataLoader(Keys(), batch_size=4, shuffle=True, generator=5)
    first = [flat(b) for b in loader]
    state = roundtrip(loader.state_dict())
    assert not state["in_progress"] and state["epoch"] == 1
    second = [flat(b) for b in loader]
    resumed = DataLoader(Keys(), batch_size=4, shuffle=True, generator=5)
    resumed.load_state_dict(state)
    assert [flat(b) for b in resumed] == second != first


def test_fresh_state_resumes_from_the_first_epoch() -> None:
    make = lambda: DataLoader(Keys(), batch_size=4, shuffle=True, generator=1)  # noqa: E731
    state = roundtrip(make().state_dict())
    assert state["epoch"] == 0 and not state["in_progress"]
    resumed = make()
    resumed.load_state_dict(state)
    assert [flat(b) for b in resumed] == [flat(b) for b in make()]


def test_resumed_epochs_draw_the_same_worker_base_seed() -> None:
    loader = DataLoader(Keys(), batch_size=4, generator=3)
    it = iter(loader)
    next(it)
    state = roundtrip(loader.state_dict())
    it.close()
    resumed = DataLoader(Keys(), batch_size=4, generator=3)
    resumed.load_state_dict(state)
    resumed_it = iter(resumed)
    next(resumed_it)
    assert resumed.state_dict()["base_seed"] == state["base_seed"]
    resumed_it.close()


def test_state_that_does_not_fit_is_refused() -> None:
    state = DataLoader(Keys(), batch_size=4, shuffle=True, generator=1).state_dict()
    with pytest.raises(ValueError, match="generator"):
        DataLoader(Keys(), batch_size=4, shuffle=True).load_state_dict(state)
    with pytest.raises(ValueError, match="batch_size=4, this loader has batch_size=None"):
        DataLoader(Keys(), batch_size=None, sampler=Reversed(), generator=1).load_state_dict(state)
    with pytest.raises(ValueError, match="version"):
        DataLoader(Keys()).load_state_dict({**state, "version": 99})


# -- worker processes ----------------------------------------------------------------------


def from_the_end(stop: int, batches: int) -> int:
    """``stop`` as a batch count: a negative one counts from the end of the epoch.

    -1: after the last batch (the epoch's end seen), -2: at the last batch, -3: one before.
    """
    return stop if stop >= 0 else batches + 2 + stop


# The hard stops, in every case (hypothesis adds random ones): before the first batch,
# after it, mid-epoch, one before the last, at the last and after the last batch, with 1
# to 3 workers (the epochs have 4 to 23 batches of sizes that do not divide 23).
HARD_STOPS = [
    example(stop_epoch=0, stop=0, seed=0, workers=2),
    example(stop_epoch=0, stop=1, seed=1, workers=1),
    example(stop_epoch=1, stop=3, seed=2, workers=3),
    example(stop_epoch=2, stop=-3, seed=3, workers=2),
    example(stop_epoch=1, stop=-2, seed=4, workers=3),
    example(stop_epoch=0, stop=-1, seed=5, workers=1),
]


def hard_stops(test: Callable[..., None]) -> Callable[..., None]:
    for hard in reversed(HARD_STOPS):
        test = hard(test)
    return test


@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")
@pytest.mark.parametrize("in_order", [True, False], ids=["in_order", "any_order"])
@pytest.mark.parametrize("name", list(SAMPLERS))
@settings(max_examples=2, deadline=None)  # a pool start costs ~0.1 s: few examples per case
@hard_stops
@given(
    stop_epoch=st.integers(0, EPOCHS - 1),
    stop=st.integers(-3, 8),
    seed=st.integers(0, 99),
    workers=st.integers(1, 3),
)
def test_resume_with_workers(
    name: str, in_order: bool, stop_epoch: int, stop: int, seed: int, workers: int
) -> None:
    kwargs, hook = SAMPLERS[name]
    dataset = Keys() if in_order else SlowKeys()

    def make(num_workers: int = workers) -> DataLoader:
        return DataLoader(
            dataset,
            num_workers=num_workers,
            persistent_workers=num_workers > 0,
            in_order=in_order,
            **kwargs(seed),
        )

    stop = from_the_end(stop, len(make(0)))
    # Workers change neither the batches nor their order: the reference runs without any.
    check_resume(make, stop_epoch, stop, in_order=in_order, hook=hook, reference=lambda: make(0))


# -- iterable datasets ---------------------------------------------------------------------


@pytest.mark.parametrize("batch_size", [3, None])
@pytest.mark.parametrize("in_order", [True, False], ids=["in_order", "any_order"])
@pytest.mark.parametrize("dataset", [Stream, AsyncStream])
@EXAMPLES
@given(stop_epoch=st.integers(0, EPOCHS - 1), stop=st.integers(0, 9))
def test_resume_iterable_dataset(
    dataset: type[Stream], in_order: bool, batch_size: int | None, stop_epoch: int, stop: int
) -> None:
    check_resume(
        lambda: DataLoader(dataset(), batch_size=batch_size, in_order=in_order, prefetch_factor=4),
        stop_epoch,
        stop,
        in_order=in_order,
    )


@pytest.mark.asyncio
@settings(max_examples=6, deadline=None)
@given(stop=st.integers(0, 9))
async def test_resume_iterable_dataset_async_for(stop: int) -> None:
    result = await run_async(lambda: DataLoader(AsyncStream(), batch_size=3), 1, stop, None)
    compare(result, True)


def test_iterable_dataset_without_state_cannot_checkpoint() -> None:
    loader = DataLoader(PlainStream(), batch_size=4)
    with pytest.raises(TypeError, match="PlainStream has no state_dict"):
        loader.state_dict()
    it = iter(loader)
    next(it)
    with pytest.raises(TypeError, match="state_dict"):
        loader.state_dict()
    it.close()


class ShardedStream:
    """Worker ``w`` of ``n`` streams samples w, w+n, w+2n, ... (all of them without workers)."""

    def __init__(self, n: int = N) -> None:
        self.n = n
        self.position = 0  # samples taken from this worker's shard by the current iter()
        self._resume_at = 0

    def __iter__(self) -> Iterator[int]:
        info = aioload.get_worker_info()
        first, step = (0, 1) if info is None else (info.id, info.num_workers)
        start, self._resume_at = self._resume_at, 0
        for index, sample in enumerate(range(first, self.n, step)):
            if index >= start:
                self.position = index + 1
                yield sample * 10

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._resume_at = state["position"]


@pytest.mark.parametrize(
    ("workers", "batch_size", "in_order"),
    [(2, 3, True), (2, 3, False), (3, None, True), (2, 4, True)],
)
@FEW
@example(stop_epoch=0, stop=0)  # the hard stops, as for map-style datasets above
@example(stop_epoch=0, stop=1)
@example(stop_epoch=1, stop=5)  # past the end of the shortest shard (2 workers, 3 a batch)
@example(stop_epoch=2, stop=-3)
@example(stop_epoch=1, stop=-2)
@example(stop_epoch=0, stop=-1)
@given(stop_epoch=st.integers(0, EPOCHS - 1), stop=st.integers(-3, 9))
def test_resume_iterable_dataset_with_workers(
    workers: int, batch_size: int | None, in_order: bool, stop_epoch: int, stop: int
) -> None:
    # Each worker resumes its own shard; in order, the round-robin goes on with the next worker
    # (23 samples: the shards end at different batches, so exhausted workers are skipped too).
    shards = [len(range(worker, N, workers)) for worker in range(workers)]
    stop = from_the_end(stop, sum(math.ceil(size / (batch_size or 1)) for size in shards))

    def make() -> DataLoader:
        return DataLoader(
            ShardedStream(),
            batch_size=batch_size,
            num_workers=workers,
            persistent_workers=True,
            in_order=in_order,
        )

    state = check_resume(make, stop_epoch, stop, in_order=in_order)
    if state["in_progress"]:
        assert len(state["dataset"]["workers"]) == workers


def test_worker_stream_states_must_match_num_workers() -> None:
    loader = DataLoader(ShardedStream(), batch_size=3, num_workers=2, persistent_workers=True)
    with loader:
        it = iter(loader)
        next(it)
        state = roundtrip(loader.state_dict())
        it.close()
    assert state["dataset"]["next_worker"] == 1
    with pytest.raises(ValueError, match="taken with num_workers=2, this loader has num_workers=3"):
        DataLoader(ShardedStream(), batch_size=3, num_workers=3).load_state_dict(state)
    state["fits"]["num_workers"] = 3  # altered to fit: the per-worker states still do not
    with pytest.raises(ValueError, match="one stream state per worker"):
        DataLoader(ShardedStream(), batch_size=3, num_workers=3).load_state_dict(state)
