"""Errors and timeouts reach the consumer with their type, the batch and its keys."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from aioload import DataLoader, IterableDataset, LoaderTimeoutError


class Broken(LookupError):
    pass


class FailsAt:
    def __init__(self, bad: int, n: int = 12) -> None:
        self.bad, self.n = bad, n

    def __getitem__(self, i: int) -> int:
        if i == self.bad:
            raise Broken(f"cannot read {i}")
        return i

    def __len__(self) -> int:
        return self.n


class AsyncFailsAt(FailsAt):
    async def __getitem__(self, i: int) -> int:  # type: ignore[override]
        await asyncio.sleep(0)
        return super().__getitem__(i)


class BatchedFails(FailsAt):
    async def __getitems__(self, keys: list[int]) -> list[int]:
        if self.bad in keys:
            raise Broken("batch read failed")
        return keys


def notes(error: BaseException) -> str:
    return "\n".join(getattr(error, "__notes__", []))


@pytest.mark.parametrize("dataset", [FailsAt(5), AsyncFailsAt(5), BatchedFails(5)])
def test_fetch_error_keeps_type_and_names_batch_and_keys_in_for(dataset: FailsAt) -> None:
    got = []
    with pytest.raises(Broken) as info:
        for batch in DataLoader(dataset, batch_size=4):
            got.append(batch.tolist())
    assert got == [[0, 1, 2, 3]]
    assert "batch 1" in notes(info.value)
    assert "[4, 5, 6, 7]" in notes(info.value)


@pytest.mark.parametrize("dataset", [FailsAt(5), AsyncFailsAt(5), BatchedFails(5)])
def test_fetch_error_keeps_type_and_names_batch_and_keys_in_async_for(dataset: FailsAt) -> None:
    async def main() -> None:
        async for _ in DataLoader(dataset, batch_size=4):
            pass

    with pytest.raises(Broken) as info:
        asyncio.run(main())
    assert "batch 1" in notes(info.value) and "[4, 5, 6, 7]" in notes(info.value)


def test_iteration_can_continue_after_a_failed_batch() -> None:
    iterator = iter(DataLoader(FailsAt(5), batch_size=4))
    assert next(iterator).tolist() == [0, 1, 2, 3]
    with pytest.raises(Broken):
        next(iterator)
    assert next(iterator).tolist() == [8, 9, 10, 11]
    with pytest.raises(StopIteration):
        next(iterator)


def test_collate_error_keeps_type() -> None:
    def collate(batch: list[int]) -> list[int]:
        raise ZeroDivisionError("bad collate")

    with pytest.raises(ZeroDivisionError) as info:
        list(DataLoader(FailsAt(-1), batch_size=4, collate_fn=collate))
    assert "batch 0" in notes(info.value)


def test_sampler_error_surfaces_after_the_batches_before_it() -> None:
    class BadSampler:
        def __iter__(self) -> Iterator[int]:
            yield 0
            yield 1
            raise KeyError("sampler broke")

    got = []
    with pytest.raises(KeyError) as info:
        for batch in DataLoader(FailsAt(-1), sampler=BadSampler(), batch_size=1):
            got.append(batch.tolist())
    assert got == [[0], [1]]
    assert "sampler" in notes(info.value)


def test_iterable_dataset_error_keeps_type() -> None:
    class Stream(IterableDataset[int]):
        def __iter__(self) -> Iterator[int]:
            yield 1
            raise Broken("stream broke")

    with pytest.raises(Broken) as info:
        list(DataLoader(Stream(), batch_size=4))
    assert "batch 0" in notes(info.value)


class Stalls:
    def __init__(self, stall_at: int, seconds: float) -> None:
        self.stall_at, self.seconds = stall_at, seconds

    async def __getitem__(self, i: int) -> int:
        if i == self.stall_at:
            await asyncio.sleep(self.seconds)
        return i

    def __len__(self) -> int:
        return 8


def test_timeout_names_the_stalled_batch_in_for() -> None:
    loader = DataLoader(Stalls(6, 5.0), batch_size=2, timeout=0.3)
    got = []
    start = time.monotonic()
    with pytest.raises(LoaderTimeoutError) as info:
        for batch in loader:
            got.append(batch.tolist())
    assert time.monotonic() - start < 3
    assert isinstance(info.value, TimeoutError)
    assert got == [[0, 1], [2, 3], [4, 5]]
    assert "batch 3" in str(info.value) and "[6, 7]" in str(info.value)


def test_a_timeout_is_the_runtime_error_torch_users_catch() -> None:
    loader = DataLoader(Stalls(0, 5.0), batch_size=2, timeout=1)
    with pytest.raises(RuntimeError, match=r"^DataLoader timed out after 1 seconds") as info:
        next(iter(loader))
    assert isinstance(info.value, LoaderTimeoutError | TimeoutError)


@pytest.mark.asyncio
async def test_timeout_names_the_stalled_batch_in_async_for() -> None:
    with pytest.raises(LoaderTimeoutError) as info:
        async for _ in DataLoader(Stalls(0, 5.0), batch_size=2, timeout=0.2):
            pass
    assert "batch 0" in str(info.value) and "[0, 1]" in str(info.value)


def test_slow_but_steady_batches_do_not_time_out() -> None:
    class Slowish:
        async def __getitem__(self, i: int) -> int:
            await asyncio.sleep(0.02)
            return i

        def __len__(self) -> int:
            return 10

    assert len(list(DataLoader(Slowish(), batch_size=2, timeout=1.0))) == 5
