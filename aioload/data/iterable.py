"""Iterable-style datasets: streams of samples, sync or async, and chaining them.

:class:`IterableDataset` is the base of a stream (``__iter__`` or ``__aiter__``) and
:class:`ChainDataset` runs several one after the other. Also here, for the map-style
datasets (:mod:`aioload.data.datasets`) and the protocol check (:mod:`aioload.data.protocol`): how
a dataset is told to be iterable-style (:func:`is_iterable_dataset`: an ``IterableDataset``, or an
object with ``__iter__`` or ``__aiter__`` but no ``__getitem__``) and whether it has a
length. Both classes are importable from :mod:`aioload.data.datasets`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any, Generic, TypeVar

from aioload.errors import DatasetKindError

__all__ = ["ChainDataset", "IterableDataset", "has_len", "is_iterable_dataset"]

T_co = TypeVar("T_co", covariant=True)


class IterableDataset(Generic[T_co]):
    """An abstract iterable-style dataset: a stream of samples.

    Subclasses define ``__iter__`` or ``__aiter__`` (an async generator, for
    streams that await I/O). With worker processes every worker iterates its
    own copy; use :func:`aioload.get_worker_info` inside ``__iter__`` to give
    each worker its own share, as with torch.

    ``a + b`` chains two iterable datasets into a :class:`ChainDataset`.

    Example::

        >>> class Count(IterableDataset[int]):
        ...     def __init__(self, n): self.n = n
        ...     def __iter__(self): return iter(range(self.n))
        >>> list(Count(2) + Count(3))
        [0, 1, 0, 1, 2]
    """

    def __add__(self, other: Any) -> ChainDataset:
        return ChainDataset([self, other])


def is_iterable_dataset(dataset: Any) -> bool:
    """Whether ``dataset`` is iterable-style: an :class:`IterableDataset`, or an object with
    ``__iter__`` or ``__aiter__`` but no ``__getitem__`` (a list is map-style).

    Args:
        dataset: any object given as a dataset.

    Example::

        >>> is_iterable_dataset(iter([1, 2])), is_iterable_dataset([1, 2])
        (True, False)
    """
    if isinstance(dataset, IterableDataset):
        return True
    kind = type(dataset)
    return not hasattr(kind, "__getitem__") and (
        hasattr(kind, "__iter__") or hasattr(kind, "__aiter__")
    )


def has_len(obj: Any) -> bool:
    """Whether ``obj``'s type defines ``__len__`` (asked of the type, as ``len()`` does).

    Args:
        obj: a dataset, a member of one, or an array.

    Example::

        >>> has_len([1]), has_len(iter([1]))
        (True, False)
    """
    return hasattr(type(obj), "__len__")


class ChainDataset(IterableDataset[Any]):
    """Chains iterable datasets, sync or async, one after the other.

    Iterating synchronously needs every member to be sync; ``async for`` works
    with any mix (sync members are iterated inline, which is right for cheap
    in-memory streams; put slow sync I/O behind ``__aiter__``).

    Example::

        >>> list(ChainDataset([range(2), range(3)]))
        [0, 1, 0, 1, 2]
    """

    def __init__(self, datasets: Iterable[Any]) -> None:
        self.datasets = list(datasets)
        for member in self.datasets:
            if not (is_iterable_dataset(member) or hasattr(type(member), "__iter__")):
                raise DatasetKindError(
                    "ChainDataset only supports IterableDataset and other iterable datasets; "
                    f"got {type(member).__name__}"
                )

    def __iter__(self) -> Iterator[Any]:
        for member in self.datasets:
            if not hasattr(type(member), "__iter__"):
                raise TypeError(
                    f"{type(member).__name__} is async-only (it has __aiter__ but no __iter__); "
                    "iterate the ChainDataset with `async for`"
                )
            yield from member

    async def __aiter__(self) -> AsyncIterator[Any]:
        for member in self.datasets:
            if hasattr(type(member), "__aiter__"):
                async for sample in member:
                    yield sample
            else:
                for sample in member:
                    yield sample

    def __len__(self) -> int:
        total = 0
        for member in self.datasets:
            if not has_len(member):
                raise TypeError(f"{type(member).__name__} has no __len__")
            total += len(member)
        return total
