"""``collate_as_read`` (aioload/collate/streamed.py) against the plain path it stands in for:
``default_collate([getitem(key) for key in keys])`` — the same batch, byte for byte, or the
same error, whatever the samples are; each sample is read once, in key order."""

from __future__ import annotations

import collections
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import numpy as np
import pytest

from aioload import default_collate
from aioload.collate.core import collate_into
from aioload.collate.fns import collate_numpy_array_fn, default_collate_fn_map
from aioload.collate.streamed import collate_as_read
from aioload.memory.segments import Arena, SegmentWriter
from tests.batches import assert_same_batch

BIG = 1 << 16  # bytes per sample: a batch of 4 is over the in-place bound


@contextmanager
def in_arena() -> Iterator[Arena]:
    arena = SegmentWriter().arena()
    try:
        with collate_into(arena.allocate):
            yield arena
    finally:
        arena.release()


def in_segment(array: np.ndarray, arena: Arena) -> bool:
    assert arena.segment is not None
    base = arena.segment.address
    return base <= array.ctypes.data < base + arena.segment.size


class Reads:
    """A ``getitem`` over ``samples`` that records the keys it was asked for."""

    def __init__(self, samples: list[Any]) -> None:
        self.samples = samples
        self.keys: list[int] = []

    def __call__(self, key: int) -> Any:
        self.keys.append(key)
        sample = self.samples[key]
        if isinstance(sample, BaseException):
            raise sample
        return sample


def both(samples: list[Any]) -> tuple[Any, Any, Reads]:
    """(collate_as_read's outcome, the plain path's) in an arena; each an object or an error."""
    keys = list(range(len(samples)))
    reads = Reads(samples)

    def outcome(run: Callable[[], Any]) -> Any:
        try:
            return run()
        except Exception as error:  # compared below, as the plain path's error
            return error

    with in_arena():
        fast = outcome(lambda: collate_as_read(reads, keys))
        fast_keys, reads.keys = reads.keys, []
        plain = outcome(lambda: default_collate([reads(key) for key in keys]))
    assert fast_keys == reads.keys  # read once each, in key order, as the list reads them
    return fast, plain, reads


def arrays(count: int = 4, dtype: Any = np.float32, shape: tuple[int, ...] = (128, 128)) -> list:
    rng = np.random.default_rng(count)
    return [rng.standard_normal(shape).astype(dtype) for _ in range(count)]


def test_alike_arrays_are_stacked_as_read_into_the_room_byte_for_byte() -> None:
    samples = arrays()
    samples[2][0, 0] = np.nan  # any bits, NaN too, copied as they are
    with in_arena() as arena:
        batch = collate_as_read(lambda key: samples[key], range(4))
        assert in_segment(batch, arena)
    plain = default_collate(samples)
    assert_same_batch(batch, plain)


@pytest.mark.parametrize(
    "layout",
    ["fortran", "strided", "zero-d", "datetime", "bool", "complex", "uint64"],
)
def test_every_numeric_layout_and_dtype_gives_the_plain_batch(layout: str) -> None:
    count = 8
    if layout == "fortran":
        samples = [np.asfortranarray(a) for a in arrays(count)]
    elif layout == "strided":
        samples = [a[::2, ::3] for a in arrays(count, np.float64, (256, 192))]
    elif layout == "zero-d":  # too small for the room: the plain path
        samples = [np.array(i, np.int32) for i in range(count)]
    elif layout == "datetime":
        samples = [np.arange(i, i + BIG // 8).astype("datetime64[s]") for i in range(count)]
    elif layout == "bool":
        samples = [np.arange(BIG) % (i + 2) == 0 for i in range(count)]
    elif layout == "complex":
        samples = [a.astype(np.complex64) for a in arrays(count)]
    else:
        samples = [np.arange(BIG // 8, dtype=np.uint64) * i for i in range(count)]
    fast, plain, _ = both(samples)
    assert_same_batch(fast, plain)


def ragged(count: int, at: int, odd: Any) -> list[Any]:
    samples: list[Any] = arrays(count)
    samples[at] = odd
    return samples


@pytest.mark.parametrize("at", [1, 3])
@pytest.mark.parametrize(
    "odd",
    [
        np.zeros((128, 127), np.float32),  # another shape: torch's RuntimeError naming both
        np.zeros((128, 128), np.float64),  # another dtype: promoted, as np.array does
        np.zeros((128, 128), np.int8),
        None,  # not an array: CollateTypeError naming the entry
        [[0.0] * 128] * 128,  # a list where arrays were
        np.ma.masked_array(np.zeros((128, 128), np.float32)),  # a subclass
        np.zeros((128, 128), object),
        np.array(["x"] * 16),
    ],
    ids=["shape", "float64", "int8", "None", "list", "masked", "object", "str"],
)
def test_a_sample_that_breaks_the_pattern_gives_the_plain_result_or_error(
    at: int, odd: Any
) -> None:
    fast, plain, _ = both(ragged(4, at, odd))
    assert_same_batch(fast, plain)


@pytest.mark.parametrize(
    "first",
    [
        np.ma.masked_array(np.ones((128, 128), np.float32)),
        None,
        np.zeros((4, 4), np.float32),  # small: copied, not stacked in place
        np.zeros((128, 128), object),
        np.zeros(BIG, "S1"),
        {"x": np.zeros(BIG, np.uint8), "y": 1},
        (np.zeros(BIG, np.uint8), "label"),
        3.5,
        "text",
    ],
    ids=["masked", "None", "small", "object", "bytes", "dict", "tuple", "float", "str"],
)
def test_samples_it_does_not_stack_go_the_plain_way(first: Any) -> None:
    samples = [first] * 4
    fast, plain, _ = both(samples)
    assert_same_batch(fast, plain)


def test_an_error_while_reading_propagates_as_from_the_list() -> None:
    failing = ragged(4, 2, KeyError("key 2 is gone"))
    reads = Reads(failing)
    with in_arena(), pytest.raises(KeyError, match="key 2 is gone"):
        collate_as_read(reads, range(4))
    assert reads.keys == [0, 1, 2]  # nothing read past the failure, as the list would


def test_without_room_or_allocator_the_batch_is_the_plain_one() -> None:
    samples = arrays()
    outside = collate_as_read(lambda key: samples[key], range(4))  # no collate_into
    with collate_into(lambda shape, dtype: None):  # no room
        no_room = collate_as_read(lambda key: samples[key], range(4))
    plain = default_collate(samples)
    assert_same_batch(outside, plain)
    assert_same_batch(no_room, plain)
    with pytest.raises(IndexError), in_arena():
        collate_as_read(lambda key: samples[key], [])


def test_a_users_function_for_arrays_is_left_to_collate() -> None:
    def halves(batch: Any, *, collate_fn_map: Any = None) -> np.ndarray:
        return np.stack(batch).astype(np.float16)

    default_collate_fn_map[np.ndarray] = halves
    try:
        fast, plain, _ = both(arrays())
    finally:
        default_collate_fn_map[np.ndarray] = collate_numpy_array_fn
    assert fast.dtype == np.float16
    assert_same_batch(fast, plain)


# -- dicts -----------------------------------------------------------------------


def records(count: int = 4) -> list[dict[str, Any]]:
    """Dict samples: two big arrays stacked as read, and fields collated at the end."""
    rng = np.random.default_rng(7)
    return [
        {
            "image": rng.integers(0, 256, (64, 64, 16), dtype=np.uint8),
            "label": i,
            "weight": i / 4,
            "name": f"s{i}",
            "small": np.full(3, i, np.int16),
            "mask": rng.random((64, 256)) > 0.5,
            "nested": {"box": np.arange(4) + i, "tag": b"t"},
        }
        for i in range(count)
    ]


def test_dict_samples_are_stacked_as_read_field_by_field() -> None:
    samples = records()
    with in_arena() as arena:
        batch = collate_as_read(lambda key: samples[key], range(4))
        assert in_segment(batch["image"], arena)  # (the mask no longer fits: the heap's)
    plain = default_collate(samples)
    assert type(batch) is dict and list(batch) == list(plain)
    assert_same_batch(batch, plain)


def changed(at: int, change: Callable[[dict[str, Any]], Any]) -> list[Any]:
    samples: list[Any] = records()
    result = change(samples[at])
    if result is not None:
        samples[at] = result
    return samples


@pytest.mark.parametrize("at", [1, 3])
@pytest.mark.parametrize(
    "change",
    [
        lambda s: s.update(image=s["image"][:-1]),  # another shape: the plain error
        lambda s: s.update(image=s["image"].astype(np.int16)),  # another dtype: promoted
        lambda s: s.update(image=None),
        lambda s: s.pop("label"),  # a missing key: the plain KeyError
        lambda s: {"extra": 1, **s},  # another key order (and an extra key)
        lambda s: {**s, "extra": 1},  # an extra key at the end: ignored, as plainly
        lambda s: s.update(label="x"),  # a field that does not collate at the end
        lambda s: s.update(nested=None),
        lambda s: [s["image"]],  # not a dict
        lambda s: collections.OrderedDict(s),
    ],
    ids=[
        "shape",
        "dtype",
        "None",
        "missing",
        "order",
        "extra",
        "label",
        "nested",
        "list",
        "ordered",
    ],
)
def test_a_dict_that_breaks_the_pattern_gives_the_plain_result_or_error(
    at: int, change: Callable[[dict[str, Any]], Any]
) -> None:
    fast, plain, _ = both(changed(at, change))
    assert_same_batch(fast, plain)


def test_dicts_it_does_not_stack_go_the_plain_way() -> None:
    small = [{"x": np.zeros(4, np.float32), "y": i} for i in range(4)]  # nothing big
    ordered = [collections.OrderedDict(s) for s in records()]  # not a plain dict
    for samples in (small, ordered):
        fast, plain, _ = both(samples)
        assert_same_batch(fast, plain)
        assert type(fast) is type(plain)


def test_an_error_while_reading_dicts_propagates_as_from_the_list() -> None:
    failing: list[Any] = records()
    failing[2] = ValueError("unreadable")
    reads = Reads(failing)
    with in_arena(), pytest.raises(ValueError, match="unreadable"):
        collate_as_read(reads, range(4))
    assert reads.keys == [0, 1, 2]


# -- tuples ----------------------------------------------------------------------


def pairs(count: int = 4) -> list[tuple[Any, ...]]:
    """``(image, label, name)`` samples, as torchvision's datasets give them."""
    rng = np.random.default_rng(3)
    return [
        (rng.random((64, 64, 4), dtype=np.float32), i, f"n{i}", (np.arange(3) + i, 0.5))
        for i in range(count)
    ]


def test_tuple_samples_are_stacked_as_read_into_a_list_of_columns() -> None:
    samples = pairs()
    with in_arena() as arena:
        batch = collate_as_read(lambda key: samples[key], range(4))
        assert in_segment(batch[0], arena)
    plain = default_collate(samples)
    assert type(batch) is list and len(batch) == 4
    assert batch[2] == ("n0", "n1", "n2", "n3")
    assert_same_batch(batch, plain)


@pytest.mark.parametrize("at", [1, 3])
@pytest.mark.parametrize(
    "change",
    [
        lambda s: (s[0][:, :-1], *s[1:]),  # another shape
        lambda s: (s[0].astype(np.float64), *s[1:]),  # another dtype
        lambda s: s[:3],  # shorter: torch's RuntimeError on unequal sizes
        lambda s: (*s, 1),  # longer
        lambda s: list(s),  # a list where tuples were
        lambda s: (None, *s[1:]),
        lambda s: (s[0], "label", *s[2:]),  # a column that does not collate at the end
        lambda s: Pair(s[0], s[1]),  # a namedtuple
    ],
    ids=["shape", "dtype", "shorter", "longer", "list", "None", "label", "namedtuple"],
)
def test_a_tuple_that_breaks_the_pattern_gives_the_plain_result_or_error(
    at: int, change: Callable[[tuple[Any, ...]], Any]
) -> None:
    samples: list[Any] = pairs()
    samples[at] = change(samples[at])
    fast, plain, _ = both(samples)
    assert_same_batch(fast, plain)


class Pair(NamedTuple):
    image: np.ndarray
    label: int


def test_namedtuple_and_list_samples_go_the_plain_way() -> None:
    named = [Pair(s[0], s[1]) for s in pairs()]
    listed = [list(s) for s in pairs()]
    for samples in (named, listed):
        fast, plain, _ = both(samples)
        assert type(fast) is type(plain)
        assert_same_batch(fast, plain)


# -- memory ----------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["array", "dict", "tuple"])
def test_each_sample_is_let_go_before_the_next_is_read(kind: str) -> None:
    # What the path is for: one sample alive at a time, so the next one is made in the memory
    # (and the cache) the last one freed. CPython frees an array when its last reference goes.
    alive: list[weakref.ref[np.ndarray]] = []

    def getitem(key: int) -> Any:
        assert all(ref() is None for ref in alive), f"a sample before {key} is still alive"
        image = np.full(BIG, key, np.uint8)
        alive.append(weakref.ref(image))
        if kind == "dict":
            return {"image": image, "label": key}
        return (image, key) if kind == "tuple" else image

    with in_arena():
        batch = collate_as_read(getitem, range(6))
    images = batch if kind == "array" else batch["image"] if kind == "dict" else batch[0]
    assert [int(row[0]) for row in images] == list(range(6))
