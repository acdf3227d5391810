"""The fault policy for streams: retry, on_error='skip' and max_skipped on iterable datasets.

A stream opts in with ``guarded_stream(guard)`` (aioload.faults.guard); these streams are
in memory, so that what is tested is the protocol and the loader's side of it (batches,
skip records from workers, counts, limits). tests/test_sources_shard_faults.py runs it
over shards in object stores.

Datasets live at module level: worker processes unpickle them.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

import numpy as np
import pytest

from aioload import (
    DataLoader,
    IterableDataset,
    RetryPolicy,
    StreamGuard,
    TooManySkippedError,
    get_worker_info,
)
from aioload.faults.policy import FaultPolicy
from aioload.read.streams import SKIPS_PER_OUTCOME

FAST = RetryPolicy(attempts=3, backoff=0.0)


class Corrupt(ValueError):
    """A sample that cannot be parsed: not transient."""


class Rows(IterableDataset):
    """Rows ``0 .. n-1`` (worker ``w`` of ``k`` streams ``w, w + k, ...``).

    Rows in ``bad`` fail to parse; rows in ``flaky`` fail their first ``fails`` reads with a
    transient error; rows in ``absent`` are not there at all (the reference run). Without a
    policy (``__iter__``) the first failure ends the stream.
    """

    def __init__(
        self,
        n: int = 20,
        bad: frozenset[int] = frozenset(),
        flaky: frozenset[int] = frozenset(),
        fails: int = 1,
        absent: frozenset[int] = frozenset(),
        endless: bool = False,
    ) -> None:
        self.n, self.bad, self.flaky, self.fails = n, bad, flaky, fails
        self.absent, self.endless = absent, endless
        self.taken = 0  # rows of this worker's share passed over by the current iteration
        self._resume_at = 0

    def mine(self) -> Iterator[int]:
        info = get_worker_info()
        first, step = (0, 1) if info is None else (info.id, info.num_workers)
        start, self._resume_at = self._resume_at, 0
        rows = range(first, 10**9 if self.endless else self.n, step)
        for position, row in enumerate(rows):
            if position >= start and row not in self.absent:
                self.taken = position + 1
                yield row

    def read(self, row: int, attempts: dict[int, int]) -> int:
        attempts[row] = tried = attempts.get(row, 0) + 1
        if row in self.flaky and tried <= self.fails:
            raise ConnectionResetError(f"row {row}: connection reset (attempt {tried})")
        if row in self.bad or self.endless:
            raise Corrupt(f"row {row} is corrupt")
        return row

    def __iter__(self) -> Iterator[int]:
        attempts: dict[int, int] = {}
        for row in self.mine():
            yield self.read(row, attempts)

    def guarded_stream(self, guard: StreamGuard) -> Iterator[Any]:
        attempts: dict[int, int] = {}
        for row in self.mine():
            try:
                value = guard.retry_sync(self.read, row, attempts)
            except Exception as error:
                yield guard.skip(row, error, where=f"row {row}")
                continue
            yield value

    def state_dict(self) -> dict[str, int]:
        return {"taken": self.taken}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._resume_at = state["taken"]


class AsyncRows(Rows):
    """:class:`Rows` as an async stream (``__aiter__``; reads await)."""

    __iter__ = None  # type: ignore[assignment]

    async def aread(self, row: int, attempts: dict[int, int]) -> int:
        await asyncio.sleep(0)
        return self.read(row, attempts)

    async def __aiter__(self) -> AsyncIterator[int]:
        attempts: dict[int, int] = {}
        for row in self.mine():
            yield await self.aread(row, attempts)

    async def guarded_stream(self, guard: StreamGuard) -> AsyncIterator[Any]:  # type: ignore[override]
        attempts: dict[int, int] = {}
        for row in self.mine():
            try:
                value = await guard.retry(self.aread, row, attempts)
            except Exception as error:
                yield guard.skip(row, error, where=f"row {row}")
                continue
            yield value


class Plain(IterableDataset):
    def __iter__(self) -> Iterator[int]:
        return iter(range(4))


def batches(loader: DataLoader) -> list[list[int]]:
    return [np.asarray(batch).tolist() for batch in loader]


BAD = frozenset({3, 4, 11, 19})


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("kind", [Rows, AsyncRows])
def test_bad_samples_are_skipped_and_the_rest_keep_their_order(
    kind: type[Rows], workers: int
) -> None:
    loader = DataLoader(kind(bad=BAD), batch_size=4, num_workers=workers, on_error="skip")
    reference = DataLoader(kind(absent=BAD), batch_size=4, num_workers=workers)
    got = batches(loader)
    assert got == batches(reference)  # full batches of the good rows, in the same order
    assert sorted(row for batch in got for row in batch) == sorted(set(range(20)) - BAD)
    report = sorted(loader.skipped, key=lambda item: item.key)
    assert [item.key for item in report] == sorted(BAD)
    assert [item.where for item in report] == [f"row {row}" for row in sorted(BAD)]
    assert {item.error_type for item in report} == {"test_stream_faults.Corrupt"}
    # Worker w streams rows w, w + 2, ...: the skips come back from the worker that met them.
    expected = [None] * len(BAD) if workers == 0 else [row % 2 for row in sorted(BAD)]
    assert [item.worker for item in report] == expected
    stats = loader.stats().epoch
    assert stats.skipped == len(BAD) and stats.items == 20 - len(BAD)


@pytest.mark.parametrize("kind", [Rows, AsyncRows])
def test_transient_failures_are_retried(kind: type[Rows]) -> None:
    flaky = frozenset({0, 5, 6, 17})
    loader = DataLoader(kind(flaky=flaky, fails=2), batch_size=5, retry=FAST)
    assert batches(loader) == [list(range(i, i + 5)) for i in range(0, 20, 5)]
    assert loader.stats().epoch.retries == 2 * len(flaky)
    # Without retries the first transient error fails the batch, with its type.
    with pytest.raises(ConnectionResetError, match="row 0: connection reset"):
        batches(DataLoader(kind(flaky=flaky), batch_size=5, retry=RetryPolicy(attempts=1)))


def test_retries_used_up_then_skipped_with_the_attempts() -> None:
    loader = DataLoader(
        Rows(flaky=frozenset({7}), fails=99), batch_size=4, retry=FAST, on_error="skip"
    )
    rows = [0, 1, 2, 3, 4, 5, 6, *range(8, 20)]
    assert batches(loader) == [rows[i : i + 4] for i in range(0, len(rows), 4)]
    (item,) = loader.skipped
    assert (item.key, item.attempts, item.error_type) == (7, 3, "builtins.ConnectionResetError")
    assert str(item) == (
        "key 7 (row 7): builtins.ConnectionResetError: row 7: connection reset (attempt 3) "
        "(3 attempts)"
    )
    assert loader.stats().epoch.retries == 2


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("kind", [Rows, AsyncRows])
def test_raise_keeps_the_error_type_and_names_the_key(kind: type[Rows], workers: int) -> None:
    loader = DataLoader(kind(bad=frozenset({6})), batch_size=4, num_workers=workers, retry=FAST)
    with pytest.raises(Corrupt, match="row 6 is corrupt") as info:
        batches(loader)
    notes = "\n".join(info.value.__notes__)
    assert "raised while reading key 6 (row 6) of the stream" in notes
    assert "raised while fetching batch" in notes
    if workers:
        assert "worker 0" in notes


@pytest.mark.parametrize("workers", [0, 2])
def test_max_skipped_ends_the_epoch(workers: int) -> None:
    ok = DataLoader(
        Rows(bad=BAD), batch_size=4, num_workers=workers, on_error="skip", max_skipped=4
    )
    assert sum(map(len, batches(ok))) == 20 - len(BAD)
    loader = DataLoader(
        Rows(bad=BAD), batch_size=4, num_workers=workers, on_error="skip", max_skipped=3
    )
    with pytest.raises(TooManySkippedError, match="max_skipped=3") as info:
        batches(loader)
    assert sorted(item.key for item in info.value.skipped) == sorted(BAD)
    assert info.value.limit == 3


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", [Rows, AsyncRows])
def test_a_stream_that_only_skips_is_stopped_by_max_skipped(kind: type[Rows]) -> None:
    # Every row of an endless stream is bad: no batch ever fills, yet the limit is enforced.
    loader = DataLoader(kind(endless=True), batch_size=4, on_error="skip", max_skipped=100)
    with pytest.raises(TooManySkippedError) as info:
        batches(loader)
    assert len(info.value.skipped) == 101


def test_many_skips_go_out_in_outcomes_of_their_own(caplog: pytest.LogCaptureFixture) -> None:
    bad = frozenset(range(5, 5 + 3 * SKIPS_PER_OUTCOME))
    n = 10 + 3 * SKIPS_PER_OUTCOME
    with caplog.at_level(logging.WARNING, logger="aioload"):
        loader = DataLoader(Rows(n=n, bad=bad), batch_size=4, on_error="skip")
        got = batches(loader)
    assert got == batches(DataLoader(Rows(n=n, absent=bad), batch_size=4))
    assert [item.key for item in loader.skipped] == sorted(bad)
    assert sum(r.name == "aioload" for r in caplog.records) == len(bad)  # each logged once


@pytest.mark.parametrize("kind", [Rows, AsyncRows])
def test_skips_at_the_end_drop_last_and_no_batching(kind: type[Rows]) -> None:
    last = frozenset({17, 18, 19})
    loader = DataLoader(kind(bad=last), batch_size=4, drop_last=True, on_error="skip")
    assert batches(loader) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    assert [item.key for item in loader.skipped] == [17, 18, 19]  # reported before the end
    single = DataLoader(kind(n=6, bad=frozenset({0, 5})), batch_size=None, on_error="skip")
    assert [int(sample) for sample in single] == [1, 2, 3, 4]
    assert [item.key for item in single.skipped] == [0, 5]


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", [Rows, AsyncRows])
async def test_skip_under_async_for(kind: type[Rows]) -> None:
    loader = DataLoader(kind(bad=BAD, flaky=frozenset({1})), batch_size=4, retry=FAST)
    with pytest.raises(Corrupt):
        async for _ in loader:
            pass
    loader = DataLoader(
        kind(bad=BAD, flaky=frozenset({1})), batch_size=4, retry=FAST, on_error="skip"
    )
    got = [np.asarray(batch).tolist() async for batch in loader]
    reference = DataLoader(kind(absent=BAD), batch_size=4)
    assert got == [np.asarray(batch).tolist() async for batch in reference]
    assert sorted(item.key for item in loader.skipped) == sorted(BAD)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_guarded_stream_resumes_from_a_checkpoint(workers: int) -> None:
    def make() -> DataLoader:
        return DataLoader(
            Rows(n=40, bad=BAD),
            batch_size=4,
            num_workers=workers,
            persistent_workers=workers > 0,
            on_error="skip",
        )

    everything = batches(make())
    interrupted = make()
    with interrupted:
        iterator = iter(interrupted)
        head = [np.asarray(next(iterator)).tolist() for _ in range(3)]
        state = json.loads(json.dumps(interrupted.state_dict()))
        iterator.close()  # type: ignore[attr-defined]
    resumed = make()
    resumed.load_state_dict(state)
    with resumed:
        assert head + batches(resumed) == everything


class NoState(Rows):
    """:class:`Rows` whose state cannot be taken: a checkpoint's ``state_dict`` fails."""

    def state_dict(self) -> dict[str, int]:
        raise RuntimeError("no state to give")


class AsyncNoState(AsyncRows):
    state_dict = NoState.state_dict  # type: ignore[assignment]


@pytest.mark.timeout(30)  # a guarded sync stream on the loader's loop hung here
@pytest.mark.parametrize("policy", [{}, {"on_error": "skip"}])
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("kind", [NoState, AsyncNoState])
def test_a_state_that_cannot_be_taken_fails_its_batch_with_or_without_the_policy(
    kind: type[Rows], workers: int, policy: dict[str, Any]
) -> None:
    # The stream's state is taken after each batch (for checkpoints); its error is that
    # batch's, as itself, whether the stream is read under the fault policy or not.
    loader = DataLoader(kind(n=12), batch_size=4, num_workers=workers, **policy)
    iterator = iter(loader)
    try:
        with pytest.raises(RuntimeError, match="no state to give") as info:
            next(iterator)
        assert type(info.value) is RuntimeError
        assert "raised while fetching batch 0" in info.value.__notes__
    finally:
        iterator.close()  # type: ignore[attr-defined]


def test_what_the_policy_cannot_apply_to_is_refused_at_construction() -> None:
    with pytest.raises(ValueError, match=r"Plain cannot\. .*guarded_stream\(guard\)"):
        DataLoader(Plain(), batch_size=2, on_error="skip")
    with pytest.raises(ValueError, match="item_timeout applies to map-style datasets only"):
        DataLoader(Rows(), batch_size=2, on_error="skip", item_timeout=1.0)
    with pytest.raises(ValueError, match="no known length; give a count"):
        DataLoader(Rows(), batch_size=2, on_error="skip", max_skipped=0.1)
    # No policy: the stream is iterated as usual, and its first error ends it.
    with pytest.raises(Corrupt):
        batches(DataLoader(Rows(bad=BAD), batch_size=4))


def test_the_guard_on_its_own() -> None:
    guard = StreamGuard(FaultPolicy(retry=FAST, on_error="skip"), worker=3)
    calls = []

    def read() -> int:
        calls.append(1)
        if len(calls) < 3:
            raise TimeoutError("slow")
        return 7

    assert guard.retry_sync(read) == 7 and guard.take_retries() == 2 and guard.take_retries() == 0
    assert asyncio.run(guard.retry(lambda: 8)) == 8
    marker = guard.skip("k", KeyError("k"), attempts=2, where="here")
    assert (marker.record.key, marker.record.worker, marker.record.where) == ("k", 3, "here")
    assert guard.skipping
    strict = StreamGuard(FaultPolicy(retry=FAST))
    with pytest.raises(KeyError) as info:
        strict.skip("k", KeyError("k"))
    assert "raised while reading key 'k' of the stream" in info.value.__notes__
    guard.close()  # the epoch closes: nothing more is retried
    assert not guard.again(TimeoutError(), 1)
