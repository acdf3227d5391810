"""Reading a batch and stacking it at once: each sample goes into the batch as soon as it is read.

:func:`default_collate` gets the list of a batch's samples and stacks them: every sample is
alive until the stack, so a batch of 16 arrays of 1 MiB is written twice at full size (the
samples, then the batch) and read once, 48 MiB of memory traffic that does not fit in the
caches. :func:`collate_as_read` reads the samples one by one and copies each into its row of
the batch at once, while it is still in the cache, then lets it go, so the next sample is
made in the memory the last one freed: the samples' 16 MiB become one sample's 1 MiB.

It does so only where the result is certainly :func:`default_collate`'s: under
:func:`~aioload.collate.fns.collate_into` (a worker's shared segment gives the room), for
samples that are plain numpy arrays of one numeric dtype and one shape, large enough to be
stacked into that room, with the registry's array function still the built-in one; or plain
``dict`` or ``tuple`` samples (``(image, label)``; no torch tensor in them, no registry entry
for them), whose fields of such arrays are stacked as read and whose other fields are
collated at the end as :func:`default_collate` collates them. The first sample that breaks
the pattern (another shape, dtype or type, other keys, another key order or length) sends the
batch back to :func:`default_collate`, with the rows already copied as the samples they were:
same values, dtype and shape, so the same result or the same error. Anything else
(namedtuples, lists, small arrays, a registry entry of the user's) is :func:`default_collate`
of the list.

One difference shows only with a dataset that returns one buffer of its own and overwrites it
at the next call: the list would hold that buffer's last contents in every row (as under
torch), the batch stacked as read holds each row as it was read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence, Sized
from typing import Any

import numpy as np

from aioload.collate.core import collate, default_collate
from aioload.collate.fns import (
    IN_PLACE_MIN_BYTES,
    active_allocator,
    collate_numpy_array_fn,
    default_collate_fn_map,
    holds_torch_tensor,
)

__all__ = ["collate_as_read"]

_NUMERIC_KINDS = frozenset("biufcmM")  # what np.stack copies byte for byte, unconverted


def collate_as_read(getitem: Callable[[Any], Any], keys: Iterable[Any]) -> Any:
    """``default_collate([getitem(key) for key in keys])``, each sample stacked as it is read.

    Args:
        getitem: reads one sample (a dataset's ``__getitem__``).
        keys: the batch's keys, at least one.

    The samples are read in key order, as in the list; an error of ``getitem`` propagates as
    it would from the list (the rows copied so far are simply dropped). See the module
    docstring for when the samples are stacked as they come.

    Example::

        with collate_into(arena.allocate):
            batch = collate_as_read(dataset.__getitem__, [0, 1, 2, 3])
    """
    count = len(keys) if isinstance(keys, Sized) else 0
    allocate = active_allocator()
    if count == 0 or allocate is None:
        return default_collate([getitem(key) for key in keys])
    remaining = iter(keys)
    first = getitem(next(remaining))
    # The first sample goes to the functions below in a list they empty, so that no frame
    # here keeps it alive once its row is copied (the next sample reuses its memory).
    if _stackable(first, count):
        out = allocate((count, *first.shape), first.dtype)
        if out is not None:
            held = [first]
            del first
            return _arrays_as_read(held, out, getitem, remaining)
    elif (type(first) is dict or type(first) is tuple) and _fields_go_through(first):
        names = list(first) if type(first) is dict else list(range(len(first)))
        outs = {}
        for name in names:
            if _stackable(first[name], count):
                room = allocate((count, *first[name].shape), first[name].dtype)
                if room is not None:
                    outs[name] = room
        if outs:
            held = [first]
            del first
            return _fields_as_read(held, names, outs, getitem, remaining)
    return default_collate([first, *(getitem(key) for key in remaining)])


def _arrays_as_read(
    held: list[np.ndarray[Any, Any]],
    out: np.ndarray[Any, Any],
    getitem: Callable[[Any], Any],
    remaining: Iterator[Any],
) -> Any:
    """The batch of array samples (the first in ``held``), each copied into its row of
    ``out`` as it is read."""
    first = held.pop()
    shape, dtype = first.shape, first.dtype
    out[0] = first
    del first  # freed now: the next sample is made in its memory, still in the cache
    for row in range(1, len(out)):
        sample = getitem(next(remaining))
        if type(sample) is not np.ndarray or sample.shape != shape or sample.dtype != dtype:
            # Not all alike: default_collate's rules (promotion, its errors) on the samples
            # as read; the rows already copied stand for theirs (same dtype, shape, bytes).
            samples = [out[done] for done in range(row)]
            samples.append(sample)
            samples.extend(getitem(key) for key in remaining)
            return default_collate(samples)
        out[row] = sample
        del sample
    return out


def _fields_as_read(
    held: list[Any],
    names: list[Any],
    outs: dict[Any, np.ndarray[Any, Any]],
    getitem: Callable[[Any], Any],
    remaining: Iterator[Any],
) -> Any:
    """The batch of dict (or plain tuple) samples: the fields (positions) in ``outs`` copied
    into their rows as read, the others collated at the end, as :func:`default_collate`
    collates a mapping's fields (a tuple's positions, into a list). The first is in
    ``held``."""
    first = held.pop()
    kind = type(first)
    count = len(next(iter(outs.values())))
    specs = {name: (first[name].shape, first[name].dtype) for name in outs}
    kept: dict[Any, list[Any]] = {name: [] for name in names if name not in outs}
    sample: Any = first
    del first
    for row in range(count):
        if row:
            sample = getitem(next(remaining))
            if not _fits(sample, kind, names) or not _alike(sample, specs):
                return _fall_back(kind, outs, kept, names, row, sample, getitem, remaining)
        for name, out in outs.items():
            out[row] = sample[name]
        for name, values_so_far in kept.items():
            values_so_far.append(sample[name])
        del sample
    values: dict[Any, Any] = {}
    try:
        for name in names:
            if name in outs:
                values[name] = outs[name]
            else:
                # The column as collate hands it on: a mapping's field as a list, a tuple's
                # position as a tuple (zip's), which str and bytes leaves come back as.
                column: Sequence[Any] = kept[name] if kind is dict else tuple(kept[name])
                values[name] = collate(column, collate_fn_map=default_collate_fn_map)
    except Exception:  # default_collate raises it again, naming the field and the entry
        return _fall_back(kind, outs, kept, names, count, None, getitem, remaining)
    # What collate rebuilds an exact dict as (its fields in the first's order), a tuple as.
    return values if kind is dict else list(values.values())


def _fits(sample: Any, kind: type[Any], names: list[Any]) -> bool:
    """Whether ``sample`` has the first sample's type and fields, in the same order."""
    if type(sample) is not kind:
        return False
    return list(sample) == names if kind is dict else len(sample) == len(names)


def _fall_back(
    kind: type,
    outs: dict[Any, np.ndarray[Any, Any]],
    kept: dict[Any, list[Any]],
    names: list[Any],
    row: int,
    sample: Any,
    getitem: Callable[[Any], Any],
    remaining: Iterator[Any],
) -> Any:
    """:func:`default_collate` of the samples as read: the first ``row`` rebuilt from their
    rows and kept fields (the same values, as a ``kind``), then ``sample`` (unless None: all
    were read), then the rest."""
    samples: list[Any] = []
    for done in range(row):
        fields = {name: outs[name][done] if name in outs else kept[name][done] for name in names}
        samples.append(fields if kind is dict else tuple(fields.values()))
    if row < len(next(iter(outs.values()))):
        samples.append(sample)
        samples.extend(getitem(key) for key in remaining)
    return default_collate(samples)


def _alike(sample: Any, specs: dict[Any, tuple[tuple[int, ...], np.dtype[Any]]]) -> bool:
    for name, (shape, dtype) in specs.items():
        value = sample[name]
        if type(value) is not np.ndarray or value.shape != shape or value.dtype != dtype:
            return False
    return True


def _fields_go_through(first: dict[Any, Any] | tuple[Any, ...]) -> bool:
    """Whether ``default_collate`` takes a batch of samples like ``first`` apart field by
    field with the built-in rules: no registry entry for their type, no torch tensor inside."""
    return not holds_torch_tensor(first) and not any(
        isinstance(first, key) for key in default_collate_fn_map
    )


def _stackable(first: Any, count: int) -> bool:
    """Whether ``default_collate`` of ``count`` samples like ``first`` stacks them into room."""
    return (
        type(first) is np.ndarray
        and first.dtype.kind in _NUMERIC_KINDS
        and first.nbytes * count >= IN_PLACE_MIN_BYTES
        # The engine looks the exact type up first: a function of the user's for arrays wins.
        and default_collate_fn_map.get(np.ndarray) is collate_numpy_array_fn
    )
