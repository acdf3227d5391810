"""The type-to-function registry of :func:`~aioload.collate.default_collate`, and its functions.

:data:`default_collate_fn_map` maps element types to the functions that collate a batch of
them: numpy arrays (stacked, into shared memory under :func:`collate_into`), numpy scalars,
Python numbers, strings and torch tensors. torch is never imported here: the registry's
first key stands for ``torch.Tensor`` and matches only when torch is already loaded, so a
batch without tensors pays at most one ``sys.modules`` lookup. When a batch cannot be
collated, the errors here say why, naming the entry (see :mod:`aioload.collate.errors`).
"""

from __future__ import annotations

import collections.abc
import contextlib
import contextvars
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeAlias

import numpy as np

from aioload.collate.errors import (
    FIELD_SLOT,
    CollateTypeError,
    entry_slot,
    int64_overflow_error,
    located_error,
    ragged_shapes_error,
    unsupported_type_error,
)

__all__ = [
    "Allocator",
    "active_allocator",
    "CollateFnMap",
    "collate_float_fn",
    "collate_int_fn",
    "collate_into",
    "collate_numpy_array_fn",
    "collate_numpy_scalar_fn",
    "collate_str_fn",
    "collate_tensor_fn",
    "default_collate_fn_map",
    "holds_torch_tensor",
    "tensor_leaves_fn_map",
]

# Typed Any because Mapping is invariant in its key type, so a user's ``{MyType: fn}`` (a
# dict[type[MyType], ...]) would not type-check otherwise.
CollateFnMap: TypeAlias = Mapping[Any, Callable[..., Any]]
"""A ``collate_fn_map``: a type (or a tuple of types) to the function that collates a batch of
its values, as :data:`default_collate_fn_map`."""

# Array kinds torch refuses to collate: bytes, unicode and object (torch's pattern "[SaUO]").
_STR_OBJ_KINDS = frozenset("SUO")
# What a batch of numbers may turn into: bool, ints, floats, complex, timedelta, datetime.
_NUMERIC_KINDS = frozenset("biufcmM")


def collate_numpy_array_fn(
    batch: Sequence[Any], *, collate_fn_map: CollateFnMap | None = None
) -> np.ndarray[Any, Any]:
    """Stack a batch of equally shaped numpy arrays into one new array (a new leading axis).

    Raises ``TypeError`` for string or object dtypes, ``RuntimeError`` naming the first two
    differing shapes when the arrays are ragged, and :class:`CollateTypeError` for an entry
    that is not an array (nor anything else collatable), such as ``None``.
    """
    elem = batch[0]
    if elem.dtype.kind in _STR_OBJ_KINDS:
        raise unsupported_type_error(elem.dtype, 0)
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
        raise _array_batch_error(batch, collate_fn_map) or unsupported_type_error(out.dtype, 0)
    return out


Allocator = Callable[[tuple[int, ...], np.dtype[Any]], "np.ndarray[Any, Any] | None"]
_allocator: contextvars.ContextVar[Allocator | None] = contextvars.ContextVar(
    "aioload_collate_allocator", default=None
)
IN_PLACE_MIN_BYTES = 64 << 10  # below this a copy costs less than finding room


def active_allocator() -> Allocator | None:
    """The ``allocate`` of the innermost :func:`collate_into` block around the caller, or None."""
    return _allocator.get()


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
    if elem.nbytes * len(batch) < IN_PLACE_MIN_BYTES:
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
    batch: Sequence[Any], *, collate_fn_map: CollateFnMap | None = None
) -> np.ndarray[Any, Any]:
    """Collate numpy scalars (``np.float32(1)``, ``np.bool_(True)``, ...) into an array of their
    dtype."""
    return _numeric_array(batch, collate_fn_map)


def collate_float_fn(
    batch: Sequence[Any], *, collate_fn_map: CollateFnMap | None = None
) -> np.ndarray[Any, Any]:
    """Collate Python floats into a ``float64`` array."""
    out = _numeric_array(batch, collate_fn_map)
    return out if out.dtype.kind == "c" else out.astype(np.float64, copy=False)


def collate_int_fn(
    batch: Sequence[Any], *, collate_fn_map: CollateFnMap | None = None
) -> np.ndarray[Any, Any]:
    """Collate Python ints into an ``int64`` array (all-``bool`` batches into a ``bool`` array;
    an int mixed with floats promotes to ``float64``)."""
    out = _numeric_array(batch, collate_fn_map)
    # NumPy turns ints beyond int64 into uint64, or float64 next to negative ones: lossy.
    if out.dtype.kind in "uf" and _all_ints(batch):
        raise int64_overflow_error(batch)
    if out.dtype.kind == "i" and out.dtype != np.int64:
        # NumPy 1.x on Windows infers int32; the documented dtype is int64 everywhere.
        out = out.astype(np.int64)
    return out


def collate_str_fn(batch: Sequence[Any], *, collate_fn_map: CollateFnMap | None = None) -> Any:
    """Return a batch of ``str`` or ``bytes`` unchanged."""
    return batch


def collate_tensor_fn(batch: Sequence[Any], *, collate_fn_map: CollateFnMap | None = None) -> Any:
    """Stack a batch of torch tensors with ``torch.stack`` (torch is imported only here).

    Under :func:`collate_into` (in a worker process) large CPU tensors are stacked into the
    room it gives, as numpy arrays are, so the batch travels through shared memory uncopied.
    """
    import torch

    allocate = _allocator.get()
    if allocate is not None:
        stacked = _stack_tensors_into(torch, batch, allocate)
        if stacked is not None:
            return stacked
    return torch.stack(list(batch), 0)


def _stack_tensors_into(torch: Any, batch: Sequence[Any], allocate: Allocator) -> Any:
    elem = batch[0]
    if elem.nbytes * len(batch) < IN_PLACE_MIN_BYTES:
        return None
    for tensor in batch:
        if (
            type(tensor) is not torch.Tensor
            or tensor.device.type != "cpu"
            or tensor.layout != torch.strided
            or tensor.requires_grad
            or tensor.dtype != elem.dtype
            or tensor.shape != elem.shape
        ):
            return None  # torch.stack's rules (and errors) apply
    try:
        dtype = torch.empty(0, dtype=elem.dtype).numpy().dtype
    except (TypeError, RuntimeError):  # no numpy dtype for it (bfloat16, quantized)
        return None
    room = allocate((len(batch), *elem.shape), dtype)
    if room is None:
        return None
    out = torch.from_numpy(room)
    torch.stack(list(batch), 0, out=out)
    return out


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


def _holds_tensor(sample: Any, tensor: type) -> bool:
    """Whether a sample's leaves (through mappings and sequences) include a ``tensor``."""
    if isinstance(sample, tensor):
        return True
    if isinstance(sample, str | bytes | np.ndarray | np.generic):
        return False
    if isinstance(sample, collections.abc.Mapping):
        return any(_holds_tensor(value, tensor) for value in sample.values())
    if isinstance(sample, collections.abc.Sequence):
        return any(_holds_tensor(item, tensor) for item in sample)
    return False


def holds_torch_tensor(sample: Any) -> bool:
    """Whether torch is imported and ``sample`` holds a torch tensor (torch is not imported)."""
    torch = sys.modules.get("torch")
    return torch is not None and _holds_tensor(sample, torch.Tensor)


def _as_tensors(fn: Callable[..., Any]) -> Callable[..., Any]:
    def collate_as_tensor(
        batch: Sequence[Any], *, collate_fn_map: CollateFnMap | None = None
    ) -> Any:
        out = fn(batch, collate_fn_map=collate_fn_map)
        try:
            return sys.modules["torch"].from_numpy(out)
        except TypeError:  # a dtype torch has no tensor for (datetimes): left as numpy
            return out

    collate_as_tensor.__name__ = collate_as_tensor.__qualname__ = f"{fn.__name__}_as_tensor"
    return collate_as_tensor


def tensor_leaves_fn_map(fn_map: CollateFnMap) -> dict[Any, Callable[..., Any]]:
    """``fn_map`` with the built-in numeric functions turning their arrays into tensors.

    What :func:`~aioload.collate.core.default_collate` uses for a batch whose samples hold torch
    tensors: numbers and numpy leaves then become tensors too, as under torch's
    ``default_collate`` (``int`` -> ``int64``, ``float`` -> ``float64``, arrays keep their
    dtype), and a ``y`` of ints next to an ``x`` of tensors is a tensor, not an array.
    """
    return {key: _TENSOR_FNS.get(fn, fn) for key, fn in fn_map.items()}


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
    batch: Sequence[Any], collate_fn_map: CollateFnMap | None
) -> np.ndarray[Any, Any]:
    try:
        out = np.array(batch)
    except ValueError as exc:  # an array or a list among the numbers
        raise _number_batch_error(batch, collate_fn_map) from exc
    if out.dtype.kind in _NUMERIC_KINDS:
        return out
    if _all_ints(batch):
        raise int64_overflow_error(batch)
    raise _number_batch_error(batch, collate_fn_map)


_NUMBER_TYPES = (int, float, complex, np.bool_, np.number, np.datetime64, np.timedelta64)


def _number_batch_error(batch: Sequence[Any], collate_fn_map: CollateFnMap | None) -> TypeError:
    for i, x in enumerate(batch):
        if not isinstance(x, _NUMBER_TYPES):
            if not _collatable(x, collate_fn_map):
                return unsupported_type_error(type(x), i, CollateTypeError)
            return located_error(
                TypeError,
                "collate: a batch of numbers must hold only numbers; "
                f"found {type(x)}{FIELD_SLOT} at {entry_slot(i)}",
            )
    found = ", ".join(sorted({type(x).__name__ for x in batch}))
    return located_error(
        TypeError, f"collate: a batch of numbers must hold only numbers; found {found}{FIELD_SLOT}"
    )


def _all_ints(batch: Sequence[Any]) -> bool:
    return all(isinstance(x, int | np.integer) for x in batch)


def _collatable(x: Any, collate_fn_map: CollateFnMap | None) -> bool:
    """Whether ``collate`` has a rule for ``x``: a registered type or a container."""
    fn_map = default_collate_fn_map if collate_fn_map is None else collate_fn_map
    if type(x) in fn_map or any(isinstance(x, key) for key in fn_map):
        return True
    return isinstance(x, collections.abc.Mapping) or (
        isinstance(x, collections.abc.Sequence) and not isinstance(x, str | bytes)
    )


def _array_batch_error(
    batch: Sequence[Any], collate_fn_map: CollateFnMap | None
) -> Exception | None:
    """Why a batch of arrays cannot be stacked: an uncollatable entry, a shape or a dtype."""
    for i, x in enumerate(batch):
        if not _collatable(x, collate_fn_map):
            return unsupported_type_error(type(x), i, CollateTypeError)
    ragged = ragged_shapes_error(batch)
    if ragged is not None:
        return ragged
    for i, x in enumerate(batch):
        dtype = getattr(x, "dtype", None)
        if dtype is not None and dtype.kind in _STR_OBJ_KINDS:
            return unsupported_type_error(dtype, i)
    return None


_TENSOR_FNS: dict[Callable[..., Any], Callable[..., Any]] = {
    fn: _as_tensors(fn)
    for fn in (collate_numpy_array_fn, collate_numpy_scalar_fn, collate_float_fn, collate_int_fn)
}
