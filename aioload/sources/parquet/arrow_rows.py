"""Arrow tables as batches: :class:`ArrowRows`, a row block over a ``pyarrow.Table``.

What a row and a batch hold, by column type (a batch is what
:func:`~aioload.collate.core.default_collate` makes of the rows, made from the columns, except
where nulls would make that fail or depend on which row comes first; see below):

========================================  ==========================  =========================
Arrow type                                in a row                    in a batch
========================================  ==========================  =========================
integers, floats, bool, timestamps,       a numpy scalar of the       a numpy array of that
dates, durations (no nulls)               column's dtype              dtype (one copy from
                                                                      Arrow's buffer)
integers and floats with nulls            ``numpy.float64``, ``nan``  a ``float64`` array,
                                          for a null (Arrow's         ``nan`` where null
                                          ``to_numpy``)
timestamps, dates, durations with nulls   ``datetime64`` /            an array of that dtype,
                                          ``timedelta64``, ``NaT``    ``NaT`` where null
                                          for a null
strings, binary                           ``str`` / ``bytes``         a list of them,
                                          (``None`` for a null)       ``None`` where null
lists of numbers                          a numpy array of the row's  ``numpy.stack`` of the
                                          values (``nan``/``NaT``     rows' arrays; a list of
                                          for a null value;           them with ``None`` where
                                          ``None``: a null list)      a list is null. Lists of
                                                                      different lengths raise
                                                                      (a ``RuntimeError``
                                                                      naming the column)
anything else (structs, maps, lists of    ``to_pylist()``'s value     ``default_collate`` of
strings, bool with nulls, ...)            (``None`` for a null)       the rows' values; their
                                                                      list, ``None`` where
                                                                      null, if a value or a
                                                                      part of one is null
========================================  ==========================  =========================

**Nulls, whatever row comes first.** ``default_collate`` of rows takes its cue from the
first row: a column of strings whose first row is null fails (``None`` is no batchable
value) while one whose null comes later passes, so whether an epoch finishes would depend on
the shuffle. A batch here never depends on the order of its rows: a column whose rows hold
``None`` (a null numpy cannot hold: a string, bytes, bool, list or struct, or a null inside
one) comes as the list of its rows' values; numbers and times hold their nulls as
``nan``/``NaT``. So a column with nulls may come as a list in one batch and as an array in
another (an integer column as ``float64`` in one and its own dtype in another): pass a
``collate_fn`` to the loader to receive the rows (a list of dicts) and batch them your way.

Example::

    block = ArrowRows(pa.table({"x": [1, 2], "s": [None, "b"]}))
    block[1]                 # {'x': np.int64(2), 's': 'b'}
    default_collate(block)   # {'x': array([1, 2]), 's': [None, 'b']}
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from aioload.collate.core import default_collate
from aioload.data.row_block import RowBlock

__all__ = ["ArrowRows", "column_rows", "numeric_views", "take_rows"]


def _is_plain(kind: pa.DataType) -> bool:
    """A type whose values numpy holds as they are (and collates to an array of them)."""
    return bool(
        pa.types.is_integer(kind)
        or pa.types.is_floating(kind)
        or pa.types.is_boolean(kind)
        or pa.types.is_timestamp(kind)
        or pa.types.is_date(kind)
        or pa.types.is_duration(kind)
    )


def _is_number(kind: pa.DataType) -> bool:
    return bool(pa.types.is_integer(kind) or pa.types.is_floating(kind))


def _nulls_in_numpy(kind: pa.DataType) -> bool:
    """A type whose nulls numpy holds: NaN for numbers, NaT for times (to_pylist cannot
    even make a row of a nanosecond timestamp without pandas)."""
    return _is_plain(kind) and not pa.types.is_boolean(kind)


def _is_list(kind: pa.DataType) -> bool:
    return bool(
        pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)
    )


def _as_numpy(array: pa.Array) -> np.ndarray[Any, Any]:
    view = _view_dtype(array.type)
    if view is not None and not array.null_count:
        # Arrow's own buffer, viewed: what to_numpy gives, at a tenth of its cost.
        data = array.buffers()[1]
        return np.frombuffer(data, view, count=len(array), offset=array.offset * view.itemsize)
    values: np.ndarray[Any, Any] = array.to_numpy(zero_copy_only=False)
    if array.null_count and _is_number(array.type):
        return values.astype(np.float64, copy=False)
    return values


def column_rows(array: pa.Array) -> Sequence[Any]:
    """The values of ``array`` as rows hold them (see the module docstring)."""
    kind = array.type
    if _is_plain(kind) and (not array.null_count or _nulls_in_numpy(kind)):
        return _as_numpy(array)  # type: ignore[return-value]  # a sequence of scalars
    if _is_list(kind) and _is_plain(kind.value_type):
        values = array.flatten()
        if values.null_count and not _nulls_in_numpy(values.type):
            return array.to_pylist()  # type: ignore[no-any-return]
        flat = _as_numpy(values)
        if pa.types.is_fixed_size_list(kind):
            starts = np.arange(len(array) + 1) * kind.list_size
        else:
            offsets = array.offsets.to_numpy()
            starts = offsets - offsets[0]
        valid = array.is_valid().to_numpy(zero_copy_only=False)
        return [flat[starts[i] : starts[i + 1]] if valid[i] else None for i in range(len(array))]
    return array.to_pylist()  # type: ignore[no-any-return]


_VIEWS: dict[pa.DataType, np.dtype[Any] | None] = {}  # a type's numpy view dtype, or None


def _view_dtype(kind: pa.DataType) -> np.dtype[Any] | None:
    """The dtype numpy views a null-free array of ``kind`` with (None: no plain view)."""
    try:
        return _VIEWS[kind]
    except KeyError:
        numeric = pa.types.is_integer(kind) or pa.types.is_floating(kind)
        view = np.dtype(kind.to_pandas_dtype()) if numeric else None
        _VIEWS[kind] = view
        return view


def _holds_none(array: pa.Array) -> bool:
    """Whether the rows of ``array`` (:func:`column_rows`) hold ``None`` anywhere: a null
    that numpy cannot hold as NaN or NaT, at the top or inside a list or struct."""
    kind = array.type
    if _is_plain(kind):
        return bool(array.null_count) and not _nulls_in_numpy(kind)
    if _is_list(kind) and _is_plain(kind.value_type):  # rows of numpy arrays
        return bool(array.null_count) or _holds_none(array.flatten())
    return _any_null(array)  # rows of to_pylist's values: every null is a None


def _any_null(array: pa.Array) -> bool:
    """Whether ``array`` has a null anywhere, nested values included."""
    if array.null_count:
        return True
    kind = array.type
    if _is_list(kind):
        return _any_null(array.flatten())
    if pa.types.is_struct(kind):
        return any(_any_null(field) for field in array.flatten())
    if pa.types.is_map(kind):
        return _any_null(array.keys) or _any_null(array.items)
    if pa.types.is_dictionary(kind):
        return _any_null(array.dictionary)
    return False


def _check_equal_lengths(name: str, array: pa.Array) -> None:
    """A list column's rows stack only if they have one length: else a clear error."""
    kind = array.type
    if not _is_list(kind) or pa.types.is_fixed_size_list(kind) or not len(array):
        return
    lengths = array.value_lengths().drop_null().to_numpy(zero_copy_only=False)
    if len(lengths) and lengths.min() != lengths.max():
        # RuntimeError: what default_collate raises for rows of different shapes.
        raise RuntimeError(
            f"column {name!r} holds lists of different lengths in this batch "
            f"({lengths.min()} to {lengths.max()} values), and default_collate stacks lists "
            "of one length only: pass collate_fn= to the DataLoader to receive the rows (a "
            "list of dicts) and batch them yourself (pad them, or keep a list), or leave the "
            "column out (columns=)"
        )


def _column_batch(name: str, column: pa.ChunkedArray) -> Any:
    kind = column.type
    view = _view_dtype(kind)
    if view is not None and not column.null_count:
        # The fast path of a batch's numbers: Arrow's buffers viewed, copied once into a
        # fresh, writable array (as default_collate's).
        chunks = column.chunks
        if len(chunks) == 1:
            chunk = chunks[0]
            data = chunk.buffers()[1]
            return np.frombuffer(data, view, len(chunk), chunk.offset * view.itemsize).copy()
        return (
            np.concatenate([_as_numpy(chunk) for chunk in chunks]) if chunks else np.zeros(0, view)
        )
    if _is_plain(kind) and (not column.null_count or _nulls_in_numpy(kind)):
        parts = [_as_numpy(chunk) for chunk in column.chunks]
        if len(parts) == 1:
            return np.array(parts[0])
        if not parts:
            return np.zeros(0, dtype=kind.to_pandas_dtype())
        return np.concatenate(parts)
    array = column.combine_chunks()
    _check_equal_lengths(name, array)
    values = column_rows(array)
    if _holds_none(array):
        return list(values)  # None where null, whatever row comes first
    try:
        return default_collate(values)
    except Exception as error:
        error.add_note(
            f"raised collating column {name!r}; pass collate_fn= to the DataLoader to "
            "receive the rows (a list of dicts) and batch them yourself"
        )
        raise


def numeric_views(table: pa.Table) -> dict[str, np.ndarray[Any, Any]]:
    """The table's null-free integer and float columns as numpy arrays over Arrow's memory
    (read-only views; a column in several chunks is joined, once)."""
    views = {}
    for name, column in zip(table.column_names, table.columns, strict=True):
        if _view_dtype(column.type) is not None and not column.null_count:
            chunks = column.chunks
            views[name] = _as_numpy(chunks[0] if len(chunks) == 1 else column.combine_chunks())
    return views


def take_rows(
    units: Sequence[int],
    tables: Sequence[pa.Table],
    of: np.ndarray[Any, Any],
    rows: np.ndarray[Any, Any],
) -> pa.Table:
    """Row ``rows[i]`` of the table of unit ``of[i]``, for every ``i``, in that order.

    ``tables[k]`` is unit ``units[k]``'s table; every unit in ``of`` is among ``units``.
    Each table gives its rows with one ``take``; a second one puts them in order.
    """
    pieces, placed = [], []
    for unit, table in zip(units, tables, strict=True):
        positions = np.flatnonzero(of == unit)
        pieces.append(table.take(pa.array(rows[positions])))
        placed.append(positions)
    taken = pa.concat_tables(pieces) if len(pieces) > 1 else pieces[0]
    order = np.concatenate(placed)
    if len(pieces) > 1 or not np.array_equal(order, np.arange(len(order))):
        taken = taken.take(pa.array(np.argsort(order, kind="stable")))
    return taken


class ArrowRows(RowBlock):
    """A batch of the rows of an Arrow table (see the module docstring for what they hold).

    Args:
        table: the rows; its chunks are combined once, when a column is first needed. Or
            a function that makes the table, called only when the table is needed (a
            batch of ``views`` alone never needs it); ``names`` and ``length`` say then
            what it will hold.
        views: some of its columns as numpy arrays already (:func:`numeric_views`, sliced
            as the table is): a batch copies them as they are.
        names: the table's column names, with a function for ``table``.
        length: its rows, with a function for ``table``.

    Example::

        block = ArrowRows(table.slice(0, 256))
        len(block), block[0], default_collate(block)
    """

    def __init__(
        self,
        table: pa.Table | Callable[[], pa.Table],
        views: Mapping[str, np.ndarray[Any, Any]] | None = None,
        *,
        names: Sequence[str] | None = None,
        length: int | None = None,
    ) -> None:
        if callable(table):
            if names is None or length is None:
                raise TypeError("ArrowRows of a table to be made needs its names and length")
            self._table: pa.Table | None = None
            self._make: Callable[[], pa.Table] | None = table
            self._names, self._length = list(names), length
        else:
            self._table, self._make = table, None
            self._names, self._length = list(table.column_names), int(table.num_rows)
        self._views = views or {}
        self._columns: list[pa.Array] | None = None
        self._rows: list[Sequence[Any]] | None = None

    @property
    def table(self) -> pa.Table:
        """The rows, as an Arrow table."""
        if self._table is None:
            assert self._make is not None
            self._table = self._make()
        return self._table

    def __len__(self) -> int:
        return self._length

    def _arrays(self) -> list[pa.Array]:
        if self._columns is None:
            self._columns = [column.combine_chunks() for column in self.table.columns]
        return self._columns

    def _row_values(self) -> list[Sequence[Any]]:
        if self._rows is None:
            self._rows = [column_rows(array) for array in self._arrays()]
        return self._rows

    def row(self, index: int) -> dict[str, Any]:
        """Row ``index`` as a dict of column name to value."""
        if self._rows is None:
            self._rows = [column_rows(array) for array in self._arrays()]
        return {name: values[index] for name, values in zip(self._names, self._rows, strict=True)}

    def rows(self) -> list[Any]:
        """Every row, as dicts."""
        if self._rows is None:
            self._rows = [column_rows(array) for array in self._arrays()]
        names = self._names
        return (
            [dict(zip(names, values, strict=True)) for values in zip(*self._rows, strict=True)]
            if names
            else []
        )

    def collate(self) -> dict[str, Any]:
        """``default_collate(self.rows())``, column by column; a column whose rows hold
        ``None`` comes as the list of its values (see the module docstring)."""
        if not len(self):
            raise IndexError("an empty block has no batch")  # default_collate([]) fails too
        views = self._views
        if len(views) == len(self._names):
            return {name: views[name].copy() for name in self._names}
        table = self.table
        return {
            name: views[name].copy() if name in views else _column_batch(name, column)
            for name, column in zip(table.column_names, table.columns, strict=True)
        }

    def __repr__(self) -> str:
        return f"ArrowRows({len(self)} rows, columns {self._names})"
