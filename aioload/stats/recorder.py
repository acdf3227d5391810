"""Observability: what a loader has done and where it stands (:meth:`DataLoader.stats`).

Recording is always on and costs a few counter updates per batch (see
``benchmarks/bench_loader.py``, measurement 5); the snapshot
(:class:`LoaderStats`), percentiles included, is only computed when someone
asks for it.

Who writes what (each figure has a single writer thread, so plain attribute
updates are enough: under the GIL a reader on another thread sees the old or the
new value, never a torn one):

- the consumer's thread (the one running ``for`` or ``async for``): batches,
  items and bytes yielded, the time it waited for a batch that was not ready
  (*stall*), when the iteration started and ended;
- the event loop that runs the epoch (the caller's under ``async for``,
  aioload's own thread under ``for``): fetch latencies and bytes of the
  measured batches (the first 8 of an epoch, then one in 32: a batch that is
  not measured costs a comparison), skips, worker restarts, retries reported
  by workers, and what datasets count of their reads (cache hits and misses,
  bytes from the store: :mod:`aioload.stats.source_counts`), which ride in each
  batch's outcome as retries do;
- retries made in a fetch thread (sync datasets) go through a lock: they are
  on the slow path anyway.

Fetch latencies land in a bounded ring (:data:`LATENCY_SAMPLES` values), so
memory stays flat however long the loader runs. One :class:`EpochRecorder`
per iteration; the loader's :class:`StatsRecorder` folds finished ones into
its totals.

Measuring a batch (:func:`measure_batch`, :func:`batch_nbytes`) is the job of
:mod:`aioload.stats.measure`; both are importable from here.
"""

from __future__ import annotations

import math
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from aioload.stats.measure import batch_nbytes, measure_batch
from aioload.stats.source_counts import SourceCounts

__all__ = [
    "LATENCY_SAMPLES",
    "EpochRecorder",
    "IterationStats",
    "LoaderStats",
    "StatsRecorder",
    "batch_nbytes",
    "measure_batch",
]

LATENCY_SAMPLES = 1024
"""How many of the latest batch fetch latencies the percentiles are computed over."""

# The gauges an epoch reports at snapshot time: batches in flight, items in
# flight, batches in the reorder buffer, batches ready for the consumer.
Gauges = tuple[int, int, int, int]


class _LatencyRing:
    """The latest :data:`LATENCY_SAMPLES` fetch latencies, in seconds (one writer)."""

    __slots__ = ("_values", "count")

    def __init__(self) -> None:
        self._values = [0.0] * LATENCY_SAMPLES
        self.count = 0  # latencies recorded so far

    def add(self, seconds: float) -> None:
        count = self.count
        self._values[count % LATENCY_SAMPLES] = seconds
        self.count = count + 1  # after the write: a reader never copies an unwritten slot

    def values(self) -> list[float]:
        return self._values[: min(self.count, LATENCY_SAMPLES)]


class EpochRecorder:
    """The counters of one iteration (see the module docstring for who writes which).

    Args:
        latencies: the loader's ring of fetch latencies.
        collated: batches are collated from lists of keys (automatic batching).
        batch_size: samples per batch of an iterable dataset (None: unknown).
    """

    __slots__ = (
        "_epoch",
        "_latencies",
        "_lock",
        "_stream_batch",
        "batches",
        "cache_hits",
        "cache_misses",
        "collated",
        "concurrency",
        "ended",
        "fetched",
        "hedges",
        "items",
        "retries",
        "sampled_bytes",
        "sampled_items",
        "skipped",
        "stall",
        "started",
        "store_bytes",
        "store_requests",
        "throttles",
        "worker_restarts",
    )

    def __init__(
        self,
        latencies: _LatencyRing | None = None,
        *,
        collated: bool = True,
        batch_size: int | None = None,
    ) -> None:
        self._latencies = latencies if latencies is not None else _LatencyRing()
        self.collated = collated
        self._stream_batch = batch_size if collated and batch_size else 1
        self._lock = threading.Lock()
        self._epoch: Callable[[], Any] | None = None
        # fetched(seconds): a batch's fetch took ``seconds`` from submission to
        # completion (the loop's side; the ring's own method: one call, not two).
        self.fetched: Callable[[float], None] = self._latencies.add
        self.started = time.perf_counter()
        self.ended: float | None = None
        self.batches = 0
        self.items = 0
        # bytes and items of the measured batches: bytes = items x their ratio
        self.sampled_bytes = 0
        self.sampled_items = 0
        self.stall = 0.0
        self.retries = 0
        self.skipped = 0
        self.worker_restarts = 0
        self.cache_hits = 0
        self.cache_misses = 0
        self.store_bytes = 0
        self.store_requests = 0
        self.hedges = 0
        self.throttles = 0
        # worker (None: the loader's loop) -> its tuned limit, under concurrency="auto"
        self.concurrency: dict[int | None, int] = {}

    # -- the loop's side ----------------------------------------------------

    def attach(self, epoch: Any) -> None:
        """The epoch whose gauges (``epoch.gauges()``) snapshots read; held weakly."""
        self._epoch = weakref.ref(epoch)

    def sample(self, items: int, nbytes: int) -> None:
        """A measured batch of ``items`` items held ``nbytes`` bytes (the loop's side)."""
        self.sampled_items += items
        self.sampled_bytes += nbytes

    def measure(self, keys: Any, batch: Any, skipped: int) -> tuple[int, int]:
        """Items and bytes of a completed batch (``keys`` None: a stream's batch)."""
        if keys is not None and self.collated:
            return len(keys) - skipped, batch_nbytes(batch)
        if not self.collated:
            return 1, batch_nbytes(batch)
        nbytes, length = measure_batch(batch)
        return (length if length >= 0 else self._stream_batch), nbytes

    def items_of(self, keys: Any) -> int:
        """Items a batch in flight asks for."""
        if not self.collated:
            return 1
        return self._stream_batch if keys is None else len(keys)

    def retried(self) -> None:
        """One more attempt at an item follows a failed one (any thread)."""
        with self._lock:
            self.retries += 1

    def add_retries(self, count: int) -> None:
        """A worker reports ``count`` repeated attempts (any thread)."""
        with self._lock:
            self.retries += count

    def add_counts(self, counts: SourceCounts) -> None:
        """A batch's outcome reports what the dataset counted of its reads (the loop's side)."""
        self.cache_hits += counts.cache_hits
        self.cache_misses += counts.cache_misses
        self.store_bytes += counts.store_bytes
        self.store_requests += counts.requests
        self.hedges += counts.hedges

    def tuned(self, worker: int | None, concurrency: int | None, throttles: int) -> None:
        """A batch's outcome reports a loop's tuned limit (``concurrency="auto"``) and the
        throttles it saw (the loop's side)."""
        if concurrency is not None:
            self.concurrency[worker] = concurrency
        self.throttles += throttles

    # -- the consumer's side ------------------------------------------------

    def end(self) -> None:
        """The iteration is over: exhausted, closed or collected (first call counts)."""
        if self.ended is None:
            self.ended = time.perf_counter()

    # -- snapshots ------------------------------------------------------------

    def counts(self, now: float) -> IterationStats:
        ended = self.ended
        items, sampled = self.items, self.sampled_items
        return IterationStats(
            batches=self.batches,
            items=items,
            bytes=round(items * self.sampled_bytes / sampled) if sampled else 0,
            seconds=(now if ended is None else ended) - self.started,
            stall=self.stall,
            retries=self.retries,
            skipped=self.skipped,
            worker_restarts=self.worker_restarts,
            cache_hits=self.cache_hits,
            cache_misses=self.cache_misses,
            store_bytes=self.store_bytes,
            store_requests=self.store_requests,
            hedges=self.hedges,
            throttles=self.throttles,
        )

    def tuned_concurrency(self) -> int | None:
        """The tuned limits of every loop that reported one, added up (None: none did)."""
        limits = list(self.concurrency.values())
        return sum(limits) if limits else None

    def gauges(self) -> Gauges:
        epoch = None if self._epoch is None or self.ended is not None else self._epoch()
        if epoch is None:
            return (0, 0, 0, 0)
        result: Gauges = epoch.gauges()
        return result


@dataclass(frozen=True, slots=True)
class IterationStats:
    """Counters over a span of iteration: one epoch, or every epoch of a loader.

    Attributes:
        batches: batches the consumer received.
        items: samples in them (a batch's keys minus the items skipped under
            ``on_error='skip'``; for an iterable dataset, the first dimension
            of the batch's first array; 1 per batch without automatic batching).
        bytes: ``nbytes`` of the arrays (numpy, or tensors) in those batches.
            To stay cheap, a sample of the batches is walked (the first 8 of
            an epoch, then one in 32; every batch of an iterable dataset; see
            :func:`measure_batch`), and ``bytes`` is ``items`` times their
            bytes per item: exact when samples have fixed shapes, an estimate
            otherwise.
        seconds: wall time of iteration, from the start of the iteration
            (``iter(loader)``, or the first ``__anext__``) to its end (exhausted,
            closed, or garbage-collected), or to now while it runs; summed over
            epochs for the totals.
        stall: seconds the consumer spent waiting inside ``__next__`` /
            ``__anext__`` for a batch that was not ready yet, the wait for the
            first batch (worker start-up included) too.
        retries: extra attempts the fault policy made at items (``retry=``).
        skipped: items dropped under ``on_error='skip'``.
        worker_restarts: worker processes that died and were replaced.
        cache_hits: shards or objects a dataset read from its local cache
            (``cache_dir=`` of :class:`~aioload.sources.ShardDataset` and
            :class:`~aioload.sources.ObjectDataset`).
        cache_misses: shards or objects a dataset with a cache read from the
            store instead.
        store_bytes: bytes the object-store datasets received from the store,
            with a cache or without.
        store_requests: GET requests the object-store datasets sent (hedges
            included); ``requests_per_s`` is their rate.
        hedges: reads sent a second time because the first was slow (``hedge=``
            of the object-store datasets).
        throttles: reads the store answered "slow down" (503, 429) that reached
            the loader (past obstore's own retries), as ``concurrency="auto"`` saw
            them (0 without it).

    The last five come from the datasets (see :mod:`aioload.stats.source_counts`):
    a worker reports them with its next batch, so a span's figures include
    what was read ahead for the next batch, and the totals are exact.
    """

    batches: int
    items: int
    bytes: int
    seconds: float
    stall: float
    retries: int
    skipped: int
    worker_restarts: int
    cache_hits: int = 0
    cache_misses: int = 0
    store_bytes: int = 0
    store_requests: int = 0
    hedges: int = 0

    @property
    def requests_per_s(self) -> float:
        """GET requests sent to the store per second of iteration."""
        return self.store_requests / self.seconds if self.seconds > 0 else 0.0

    throttles: int = 0

    @property
    def items_per_s(self) -> float:
        """Items received per second of iteration."""
        return self.items / self.seconds if self.seconds > 0 else 0.0

    @property
    def batches_per_s(self) -> float:
        """Batches received per second of iteration."""
        return self.batches / self.seconds if self.seconds > 0 else 0.0

    @property
    def bytes_per_s(self) -> float:
        """Bytes received per second of iteration."""
        return self.bytes / self.seconds if self.seconds > 0 else 0.0

    @property
    def stall_fraction(self) -> float:
        """``stall / seconds``: the share of the iteration the consumer waited for data.

        Near 0: the loader keeps up and the consumer's own work sets the pace.
        Near 1: the consumer is data-bound.
        """
        return min(1.0, self.stall / self.seconds) if self.seconds > 0 else 0.0

    def __add__(self, other: IterationStats) -> IterationStats:
        return IterationStats(*(a + b for a, b in zip(_fields(self), _fields(other), strict=True)))

    def as_dict(self) -> dict[str, float]:
        """The counters and the rates derived from them, as a flat dict."""
        return {
            **asdict(self),
            "items_per_s": self.items_per_s,
            "batches_per_s": self.batches_per_s,
            "bytes_per_s": self.bytes_per_s,
            "stall_fraction": self.stall_fraction,
            "requests_per_s": self.requests_per_s,
        }


def _fields(stats: IterationStats) -> tuple[Any, ...]:
    return (
        stats.batches,
        stats.items,
        stats.bytes,
        stats.seconds,
        stats.stall,
        stats.retries,
        stats.skipped,
        stats.worker_restarts,
        stats.cache_hits,
        stats.cache_misses,
        stats.store_bytes,
        stats.store_requests,
        stats.hedges,
        stats.throttles,
    )


_ZERO = IterationStats(0, 0, 0, 0.0, 0.0, 0, 0, 0, 0, 0, 0, 0, 0, 0)


@dataclass(frozen=True, slots=True)
class LoaderStats:
    """A snapshot of a loader, from :meth:`DataLoader.stats() <aioload.DataLoader.stats>`.

    Attributes:
        epochs: iterations started over the loader's life.
        iterating: whether an iteration is in progress.
        epoch: the counters of the latest iteration (in progress or finished).
        total: the counters of every iteration of the loader added up.
        fetch_p50: median fetch latency in seconds: from handing a batch to
            the backend to its completion (read, collated and, with workers,
            back in this process), over the latest :data:`LATENCY_SAMPLES`
            measured batches of any epoch (the first 8 of an epoch, then one
            in 32); None before the first.
        fetch_p90: the 90th percentile, likewise.
        fetch_p99: the 99th percentile, likewise.
        fetch_samples: how many latencies the percentiles are over.
        batches_in_flight: batches of the running iteration handed to the
            backend and not completed yet (at snapshot time).
        items_in_flight: the items those batches ask for.
        reorder_buffer: completed batches waiting for an earlier one
            (``in_order=True``).
        ready: completed batches waiting for the consumer to take them (in the
            hand-off or the pin stage). Often > 0: the loader is ahead.
        concurrency: under ``concurrency="auto"``, the item reads in flight the
            latest iteration's tuner settled on (added up over the workers, each
            tuning its own); None otherwise, or before its first report.

    ``str(stats)`` is a one-line summary (:meth:`format`); :meth:`as_dict`
    gives plain values for a logger or a metrics system.

    Example::

        >>> import numpy as np
        >>> from aioload import ArrayDataset, DataLoader
        >>> loader = DataLoader(ArrayDataset(np.zeros((1000, 8), np.float32)), batch_size=100)
        >>> for batch in loader:
        ...     pass
        >>> print(loader.stats())   # doctest: +ELLIPSIS +NORMALIZE_WHITESPACE
        epoch 1 (done): 10 batches, 1k items, 32kB in ... s (...), stall ... | fetch p50/p90/p99
        ... | in flight 0 batches (0 items), reorder 0, ready 0 | retries 0, skipped 0, worker
        restarts 0
        >>> loader.stats().as_dict()["epoch"]["items"]
        1000
    """

    epochs: int
    iterating: bool
    epoch: IterationStats
    total: IterationStats
    fetch_p50: float | None
    fetch_p90: float | None
    fetch_p99: float | None
    fetch_samples: int
    batches_in_flight: int
    items_in_flight: int
    reorder_buffer: int
    ready: int
    concurrency: int | None = None

    def as_dict(self) -> dict[str, Any]:
        """The snapshot as plain values: ``epoch`` and ``total`` as nested dicts with rates."""
        values = {name: getattr(self, name) for name in self.__dataclass_fields__}
        values["epoch"] = self.epoch.as_dict()
        values["total"] = self.total.as_dict()
        return values

    def format(self) -> str:
        """A one-line, human-readable summary of the latest epoch and the loader's state."""
        e = self.epoch
        if self.fetch_p50 is None:
            fetch = "fetch -"
        else:
            fetch = "fetch p50/p90/p99 " + "/".join(
                f"{1e3 * (q or 0.0):.3g}" for q in (self.fetch_p50, self.fetch_p90, self.fetch_p99)
            )
            fetch += " ms"
        faults = f"retries {e.retries}, skipped {e.skipped}, worker restarts {e.worker_restarts}"
        if e.cache_hits or e.cache_misses or e.store_bytes:
            faults += (
                f" | cache hits {e.cache_hits}, misses {e.cache_misses}, "
                f"from the store {_si(e.store_bytes)}B"
            )
        if e.store_requests:
            faults += f" | requests {_si(e.store_requests)} ({_si(e.requests_per_s)}/s)"
        if e.hedges:
            faults += f", hedges {e.hedges}"
        if self.concurrency is not None:
            faults += f" | concurrency auto: {self.concurrency}, throttles {e.throttles}"
        state = "running" if self.iterating else "done"
        return (
            f"epoch {self.epochs} ({state}): {e.batches} batches, {_si(e.items)} items, "
            f"{_si(e.bytes)}B in {e.seconds:.3g} s ({_si(e.items_per_s)} items/s, "
            f"{_si(e.bytes_per_s)}B/s), stall {e.stall_fraction:.0%} ({e.stall:.3g} s) | "
            f"{fetch} | in flight {self.batches_in_flight} batches "
            f"({self.items_in_flight} items), reorder {self.reorder_buffer}, "
            f"ready {self.ready} | {faults}"
        )

    def __str__(self) -> str:
        return self.format()


def _si(value: float) -> str:
    """``value`` with a k/M/G/T suffix and three significant digits."""
    for suffix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def _percentile(ordered: list[float], q: float) -> float:
    """Linear interpolation between the closest ranks (numpy's default method)."""
    rank = q / 100 * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


class StatsRecorder:
    """A loader's recorder: one :class:`EpochRecorder` per iteration, and their totals.

    Example::

        recorder = StatsRecorder()
        record = recorder.new_epoch(collated=True, batch_size=64)
        ...
        print(recorder.snapshot())
    """

    def __init__(self) -> None:
        self._latencies = _LatencyRing()
        self._lock = threading.Lock()
        self._finished = _ZERO  # the totals of the iterations that ended
        self._live: list[EpochRecorder] = []
        self._latest: EpochRecorder | None = None
        self._epochs = 0

    def new_epoch(self, *, collated: bool, batch_size: int | None) -> EpochRecorder:
        """The recorder of a new iteration, which becomes the latest."""
        record = EpochRecorder(self._latencies, collated=collated, batch_size=batch_size)
        with self._lock:
            self._fold(time.perf_counter())
            self._live.append(record)
            self._latest = record
            self._epochs += 1
        return record

    def _fold(self, now: float) -> None:
        # Iterations that ended move into the totals; a late update from their
        # loop (a restart during shutdown) is then not counted.
        live = []
        for record in self._live:
            if record.ended is None:
                live.append(record)
            else:
                self._finished = self._finished + record.counts(now)
        self._live = live

    def snapshot(self) -> LoaderStats:
        """The :class:`LoaderStats` as of now."""
        now = time.perf_counter()
        with self._lock:
            self._fold(now)
            total = self._finished
            for record in self._live:
                total = total + record.counts(now)
            latest = self._latest
            epochs = self._epochs
        epoch = _ZERO if latest is None else latest.counts(now)
        gauges = (0, 0, 0, 0) if latest is None else latest.gauges()
        ordered = sorted(self._latencies.values())
        p50 = p90 = p99 = None
        if ordered:
            p50, p90, p99 = (_percentile(ordered, q) for q in (50, 90, 99))
        return LoaderStats(
            epochs=epochs,
            iterating=latest is not None and latest.ended is None,
            epoch=epoch,
            total=total,
            fetch_p50=p50,
            fetch_p90=p90,
            fetch_p99=p99,
            fetch_samples=len(ordered),
            batches_in_flight=gauges[0],
            items_in_flight=gauges[1],
            reorder_buffer=gauges[2],
            ready=gauges[3],
            concurrency=None if latest is None else latest.tuned_concurrency(),
        )
