"""A read-only list whose items live in two numpy arrays, so workers share it instead of copying.

A plain Python list of dicts or strings in a dataset grows the memory of every
worker over an epoch, even under ``fork`` and even though nothing writes it
(torch's "copy-on-read" problem, pytorch#13246): reading an item updates its
reference count, which writes the page it lies on, and the kernel copies
every page so touched into the worker. :class:`SharedList` holds the pickled
items in one ``uint8`` array and their offsets in one ``int64`` array, and
unpickles an item only when it is read. Two objects, whatever the number of
items: under ``fork`` the workers inherit the arrays' pages without touching
them, and under ``forkserver`` or ``spawn`` the arrays reach the workers out of
band, in the shared-memory segment of the worker setup (see
:mod:`aioload.backends.processes.setup_parcel`), not as copies.
"""

from __future__ import annotations

import operator
import pickle
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TypeVar, overload

import numpy as np

__all__ = ["SharedList"]

T_co = TypeVar("T_co", covariant=True)


class SharedList(Sequence[T_co]):
    """A read-only sequence of picklable items, stored as one buffer and unpickled on read.

    Use it for the dataset's own index — a list of dicts, file names, captions,
    labels — that worker processes read: unlike a list, it does not grow each
    worker's memory as the worker reads it, and it reaches ``forkserver`` and
    ``spawn`` workers as a handle to shared memory, not as a copy.

    Args:
        items: any iterable of picklable items; each is pickled once, here.

    Raises:
        TypeError: ``items`` is not iterable, or an item cannot be pickled
            (the message names its index).

    Reading: ``shared[i]`` (negative ``i`` counts from the end; ``IndexError``
    out of range) unpickles item ``i`` alone, so each read returns a new copy
    and changing it changes nothing stored. A slice returns a plain ``list`` of
    the items (build a new ``SharedList`` from it to share a subset). ``len``,
    iteration, ``in``, ``index`` and ``count`` work as on any sequence. Having
    ``__getitem__`` and ``__len__``, it is a map-style dataset by itself.

    Example::

        >>> records = SharedList([{"path": "a.jpg", "label": 3}, {"path": "b.jpg", "label": 1}])
        >>> records[-1]
        {'path': 'b.jpg', 'label': 1}
        >>> len(records), records[:1]
        (2, [{'path': 'a.jpg', 'label': 3}])
        >>> from aioload import DataLoader
        >>> loader = DataLoader(records, batch_size=64, num_workers=2)   # shared, not copied
    """

    __slots__ = ("_data", "_offsets", "_view")

    def __init__(self, items: Iterable[T_co]) -> None:
        try:
            iterator = iter(items)
        except TypeError:
            raise TypeError(
                f"SharedList takes an iterable of items, not {type(items).__qualname__}"
            ) from None
        pickles: list[bytes] = []
        for index, item in enumerate(iterator):
            try:
                pickles.append(pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL))
            except Exception as error:
                raise TypeError(
                    f"SharedList cannot hold item {index} (a {type(item).__module__}."
                    f"{type(item).__qualname__}): it cannot be pickled: {error}"
                ) from error
        offsets = np.zeros(len(pickles) + 1, dtype=np.int64)
        lengths = np.fromiter(map(len, pickles), dtype=np.int64, count=len(pickles))
        np.cumsum(lengths, out=offsets[1:])
        self._set(offsets, np.frombuffer(b"".join(pickles), dtype=np.uint8))

    def _set(self, offsets: np.ndarray[Any, Any], data: np.ndarray[Any, Any]) -> None:
        offsets.flags.writeable = False  # read-only, also where it was unpickled writable
        data.flags.writeable = False
        self._offsets = offsets
        self._data = data
        self._view = data.data  # slicing a memoryview is cheaper than slicing the array

    def __len__(self) -> int:
        return len(self._offsets) - 1

    @overload
    def __getitem__(self, index: int) -> T_co: ...

    @overload
    def __getitem__(self, index: slice) -> list[T_co]: ...

    def __getitem__(self, index: int | slice) -> T_co | list[T_co]:
        if isinstance(index, slice):
            return [self._item(i) for i in range(*index.indices(len(self)))]
        try:
            position = operator.index(index)
        except TypeError:
            raise TypeError(
                f"SharedList indices must be integers or slices, not {type(index).__qualname__}"
            ) from None
        length = len(self)
        if position < 0:
            position += length
        if not 0 <= position < length:
            raise IndexError(f"SharedList index {index} out of range for {length} items")
        return self._item(position)

    def _item(self, position: int) -> T_co:
        start, stop = self._offsets[position : position + 2].tolist()
        item: T_co = pickle.loads(self._view[start:stop])
        return item

    def __iter__(self) -> Iterator[T_co]:
        for position in range(len(self)):
            yield self._item(position)

    def __repr__(self) -> str:
        return f"SharedList({len(self)} items, {_size(self._data.nbytes + self._offsets.nbytes)})"

    def __reduce__(self) -> tuple[Any, ...]:
        # Two arrays: with pickle protocol 5 they can leave the pickle out of band,
        # so what is left in it is a few dozen bytes.
        return _rebuild, (self._offsets, self._data)


def _rebuild(offsets: np.ndarray[Any, Any], data: np.ndarray[Any, Any]) -> SharedList[Any]:
    shared: SharedList[Any] = SharedList.__new__(SharedList)
    shared._set(offsets, data)
    return shared


_UNITS = ("bytes", "KiB", "MiB", "GiB", "TiB")


def _size(nbytes: int) -> str:
    exponent = min(len(_UNITS) - 1, max(0, nbytes.bit_length() - 1) // 10)
    if exponent == 0:
        return f"{nbytes} bytes"
    return f"{nbytes / 1024**exponent:.1f} {_UNITS[exponent]}"
