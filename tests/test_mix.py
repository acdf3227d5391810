"""MixDataset: weighted mixing of streams, reproducible by seed and epoch, resumable.

Sources live at module level: worker processes unpickle them. Source ``tag`` yields
``tag * 100_000 + epoch * 10_000 + i`` for its samples ``i`` (worker ``w`` of ``k`` takes
``i = w, w + k, ...``), so a sample says where it came from.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import numpy as np
import pytest

from aioload import DataLoader, IterableDataset, RetryPolicy, StreamGuard, get_worker_info
from aioload.sources import MixDataset

WEIGHTS = [0.5, 0.3, 0.2]


class Source(IterableDataset):
    """``n`` samples (``n=None``: endless), split by worker; with a state and ``set_epoch``.

    Samples in ``bad`` fail to read, those in ``absent`` are not there (the reference).
    """

    def __init__(
        self,
        tag: int,
        n: int | None = 100,
        bad: frozenset[int] = frozenset(),
        absent: frozenset[int] = frozenset(),
    ) -> None:
        self.tag, self.n, self.bad, self.absent = tag, n, bad, absent
        self.epoch = 0
        self.taken = 0
        self._resume_at = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def numbers(self) -> Iterator[int]:
        info = get_worker_info()
        first, step = (0, 1) if info is None else (info.id, info.num_workers)
        start, self._resume_at = self._resume_at, 0
        numbers = itertools.count(first, step) if self.n is None else range(first, self.n, step)
        for position, i in enumerate(numbers):
            if position >= start and i not in self.absent:
                self.taken = position + 1
                yield i

    def value(self, i: int) -> int:
        if i in self.bad:
            raise KeyError(f"sample {i} of source {self.tag} is broken")
        return self.tag * 100_000 + self.epoch * 10_000 + i

    def __iter__(self) -> Iterator[int]:
        for i in self.numbers():
            yield self.value(i)

    def guarded_stream(self, guard: StreamGuard) -> Iterator[Any]:
        for i in self.numbers():
            try:
                value = self.value(i)
            except KeyError as error:
                yield guard.skip((self.tag, i), error)
                continue
            yield value

    def state_dict(self) -> dict[str, int]:
        return {"taken": self.taken}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._resume_at = state["taken"]


class AsyncSource(Source):
    """:class:`Source` as an async stream."""

    __iter__ = None  # type: ignore[assignment]

    async def __aiter__(self) -> AsyncIterator[int]:
        for i in self.numbers():
            await asyncio.sleep(0)
            yield self.value(i)

    async def guarded_stream(self, guard: StreamGuard) -> AsyncIterator[Any]:  # type: ignore[override]
        for sample in Source.guarded_stream(self, guard):
            await asyncio.sleep(0)
            yield sample


class Plain(IterableDataset):
    """A stream without a state, nor guarded_stream."""

    def __iter__(self) -> Iterator[int]:
        return iter(range(300_000, 300_010))


def tag(sample: int) -> int:
    return sample // 100_000


def flat(loader: Any) -> list[int]:
    return [int(x) for batch in loader for x in np.asarray(batch).reshape(-1)]


def take(loader: DataLoader, batches: int) -> list[int]:
    """The samples of the loader's first ``batches`` batches (for endless mixes)."""
    iterator = iter(loader)
    try:
        return [int(x) for batch in itertools.islice(iterator, batches) for x in batch]
    finally:
        iterator.close()  # type: ignore[attr-defined]


def sources(kind: type[Source] = Source, n: int | None = 100) -> list[Source]:
    return [kind(t, n) for t in range(3)]


@pytest.mark.parametrize("kind", [Source, AsyncSource])
def test_proportions_follow_the_weights(kind: type[Source]) -> None:
    mix = MixDataset(sources(kind, None), WEIGHTS, seed=11, stop="never")
    got = take(DataLoader(mix, batch_size=1000), 50)
    assert len(got) == 50_000
    counts = collections.Counter(map(tag, got))
    for source, weight in enumerate(WEIGHTS):
        assert abs(counts[source] / len(got) - weight) <= 0.02 * weight
    # Within each source the samples keep the source's order.
    for source in range(3):
        own = [sample % 100_000 for sample in got if tag(sample) == source]
        assert own == list(range(len(own)))


@pytest.mark.parametrize("workers", [0, 2])
def test_the_sequence_depends_on_the_seed_only(workers: int) -> None:
    def run(seed: int) -> list[int]:
        mix = MixDataset(sources(), WEIGHTS, seed=seed, stop="longest")
        return flat(DataLoader(mix, batch_size=7, num_workers=workers))

    first = run(5)
    assert sorted(first) == sorted(t * 100_000 + i for t in range(3) for i in range(100))
    assert run(5) == first
    assert run(6) != first


@pytest.mark.parametrize("workers", [0, 2])
def test_each_worker_mixes_its_own_split(workers: int) -> None:
    mix = MixDataset(sources(n=40), [1, 1, 1], seed=0, stop="longest")
    loader = DataLoader(mix, batch_size=4, num_workers=workers)
    got = flat(loader)
    assert collections.Counter(got) == collections.Counter(
        t * 100_000 + i for t in range(3) for i in range(40)
    )


def test_set_epoch_reaches_the_sources_and_changes_the_draws() -> None:
    mix = MixDataset(sources(), WEIGHTS, seed=1, stop="first")
    first = list(mix)
    mix.set_epoch(2)
    assert [source.epoch for source in mix.datasets] == [2, 2, 2]  # type: ignore[attr-defined]
    second = list(mix)
    assert {sample // 10_000 % 10 for sample in second} == {2}
    assert [tag(s) for s in second] != [tag(s) for s in first]
    mix.set_epoch(0)
    assert list(mix) == first
    with pytest.raises(ValueError, match="epoch"):
        mix.set_epoch(-1)


def test_stop_first_ends_with_the_first_source_to_run_out() -> None:
    mix = MixDataset([Source(0, 5), Source(1, 100)], [1, 1], seed=0, stop="first")
    got = list(mix)
    counts = collections.Counter(map(tag, got))
    assert counts[0] == 5 and 0 < counts[1] < 100  # it ended at source 0's sixth draw
    assert list(mix) == got


def test_stop_longest_goes_on_until_every_source_ends() -> None:
    mix = MixDataset([Source(0, 5), Source(1, 50), Source(2, 20)], [5, 1, 1], stop="longest")
    got = list(mix)
    assert collections.Counter(map(tag, got)) == {0: 5, 1: 50, 2: 20}
    # Source 0 (weight 5 of 7) runs out early; the end of the mix is the others'.
    assert all(tag(s) != 0 for s in got[-40:])


@pytest.mark.asyncio
async def test_stop_never_starts_sources_again() -> None:
    mix = MixDataset([AsyncSource(0, 3), Source(1, 5)], [1, 1], seed=2, stop="never")
    got: list[int] = []
    async for sample in mix:
        got.append(sample)
        if len(got) == 200:
            break
    for source, n in ((0, 3), (1, 5)):
        own = [s % 100_000 for s in got if tag(s) == source]
        assert own == [i % n for i in range(len(own))]  # again from the start, in order
    with pytest.raises(ValueError, match=r"source 1 .*no sample from its start"):
        list(MixDataset([Source(0, 3), Source(1, 0)], [1, 1], stop="never"))


@pytest.mark.parametrize("stop", ["first", "longest", "never"])
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("kind", [Source, AsyncSource])
def test_a_mix_resumes_exactly_where_it_stopped(
    kind: type[Source], workers: int, stop: str
) -> None:
    endless = stop == "never"

    def make() -> DataLoader:
        parts = [kind(0, 30), kind(1, 60), kind(2, 15)]
        mix = MixDataset(parts, WEIGHTS, seed=4, stop=stop)  # type: ignore[arg-type]
        return DataLoader(mix, batch_size=5, num_workers=workers, persistent_workers=workers > 0)

    batches = 30 if endless else None
    reference = make()
    with reference:
        everything = take(reference, 30) if endless else flat(reference)
    interrupted = make()
    with interrupted:
        iterator = iter(interrupted)
        head = [int(x) for batch in itertools.islice(iterator, 7) for x in batch]
        state = json.loads(json.dumps(interrupted.state_dict()))
        iterator.close()  # type: ignore[attr-defined]
    assert head == everything[: len(head)]
    resumed = make()
    resumed.load_state_dict(state)
    with resumed:
        rest = take(resumed, 30 - 7) if batches else flat(resumed)
    assert head + rest == everything


def batches_of(loader: DataLoader, count: int | None = None) -> list[list[int]]:
    """The loader's batches (the first ``count`` of them for an endless mix), as lists."""
    iterator = iter(loader)
    try:
        return [[int(x) for x in batch] for batch in itertools.islice(iterator, count)]
    finally:
        iterator.close()  # type: ignore[attr-defined]


def exhausted_flags(state: Any) -> list[list[bool]]:
    """The ``exhausted`` flags of every MixDataset state inside a loader's state."""
    if isinstance(state, dict):
        own = [state["exhausted"]] if state.get("type") == "MixDataset" else []
        return own + [flags for value in state.values() for flags in exhausted_flags(value)]
    if isinstance(state, list):
        return [flags for value in state for flags in exhausted_flags(value)]
    return []


@pytest.mark.parametrize("stop", ["longest", "never"])
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("kind", [Source, AsyncSource])
def test_a_checkpoint_after_any_batch_resumes_exactly(
    kind: type[Source], workers: int, stop: str
) -> None:
    # Sources of 6, 20 and 4 samples: two run out early, so most checkpoints come after a
    # source has ended (dropped with "longest", started again with "never"). A checkpoint
    # after every batch, the first and the last included, each resumed in a new loader,
    # must go on exactly as the uninterrupted run did.
    endless = stop == "never"

    def make() -> DataLoader:
        parts = [kind(0, 6), kind(1, 20), kind(2, 4)]
        mix = MixDataset(parts, WEIGHTS, seed=4, stop=stop)  # type: ignore[arg-type]
        return DataLoader(mix, batch_size=3, num_workers=workers, persistent_workers=workers > 0)

    count = 14 if endless else None  # "never": the first 14 batches (3 restarts or more)
    with make() as reference:
        everything = batches_of(reference, count)
    assert len(everything) >= 10

    states = []
    with make() as checkpointing:
        iterator = iter(checkpointing)
        states.append(json.loads(json.dumps(checkpointing.state_dict())))
        seen = []
        for batch in itertools.islice(iterator, len(everything)):
            seen.append([int(x) for x in batch])
            states.append(json.loads(json.dumps(checkpointing.state_dict())))
        iterator.close()  # type: ignore[attr-defined]
    assert seen == everything  # taking states changes nothing
    if not endless:  # the case the states must carry: a source dropped before the end
        assert any(any(flags) for state in states[1:-1] for flags in exhausted_flags(state))

    for done, state in enumerate(states):
        resumed = make()
        resumed.load_state_dict(state)
        with resumed:
            rest = batches_of(resumed, None if count is None else count - done)
        assert everything[:done] + rest == everything, f"resumed after batch {done}"


def test_the_mix_state_holds_the_draws_and_each_source_state() -> None:
    mix = MixDataset(sources(n=10), WEIGHTS, seed=3, stop="longest")
    iterator = iter(mix)
    head = [next(iterator) for _ in range(12)]
    state = json.loads(json.dumps(mix.state_dict()))
    assert state["type"] == "MixDataset" and state["draws"] >= 12
    assert [s["taken"] for s in state["sources"] if s] == [
        sum(tag(x) == t for x in head) for t in range(3) if not state["exhausted"][t]
    ]
    rest = list(iterator)
    again = MixDataset(sources(n=10), WEIGHTS, seed=3, stop="longest")
    again.load_state_dict(state)
    assert list(again) == rest
    with pytest.raises(ValueError, match="MixDataset of 3 sources"):
        again.load_state_dict({**state, "sources": state["sources"][:2]})


@pytest.mark.parametrize("field", ["draws", "epoch"])
def test_a_mix_state_with_a_bool_count_is_refused(field: str) -> None:
    mix = MixDataset(sources(n=10), WEIGHTS, seed=3)
    state = {**mix.state_dict(), field: True}  # JSON's true: an int to isinstance
    with pytest.raises(ValueError):
        MixDataset(sources(n=10), WEIGHTS, seed=3).load_state_dict(state)


def test_a_source_without_state_dict_is_named() -> None:
    mix = MixDataset([Source(0), Plain()], [1, 1])
    with pytest.raises(AttributeError, match=r"source 1 \(Plain\) has no state_dict"):
        mix.state_dict()
    loader = DataLoader(mix, batch_size=4)
    with pytest.raises(TypeError, match="MixDataset has no state_dict") as info:
        loader.state_dict()
    assert any("source 1 (Plain)" in note for note in info.value.__notes__)
    assert flat(loader)  # it still loads


def by_worker(samples: list[int], workers: int) -> dict[int, list[int]]:
    """Each worker's samples in the order it read them (worker w reads i = w mod workers)."""
    split: dict[int, list[int]] = {}
    for sample in samples:
        split.setdefault(sample % 100_000 % max(1, workers), []).append(sample)
    return split


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("kind", [Source, AsyncSource])
def test_a_skipped_sample_uses_up_its_draw(kind: type[Source], workers: int) -> None:
    bad = frozenset({2, 3, 17})

    def loader(**faults: frozenset[int]) -> DataLoader:
        mix = MixDataset([kind(t, 30, **faults) for t in range(3)], WEIGHTS, seed=9, stop="first")
        return DataLoader(
            mix, batch_size=4, num_workers=workers, on_error="skip", retry=RetryPolicy()
        )

    skipping = loader(bad=bad)
    got = flat(skipping)
    clean = flat(loader())
    # What fails leaves a hole: the draws, and so the order of the rest, are unchanged (in
    # each worker's stream; which worker's batch comes next is the loader's round-robin).
    assert by_worker(got, workers) == by_worker(
        [x for x in clean if x % 100_000 not in bad], workers
    )
    assert {item.key for item in skipping.skipped} == {
        (tag(x), x % 100_000) for x in clean if x % 100_000 in bad
    }
    with pytest.raises(ValueError, match=r"source 1 \(Plain\) cannot skip"):
        DataLoader(MixDataset([Source(0), Plain()], [1, 1]), on_error="skip")


def test_sync_and_async_sources_mix() -> None:
    sync_mix = MixDataset(sources(n=10), WEIGHTS, stop="longest")
    assert sync_mix.is_async_stream is False
    mixed = MixDataset([Source(0, 10), AsyncSource(1, 10)], [1, 1], stop="longest")
    assert mixed.is_async_stream is True
    with pytest.raises(TypeError, match="async-only"):
        iter(mixed)
    assert sorted(flat(DataLoader(mixed, batch_size=3))) == [
        *range(10),
        *range(100_000, 100_010),
    ]

    async def collect() -> list[int]:
        return [sample async for sample in sync_mix]

    assert sorted(asyncio.run(collect())) == sorted(list(sync_mix))


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "words"),
    [
        (([], []), {}, ValueError, "at least one dataset"),
        (([Source(0)], [1, 2]), {}, ValueError, "1 datasets but 2 weights"),
        (([Source(0)], [0]), {}, ValueError, "positive finite"),
        (([Source(0)], [float("inf")]), {}, ValueError, "positive finite"),
        (([Source(0)], [True]), {}, ValueError, "positive finite"),
        (([Source(0)], ["1"]), {}, ValueError, "positive finite"),
        (([Source(0)], 1), {}, TypeError, "list of numbers"),
        (([42], [1]), {}, TypeError, "dataset 0 is a int"),
        (("abc", [1]), {}, TypeError, "list of iterable datasets"),
        (([Source(0)], [1]), {"seed": -1}, ValueError, "seed"),
        (([Source(0)], [1]), {"stop": "last"}, ValueError, "'first', 'longest', 'never'"),
    ],
)
def test_arguments_are_checked_at_construction(
    args: tuple[Any, Any], kwargs: dict[str, Any], error: type[Exception], words: str
) -> None:
    with pytest.raises(error, match=words):
        MixDataset(*args, **kwargs)
