"""DataLoader: torch's arguments and semantics, iterated with ``async for`` or ``for``.

The public class and nothing more: its arguments (checked by
:mod:`aioload.pipeline.arguments`), ``len``, ``__iter__``/``__aiter__``, ``close``. An
epoch is assembled from the loader's samplers, a backend built by
:class:`~aioload.backends.factory.Backends` and the checkpoint record of
:class:`~aioload.pipeline.checkpoint.Checkpoints`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
from collections.abc import Callable, Mapping
from typing import Any, Generic, Literal, TypeVar

from aioload.backends.factory import Backends
from aioload.backends.processes.main_module import check_script_for_workers
from aioload.collate.core import default_collate, default_convert
from aioload.faults.policy import RetryPolicy, SkipLog, SkippedItem
from aioload.pipeline.arguments import (
    DEFAULT_CONCURRENCY,
    DEFAULT_MAX_WORKER_RESTARTS,
    check_arguments,
    epoch_items,
    warn_excessive_workers,
    window_size,
)
from aioload.pipeline.checkpoint import Checkpoints
from aioload.pipeline.handoff import LoopOutput, ThreadOutput
from aioload.pipeline.iteration import (
    AsyncBatchIterator,
    EpochFactory,
    ReportedLength,
    SyncBatchIterator,
)
from aioload.pipeline.notebook import check_workers_can_import, is_ipython_loop
from aioload.pipeline.pin_stage import Pinner
from aioload.pipeline.scheduler import Epoch
from aioload.ranks import ranks_for_workers
from aioload.read.reader import WorkerSetup
from aioload.samplers.builtin import GeneratorLike
from aioload.samplers.offered import unsized_message
from aioload.stats.recorder import LoaderStats, StatsRecorder

__all__ = ["DEFAULT_CONCURRENCY", "DEFAULT_MAX_WORKER_RESTARTS", "DataLoader"]

T_co = TypeVar("T_co", covariant=True)

_FROZEN_AFTER_INIT = (
    "batch_size",
    "batch_sampler",
    "sampler",
    "drop_last",
    "dataset",
    "persistent_workers",
    "executor",
    # What the window and the backend were sized and chosen by (torch reads them per
    # iterator; here they are settled at construction, so a change would go unnoticed).
    "num_workers",
    "prefetch_factor",
    "concurrency",
    "in_order",
    "generator",
    # The fault policy is settled at construction (and sent to persistent workers).
    "retry",
    "item_timeout",
    "on_error",
    "max_skipped",
)


class DataLoader(Generic[T_co]):
    """Combines a dataset and a sampler and iterates over batches of the dataset.

    The arguments, defaults and errors are torch's ``DataLoader``'s; batches
    are numpy arrays (see :func:`aioload.default_collate`), or torch tensors
    with ``from aioload.torch import DataLoader`` (see :mod:`aioload.torch`). Iterate with
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
            Without it (and without ``batch_sampler``) the keys come from the
            dataset's own ``default_sampler(shuffle, generator)`` where it has one
            (a dataset that lists its keys as it goes, such as
            :class:`~aioload.sources.ObjectDataset` without ``keys``; see
            :mod:`aioload.samplers.offered`), else from a ``SequentialSampler``, or a
            ``RandomSampler`` with ``shuffle``.
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
            thread, before returning it: torch's pinned memory where torch is
            imported and its accelerator available (numpy arrays stay numpy
            arrays, and CUDA copies from them asynchronously), ``mlock``-ed
            buffers otherwise (see :mod:`aioload.memory.pinned`).
        drop_last: drop the last incomplete batch.
        timeout: seconds to wait for the next batch before raising
            :class:`~aioload.LoaderTimeoutError` (0: wait forever).
        worker_init_fn: called with the worker id in each worker process,
            after its generators are seeded as torch seeds them (Python's
            ``random`` and torch if imported with ``base_seed + id``, numpy's
            legacy global state with words derived from both, where
            ``base_seed`` is drawn from ``generator`` every epoch).
        multiprocessing_context: ``'fork'``, ``'spawn'``, ``'forkserver'`` or a
            context object. Left unset (None), as in torch, multiprocessing's
            default context (``set_start_method`` honoured): ``fork`` on Linux
            up to Python 3.13, whatever Python threads run (the workers inherit
            the dataset; a script needs no ``__main__`` guard). Where obstore's
            or CUDA's runtime runs in the process, a fork of it would not work:
            workers then come from aioload's fork template, forked before that
            runtime started. The rule, and when the dataset must be picklable
            and the script guarded: :mod:`aioload.backends.processes.start_method`.
        generator: what the epoch's base seed and the shuffle (``shuffle=True``)
            are drawn from: a ``numpy.random.Generator``, an int seed, or a
            ``torch.Generator`` (torch's own draw of the base seed from it every
            epoch, then one seed for the shuffle, so it advances as under
            torch). A fixed seed makes the sequence of epochs reproducible.
            None, as in torch, draws from the global state: torch's default
            generator when torch is imported (``torch.manual_seed(0)``
            reproduces the run), else numpy's (``np.random.seed(0)`` does).
        prefetch_factor: batches in flight per worker (``num_workers > 0``,
            default 2). Unlike torch it is also allowed with
            ``num_workers=0``, where it sizes the window of batches in flight
            on the event loop. The default there is sized by what the window
            serves — twice the batches that keep ``concurrency`` items in
            flight, ``max(16, 2 * ceil(concurrency / batch_size))``, for an
            async dataset (for a ``thread_safe`` sync one, its 8 threads' worth;
            else 16: a stream or a sync dataset reads one batch at a time) —
            and held to 256 MiB of batches
            (:data:`~aioload.pipeline.arguments.DEFAULT_WINDOW_BYTES`): the epoch starts
            with 4 batches in flight and sizes the window as it measures them.
            An explicit ``prefetch_factor`` is taken as it is.
        persistent_workers: keep the worker processes (and their dataset
            copies) between epochs; they stop at :meth:`close`, when the loader
            is collected, or at exit.
        pin_memory_device: the device whose accelerator pins (``""``: CUDA).
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
            float between 0 and 1, which needs a sampler with a length; a
            stream takes a count). One more ends the epoch with
            :class:`~aioload.TooManySkippedError`, listing every skipped key and
            reason. None (the default): no limit.
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
    map-style datasets, and (but for ``item_timeout``) to the iterable
    datasets that can skip a sample without ending their stream, through a
    ``guarded_stream`` method (:mod:`aioload.faults.guard`; ``ShardDataset``
    and ``MixDataset`` have one); it runs where items are read, inside the
    workers when ``num_workers > 0``.

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

    # What collate_fn=None stands for (aioload.torch.DataLoader's return tensors).
    _default_collate_fn: Callable[[Any], Any] = staticmethod(default_collate)
    _default_convert_fn: Callable[[Any], Any] = staticmethod(default_convert)

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
        generator: GeneratorLike = None,
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
        arguments = check_arguments(
            dataset,
            batch_size=batch_size,
            shuffle=shuffle,
            sampler=sampler,
            batch_sampler=batch_sampler,
            num_workers=num_workers,
            drop_last=drop_last,
            timeout=timeout,
            multiprocessing_context=multiprocessing_context,
            generator=generator,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            in_order=in_order,
            concurrency=concurrency,
            max_worker_restarts=max_worker_restarts,
            retry=retry,
            item_timeout=item_timeout,
            on_error=on_error,
            max_skipped=max_skipped,
            executor=executor,
        )
        protocol = arguments.protocol
        self.dataset = dataset
        self.num_workers = num_workers
        self.prefetch_factor = arguments.prefetch_factor
        self.pin_memory = pin_memory
        self.pin_memory_device = pin_memory_device
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.multiprocessing_context = multiprocessing_context
        self.batch_size = arguments.batch_size
        self.drop_last = arguments.drop_last
        self.sampler = arguments.sampler
        self.batch_sampler = arguments.batch_sampler
        self.generator = arguments.generator
        self.persistent_workers = persistent_workers
        self.in_order = in_order
        self.concurrency = arguments.concurrency
        self.max_worker_restarts = max_worker_restarts
        self.retry = retry
        self.item_timeout = item_timeout
        self.on_error = on_error
        self.max_skipped = max_skipped
        self.executor = executor
        policy = arguments.policy
        # None keeps the default path free of any fault-policy machinery.
        self._policy = policy if policy.active else None
        self._skip_log: SkipLog | None = None  # the latest epoch's skips
        # What len(loader) last reported for an iterable dataset (torch's
        # _IterableDataset_len_called): an epoch that overruns it warns.
        self._len_reported: int | None = None
        self._protocol = protocol
        self._sampler_offered = arguments.sampler_offered
        if collate_fn is None:
            collate_fn = (
                self._default_collate_fn if self._auto_collation else self._default_convert_fn
            )
        self.collate_fn = collate_fn
        self._window, self._window_bytes = window_size(
            protocol=protocol,
            num_workers=num_workers,
            prefetch_factor=self.prefetch_factor,
            concurrency=self.concurrency,
            batch_size=self.batch_size,
            batch_sampler=self.batch_sampler,
            executor=executor,
        )
        self._pinner = Pinner()
        self._stats = StatsRecorder()
        self._backends = Backends(
            protocol,
            num_workers=num_workers,
            executor=executor,
            persistent_workers=persistent_workers,
            prefetch_factor=self.prefetch_factor,
        )
        self._checkpoints = Checkpoints(
            dataset,
            None if protocol.iterable else self._index_sampler,
            self.generator,
            iterable=protocol.iterable,
            num_workers=num_workers,
            in_order=in_order,
            batch_size=self.batch_size,
            drop_last=self.drop_last,
        )
        self._backends.warm_up(multiprocessing_context)
        warn_excessive_workers(num_workers, stacklevel=2)  # as torch: here and at every iter()
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
            length = self._len_reported = len(self.dataset)
            if self.batch_size is not None:
                if self.drop_last:
                    return length // self.batch_size
                return math.ceil(length / self.batch_size)
            return int(length)
        try:
            return len(self._index_sampler)
        except TypeError as error:
            if not self._sampler_offered:
                raise
            raise TypeError(unsized_message(self.dataset, self.sampler)) from error

    @property
    def skipped(self) -> list[SkippedItem]:
        """The items the latest epoch skipped (``on_error='skip'``), with why.

        Read it after the epoch (for a report) or during it; a new iteration
        starts a new list. Each :class:`~aioload.SkippedItem` has the key, the
        last error's type and message, the attempts made and the worker.

        Example::

            >>> from aioload import DataLoader, Dataset, RetryPolicy
            >>> class Flaky(Dataset):
            ...     def __getitem__(self, i):
            ...         if i == 17:
            ...             raise ConnectionResetError("connection reset")
            ...         return i
            ...     def __len__(self):
            ...         return 64
            >>> retry = RetryPolicy(attempts=3, backoff=0)
            >>> loader = DataLoader(Flaky(), batch_size=16, retry=retry, on_error="skip")
            >>> [len(batch) for batch in loader]
            [16, 15, 16, 16]
            >>> for item in loader.skipped:
            ...     print(item)
            key 17: builtins.ConnectionResetError: connection reset (3 attempts)
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
        See :class:`~aioload.stats.recorder.LoaderStats` for every field.

        Example::

            >>> import numpy as np
            >>> from aioload import ArrayDataset, DataLoader
            >>> loader = DataLoader(ArrayDataset(np.zeros((1000, 8), np.float32)), batch_size=100)
            >>> for step, batch in enumerate(loader):
            ...     if step % 5 == 0:
            ...         summary = str(loader.stats())   # a one-line summary, for a log
            >>> loader.stats().epoch.batches, loader.stats().epoch.items
            (10, 1000)
            >>> 0 <= loader.stats().epoch.stall_fraction <= 1   # near 0: the model sets the pace
            True
        """
        return self._stats.snapshot()

    def __iter__(self) -> SyncBatchIterator:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            # A notebook cell runs on the kernel's running loop: blocking it for the
            # cell is what the user asks for there (see aioload.pipeline.notebook).
            if not is_ipython_loop(loop):
                raise RuntimeError(
                    "a DataLoader cannot be iterated with a plain `for` inside a running event "
                    "loop (it would block the loop); use `async for batch in loader` instead "
                    "(IPython and Jupyter cells are exempt: there `for` blocks the cell)"
                )
        self._check_workers_can_start()
        warn_excessive_workers(self.num_workers, stacklevel=2)
        self._warn_if_tensors_cannot_pin()
        new_epoch = self._prepare_epoch(offload_sync=self.timeout > 0)
        return SyncBatchIterator(new_epoch, self.timeout, self._reported_length())

    def __aiter__(self) -> AsyncBatchIterator:
        self._check_workers_can_start()
        warn_excessive_workers(self.num_workers, stacklevel=2)
        self._warn_if_tensors_cannot_pin()
        return AsyncBatchIterator(self._new_epoch, self.timeout, self._reported_length())

    def _new_epoch(
        self, loop: asyncio.AbstractEventLoop, output: LoopOutput | ThreadOutput, offload: bool
    ) -> Epoch:
        # Made on the loop at once (the first __anext__ of async for): workers fork on
        # the loop's thread if nothing else runs.
        return self._epoch_parts(offload)(loop, output, offload)

    def _reported_length(self) -> ReportedLength | None:
        reported = self._len_reported
        return (
            None if reported is None else ReportedLength(self.dataset, reported, self.num_workers)
        )

    def _check_workers_can_start(self) -> None:
        """Refuses, before a worker starts, what workers would fail to import or run."""
        objects = {
            "dataset": self.dataset,
            "collate_fn": self.collate_fn,
            "worker_init_fn": self.worker_init_fn,
            "policy": self._policy,
        }
        start = self._backends.start_now(self.multiprocessing_context, objects)
        if start is None:
            return
        check_workers_can_import(objects, start.method)
        check_script_for_workers(objects, start.method, in_the_way=start.in_the_way)

    def _warn_if_tensors_cannot_pin(self) -> None:
        # Called by __iter__/__aiter__: the warning points at the line that iterates.
        if self.pin_memory:
            from aioload.memory.pinned import warn_if_tensors_cannot_pin

            warn_if_tensors_cannot_pin(self.pin_memory_device, stacklevel=3)

    def _prepare_epoch(self, offload_sync: bool) -> EpochFactory:
        """Everything of a new epoch but its loop: what makes the epoch on the loop.

        Called in the thread that iterates, before aioload starts a thread for
        the epoch, so that the epoch's workers can be forked (see
        :mod:`aioload.backends.processes.start_method`). An error is raised where the
        epoch would have been made, as if it had happened there.
        """
        try:
            return self._epoch_parts(offload_sync)
        except Exception as error:
            failure = error

            def fail(*_: Any) -> Epoch:
                raise failure

            return fail

    def _epoch_parts(self, offload_sync: bool) -> EpochFactory:
        plan = self._checkpoints.start_epoch()
        policy = self._policy
        skips = None
        if policy is not None and policy.on_error == "skip":
            skips = SkipLog(
                policy.skip_limit(epoch_items(self.sampler, self.batch_sampler)),
                policy.max_skipped,
            )
        self._skip_log = skips
        batch_size = self.batch_size if self._auto_collation else None
        stats = self._stats.new_epoch(collated=self._auto_collation, batch_size=batch_size)
        make_backend = self._backends.for_epoch(
            self._worker_setup(),
            plan,
            stats,
            offload_sync=offload_sync,
            multiprocessing_context=self.multiprocessing_context,
            max_worker_restarts=self.max_worker_restarts,
            in_order=self.in_order,
        )

        # Here, in the thread that iterates: the pin thread pins for this thread's CUDA device.
        pin = self._pinner.for_device(self.pin_memory_device) if self.pin_memory else None

        def made(
            loop: asyncio.AbstractEventLoop, output: LoopOutput | ThreadOutput, _offload: bool
        ) -> Epoch:
            return Epoch(
                None if self._protocol.iterable else self._index_sampler,
                make_backend,
                window=self._window,
                window_bytes=self._window_bytes,
                in_order=self.in_order,
                output=output,
                loop=loop,
                pin=pin,
                skips=skips,
                progress=plan.received,
                on_iter=plan.on_iter,
                fast_forward=plan.fast_forward,
                stats=stats,
            )

        return made

    def _worker_setup(self) -> WorkerSetup:
        """What reading this epoch's batches needs, wherever they are read."""
        return WorkerSetup(
            dataset=self.dataset,
            collate_fn=self.collate_fn,
            worker_init_fn=self.worker_init_fn,
            batch_size=self.batch_size if self._auto_collation else None,
            auto_collation=self._auto_collation,
            drop_last=self.drop_last,
            concurrency=self.concurrency,
            num_workers=self.num_workers,
            policy=self._policy,
            track_stream_state=self._checkpoints.tracks_stream,
            ranks=ranks_for_workers(),
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

            >>> import json
            >>> import numpy as np
            >>> from aioload import ArrayDataset, DataLoader
            >>> dataset = ArrayDataset(np.arange(10))
            >>> loader = DataLoader(dataset, batch_size=4, shuffle=True, generator=0)
            >>> for step, (batch,) in enumerate(loader):
            ...     if step == 0:
            ...         saved = json.dumps(loader.state_dict())   # after the first batch
            >>> state = json.loads(saved)
            >>> state["in_progress"], state["batches"]
            (True, 1)
        """
        return self._checkpoints.state_dict()

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
            ValueError: the state is not a DataLoader state of this version,
                was altered, or does not fit this loader (another batch size,
                ``drop_last``, dataset length, sampler, ``in_order``; a generator
                state where it has none, ...): the error names the field, and
                nothing was loaded.
            TypeError: as :meth:`state_dict`.

        Example::

            >>> import json
            >>> import numpy as np
            >>> from aioload import ArrayDataset, DataLoader
            >>> dataset = ArrayDataset(np.arange(10))
            >>> loader = DataLoader(dataset, batch_size=4, shuffle=True, generator=0)
            >>> batches = iter(loader)
            >>> first = next(batches)
            >>> saved = json.dumps(loader.state_dict())   # then the run stops
            >>> rest = [batch.tolist() for batch, in batches]
            >>> loader = DataLoader(dataset, batch_size=4, shuffle=True, generator=0)
            >>> loader.load_state_dict(json.loads(saved))
            >>> [batch.tolist() for batch, in loader] == rest   # the rest of the interrupted epoch
            True
        """
        self._checkpoints.load_state_dict(state)

    def close(self) -> None:
        """Stops the persistent worker processes (``persistent_workers=True``).

        They also stop when the loader is garbage-collected and at interpreter
        exit; a later iteration starts new ones. Without persistent workers
        there is nothing to close: every epoch stops its own workers.
        """
        self._backends.close()

    def __enter__(self) -> DataLoader[T_co]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
