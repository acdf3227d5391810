"""Datasets: the map-style and iterable-style containers that a loader reads.

The classes mirror ``torch.utils.data``'s, over numpy and without torch, and
accept coroutine-based datasets too: a map-style dataset may define
``async def __getitem__`` (and/or ``async def __getitems__``), an iterable one
may define ``__aiter__``. :mod:`aioload.data.protocol` tells the loader which protocol a
dataset speaks.

As in torch, subclassing is optional: any object with ``__getitem__`` is a
map-style dataset, and any object with ``__iter__`` or ``__aiter__`` but no
``__getitem__`` is an iterable one.

This module holds the map-style datasets; the iterable-style ones (:class:`IterableDataset`,
:class:`ChainDataset`) are in :mod:`aioload.data.iterable` and importable from here.
"""

from __future__ import annotations

import bisect
import inspect
import math
import warnings
from collections.abc import Iterable, Sequence
from typing import Any, Generic, TypeVar, overload

import numpy as np

from aioload.checks import is_integral
from aioload.data.iterable import (
    ChainDataset,
    IterableDataset,
    has_len,
    is_iterable_dataset,
)
from aioload.errors import DatasetKindError
from aioload.samplers.builtin import GeneratorLike, as_generator, split_order

__all__ = [
    "ArrayDataset",
    "ChainDataset",
    "ConcatDataset",
    "Dataset",
    "IterableDataset",
    "StackDataset",
    "Subset",
    "TensorDataset",
    "getitem_is_async",
    "random_split",
]

T_co = TypeVar("T_co", covariant=True)
T = TypeVar("T")
# A StackDataset's sample: a tuple (datasets given by position) or a dict (by keyword), as torch's.
T_stack = TypeVar("T_stack", tuple[Any, ...], dict[str, Any])


def _getitems_per_key(self: Any, indices: Sequence[Any]) -> list[Any]:
    """``__getitems__`` of a subclass that overrides only ``__getitem__``: one call per key.

    The items of an async ``__getitem__`` stay awaitables; the loader awaits them concurrently.
    """
    return [self[index] for index in indices]


def _honour_getitem_override(cls: type[Any], base: type[Any]) -> None:
    """Makes ``cls`` read batches through its own ``__getitem__`` when it overrides only that.

    The loader prefers ``__getitems__``: a subclass of ``base`` that overrides ``__getitem__``
    but inherits ``base``'s batched read would otherwise get ``base``'s items from the loader
    and its own from ``dataset[i]``.
    """
    if cls.__getitem__ is not base.__getitem__ and cls.__getitems__ is base.__getitems__:
        type.__setattr__(cls, "__getitems__", _getitems_per_key)


class Dataset(Generic[T_co]):
    """An abstract map-style dataset: a mapping from keys to samples.

    Subclasses override ``__getitem__`` (sync or ``async def``) and usually
    ``__len__``, which samplers and the loader use for the dataset's size. They
    may also define ``__getitems__(keys)`` to read a whole batch at once (a bulk
    database query, one read of a contiguous block); the loader then calls it
    instead of ``__getitem__`` once per key.

    ``a + b`` concatenates two datasets into a :class:`ConcatDataset`.

    Example::

        >>> class Squares(Dataset[int]):
        ...     def __getitem__(self, i): return i * i
        ...     def __len__(self): return 10
        >>> Squares()[3]
        9
        >>> len(Squares() + Squares())
        20
    """

    def __getitem__(self, index: Any) -> T_co:
        raise NotImplementedError("Subclasses of Dataset should implement __getitem__.")

    def __add__(self, other: Dataset[T_co]) -> ConcatDataset[T_co]:
        return ConcatDataset([self, other])


def _as_rows(array: Any) -> int:
    shape = getattr(array, "shape", None)
    if shape is None:
        if not has_len(array):
            raise TypeError(
                "ArrayDataset needs arrays (objects with a shape or a length); "
                f"got {type(array).__name__}"
            )
        return len(array)
    if len(shape) == 0:
        raise ValueError("ArrayDataset needs arrays with at least one dimension; got a 0-d array")
    return int(shape[0])


class ArrayDataset(Dataset[tuple[Any, ...]]):
    """A dataset of rows of equally long arrays (torch's ``TensorDataset``).

    Sample ``i`` is ``tuple(array[i] for array in arrays)``.

    Args:
        *arrays: numpy arrays (or anything indexable with a ``shape`` or a
            ``len``) whose first dimensions are equal.

    The loader reads a batch with one fancy-indexing read per numpy array
    (``__getitems__``). A subclass that overrides ``__getitem__`` alone (to
    transform samples, say) is read through its ``__getitem__``, key by key, as
    torch's ``TensorDataset`` subclasses are; override ``__getitems__`` too to
    keep the batched read.

    Example::

        >>> import numpy as np
        >>> ds = ArrayDataset(np.arange(6).reshape(3, 2), np.array([0, 1, 0]))
        >>> ds[1]
        (array([2, 3]), np.int64(1))
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _honour_getitem_override(cls, ArrayDataset)

    def __init__(self, *arrays: Any) -> None:
        if not arrays:
            raise ValueError("ArrayDataset needs at least one array")
        sizes = [_as_rows(a) for a in arrays]
        if any(size != sizes[0] for size in sizes):
            raise ValueError(
                f"Size mismatch between tensors: first dimensions are {sizes}; "
                "all arrays must have the same size in the first dimension"
            )
        self.arrays = arrays
        self.tensors = arrays  # torch's attribute name

    def __getitem__(self, index: Any) -> tuple[Any, ...]:
        return tuple(array[index] for array in self.arrays)

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[Any, ...]]:
        # One fancy-indexing read per numpy array instead of one per key; other
        # arrays (lists, tensors) are read per key so that samples keep the types
        # ``__getitem__`` gives them.
        keys = np.asarray(indices, dtype=np.intp)
        columns = [
            array[keys] if isinstance(array, np.ndarray) else [array[k] for k in indices]
            for array in self.arrays
        ]
        return list(zip(*columns, strict=True))

    def __len__(self) -> int:
        return _as_rows(self.arrays[0])


TensorDataset = ArrayDataset


class StackDataset(Dataset[T_stack]):
    """Stacks several datasets of equal length into one of tuples or dicts.

    Pass the datasets positionally for tuple samples, or as keywords for dict
    samples (not both). Members may be async datasets: then the items of the
    stack are awaitable and resolve to the tuple or dict.

    A batch (``__getitems__``, which the loader calls) is read with each
    member's own ``__getitems__`` where it has one, else key by key, as in
    torch; a member whose ``__getitems__`` returns a list of the wrong length
    raises ``ValueError``. A subclass that overrides ``__getitem__`` alone is
    read through its ``__getitem__``, key by key.

    Args:
        *args: map-style datasets of equal length, for tuple samples.
        **kwargs: map-style datasets of equal length, for dict samples.

    Example::

        >>> images, labels = [10, 11, 12], [0, 1, 0]
        >>> StackDataset(images, labels)[1]
        (11, 1)
        >>> StackDataset(image=images, label=labels)[2]
        {'image': 12, 'label': 0}
        >>> StackDataset(images, labels).__getitems__([0, 2])
        [(10, 0), (12, 0)]
    """

    datasets: tuple[Any, ...] | dict[str, Any]

    @overload
    def __init__(self: StackDataset[tuple[Any, ...]], *args: Any) -> None: ...

    @overload
    def __init__(self: StackDataset[dict[str, Any]], **kwargs: Any) -> None: ...

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if args and kwargs:
            raise ValueError(
                "Supported either ``tuple``- (via ``args``) or "
                "``dict``- (via ``kwargs``) like input/output, but both types are given."
            )
        members: list[Any] = list(args) if args else list(kwargs.values())
        if not members:
            raise ValueError("At least one dataset should be passed")
        for member in members:
            if is_iterable_dataset(member) or not has_len(member):
                raise TypeError(
                    f"StackDataset members must be map-style datasets with a length; "
                    f"got {type(member).__name__}"
                )
        self._length = len(members[0])
        if any(len(m) != self._length for m in members):
            raise ValueError("Size mismatch between datasets")
        self.datasets = tuple(args) if args else dict(kwargs)
        self._keys: list[str] | None = None if args else list(kwargs)
        self._members = members
        self._async = any(_reads_are_async(m) for m in members)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _honour_getitem_override(cls, StackDataset)

    def __getitem__(self, index: Any) -> Any:
        parts = [member[index] for member in self._members]
        if self._async:
            return self._gather(parts)
        return self._assemble(parts)

    def __getitems__(self, indices: Sequence[Any]) -> Any:
        """The samples at ``indices``, each member read in one call where it can be.

        Returns a list of tuples or dicts; over async members, an awaitable of that list.

        Raises:
            ValueError: a member's ``__getitems__`` returned a list of another length.
        """
        columns = [self._read_column(member, indices) for member in self._members]
        if self._async:
            return self._gather_batch(columns, len(indices))
        for column in columns:
            _check_column_length(column, len(indices))
        return [self._assemble(list(parts)) for parts in zip(*columns, strict=True)]

    @staticmethod
    def _read_column(member: Any, indices: Sequence[Any]) -> Any:
        getitems = getattr(member, "__getitems__", None)
        if callable(getitems):
            return getitems(indices)
        return [member[index] for index in indices]

    async def _gather_batch(self, columns: list[Any], size: int) -> list[Any]:
        resolved: list[list[Any]] = []
        for column in columns:
            if inspect.isawaitable(column):
                column = await column
            _check_column_length(column, size)
            resolved.append([await p if inspect.isawaitable(p) else p for p in column])
        return [self._assemble(list(parts)) for parts in zip(*resolved, strict=True)]

    async def _gather(self, parts: list[Any]) -> Any:
        return self._assemble([await p if inspect.isawaitable(p) else p for p in parts])

    def _assemble(self, parts: list[Any]) -> Any:
        if self._keys is None:
            return tuple(parts)
        return dict(zip(self._keys, parts, strict=True))

    def __len__(self) -> int:
        return self._length


def _check_column_length(column: Any, size: int) -> None:
    if len(column) != size:
        raise ValueError(
            f"Nested dataset's output size mismatch. Expected {size}, got {len(column)}: "
            "a member's __getitems__ must return one sample per index"
        )


def _reads_are_async(dataset: Any) -> bool:
    """Whether reading ``dataset`` by key or by batch may give awaitables."""
    getitems = getattr(type(dataset), "__getitems__", None)
    if getitem_is_async(dataset) or inspect.iscoroutinefunction(getitems):
        return True
    # Subset.__getitems__ forwards to the parent's, which may be async.
    return isinstance(dataset, Subset) and _reads_are_async(dataset.dataset)


def getitem_is_async(dataset: Any) -> bool:
    """Whether ``dataset[key]`` may give an awaitable: an ``async def __getitem__``, or a
    :class:`ConcatDataset`, :class:`StackDataset` or :class:`Subset` over an async member.

    Args:
        dataset: a map-style dataset.

    Example::

        >>> class Remote:
        ...     async def __getitem__(self, key): ...
        >>> getitem_is_async(Remote()), getitem_is_async(Subset(Remote(), [0]))
        (True, True)
        >>> getitem_is_async([1, 2])
        False
    """
    # A subclass's own ``async def __getitem__`` counts as much as async members do.
    method = getattr(type(dataset), "__getitem__", None)
    if method is not None and inspect.iscoroutinefunction(method):
        return True
    if isinstance(dataset, (ConcatDataset, StackDataset)):
        return dataset._async
    if isinstance(dataset, Subset):
        return getitem_is_async(dataset.dataset)
    return False


class ConcatDataset(Dataset[T_co]):
    """Concatenates map-style datasets end to end.

    Indices run through the members in order; negative indices count from the
    end. Members may be async datasets: the item for index ``i`` is awaitable
    exactly when the member that holds ``i`` is async.

    Args:
        datasets: map-style datasets with a length (iterable datasets belong
            in a :class:`ChainDataset`).

    Example::

        >>> ds = ConcatDataset([[0, 1], [2, 3, 4]])
        >>> ds.cumulative_sizes, ds[3], ds[-1]
        ([2, 5], 3, 4)
    """

    datasets: list[Any]
    cumulative_sizes: list[int]

    @staticmethod
    def cumsum(sequence: Iterable[Any]) -> list[int]:
        """Running totals of the members' lengths."""
        totals: list[int] = []
        running = 0
        for member in sequence:
            running += len(member)
            totals.append(running)
        return totals

    def __init__(self, datasets: Iterable[Any]) -> None:
        self.datasets = list(datasets)
        if not self.datasets:
            raise ValueError("datasets should not be an empty iterable")
        for member in self.datasets:
            if is_iterable_dataset(member):
                raise DatasetKindError(
                    "ConcatDataset does not support IterableDataset members "
                    f"(got {type(member).__name__}); use ChainDataset for iterable datasets"
                )
            if not has_len(member):
                raise TypeError(
                    f"ConcatDataset members need a length; {type(member).__name__} has no __len__"
                )
        self.cumulative_sizes = self.cumsum(self.datasets)
        self._async = any(getitem_is_async(m) for m in self.datasets)

    def __len__(self) -> int:
        return self.cumulative_sizes[-1]

    def __getitem__(self, idx: int) -> Any:
        member, local = self._locate(idx)
        return self.datasets[member][local]

    def _locate(self, idx: int) -> tuple[int, int]:
        if idx < 0:
            if -idx > len(self):
                raise ValueError("absolute value of index should not exceed dataset length")
            idx = len(self) + idx
        member = bisect.bisect_right(self.cumulative_sizes, idx)
        if member >= len(self.datasets):
            raise IndexError(f"index {idx} is out of range for a dataset of length {len(self)}")
        start = self.cumulative_sizes[member - 1] if member > 0 else 0
        return member, idx - start


class Subset(Dataset[T_co]):
    """The part of a dataset at the given indices.

    The loader reads a batch through ``__getitems__``, which forwards to the
    parent's. So, as in torch, a subclass that overrides ``__getitem__`` must
    override ``__getitems__`` too (else constructing it raises
    ``NotImplementedError``); ``[self[i] for i in indices]`` will do.

    Args:
        dataset: the whole dataset (sync or async).
        indices: indices into ``dataset``, in the order of the subset.

    Raises:
        NotImplementedError: the class overrides ``__getitem__`` but not ``__getitems__``.

    Example::

        >>> Subset(["a", "b", "c", "d"], [3, 0])[0]
        'd'
    """

    def __init__(self, dataset: Any, indices: Sequence[int]) -> None:
        self.dataset = dataset
        self.indices = indices
        # Inheriting the forwarding __getitems__ would make the loader yield the parent's
        # items, not the override's; torch refuses such a subclass here, so do we.
        kind = type(self)
        if kind.__getitem__ is not Subset.__getitem__ and kind.__getitems__ is Subset.__getitems__:
            raise NotImplementedError(
                f"{kind.__name__} overrides __getitem__ but not __getitems__. When subclassing "
                "Subset and overriding __getitem__, you must also override __getitems__, which "
                "the DataLoader reads batches through, or it would get the parent's items. "
                "A simple implementation:\n\n"
                "def __getitems__(self, indices):\n"
                "    return [self.__getitem__(idx) for idx in indices]"
            )

    def __getitem__(self, idx: Any) -> Any:
        if isinstance(idx, list):
            return self.dataset[[self.indices[i] for i in idx]]
        return self.dataset[self.indices[idx]]

    def __getitems__(self, indices: list[int]) -> Any:
        # Forward a batched read to the parent when it has one, as torch does.
        keys = [self.indices[i] for i in indices]
        getitems = getattr(self.dataset, "__getitems__", None)
        if callable(getitems):
            return getitems(keys)
        # Items of an async parent stay awaitables here; the loader awaits them
        # concurrently (see aioload.read.fetch).
        return [self.dataset[k] for k in keys]

    def __len__(self) -> int:
        return len(self.indices)


def random_split(
    dataset: Any,
    lengths: Sequence[int | float],
    generator: GeneratorLike = None,
) -> list[Subset[Any]]:
    """Randomly splits a dataset into non-overlapping subsets of given lengths.

    ``lengths`` are either integers summing to ``len(dataset)`` or fractions
    summing to 1; fractions become ``floor(frac * len(dataset))`` each, and the
    remainder is handed out one by one, round-robin, as torch does.

    Args:
        dataset: a map-style dataset with a length.
        lengths: sizes or fractions of the splits.
        generator: a ``torch.Generator`` (torch's ``randperm`` from it: torch's split), a
            ``numpy.random.Generator`` or an int seed (numpy's permutation); the same seed
            gives the same split. None (torch's default: its global generator) draws
            torch's ``randperm`` from torch's default generator when torch is imported
            (``torch.manual_seed(0)`` gives torch's split), else a numpy permutation seeded
            by numpy's global state (``np.random.seed(0)`` repeats it).

    Example::

        >>> [len(s) for s in random_split(range(30), [0.3, 0.3, 0.4], generator=42)]
        [9, 9, 12]
    """
    if isinstance(lengths, np.ndarray):
        lengths = lengths.tolist()
    if isinstance(lengths, (str, bytes)) or not isinstance(lengths, Sequence):
        raise TypeError(f"lengths must be a sequence of ints or floats; got {lengths!r}")
    if not lengths:
        raise ValueError("lengths must not be empty")
    n = len(dataset)
    if math.isclose(sum(lengths), 1) and sum(lengths) <= 1:
        lengths = _fractions_to_lengths(lengths, n)
    elif any(isinstance(x, float) for x in lengths):
        raise ValueError(
            f"lengths must be ints summing to the dataset's length ({n}) or fractions "
            f"summing to 1; got {list(lengths)!r} (sum {sum(lengths)})"
        )
    for length in lengths:
        if not is_integral(length):
            raise TypeError(f"lengths must be all ints or all fractions; got {list(lengths)!r}")
        if length < 0:
            raise ValueError(f"lengths must not be negative; got {list(lengths)!r}")
    if sum(lengths) != n:
        raise ValueError(
            "Sum of input lengths does not equal the length of the input dataset! "
            f"(lengths {list(lengths)} sum to {sum(lengths)}, the dataset has {n} items)"
        )
    order = split_order(n, as_generator(generator))
    splits: list[Subset[Any]] = []
    start = 0
    for length in lengths:
        splits.append(Subset(dataset, order[start : start + int(length)]))
        start += int(length)
    return splits


def _fractions_to_lengths(fractions: Sequence[int | float], n: int) -> list[int]:
    for frac in fractions:
        if not 0 <= frac <= 1:
            raise ValueError(f"Fraction at index {fractions.index(frac)} is not between 0 and 1")
    lengths = [math.floor(n * frac) for frac in fractions]
    for i in range(n - sum(lengths)):
        lengths[i % len(lengths)] += 1
    for i, length in enumerate(lengths):
        if length == 0:
            warnings.warn(
                f"Length of split at index {i} is 0. This might result in an empty dataset.",
                stacklevel=3,
            )
    return lengths
