"""An iterable dataset that yields more than its reported ``len()`` warns, as in torch.

torch warns when ``len(loader)`` was asked before the iteration and the
iterator then yields more batches than the dataset's ``len()``: once for every
batch past it. The loader hands the iterator what ``len()`` reported (a
:class:`~aioload.pipeline.iteration.ReportedLength`); these tests build the iterators
with one, as ``DataLoader.__iter__``/``__aiter__`` do.
"""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from aioload import DataLoader, IterableDataset
from aioload.pipeline.iteration import AsyncBatchIterator, ReportedLength, SyncBatchIterator


class Overlong(IterableDataset[int]):
    """Says it has ``length`` samples, yields ``actual``."""

    def __init__(self, length: int, actual: int) -> None:
        self.length, self.actual = length, actual

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.actual))

    def __len__(self) -> int:
        return self.length

    def __repr__(self) -> str:  # the same in both loaders' messages
        return f"Overlong({self.length}, {self.actual})"


def message(dataset: Any, length: int, yielded: int) -> str:
    return (
        f"Length of IterableDataset {dataset} was reported to be {length}(when accessing "
        f"len(dataloader)), but {yielded} samples have been fetched. "
    )


def collect_sync(loader: DataLoader[Any], reported: ReportedLength | None) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in SyncBatchIterator(loader._new_epoch, 0, reported):
            pass
    return [str(w.message) for w in caught if issubclass(w.category, UserWarning)]


def collect_async(loader: DataLoader[Any], reported: ReportedLength | None) -> list[str]:
    async def consume() -> None:
        async for _ in AsyncBatchIterator(loader._new_epoch, 0, reported):
            pass

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        asyncio.run(consume())
    return [str(w.message) for w in caught if issubclass(w.category, UserWarning)]


COLLECT = {"for": collect_sync, "async for": collect_async}


@pytest.mark.timeout(10)
@pytest.mark.parametrize("style", ["for", "async for"])
@pytest.mark.parametrize(("batch_size", "batches"), [(None, 6), (2, 3)])
def test_warns_for_every_batch_past_the_reported_length(
    style: str, batch_size: int | None, batches: int
) -> None:
    dataset = Overlong(2, 6)
    loader: DataLoader[Any] = DataLoader(dataset, batch_size=batch_size)
    got = COLLECT[style](loader, ReportedLength(dataset, len(dataset)))
    # torch compares the batches yielded with the dataset's len(), not len(loader).
    assert got == [message(dataset, 2, n) for n in range(3, batches + 1)]


@pytest.mark.timeout(10)
@pytest.mark.parametrize("style", ["for", "async for"])
def test_no_warning_without_a_reported_length_or_within_it(style: str) -> None:
    loader: DataLoader[Any] = DataLoader(Overlong(2, 6), batch_size=2)
    assert COLLECT[style](loader, None) == []
    assert COLLECT[style](loader, ReportedLength(loader.dataset, 3)) == []


@pytest.mark.timeout(10)
def test_with_workers_the_warning_suggests_the_cause() -> None:
    dataset = Overlong(1, 2)
    with pytest.warns(UserWarning) as caught:
        ReportedLength(dataset, 1, num_workers=2).warn(2)
    text = str(caught[0].message)
    assert text.startswith(message(dataset, 1, 2)) and "replica at each worker" in text


@pytest.mark.timeout(10)
def test_the_warning_points_at_the_callers_loop() -> None:
    loader: DataLoader[Any] = DataLoader(Overlong(1, 2), batch_size=None)
    with pytest.warns(UserWarning) as caught:
        for _ in SyncBatchIterator(loader._new_epoch, 0, ReportedLength(loader.dataset, 1)):
            pass
    assert caught[0].filename == __file__


@pytest.mark.timeout(30)
@pytest.mark.parametrize("batch_size", [None, 2, 4])
def test_same_warnings_as_torch(batch_size: int | None) -> None:
    torch_data = pytest.importorskip("torch.utils.data")

    class TorchOverlong(torch_data.IterableDataset):  # type: ignore[misc,name-defined]
        def __iter__(self) -> Iterator[int]:
            return iter(range(7))

        def __len__(self) -> int:
            return 3

        def __repr__(self) -> str:
            return "Overlong(3, 7)"

    torch_loader = torch_data.DataLoader(TorchOverlong(), batch_size=batch_size)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        len(torch_loader)
        list(torch_loader)
    expected = [str(w.message) for w in caught if "Length of IterableDataset" in str(w.message)]
    dataset = Overlong(3, 7)
    loader: DataLoader[Any] = DataLoader(dataset, batch_size=batch_size)
    reported = ReportedLength(dataset, len(dataset))
    assert collect_sync(loader, reported) == expected
    assert collect_async(loader, reported) == expected


class Overruns(IterableDataset[int]):
    """Says it holds 3 samples, yields 5."""

    def __len__(self) -> int:
        return 3

    def __iter__(self) -> Iterator[int]:
        return iter(range(5))


def _warned(run: Callable[[], object]) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run()
    return [str(w.message) for w in caught if "was reported to be" in str(w.message)]


def test_the_loader_warns_after_len_was_asked_and_only_then() -> None:
    loader = DataLoader(Overruns(), batch_size=None)
    assert len(_warned(lambda: list(loader))) == 0  # len() never asked: nothing to compare
    assert len(loader) == 3
    messages = _warned(lambda: list(loader))
    assert len(messages) == 2  # batches 4 and 5
    assert "reported to be 3" in messages[0] and "5 samples have been fetched" in messages[1]


def test_the_loader_warns_as_torch_does() -> None:
    torch = pytest.importorskip("torch")

    class TorchOverruns(torch.utils.data.IterableDataset):  # type: ignore[misc]
        def __len__(self) -> int:
            return 3

        def __iter__(self) -> Iterator[int]:
            return iter(range(5))

    theirs_loader = torch.utils.data.DataLoader(TorchOverruns(), batch_size=None)
    len(theirs_loader)
    ours_loader = DataLoader(Overruns(), batch_size=None)
    len(ours_loader)
    theirs = _warned(lambda: list(theirs_loader))
    ours = _warned(lambda: list(ours_loader))
    assert len(ours) == len(theirs)
    strip = lambda text: text.split(" was reported", 1)[1]  # noqa: E731 - the dataset's repr differs
    assert [strip(m) for m in ours] == [strip(m) for m in theirs]
