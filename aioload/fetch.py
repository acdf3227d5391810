"""Fetch: which protocol a dataset speaks, and reading samples from it.

:func:`inspect_dataset` tells map-style from iterable and sync from async once,
when a loader is built; :class:`Fetcher` then reads a batch of keys (or the
next samples of a stream) the cheapest way that protocol allows:

- ``__getitems__(keys)`` when the dataset has one (awaited if it is a
  coroutine function), else ``__getitem__`` once per key;
- for async datasets, the item coroutines of a batch run concurrently through
  an :class:`~aioload.eager.ItemPool` (the backend's), which creates no task
  for items that finish without waiting;
- awaitable items inside a sync result (a :class:`~aioload.datasets.Subset` or
  :class:`~aioload.datasets.ConcatDataset` over async members) are resolved the
  same way.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from aioload.datasets import (
    ChainDataset,
    Subset,
    _getitem_is_async,
    _is_iterable_dataset,
)
from aioload.eager import Done, ItemPool

__all__ = ["DatasetProtocol", "Fetcher", "inspect_dataset"]


@dataclass(frozen=True)
class DatasetProtocol:
    """How a dataset is read.

    Attributes:
        iterable: an iterable-style dataset (``__iter__``/``__aiter__``), not map-style.
        is_async: reading it needs an event loop: an ``async def __getitem__`` or
            ``__getitems__`` (or async members), or an iterable with ``__aiter__``.
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
    if _is_iterable_dataset(dataset):
        return DatasetProtocol(
            iterable=True,
            is_async=_stream_is_async(dataset),
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
        is_async=_items_are_async(dataset)
        or (getitems is not None and inspect.iscoroutinefunction(getitems)),
        batched=getitems is not None,
        thread_safe=thread_safe,
    )


def _stream_is_async(dataset: Any) -> bool:
    # A ChainDataset has __aiter__ for its async members' sake; a chain of sync
    # members is a sync stream, which the loader reads in a thread.
    if isinstance(dataset, ChainDataset):
        return any(_stream_is_async(member) for member in dataset.datasets)
    return hasattr(type(dataset), "__aiter__")


def _items_are_async(dataset: Any) -> bool:
    if isinstance(dataset, Subset):
        # Subset.__getitems__ forwards to the parent's, which may be async.
        return inspect_dataset(dataset.dataset).is_async
    return _getitem_is_async(dataset)


class Fetcher:
    """Reads samples from one dataset for one loader iteration.

    Args:
        dataset: the dataset.
        protocol: its :class:`DatasetProtocol` (from :func:`inspect_dataset`).

    ``fetch_sync`` serves sync map-style datasets, ``fetch`` every map-style
    dataset on an event loop, and ``stream_sync``/``stream`` iterable ones.
    """

    def __init__(self, dataset: Any, protocol: DatasetProtocol) -> None:
        self.dataset = dataset
        self.protocol = protocol
        self._getitem = getattr(dataset, "__getitem__", None)
        self._getitems = getattr(dataset, "__getitems__", None) if protocol.batched else None

    def fetch_one_sync(self, key: Any) -> Any:
        """One sample of a sync map-style dataset."""
        return self._getitem(key)  # type: ignore[misc]

    def fetch_sync(self, keys: Sequence[Any]) -> list[Any]:
        """The samples for ``keys`` from a sync map-style dataset."""
        if self._getitems is not None:
            return list(self._getitems(keys))
        getitem = self._getitem
        return [getitem(key) for key in keys]  # type: ignore[misc]

    def fetch(self, keys: Sequence[Any], pool: ItemPool, done: Done) -> None:
        """Reads ``keys`` from any map-style dataset on the running loop.

        Item coroutines run concurrently through ``pool``; ``done(samples,
        error)`` is called once, with the samples in key order or the first error.
        """
        if self._getitems is None:
            getitem = self._getitem
            pool.submit([getitem(key) for key in keys], done)  # type: ignore[misc]
            return
        result = self._getitems(keys)
        if not inspect.isawaitable(result):
            pool.submit(list(result), done)
            return

        def unwrap(results: list[Any] | None, error: BaseException | None) -> None:
            done(None if results is None else list(results[0]), error)

        pool.submit([result], unwrap)

    def fetch_one(self, key: Any, pool: ItemPool, done: Done) -> None:
        """Reads one sample (automatic batching off); ``done(sample, error)``."""

        def unwrap(results: list[Any] | None, error: BaseException | None) -> None:
            done(None if results is None else results[0], error)

        pool.submit([self._getitem(key)], unwrap)  # type: ignore[misc]

    def stream_sync(self) -> Iterator[Any]:
        """The samples of a sync iterable dataset."""
        return iter(self.dataset)

    def stream(self) -> AsyncIterator[Any]:
        """The samples of an iterable dataset (sync or async) as an async iterator."""
        if self.protocol.is_async:
            return aiter(self.dataset)
        return _async_from_sync(iter(self.dataset))


async def _async_from_sync(iterator: Iterator[Any]) -> AsyncIterator[Any]:
    for sample in iterator:
        yield sample
