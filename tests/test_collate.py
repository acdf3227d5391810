"""default_collate / collate / default_convert: torch's structure rules with numpy leaves."""

from __future__ import annotations

import pickle
import subprocess
import sys
import threading
import types
from collections import OrderedDict, defaultdict, namedtuple
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from aioload.collate.core import (
    CollateTypeError,
    collate,
    collate_str_fn,
    default_collate,
    default_collate_fn_map,
    default_convert,
)

ERR = "default_collate: batch must contain tensors, numpy arrays, numbers, dicts or lists; found "
Point = namedtuple("Point", ["x", "y"])


class Pair(NamedTuple):
    image: Any
    label: Any


def assert_array(actual: Any, expected: list[Any], dtype: Any) -> None:
    assert isinstance(actual, np.ndarray)
    assert actual.dtype == dtype
    np.testing.assert_array_equal(actual, np.array(expected))


@pytest.fixture
def restore_fn_map() -> Iterator[None]:
    saved = dict(default_collate_fn_map)
    try:
        yield
    finally:
        default_collate_fn_map.clear()
        default_collate_fn_map.update(saved)


# --- the examples from torch's default_collate docstring -------------------------------------


def test_doc_example_ints() -> None:
    assert_array(default_collate([0, 1, 2, 3]), [0, 1, 2, 3], np.int64)


def test_doc_example_strings() -> None:
    assert default_collate(["a", "b", "c"]) == ["a", "b", "c"]


def test_doc_example_mapping() -> None:
    out = default_collate([{"A": 0, "B": 1}, {"A": 100, "B": 100}])
    assert type(out) is dict and list(out) == ["A", "B"]
    assert_array(out["A"], [0, 100], np.int64)
    assert_array(out["B"], [1, 100], np.int64)


def test_doc_example_namedtuple() -> None:
    out = default_collate([Point(0, 0), Point(1, 1)])
    assert type(out) is Point
    assert_array(out.x, [0, 1], np.int64)
    assert_array(out.y, [0, 1], np.int64)


def test_doc_example_tuple_becomes_list() -> None:
    out = default_collate([(0, 1), (2, 3)])
    assert type(out) is list and len(out) == 2
    assert_array(out[0], [0, 2], np.int64)
    assert_array(out[1], [1, 3], np.int64)


def test_doc_example_list() -> None:
    out = default_collate([[0, 1], [2, 3]])
    assert type(out) is list and len(out) == 2
    assert_array(out[0], [0, 2], np.int64)
    assert_array(out[1], [1, 3], np.int64)


# --- leaves: numpy arrays ---------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(), (16,), (3, 8, 8), (2, 0)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int16, np.uint8, np.bool_])
def test_arrays_stack_on_a_new_leading_axis(shape: tuple[int, ...], dtype: Any) -> None:
    batch = [np.full(shape, i, dtype=dtype) for i in range(4)]
    out = default_collate(batch)
    assert type(out) is np.ndarray
    assert out.shape == (4, *shape) and out.dtype == dtype
    np.testing.assert_array_equal(out, np.stack(batch))


def test_stacked_array_is_a_new_contiguous_array() -> None:
    batch = [np.arange(6, dtype=np.float32).reshape(2, 3).T for _ in range(3)]
    out = default_collate(batch)
    assert out.flags.c_contiguous and out.flags.owndata
    batch[0][0, 0] = 99
    assert out[0, 0, 0] == 0


def test_arrays_of_mixed_dtypes_promote_like_numpy() -> None:
    out = default_collate([np.zeros(2, np.float32), np.zeros(2, np.float64)])
    assert out.dtype == np.float64


def test_array_subclass_memmap_is_stacked(tmp_path: Any) -> None:
    mm = np.memmap(tmp_path / "a.bin", dtype=np.float32, mode="w+", shape=(2, 3))
    mm[:] = 1.0
    out = default_collate([mm[0], mm[1]])
    assert out.shape == (2, 3) and out.dtype == np.float32
    np.testing.assert_array_equal(out, np.ones((2, 3)))


@pytest.mark.parametrize(
    ("batch", "found"),
    [
        ([np.array(["a", "b"]), np.array(["c", "d"])], "<U1"),
        ([np.array([b"ab"]), np.array([b"cd"])], "|S2"),
        ([np.array([1, None], dtype=object)] * 2, "object"),
    ],
)
def test_string_and_object_arrays_raise_torchs_type_error(batch: list[Any], found: str) -> None:
    with pytest.raises(TypeError) as info:
        default_collate(batch)
    assert str(info.value) == ERR + found + " at entry 0"


def test_ragged_arrays_raise_runtime_error_naming_the_shapes() -> None:
    batch = [np.zeros(3), np.zeros(3), np.zeros((4,))]
    with pytest.raises(RuntimeError, match=r"shape \(3,\) at entry 0 and shape \(4,\) at entry 2"):
        default_collate(batch)


def test_ragged_arrays_differing_in_an_inner_dimension() -> None:
    with pytest.raises(RuntimeError, match=r"\(2, 3\) at entry 0 and shape \(2, 4\) at entry 1"):
        default_collate([np.zeros((2, 3)), np.zeros((2, 4))])


def test_array_batch_with_a_ragged_nested_list_element() -> None:
    with pytest.raises(RuntimeError, match=r"shape \(2,\) at entry 0 and shape None at entry 1"):
        default_collate([np.zeros(2), [1, [2, 3]]])


# --- leaves: Python and numpy scalars ---------------------------------------------------------


@pytest.mark.parametrize(
    ("batch", "dtype"),
    [
        ([0, 1, 2], np.int64),
        ([-(2**63), 2**63 - 1], np.int64),
        ([0.5, 1.5], np.float64),
        ([0.5, 1], np.float64),
        ([True, False], np.bool_),
        ([True, 2], np.int64),
        ([1, 2.5], np.float64),
    ],
)
def test_python_numbers(batch: list[Any], dtype: Any) -> None:
    assert_array(default_collate(batch), batch, dtype)


@pytest.mark.parametrize(
    ("batch", "dtype"),
    [
        ([np.float32(1), np.float32(2)], np.float32),
        ([np.int8(1), np.int8(-2)], np.int8),
        ([np.uint64(2**64 - 1), np.uint64(0)], np.uint64),
        ([np.bool_(True), np.bool_(False)], np.bool_),
        ([np.float16(1), np.float16(2)], np.float16),
        ([np.complex64(1j), np.complex64(2)], np.complex64),
        ([np.datetime64("2024-01-01"), np.datetime64("2024-01-02")], np.dtype("datetime64[D]")),
    ],
)
def test_numpy_scalars_keep_their_dtype(batch: list[Any], dtype: Any) -> None:
    assert_array(default_collate(batch), batch, dtype)


def test_numpy_string_scalars_are_passed_through() -> None:
    batch = [np.str_("a"), np.str_("b")]
    assert default_collate(batch) is batch


def test_python_int_too_large_for_int64_raises_overflow_error() -> None:
    with pytest.raises(OverflowError, match="int64"):
        default_collate([1, 2**63])
    with pytest.raises(OverflowError, match="int64"):
        default_collate([-1, 2**63])
    with pytest.raises(OverflowError, match="int64"):
        default_collate([True, 2**80])
    with pytest.raises(OverflowError, match="int64"):
        default_collate([2**80, 1])


@pytest.mark.parametrize("batch", [[1.0, "a"], [np.float32(1), "a"]])
def test_numbers_mixed_with_other_values_raise_type_error(batch: list[Any]) -> None:
    with pytest.raises(TypeError, match=r"must hold only numbers; found <class 'str'> at entry 1$"):
        default_collate(batch)


def test_numbers_mixed_with_none_raise_torchs_type_error() -> None:
    with pytest.raises(TypeError, match=r"found <class 'NoneType'> at entry 1$") as info:
        default_collate([1, None])
    assert str(info.value).startswith(ERR)


# --- leaves: strings and bytes ----------------------------------------------------------------


def test_strings_and_bytes_come_back_unchanged() -> None:
    strings = ["a", "bb"]
    raw = [b"a", b"bb"]
    assert default_collate(strings) is strings
    assert default_collate(raw) is raw


def test_strings_inside_tuples_come_back_as_a_tuple_like_torch() -> None:
    out = default_collate([("a", 1), ("b", 2)])
    assert out[0] == ("a", "b")
    assert_array(out[1], [1, 2], np.int64)


def test_strings_inside_mappings_come_back_as_a_list() -> None:
    assert default_collate([{"k": "a"}, {"k": "b"}]) == {"k": ["a", "b"]}


# --- structure --------------------------------------------------------------------------------


def test_loader_shaped_batch_of_array_label_tuples() -> None:
    batch = [(np.full(16, i, np.float32), i) for i in range(64)]
    images, labels = default_collate(batch)
    assert images.shape == (64, 16) and images.dtype == np.float32
    assert_array(labels, list(range(64)), np.int64)
    np.testing.assert_array_equal(images[:, 0], np.arange(64))


def test_nested_structures() -> None:
    batch = [
        {"img": np.zeros((2, 2)), "meta": (i, {"name": f"s{i}", "w": float(i)}), "ids": [i, -i]}
        for i in range(3)
    ]
    out = default_collate(batch)
    assert out["img"].shape == (3, 2, 2)
    meta_ids, meta = out["meta"]
    assert_array(meta_ids, [0, 1, 2], np.int64)
    assert meta["name"] == ["s0", "s1", "s2"]
    assert_array(meta["w"], [0.0, 1.0, 2.0], np.float64)
    assert type(out["ids"]) is list
    assert_array(out["ids"][1], [0, -1, -2], np.int64)


def test_typed_namedtuple_keeps_its_type() -> None:
    out = default_collate([Pair(np.zeros(3), 0), Pair(np.ones(3), 1)])
    assert type(out) is Pair
    assert out.image.shape == (2, 3)
    assert_array(out.label, [0, 1], np.int64)


def test_ordered_dict_keeps_type_and_order() -> None:
    batch = [OrderedDict([("b", 1), ("a", 2)]), OrderedDict([("b", 3), ("a", 4)])]
    out = default_collate(batch)
    assert type(out) is OrderedDict and list(out) == ["b", "a"]
    assert_array(out["b"], [1, 3], np.int64)


def test_defaultdict_keeps_its_default_factory() -> None:
    sample: defaultdict[str, Any] = defaultdict(list, {"x": 1})
    out = default_collate([sample, sample])
    assert type(out) is defaultdict and out.default_factory is list
    assert_array(out["x"], [1, 1], np.int64)


class FrozenMap(Mapping[str, Any]):
    """An immutable mapping built from a dict."""

    def __init__(self, data: dict[str, Any]) -> None:
        self._data = dict(data)

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


class RecordMap(FrozenMap):
    """An immutable mapping whose constructor does not take a dict."""

    def __init__(self, **fields: Any) -> None:
        super().__init__(fields)


def test_immutable_mapping_is_rebuilt_from_a_dict() -> None:
    out = default_collate([FrozenMap({"x": 1}), FrozenMap({"x": 2})])
    assert type(out) is FrozenMap
    assert_array(out["x"], [1, 2], np.int64)


def test_mapping_that_cannot_be_rebuilt_falls_back_to_dict() -> None:
    out = default_collate([RecordMap(x=1), RecordMap(x=2)])
    assert type(out) is dict
    assert_array(out["x"], [1, 2], np.int64)


class MyList(list[Any]):
    pass


class FrozenSeq(Sequence[Any]):
    """An immutable sequence built from a list."""

    def __init__(self, items: list[Any]) -> None:
        self._items = list(items)

    def __getitem__(self, i: Any) -> Any:
        return self._items[i]

    def __len__(self) -> int:
        return len(self._items)


def test_mutable_sequence_subclass_keeps_its_type() -> None:
    out = default_collate([MyList([1, 2]), MyList([3, 4])])
    assert type(out) is MyList
    assert_array(out[0], [1, 3], np.int64)


def test_immutable_sequence_is_rebuilt_from_a_list() -> None:
    out = default_collate([FrozenSeq([1, 2]), FrozenSeq([3, 4])])
    assert type(out) is FrozenSeq
    assert_array(out[1], [2, 4], np.int64)


def test_sequence_that_cannot_be_rebuilt_falls_back_to_list() -> None:
    out = default_collate([range(3), range(3)])
    assert type(out) is list
    assert_array(out[2], [2, 2], np.int64)


@pytest.mark.parametrize(
    "batch", [[[1, 2], [3, 4, 5]], [[1, 2, 3], [4, 5]], [(1, 2), (3,)], [Point(1, 2), (3,)]]
)
def test_sequences_of_unequal_length_raise_torchs_runtime_error(batch: list[Any]) -> None:
    with pytest.raises(
        RuntimeError,
        match=r"^each element in list of batch should be of equal size: "
        r"entry 0 has \d elements and entry 1 has \d$",
    ):
        default_collate(batch)


@pytest.mark.parametrize(("elem", "name"), [(None, "NoneType"), (object(), "object"), ({1}, "set")])
def test_unsupported_element_type_raises_torchs_type_error(elem: Any, name: str) -> None:
    with pytest.raises(TypeError) as info:
        default_collate([elem, elem])
    assert str(info.value) == ERR + f"<class '{name}'> at entry 0"


def test_empty_batch_raises_index_error() -> None:
    with pytest.raises(IndexError, match="batch is empty"):
        default_collate([])


# --- collate and its registry -----------------------------------------------------------------


def test_collate_without_a_map_only_takes_containers_apart() -> None:
    with pytest.raises(TypeError, match="found <class 'int'>"):
        collate([{"a": 1}, {"a": 2}])
    with pytest.raises(TypeError, match="found <class 'str'>"):
        collate(["ab", "cd"])
    with pytest.raises(TypeError, match=r"found <class 'numpy\.ndarray'>"):
        collate([np.zeros(1), np.zeros(1)])


def test_registry_functions_get_batch_positionally_and_the_map_by_keyword() -> None:
    calls: list[tuple[Any, Any]] = []

    def record(batch: Any, *, collate_fn_map: Any = None) -> str:
        calls.append((batch, collate_fn_map))
        return "recorded"

    fn_map = {int: record}
    assert collate([(1, 2), (3, 4)], collate_fn_map=fn_map) == ["recorded", "recorded"]
    assert calls == [((1, 3), fn_map), ((2, 4), fn_map)]
    assert all(seen is fn_map for _, seen in calls)


class Base:
    pass


class Child(Base):
    pass


class GrandChild(Child):
    pass


def test_registry_prefers_the_exact_type() -> None:
    fn_map: dict[Any, Any] = {
        Base: lambda b, *, collate_fn_map: "base",
        Child: lambda b, *, collate_fn_map: "child",
    }
    assert collate([Child()], collate_fn_map=fn_map) == "child"


def test_registry_then_takes_the_first_matching_key_in_insertion_order() -> None:
    fn_map: dict[Any, Any] = {
        Base: lambda b, *, collate_fn_map: "base",
        Child: lambda b, *, collate_fn_map: "child",
    }
    assert collate([GrandChild()], collate_fn_map=fn_map) == "base"
    assert collate([GrandChild()], collate_fn_map=dict(reversed(fn_map.items()))) == "child"


def test_registry_accepts_tuple_keys() -> None:
    fn_map: dict[Any, Any] = {(str, Base): lambda b, *, collate_fn_map: len(b)}
    assert collate([Child(), Child(), Child()], collate_fn_map=fn_map) == 3


def test_registry_entry_overrides_structural_rules() -> None:
    fn_map = {**default_collate_fn_map, list: collate_str_fn}
    batch = [[1, 2], [3, 4]]
    assert collate(batch, collate_fn_map=fn_map) is batch
    out = collate([{"k": [1]}, {"k": [2]}], collate_fn_map=fn_map)
    assert out == {"k": [[1], [2]]}


class Box:
    def __init__(self, value: int) -> None:
        self.value = value


def test_extend_option_1_custom_collate_falls_back_to_default_collate() -> None:
    def custom_collate(batch: list[Any]) -> Any:
        if isinstance(batch[0], Box):
            return sum(b.value for b in batch)
        return default_collate(batch)

    assert custom_collate([Box(1), Box(2)]) == 3
    assert_array(custom_collate([1, 2]), [1, 2], np.int64)
    with pytest.raises(TypeError, match=r"found <class '[\w.]*Box'>"):
        default_collate([{"b": Box(1)}])


def test_extend_option_2_update_default_collate_fn_map_in_place(restore_fn_map: None) -> None:
    def collate_box_fn(batch: Sequence[Box], *, collate_fn_map: Any = None) -> Any:
        return np.array([b.value for b in batch], dtype=np.int8)

    default_collate_fn_map.update({Box: collate_box_fn})
    out = default_collate([{"b": Box(1), "n": 1.0}, {"b": Box(2), "n": 2.0}])
    assert_array(out["b"], [1, 2], np.int8)
    assert_array(out["n"], [1.0, 2.0], np.float64)


def test_default_collate_fn_map_can_replace_a_leaf_rule(restore_fn_map: None) -> None:
    default_collate_fn_map[float] = lambda batch, *, collate_fn_map: np.array(batch, np.float32)
    assert default_collate([0.5, 1.5]).dtype == np.float32


@settings(max_examples=30, deadline=None)
@given(
    hnp.arrays(
        dtype=st.sampled_from([np.float32, np.int64, np.uint8, np.bool_]),
        shape=hnp.array_shapes(min_dims=0, max_dims=3, max_side=4),
    ),
    st.integers(min_value=1, max_value=5),
)
def test_arrays_collate_exactly_like_np_stack(elem: Any, n: int) -> None:
    batch = [elem + np.zeros_like(elem) for _ in range(n)]
    out = default_collate(batch)
    expected = np.stack(batch)
    assert out.dtype == expected.dtype
    np.testing.assert_array_equal(out, expected)


# --- torch tensors ----------------------------------------------------------------------------


def test_importing_collate_does_not_import_torch() -> None:
    code = "import sys, aioload.collate; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_tensors_are_stacked_by_torch_once_torch_is_imported(monkeypatch: Any) -> None:
    # A stand-in module exercises the lazy path without torch being installed.
    class Tensor:
        def __init__(self, value: int) -> None:
            self.value = value

    fake = types.ModuleType("torch")
    fake.Tensor = Tensor  # type: ignore[attr-defined]
    fake.stack = lambda tensors, dim: ("stacked", [t.value for t in tensors], dim)  # type: ignore[attr-defined]
    fake.from_numpy = lambda array: ("tensor", array.dtype, array.tolist())  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", fake)
    out = default_collate([(Tensor(1), 5), (Tensor(2), 6)])
    assert out[0] == ("stacked", [1, 2], 0)
    # Next to tensors, numbers become tensors too, as under torch's default_collate.
    assert out[1] == ("tensor", np.int64, [5, 6])
    assert_array(default_collate([(1, 5), (2, 6)])[1], [5, 6], np.int64)  # no tensor: numpy


@pytest.mark.slow
def test_torch_tensors_with_real_torch() -> None:
    torch = pytest.importorskip("torch")
    out = default_collate(
        [{"x": torch.ones(3), "y": np.zeros(2)}, {"x": torch.zeros(3), "y": np.ones(2)}]
    )
    assert isinstance(out["x"], torch.Tensor) and tuple(out["x"].shape) == (2, 3)
    # The arrays of a batch that holds tensors become tensors, as torch collates them.
    assert isinstance(out["y"], torch.Tensor) and out["y"].shape == (2, 2)
    assert out["y"].dtype == torch.float64
    tensor = torch.ones(2)
    assert default_convert(tensor) is tensor


# --- default_convert --------------------------------------------------------------------------


def test_default_convert_leaves_leaves_as_they_are() -> None:
    arr = np.array([0, 1])
    strings = np.array(["a"])
    scalar = np.float32(1)
    assert default_convert(0) == 0
    assert default_convert(arr) is arr
    assert default_convert(strings) is strings
    assert default_convert(scalar) is scalar
    assert default_convert("ab") == "ab" and default_convert(b"ab") == b"ab"
    assert default_convert(None) is None


def test_default_convert_rebuilds_containers_with_torchs_rules() -> None:
    arr = np.array([0, 1])
    assert default_convert((arr, "a")) == [arr, "a"]
    assert type(default_convert((arr, "a"))) is list
    point = default_convert(Point(arr, 1))
    assert type(point) is Point and point.x is arr and point.y == 1
    out = default_convert(OrderedDict([("b", arr), ("a", (1, 2))]))
    assert type(out) is OrderedDict and list(out) == ["b", "a"] and out["a"] == [1, 2]
    assert type(default_convert(MyList([1, (2,)]))) is MyList
    assert default_convert(MyList([1, (2,)])) == [1, [2]]
    assert type(default_convert(FrozenMap({"x": 1}))) is FrozenMap
    assert type(default_convert(RecordMap(x=1))) is dict
    assert default_convert(range(3)) == [0, 1, 2]
    assert default_convert([]) == []


# --- errors name the field, its type and the entry --------------------------------------------


@pytest.mark.parametrize(
    ("batch", "found", "where"),
    [
        ([{"image": np.zeros(3)}, {"image": None}], "<class 'NoneType'>", " in field ['image']"),
        ([np.zeros(3), np.zeros(3), threading.Lock()], "<class '_thread.lock'>", ""),
        ([(np.zeros(2), 0), (None, 1)], "<class 'NoneType'>", " in field [0]"),
        ([Pair(np.zeros(2), 0), Pair(np.zeros(2), None)], "<class 'NoneType'>", " in field .label"),
        (
            [{"meta": {"boxes": [np.zeros(4), np.zeros(4)]}}] * 2
            + [{"meta": {"boxes": [np.zeros(4), None]}}],
            "<class 'NoneType'>",
            " in field ['meta']['boxes'][1]",
        ),
        ([np.array(1.0), None], "<class 'NoneType'>", ""),  # 0-d arrays: numpy would not fail
        ([1, 2, object()], "<class 'object'>", ""),
        ([{"a": 1}, {"a": 2}, None], "<class 'NoneType'>", ""),
        ([[1, 2], None], "<class 'NoneType'>", ""),
    ],
)
def test_an_uncollatable_entry_is_named_with_its_field_type_and_entry(
    batch: list[Any], found: str, where: str
) -> None:
    with pytest.raises(TypeError) as info:
        default_collate(batch)
    # The bad entry is the last one in every case.
    assert str(info.value) == f"{ERR}{found}{where} at entry {len(batch) - 1}"


def test_an_uncollatable_entry_after_an_array_is_also_a_runtime_error() -> None:
    # torch raises RuntimeError ("Could not infer dtype of NoneType") after a numpy array and
    # TypeError after a tensor: the error is both, so either ``except`` keeps working.
    with pytest.raises(CollateTypeError) as info:
        default_collate([{"x": np.zeros(2)}, {"x": None}])
    assert isinstance(info.value, TypeError) and isinstance(info.value, RuntimeError)


def test_an_uncollatable_first_entry_is_named_too() -> None:
    with pytest.raises(TypeError) as info:
        default_collate([{"image": None}, {"image": np.zeros(3)}])
    assert str(info.value) == ERR + "<class 'NoneType'> in field ['image'] at entry 0"


def test_ragged_arrays_in_a_field_keep_the_runtime_error_and_name_the_field() -> None:
    batch = [{"x": [np.zeros(3), np.zeros(2)]}, {"x": [np.zeros(3), np.zeros(5)]}]
    with pytest.raises(RuntimeError) as info:
        default_collate(batch)
    assert not isinstance(info.value, TypeError)
    assert str(info.value) == (
        "default_collate: stack expects each array in field ['x'][1] to be equal size, "
        "but got shape (2,) at entry 0 and shape (5,) at entry 1"
    )


def test_sequences_of_unequal_length_in_a_field_name_it_and_the_entries() -> None:
    with pytest.raises(RuntimeError) as info:
        default_collate([{"boxes": [1, 2]}, {"boxes": [1, 2]}, {"boxes": [1]}])
    assert str(info.value) == (
        "each element in list of batch should be of equal size in field ['boxes']: "
        "entry 0 has 2 elements and entry 2 has 1"
    )


def test_numbers_mixed_with_strings_name_the_field_and_entry() -> None:
    with pytest.raises(TypeError) as info:
        default_collate([{"label": 1}, {"label": "cat"}])
    assert str(info.value) == (
        "collate: a batch of numbers must hold only numbers; "
        "found <class 'str'> in field ['label'] at entry 1"
    )


def test_an_array_among_numbers_is_a_type_error_naming_the_entry() -> None:
    with pytest.raises(
        TypeError, match=r"found <class 'numpy\.ndarray'> in field \[0\] at entry 1"
    ):
        default_collate([(1,), (np.zeros(3),)])


def test_int64_overflow_names_the_field_and_entry() -> None:
    with pytest.raises(OverflowError, match=r"int64 array in field \['id'\] at entry 2$"):
        default_collate([{"id": 1}, {"id": 2}, {"id": 2**70}])


def test_a_string_array_among_numeric_arrays_is_named() -> None:
    with pytest.raises(TypeError, match=r"found <U1 in field \['x'\] at entry 1$"):
        default_collate([{"x": np.zeros(2)}, {"x": np.array(["a", "b"])}])


def test_located_errors_survive_pickling_with_their_message() -> None:
    # Worker processes send errors back pickled.
    with pytest.raises(TypeError) as info:
        default_collate([{"image": np.zeros(3)}, {"image": None}])
    copy = pickle.loads(pickle.dumps(info.value))
    assert type(copy) is CollateTypeError
    assert str(copy) == str(info.value)


def test_errors_raised_by_a_registered_function_are_left_alone(restore_fn_map: None) -> None:
    def collate_box_fn(batch: Sequence[Box], *, collate_fn_map: Any = None) -> Any:
        raise TypeError("boxes do not stack")

    default_collate_fn_map[Box] = collate_box_fn
    with pytest.raises(TypeError, match=r"^boxes do not stack$"):
        default_collate([{"b": Box(1)}, {"b": Box(2)}])


def test_the_loader_reports_the_field_of_a_bad_sample() -> None:
    from aioload import DataLoader

    samples = [{"image": np.zeros(3), "label": 0}, {"image": None, "label": 1}]
    with pytest.raises(
        TypeError, match=r"found <class 'NoneType'> in field \['image'\] at entry 1"
    ):
        next(iter(DataLoader(samples, batch_size=2, num_workers=0)))


class _BadAt:
    """Sample ``i``: an image and a size under meta; key 13's image is None, key 11's size 3."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> dict[str, Any]:
        if i == 5:
            raise KeyError("unreadable")  # skipped under on_error="skip"
        return {
            "image": None if i == 13 else np.zeros(3),
            "meta": {"size": np.zeros(3 if i == 11 else 2)},
        }


class _AsyncBadAt(_BadAt):
    async def __getitem__(self, i: int) -> dict[str, Any]:  # type: ignore[override]
        return super().__getitem__(i)


@pytest.mark.parametrize("num_workers", [0, 1])
@pytest.mark.parametrize("dataset", [_BadAt(), _AsyncBadAt()], ids=["sync", "async"])
def test_the_loader_names_the_key_of_the_entry_that_does_not_collate(
    num_workers: int, dataset: Any
) -> None:
    from aioload import DataLoader

    loader = DataLoader(dataset, batch_size=4, sampler=[2, 13, 0, 1], num_workers=num_workers)
    with pytest.raises(TypeError) as info:
        next(iter(loader))
    assert str(info.value).endswith(
        "found <class 'NoneType'> in field ['image'] at entry 1 (key 13)"
    )
    # Both entries of a shape mismatch, deep in the sample.
    loader = DataLoader(dataset, batch_size=3, sampler=[7, 11, 9], num_workers=num_workers)
    with pytest.raises(RuntimeError) as ragged:
        next(iter(loader))
    assert str(ragged.value) == (
        "default_collate: stack expects each array in field ['meta']['size'] to be equal size, "
        "but got shape (2,) at entry 0 (key 7) and shape (3,) at entry 1 (key 11)"
    )


def test_with_skipped_items_the_key_is_that_of_the_entry_collated() -> None:
    from aioload import DataLoader

    # Key 5 fails and is skipped, so key 13 is entry 1 of the samples collated.
    loader = DataLoader(_BadAt(), batch_size=3, sampler=[5, 4, 13], on_error="skip")
    with pytest.raises(TypeError, match=r"in field \['image'\] at entry 1 \(key 13\)"):
        next(iter(loader))


def test_named_keys_are_quoted_as_python_writes_them() -> None:
    from aioload.collate.errors import name_keys

    with pytest.raises(TypeError) as info:
        default_collate([1, "two"])
    name_keys(info.value, ["a.jpg", "b.jpg"])
    assert str(info.value).endswith("found <class 'str'> at entry 1 (key 'b.jpg')")
    name_keys(ValueError("not a collate error"), [1])  # left alone


BAD_BATCHES: list[Any] = [
    [None, None],
    [np.zeros(3), None],
    [{"image": np.zeros(3)}, {"image": None}],
    [1, None],
    [1.5, None],
    [np.zeros(3), threading.Lock()],
    [np.zeros(3), np.zeros(2)],
    [{"a": 1}, None],
    [[1, 2], None],
    [[1, 2], [1]],
    [np.array([None], dtype=object)] * 2,
]


@pytest.mark.parametrize("batch", BAD_BATCHES)
def test_error_types_are_torchs(batch: list[Any]) -> None:
    torch_data = pytest.importorskip("torch.utils.data")
    with pytest.raises(Exception) as theirs:
        torch_data.default_collate(batch)
    with pytest.raises(Exception) as ours:
        default_collate(batch)
    assert isinstance(ours.value, type(theirs.value)), (theirs.value, ours.value)
    if str(theirs.value).startswith("default_collate: batch must contain"):
        assert str(ours.value).startswith(str(theirs.value))
