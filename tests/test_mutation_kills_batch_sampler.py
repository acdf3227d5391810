"""BatchSampler states between iterations and loading errors (aioload/samplers/batch.py).

Written for the survivors of the mutation run (docs/testing/mutation.md): a state taken
between iterations says no batch of an iteration was yielded, a loaded state reads back,
and an inner sampler's refusal says it came from the inner state.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from aioload import BatchSampler, RandomSampler, SequentialSampler


def roundtrip(state: dict[str, Any]) -> dict[str, Any]:
    back: dict[str, Any] = json.loads(json.dumps(state))
    return back


def test_a_state_between_iterations_counts_no_batch() -> None:
    batches = BatchSampler(RandomSampler(range(10), generator=0), 3, False)
    assert batches.state_dict()["batches"] == 0  # before the first iteration
    list(batches)
    state = batches.state_dict()
    assert (state["in_progress"], state["batches"]) == (False, 0)


def test_a_loaded_state_between_iterations_reads_back_and_resumes_the_next_epoch() -> None:
    reference = BatchSampler(RandomSampler(range(10), generator=0), 3, False)
    epochs = [list(reference) for _ in range(2)]
    interrupted = BatchSampler(RandomSampler(range(10), generator=0), 3, False)
    list(interrupted)
    state = roundtrip(interrupted.state_dict())
    resumed = BatchSampler(RandomSampler(range(10), generator=1), 3, False)
    resumed.load_state_dict(state)
    assert resumed.state_dict() == state
    assert list(resumed) == epochs[1]


def test_an_inner_refusal_is_noted_as_the_inner_samplers() -> None:
    state = roundtrip(BatchSampler(RandomSampler(range(10), generator=0), 3, False).state_dict())
    state["sampler"]["type"] = "SomethingElse"
    with pytest.raises(ValueError) as info:
        BatchSampler(RandomSampler(range(10), generator=0), 3, False).load_state_dict(state)
    assert "raised while loading the BatchSampler's inner sampler state" in info.value.__notes__


def test_resuming_after_k_batches_yields_the_rest() -> None:
    batches = BatchSampler(SequentialSampler(range(10)), 4, False)
    iterator = iter(batches)
    assert next(iterator) == [0, 1, 2, 3]
    state = roundtrip(batches.state_dict())
    assert (state["in_progress"], state["batches"]) == (True, 1)
    resumed = BatchSampler(SequentialSampler(range(10)), 4, False)
    resumed.load_state_dict(state)
    assert list(resumed) == [[4, 5, 6, 7], [8, 9]]
