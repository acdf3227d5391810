"""The per-item fault policy: retry, item_timeout, on_error='skip', max_skipped.

Datasets live at module level: workers start with ``forkserver``, which pickles
them. Each copy of a dataset counts its own attempts, which is enough with
workers too: every attempt at a key happens in the worker that holds its batch.
"""

from __future__ import annotations

import asyncio
import logging
import math
import pickle
import random
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from aioload import (
    DataLoader,
    ItemTimeoutError,
    IterableDataset,
    RetryPolicy,
    SkippedItem,
    Subset,
    TooManySkippedError,
)
from aioload.faults.policy import FaultPolicy

FAST = RetryPolicy(attempts=3, backoff=0.0)  # retries without waiting


class Bad(LookupError):
    """A non-transient error: a broken sample."""


# -- datasets ------------------------------------------------------------------


class Flaky:
    """Keys in ``bad`` fail their first ``fails`` attempts with ``error``; others never.

    ``bad`` may also map keys to their own number of failing attempts.
    """

    def __init__(
        self,
        n: int = 12,
        bad: set[int] | dict[int, int] = frozenset(),  # type: ignore[assignment]
        fails: int = 1_000_000,
        error: type[Exception] = ConnectionResetError,
    ) -> None:
        self.n, self.error = n, error
        self.fails = dict(bad) if isinstance(bad, dict) else dict.fromkeys(bad, fails)
        self.bad = frozenset(self.fails)
        self.attempts: dict[int, int] = {}

    def __len__(self) -> int:
        return self.n

    def read(self, key: int) -> int:
        tries = self.attempts[key] = self.attempts.get(key, 0) + 1
        if tries <= self.fails.get(key, 0):
            raise self.error(f"cannot read {key} (attempt {tries})")
        return key

    def __getitem__(self, key: int) -> int:
        return self.read(key)


class AsyncFlaky(Flaky):
    async def __getitem__(self, key: int) -> int:  # type: ignore[override]
        await asyncio.sleep(0)  # a real suspension: items run concurrently
        return self.read(key)


class Batched(Flaky):
    """A bulk ``__getitems__`` that fails when it meets a bad key (``batch_fails`` calls
    with ``batch_error``, then like ``__getitem__``); ``__getitem__`` reads one key."""

    def __init__(self, *args: Any, batch_error: type[Exception] = Bad, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.batch_error = batch_error
        self.batch_calls = 0

    def __getitems__(self, keys: list[int]) -> list[int]:
        self.batch_calls += 1
        if self.bad.intersection(keys):
            raise self.batch_error(f"bulk read of {keys} failed")
        return list(keys)


class AsyncBatched(Batched):
    async def __getitems__(self, keys: list[int]) -> list[int]:  # type: ignore[override]
        await asyncio.sleep(0)
        return super().__getitems__(keys)


class BulkOnly(Batched):
    """Reads only in bulk: ``__getitem__`` is not implemented."""

    def __getitem__(self, key: int) -> int:
        raise NotImplementedError("read in bulk")


class Hangs:
    """Async items; keys in ``hang`` never finish their first ``hangs`` attempts.

    ``hung`` holds each hanging attempt's ``(start, end)`` on the monotonic clock: from
    its start to its cancellation.
    """

    def __init__(self, n: int, hang: set[int], hangs: int = 1_000_000) -> None:
        self.n, self.hang, self.hangs = n, hang, hangs
        self.attempts: dict[int, int] = {}
        self.hung: dict[int, list[tuple[float, float]]] = {}

    def __len__(self) -> int:
        return self.n

    async def __getitem__(self, key: int) -> int:
        tries = self.attempts[key] = self.attempts.get(key, 0) + 1
        if key in self.hang and tries <= self.hangs:
            start = time.monotonic()
            try:
                await asyncio.sleep(3600)
            finally:
                self.hung.setdefault(key, []).append((start, time.monotonic()))
        return key


class SlowSync:
    """Sync items; keys in ``slow`` take ``delay`` seconds on their first attempt."""

    def __init__(self, n: int, slow: set[int], delay: float) -> None:
        self.n, self.slow, self.delay = n, slow, delay
        self.attempts: dict[int, int] = {}

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, key: int) -> int:
        tries = self.attempts[key] = self.attempts.get(key, 0) + 1
        if key in self.slow and tries == 1:
            time.sleep(self.delay)
        return key


class Stream(IterableDataset):
    def __iter__(self) -> Iterator[int]:
        return iter(range(4))


class NoLen:
    def __iter__(self) -> Iterator[int]:
        return iter(range(6))


def batches(loader: DataLoader) -> list[list[int]]:
    return [batch.tolist() for batch in loader]


async def abatches(loader: DataLoader) -> list[list[int]]:
    return [batch.tolist() async for batch in loader]


def notes(error: BaseException) -> str:
    return "\n".join(getattr(error, "__notes__", []))


# -- arguments -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"retry": 3}, TypeError, "RetryPolicy"),
        ({"retry": True}, TypeError, "RetryPolicy"),
        ({"item_timeout": 0}, ValueError, "positive number of seconds"),
        ({"item_timeout": -1.0}, ValueError, "item_timeout"),
        ({"item_timeout": math.nan}, ValueError, "item_timeout"),
        ({"item_timeout": "5"}, ValueError, "item_timeout"),
        ({"on_error": "ignore"}, ValueError, "'raise'"),
        ({"max_skipped": 3}, ValueError, "needs on_error='skip'"),
        ({"on_error": "skip", "max_skipped": -1}, ValueError, "count >= 0"),
        ({"on_error": "skip", "max_skipped": 1.0}, ValueError, "strictly between 0 and 1"),
        ({"on_error": "skip", "max_skipped": 0.0}, ValueError, "use an int for a count"),
        ({"on_error": "skip", "max_skipped": True}, TypeError, "max_skipped"),
        ({"on_error": "skip", "max_skipped": "3"}, TypeError, "max_skipped"),
    ],
)
def test_invalid_arguments_fail_at_construction(
    kwargs: dict[str, Any], error: type[Exception], words: str
) -> None:
    with pytest.raises(error, match=words) as info:
        DataLoader(Flaky(), batch_size=4, **kwargs)
    assert str(info.value)  # says what is wrong


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"attempts": 0}, ValueError, "positive integer"),
        ({"attempts": 2.5}, ValueError, "attempts"),
        ({"backoff": -0.1}, ValueError, ">= 0"),
        ({"max_backoff": math.inf}, ValueError, "finite"),
        ({"backoff": 2.0, "max_backoff": 1.0}, ValueError, "at least backoff"),
        ({"jitter": 1}, TypeError, "bool"),
        ({"retry_on": ()}, ValueError, "empty"),
        ({"retry_on": int}, TypeError, "Exception subclass"),
        ({"retry_on": (OSError, "EIO")}, TypeError, "Exception subclass"),
        ({"retry_on": KeyboardInterrupt}, TypeError, "Exception subclass"),
    ],
)
def test_invalid_retry_policy(kwargs: dict[str, Any], error: type[Exception], words: str) -> None:
    with pytest.raises(error, match=words):
        RetryPolicy(**kwargs)


def test_policy_does_not_apply_to_iterable_datasets_that_cannot_skip() -> None:
    # A plain generator ends at its first error: only a stream with guarded_stream can skip
    # (tests/test_stream_faults.py).
    for kwargs in ({"retry": FAST}, {"on_error": "skip"}):
        with pytest.raises(ValueError, match=r"Stream cannot\. .*guarded_stream"):
            DataLoader(Stream(), batch_size=2, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="item_timeout applies to map-style datasets only"):
        DataLoader(Stream(), batch_size=2, item_timeout=1.0)


def test_fraction_needs_an_epoch_of_known_length() -> None:
    with pytest.raises(ValueError, match="no length"):
        DataLoader(Flaky(), batch_size=2, sampler=NoLen(), on_error="skip", max_skipped=0.5)
    # A count needs no length.
    loader = DataLoader(Flaky(), batch_size=2, sampler=NoLen(), on_error="skip", max_skipped=1)
    assert batches(loader) == [[0, 1], [2, 3], [4, 5]]


def test_policy_cannot_change_after_construction() -> None:
    loader = DataLoader(Flaky(), batch_size=4)
    for name, value in [("on_error", "skip"), ("retry", FAST), ("item_timeout", 1.0)]:
        with pytest.raises(ValueError, match="should not be set"):
            setattr(loader, name, value)


def test_retry_policy_delay_grows_is_capped_and_jittered() -> None:
    exact = RetryPolicy(backoff=0.1, max_backoff=0.3, jitter=False)
    assert [exact.delay(n) for n in (1, 2, 3, 4)] == pytest.approx([0.1, 0.2, 0.3, 0.3])
    jittered = RetryPolicy(backoff=0.1, max_backoff=10.0)
    rng = random.Random(0)
    waits = [jittered.delay(3, rng) for _ in range(200)]
    assert all(0.2 <= wait <= 0.4 for wait in waits)
    assert len(set(waits)) > 100  # not one fixed value


def test_retry_on_a_class_or_a_predicate() -> None:
    assert RetryPolicy(retry_on=ConnectionError).retry_on == (ConnectionError,)
    default = RetryPolicy()
    assert default.retries(ConnectionResetError()) and default.retries(TimeoutError())
    assert default.retries(ItemTimeoutError()) and not default.retries(KeyError(1))
    busy = RetryPolicy(retry_on=lambda error: "busy" in str(error))
    assert busy.retries(RuntimeError("server busy")) and not busy.retries(RuntimeError("gone"))


def test_skip_records_and_too_many_skipped_pickle() -> None:
    item = SkippedItem.from_error(7, Bad("broken"), 2, worker=1)
    assert str(item) == "key 7: test_fault_policy.Bad: broken (2 attempts, worker 1)"
    error = TooManySkippedError("too many", skipped=[item], limit=0)
    copy = pickle.loads(pickle.dumps(error))
    assert (str(copy), copy.skipped, copy.limit) == ("too many", (item,), 0)
    assert not FaultPolicy().active


# -- the default: torch's behaviour ------------------------------------------------


@pytest.mark.parametrize(
    "dataset",
    [Flaky(bad={5}), AsyncFlaky(bad={5}), Batched(bad={5}, batch_error=ConnectionResetError)],
)
def test_default_fails_on_the_first_error_with_its_type(dataset: Flaky) -> None:
    loader = DataLoader(dataset, batch_size=4)
    got = []
    with pytest.raises(ConnectionResetError) as info:
        for batch in loader:
            got.append(batch.tolist())
    assert got == [[0, 1, 2, 3]]
    assert dataset.attempts.get(5, 0) <= 1  # never retried
    assert "[4, 5, 6, 7]" in notes(info.value)
    assert "reading key" not in notes(info.value)  # the guarded path was not taken
    assert loader.skipped == []


# -- retries -----------------------------------------------------------------------


@pytest.mark.parametrize("kind", [Flaky, AsyncFlaky])
def test_transient_failures_are_retried_until_they_succeed(kind: type[Flaky]) -> None:
    dataset = kind(bad={1, 6, 7}, fails=2)
    loader = DataLoader(dataset, batch_size=4, retry=FAST)
    assert batches(loader) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert {key: dataset.attempts[key] for key in (0, 1, 6, 7)} == {0: 1, 1: 3, 6: 3, 7: 3}


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("kind", [Flaky, AsyncFlaky])
def test_thirty_percent_transient_first_failures_complete_under_retry(
    kind: type[Flaky], num_workers: int
) -> None:
    rng = np.random.default_rng(30)
    bad = {int(key) for key in np.flatnonzero(rng.random(200) < 0.3)}
    assert 45 <= len(bad) <= 75
    loader = DataLoader(
        kind(200, bad=bad, fails=1), batch_size=16, retry=FAST, num_workers=num_workers
    )
    assert [key for batch in batches(loader) for key in batch] == list(range(200))
    assert loader.skipped == []


@pytest.mark.asyncio
async def test_retries_with_async_for() -> None:
    dataset = AsyncFlaky(bad={2, 9}, fails=1)
    loader = DataLoader(dataset, batch_size=4, retry=FAST)
    assert await abatches(loader) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert dataset.attempts[2] == dataset.attempts[9] == 2


@pytest.mark.parametrize("kind", [Flaky, AsyncFlaky])
def test_exhausted_retries_raise_the_last_error_naming_key_and_attempts(
    kind: type[Flaky],
) -> None:
    dataset = kind(bad={5}, fails=10)
    with pytest.raises(ConnectionResetError, match="attempt 3") as info:
        batches(DataLoader(dataset, batch_size=4, retry=FAST))
    assert dataset.attempts[5] == 3
    text = notes(info.value)
    assert "key 5, the last of 3 attempts" in text and "batch 1 (keys [4, 5, 6, 7])" in text


@pytest.mark.parametrize("kind", [Flaky, AsyncFlaky])
def test_non_transient_errors_are_not_retried(kind: type[Flaky]) -> None:
    dataset = kind(bad={5}, error=Bad)
    with pytest.raises(Bad) as info:
        batches(DataLoader(dataset, batch_size=4, retry=FAST))
    assert dataset.attempts[5] == 1
    assert "raised while reading key 5" in notes(info.value)


def test_retry_on_narrows_what_is_transient() -> None:
    dataset = Flaky(bad={2}, fails=1, error=FileNotFoundError)
    policy = RetryPolicy(backoff=0.0, retry_on=(ConnectionError, TimeoutError))
    with pytest.raises(FileNotFoundError):
        batches(DataLoader(dataset, batch_size=4, retry=policy))
    assert dataset.attempts[2] == 1


@pytest.mark.parametrize("kind", [Flaky, AsyncFlaky])
def test_backoff_waits_between_attempts(kind: type[Flaky]) -> None:
    # Two failures: waits of 0.04 then 0.08 s (no jitter), 0.12 s at least in all.
    policy = RetryPolicy(attempts=3, backoff=0.04, jitter=False)
    dataset = kind(n=4, bad={1}, fails=2)
    start = time.monotonic()
    assert batches(DataLoader(dataset, batch_size=4, retry=policy)) == [[0, 1, 2, 3]]
    assert time.monotonic() - start >= 0.12
    assert dataset.attempts[1] == 3


def test_closing_the_epoch_ends_a_sync_backoff_wait() -> None:
    # The second batch's bad key waits 30 s for its retry; leaving must not wait for it.
    policy = RetryPolicy(attempts=2, backoff=30.0, max_backoff=30.0)
    dataset = Flaky(n=8, bad={5}, fails=10)
    iterator = iter(DataLoader(dataset, batch_size=4, retry=policy, prefetch_factor=2))
    assert next(iterator).tolist() == [0, 1, 2, 3]
    deadline = time.monotonic() + 5
    while 5 not in dataset.attempts and time.monotonic() < deadline:
        time.sleep(0.005)  # until the read of key 5 is waiting for its retry
    start = time.monotonic()
    iterator.close()  # type: ignore[attr-defined]
    assert time.monotonic() - start < 5
    assert dataset.attempts[5] == 1


# -- item_timeout ------------------------------------------------------------------


def test_item_timeout_fails_a_hanging_async_item() -> None:
    loader = DataLoader(Hangs(8, hang={2}), batch_size=4, item_timeout=0.05)
    expected = r"key 2 took longer than item_timeout=0\.05 s"
    with pytest.raises(ItemTimeoutError, match=expected) as info:
        batches(loader)
    assert isinstance(info.value, TimeoutError)
    assert "batch 0 (keys [0, 1, 2, 3])" in notes(info.value)


def test_item_timeout_with_skip_drops_the_hanging_item() -> None:
    dataset = Hangs(8, hang={2, 5})
    loader = DataLoader(dataset, batch_size=4, item_timeout=0.05, on_error="skip")
    assert batches(loader) == [[0, 1, 3], [4, 6, 7]]
    # The two hanging items (of two batches) waited together: each wait began before the
    # other ended, whatever the timing (one after the other, one would end first).
    ((start_2, end_2),), ((start_5, end_5),) = dataset.hung[2], dataset.hung[5]
    assert max(start_2, start_5) < min(end_2, end_5)
    assert sorted((item.key, item.error_type) for item in loader.skipped) == [
        (2, "aioload.errors.ItemTimeoutError"),
        (5, "aioload.errors.ItemTimeoutError"),
    ]


def test_a_timed_out_attempt_is_retried() -> None:
    dataset = Hangs(4, hang={1}, hangs=1)
    loader = DataLoader(dataset, batch_size=4, item_timeout=0.05, retry=FAST)
    assert batches(loader) == [[0, 1, 2, 3]]
    assert dataset.attempts[1] == 2


def test_a_dataset_timeout_error_is_not_mistaken_for_item_timeout() -> None:
    dataset = AsyncFlaky(n=4, bad={3}, error=TimeoutError)
    with pytest.raises(TimeoutError) as info:
        batches(DataLoader(dataset, batch_size=4, item_timeout=5.0))
    assert not isinstance(info.value, ItemTimeoutError)


def test_a_hung_sync_attempt_is_abandoned_and_retried() -> None:
    # A sync read cannot be interrupted: it is left to finish in the background, and retried.
    dataset = SlowSync(4, slow={2}, delay=1.5)
    loader = DataLoader(dataset, batch_size=4, item_timeout=0.05, retry=FAST)
    started = time.monotonic()
    assert batches(loader) == [[0, 1, 2, 3]]
    assert time.monotonic() - started < 1.0  # the hung first attempt was not waited for
    assert dataset.attempts[2] == 2
    skipping = DataLoader(SlowSync(4, slow={2}, delay=0.3), batch_size=4, item_timeout=0.05)
    with pytest.raises(ItemTimeoutError, match="abandoned"):
        batches(skipping)


# -- skipping ------------------------------------------------------------------------


@pytest.mark.parametrize("kind", [Flaky, AsyncFlaky])
def test_skip_collates_the_items_that_were_read(kind: type[Flaky]) -> None:
    loader = DataLoader(kind(n=10, bad={1, 5, 6}, error=Bad), batch_size=4, on_error="skip")
    assert batches(loader) == [[0, 2, 3], [4, 7], [8, 9]]
    assert sorted(item.key for item in loader.skipped) == [1, 5, 6]


def test_drop_last_drops_only_the_samplers_last_batch() -> None:
    loader = DataLoader(
        Flaky(n=10, bad={1}, error=Bad), batch_size=4, drop_last=True, on_error="skip"
    )
    assert batches(loader) == [[0, 2, 3], [4, 5, 6, 7]]


@pytest.mark.parametrize("in_order", [True, False])
def test_a_batch_whose_items_all_failed_yields_nothing(in_order: bool) -> None:
    dataset = AsyncFlaky(n=12, bad={4, 5, 6, 7}, error=Bad)
    loader = DataLoader(dataset, batch_size=4, on_error="skip", in_order=in_order)
    got = batches(loader)
    assert sorted(got) == [[0, 1, 2, 3], [8, 9, 10, 11]]
    assert sorted(item.key for item in loader.skipped) == [4, 5, 6, 7]


@pytest.mark.parametrize("kind", [Flaky, AsyncFlaky])
def test_skip_without_automatic_batching(kind: type[Flaky]) -> None:
    loader = DataLoader(kind(n=5, bad={1, 3}, error=Bad), batch_size=None, on_error="skip")
    assert [int(sample) for sample in loader] == [0, 2, 4]
    assert sorted(item.key for item in loader.skipped) == [1, 3]


def test_retried_then_skipped_and_the_report_after_the_epoch() -> None:
    dataset = Flaky(n=8, bad={3, 6}, error=OSError)  # transient, but always failing
    loader = DataLoader(dataset, batch_size=4, retry=FAST, on_error="skip")
    assert batches(loader) == [[0, 1, 2], [4, 5, 7]]
    report = sorted(loader.skipped, key=lambda item: item.key)
    assert [(i.key, i.error_type, i.attempts, i.worker) for i in report] == [
        (3, "builtins.OSError", 3, None),
        (6, "builtins.OSError", 3, None),
    ]
    assert report[0].error == "cannot read 3 (attempt 3)"
    assert report[0].reason == "builtins.OSError: cannot read 3 (attempt 3)"


def test_each_epoch_has_its_own_report() -> None:
    dataset = Flaky(n=8, bad={3}, fails=1, error=Bad)  # fails on its first read only
    loader = DataLoader(dataset, batch_size=4, on_error="skip")
    assert batches(loader) == [[0, 1, 2], [4, 5, 6, 7]]
    assert [item.key for item in loader.skipped] == [3]
    assert batches(loader) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert loader.skipped == []


def test_each_skip_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="aioload"):
        batches(
            DataLoader(AsyncFlaky(n=12, bad={2, 7, 8}, error=Bad), batch_size=4, on_error="skip")
        )
    records = [r for r in caplog.records if r.name == "aioload"]
    assert len(records) == 3
    for key in (2, 7, 8):
        assert sum(f"key {key}:" in r.getMessage() for r in records) == 1
    assert all(r.levelno == logging.WARNING for r in records)


@pytest.mark.asyncio
async def test_skip_with_async_for() -> None:
    loader = DataLoader(AsyncFlaky(n=8, bad={0, 5}, error=Bad), batch_size=4, on_error="skip")
    assert await abatches(loader) == [[1, 2, 3], [4, 6, 7]]
    assert sorted(item.key for item in loader.skipped) == [0, 5]


@pytest.mark.asyncio
async def test_sync_dataset_with_retries_and_skip_under_async_for() -> None:
    dataset = Flaky(n=8, bad={1, 4, 6}, fails=1)
    loader = DataLoader(dataset, batch_size=4, retry=FAST, on_error="skip")
    assert await abatches(loader) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert loader.skipped == []


# -- max_skipped -----------------------------------------------------------------------


@pytest.mark.parametrize("kind", [Flaky, AsyncFlaky])
def test_max_skipped_count(kind: type[Flaky]) -> None:
    ok = DataLoader(kind(bad={1, 5, 9}, error=Bad), batch_size=4, on_error="skip", max_skipped=3)
    assert len(batches(ok)) == 3

    loader = DataLoader(
        kind(bad={1, 5, 9}, error=Bad), batch_size=4, on_error="skip", max_skipped=2
    )
    got = []
    with pytest.raises(TooManySkippedError) as info:
        for batch in loader:
            got.append(batch.tolist())
    error = info.value
    assert got == [[0, 2, 3], [4, 6, 7]]  # the batch that crossed the limit is not yielded
    assert error.limit == 2 and [item.key for item in error.skipped] == [1, 5, 9]
    message = str(error)
    assert "max_skipped=2" in message and "crossed in batch 2" in message
    for key in (1, 5, 9):
        assert f"key {key}: test_fault_policy.Bad: cannot read {key}" in message
    assert len(loader.skipped) == 3


def test_max_skipped_zero_fails_on_the_first_skip() -> None:
    loader = DataLoader(Flaky(bad={6}, error=Bad), batch_size=4, on_error="skip", max_skipped=0)
    with pytest.raises(TooManySkippedError, match="key 6"):
        batches(loader)


def test_max_skipped_fraction_of_the_epoch() -> None:
    dataset = Flaky(n=20, bad={3, 11, 17}, error=Bad)
    # 0.15 of 20 items: 3 skips allowed; 0.1: 2.
    assert len(batches(DataLoader(dataset, batch_size=5, on_error="skip", max_skipped=0.15))) == 4
    with pytest.raises(TooManySkippedError, match=r"max_skipped=0.1, i.e. 2 items"):
        batches(DataLoader(dataset, batch_size=5, on_error="skip", max_skipped=0.1))


# -- __getitems__ ----------------------------------------------------------------------


@pytest.mark.parametrize("kind", [Batched, AsyncBatched])
def test_a_failed_bulk_read_is_read_key_by_key_to_find_the_bad_keys(kind: type[Batched]) -> None:
    dataset = kind(n=8, bad={5}, error=Bad)
    loader = DataLoader(dataset, batch_size=4, on_error="skip")
    assert batches(loader) == [[0, 1, 2, 3], [4, 6, 7]]
    (item,) = loader.skipped
    assert (item.key, item.error_type) == (5, "test_fault_policy.Bad")
    assert dataset.attempts == {4: 1, 5: 1, 6: 1, 7: 1}  # key by key only for the failed batch


@pytest.mark.parametrize("kind", [Batched, AsyncBatched])
def test_a_bulk_read_is_retried_whole_and_skipped_whole_when_retries_run_out(
    kind: type[Batched],
) -> None:
    dataset = kind(n=8, bad={5}, batch_error=ConnectionResetError)
    loader = DataLoader(dataset, batch_size=4, retry=FAST, on_error="skip")
    assert batches(loader) == [[0, 1, 2, 3]]
    assert dataset.batch_calls == 1 + 3
    assert sorted(item.key for item in loader.skipped) == [4, 5, 6, 7]
    assert {item.attempts for item in loader.skipped} == {3}
    assert dataset.attempts == {}  # never read key by key


def test_a_failed_bulk_read_raises_naming_its_keys() -> None:
    dataset = Batched(n=8, bad={5}, batch_error=ConnectionResetError)
    with pytest.raises(ConnectionResetError) as info:
        batches(DataLoader(dataset, batch_size=4, retry=FAST))
    assert "keys [4, 5, 6, 7] (one __getitems__ call), the last of 3 attempts" in notes(info.value)


def test_a_bulk_only_dataset_skips_the_whole_batch_with_the_bulk_error() -> None:
    loader = DataLoader(BulkOnly(n=8, bad={2}), batch_size=4, on_error="skip")
    assert batches(loader) == [[4, 5, 6, 7]]
    assert {item.error for item in loader.skipped} == {"bulk read of [0, 1, 2, 3] failed"}


def test_a_subset_of_an_async_dataset_is_retried_item_by_item() -> None:
    # Subset.__getitems__ only forwards to a parent without one: items stay the unit.
    dataset = AsyncFlaky(n=8, bad={2, 5}, fails=1)
    loader = DataLoader(Subset(dataset, [5, 4, 3, 2]), batch_size=2, retry=FAST)
    assert batches(loader) == [[5, 4], [3, 2]]
    assert dataset.attempts == {5: 2, 4: 1, 3: 1, 2: 2}


# -- workers --------------------------------------------------------------------------


def test_workers_retry_skip_and_report_back() -> None:
    # Key 2 recovers on its second attempt; 5 and 8..11 stay broken.
    always = 1_000_000
    bad = {2: 1, 5: always, 8: always, 9: always, 10: always, 11: always}
    dataset = Flaky(n=14, bad=bad, error=OSError)
    loader = DataLoader(dataset, batch_size=4, num_workers=2, retry=FAST, on_error="skip")
    assert batches(loader) == [[0, 1, 2, 3], [4, 6, 7], [12, 13]]
    report = sorted(loader.skipped, key=lambda item: item.key)
    assert [item.key for item in report] == [5, 8, 9, 10, 11]
    assert {item.attempts for item in report} == {3}
    # Batch i went to worker i % 2.
    assert [item.worker for item in report] == [1, 0, 0, 0, 0]


def test_workers_count_skips_across_workers(caplog: pytest.LogCaptureFixture) -> None:
    dataset = AsyncFlaky(n=16, bad={1, 6, 9, 14}, error=Bad)
    with caplog.at_level(logging.WARNING, logger="aioload"):
        loader = DataLoader(dataset, batch_size=4, num_workers=2, on_error="skip", max_skipped=3)
        with pytest.raises(TooManySkippedError) as info:
            batches(loader)
    assert sorted(item.worker for item in info.value.skipped) == [0, 0, 1, 1]
    assert sum(r.name == "aioload" for r in caplog.records) == 4  # each logged once, here


def test_workers_raise_with_type_key_and_worker() -> None:
    with pytest.raises(Bad) as info:
        batches(DataLoader(Flaky(n=8, bad={6}, error=Bad), batch_size=4, num_workers=2, retry=FAST))
    text = notes(info.value)
    assert "raised while reading key 6" in text and "worker 1" in text


def test_workers_all_failed_batch_and_item_timeout() -> None:
    loader = DataLoader(
        Hangs(12, hang={4, 5, 6, 7, 9}),
        batch_size=4,
        num_workers=2,
        item_timeout=0.05,
        on_error="skip",
    )
    assert batches(loader) == [[0, 1, 2, 3], [8, 10, 11]]
    assert sorted(item.key for item in loader.skipped) == [4, 5, 6, 7, 9]
    assert {item.error_type for item in loader.skipped} == {"aioload.errors.ItemTimeoutError"}
