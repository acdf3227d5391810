"""Fetch: reading the samples of a map-style dataset.

:func:`~aioload.data.protocol.inspect_dataset` tells map-style from iterable and sync
from async once, when a loader is built; :class:`Fetcher` then reads a batch of keys the
cheapest way that protocol allows:

- ``__getitems__(keys)`` when the dataset has one (awaited if it is a
  coroutine function), else ``__getitem__`` once per key;
- for async datasets, the item coroutines of a batch run concurrently through
  an :class:`~aioload.read.eager.ItemPool` (the backend's), which creates no task
  for items that finish without waiting;
- awaitable items inside a sync result (a :class:`~aioload.data.datasets.Subset` or
  :class:`~aioload.data.datasets.ConcatDataset` over async members) are resolved the
  same way.

Under an active :class:`~aioload.faults.policy.FaultPolicy` a :class:`GuardedFetcher`
reads instead, through the reader's :class:`~aioload.faults.retrier.Retrier` (retries,
item timeouts, skips); the default path pays nothing for it: no wrapper
coroutine and no check per item.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from aioload.data.datasets import Subset
from aioload.data.protocol import DatasetProtocol
from aioload.data.row_block import RowBlock
from aioload.faults.policy import Skip
from aioload.faults.retrier import Attempted, Retrier
from aioload.read.eager import Done, ItemPool

__all__ = ["Fetcher", "GuardedFetcher"]


class Fetcher:
    """Reads samples from one dataset for one loader iteration.

    Args:
        dataset: the dataset.
        protocol: its :class:`~aioload.data.protocol.DatasetProtocol` (from
            :func:`~aioload.data.protocol.inspect_dataset`).

    ``fetch_sync`` serves sync map-style datasets, ``fetch`` every map-style
    dataset on an event loop (an iterable dataset's stream is opened and read by
    :class:`~aioload.read.streams.StreamReader`).
    """

    def __init__(self, dataset: Any, protocol: DatasetProtocol) -> None:
        self.dataset = dataset
        self.protocol = protocol
        self._getitem = getattr(dataset, "__getitem__", None)
        self._getitems = getattr(dataset, "__getitems__", None) if protocol.batched else None

    @property
    def getitem_per_key(self) -> Callable[[Any], Any] | None:
        """The dataset's ``__getitem__`` when a batch is read a key at a time (no
        ``__getitems__``, sync), else None."""
        protocol = self.protocol
        if self._getitems is not None or protocol.is_async or protocol.iterable:
            return None
        return self._getitem

    def fetch_one_sync(self, key: Any) -> Any:
        """One sample of a sync map-style dataset."""
        return self._getitem(key)  # type: ignore[misc]

    def fetch_sync(self, keys: Sequence[Any]) -> Sequence[Any]:
        """The samples for ``keys`` from a sync map-style dataset."""
        if self._getitems is not None:
            return _as_list(self._getitems(keys))
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
            if isinstance(result, RowBlock):  # read already: nothing to await in it
                done(result, None)
                return
            pool.submit(list(result), done)
            return

        def unwrap(results: Sequence[Any] | None, error: BaseException | None) -> None:
            done(None if results is None else _as_list(results[0]), error)

        pool.submit([result], unwrap)

    def fetch_one(self, key: Any, pool: ItemPool, done: Done) -> None:
        """Reads one sample (automatic batching off); ``done(sample, error)``."""

        def unwrap(results: Sequence[Any] | None, error: BaseException | None) -> None:
            done(None if results is None else results[0], error)

        pool.submit([self._getitem(key)], unwrap)  # type: ignore[misc]


def _as_list(samples: Any) -> Sequence[Any]:
    """A ``__getitems__`` result as a list; a :class:`~aioload.data.row_block.RowBlock` stays one
    (it collates by columns, see :mod:`aioload.data.row_block`)."""
    return samples if isinstance(samples, RowBlock) else list(samples)


def _has_own_getitems(dataset: Any) -> bool:
    """Whether ``dataset`` reads a batch in one call (a Subset only forwards its parent's,
    unless a subclass defines its own)."""
    while isinstance(dataset, Subset) and type(dataset).__getitems__ is Subset.__getitems__:
        dataset = dataset.dataset
    return hasattr(type(dataset), "__getitems__")


async def _resolve(samples: list[Any]) -> list[Any]:
    """Awaits the awaitable samples of a sync ``__getitems__`` result, concurrently."""
    pending = [i for i, sample in enumerate(samples) if inspect.isawaitable(sample)]
    if not pending:
        return samples
    tasks = [asyncio.ensure_future(samples[i]) for i in pending]
    try:
        values = await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:  # gather leaves the others running when one fails
            task.cancel()
        raise
    for i, value in zip(pending, values, strict=True):
        samples[i] = value
    return samples


class GuardedFetcher:
    """Reads a map-style dataset under an active :class:`~aioload.faults.policy.FaultPolicy`.

    It has :class:`Fetcher`'s map-style methods; every read goes through the reader's
    :class:`~aioload.faults.retrier.Retrier` (attempts, backoff, the closed epoch). In their
    results a :class:`~aioload.faults.policy.Skip` stands where ``on_error='skip'`` gave an
    item up; with ``on_error='raise'`` an item's last error is raised, with a note naming its
    key and attempts.

    - Items (``__getitem__``): every attempt calls ``dataset[key]`` anew. An
      async item is awaited under ``asyncio.timeout(item_timeout)``. A sync
      call cannot be interrupted: with ``item_timeout`` each sync attempt
      runs in a thread of its own and is abandoned when the time is up (the
      call finishes in the background, its result dropped; a retry may then
      run while it does). Backoff waits
      are ``asyncio.sleep`` for async datasets. For sync ones they block like
      the read (the loader reads them in its fetch thread; a worker on its
      loop) and end early when the epoch closes: the item gives up.
    - Batches (a dataset's own ``__getitems__``): one call is one attempt for
      the whole batch (``item_timeout`` bounds the call) and is retried whole.
      When it fails for good with ``on_error='skip'``: after a transient error
      (its attempts used up) every key of the batch is skipped with that error,
      since reading them one by one would only multiply the waiting; after any
      other error the keys are read one by one through ``__getitem__`` under
      the same policy, to find the bad ones (a ``__getitem__`` that raises
      ``NotImplementedError`` leaves the batch's error standing for its key).

    Args:
        fetcher: the plain fetcher of the (map-style) dataset.
        retrier: the reader's retrier (its policy, worker, closed epoch and retry count).

    Example::

        guard = GuardedFetcher(Fetcher(dataset, inspect_dataset(dataset)), Retrier(policy))
        samples = guard.fetch_sync([0, 1, 2])   # Skip markers where items were dropped
    """

    def __init__(self, fetcher: Fetcher, retrier: Retrier) -> None:
        self.protocol = fetcher.protocol
        self._retrier = retrier
        self._getitem: Callable[[Any], Any] = fetcher._getitem  # type: ignore[assignment]
        self._getitems = fetcher._getitems if _has_own_getitems(fetcher.dataset) else None
        self._timeout = retrier.policy.item_timeout

    # -- map-style reads ---------------------------------------------------

    def fetch_one_sync(self, key: Any) -> Any:
        """One sample of a sync map-style dataset, or a :class:`Skip`."""
        return self._result(key, self._item_sync(key))

    def fetch_sync(self, keys: Sequence[Any]) -> Sequence[Any]:
        """The samples for ``keys`` of a sync map-style dataset (:class:`Skip` if dropped)."""
        if self._getitems is None:
            one = self.fetch_one_sync
            return [one(key) for key in keys]
        batch = self._retrier.attempts_sync(
            self._read_batch_sync, (keys,), timeout=self._timeout, what=_keys
        )
        results = self._batch_result(keys, batch)
        if results is not None:
            return results
        return self._one_by_one(keys, [self._item_sync(key) for key in keys], batch)

    def fetch(self, keys: Sequence[Any], pool: ItemPool, done: Done) -> None:
        """Reads ``keys`` on the running loop through ``pool``; ``done(samples, error)``."""
        if self._getitems is None:
            item = self._item
            pool.submit([item(key) for key in keys], done)
            return

        def unwrap(results: Sequence[Any] | None, error: BaseException | None) -> None:
            done(None if results is None else results[0], error)

        pool.submit([self._batch(keys)], unwrap)

    def fetch_one(self, key: Any, pool: ItemPool, done: Done) -> None:
        """Reads one sample (automatic batching off); ``done(sample or Skip, error)``."""

        def unwrap(results: Sequence[Any] | None, error: BaseException | None) -> None:
            done(None if results is None else results[0], error)

        pool.submit([self._item(key)], unwrap)

    # -- attempts ------------------------------------------------------------

    def _item_sync(self, key: Any) -> Attempted:
        return self._retrier.attempts_sync(self._getitem, (key,), timeout=self._timeout, what=_key)

    def _item_attempts(self, key: Any) -> Coroutine[Any, Any, Attempted]:
        return self._retrier.attempts(self._getitem, (key,), timeout=self._timeout, what=_key)

    def _read_batch_sync(self, keys: Sequence[Any]) -> list[Any]:
        return list(self._getitems(keys))  # type: ignore[misc]

    async def _read_batch_async(self, keys: Sequence[Any]) -> list[Any]:
        result = self._getitems(keys)  # type: ignore[misc]
        if inspect.isawaitable(result):
            result = await result
        return await _resolve(list(result))

    async def _item(self, key: Any) -> Any:
        return self._result(key, await self._item_attempts(key))

    async def _batch(self, keys: Sequence[Any]) -> list[Any]:
        batch = await self._retrier.attempts(
            self._read_batch_async, (keys,), timeout=self._timeout, what=_keys
        )
        results = self._batch_result(keys, batch)
        if results is not None:
            return results
        # Fallback reads run outside the pool's limit: they are one batch's keys at most.
        attempted = await asyncio.gather(*(self._item_attempts(key) for key in keys))
        return self._one_by_one(keys, attempted, batch)

    # -- decisions -------------------------------------------------------------

    def _result(self, key: Any, attempted: Attempted) -> Any:
        """An item's value, or (its attempts failed) its :class:`Skip` or its error raised."""
        value, error, attempts = attempted
        return value if error is None else self._give_up(key, error, attempts)

    def _batch_result(self, keys: Sequence[Any], batch: Attempted) -> list[Any] | None:
        """A ``__getitems__`` call's samples, or its keys' skips or its error raised; None
        when its keys are to be read one by one to find the bad ones."""
        value, error, attempts = batch
        if error is None:
            return value  # type: ignore[no-any-return]
        if not self._retrier.skipping or self._retrier.transient(error):
            return self._batch_failed(keys, error, attempts)
        return None

    def _give_up(self, key: Any, error: Exception, attempts: int) -> Skip:
        """An item's last attempt failed: its :class:`Skip`, or ``error`` raised."""
        if not self._retrier.skipping:
            raise _noted(error, _key(key), attempts)
        return self._retrier.skipped(key, error, attempts)

    def _batch_failed(self, keys: Sequence[Any], error: Exception, attempts: int) -> list[Any]:
        """A ``__getitems__`` call failed for good: ``error`` raised, or every key skipped."""
        if not self._retrier.skipping:
            raise _noted(error, _keys(keys), attempts)
        skipped = self._retrier.skipped
        return [skipped(key, error, attempts) for key in keys]

    def _one_by_one(
        self, keys: Sequence[Any], attempted: Sequence[Attempted], batch: Attempted
    ) -> list[Any]:
        """The samples of a failed ``__getitems__`` call's keys, read one by one."""
        # A __getitem__ that is not implemented leaves the batch's error standing for its key.
        return [
            self._result(key, batch if isinstance(item.error, NotImplementedError) else item)
            for key, item in zip(keys, attempted, strict=True)
        ]


def _key(key: Any) -> str:
    return f"key {key!r}"


def _keys(keys: Sequence[Any]) -> str:
    return f"keys {list(keys)!r} (one __getitems__ call)"


def _noted(error: Exception, what: str, attempts: int) -> Exception:
    tries = "" if attempts == 1 else f", the last of {attempts} attempts"
    error.add_note(f"raised while reading {what}{tries}")
    return error
