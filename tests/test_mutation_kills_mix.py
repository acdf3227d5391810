"""MixDataset's states, closing and messages (aioload/sources/mix.py).

Written for the survivors of the mutation run (docs/testing/mutation.md): a loaded state
reads back as loaded, an async mix's state after its iteration is a plain one, a
state that is not a dict is refused as a ValueError, a sync source stopped early is
closed at once, and the messages name every source they are about.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from aioload import IterableDataset
from aioload.sources import MixDataset


class Counting(IterableDataset):
    """``tag * 1000 + i`` for ``i < n``; with a state; records whether it was closed."""

    def __init__(self, tag: int, n: int = 50) -> None:
        self.tag, self.n = tag, n
        self.taken = 0
        self._resume_at = 0
        self.closed = 0

    def __iter__(self) -> Iterator[int]:
        start, self._resume_at = self._resume_at, 0
        try:
            for i in range(start, self.n):
                self.taken = i + 1
                yield self.tag * 1000 + i
        finally:
            self.closed += 1

    def state_dict(self) -> dict[str, int]:
        return {"taken": self.taken}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._resume_at = state["taken"]


class AsyncCounting(Counting):
    __iter__ = None  # type: ignore[assignment]

    async def __aiter__(self) -> AsyncIterator[int]:
        start, self._resume_at = self._resume_at, 0
        for i in range(start, self.n):
            await asyncio.sleep(0)
            self.taken = i + 1
            yield self.tag * 1000 + i


class Stateless(IterableDataset):
    def __iter__(self) -> Iterator[int]:
        return iter(range(3))


def mix(kind: type[Counting] = Counting, **kwargs: Any) -> MixDataset:
    return MixDataset([kind(0), kind(1)], [1, 1], seed=7, **kwargs)


def test_a_loaded_state_reads_back_as_loaded_and_loads_again() -> None:
    first = mix()
    iterator = iter(first)
    head = [next(iterator) for _ in range(9)]
    state = json.loads(json.dumps(first.state_dict()))
    rest = list(iterator)
    loaded = mix()
    loaded.load_state_dict(state)
    # Not iterated yet: its state is the one it was given, and it loads elsewhere too.
    assert loaded.state_dict() == state
    again = mix()
    again.load_state_dict(loaded.state_dict())
    assert head and rest and list(again) == rest


def test_an_async_mix_state_after_its_iteration_is_a_plain_state() -> None:
    async def run() -> tuple[list[int], dict[str, Any]]:
        dataset = mix(AsyncCounting, stop="first")
        samples = [sample async for sample in dataset]
        return samples, dataset.state_dict()

    samples, state = asyncio.run(run())
    assert samples
    # The iteration is over: a state between iterations, JSON-serialisable.
    assert json.loads(json.dumps(state)) == state
    assert isinstance(state["draws"], int) and isinstance(state["epoch"], int)


@pytest.mark.parametrize("state", ["MixDataset", ["type", "MixDataset"], 3, None])
def test_a_state_that_is_not_a_dict_is_refused_as_a_value_error(state: Any) -> None:
    with pytest.raises(ValueError, match="a MixDataset state should be a dict"):
        mix().load_state_dict(state)


class Reader:
    """An iterator with ``close()`` (a file-like reader, not a generator)."""

    def __init__(self, source: Closable) -> None:
        self.source = source
        self.i = 0

    def __iter__(self) -> Reader:
        return self

    def __next__(self) -> int:
        self.i += 1
        return self.i

    def close(self) -> None:
        self.source.closed.append(self)


class Closable(IterableDataset):
    def __init__(self) -> None:
        self.closed: list[Reader] = []

    def __iter__(self) -> Reader:
        return Reader(self)


def test_a_sync_source_stopped_early_is_closed_at_once() -> None:
    # A reader that garbage collection would not close: the mix closes it itself.
    sources = [Closable(), Closable()]
    iterator = iter(MixDataset(sources, [1, 1], seed=7))
    [next(iterator) for _ in range(5)]
    iterator.close()  # type: ignore[attr-defined]
    assert [len(s.closed) for s in sources] == [1, 1]


def test_messages_name_one_source_or_several() -> None:
    with pytest.raises(AttributeError, match=r"sources 1 \(Stateless\), 2 \(Stateless\) have"):
        MixDataset([Counting(0), Stateless(), Stateless()], [1, 1, 1]).state_dict()
    with pytest.raises(AttributeError, match=r"MixDataset has no state_dict\(\): source 1 "):
        MixDataset([Counting(0), Stateless()], [1, 1]).state_dict()


def test_repr_names_the_sources_weights_and_stop() -> None:
    assert repr(MixDataset([Counting(0), Stateless()], [2, 1], stop="longest")) == (
        "MixDataset([Counting, Stateless], weights=[2.0, 1.0], stop='longest')"
    )
