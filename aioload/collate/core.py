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

This module holds the engine and the containers' rules; the registry and the functions for
leaf types are in :mod:`aioload.collate.fns`, and the errors that name the field and the entry
in :mod:`aioload.collate.errors`. Their public names are importable from here.
"""

from __future__ import annotations

import collections.abc
import copy
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from aioload.collate.errors import (
    FIELD_SLOT,
    CollateTypeError,
    default_collate_err_msg_format,
    entry_slot,
    located_error,
    prepend_field,
    raise_if_not_all,
    unsupported_type_error,
)
from aioload.collate.fns import (
    Allocator,
    CollateFnMap,
    collate_float_fn,
    collate_int_fn,
    collate_into,
    collate_numpy_array_fn,
    collate_numpy_scalar_fn,
    collate_str_fn,
    collate_tensor_fn,
    default_collate_fn_map,
    holds_torch_tensor,
    tensor_leaves_fn_map,
)
from aioload.data.row_block import RowBlock

__all__ = [
    "Allocator",
    "CollateTypeError",
    "collate",
    "collate_float_fn",
    "collate_int_fn",
    "collate_into",
    "collate_numpy_array_fn",
    "collate_numpy_scalar_fn",
    "collate_str_fn",
    "collate_tensor_fn",
    "default_collate",
    "default_collate_err_msg_format",
    "default_collate_fn_map",
    "default_convert",
]


def collate(batch: Sequence[Any], *, collate_fn_map: CollateFnMap | None = None) -> Any:
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

    # The try blocks cost nothing until an error, which they locate (see prepend_field).
    if isinstance(elem, collections.abc.Mapping):
        values: dict[Any, Any] = {}
        name: Any = None
        try:
            for name in elem:
                values[name] = collate([d[name] for d in batch], collate_fn_map=collate_fn_map)
        except Exception as error:
            if not prepend_field(error, f"[{name!r}]"):
                raise_if_not_all(batch, collections.abc.Mapping, error)
            raise
        return rebuild_mapping(elem, values)
    if isinstance(elem, tuple) and hasattr(elem, "_fields"):
        fields = _transpose(batch)
        out: list[Any] = []
        try:
            for field in fields:
                out.append(collate(field, collate_fn_map=collate_fn_map))
        except Exception as error:
            prepend_field(error, f".{elem._fields[len(out)]}")
            raise
        return elem_type(*out)
    if isinstance(elem, collections.abc.Sequence) and not isinstance(elem, str | bytes):
        columns = _transpose(batch)
        out = []
        try:
            for column in columns:
                out.append(collate(column, collate_fn_map=collate_fn_map))
        except Exception as error:
            prepend_field(error, f"[{len(out)}]")
            raise
        if isinstance(elem, tuple):
            return out
        return rebuild_sequence(elem, out)

    raise unsupported_type_error(elem_type, 0)


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

    A batch whose first sample holds a torch tensor is collated as torch's ``default_collate``
    would: its numbers and numpy leaves become tensors too (``int`` -> ``int64``, ``float`` ->
    ``float64``, arrays keep their dtype; see
    :func:`~aioload.collate.fns.tensor_leaves_fn_map`), so tensor images with int labels give
    a tensor ``y``. Only ``sys.modules`` and the first sample are looked at: torch is never
    imported.

    Args:
        batch: a non-empty sequence of samples.

    Examples:
        >>> from collections import namedtuple
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
        >>> class Span:
        ...     def __init__(self, start, stop):
        ...         self.start, self.stop = start, stop
        >>> def custom_collate(batch):
        ...     if isinstance(batch[0], Span):
        ...         return np.array([[span.start, span.stop] for span in batch])
        ...     return default_collate(batch)
        >>> custom_collate([Span(0, 2), Span(5, 9)])
        array([[0, 2],
               [5, 9]])
        >>> # 2: register a function for the type, in place: every default_collate from
        >>> # then on uses it, inside containers too.
        >>> def collate_span_fn(batch, *, collate_fn_map=None):
        ...     return np.array([[span.start, span.stop] for span in batch])
        >>> default_collate_fn_map.update({Span: collate_span_fn})
        >>> default_collate([{"span": Span(0, 2), "y": 1}, {"span": Span(5, 9), "y": 0}])
        {'span': array([[0, 2],
               [5, 9]]), 'y': array([1, 0])}
        >>> del default_collate_fn_map[Span]   # (this example undoes it)
    """
    if isinstance(batch, RowBlock):  # a columnar batch collates itself, the same way
        return batch.collate()
    if len(batch) and holds_torch_tensor(batch[0]):
        return collate(batch, collate_fn_map=tensor_leaves_fn_map(default_collate_fn_map))
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
        >>> from collections import namedtuple
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


def _transpose(batch: Sequence[Any]) -> list[tuple[Any, ...]]:
    try:
        return list(zip(*batch, strict=True))
    except TypeError as exc:
        raise_if_not_all(batch, collections.abc.Sequence, exc)
        raise
    except ValueError:
        sizes = [len(sample) for sample in batch]
        if len(set(sizes)) == 1:
            raise
        entry = next(i for i, size in enumerate(sizes) if size != sizes[0])
        raise located_error(
            RuntimeError,
            f"each element in list of batch should be of equal size{FIELD_SLOT}: {entry_slot(0)} "
            f"has {sizes[0]} elements and {entry_slot(entry)} has {sizes[entry]}",
        ) from None


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
