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
from typing import Any, TypeVar

import numpy as np

__all__ = [
    "CollateTypeError",
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
_E = TypeVar("_E", bound=BaseException)

default_collate_err_msg_format = (
    "default_collate: batch must contain tensors, numpy arrays, numbers, dicts or lists; found {}"
)


class CollateTypeError(TypeError, RuntimeError):
    """An entry of a batch whose type cannot be collated with the field's other entries.

    For example ``None`` among arrays. The message names the type, the entry (the sample's
    index in the batch) and the field (its path in the sample, e.g. ``['image']``). It is a
    ``TypeError``, as torch raises for a tensor followed by ``None``, and a ``RuntimeError``,
    as torch raises for a numpy array or an int followed by ``None``: either ``except`` that
    works with torch catches it.

    Example::

        >>> try:
        ...     default_collate([{"image": np.zeros(3)}, {"image": None}])
        ... except RuntimeError as error:  # or TypeError
        ...     print(str(error).split("; ")[1])
        found <class 'NoneType'> in field ['image'] at entry 1
    """


# The errors raised here carry, under this attribute, the path of the field they concern (filled
# in as they propagate out of the nested collate calls) and their message with a "{field}" slot.
_WHERE = "_aioload_collate_where"
_FIELD_SLOT = "{field}"


def _located(kind: type[_E], template: str) -> _E:
    """An error of ``kind`` whose message is ``template`` with its field slot filled in."""
    error = kind(template.replace(_FIELD_SLOT, ""))
    setattr(error, _WHERE, ([], template))
    return error


def _in_field(error: BaseException, segment: str) -> bool:
    """Prepends ``segment`` (``['key']``, ``[0]``, ``.name``) to a located error's field path.

    Returns whether ``error`` was raised here (other errors are left alone).
    """
    where = getattr(error, _WHERE, None)
    if where is None:
        return False
    path, template = where
    path.insert(0, segment)
    error.args = (template.replace(_FIELD_SLOT, " in field " + "".join(path)),)
    return True


def _unsupported(type_: Any, entry: int, kind: type[TypeError] = TypeError) -> TypeError:
    return _located(
        kind, default_collate_err_msg_format.format(type_) + f"{{field}} at entry {entry}"
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
        TypeError: an element type has no registered function and is not a container
            (:class:`CollateTypeError` when entries of one field have types that do not go
            together, e.g. ``None`` after a container).

    The errors raised by the collate functions here name the field (its path in the sample,
    e.g. ``['image'][0]``) and the entry (the sample's index in the batch) that caused them.

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

    # The try blocks cost nothing until an error, which they locate (see _in_field).
    if isinstance(elem, collections.abc.Mapping):
        values: dict[Any, Any] = {}
        name: Any = None
        try:
            for name in elem:
                values[name] = collate([d[name] for d in batch], collate_fn_map=collate_fn_map)
        except Exception as error:
            if not _in_field(error, f"[{name!r}]"):
                _raise_if_not_all(batch, collections.abc.Mapping, error)
            raise
        return rebuild_mapping(elem, values)
    if isinstance(elem, tuple) and hasattr(elem, "_fields"):
        fields = _transpose(batch)
        out: list[Any] = []
        try:
            for field in fields:
                out.append(collate(field, collate_fn_map=collate_fn_map))
        except Exception as error:
            _in_field(error, f".{elem._fields[len(out)]}")
            raise
        return elem_type(*out)
    if isinstance(elem, collections.abc.Sequence) and not isinstance(elem, str | bytes):
        columns = _transpose(batch)
        out = []
        try:
            for column in columns:
                out.append(collate(column, collate_fn_map=collate_fn_map))
        except Exception as error:
            _in_field(error, f"[{len(out)}]")
            raise
        if isinstance(elem, tuple):
            return out
        return rebuild_sequence(elem, out)

    raise _unsupported(elem_type, 0)


def default_collate(batch: Sequence[Any]) -> Any:
    r"""Collate a list of samples into a batch with a new leading batch dimension.

    This is the loader's ``collate_fn`` when automatic batching is on. It is
    ``collate(batch, collate_fn_map=default_collate_fn_map)``, and maps element types so:

    * ``np.ndarray`` -> one new array of shape ``(len(batch), *elem.shape)`` (``np.stack``);
      arrays of string or object dtype raise ``TypeError``; arrays of different shapes raise
      ``RuntimeError`` naming the shapes (torch's ``stack`` error type, so one ``except``
      catches both ragged arrays and ragged sequences); an entry of a type that cannot be
      collated (``None``, a lock) raises :class:`CollateTypeError`;
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

    Raises ``TypeError`` for string or object dtypes, ``RuntimeError`` naming the first two
    differing shapes when the arrays are ragged, and :class:`CollateTypeError` for an entry
    that is not an array (nor anything else collatable), such as ``None``.
    """
    elem = batch[0]
    if elem.dtype.kind in _STR_OBJ_KINDS:
        raise _unsupported(elem.dtype, 0)
    try:
        if type(elem) is np.ndarray:
            allocate = _allocator.get()
            if allocate is not None:
                stacked = _stack_into(batch, elem, allocate)
                if stacked is not None:
                    return stacked
            # Same result as np.stack for plain arrays, with the copy loop in C rather than a
            # Python-level view per element: about 2.5x faster on small arrays.
            out = np.array(batch)
        else:
            # Subclasses (memmap, masked arrays) keep np.stack's subclass handling.
            out = np.stack(batch)
    except ValueError as exc:
        error = _array_batch_error(batch, collate_fn_map)
        if error is None:
            raise
        raise error from exc
    if out.dtype.kind in _STR_OBJ_KINDS:  # e.g. None or a str next to 0-d arrays
        raise _array_batch_error(batch, collate_fn_map) or _unsupported(out.dtype, 0)
    return out


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
    return _numeric_array(batch, collate_fn_map)


def collate_float_fn(
    batch: Sequence[Any], *, collate_fn_map: _CollateFnMap | None = None
) -> np.ndarray[Any, Any]:
    """Collate Python floats into a ``float64`` array."""
    out = _numeric_array(batch, collate_fn_map)
    return out if out.dtype.kind == "c" else out.astype(np.float64, copy=False)


def collate_int_fn(
    batch: Sequence[Any], *, collate_fn_map: _CollateFnMap | None = None
) -> np.ndarray[Any, Any]:
    """Collate Python ints into an ``int64`` array (all-``bool`` batches into a ``bool`` array;
    an int mixed with floats promotes to ``float64``)."""
    out = _numeric_array(batch, collate_fn_map)
    # NumPy turns ints beyond int64 into uint64, or float64 next to negative ones: lossy.
    if out.dtype.kind in "uf" and _all_ints(batch):
        raise _int64_overflow(batch)
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


def _numeric_array(
    batch: Sequence[Any], collate_fn_map: _CollateFnMap | None
) -> np.ndarray[Any, Any]:
    try:
        out = np.array(batch)
    except ValueError as exc:  # an array or a list among the numbers
        raise _number_batch_error(batch, collate_fn_map) from exc
    if out.dtype.kind in _NUMERIC_KINDS:
        return out
    if _all_ints(batch):
        raise _int64_overflow(batch)
    raise _number_batch_error(batch, collate_fn_map)


_NUMBER_TYPES = (int, float, complex, np.bool_, np.number, np.datetime64, np.timedelta64)


def _number_batch_error(batch: Sequence[Any], collate_fn_map: _CollateFnMap | None) -> TypeError:
    for i, x in enumerate(batch):
        if not isinstance(x, _NUMBER_TYPES):
            if not _collatable(x, collate_fn_map):
                return _unsupported(type(x), i, CollateTypeError)
            return _located(
                TypeError,
                "collate: a batch of numbers must hold only numbers; "
                f"found {type(x)}{_FIELD_SLOT} at entry {i}",
            )
    found = ", ".join(sorted({type(x).__name__ for x in batch}))
    return _located(
        TypeError, f"collate: a batch of numbers must hold only numbers; found {found}{_FIELD_SLOT}"
    )


def _all_ints(batch: Sequence[Any]) -> bool:
    return all(isinstance(x, int | np.integer) for x in batch)


def _int64_overflow(batch: Sequence[Any]) -> OverflowError:
    info = np.iinfo(np.int64)
    entry = next((i for i, x in enumerate(batch) if not info.min <= x <= info.max), 0)
    return _located(
        OverflowError,
        f"collate: Python int too large to fit in an int64 array{_FIELD_SLOT} at entry {entry}",
    )


def _collatable(x: Any, collate_fn_map: _CollateFnMap | None) -> bool:
    """Whether ``collate`` has a rule for ``x``: a registered type or a container."""
    fn_map = default_collate_fn_map if collate_fn_map is None else collate_fn_map
    if type(x) in fn_map or any(isinstance(x, key) for key in fn_map):
        return True
    return isinstance(x, collections.abc.Mapping) or (
        isinstance(x, collections.abc.Sequence) and not isinstance(x, str | bytes)
    )


def _array_batch_error(
    batch: Sequence[Any], collate_fn_map: _CollateFnMap | None
) -> Exception | None:
    """Why a batch of arrays cannot be stacked: an uncollatable entry, a shape or a dtype."""
    for i, x in enumerate(batch):
        if not _collatable(x, collate_fn_map):
            return _unsupported(type(x), i, CollateTypeError)
    ragged = _ragged_error(batch)
    if ragged is not None:
        return ragged
    for i, x in enumerate(batch):
        dtype = getattr(x, "dtype", None)
        if dtype is not None and dtype.kind in _STR_OBJ_KINDS:
            return _unsupported(dtype, i)
    return None


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
                f"but got shape {first} at entry 0 and shape {shape} at entry {i}",
            )
    return None


def _transpose(batch: Sequence[Any]) -> list[tuple[Any, ...]]:
    try:
        return list(zip(*batch, strict=True))
    except TypeError as exc:
        _raise_if_not_all(batch, collections.abc.Sequence, exc)
        raise
    except ValueError:
        sizes = [len(sample) for sample in batch]
        if len(set(sizes)) == 1:
            raise
        entry = next(i for i, size in enumerate(sizes) if size != sizes[0])
        raise _located(
            RuntimeError,
            f"each element in list of batch should be of equal size{_FIELD_SLOT}: entry 0 has "
            f"{sizes[0]} elements and entry {entry} has {sizes[entry]}",
        ) from None


def _raise_if_not_all(batch: Sequence[Any], kind: type, error: BaseException) -> None:
    """Raises a located error, caused by ``error``, for the first entry not a ``kind``."""
    for i, x in enumerate(batch):
        if not isinstance(x, kind) or isinstance(x, str | bytes):
            raise _unsupported(type(x), i, CollateTypeError) from error


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
