"""Measuring a batch: the bytes of its arrays and its length, cheaply, whatever its shape.

The loader's statistics (:mod:`aioload.stats`) count the bytes of the batches they measure,
and the scheduler fits its window to a byte budget by them (:func:`batch_nbytes`); for an
iterable dataset the length of a batch (its first array's first dimension) is its number of
items. Both walk the batch within fixed bounds (width, depth, containers opened), so any batch
costs little.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["batch_nbytes", "measure_batch"]

_WIDE = 16  # a sequence longer than this is counted as its first entry times its length
_BUDGET = 256  # at most this many containers are opened to find a batch's length
_DEPTH = 8  # containers nested deeper are not opened to count bytes
_PLAIN = frozenset({int, float, bool, str, bytes, complex, type(None)})


def measure_batch(batch: Any) -> tuple[int, int]:
    """The bytes of the arrays in ``batch`` and the length of its first array.

    Counts ``nbytes`` of numpy arrays and scalars and of any object with an
    integer ``nbytes`` (torch tensors), found through tuples, lists and
    mappings. To stay cheap on any batch, a sequence of more than 16 entries
    (a list of uncollated samples) counts as its first entry times its
    length, and containers nested more than 8 deep are not opened. The
    length (-1 when there is no array) is the first dimension of the first
    array found, depth first, or the length of a long sequence met before any
    array (at most 256 containers are opened to find it).

    Example::

        >>> measure_batch((np.zeros((4, 3), np.float32), np.arange(4)))
        (80, 4)
    """
    if type(batch) is dict:
        # What default_collate makes of columns, a dict of arrays: one pass, the same
        # figures as the general walks below (a dict is opened whatever its width).
        total, length = 0, -1
        for value in batch.values():
            if type(value) is not np.ndarray:
                break
            total += value.nbytes
            if length < 0 and value.ndim:
                length = value.shape[0]
        else:
            return total, length
    return batch_nbytes(batch), _walk(batch)[1]


def batch_nbytes(batch: Any, depth: int = 0) -> int:
    """The bytes of the arrays in ``batch`` (see :func:`measure_batch`).

    Runs once per batch, so the common shapes — an array, a short tuple,
    list or dict of arrays (what :func:`~aioload.default_collate` makes),
    a long list of uncollated samples — are counted without building
    anything. Containers nested deeper than 8 levels are not opened.
    """
    kind = type(batch)
    if kind is np.ndarray:
        return int(batch.nbytes)
    if kind is tuple or kind is list:
        count = len(batch)
        if count > _WIDE:
            return batch_nbytes(batch[0], depth) * count
        entries: Any = batch
    elif kind is dict:
        entries = batch.values()
    elif kind in _PLAIN:
        return 0
    elif isinstance(batch, tuple | list | Mapping):
        entries = batch.values() if isinstance(batch, Mapping) else batch
        if len(entries) > _WIDE:
            return batch_nbytes(next(iter(entries)), depth) * len(entries)
    else:
        nbytes = getattr(batch, "nbytes", None)  # numpy scalars, torch tensors
        return nbytes if isinstance(nbytes, int) else 0
    if depth >= _DEPTH:
        return 0
    total = 0
    for entry in entries:
        if type(entry) is np.ndarray:
            total += entry.nbytes
        elif type(entry) not in _PLAIN:
            total += batch_nbytes(entry, depth + 1)
    return total


def _walk(batch: Any) -> tuple[int, int]:
    """:func:`measure_batch` for any batch: depth first, within the budget."""
    total = 0
    length = -1
    budget = _BUDGET
    todo = [batch]
    while todo:
        value = todo.pop()
        kind = type(value)
        if kind is np.ndarray:
            total += value.nbytes
            if length < 0 and value.ndim:
                length = value.shape[0]
            continue
        if kind in _PLAIN:
            continue
        budget -= 1
        if budget < 0:
            break
        if kind is tuple or kind is list or isinstance(value, tuple | list):
            count = len(value)
            if count > _WIDE:
                if length < 0:
                    length = count
                total += _walk(value[0])[0] * count
            else:
                todo += value[::-1]  # depth first, in order
            continue
        if kind is dict:
            values = list(value.values())
            values.reverse()
            todo += values
            continue
        nbytes = getattr(value, "nbytes", None)
        if isinstance(nbytes, int):
            total += nbytes
            if length < 0:
                shape = getattr(value, "shape", None)
                if shape is not None and len(shape):
                    length = int(shape[0])
        elif isinstance(value, Mapping):
            values = list(value.values())
            values.reverse()
            todo += values
    return total, length
