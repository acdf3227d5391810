"""Big batches through worker processes: the fast path (stacked straight into a reused shared
segment, huge pages advised) gives the batches the plain path gives.

The plain path is the same loader with ``num_workers=0``: ``default_collate`` in the consumer's
process, nothing shared. Datasets live at module level: workers may pickle them.
"""

from __future__ import annotations

import mmap
import os
from typing import Any, NamedTuple

import numpy as np
import pytest

import aioload
from aioload import DataLoader
from aioload.memory.buffers import HUGE_PAGE, advise_huge_pages
from aioload.memory.segments import SegmentReader, SegmentWriter
from tests.batches import assert_same_batch
from tests.mappings import segment_inode

ITEM = 3 << 19  # 1.5 MiB: a batch of 4 is 6 MiB, three whole huge pages


class Pair(NamedTuple):
    image: np.ndarray
    label: int


class Mixed(aioload.Dataset):
    """Big arrays in a dict, a tuple and a namedtuple, next to numbers, text and None-free
    lists: every container default_collate knows, and leaves it does not stack."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, index: int) -> dict[str, Any]:
        rng = np.random.default_rng(index)
        return {
            "big": rng.integers(0, 256, ITEM, dtype=np.uint8),
            "floats": rng.random((64, 1024), dtype=np.float32),  # 256 KiB, float32
            "pair": (np.full(ITEM // 8, index, np.int64), f"name-{index}"),
            "named": Pair(rng.integers(0, 9, (3, 4), dtype=np.int16), index),
            "scalar": np.float64(index / 3),
            "flag": index % 2 == 0,
            "raw": bytes([index]) * 5,
        }


def stack_my_way(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """A custom collate_fn: left alone by the fast path (its arrays are copied once)."""
    return {"big": np.stack([s["big"] for s in samples])[:, ::-1], "n": len(samples)}


@pytest.mark.parametrize("collate_fn", [None, stack_my_way])
def test_big_batches_from_workers_are_the_plain_paths_batches(collate_fn: Any) -> None:
    plain = list(DataLoader(Mixed(), batch_size=4, collate_fn=collate_fn))
    fast = list(DataLoader(Mixed(), batch_size=4, num_workers=2, collate_fn=collate_fn))
    assert len(fast) == len(plain) == 3
    for got, expected in zip(fast, plain, strict=True):
        assert_same_batch(got, expected, layout=False)  # a worker sends arrays contiguous
    if collate_fn is None:  # default_collate's rules, kept: tuples become lists, text inside
        first = fast[0]  # a sequence a tuple (as torch), text in a mapping a list
        assert isinstance(first["pair"], list)
        assert first["pair"][1] == tuple(f"name-{i}" for i in range(4))
        assert isinstance(first["named"], Pair) and first["named"].label.tolist() == [0, 1, 2, 3]
        assert first["flag"].dtype == np.bool_
        assert first["raw"] == [bytes([i]) * 5 for i in range(4)]
        assert not first["big"].flags.owndata  # a view of the segment: stacked there, not copied


class Arrays(aioload.Dataset):
    """Top-level 1.5 MiB arrays, stacked as read in a worker; key 9 is float64 where the
    others are float32 and key 14 a shorter array: those batches go the plain way."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> np.ndarray:
        values = np.random.default_rng(index).random(ITEM // 4, dtype=np.float32)
        if index == 9:
            return values.astype(np.float64)
        return values[:-1] if index == 14 else values


def test_arrays_stacked_as_read_in_workers_are_the_plain_paths_batches() -> None:
    def outcomes(workers: int) -> list[Any]:
        loader = DataLoader(Arrays(), batch_size=4, num_workers=workers)
        iterator, got = iter(loader), []
        while True:
            try:
                got.append(next(iterator))
            except StopIteration:
                return got
            except RuntimeError as error:  # the ragged batch: the same error, then on
                got.append(str(error).splitlines()[0])

    plain, fast = outcomes(0), outcomes(2)
    assert len(fast) == len(plain) == 4
    assert isinstance(plain[3], str) and "shape" in plain[3]
    assert fast[2].dtype == np.float64  # promoted, as np.array does
    for got, expected in zip(fast, plain, strict=True):
        assert_same_batch(got, expected, layout=False)  # a worker sends arrays contiguous


class Numbered(aioload.Dataset):
    """Sample ``i`` is 1.5 MiB of uint16 values that only sample ``i`` holds."""

    def __len__(self) -> int:
        return 48

    def __getitem__(self, index: int) -> np.ndarray:
        return Numbered.expected(index)

    @staticmethod
    def expected(index: int) -> np.ndarray:
        count = ITEM // 2
        return (np.arange(count, dtype=np.uint32) + index * 7919).astype(np.uint16)


def test_a_held_big_batch_is_never_written_over_while_dropped_ones_are_reused() -> None:
    # Every third batch kept to the end, the others dropped once read: the dropped ones'
    # segments are written again (few segments in all), the kept ones' never.
    loader = DataLoader(Numbered(), batch_size=2, num_workers=2, prefetch_factor=2)
    kept: dict[int, np.ndarray] = {}
    inodes: set[int] = set()
    for number, batch in enumerate(loader):
        for row, index in enumerate((2 * number, 2 * number + 1)):
            np.testing.assert_array_equal(batch[row], Numbered.expected(index))
        inodes.add(segment_inode(batch))
        if number % 3 == 0:
            kept[number] = batch
    del batch
    for number, batch in kept.items():
        for row, index in enumerate((2 * number, 2 * number + 1)):
            np.testing.assert_array_equal(batch[row], Numbered.expected(index))
    assert len(inodes) < 24, "one segment per batch: dropped batches' segments were not reused"


def test_huge_pages_are_advised_on_whole_huge_pages_only() -> None:
    small = mmap.mmap(-1, HUGE_PAGE - mmap.PAGESIZE)
    assert not advise_huge_pages(small, len(small))
    fd = os.memfd_create("aioload-test", os.MFD_CLOEXEC)
    try:
        size = HUGE_PAGE * 2 + mmap.PAGESIZE  # the tail is not a whole huge page: not advised
        os.ftruncate(fd, size)
        mapping = mmap.mmap(fd, size)
    finally:
        os.close(fd)
    advised = advise_huge_pages(mapping, size)  # True wherever the kernel has the advice
    assert advised == hasattr(mmap, "MADV_HUGEPAGE") or not advised
    view = np.frombuffer(mapping, np.uint8)
    view[:] = np.arange(size, dtype=np.uint64).astype(np.uint8)
    assert view[-1] == (size - 1) % 256 and view[HUGE_PAGE] == 0
    del view


def test_a_big_result_read_from_an_advised_segment_is_intact() -> None:
    writer, reader = SegmentWriter(), SegmentReader(keep_free=2)
    batch = {"x": np.arange(5 * HUGE_PAGE // 4, dtype=np.int32), "y": 3}
    written = writer.write(batch)
    assert written.size >= 5 * HUGE_PAGE
    got = reader.read(written.segment, written.size, written.layout_at, written.fd)
    assert_same_batch(got, batch, layout=False)
