"""Counters a dataset keeps about its reads (cache hits, bytes from the store), for the stats.

A dataset that reads from somewhere worth counting (the object-store datasets
of :mod:`aioload.sources`) keeps a :class:`SourceCounter` and offers the
*source-counts hook*: a method ``take_source_counts()`` returning the
:class:`SourceCounts` since its previous call (None when there is nothing new).

The loader calls the hook where the dataset is read, after every batch
(:class:`~aioload.read.reader.BatchReader`: in the loader's process with
``num_workers=0``, in each worker process otherwise), and the counts ride in the
batch's :class:`~aioload.read.outcome.Outcome` to the loader, as retries do, which
adds them to :meth:`DataLoader.stats() <aioload.DataLoader.stats>`
(:class:`~aioload.stats.recorder.IterationStats`: ``cache_hits``, ``cache_misses``,
``store_bytes``, ``store_requests``, ``hedges``). A dataset without the hook costs nothing.

Counts are taken after each batch, so what a dataset reads ahead (a shard
streaming in while its first samples are batched) is reported with a later
batch, and what it reads after its last batch of an epoch is reported with
the next epoch's first: the totals over a loader's life are exact.

A counter starts at zero in every process: pickled to a worker, it arrives
empty, so the parent's counts are never reported twice.
"""

from __future__ import annotations

import threading
from typing import Any, NamedTuple

__all__ = ["SourceCounter", "SourceCounts"]


class SourceCounts(NamedTuple):
    """What a dataset's reads came to over some span (immutable; ``+`` adds).

    Attributes:
        cache_hits: entries (shards, objects) read from the local cache.
        cache_misses: entries a dataset with a cache had to read from the store.
        store_bytes: bytes received from the store (with a cache or without).
        requests: GET requests sent to the store (hedges included; not the store
            client's own retries).
        hedges: reads sent a second time because the first was slow
            (:mod:`aioload.sources.stores.hedge`).

    Example::

        >>> SourceCounts(1, 2, 300) + SourceCounts(0, 1, 50)
        SourceCounts(cache_hits=1, cache_misses=3, store_bytes=350, requests=0, hedges=0)
    """

    cache_hits: int = 0
    cache_misses: int = 0
    store_bytes: int = 0
    requests: int = 0
    hedges: int = 0

    def __add__(self, other: Any) -> SourceCounts:
        if not isinstance(other, SourceCounts):
            return NotImplemented
        return SourceCounts(*(mine + theirs for mine, theirs in zip(self, other, strict=True)))


class SourceCounter:
    """A dataset's running counts, taken (and reset) by the loader after each batch.

    Updates come from the thread that reads (the event loop); :meth:`take` may
    run on another, so the swap is locked. Pickles as a fresh, empty counter.

    Example::

        >>> counter = SourceCounter()
        >>> counter.hit()
        >>> counter.received(4096)
        >>> counter.take()
        SourceCounts(cache_hits=1, cache_misses=0, store_bytes=4096, requests=0, hedges=0)
        >>> print(counter.take())   # nothing since
        None
    """

    __slots__ = ("_lock", "cache_hits", "cache_misses", "hedges", "requests", "store_bytes")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.cache_hits = 0
        self.cache_misses = 0
        self.store_bytes = 0
        self.requests = 0
        self.hedges = 0

    def hit(self) -> None:
        """One entry was read from the local cache."""
        with self._lock:
            self.cache_hits += 1

    def miss(self) -> None:
        """One entry had to be read from the store although a cache was configured."""
        with self._lock:
            self.cache_misses += 1

    def received(self, nbytes: int) -> None:
        """``nbytes`` more bytes arrived from the store."""
        with self._lock:
            self.store_bytes += nbytes

    def requested(self) -> None:
        """One more GET request was sent to the store."""
        with self._lock:
            self.requests += 1

    def hedged(self) -> None:
        """One read was sent a second time (its second request is counted apart)."""
        with self._lock:
            self.hedges += 1

    def take(self) -> SourceCounts | None:
        """The counts since the previous call, reset to zero; None when all are zero."""
        if not (
            self.cache_hits or self.cache_misses or self.store_bytes or self.requests or self.hedges
        ):
            return None
        with self._lock:
            counts = SourceCounts(
                self.cache_hits, self.cache_misses, self.store_bytes, self.requests, self.hedges
            )
            self.cache_hits = self.cache_misses = self.store_bytes = 0
            self.requests = self.hedges = 0
        return counts

    def __reduce__(self) -> tuple[Any, ...]:
        # A worker's copy starts empty: the parent's counts stay the parent's to report.
        return (SourceCounter, ())

    def __repr__(self) -> str:
        return (
            f"SourceCounter(cache_hits={self.cache_hits}, cache_misses={self.cache_misses}, "
            f"store_bytes={self.store_bytes}, requests={self.requests}, hedges={self.hedges})"
        )
