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
stacked into that room, with the registry's array function still the built-in one. The
first sample that breaks the pattern (another shape, dtype or type) sends the batch back to
:func:`default_collate`, with the rows already copied as the samples they were: same values,
dtype and shape, so the same result or the same error. Anything else (dicts, tuples, small
arrays, a registry entry of the user's) is :func:`default_collate` of the list, as always.

One difference shows only with a dataset that returns one buffer of its own and overwrites it
at the next call: the list would hold that buffer's last contents in every row (as under
torch), the batch stacked as read holds each row as it was read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sized
from typing import Any

import numpy as np

from aioload.collate.core import default_collate
from aioload.collate.fns import (
    IN_PLACE_MIN_BYTES,
    active_allocator,
    collate_numpy_array_fn,
    default_collate_fn_map,
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
    if count == 0 or active_allocator() is None:
        return default_collate([getitem(key) for key in keys])
    allocate = active_allocator()
    assert allocate is not None
    remaining = iter(keys)
    first = getitem(next(remaining))
    if not _stackable(first, count):
        return default_collate([first, *(getitem(key) for key in remaining)])
    out = allocate((count, *first.shape), first.dtype)
    if out is None:  # no room: stacked as usual
        return default_collate([first, *(getitem(key) for key in remaining)])
    shape, dtype = first.shape, first.dtype
    out[0] = first
    del first  # freed now: the next sample is made in its memory, still in the cache
    for row in range(1, count):
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


def _stackable(first: Any, count: int) -> bool:
    """Whether ``default_collate`` of ``count`` samples like ``first`` stacks them into room."""
    return (
        type(first) is np.ndarray
        and first.dtype.kind in _NUMERIC_KINDS
        and first.nbytes * count >= IN_PLACE_MIN_BYTES
        # The engine looks the exact type up first: a function of the user's for arrays wins.
        and default_collate_fn_map.get(np.ndarray) is collate_numpy_array_fn
    )
