"""aioload.progress: a tqdm bar over a loader, for ``for`` and ``async for``."""

from __future__ import annotations

import io
import sys
from typing import Any

import numpy as np
import pytest
import tqdm

import aioload
from aioload import ArrayDataset, DataLoader


def loader(n: int = 20, batch_size: int = 4) -> DataLoader:
    return DataLoader(ArrayDataset(np.arange(n)), batch_size=batch_size)


def bar_text(out: io.StringIO) -> str:
    return out.getvalue().replace("\r", "\n")


def test_for_yields_the_loaders_batches_and_shows_items_per_second_and_stall() -> None:
    out = io.StringIO()
    data = loader()
    got = [x.tolist() for (x,) in aioload.progress(data, file=out, tqdm_class=tqdm.tqdm)]
    assert got == [x.tolist() for (x,) in data]
    text = bar_text(out)
    assert "5/5" in text and "batch" in text
    assert "items/s" in text and "stall" in text
    assert not data.stats().iterating


@pytest.mark.asyncio
async def test_async_for_too() -> None:
    out = io.StringIO()
    data = loader()
    got = [x.tolist() async for (x,) in aioload.progress(data, file=out, tqdm_class=tqdm.tqdm)]
    assert got == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15], [16, 17, 18, 19]]
    text = bar_text(out)
    assert "5/5" in text and "items/s" in text and "stall" in text


def test_break_closes_the_bar_and_ends_the_loaders_iteration() -> None:
    out = io.StringIO()
    data = loader(100, 2)
    bar = aioload.progress(data, file=out, tqdm_class=tqdm.tqdm, desc="train")
    assert len(bar) == 50
    for i, _ in enumerate(bar):
        if i == 3:
            break
    assert not data.stats().iterating
    assert "train" in bar_text(out) and "4/50" in bar_text(out)


@pytest.mark.asyncio
async def test_async_aclose_ends_the_loaders_iteration() -> None:
    data = loader(100, 2)
    iterator: Any = aiter(aioload.progress(data, file=io.StringIO(), tqdm_class=tqdm.tqdm))
    await anext(iterator)
    assert data.stats().iterating
    await iterator.aclose()
    assert not data.stats().iterating


def test_a_loader_without_length() -> None:
    class Stream(aioload.IterableDataset):
        def __iter__(self) -> Any:
            return iter(range(10))

    out = io.StringIO()
    batches = list(aioload.progress(DataLoader(Stream(), batch_size=3), file=out))
    assert len(batches) == 4 and "4batch" in bar_text(out).replace(" ", "")


def test_without_tqdm_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    with pytest.raises(ImportError, match=r"pip install 'aioload-data\[progress\]'$"):
        aioload.progress(loader())


def test_no_bar_unless_asked(capsys: pytest.CaptureFixture[str]) -> None:
    list(loader())
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == ""
