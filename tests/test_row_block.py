"""RowBlock's contract: ``default_collate(block)`` is ``default_collate(block.rows())``.

A block collates itself from its columns, faster, and must give what collating its rows
one by one gives — the same keys, types, dtypes and values (NaN where the rows have NaN),
or the same type of error; but where a column's rows hold ``None`` (a null numpy cannot
hold), which would make collating the rows fail or pass by which row comes first, the
column comes as the list of its rows' values. Tested on a minimal subclass and, with
hypothesis, on :class:`~aioload.sources.parquet.arrow_rows.ArrowRows` over generated Arrow tables:
integers of every width, floats, bools, strings, timestamps, dates, lists (equal lengths and
ragged), structs, with and without nulls, in one chunk or several, sliced, in any row order.
"""

from __future__ import annotations

import datetime
import math
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from aioload.collate.core import default_collate
from aioload.data.row_block import RowBlock, as_samples, rows_for_collate
from aioload.sources.parquet.arrow_rows import ArrowRows


class Columns(RowBlock):
    """The module docstring's example: two numpy columns."""

    def __init__(self, x: np.ndarray[Any, Any], y: np.ndarray[Any, Any]) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def row(self, index: int) -> dict[str, Any]:
        return {"x": self.x[index], "y": self.y[index]}

    def collate(self) -> dict[str, Any]:
        return {"x": self.x.copy(), "y": self.y.copy()}


def assert_same(ours: Any, theirs: Any, path: str = "") -> None:
    """Equal batches: the same structure, types, dtypes, shapes and values (NaN = NaN)."""
    assert type(ours) is type(theirs), (path, type(ours), type(theirs))
    if isinstance(ours, np.ndarray):
        assert ours.dtype == theirs.dtype, (path, ours.dtype, theirs.dtype)
        assert ours.shape == theirs.shape, (path, ours.shape, theirs.shape)
        np.testing.assert_array_equal(ours, theirs, err_msg=path)  # NaN/NaT equal themselves
    elif isinstance(ours, dict):
        assert list(ours) == list(theirs), path
        for key in ours:
            assert_same(ours[key], theirs[key], f"{path}[{key!r}]")
    elif isinstance(ours, list | tuple):
        assert len(ours) == len(theirs), path
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            assert_same(a, b, f"{path}[{i}]")
    elif isinstance(ours, float) and math.isnan(ours):
        assert math.isnan(theirs), path
    else:
        assert ours == theirs, (path, ours, theirs)


def collated_or_error(collate: Any, batch: Any) -> tuple[str, Any]:
    try:
        return "ok", collate(batch)
    except Exception as error:
        return "error", type(error)


def check_contract(block: RowBlock) -> Any:
    """``default_collate(block)`` against ``default_collate(block.rows())``; the batch."""
    rows = block.rows()
    assert type(rows) is list and len(rows) == len(block)
    ours = collated_or_error(default_collate, block)
    theirs = collated_or_error(default_collate, rows)
    if ours[0] == "error" or theirs[0] == "error":
        assert ours == theirs, (ours, theirs)
        return None
    assert_same(ours[1], theirs[1])
    return ours[1]


def holds_none(value: Any) -> bool:
    """Whether a row's value is, or holds, ``None``."""
    if value is None:
        return True
    if isinstance(value, dict):
        return any(holds_none(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(holds_none(v) for v in value)
    return False


def rows_batch(block: ArrowRows) -> tuple[str, Any]:
    """What ``default_collate(block)`` should give, from the block's rows: each column
    collated from its rows' values, or, if they hold ``None``, their list; a list column
    whose rows have different lengths fails as default_collate fails on them."""
    rows = block.rows()
    if not rows:
        return collated_or_error(default_collate, rows)
    batch = {}
    for name, column in zip(block.table.column_names, block.table.columns, strict=True):
        values = [row[name] for row in rows]
        lists = pa.types.is_list(column.type) or pa.types.is_large_list(column.type)
        if lists and len({len(v) for v in values if v is not None}) > 1:
            return "error", RuntimeError
        if any(holds_none(value) for value in values):
            batch[name] = values
            continue
        outcome = collated_or_error(default_collate, values)
        if outcome[0] == "error":
            return outcome
        batch[name] = outcome[1]
    return "ok", batch


def check_arrow_contract(block: ArrowRows) -> Any:
    """``default_collate(block)`` against :func:`rows_batch`; the batch."""
    ours = collated_or_error(default_collate, block)
    theirs = rows_batch(block)
    if ours[0] == "error" or theirs[0] == "error":
        assert ours == theirs, (ours, theirs)
        return None
    assert_same(ours[1], theirs[1])
    rows = collated_or_error(default_collate, block.rows())
    nulls = any(holds_none(value) for row in block.rows() for value in row.values())
    if rows[0] == "ok" and not nulls:
        # Where the rows collate, the same batch exactly; a column holding None is the stated
        # exception (its list of values, whatever row comes first), checked by rows_batch.
        assert_same(ours[1], rows[1])
    return ours[1]


# -- the generic contract ----------------------------------------------------------------


def test_a_block_is_a_sequence_of_its_rows() -> None:
    block = Columns(np.arange(4), np.linspace(0, 1, 4))
    assert len(block) == 4 and block[-1] == block[3] == {"x": 3, "y": 1.0}
    assert [row["x"] for row in block] == [0, 1, 2, 3]
    assert [row["x"] for row in block[1:3]] == [1, 2]
    assert block[::-2] == [block[3], block[1]]
    for bad in (4, -5):
        with pytest.raises(IndexError):
            block[bad]
    assert as_samples(block) == block.rows() and type(as_samples(block)) is list
    assert as_samples([1, 2]) == [1, 2]
    assert rows_for_collate(lambda rows: type(rows))(block) is list
    check_contract(block)


def test_an_abstract_block_cannot_be_made() -> None:
    with pytest.raises(TypeError):
        RowBlock()  # type: ignore[abstract]


# -- ArrowRows over generated tables -------------------------------------------------------

STRUCT_FIELDS = [("a", pa.int64()), ("b", pa.string())]
INTS = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32()]
INTS += [pa.uint64()]
FLOATS = [pa.float16(), pa.float32(), pa.float64()]
TIMES = [pa.timestamp("s"), pa.timestamp("ms"), pa.timestamp("us", tz="UTC"), pa.timestamp("ns")]
DATES = [pa.date32(), pa.duration("ms")]


def values_of(kind: pa.DataType) -> st.SearchStrategy[Any]:
    if pa.types.is_integer(kind):
        bits = kind.bit_width
        if pa.types.is_signed_integer(kind):
            return st.integers(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
        return st.integers(0, 2**bits - 1)
    if pa.types.is_floating(kind):
        width = {16: 16, 32: 32, 64: 64}[kind.bit_width]
        return st.floats(width=width, allow_nan=True, allow_infinity=True)  # type: ignore[arg-type]
    if pa.types.is_boolean(kind):
        return st.booleans()
    if pa.types.is_string(kind):
        return st.text(max_size=4)
    if pa.types.is_binary(kind):
        return st.binary(max_size=4)
    if pa.types.is_timestamp(kind):
        return st.integers(-(10**9), 10**9)
    if pa.types.is_date(kind):
        return st.integers(-(10**5), 10**5)
    if pa.types.is_duration(kind):
        return st.integers(-(10**9), 10**9)
    raise AssertionError(kind)


@st.composite
def columns(draw: st.DrawFn, rows: int) -> pa.Array:
    shape = draw(st.sampled_from(["plain", "plain", "equal list", "ragged list", "struct"]))
    nulls = draw(st.booleans())

    def maybe_null(values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        return st.none() | values if nulls else values

    if shape == "plain":
        kind = draw(st.sampled_from([*INTS, *FLOATS, pa.bool_(), pa.string(), pa.binary()]))
        kind = draw(st.sampled_from([kind, *TIMES, *DATES])) if draw(st.booleans()) else kind
        values = draw(st.lists(maybe_null(values_of(kind)), min_size=rows, max_size=rows))
        return pa.array(values, kind)
    if shape in ("equal list", "ragged list"):
        inner = draw(st.sampled_from([pa.int8(), pa.int32(), pa.int64(), pa.float32()]))
        if draw(st.booleans()):
            inner = draw(st.sampled_from([inner, pa.bool_(), pa.timestamp("ns"), pa.date32()]))
        length = draw(st.integers(0, 3))
        inner_nulls = draw(st.booleans())
        item = st.none() | values_of(inner) if inner_nulls else values_of(inner)
        sizes = st.just(length) if shape == "equal list" else st.integers(0, 3)

        @st.composite
        def one(draw2: st.DrawFn) -> list[Any]:
            size = draw2(sizes)
            return draw2(st.lists(item, min_size=size, max_size=size))

        values = draw(st.lists(maybe_null(one()), min_size=rows, max_size=rows))
        kind = (
            draw(st.sampled_from(["list", "large", "fixed"])) if shape == "equal list" else "list"
        )
        if kind == "fixed":
            return pa.array(values, pa.list_(inner, length))
        if kind == "large":
            return pa.array(values, pa.large_list(inner))
        return pa.array(values, pa.list_(inner))
    struct = pa.struct(STRUCT_FIELDS)
    entry = st.fixed_dictionaries(
        {"a": maybe_null(st.integers(-5, 5)), "b": maybe_null(st.text(max_size=3))}
    )
    values = draw(st.lists(maybe_null(entry), min_size=rows, max_size=rows))
    return pa.array(values, struct)


@st.composite
def tables(draw: st.DrawFn) -> pa.Table:
    rows = draw(st.integers(0, 6))
    count = draw(st.integers(1, 4))
    table = pa.table({f"c{i}": draw(columns(rows)) for i in range(count)})
    layout = draw(st.sampled_from(["one chunk", "chunks", "sliced"]))
    if layout == "chunks" and rows > 1:
        cut = draw(st.integers(1, rows - 1))
        table = pa.concat_tables([table.slice(0, cut), table.slice(cut)])
    elif layout == "sliced" and rows > 1:
        start = draw(st.integers(1, rows - 1))
        table = table.slice(start)
    return table


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tables())
@example(  # a null inside a struct, not in its first row: the rows collate, the block lists
    pa.table({"c0": pa.array([{"a": 1, "b": ""}, {"a": 2, "b": None}], pa.struct(STRUCT_FIELDS))})
)
def test_arrow_rows_collate_like_their_rows(table: pa.Table) -> None:
    block = ArrowRows(table)
    assert len(block) == table.num_rows
    assert [list(row) for row in block.rows()] == [table.column_names] * table.num_rows
    batch = check_arrow_contract(block)
    # The rows in another order: the same outcome, the batch's rows in that order.
    order = pa.array(range(table.num_rows - 1, -1, -1), pa.int64())
    reversed_block = ArrowRows(table.take(order))
    again = check_arrow_contract(reversed_block)
    assert (batch is None) == (again is None)
    if batch is None:
        return
    for name, value in batch.items():
        if isinstance(value, np.ndarray):
            assert value.flags.writeable, name
            for chunk in table.column(name).chunks:
                for buffer in chunk.buffers():
                    if buffer is not None and buffer.size:
                        memory = np.frombuffer(buffer, dtype=np.uint8)
                        assert not np.shares_memory(value, memory), name


def test_the_docstring_table_holds() -> None:
    table = pa.table(
        {
            "i": pa.array([1, 2, 3], pa.int16()),
            "n": pa.array([1, None, 3], pa.int32()),
            "s": ["a", None, "c"],
            "l": pa.array([[1, 2], None, []], pa.list_(pa.int64())),
            "t": pa.array([0, 1, 2], pa.timestamp("ms")),
            "st": pa.array([{"a": 1}, {"a": 2}, None], pa.struct([("a", pa.int8())])),
        }
    )
    row = ArrowRows(table)[1]
    assert type(row["i"]) is np.int16 and row["i"] == 2
    assert type(row["n"]) is np.float64 and math.isnan(row["n"])
    assert row["s"] is None and row["l"] is None and row["st"] == {"a": 2}
    assert isinstance(row["t"], np.datetime64)
    assert ArrowRows(table)[0]["l"].tolist() == [1, 2]
    batch = default_collate(ArrowRows(table.select(["i", "n", "t"])))
    assert batch["i"].dtype == np.int16 and batch["n"].dtype == np.float64
    assert batch["t"].dtype == np.dtype("datetime64[ms]")
    assert_same(batch, default_collate(ArrowRows(table.select(["i", "n", "t"])).rows()))


def test_a_batch_does_not_alias_arrow_memory() -> None:
    table = pa.table({"x": pa.array(np.arange(8, dtype=np.int32)), "f": np.ones(8)})
    block = ArrowRows(table.slice(2, 4))
    batch = default_collate(block)
    batch["x"][:] = -1
    batch["f"][:] = 0
    assert table.column("x").to_pylist() == list(range(8))
    assert table.column("f").to_pylist() == [1.0] * 8
    again = default_collate(ArrowRows(table.slice(2, 4)))
    assert again["x"].tolist() == [2, 3, 4, 5]


def test_an_empty_block_fails_as_an_empty_batch() -> None:
    check_arrow_contract(ArrowRows(pa.table({"x": pa.array([], pa.int64())})))
    with pytest.raises(IndexError):
        default_collate(ArrowRows(pa.table({"x": pa.array([], pa.int64())})))


# The dtypes torch's default_collate takes from numpy scalars (not uint16/32/64).
NUMERIC = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.float32(), pa.float64()]
NUMERIC += [pa.bool_()]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_torch_default_collate_of_the_rows_agrees_on_numeric_columns(data: st.DataObject) -> None:
    torch = pytest.importorskip("torch")
    from torch.utils.data import default_collate as torch_collate

    rows = data.draw(st.integers(1, 6))
    kinds = data.draw(st.lists(st.sampled_from(NUMERIC), min_size=1, max_size=3))
    arrays = {}
    for i, kind in enumerate(kinds):
        nulls = data.draw(st.booleans()) and not pa.types.is_boolean(kind)
        item = st.none() | values_of(kind) if nulls else values_of(kind)
        arrays[f"c{i}"] = pa.array(data.draw(st.lists(item, min_size=rows, max_size=rows)), kind)
    block = ArrowRows(pa.table(arrays))
    ours = default_collate(block)
    theirs = torch_collate(block.rows())
    assert list(ours) == list(theirs)
    for name in ours:
        tensor = theirs[name]
        assert isinstance(tensor, torch.Tensor)
        assert tensor.numpy().dtype == ours[name].dtype, name
        np.testing.assert_array_equal(tensor.numpy(), ours[name], err_msg=name)


@pytest.mark.parametrize("unit", ["s", "ms", "us", "ns"])
def test_times_with_nulls_are_nat(unit: str) -> None:
    # Nanoseconds too, which to_pylist cannot turn into datetime objects without pandas.
    when = datetime.datetime(2024, 5, 6, 7, 8, 9)
    block = ArrowRows(pa.table({"t": pa.array([when, None], pa.timestamp(unit))}))
    assert block[0]["t"] == np.datetime64(when, unit)
    assert np.isnat(block[1]["t"])
    batch = default_collate(block)["t"]
    assert batch.dtype == np.dtype(f"datetime64[{unit}]") and np.isnat(batch[1])
    check_arrow_contract(block)


NULLABLE = {
    "string": (pa.string(), ["a", "b"]),
    "binary": (pa.binary(), [b"a", b"b"]),
    "bool": (pa.bool_(), [True, False]),
    "list of ints": (pa.list_(pa.int64()), [[1, 2], [3, 4]]),
    "list of strings": (pa.list_(pa.string()), [["a"], ["b"]]),
    "struct": (pa.struct([("a", pa.int64())]), [{"a": 1}, {"a": 2}]),
    "int": (pa.int32(), [1, 2]),
    "float": (pa.float32(), [1.5, 2.5]),
    "timestamp": (pa.timestamp("ms"), [1, 2]),
    "date": (pa.date32(), [1, 2]),
}


@pytest.mark.parametrize("kind", list(NULLABLE))
@pytest.mark.parametrize("null_at", [0, 1, 2])
def test_a_null_comes_through_whatever_row_comes_first(kind: str, null_at: int) -> None:
    arrow_type, present = NULLABLE[kind]
    values: list[Any] = list(present)
    values.insert(null_at, None)
    batch = default_collate(ArrowRows(pa.table({"c": pa.array(values, arrow_type)})))["c"]
    if isinstance(batch, np.ndarray):  # numbers and times: NaN and NaT
        assert kind in ("int", "float", "timestamp", "date")
        assert np.isnan(batch[null_at]) if batch.dtype.kind == "f" else np.isnat(batch[null_at])
        assert np.count_nonzero(np.isnan(batch) if batch.dtype.kind == "f" else np.isnat(batch))
        return
    assert isinstance(batch, list) and len(batch) == 3
    assert batch[null_at] is None and sum(value is None for value in batch) == 1
    others = [plain(value) for i, value in enumerate(batch) if i != null_at]
    assert others == present


def plain(value: Any) -> Any:
    return value.tolist() if isinstance(value, np.ndarray) else value


def test_a_null_inside_a_value_comes_through_as_none() -> None:
    table = pa.table(
        {
            "st": pa.array([{"a": None}, {"a": 1}], pa.struct([("a", pa.int64())])),
            "ls": pa.array([["x", None], ["y", "z"]], pa.list_(pa.string())),
            "lb": pa.array([[True], [None]], pa.list_(pa.bool_())),
            "li": pa.array([[1, None], [2, 3]], pa.list_(pa.int64())),  # NaN: numpy holds it
        }
    )
    batch = default_collate(ArrowRows(table))
    assert batch["st"] == [{"a": None}, {"a": 1}]
    assert batch["ls"] == [["x", None], ["y", "z"]]
    assert batch["lb"] == [[True], [None]]
    assert batch["li"].dtype == np.float64 and np.isnan(batch["li"][0, 1])


@pytest.mark.parametrize("first", ["short", "long"])
def test_ragged_lists_fail_naming_the_column_and_collate_fn(first: str) -> None:
    rows = [[1], [2, 3], None] if first == "short" else [[2, 3], None, [1]]
    block = ArrowRows(pa.table({"id": [0, 1, 2], "tags": pa.array(rows, pa.list_(pa.int64()))}))
    with pytest.raises(RuntimeError, match=r"(?s)column 'tags'.*different lengths.*collate_fn="):
        default_collate(block)
