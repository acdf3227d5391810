"""Collate functions: ``torch.utils.data``'s batching rules, with numpy arrays as the leaves.

A loader calls :func:`default_collate` on each list of samples when automatic batching is on
(``batch_size`` or ``batch_sampler`` given), and :func:`default_convert` on each sample when it is
off. Both follow torch's structure rules exactly — mappings keep their type, namedtuples keep
their type, plain tuples become lists (torch keeps that for backwards compatibility), strings are
passed through — so code written against torch's collated batches reads ours unchanged; only the
leaves are numpy arrays instead of tensors.

:func:`collate` is the registry-driven engine behind :func:`default_collate`: the first element's
type picks a function from ``collate_fn_map`` (exact type first, then the first key in insertion
order that the type is a subclass of); containers with no registered function are taken apart,
collated field by field and rebuilt.

torch is never imported here. The registry's first key stands for ``torch.Tensor`` and matches
only when torch is already loaded, so tensors from a torch-using dataset are stacked with
``torch.stack``, while a batch without tensors pays at most one ``sys.modules`` lookup.
"""

from __future__ import annotations

import collections.abc
import contextlib
import contextvars
import copy
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

__all__ = [
    "collate",
    "collate_float_fn",
    "collate_int_fn",
    "collate_numpy_array_fn",
    "collate_numpy_scalar_fn",
    "collate_str_fn",
    "collate_tensor_fn",
    "default_collate",
    "default_collate_err_msg_format",
    "default_collate_fn_map",
    "default_convert",
]

# Keys are types or tuples of types. Typed Any because Mapping is invariant in its key type, so
# a user's ``{MyType: fn}`` (a dict[type[MyType], ...]) would not type-check otherwise.
_CollateFnMap = Mapping[Any, Callable[..., Any]]

default_collate_err_msg_format = (
    "default_collate: batch must contain tensors, numpy arrays, numbers, dicts or lists; found {}"
)

# Array kinds torch refuses to collate: bytes, unicode and object (torch's pattern "[SaUO]").
_STR_OBJ_KINDS = frozenset("SUO")
# What a batch of numbers may turn into: bool, ints, floats, complex, timedelta, datetime.
_NUMERIC_KINDS = frozenset("biufcmM")


def collate(batch: Sequence[Any], *, collate_fn_map: _CollateFnMap | None = None) -> Any:
    r"""Collate a batch whose elements may be nested containers, dispatching on a registry.

    The first element's type selects a function from ``collate_fn_map``: the entry for exactly
    that type if there is one, otherwise the first key, in insertion order, that the element is
    an instance of (a key may be a type or a tuple of types). The function is called as
    ``fn(batch, collate_fn_map=collate_fn_map)``. When no key matches, containers are collated
    structurally, recursing with the same ``collate_fn_map``:

    * ``Mapping`` -> the same mapping type, each key collated over the batch (a plain ``dict``
      when the type cannot be copied-and-updated or built from a dict);
    * ``NamedTuple`` -> the same namedtuple type, collated field by field;
    * ``tuple`` -> ``list`` of per-position collations (torch's backwards-compatible rule);
    * other ``Sequence`` (not ``str``/``bytes``) -> the same sequence type when it can be
      copied-and-assigned or built from a list, else a ``list``. All samples must have the same
      length.

    Args:
        batch: a non-empty sequence of samples.
        collate_fn_map: maps element types to collate functions. ``None`` collates containers
            only, so any leaf raises ``TypeError``.

    Returns:
        The collated batch.

    Raises:
        IndexError: ``batch`` is empty.
        RuntimeError: sequence samples differ in length.
        TypeError: an element type has no registered function and is not a container.

    Example:
        >>> def collate_half_fn(batch, *, collate_fn_map=None):
        ...     return np.stack(batch).astype(np.float16)
        >>> fn_map = {**default_collate_fn_map, np.ndarray: collate_half_fn}
        >>> collate([{"x": np.zeros(2)}, {"x": np.ones(2)}], collate_fn_map=fn_map)["x"].dtype
        dtype('float16')
    """
    try:
        elem = batch[0]
    except IndexError:
        raise IndexError("collate: batch is empty; it must hold at least one sample") from None
    elem_type = type(elem)

    if collate_fn_map is not None:
        fn = collate_fn_map.get(elem_type)
        if fn is None:
            for key, candidate in collate_fn_map.items():
                if isinstance(elem, key):
                    fn = candidate
                    break
        if fn is not None:
            return fn(batch, collate_fn_map=collate_fn_map)

    if isinstance(elem, collections.abc.Mapping):
        return rebuild_mapping(
            elem,
            {key: collate([d[key] for d in batch], collate_fn_map=collate_fn_map) for key in elem},
        )
    if isinstance(elem, tuple) and hasattr(elem, "_fields"):
        fields = _transpose(batch)
        return elem_type(*(collate(field, collate_fn_map=collate_fn_map) for field in fields))
    if isinstance(elem, collections.abc.Sequence) and not isinstance(elem, str | bytes):
        columns = _transpose(batch)
        if isinstance(elem, tuple):
            return [collate(column, collate_fn_map=collate_fn_map) for column in columns]
        return rebuild_sequence(
            elem, [collate(column, collate_fn_map=collate_fn_map) for column in columns]
        )

    raise TypeError(default_collate_err_msg_format.format(elem_type))


def default_collate(batch: Sequence[Any]) -> Any:
    r"""Collate a list of samples into a batch with a new leading batch dimension.

    This is the loader's ``collate_fn`` when automatic batching is on. It is
    ``collate(batch, collate_fn_map=default_collate_fn_map)``, and maps element types so:

    * ``np.ndarray`` -> one new array of shape ``(len(batch), *elem.shape)`` (``np.stack``);
      arrays of string or object dtype raise ``TypeError``; arrays of different shapes raise
      ``RuntimeError`` naming the shapes (torch's ``stack`` error type, so one ``except``
      catches both ragged arrays and ragged sequences);
    * numpy scalars (``np.float32(1)``, ``np.bool_``, ...) -> an array of their dtype;
    * ``int`` -> ``int64`` array, ``float`` -> ``float64`` array, all-``bool`` -> ``bool``
      array (a batch mixing kinds promotes as numpy does: ``[1, 2.5]`` -> ``float64``);
    * ``str`` / ``bytes`` -> the batch unchanged (a list at the top, a tuple inside
      sequences, as in torch);
    * ``torch.Tensor`` (only when torch is installed and already imported) -> ``torch.stack``;
    * ``Mapping``, ``NamedTuple``, ``tuple`` and other sequences -> as :func:`collate`.

    Args:
        batch: a non-empty sequence of samples.

    Examples:
        >>> default_collate([0, 1, 2, 3])
        array([0, 1, 2, 3])
        >>> default_collate(["a", "b", "c"])
        ['a', 'b', 'c']
        >>> default_collate([{"A": 0, "B": 1}, {"A": 100, "B": 100}])
        {'A': array([  0, 100]), 'B': array([  1, 100])}
        >>> Point = namedtuple("Point", ["x", "y"])
        >>> default_collate([Point(0, 0), Point(1, 1)])
        Point(x=array([0, 1]), y=array([0, 1]))
        >>> default_collate([(0, 1), (2, 3)])
        [array([0, 2]), array([1, 3])]
        >>> default_collate([[0, 1], [2, 3]])
        [array([0, 2]), array([1, 3])]
        >>> # Two ways to extend it. 1: a collate_fn that falls back to default_collate.
        >>> def custom_collate(batch):
        ...     if isinstance(batch[0], CustomType):
        ...         return ...
        ...     return default_collate(batch)
        >>> # 2: register a function for the type, in place.
        >>> def collate_customtype_fn(batch, *, collate_fn_map=None):
        ...     return ...
        >>> default_collate_fn_map.update({CustomType: collate_customtype_fn})
    """
    return collate(batch, collate_fn_map=default_collate_fn_map)


def default_convert(data: Any) -> Any:
    r"""Convert one sample the way torch's loader does when automatic batching is off.

    torch turns numpy arrays into tensors here; with numpy leaves there is nothing to convert, so
    arrays, numpy scalars and every other leaf come back as they are (the same objects). Containers
    are rebuilt with torch's rules, so a sample has the same shape as under torch: mappings and
    namedtuples keep their type, plain tuples become lists, other sequences keep their type when
    they can be copied-and-assigned or built from a list and become lists otherwise; ``str`` and
    ``bytes`` are leaves.

    Args:
        data: a single sample.

    Examples:
        >>> default_convert(0)
        0
        >>> default_convert(np.array([0, 1]))
        array([0, 1])
        >>> Point = namedtuple("Point", ["x", "y"])
        >>> default_convert(Point(np.array(0), 1))
        Point(x=array(0), y=1)
        >>> default_convert((np.array([0, 1]), "a"))
        [array([0, 1]), 'a']
    """
    if isinstance(data, np.ndarray | np.generic | str | bytes):
        return data
    if isinstance(data, collections.abc.Mapping):
        return rebuild_mapping(data, {key: default_convert(data[key]) for key in data})
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(default_convert(d) for d in data))
    if isinstance(data, tuple):
        return [default_convert(d) for d in data]
    if isinstance(data, collections.abc.Sequence):
        return rebuild_sequence(data, [default_convert(d) for d in data])
    return data


def collate_numpy_array_fn(
    batch: Sequence[Any], *, collate_fn_map: _CollateFnMap | None = None
) -> np.ndarray[Any, Any]:
    """Stack a batch of equally shaped numpy arrays into one new array (a new leading axis).

    Raises ``TypeError`` for string or object dtypes and ``RuntimeError`` naming the first two
    differing shapes when the arrays are ragged.
    """
    elem = batch[0]
    if elem.dtype.kind in _STR_OBJ_KINDS:
        raise TypeError(default_collate_err_msg_format.format(elem.dtype))
    try:
        if type(elem) is np.ndarray:
            allocate = _allocator.get()
            if allocate is not None:
                stacked = _stack_into(batch, elem, allocate)
                if stacked is not None:
                    return stacked
            # Same result as np.stack for plain arrays, with the copy loop in C rather than a
            # Python-level view per element: about 2.5x faster on small arrays.
            return np.array(batch)
        # Subclasses (memmap, masked arrays) keep np.stack's subclass handling.
        return np.stack(batch)
    except ValueError as exc:
        ragged = _ragged_error(batch)
        if ragged is None:
            raise
        raise ragged from exc


Allocator = Callable[[tuple[int, ...], np.dtype[Any]], "np.ndarray[Any, Any] | None"]
_allocator: contextvars.ContextVar[Allocator | None] = contextvars.ContextVar(
    "aioload_collate_allocator", default=None
)
_IN_PLACE_MIN_BYTES = 64 << 10  # below this a copy costs less than finding room


@contextlib.contextmanager
def collate_into(allocate: Allocator) -> Iterator[None]:
    """Within the block, :func:`default_collate` stacks large arrays into ``allocate()``.

    ``allocate(shape, dtype)`` returns room for the array. Worker processes pass
    room in the shared memory their result goes to, so a
    collated batch needs no copy on its way to the loader. ``allocate`` may
    return None (no room): the batch is then stacked as usual.

    Example::

        with collate_into(arena.allocate):
            batch = default_collate(samples)
    """
    token = _allocator.set(allocate)
    try:
        yield
    finally:
        _allocator.reset(token)


def _stack_into(
    batch: Sequence[Any], elem: np.ndarray[Any, Any], allocate: Allocator
) -> np.ndarray[Any, Any] | None:
    shape, dtype = elem.shape, elem.dtype
    if elem.nbytes * len(batch) < _IN_PLACE_MIN_BYTES:
        return None
    for array in batch:
        if type(array) is not np.ndarray or array.shape != shape or array.dtype != dtype:
            return None  # ragged or mixed: np.array's rules (and errors) apply
    out = allocate((len(batch), *shape), dtype)
    if out is None:
        return None
    np.stack(batch, out=out)
    return out


def collate_numpy_scalar_fn(
    batch: Sequence[Any], *, collate_fn_map: _CollateFnMap | None = None
) -> np.ndarray[Any, Any]:
    """Collate numpy scalars (``np.float32(1)``, ``np.bool_(True)``, ...) into an array of their
    dtype."""
    return _numeric_array(batch)


def collate_float_fn(
    batch: Sequence[Any], *, collate_fn_map: _CollateFnMap | None = None
) -> np.ndarray[Any, Any]:
    """Collate Python floats into a ``float64`` array."""
    out = _numeric_array(batch)
    return out if out.dtype.kind == "c" else out.astype(np.float64, copy=False)


def collate_int_fn(
    batch: Sequence[Any], *, collate_fn_map: _CollateFnMap | None = None
) -> np.ndarray[Any, Any]:
    """Collate Python ints into an ``int64`` array (all-``bool`` batches into a ``bool`` array;
    an int mixed with floats promotes to ``float64``)."""
    out = _numeric_array(batch)
    # NumPy turns ints beyond int64 into uint64, or float64 next to negative ones: lossy.
    if out.dtype.kind in "uf" and _all_ints(batch):
        raise _int64_overflow()
    if out.dtype.kind == "i" and out.dtype != np.int64:
        # NumPy 1.x on Windows infers int32; the documented dtype is int64 everywhere.
        out = out.astype(np.int64)
    return out


def collate_str_fn(batch: Sequence[Any], *, collate_fn_map: _CollateFnMap | None = None) -> Any:
    """Return a batch of ``str`` or ``bytes`` unchanged."""
    return batch


def collate_tensor_fn(batch: Sequence[Any], *, collate_fn_map: _CollateFnMap | None = None) -> Any:
    """Stack a batch of torch tensors with ``torch.stack`` (torch is imported only here)."""
    import torch

    return torch.stack(list(batch), 0)


class _TorchTensorMeta(type):
    # isinstance() against the registry key asks torch only if some other code has imported it:
    # a tensor cannot exist before that, and aioload itself must never pull torch in.
    def __instancecheck__(cls, obj: object) -> bool:
        torch = sys.modules.get("torch")
        return torch is not None and isinstance(obj, torch.Tensor)

    def __subclasscheck__(cls, sub: type) -> bool:
        torch = sys.modules.get("torch")
        return torch is not None and issubclass(sub, torch.Tensor)


class _TorchTensor(metaclass=_TorchTensorMeta):
    """Registry key standing for ``torch.Tensor`` without importing torch."""


default_collate_fn_map: dict[type | tuple[type, ...], Callable[..., Any]] = {
    _TorchTensor: collate_tensor_fn,
    np.ndarray: collate_numpy_array_fn,
    # Numeric numpy scalars; np.str_ and np.bytes_ fall through to the str and bytes keys.
    (np.bool_, np.number, np.datetime64, np.object_): collate_numpy_scalar_fn,
    float: collate_float_fn,
    int: collate_int_fn,
    str: collate_str_fn,
    bytes: collate_str_fn,
}
"""The registry :func:`default_collate` uses. Extend it in place to teach ``default_collate``
a new type, e.g. ``default_collate_fn_map[MyType] = collate_mytype_fn``; each function is
called as ``fn(batch, collate_fn_map=...)``."""


def _numeric_array(batch: Sequence[Any]) -> np.ndarray[Any, Any]:
    out = np.array(batch)
    if out.dtype.kind in _NUMERIC_KINDS:
        return out
    if _all_ints(batch):
        raise _int64_overflow()
    found = ", ".join(sorted({type(x).__name__ for x in batch}))
    raise TypeError(f"collate: a batch of numbers must hold only numbers; found {found}")


def _all_ints(batch: Sequence[Any]) -> bool:
    return all(isinstance(x, int | np.integer) for x in batch)


def _int64_overflow() -> OverflowError:
    return OverflowError("collate: Python int too large to fit in an int64 array")


def _ragged_error(batch: Sequence[Any]) -> RuntimeError | None:
    first = np.shape(batch[0])
    for i, x in enumerate(batch):
        try:
            shape = np.shape(x)
        except ValueError:  # x is itself a ragged nested list
            shape = None
        if shape != first:
            return RuntimeError(
                "default_collate: stack expects each array to be equal size, "
                f"but got shape {first} at entry 0 and shape {shape} at entry {i}"
            )
    return None


def _transpose(batch: Sequence[Any]) -> list[tuple[Any, ...]]:
    try:
        return list(zip(*batch, strict=True))
    except ValueError:
        if len({len(sample) for sample in batch}) == 1:
            raise
        raise RuntimeError("each element in list of batch should be of equal size") from None


def rebuild_mapping(template: Mapping[Any, Any], values: dict[Any, Any]) -> Any:
    """A mapping of ``template``'s type holding ``values`` (a plain dict when that fails)."""
    # A mapping type may carry extra state (OrderedDict's order, defaultdict's factory): copy the
    # sample and overwrite its values when it is mutable, else call the type on a dict.
    if type(template) is dict:
        return values
    try:
        if isinstance(template, collections.abc.MutableMapping):
            clone = copy.copy(template)
            clone.update(values)
            return clone
        return type(template)(values)  # type: ignore[call-arg]
    except TypeError:
        return values


def rebuild_sequence(template: Sequence[Any], values: list[Any]) -> Any:
    """A sequence of ``template``'s type holding ``values`` (a plain list when that fails)."""
    if type(template) is list:
        return values
    try:
        if isinstance(template, collections.abc.MutableSequence):
            clone = copy.copy(template)
            for i, value in enumerate(values):
                clone[i] = value
            return clone
        return type(template)(values)  # type: ignore[call-arg]
    except TypeError:
        # e.g. range: neither assignable nor constructible from a list.
        return values
