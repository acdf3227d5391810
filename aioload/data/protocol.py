"""Which protocol a dataset speaks: map-style or iterable, sync or async, batched, thread-safe.

:func:`inspect_dataset` tells it once, when a loader is built, and the loader reads the
dataset the way its :class:`DatasetProtocol` says (:mod:`aioload.read.fetch` for map-style
reads, :mod:`aioload.read.streams` for streams). :func:`stream_is_async` is the part a
dataset that wraps streams asks of each of them (a :class:`~aioload.sources.MixDataset`).
Nothing here reads a sample.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from aioload.data.datasets import ChainDataset, Subset, getitem_is_async
from aioload.data.iterable import is_iterable_dataset

__all__ = ["DatasetProtocol", "inspect_dataset", "items_are_async", "stream_is_async"]


@dataclass(frozen=True)
class DatasetProtocol:
    """How a dataset is read.

    Attributes:
        iterable: an iterable-style dataset (``__iter__``/``__aiter__``), not map-style.
        is_async: reading it needs an event loop: an ``async def __getitem__`` or
            ``__getitems__`` (or async members), or an iterable with ``__aiter__``
            (unless it says otherwise with a bool attribute ``is_async_stream``: a
            stream with both ``__iter__`` and ``__aiter__``, read with ``__iter__``).
        batched: a map-style dataset with ``__getitems__``.
        thread_safe: the dataset declares (``thread_safe = True``) that several
            threads may call it at once; otherwise a sync dataset is read by
            one thread at a time.
    """

    iterable: bool
    is_async: bool
    batched: bool
    thread_safe: bool


def inspect_dataset(dataset: Any) -> DatasetProtocol:
    """Tells which protocol ``dataset`` speaks.

    Example::

        >>> class Remote:
        ...     async def __getitem__(self, key): ...
        ...     def __len__(self): return 10
        >>> inspect_dataset(Remote())
        DatasetProtocol(iterable=False, is_async=True, batched=False, thread_safe=False)
    """
    kind = type(dataset)
    thread_safe = bool(getattr(dataset, "thread_safe", False))
    if is_iterable_dataset(dataset):
        return DatasetProtocol(
            iterable=True,
            is_async=stream_is_async(dataset),
            batched=False,
            thread_safe=thread_safe,
        )
    if not hasattr(kind, "__getitem__"):
        raise TypeError(
            f"{kind.__name__} is not a dataset: a map-style dataset defines __getitem__, "
            "an iterable one __iter__ or __aiter__"
        )
    getitems = getattr(kind, "__getitems__", None)
    return DatasetProtocol(
        iterable=False,
        is_async=items_are_async(dataset)
        or (getitems is not None and inspect.iscoroutinefunction(getitems)),
        batched=getitems is not None,
        thread_safe=thread_safe,
    )


def stream_is_async(dataset: Any) -> bool:
    """Whether the loader reads the iterable ``dataset`` with ``__aiter__`` (else ``__iter__``).

    A :class:`~aioload.data.datasets.ChainDataset` is async when one of its members is; a
    stream with both methods may say which one it is read with (a bool ``is_async_stream``);
    any other stream is async when its type defines ``__aiter__``.

    Args:
        dataset: an iterable-style dataset.

    Example::

        >>> class Both:
        ...     is_async_stream = False
        ...     def __iter__(self): return iter(())
        ...     def __aiter__(self): ...
        >>> stream_is_async(Both()), stream_is_async(ChainDataset([iter(())]))
        (False, False)
    """
    # A ChainDataset has __aiter__ for its async members' sake; a chain of sync
    # members is a sync stream, which the loader reads in a thread.
    if isinstance(dataset, ChainDataset):
        return any(stream_is_async(member) for member in dataset.datasets)
    # So may any stream with both methods say which one the loader reads (a MixDataset).
    declared = getattr(dataset, "is_async_stream", None)
    if isinstance(declared, bool):
        return declared
    return hasattr(type(dataset), "__aiter__")


def items_are_async(dataset: Any) -> bool:
    """Whether the items of the map-style ``dataset`` may be awaitables (by ``__getitem__``,
    or through a :class:`~aioload.data.datasets.Subset`'s parent, whatever way it reads).

    Args:
        dataset: a map-style dataset.

    Example::

        >>> class Batched:
        ...     def __getitem__(self, key): ...
        ...     async def __getitems__(self, keys): ...
        >>> items_are_async(Batched()), items_are_async(Subset(Batched(), [0]))
        (False, True)
    """
    if isinstance(dataset, Subset):
        # Subset.__getitems__ forwards to the parent's, which may be async; a subclass's
        # own async __getitem__ makes its reads async whatever the parent is.
        return getitem_is_async(dataset) or inspect_dataset(dataset.dataset).is_async
    return getitem_is_async(dataset)
