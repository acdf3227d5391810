"""Errors that say where a batch could not be collated: the field, the entry and its key.

An error raised while collating carries the path of its field (``['image'][0]``, ``.name``),
filled in as it propagates out of the nested collate calls (:func:`_in_field`), and the
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

__all__ = ["CollateTypeError", "default_collate_err_msg_format", "name_keys"]

_E = TypeVar("_E", bound=BaseException)

default_collate_err_msg_format = (
    "default_collate: batch must contain tensors, numpy arrays, numbers, dicts or lists; found {}"
)


# The errors raised here carry, under this attribute, the path of the field they concern (filled
# in as they propagate out of the nested collate calls), their message with a "{field}" slot and
# "{entry:N}" slots (see _entry), and the batch's keys once known.
_WHERE = "_aioload_collate_where"
_FIELD_SLOT = "{field}"
_ENTRY_SLOT = re.compile(r"\{entry:(\d+)\}")


def _entry(index: int) -> str:
    """The slot for ``entry <index>`` in a message, which :func:`name_keys` gives its key."""
    return f"{{entry:{index}}}"


def _located(kind: type[_E], template: str) -> _E:
    """An error of ``kind`` whose message is ``template`` with its slots filled in."""
    where: list[Any] = [[], template, None]
    error = kind(_render(where))
    setattr(error, _WHERE, where)
    return error


def _render(where: list[Any]) -> str:
    path, template, keys = where
    text = template.replace(_FIELD_SLOT, " in field " + "".join(path) if path else "")

    def entry(match: re.Match[str]) -> str:
        index = int(match[1])
        if keys is None or index >= len(keys):
            return f"entry {index}"
        return f"entry {index} (key {keys[index]!r})"

    return _ENTRY_SLOT.sub(entry, text)


def _in_field(error: BaseException, segment: str) -> bool:
    """Prepends ``segment`` (``['key']``, ``[0]``, ``.name``) to a located error's field path.

    Returns whether ``error`` was raised here (other errors are left alone).
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


def _unsupported(type_: Any, entry: int, kind: type[TypeError] = TypeError) -> TypeError:
    return _located(
        kind, default_collate_err_msg_format.format(type_) + f"{_FIELD_SLOT} at {_entry(entry)}"
    )


def _int64_overflow(batch: Sequence[Any]) -> OverflowError:
    info = np.iinfo(np.int64)
    entry = next((i for i, x in enumerate(batch) if not info.min <= x <= info.max), 0)
    return _located(
        OverflowError,
        f"collate: Python int too large to fit in an int64 array{_FIELD_SLOT} at {_entry(entry)}",
    )


def _ragged_error(batch: Sequence[Any]) -> RuntimeError | None:
    first = np.shape(batch[0])
    for i, x in enumerate(batch):
        try:
            shape = np.shape(x)
        except ValueError:  # x is itself a ragged nested list
            shape = None
        if shape != first:
            return _located(
                RuntimeError,
                f"default_collate: stack expects each array{_FIELD_SLOT} to be equal size, "
                f"but got shape {first} at {_entry(0)} and shape {shape} at {_entry(i)}",
            )
    return None


def _raise_if_not_all(batch: Sequence[Any], kind: type, error: BaseException) -> None:
    """Raises a located error, caused by ``error``, for the first entry not a ``kind``."""
    for i, x in enumerate(batch):
        if not isinstance(x, kind) or isinstance(x, str | bytes):
            raise _unsupported(type(x), i, CollateTypeError) from error
