"""Errors that say where a batch could not be collated: the field, the entry and its key.

An error raised while collating carries the path of its field (``['image'][0]``, ``.name``),
filled in as it propagates out of the nested collate calls (:func:`prepend_field`), and the
index of the offending sample in the batch; where the batch's keys are known (the loader's
batch reader), :func:`name_keys` adds the dataset key of each entry it names
(``at entry 1 (key 17)``). :class:`CollateTypeError` is the error for an entry whose type does
not go with the field's other entries (``None`` among arrays).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, TypeVar

import numpy as np

from aioload.errors import CollateTypeError

# Beyond the first three, for aioload's collate functions (:mod:`aioload.collate.core` and
# :mod:`aioload.collate.fns`), which raise the located errors.
__all__ = [
    "FIELD_SLOT",
    "CollateTypeError",
    "default_collate_err_msg_format",
    "entry_slot",
    "int64_overflow_error",
    "located_error",
    "name_keys",
    "prepend_field",
    "raise_if_not_all",
    "ragged_shapes_error",
    "unsupported_type_error",
]

_E = TypeVar("_E", bound=BaseException)

default_collate_err_msg_format = (
    "default_collate: batch must contain tensors, numpy arrays, numbers, dicts or lists; found {}"
)


# The errors raised here carry, under this attribute, the path of the field they concern (filled
# in as they propagate out of the nested collate calls), their message with a "{field}" slot and
# "{entry:N}" slots (see entry_slot), and the batch's keys once known.
_WHERE = "_aioload_collate_where"
FIELD_SLOT = "{field}"
"""The slot in a :func:`located_error` template for `` in field ['image'][0]`` (or nothing)."""
_ENTRY_SLOT = re.compile(r"\{entry:(\d+)\}")


def entry_slot(index: int) -> str:
    """The slot for ``entry <index>`` in a message, which :func:`name_keys` gives its key.

    Args:
        index: the entry's index in the batch.

    Example::

        >>> str(located_error(ValueError, f"bad{FIELD_SLOT} at {entry_slot(2)}"))
        'bad at entry 2'
    """
    return f"{{entry:{index}}}"


def located_error(kind: type[_E], template: str) -> _E:
    """An error of ``kind`` whose message is ``template`` with its slots filled in.

    The error keeps its template: :func:`prepend_field` and :func:`name_keys` fill the slots
    in again as the error learns its field and its batch's keys.

    Args:
        kind: the exception type.
        template: the message, with a :data:`FIELD_SLOT` and :func:`entry_slot` slots.

    Example::

        >>> error = located_error(TypeError, f"no{FIELD_SLOT} at {entry_slot(1)}")
        >>> prepend_field(error, "['label']"), str(error)
        (True, "no in field ['label'] at entry 1")
    """
    where: list[Any] = [[], template, None]
    error = kind(_render(where))
    setattr(error, _WHERE, where)
    return error


def _render(where: list[Any]) -> str:
    path, template, keys = where
    text = template.replace(FIELD_SLOT, " in field " + "".join(path) if path else "")

    def entry(match: re.Match[str]) -> str:
        index = int(match[1])
        if keys is None or index >= len(keys):
            return f"entry {index}"
        return f"entry {index} (key {keys[index]!r})"

    return _ENTRY_SLOT.sub(entry, text)


def prepend_field(error: BaseException, segment: str) -> bool:
    """Prepends ``segment`` (``['key']``, ``[0]``, ``.name``) to a located error's field path.

    Returns whether ``error`` was raised here (other errors are left alone).

    Args:
        error: an error raised while collating a field.
        segment: the field's place in its container.

    Example::

        >>> error = located_error(TypeError, f"no{FIELD_SLOT}")
        >>> prepend_field(error, "[0]"), prepend_field(error, "['x']"), str(error)
        (True, True, "no in field ['x'][0]")
        >>> prepend_field(KeyError("other"), "[0]")
        False
    """
    where = getattr(error, _WHERE, None)
    if where is None:
        return False
    where[0].insert(0, segment)
    error.args = (_render(where),)
    return True


def name_keys(error: BaseException, keys: Sequence[Any]) -> None:
    """Names, in a collate error's message, the dataset key of each entry it names.

    ``keys[i]`` is the key of the batch's entry ``i`` (the sample collated at index ``i``).
    Errors not raised by collate are left alone.

    Example::

        >>> from aioload import default_collate
        >>> try:
        ...     default_collate([{"image": np.zeros(3)}, {"image": None}])
        ... except RuntimeError as error:
        ...     name_keys(error, [40, 17])
        ...     print(str(error).split("; ")[1])
        found <class 'NoneType'> in field ['image'] at entry 1 (key 17)
    """
    where = getattr(error, _WHERE, None)
    if where is None:
        return
    where[2] = list(keys)
    error.args = (_render(where),)


def unsupported_type_error(type_: Any, entry: int, kind: type[TypeError] = TypeError) -> TypeError:
    """torch's error for a type ``default_collate`` cannot collate, located at ``entry``.

    Args:
        type_: the type (or numpy dtype) found.
        entry: the index of the entry that has it.
        kind: the exception type (:class:`CollateTypeError` for one among other types).

    Example::

        >>> str(unsupported_type_error(set, 0)).split("; ")[1]
        "found <class 'set'> at entry 0"
    """
    return located_error(
        kind, default_collate_err_msg_format.format(type_) + f"{FIELD_SLOT} at {entry_slot(entry)}"
    )


def int64_overflow_error(batch: Sequence[Any]) -> OverflowError:
    """The error for a batch of Python ints that an int64 array cannot hold, at the first
    entry out of range.

    Args:
        batch: the ints.

    Example::

        >>> str(int64_overflow_error([1, 2**70]))
        'collate: Python int too large to fit in an int64 array at entry 1'
    """
    info = np.iinfo(np.int64)
    entry = next((i for i, x in enumerate(batch) if not info.min <= x <= info.max), 0)
    return located_error(
        OverflowError,
        "collate: Python int too large to fit in an int64 array"
        f"{FIELD_SLOT} at {entry_slot(entry)}",
    )


def ragged_shapes_error(batch: Sequence[Any]) -> RuntimeError | None:
    """torch's error for arrays that cannot be stacked, naming the first entry whose shape
    differs from entry 0's; None when every shape is the same.

    Args:
        batch: the arrays (or nested lists) to stack.

    Example::

        >>> ragged_shapes_error([np.zeros(2), np.zeros(2)]) is None
        True
        >>> print(ragged_shapes_error([np.zeros(2), np.zeros(3)]))
        default_collate: stack expects each array to be equal size, but got shape (2,) at entry 0 \
and shape (3,) at entry 1
    """
    first = np.shape(batch[0])
    for i, x in enumerate(batch):
        try:
            shape = np.shape(x)
        except ValueError:  # x is itself a ragged nested list
            shape = None
        if shape != first:
            return located_error(
                RuntimeError,
                f"default_collate: stack expects each array{FIELD_SLOT} to be equal size, "
                f"but got shape {first} at {entry_slot(0)} and shape {shape} at {entry_slot(i)}",
            )
    return None


def raise_if_not_all(batch: Sequence[Any], kind: type, error: BaseException) -> None:
    """Raises a located error, caused by ``error``, for the first entry not a ``kind``.

    A ``str`` or ``bytes`` is not a sequence here, as it is not to ``default_collate``.

    Args:
        batch: the batch whose first entry was a ``kind``.
        kind: the type every entry should be (``Mapping``, ``Sequence``).
        error: the error collating the batch raised, the cause of the one raised here.

    Example::

        >>> raise_if_not_all([{"a": 1}, {"a": 2}], dict, KeyError("a"))  # every entry is one
    """
    for i, x in enumerate(batch):
        if not isinstance(x, kind) or isinstance(x, str | bytes):
            raise unsupported_type_error(type(x), i, CollateTypeError) from error
