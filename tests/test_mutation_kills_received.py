"""What an epoch records of the batches its consumer received (aioload/pipeline/received.py).

Written for the survivors of the mutation run (docs/testing/mutation.md): batches that
deliver nothing (every item skipped under ``on_error='skip'``) count as received, so a
checkpoint taken after them does not fetch them again; and the record's defaults are
those of a fresh, in-order, non-stream epoch.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import aioload
from aioload import DataLoader
from aioload.pipeline.received import Received


def test_a_fresh_record_is_in_order_from_batch_zero_and_tracks_no_stream() -> None:
    record = Received()
    assert record.position() == (0, [])
    assert record.stream_states is None and record.stream_state is None
    # In order, receiving batch 3 means 0..2 went out (or had nothing) before it.
    record.receive(3)
    assert record.position() == (4, [])
    assert not record.finished


def test_out_of_order_receipts_wait_for_the_prefix() -> None:
    record = Received(in_order=False)
    record.receive(2)
    record.receive(1)
    assert record.position() == (0, [1, 2])
    record.receive(0)
    assert record.position() == (3, [])
    record.receive(1)  # a batch below ``done`` changes nothing
    assert record.position() == (3, [])


def test_batches_with_nothing_to_deliver_count_as_received() -> None:
    record = Received(in_order=False)
    record.receive(2)
    record.nothing_for(0)
    # The loop's reports are counted on the consumer's side, when it next looks.
    assert record.position() == (1, [2])
    record.nothing_for(4)
    record.nothing_for(1)
    assert record.position() == (3, [4])
    record.receive(3)
    assert record.position() == (5, [])


def test_nothing_reported_before_a_receipt_is_counted_first() -> None:
    record = Received(in_order=False)
    record.nothing_for(0)
    record.nothing_for(2)
    record.receive(1)
    assert record.position() == (3, [])


def test_a_resumed_record_starts_at_done_with_its_received_batches() -> None:
    record = Received(False, 5, [7, 8])
    assert record.skip == frozenset({7, 8})
    assert record.position() == (5, [7, 8])
    record.nothing_for(6)
    record.receive(5)
    assert record.position() == (9, [])


def test_a_streams_empty_batches_are_past_its_end_and_not_counted() -> None:
    record = Received(in_order=False, stream=True)
    record.receive(0)
    record.nothing_for(1)
    assert record.position() == (1, [])


def test_a_stream_record_keeps_each_batchs_state_until_it_is_received() -> None:
    record = Received(stream=True, stream_state="start")
    assert record.stream_states == {}
    record.stream_states[0] = (None, "after 0")
    record.stream_states[1] = (None, "after 1")
    record.receive(0)
    assert (record.done, record.stream_state) == (1, "after 0")
    assert record.stream_states == {1: (None, "after 1")}
    record.receive(1)
    assert (record.done, record.stream_state) == (2, "after 1")


def test_a_worker_stream_record_drops_only_that_workers_older_states() -> None:
    record = Received(stream=True, stream_state={"workers": [None, None], "next_worker": 0})
    states = record.stream_states
    assert states is not None
    states[0] = (0, "w0 after 0")
    states[1] = (1, "w1 after 1")
    states[2] = (0, "w0 after 2")
    states[3] = (1, "w1 after 3")
    # Batch 1 of worker 1 is still on its way when worker 0's batch 2 is received
    # (out of order): its state must survive the clean-up of worker 0's older ones.
    record.receive(0)
    record.receive(2)
    assert record.stream_state == {"workers": ["w0 after 2", None], "next_worker": 1}
    assert set(states) == {1, 3}
    record.receive(1)
    assert record.stream_state == {"workers": ["w0 after 2", "w1 after 1"], "next_worker": 0}


class FailsOnce(aioload.Dataset):
    """Key 1 fails on its first read only; key 0 is slow, so batch 0 arrives last."""

    def __init__(self, fail: bool) -> None:
        self.fail = fail

    def __len__(self) -> int:
        return 4

    async def __getitem__(self, key: int) -> int:
        if key == 0:
            await asyncio.sleep(0.2)
        if key == 1 and self.fail:
            self.fail = False
            raise OSError("a transient read failure")
        return key


def loader(fail: bool) -> DataLoader:
    return DataLoader(FailsOnce(fail), batch_size=1, in_order=False, on_error="skip")


def test_a_skipped_batch_is_not_fetched_again_by_a_resumed_epoch() -> None:
    interrupted = loader(fail=True)
    it = iter(interrupted)
    got = sorted(int(np.asarray(next(it)).reshape(-1)[0]) for _ in range(3))
    assert got == [0, 2, 3]
    state: dict[str, Any] = json.loads(json.dumps(interrupted.state_dict()))
    it.close()
    # Every batch was received or skipped: the state says the epoch's 4 batches are done.
    assert state["in_progress"] and (state["batches"], state["received"]) == (4, [])
    resumed = loader(fail=False)
    resumed.load_state_dict(state)
    # The batch skipped before the checkpoint is not delivered after it.
    assert list(resumed) == []


class FailingShard:
    """Worker ``w`` of 2 streams w, w+2, ...; worker 0's second read fails, late."""

    def __init__(self) -> None:
        self.position = 0

    def __iter__(self) -> Iterator[int]:
        info = aioload.get_worker_info()
        worker = 0 if info is None else info.id
        for index, sample in enumerate(range(worker, 12, 2)):
            if worker == 0 and index == 1:
                # Late, so that worker 1's next batches are read (and their states
                # recorded) ahead of the consumer before this one fails.
                time.sleep(0.3)
                raise ValueError("shard read failed")
            self.position = index + 1
            yield sample

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = state["position"]


def test_a_failed_stream_batch_raises_its_own_error_with_states_read_ahead() -> None:
    loader = DataLoader(FailingShard(), batch_size=1, num_workers=2)
    it = iter(loader)
    try:
        assert [int(np.asarray(next(it))[0]) for _ in range(2)] == [0, 1]
        with pytest.raises(ValueError, match="shard read failed"):
            next(it)
    finally:
        it.close()
