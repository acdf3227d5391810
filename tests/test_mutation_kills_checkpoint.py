"""Loader checkpoints: elastic streams, tampered positions, generator messages
(aioload/pipeline/checkpoint.py).

Written for the survivors of the mutation run (docs/testing/mutation.md): a stream that
re-splits itself (``resume_streams``) resumes exactly once with as many workers or
another number of them, and is still held to every other field of the fit; a state
naming a received batch past the epoch is refused; a bad generator state is refused
naming the loader and the field.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import aioload
from aioload import DataLoader

N = 24


class Elastic(aioload.IterableDataset):
    """Samples ``0..N-1``, worker ``w`` of ``k`` taking every ``k``-th from ``w``.

    Its state is what its share has left; ``resume_streams`` pools what every worker
    had left and deals it out again to any number of workers.
    """

    def __init__(self) -> None:
        self.left: list[int] | None = None  # what this worker's share has left to yield
        self._resume: list[int] | None = None

    def __iter__(self) -> Iterator[int]:
        info = aioload.get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        share, self._resume = self._resume, None
        if share is None:
            share = list(range(worker, N, workers))
        for position, sample in enumerate(share):
            self.left = share[position + 1 :]
            yield sample

    def state_dict(self) -> dict[str, Any]:
        return {"left": self.left}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._resume = state["left"]

    def resume_streams(
        self, states: list[Any], num_workers: int, batch_size: int | None
    ) -> list[Any]:
        count = max(num_workers, 1)
        if len(states) == count and all(s is not None for s in states):
            return states  # they fit as they are
        left: list[int] = []
        for worker, state in enumerate(states):
            left += list(range(worker, N, len(states))) if state is None else state["left"]
        left.sort()
        return [{"left": left[w::count]} for w in range(count)]


def samples(batches: Any) -> list[int]:
    return [int(x) for batch in batches for x in np.asarray(batch).reshape(-1)]


def interrupted(workers: int, batches: int) -> tuple[list[int], dict[str, Any]]:
    """The samples of the first ``batches`` batches, and the state just after them."""
    loader = DataLoader(Elastic(), batch_size=2, num_workers=workers)
    iterator = iter(loader)
    try:
        head = samples(next(iterator) for _ in range(batches))
        state: dict[str, Any] = json.loads(json.dumps(loader.state_dict()))
    finally:
        iterator.close()  # type: ignore[attr-defined]
    return head, state


def resumed(state: dict[str, Any], workers: int) -> list[int]:
    loader = DataLoader(Elastic(), batch_size=2, num_workers=workers)
    loader.load_state_dict(state)
    return samples(loader)


def test_an_elastic_stream_resumes_exactly_once_without_workers() -> None:
    head, state = interrupted(0, 3)
    assert head == list(range(6))
    assert resumed(state, 0) == list(range(6, N))


@pytest.mark.parametrize("workers", [2, 0])
def test_an_elastic_stream_resumes_exactly_once_from_two_workers(workers: int) -> None:
    head, state = interrupted(2, 3)
    assert state["fits"]["num_workers"] == 2
    rest = resumed(state, workers)
    assert sorted(head + rest) == list(range(N))  # every sample once, none twice


def test_an_elastic_stream_takes_another_number_of_workers_but_no_other_change() -> None:
    _, state = interrupted(0, 3)
    DataLoader(Elastic(), batch_size=2, num_workers=2).load_state_dict(state)
    with pytest.raises(ValueError, match="taken with batch_size=2, this loader has batch_size=3"):
        DataLoader(Elastic(), batch_size=3).load_state_dict(state)


class Keys(aioload.Dataset):
    def __len__(self) -> int:
        return 10

    def __getitem__(self, key: int) -> int:
        return key


def test_a_received_batch_past_the_epoch_is_refused() -> None:
    def loader() -> DataLoader:
        return DataLoader(Keys(), batch_size=2, in_order=False)

    taking = loader()
    iterator = iter(taking)
    next(iterator)
    state = json.loads(json.dumps(taking.state_dict()))
    iterator.close()  # type: ignore[attr-defined]
    total = len(taking)
    for received, ok in (([total - 1], True), ([total], False)):
        tampered = {**state, "batches": 0, "received": received}
        tampered["sampler"] = {**state["sampler"], "batches": 0}
        if ok:
            loader().load_state_dict(tampered)
            continue
        with pytest.raises(ValueError, match=f"names batch {total}, past this epoch's {total}"):
            loader().load_state_dict(tampered)


def test_a_bad_numpy_generator_state_is_refused_naming_the_loader() -> None:
    def loader() -> DataLoader:
        return DataLoader(Keys(), batch_size=2, shuffle=True, generator=0)

    state = json.loads(json.dumps(loader().state_dict()))
    state["generator"]["state"] = "not a state"
    with pytest.raises(ValueError, match=r"^DataLoader state field 'generator' is not a valid"):
        loader().load_state_dict(state)


@pytest.mark.slow  # real torch
def test_a_bad_torch_generator_state_is_refused_naming_the_loader_and_the_field() -> None:
    torch = pytest.importorskip("torch")

    def loader() -> DataLoader:
        return DataLoader(Keys(), batch_size=2, generator=torch.Generator().manual_seed(0))

    state = json.loads(json.dumps(loader().state_dict()))
    state["generator"]["state"] = [1, 2, 3]
    with pytest.raises(ValueError, match=r"^DataLoader state field 'generator' is not a valid"):
        loader().load_state_dict(state)
