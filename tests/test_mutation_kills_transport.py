"""The shared-memory transport of worker results, in one process (aioload/memory/segments.py).

The loader tests cross it through worker processes, where the mutation run cannot see
which test calls what (docs/testing/mutation.md); these drive the worker's side
(:class:`SegmentWriter`, :class:`Arena`) and the loader's (:class:`SegmentReader`)
directly: what goes in comes out, arrays are views of the segment, collated arrays are
not copied again, and segments are recycled, dropped past the bound, and never mixed up.
"""

from __future__ import annotations

import gc
from typing import Any

import numpy as np
import pytest

from aioload.memory.segments import SegmentReader, SegmentWriter, Written


def read(reader: SegmentReader, written: Written) -> Any:
    return reader.read(written.segment, written.size, written.layout_at, written.fd)


def payload() -> dict[str, Any]:
    return {
        "floats": np.arange(12, dtype=np.float32).reshape(3, 4),
        "fortran": np.asfortranarray(np.arange(6, dtype=np.int64).reshape(2, 3)),
        "strided": np.arange(20, dtype=np.int16)[::3],
        "empty": np.zeros((0, 5), dtype=np.uint8),
        "bools": np.array([True, False, True]),
        "scalar": np.float64(2.5),
        "text": "caf\u00e9",
        "bytes": b"\x00\x01",
        "nested": [1, (2, None), {"k": np.array([7, 8], dtype=np.uint64)}],
    }


def assert_same(got: Any, expected: Any) -> None:
    if isinstance(expected, np.ndarray):
        assert isinstance(got, np.ndarray)
        assert got.dtype == expected.dtype and got.shape == expected.shape
        if expected.flags.f_contiguous and not expected.flags.c_contiguous:
            assert got.flags.f_contiguous  # Fortran order is kept
        np.testing.assert_array_equal(got, expected)
    elif isinstance(expected, dict):
        assert got.keys() == expected.keys()
        for key in expected:
            assert_same(got[key], expected[key])
    elif isinstance(expected, list | tuple):
        assert type(got) is type(expected) and len(got) == len(expected)
        for a, b in zip(got, expected, strict=True):
            assert_same(a, b)
    else:
        assert got == expected and type(got) is type(expected)


def test_every_value_crosses_intact_and_arrays_are_views_of_the_segment() -> None:
    writer, reader = SegmentWriter(), SegmentReader(keep_free=2)
    written = writer.write(payload())
    assert written.fd is not None  # a new segment: its descriptor must cross once
    got = read(reader, written)
    assert_same(got, payload())
    assert not got["floats"].flags.owndata  # unpickled in place, not copied
    got["floats"][0, 0] = 100.0  # the consumer owns the memory now
    assert got["floats"][0, 0] == 100.0
    del got
    reader.close()


def test_results_written_one_after_another_keep_their_own_segments() -> None:
    writer, reader = SegmentWriter(), SegmentReader(keep_free=4)
    batches = [{"x": np.full((64, 64), i, dtype=np.int32)} for i in range(4)]
    written = [writer.write(b) for b in batches]
    assert len({w.segment for w in written}) == 4  # nothing was returned: four segments
    got = [read(reader, w) for w in written]
    for i, batch in enumerate(got):
        assert int(batch["x"].min()) == int(batch["x"].max()) == i
    del got
    reader.close()


def test_a_dead_result_returns_its_segment_and_the_next_result_reuses_it() -> None:
    writer, reader = SegmentWriter(), SegmentReader(keep_free=1)
    first = writer.write({"x": np.ones(1000)})
    got = read(reader, first)
    assert reader.take_returned() == ([], [])  # still alive: nothing goes back
    del got
    gc.collect()
    recycle, drop = reader.take_returned()
    assert (recycle, drop) == ([first.segment], [])
    writer.recycle(recycle)
    second = writer.write({"y": np.arange(1000)})
    # The same segment, already mapped by the loader: no descriptor crosses again.
    assert (second.segment, second.size, second.fd) == (first.segment, first.size, None)
    assert_same(read(reader, second), {"y": np.arange(1000)})
    reader.close()


def test_segments_past_the_idle_bound_are_dropped_on_both_sides() -> None:
    writer, reader = SegmentWriter(), SegmentReader(keep_free=1)
    written = [writer.write({"x": np.full(100, i)}) for i in range(3)]
    got = [read(reader, w) for w in written]
    del got
    gc.collect()
    recycle, drop = reader.take_returned()
    assert len(recycle) == 1 and len(drop) == 2
    assert sorted(recycle + drop) == sorted(w.segment for w in written)
    writer.recycle(recycle)
    writer.drop(drop)
    again = writer.write({"x": np.zeros(100)})
    assert again.segment == recycle[0] and again.fd is None
    fresh = writer.write({"x": np.zeros(100)})  # the dropped ones are gone: a new one
    assert fresh.segment not in {w.segment for w in written} and fresh.fd is not None
    reader.close()


def test_a_discarded_result_gives_its_segment_straight_back() -> None:
    writer, reader = SegmentWriter(), SegmentReader(keep_free=2)
    written = writer.write({"x": np.ones(10)})
    reader.discard(written.segment, written.size, written.fd)
    assert reader.take_returned() == ([written.segment], [])


def test_arrays_collated_into_the_arena_are_not_copied_again() -> None:
    writer, reader = SegmentWriter(), SegmentReader(keep_free=2)
    arena = writer.arena()
    big = arena.allocate((256, 1024), np.dtype(np.float32))
    small = arena.allocate((3,), np.dtype(np.int64))
    assert big is not None and small is not None and arena.segment is not None
    big[...] = np.arange(1024, dtype=np.float32)
    small[...] = [5, 6, 7]
    written = writer.write({"big": big, "small": small, "copied": np.arange(4)}, arena)
    assert written.segment == arena.segment.id
    # Only what was not in the arena (and the pickle) was added after it.
    assert writer.expected_size < big.nbytes + 64 * 1024
    got = read(reader, written)
    np.testing.assert_array_equal(got["big"][7], np.arange(1024, dtype=np.float32))
    assert got["small"].tolist() == [5, 6, 7] and got["copied"].tolist() == [0, 1, 2, 3]
    del got, big, small
    reader.close()


def test_a_result_written_in_its_arena_keeps_the_segment_while_it_lives() -> None:
    writer, reader = SegmentWriter(), SegmentReader(keep_free=2)

    def collated(value: int) -> Any:
        arena = writer.arena()
        batch = arena.allocate((1000,), np.dtype(np.int64))
        assert batch is not None
        batch[...] = value
        return read(reader, writer.write(batch, arena))

    first = collated(1)
    second = collated(2)  # must not be written over the first, which is still alive
    assert int(first.min()) == int(first.max()) == 1
    assert int(second.min()) == 2
    del first, second
    reader.close()


def test_an_arena_allocates_distinct_aligned_arrays_until_it_is_full() -> None:
    writer = SegmentWriter()
    arena = writer.arena()
    a = arena.allocate((10,), np.dtype(np.uint8))
    b = arena.allocate((4, 4), np.dtype(np.float64))
    assert a is not None and b is not None
    assert a.shape == (10,) and b.shape == (4, 4) and b.dtype == np.float64
    assert b.ctypes.data % 64 == 0 and b.ctypes.data >= a.ctypes.data + 10
    a[...] = 1
    b[...] = 2.0
    assert a.tolist() == [1] * 10 and float(b.sum()) == 32.0  # no overlap
    assert arena.segment is not None
    too_big = arena.allocate((arena.segment.size,), np.dtype(np.uint8))
    assert too_big is None


def test_a_result_larger_than_its_arena_goes_to_a_new_segment_and_frees_the_arena() -> None:
    writer, reader = SegmentWriter(), SegmentReader(keep_free=2)
    arena = writer.arena()
    kept = arena.allocate((8,), np.dtype(np.uint8))
    assert kept is not None and arena.segment is not None
    kept[...] = 9
    arena_id, arena_size = arena.segment.id, arena.segment.size
    huge = np.ones(arena_size, dtype=np.uint8)  # cannot fit next to it
    written = writer.write({"kept": kept, "huge": huge}, arena)
    assert written.segment != arena_id and written.size > arena_size
    got = read(reader, written)
    assert got["kept"].tolist() == [9] * 8 and int(got["huge"].sum()) == arena_size
    # The arena's segment went back to the free list: the next take of its size reuses it.
    assert arena.segment is None
    assert writer.take(arena_size).id == arena_id
    del got
    reader.close()


def test_an_unused_arena_released_is_reused() -> None:
    writer = SegmentWriter()
    arena = writer.arena()
    assert arena.allocate((16,), np.dtype(np.uint8)) is not None
    assert arena.segment is not None
    segment = arena.segment.id
    arena.release()
    assert arena.segment is None
    assert next_arena_segment(writer) == segment


def next_arena_segment(writer: SegmentWriter) -> int:
    arena = writer.arena()
    assert arena.allocate((16,), np.dtype(np.uint8)) is not None
    assert arena.segment is not None
    return arena.segment.id


def test_tensors_cross_as_views_of_the_segment() -> None:
    torch = pytest.importorskip("torch")
    writer, reader = SegmentWriter(), SegmentReader(keep_free=2)
    tensor = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    big = torch.ones(256, 1024)
    written = writer.write({"t": tensor, "strided": tensor[:, ::2], "big": big})
    # The tensors' data went out of band, ahead of the pickle (not inside it).
    assert written.layout_at >= big.numel() * big.element_size()
    got = read(reader, written)
    assert type(got["t"]) is torch.Tensor and torch.equal(got["t"], tensor)
    assert torch.equal(got["strided"], tensor[:, ::2]) and torch.equal(got["big"], big)
    del got
    reader.close()


def test_results_of_every_size_around_a_page_boundary_fit_their_segment() -> None:
    # The segment is sized from the result's end (buffers, layout and pickle): a result
    # that ends a few bytes past a page must get the next size, or its tail is cut off.
    writer, reader = SegmentWriter(), SegmentReader(keep_free=1)
    for n in range(3900, 4200, 4):
        written = writer.write(np.full(n, n % 251, dtype=np.uint8))
        got = read(reader, written)
        assert got.shape == (n,) and int(got[-1]) == n % 251
        del got
        recycle, drop = reader.take_returned()
        writer.recycle(recycle)
        writer.drop(drop)
    reader.close()
