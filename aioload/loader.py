"""DataLoader: torch's arguments and semantics, iterated with ``async for`` or ``for``."""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import functools
import itertools
import math
import multiprocessing
import threading
import uuid
import weakref
from collections.abc import Callable, Mapping
from typing import Any, Literal

import anyio.abc
import numpy as np

from aioload.backends.base import Completion
from aioload.backends.executor import ExecutorBackend, check_executor, executor_size
from aioload.backends.inline import InlineBackend
from aioload.backends.pool import WorkerPool, start_method_context
from aioload.backends.processes import ProcessBackend
from aioload.checkpoint import (
    STATE_VERSION,
    EpochStart,
    Resume,
    check_state,
    check_worker_streams,
    count_field,
    record_in,
)
from aioload.collate import default_collate, default_convert
from aioload.fetch import Fetcher, inspect_dataset
from aioload.handoff import LoopOutput, ThreadOutput
from aioload.iteration import AsyncBatchIterator, SyncBatchIterator
from aioload.policy import FaultPolicy, RetryPolicy, SkipLog, SkippedItem
from aioload.samplers import (
    BatchSampler,
    RandomSampler,
    SequentialSampler,
    _as_generator,
    _check_generator_state,
    _plain,
    _stateful,
)
from aioload.scheduler import BackendFactory, Epoch, Progress
from aioload.stats import EpochRecorder, LoaderStats, StatsRecorder
from aioload.worker import WorkerSetup

__all__ = ["DEFAULT_CONCURRENCY", "DEFAULT_MAX_WORKER_RESTARTS", "DataLoader"]

DEFAULT_CONCURRENCY = 256
"""Async item fetches in flight at once on one event loop unless ``concurrency`` says otherwise."""

DEFAULT_MAX_WORKER_RESTARTS = 3
"""Worker deaths one epoch survives (by restarting the worker) unless told otherwise."""

# Bumped when the layout of DataLoader.state_dict() changes, so an old state is refused clearly.

_FROZEN_AFTER_INIT = (
    "batch_size",
    "batch_sampler",
    "sampler",
    "drop_last",
    "dataset",
    "persistent_workers",
    "executor",
    # The fault policy is settled at construction (and sent to persistent workers).
    "retry",
    "item_timeout",
    "on_error",
    "max_skipped",
)


class DataLoader:
    """Combines a dataset and a sampler and iterates over batches of the dataset.

    The arguments, defaults and errors are torch's ``DataLoader``'s; batches
    are numpy arrays (see :func:`aioload.default_collate`). Iterate with
    ``async for`` inside an event loop (the loop never blocks: sync datasets
    are read in a thread) or with plain ``for`` (aioload runs its pipeline on
    its own uvloop loop in a background thread, so fetching overlaps your
    compute). Every iteration is a new epoch.

    Args:
        dataset: a map-style dataset (``__getitem__``, sync or ``async def``,
            optionally ``__getitems__``) or an iterable one (``__iter__`` or
            ``__aiter__``).
        batch_size: samples per batch; ``None`` turns automatic batching off.
        shuffle: reshuffle the data every epoch (map-style only).
        sampler: a sampler of keys (sync or async iterable); excludes ``shuffle``.
        batch_sampler: a sampler of lists of keys; excludes ``batch_size``,
            ``shuffle``, ``sampler`` and ``drop_last``.
        num_workers: worker processes; 0 loads on the event loop. Each worker
            runs its own uvloop loop and a copy of the dataset, with up to
            ``concurrency`` item fetches in flight; batch ``i`` goes to worker
            ``i % num_workers``. Arrays come back through shared memory
            without a copy. Iterable datasets are iterated (and batched, with
            ``drop_last`` per worker) by every worker: shard them with
            :func:`~aioload.get_worker_info`.
        collate_fn: merges a list of samples into a batch (default
            :func:`~aioload.default_collate`, or :func:`~aioload.default_convert`
            without automatic batching).
        pin_memory: copy each batch into page-locked memory, in a dedicated
            thread, before returning it.
        drop_last: drop the last incomplete batch.
        timeout: seconds to wait for the next batch before raising
            :class:`~aioload.LoaderTimeoutError` (0: wait forever).
        worker_init_fn: called with the worker id in each worker process,
            after its generators are seeded (Python's ``random``, numpy's legacy
            global state and torch if imported, with ``base_seed + id``, where
            ``base_seed`` is drawn from ``generator`` every epoch).
        multiprocessing_context: ``'fork'``, ``'spawn'``, ``'forkserver'`` or a
            context object. The default is ``'forkserver'``: aioload runs threads
            (its loop, fetch and pin threads), and forking a process that has
            threads can deadlock the child. The cost: the dataset,
            ``collate_fn`` and ``worker_init_fn`` must be picklable (they are
            pickled once per epoch, or once with ``persistent_workers``), and
            the first loader of a process starts the fork server (a few hundred
            milliseconds, with aioload's worker code preloaded); later workers
            start in milliseconds.
        generator: a ``numpy.random.Generator`` or an int seed for shuffling;
            a fixed seed makes the sequence of epochs reproducible.
        prefetch_factor: batches in flight per worker (``num_workers > 0``,
            default 2). Unlike torch it is also allowed with
            ``num_workers=0``, where it sizes the window of batches in flight
            on the event loop; the default there is enough batches to keep
            ``concurrency`` items in flight and at least 4:
            ``max(4, 2 * ceil(concurrency / batch_size))`` (twice what
            ``concurrency`` needs, so refilling the window never starves it).
        persistent_workers: keep the worker processes (and their dataset
            copies) between epochs; they stop at :meth:`close`, when the loader
            is collected, or at exit.
        pin_memory_device: the device to pin for (torch tensors only).
        in_order: yield batches in sampler order; ``False`` yields them as
            they finish, so one slow fetch does not hold the others back.
        concurrency: the most item fetches in flight at once on one event
            loop (default :data:`DEFAULT_CONCURRENCY` = 256). With an async
            dataset every item of every batch in the window is fetched
            concurrently up to this cap. With workers, the cap is per worker.
        max_worker_restarts: worker processes that die (killed, out of memory,
            ``os._exit``) are restarted and the batches they held are fetched
            again, so the epoch still yields every sample exactly once; after
            this many restarts in one epoch (default
            :data:`DEFAULT_MAX_WORKER_RESTARTS` = 3) the epoch fails with
            :class:`~aioload.WorkerCrashedError`. A worker of an iterable
            dataset is never restarted (its stream position died with it).
        retry: a :class:`~aioload.RetryPolicy` — how many attempts an item
            gets, the exponential backoff with jitter between them, and which
            errors are transient (default ``OSError`` and ``TimeoutError``);
            None (the default): no retries. Each attempt calls
            ``dataset[key]`` anew; a dataset's own ``__getitems__`` call is
            retried as a whole.
        item_timeout: seconds one attempt at one item may take (None, the
            default: no limit); a slower attempt fails with
            :class:`~aioload.ItemTimeoutError` (transient under the default
            ``retry``). An async item is cancelled at the deadline; a sync
            ``__getitem__`` cannot be interrupted, so a sync attempt that
            returns late counts as failed and its result is dropped. It bounds
            a whole ``__getitems__`` call.
        on_error: what an item that still fails (a non-transient error, or
            its attempts used up) does: ``'raise'`` (the default, as torch)
            fails its batch with the item's own exception; ``'skip'`` drops
            it: the batch is collated from the items that were read (so it
            may be smaller than ``batch_size`` whatever ``drop_last``, which
            only concerns the sampler's last batch), a batch with nothing left
            is not yielded (``len(loader)`` still counts the sampler's
            batches), and each skip is logged once (logger
            ``"aioload"``, level WARNING) and listed by :attr:`skipped`. When
            a ``__getitems__`` call fails for good, its keys are skipped
            together after a transient error, and read one by one through
            ``__getitem__`` to find the bad ones after any other.
        max_skipped: with ``on_error='skip'``, the most items one epoch may
            skip: a count (int >= 0) or a fraction of the epoch's items (a
            float between 0 and 1, which needs a sampler with a length). One
            more ends the epoch with :class:`~aioload.TooManySkippedError`,
            listing every skipped key and reason. None (the default): no limit.
        executor: a :class:`concurrent.futures.Executor` to run the batches
            on instead of the event loop or aioload's worker processes: a
            ``ThreadPoolExecutor``, a ``ProcessPoolExecutor``, or a cluster's,
            such as dask.distributed's ``client.get_executor(pure=False)``
            (``pure=True``, its default, is refused: dask would merge a batch
            asked for again with the earlier one). Each batch is one task
            (never one per item); ``prefetch_factor`` batches per executor
            worker are in flight (default 2); the dataset, ``collate_fn`` and
            ``worker_init_fn`` reach each executor worker once per epoch;
            :func:`~aioload.get_worker_info` works in the tasks; an async
            dataset's items run concurrently on an event loop per executor
            thread. Map-style datasets only; excludes ``num_workers > 0`` and
            ``persistent_workers``. The executor stays the caller's: aioload
            never shuts it down. See :mod:`aioload.backends.executor`.

    The fault policy (``retry``, ``item_timeout``, ``on_error``) applies to
    map-style datasets only — an iterable dataset's stream cannot read a
    sample again — and runs where items are read, inside the workers when
    ``num_workers > 0``.

    Checkpoints: :meth:`state_dict` may be called between any two batches
    (``for`` or ``async for``), after an epoch or before the first; it
    returns a small JSON-serialisable dict describing what the consumer
    has received. :meth:`load_state_dict` on a new loader built with the
    same dataset and arguments makes its next iteration continue that
    epoch (``in_order=True``: the same remaining batches in the same
    order; ``in_order=False``: the same remaining samples), and the epochs
    after it reshuffle as the original's would. Built-in samplers resume by
    slicing; other samplers are fast-forwarded (see
    :meth:`load_state_dict`). An iterable dataset needs its own
    ``state_dict``/``load_state_dict``; with workers, each worker's copy is
    checkpointed and resumed on its own. The state follows the latest
    epoch started from this loader.

    Example::

        >>> import numpy as np
        >>> from aioload import ArrayDataset, DataLoader
        >>> loader = DataLoader(ArrayDataset(np.arange(10)), batch_size=4)
        >>> [batch[0].tolist() for batch in loader]
        [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]

        # inside a coroutine:
        # async for (x,) in loader: ...

        # flaky storage: retry transient errors, drop items that stay broken
        # loader = DataLoader(remote, batch_size=64, retry=RetryPolicy(attempts=4),
        #                     item_timeout=5.0, on_error="skip", max_skipped=0.01)
        # for batch in loader: ...
        # report = loader.skipped   # [SkippedItem(key=..., error_type=..., ...), ...]

        # checkpoint mid-epoch, resume after a restart
        # saved = json.dumps(loader.state_dict())
        # loader = DataLoader(same_dataset, batch_size=64, shuffle=True, generator=0)
        # loader.load_state_dict(json.loads(saved))
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Any = None,
        batch_sampler: Any = None,
        num_workers: int = 0,
        collate_fn: Callable[[Any], Any] | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: Any = None,
        generator: np.random.Generator | int | None = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        concurrency: int | None = None,
        max_worker_restarts: int = DEFAULT_MAX_WORKER_RESTARTS,
        retry: RetryPolicy | None = None,
        item_timeout: float | None = None,
        on_error: Literal["raise", "skip"] = "raise",
        max_skipped: int | float | None = None,
        executor: concurrent.futures.Executor | None = None,
    ) -> None:
        if not isinstance(num_workers, int) or isinstance(num_workers, bool):
            raise TypeError(f"num_workers should be an int; got {num_workers!r}")
        if num_workers < 0:
            raise ValueError(
                "num_workers option should be non-negative; "
                "use num_workers=0 to disable multiprocessing."
            )
        if timeout < 0:
            raise ValueError("timeout option should be non-negative")
        if prefetch_factor is not None:
            if not isinstance(prefetch_factor, int) or isinstance(prefetch_factor, bool):
                raise TypeError(f"prefetch_factor should be an int; got {prefetch_factor!r}")
            if prefetch_factor < 1:
                raise ValueError(
                    f"prefetch_factor should be a positive integer (batches in flight per "
                    f"worker); got {prefetch_factor}"
                )
        elif num_workers > 0:
            prefetch_factor = 2
        if persistent_workers and num_workers == 0 and executor is None:
            raise ValueError("persistent_workers option needs num_workers > 0")
        if concurrency is None:
            concurrency = DEFAULT_CONCURRENCY
        elif not isinstance(concurrency, int) or isinstance(concurrency, bool):
            raise TypeError(f"concurrency should be an int; got {concurrency!r}")
        elif concurrency < 1:
            raise ValueError(f"concurrency should be at least 1; got {concurrency}")
        if not isinstance(in_order, bool):
            raise TypeError(f"in_order should be a bool; got {in_order!r}")
        _check_multiprocessing_context(multiprocessing_context, num_workers)
        if (
            not isinstance(max_worker_restarts, int)
            or isinstance(max_worker_restarts, bool)
            or max_worker_restarts < 0
        ):
            raise ValueError(
                "max_worker_restarts should be a non-negative integer (worker deaths an epoch "
                f"survives by restarting the worker); got {max_worker_restarts!r}"
            )

        policy = FaultPolicy(retry, item_timeout, on_error, max_skipped)

        protocol = inspect_dataset(dataset)
        if protocol.iterable and policy.active:
            raise ValueError(
                "retry, item_timeout and on_error='skip' apply to map-style datasets only: "
                "an iterable dataset's stream cannot read a sample again; leave them at "
                "their defaults (retry=None, item_timeout=None, on_error='raise')"
            )
        if executor is not None:
            check_executor(
                executor,
                num_workers=num_workers,
                persistent_workers=persistent_workers,
                iterable=protocol.iterable,
            )
        if protocol.iterable:
            if shuffle not in {False, None}:
                raise ValueError(
                    "DataLoader with IterableDataset: expected unspecified shuffle option, "
                    f"but got shuffle={shuffle}"
                )
            if sampler is not None:
                raise ValueError(
                    "DataLoader with IterableDataset: expected unspecified sampler option, "
                    f"but got sampler={sampler}"
                )
            if batch_sampler is not None:
                raise ValueError(
                    "DataLoader with IterableDataset: expected unspecified batch_sampler "
                    f"option, but got batch_sampler={batch_sampler}"
                )
        else:
            shuffle = bool(shuffle)

        if sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle")
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError(
                    "batch_sampler option is mutually exclusive "
                    "with batch_size, shuffle, sampler, and drop_last"
                )
            batch_size = None
            drop_last = False
        elif batch_size is None:
            if drop_last:
                raise ValueError(
                    "batch_size=None option disables auto-batching "
                    "and is mutually exclusive with drop_last"
                )
        else:
            _check_batch_size(batch_size)
            # torch's BatchSampler checks drop_last; the other branches only test its truth.
            if not isinstance(drop_last, bool):
                raise ValueError(
                    f"drop_last should be a boolean value, but got drop_last={drop_last!r}"
                )

        rng = _as_generator(generator)
        if not protocol.iterable:
            if sampler is None:
                sampler = (
                    RandomSampler(dataset, generator=rng) if shuffle else SequentialSampler(dataset)
                )
            if batch_size is not None and batch_sampler is None:
                batch_sampler = BatchSampler(sampler, batch_size, drop_last)

        self.dataset = dataset
        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor
        self.pin_memory = pin_memory
        self.pin_memory_device = pin_memory_device
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.multiprocessing_context = multiprocessing_context
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        self.generator = rng
        self.persistent_workers = persistent_workers
        self.in_order = in_order
        self.concurrency = concurrency
        self.max_worker_restarts = max_worker_restarts
        self.retry = retry
        self.item_timeout = item_timeout
        self.on_error = on_error
        self.max_skipped = max_skipped
        self.executor = executor
        # Who this loader is to its executor's workers, which keep its setup per epoch.
        self._executor_token = uuid.uuid4().hex
        # None keeps the default path free of any fault-policy machinery.
        self._policy = policy if policy.active else None
        self._skip_log: SkipLog | None = None  # the latest epoch's skips
        self._protocol = protocol
        if collate_fn is None:
            collate_fn = default_collate if self._auto_collation else default_convert
        self.collate_fn = collate_fn
        self._window = self._window_size()
        self._pin_pool: Any = None
        self._pin_lock = threading.Lock()
        self._stats = StatsRecorder()
        self._pool: WorkerPool | None = None  # the persistent workers, once started
        self._pool_lock = threading.Lock()
        self._epochs = itertools.count()  # numbers epochs within a worker pool
        self._epoch = 0  # epochs started (or resumed past, after load_state_dict)
        self._start: EpochStart | None = None  # what replays the latest epoch's start
        self._resume: Resume | None = None  # loaded by load_state_dict for the next epoch
        self._loaded: dict[str, Any] | None = None  # that state, until the next epoch starts
        if isinstance(max_skipped, float) and self._epoch_items() is None:
            raise ValueError(
                f"max_skipped={max_skipped!r} is a fraction of the epoch's items, but the "
                "sampler has no length; give a count (an int) instead"
            )
        self.__initialized = True

    def __setattr__(self, attr: str, value: Any) -> None:
        if attr in _FROZEN_AFTER_INIT and self.__dict__.get("_DataLoader__initialized"):
            raise ValueError(
                f"{attr} attribute should not be set after {type(self).__name__} is initialized"
            )
        super().__setattr__(attr, value)

    @property
    def _auto_collation(self) -> bool:
        return self.batch_sampler is not None or (
            self._protocol.iterable and self.batch_size is not None
        )

    @property
    def _index_sampler(self) -> Any:
        return self.batch_sampler if self.batch_sampler is not None else self.sampler

    def _window_size(self) -> int:
        if self.executor is not None:
            return (self.prefetch_factor or 2) * (executor_size(self.executor) or 1)
        if self.prefetch_factor is not None:
            per_worker = self.prefetch_factor
        elif self.num_workers > 0:
            per_worker = 2
        else:
            batch = self.batch_size or getattr(self.batch_sampler, "batch_size", None)
            if not isinstance(batch, int) or batch < 1:
                batch = 32 if self.batch_sampler is not None else 1
            per_worker = max(4, 2 * math.ceil(self.concurrency / batch))
        return per_worker * max(1, self.num_workers)

    @property
    def window(self) -> int:
        """The most batches in flight at once: ``prefetch_factor × max(1, num_workers)``.

        With an ``executor``: ``prefetch_factor`` (default 2) × the executor's
        workers (its threads, processes, or the dask cluster's threads when the
        loader was built).
        """
        return self._window

    def __len__(self) -> int:
        if self._protocol.iterable:
            length = len(self.dataset)
            if self.batch_size is not None:
                if self.drop_last:
                    return length // self.batch_size
                return math.ceil(length / self.batch_size)
            return int(length)
        return len(self._index_sampler)

    @property
    def skipped(self) -> list[SkippedItem]:
        """The items the latest epoch skipped (``on_error='skip'``), with why.

        Read it after the epoch (for a report) or during it; a new iteration
        starts a new list. Each :class:`~aioload.SkippedItem` has the key, the
        last error's type and message, the attempts made and the worker.

        Example::

            for batch in loader:
                ...
            for item in loader.skipped:
                print(item)   # key 17: builtins.OSError: connection reset (3 attempts)
        """
        log = self._skip_log
        return [] if log is None else log.items

    def stats(self) -> LoaderStats:
        """A snapshot of what this loader has done and where it stands.

        Recording is always on and costs a few counter updates per batch; the
        snapshot (percentiles included) is only computed here. Call it from
        any thread, during an iteration or after it. ``stats().epoch`` covers
        the latest iteration, ``stats().total`` every iteration of the loader;
        the fetch-latency percentiles are over the latest 1024 batches, and
        the in-flight figures are those of the moment. The one figure that
        says whether training is data-bound: ``stats().epoch.stall_fraction``,
        the share of the iteration the consumer spent waiting for a batch.
        See :class:`~aioload.stats.LoaderStats` for every field.

        Example::

            for step, batch in enumerate(loader):
                train(batch)
                if step % 100 == 0:
                    log.info("%s", loader.stats())   # a one-line summary
            print(loader.stats().epoch.stall_fraction)   # 0.02: the model sets the pace
        """
        return self._stats.snapshot()

    def _epoch_items(self) -> int | None:
        """How many items an epoch asks for, when the samplers tell (None: unknown)."""
        try:
            if self.batch_sampler is None:
                return len(self.sampler)
            sampler = getattr(self.batch_sampler, "sampler", None)
            batch_size = getattr(self.batch_sampler, "batch_size", None)
            if sampler is None or not isinstance(batch_size, int) or batch_size < 1:
                return None
            items = len(sampler)
        except TypeError:
            return None
        if getattr(self.batch_sampler, "drop_last", False):
            items -= items % batch_size
        return items

    def __iter__(self) -> SyncBatchIterator:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise RuntimeError(
                "a DataLoader cannot be iterated with a plain `for` inside a running event "
                "loop (it would block the loop); use `async for batch in loader` instead"
            )
        return SyncBatchIterator(self._new_epoch, self.timeout)

    def __aiter__(self) -> AsyncBatchIterator:
        return AsyncBatchIterator(self._new_epoch, self.timeout)

    def _new_epoch(
        self,
        loop: asyncio.AbstractEventLoop,
        output: LoopOutput | ThreadOutput,
        offload_sync: bool,
    ) -> Epoch:
        collate_fn = self.collate_fn
        batch_size = self.batch_size if self._auto_collation else None
        resume, self._resume, self._loaded = self._resume, None, None
        # A checkpoint replays this epoch's start from the generator state before the draw.
        generator_before = (
            None if self.generator is None else _plain(self.generator.bit_generator.state)
        )
        # Drawn every epoch, whatever num_workers, before the sampler draws (as
        # torch does), so a seeded generator shuffles alike with or without workers.
        # Without a generator every epoch gets fresh entropy, like the samplers.
        rng = self.generator if self.generator is not None else np.random.default_rng()
        base_seed = int(rng.integers(1 << 62))
        if resume is not None:
            base_seed = resume.base_seed  # the same draw, or the one recorded without a generator
        start, on_iter, record_state = self._track_epoch(resume, base_seed, generator_before)
        policy = self._policy
        skips = None
        if policy is not None and policy.on_error == "skip":
            skips = SkipLog(policy.skip_limit(self._epoch_items()), policy.max_skipped)
        self._skip_log = skips
        stats = self._stats.new_epoch(collated=self._auto_collation, batch_size=batch_size)
        make_backend: BackendFactory
        if self.num_workers > 0:
            make_backend = self._process_backend_factory(
                base_seed, start.progress, resumed=resume is not None, stats=stats
            )
        elif self.executor is not None:
            make_backend = self._executor_backend_factory(base_seed)
        else:
            fetcher = Fetcher(self.dataset, self._protocol)

            def make_backend(
                task_group: anyio.abc.TaskGroup, complete: Completion
            ) -> InlineBackend:
                return InlineBackend(
                    fetcher,
                    collate_fn,
                    batch_size=batch_size,
                    drop_last=self.drop_last,
                    concurrency=self.concurrency,
                    # Under the sync facade too, a sync read that retries runs in a
                    # thread: its backoff waits then never hold up the loop, and
                    # closing the epoch cuts them short.
                    offload_sync=offload_sync or (policy is not None and policy.retry is not None),
                    task_group=task_group,
                    complete=complete,
                    policy=policy,
                    record_state=record_state,
                    on_retry=stats.retried,
                )

        return Epoch(
            None if self._protocol.iterable else self._index_sampler,
            make_backend,
            window=self._window,
            in_order=self.in_order,
            output=output,
            loop=loop,
            pin=self._pinner() if self.pin_memory else None,
            skips=skips,
            progress=start.progress,
            on_iter=on_iter,
            fast_forward=0 if resume is None else resume.fast_forward,
            stats=stats,
        )

    def _track_epoch(
        self, resume: Resume | None, base_seed: int, generator_before: Any
    ) -> tuple[EpochStart, Callable[[], None] | None, Callable[[int], None] | None]:
        """Records what replays a new epoch's start (see :meth:`state_dict`).

        Returns the record, the hook the scheduler calls once the sampler's
        iterator is open, and what records an iterable dataset's state per batch.
        """
        sampler: Any = None if self._protocol.iterable else self._index_sampler
        stream = self._protocol.iterable and _stateful(self.dataset)
        stream_state = None if resume is None else copy.deepcopy(resume.stream_state)
        if stream and self.num_workers > 0 and stream_state is None:
            stream_state = {"workers": [None] * self.num_workers, "next_worker": 0}
        progress = Progress(
            self.in_order,
            0 if resume is None else resume.done,
            () if resume is None else resume.received,
            stream=stream,
            stream_state=stream_state,
        )
        start = EpochStart(
            number=self._epoch,
            base_seed=base_seed,
            generator=generator_before,
            sampler_before=sampler.state_dict() if _stateful(sampler) else None,
            progress=progress,
        )
        self._epoch += 1
        self._start = start
        on_iter = None
        if count_field(sampler) is not None:
            assert sampler is not None

            def on_iter() -> None:
                # A built-in sampler's state once its iteration began: its start and a
                # count that state_dict() lowers to what the consumer received.
                start.sampler_after = sampler.state_dict()

        record_state = None
        states = progress.stream_states
        if states is not None and self.num_workers == 0:
            dataset = self.dataset

            def record_state(seq: int) -> None:
                states[seq] = (None, dataset.state_dict())

        return start, on_iter, record_state

    def _check_checkpointable(self) -> None:
        if not self._protocol.iterable:
            return
        if not _stateful(self.dataset):
            raise TypeError(
                f"this DataLoader cannot checkpoint: its iterable dataset "
                f"{type(self.dataset).__name__} has no state_dict()/load_state_dict(), so a "
                "checkpoint could not say where its stream stood"
            )

    def state_dict(self) -> dict[str, Any]:
        """Returns where the loader stands, as a small JSON-serialisable dict.

        Call it from the consumer's side, between two batches of an epoch
        (``for`` or ``async for``), after an epoch, after a ``break``, or before
        the first iteration. A loader built with the same dataset and arguments
        that loads the state with :meth:`load_state_dict` continues from there:
        the rest of the epoch in progress, then the following epochs,
        reshuffles included. The state describes what the consumer has
        *received*, not what was fetched ahead.

        Raises:
            TypeError: the dataset is iterable and has no ``state_dict``.

        Example::

            for step, batch in enumerate(loader):
                train(batch)
                if step % 1000 == 0:
                    save(json.dumps(loader.state_dict()))
        """
        self._check_checkpointable()
        if self._loaded is not None:
            return copy.deepcopy(self._loaded)
        start = self._start
        if start is None or start.progress.finished:
            return self._between_epochs(self._epoch, self._generator_state(), self._sampler_state())
        done, received = start.progress.position()
        sampler = None if self._protocol.iterable else self._index_sampler
        sampler_state = start.sampler_before
        count = count_field(sampler)
        if count is not None:
            after = start.sampler_after
            if after is None:
                # The sampler was not iterated yet, so nothing was received: the
                # state is that of the moment before this epoch began.
                return self._between_epochs(start.number, start.generator, sampler_state)
            sampler_state = {**after, "in_progress": True, count: done}
        return {
            "type": "DataLoader",
            "version": STATE_VERSION,
            "in_progress": True,
            "epoch": start.number,
            "batches": done,
            "received": received,
            "base_seed": start.base_seed,
            "generator": start.generator,
            "sampler": sampler_state,
            "dataset": start.progress.stream_state,
        }

    def _generator_state(self) -> Any:
        return None if self.generator is None else _plain(self.generator.bit_generator.state)

    def _sampler_state(self) -> Any:
        sampler: Any = None if self._protocol.iterable else self._index_sampler
        return sampler.state_dict() if _stateful(sampler) else None

    def _between_epochs(self, epoch: int, generator: Any, sampler: Any) -> dict[str, Any]:
        return {
            "type": "DataLoader",
            "version": STATE_VERSION,
            "in_progress": False,
            "epoch": epoch,
            "batches": 0,
            "received": [],
            "base_seed": None,
            "generator": generator,
            "sampler": sampler,
            "dataset": None,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores a state from :meth:`state_dict`; the next iteration continues from it.

        Load it into a loader built with the same dataset and arguments (and
        not iterating). The next epoch yields, with ``in_order=True``, exactly
        the batches the interrupted run had not yet yielded, in the same order;
        with ``in_order=False``, exactly the samples it had not yet yielded.
        The epochs after it are the original's.

        How the sampler is moved: a built-in sampler (and a
        :class:`~aioload.BatchSampler` over any sampler) loads its own state
        and skips what was received by slicing, at no per-key cost (a
        ``BatchSampler`` over a user sampler draws and drops the keys). Any
        other sampler, with ``state_dict``/``load_state_dict`` or without
        (which must then yield the same keys on every pass), is restored to
        the start of the epoch and fast-forwarded by drawing and dropping one
        item per batch already received: O(batches received) work on resume.
        An iterable dataset gets its ``load_state_dict`` called with its state
        as of the last batch received; its ``state_dict()`` must return a new
        JSON-serialisable object describing the samples taken so far from the
        current ``iter(dataset)``, and its ``load_state_dict(state)`` must make
        the next ``iter(dataset)`` continue after them.

        Args:
            state: the dict :meth:`state_dict` returned, possibly through JSON.

        Raises:
            ValueError: the state is not a DataLoader state of this version, or
                does not fit this loader (a generator state where it has none,
                a sampler state where its sampler has no ``state_dict``, ...).
            TypeError: as :meth:`state_dict`.

        Example::

            loader = DataLoader(dataset, batch_size=64, shuffle=True, generator=0)
            loader.load_state_dict(json.loads(saved))
            for batch in loader:   # the rest of the interrupted epoch
                ...
        """
        self._check_checkpointable()
        in_progress, epoch, done, received, base_seed = check_state(state)
        sampler = None if self._protocol.iterable else self._index_sampler
        sampler_state = state.get("sampler")
        if _stateful(sampler) != (sampler_state is not None):
            raise ValueError(
                f"DataLoader state has {'no' if sampler_state is None else 'a'} sampler state, "
                f"but this loader's {type(sampler).__name__} has "
                f"{'' if sampler_state is None else 'no '}state_dict(): build the loader with "
                "the same arguments"
            )
        generator = state.get("generator")
        if (generator is None) != (self.generator is None):
            raise ValueError(
                "DataLoader state has "
                + (
                    "no generator state, but this loader has a generator"
                    if generator is None
                    else "a generator state, but this loader has generator=None"
                )
                + ": build the loader with the same arguments"
            )
        if generator is not None:
            if not isinstance(generator, Mapping):
                raise ValueError("DataLoader state field 'generator' should be a dict or None")
            _check_generator_state(generator, "DataLoader", self.generator)
        if sampler is not None and sampler_state is not None:
            try:
                sampler.load_state_dict(sampler_state)
            except Exception as exc:
                exc.add_note("raised while loading the DataLoader's sampler state")
                raise
        if self.generator is not None and generator is not None:
            # After the sampler's: a sampler sharing the generator set it to the start
            # of its own iteration, which comes after the loader's base-seed draw.
            self.generator.bit_generator.state = generator
        dataset_state = state.get("dataset")
        if in_progress and dataset_state is not None:
            if self.num_workers > 0:
                check_worker_streams(dataset_state, self.num_workers)  # loaded in each worker
            else:
                self.dataset.load_state_dict(dataset_state)
        self._epoch = epoch
        self._start = None
        self._resume = None
        if in_progress:
            self._resume = Resume(
                done=done,
                received=received,
                base_seed=base_seed,
                fast_forward=0 if count_field(sampler) is not None else done,
                stream_state=dataset_state,
            )
        self._loaded = copy.deepcopy(dict(state))

    def _process_backend_factory(
        self,
        base_seed: int,
        progress: Progress,
        *,
        resumed: bool,
        stats: EpochRecorder | None = None,
    ) -> BackendFactory:
        persistent = self.persistent_workers
        if persistent:
            with self._pool_lock:
                if self._pool is None or self._pool.closed:
                    self._pool = self._new_pool(base_seed)
                pool = self._pool
        else:
            pool = self._new_pool(base_seed)
        epoch = next(self._epochs)
        # A tracked stream: each worker's state rides with its batches; a resumed
        # epoch starts each worker's stream where the checkpoint left it.
        states = progress.stream_states
        record = None if states is None else functools.partial(record_in, states)
        resume_streams, first_worker = None, 0
        if states is not None and resumed:
            resume_streams = list(progress.stream_state["workers"])
            first_worker = progress.stream_state["next_worker"]

        def make_backend(task_group: anyio.abc.TaskGroup, complete: Completion) -> ProcessBackend:
            return ProcessBackend(
                pool,
                owns_pool=not persistent,
                epoch=epoch,
                iterable=self._protocol.iterable,
                max_restarts=self.max_worker_restarts,
                task_group=task_group,
                complete=complete,
                resume_streams=resume_streams,
                first_worker=first_worker,
                record_stream_state=record,
                stats=stats,
            )

        return make_backend

    def _worker_setup(self, num_workers: int, track_stream_state: bool = False) -> WorkerSetup:
        """What every worker (process or executor task) needs to read batches."""
        return WorkerSetup(
            dataset=self.dataset,
            collate_fn=self.collate_fn,
            worker_init_fn=self.worker_init_fn,
            batch_size=self.batch_size if self._auto_collation else None,
            drop_last=self.drop_last,
            concurrency=self.concurrency,
            num_workers=num_workers,
            policy=self._policy,
            track_stream_state=track_stream_state,
        )

    def _executor_backend_factory(self, base_seed: int) -> BackendFactory:
        executor = self.executor
        assert executor is not None
        setup = self._worker_setup(executor_size(executor) or 1)
        key = (self._executor_token, next(self._epochs))

        def make_backend(task_group: anyio.abc.TaskGroup, complete: Completion) -> ExecutorBackend:
            return ExecutorBackend(
                executor,
                setup,
                key=key,
                base_seed=base_seed,
                task_group=task_group,
                complete=complete,
                max_resubmits=self.max_worker_restarts,
            )

        return make_backend

    def _new_pool(self, base_seed: int) -> WorkerPool:
        setup = self._worker_setup(
            self.num_workers,
            track_stream_state=self._protocol.iterable and _stateful(self.dataset),
        )
        pool = WorkerPool(
            setup,
            start_method_context(self.multiprocessing_context),
            base_seed,
            keep_free=(self.prefetch_factor or 2) + 2,
        )
        if self.persistent_workers:
            # The workers go when the loader is closed or collected, or at exit.
            weakref.finalize(self, pool.close)
        return pool

    def close(self) -> None:
        """Stops the persistent worker processes (``persistent_workers=True``).

        They also stop when the loader is garbage-collected and at interpreter
        exit; a later iteration starts new ones. Without persistent workers
        there is nothing to close: every epoch stops its own workers.
        """
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    def __enter__(self) -> DataLoader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _pinner(self) -> Callable[[Any], Any]:
        from aioload.pinning import PinnedBufferPool, pin_batch

        with self._pin_lock:
            if self._pin_pool is None:
                self._pin_pool = PinnedBufferPool()
            pool = self._pin_pool
        device = self.pin_memory_device

        def pin(batch: Any) -> Any:
            return pin_batch(batch, pool, device=device)

        return pin


def _check_batch_size(batch_size: Any) -> None:
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0:
        raise ValueError(
            "batch_size should be a positive integer value or None, "
            f"but got batch_size={batch_size!r}"
        )


def _check_multiprocessing_context(context: Any, num_workers: int) -> None:
    if context is None:
        return
    if num_workers == 0:
        raise ValueError(
            "multiprocessing_context can only be used with multi-process loading "
            f"(num_workers > 0), but got num_workers={num_workers}"
        )
    if isinstance(context, str):
        start_methods = multiprocessing.get_all_start_methods()
        if context not in start_methods:
            raise ValueError(
                "multiprocessing_context option should specify a valid start method in "
                f"{start_methods!r}, but got multiprocessing_context={context!r}"
            )
    elif not isinstance(context, multiprocessing.context.BaseContext):
        raise TypeError(
            "multiprocessing_context option should be a valid context object or a string "
            f"specifying the start method, but got multiprocessing_context={context!r}"
        )
