"""Arrow tables as batches: :class:`ArrowRows`, a row block over a ``pyarrow.Table``.

What a row and a batch hold, by column type (the batch is always what
:func:`~aioload.collate.default_collate` makes of the rows, made from the columns):

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
strings, binary                           ``str`` / ``bytes``         a list of them
                                          (``None`` for a null)       (``default_collate``
                                                                      leaves strings as a list)
lists of numbers                          a numpy array of the row's  ``numpy.stack`` of the
                                          values (``None``: null)     rows' arrays: equal
                                                                      lengths only; ragged
                                                                      lists raise (collate
                                                                      them yourself)
anything else (structs, maps, lists of    ``to_pylist()``'s value     ``default_collate`` of
strings, bool with nulls, ...)                                        the rows' values
========================================  ==========================  =========================

Example::

    block = ArrowRows(pa.table({"x": [1, 2], "s": ["a", "b"]}))
    block[1]                 # {'x': np.int64(2), 's': 'b'}
    default_collate(block)   # {'x': array([1, 2]), 's': ['a', 'b']}
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from aioload.collate import default_collate
from aioload.row_block import RowBlock

__all__ = ["ArrowRows", "column_rows"]


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
    kind = array.type
    if not array.null_count and (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
        # Arrow's own buffer, viewed: what to_numpy gives, at a tenth of its cost.
        dtype = np.dtype(kind.to_pandas_dtype())
        data = array.buffers()[1]
        return np.frombuffer(data, dtype, count=len(array), offset=array.offset * dtype.itemsize)
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


def _column_batch(column: pa.ChunkedArray) -> Any:
    kind = column.type
    if _is_plain(kind) and (not column.null_count or _nulls_in_numpy(kind)):
        # A fresh, writable array, as default_collate's: one copy out of Arrow's buffers.
        parts = [_as_numpy(chunk) for chunk in column.chunks]
        if len(parts) == 1:
            return np.array(parts[0])
        if not parts:
            return np.zeros(0, dtype=column.type.to_pandas_dtype())
        return np.concatenate(parts)
    return default_collate(column_rows(column.combine_chunks()))


class ArrowRows(RowBlock):
    """A batch of the rows of an Arrow table (see the module docstring for what they hold).

    Args:
        table: the rows; its chunks are combined once, when a column is first needed.

    Example::

        block = ArrowRows(table.slice(0, 256))
        len(block), block[0], default_collate(block)
    """

    def __init__(self, table: pa.Table) -> None:
        self.table = table
        self._columns: list[pa.Array] | None = None
        self._rows: list[Sequence[Any]] | None = None

    def __len__(self) -> int:
        return int(self.table.num_rows)

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
        return {
            name: values[index]
            for name, values in zip(self.table.column_names, self._rows, strict=True)
        }

    def rows(self) -> list[Any]:
        """Every row, as dicts."""
        if self._rows is None:
            self._rows = [column_rows(array) for array in self._arrays()]
        names = self.table.column_names
        return (
            [dict(zip(names, values, strict=True)) for values in zip(*self._rows, strict=True)]
            if names
            else []
        )

    def collate(self) -> dict[str, Any]:
        """``default_collate(self.rows())``, column by column."""
        if not len(self):
            raise IndexError("an empty block has no batch")  # default_collate([]) fails too
        table = self.table
        return {
            name: _column_batch(column)
            for name, column in zip(table.column_names, table.columns, strict=True)
        }

    def __repr__(self) -> str:
        return f"ArrowRows({len(self)} rows, columns {self.table.column_names})"
