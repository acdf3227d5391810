"""LoaderSettings: every setting of a loader, spelled once — its default, its check, its doc.

A :class:`~aioload.DataLoader` takes torch's arguments (and aioload's own) and makes
one :class:`LoaderSettings` of them in ``__init__``; the epoch, its scheduler, the
backends and the checkpoints receive that object whole. Making it checks every
argument with torch's errors and messages (:mod:`aioload.settings.checks`, in
torch's order) and settles what the arguments leave open, once: the samplers, the
default ``collate_fn``, the generator, ``prefetch_factor`` and ``concurrency``,
and what follows from them (the dataset's protocol, the fault policy, automatic
batching, the index sampler, the window of batches in flight).

The settings are frozen. A few are *live* (:data:`LIVE_SETTINGS`): torch lets a
loader change them after construction (``loader.timeout = 5``), and each epoch
takes them as they stand when it starts; the loader then holds a
:meth:`~LoaderSettings.changed` copy. Every other is fixed once the loader is
built (torch's ``ValueError`` on setting it).

This package sits between ``backends`` (which receive the settings) and ``read``: it
imports only the packages below it and the leaves.
"""

from __future__ import annotations

import concurrent.futures
import copy
from collections.abc import Callable
from dataclasses import InitVar, dataclass, field, fields
from types import MappingProxyType
from typing import Any, Literal

from aioload.collate.core import default_collate, default_convert
from aioload.data.protocol import DatasetProtocol, inspect_dataset
from aioload.faults.guard import check_stream_policy
from aioload.faults.policy import FaultPolicy, RetryPolicy
from aioload.ranks import ranks_for_workers
from aioload.read.reader import WorkerSetup
from aioload.samplers.builtin import GeneratorLike, as_generator
from aioload.settings.checks import (
    AUTO_MOST_CONCURRENCY,
    DEFAULT_MAX_WORKER_RESTARTS,
    build_samplers,
    check_concurrency,
    check_in_order,
    check_max_skipped_fraction,
    check_max_worker_restarts,
    check_multiprocessing_context,
    check_num_workers,
    check_persistent_workers,
    check_prefetch_factor,
    check_sampling,
    check_timeout,
    epoch_items,
)
from aioload.settings.executors import check_executor
from aioload.settings.window import window_size

__all__ = [
    "LIVE_SETTINGS",
    "LOADER_ARGUMENTS",
    "LOADER_ATTRIBUTES",
    "LoaderSettings",
    "arguments_doc",
]

Collate = Callable[[Any], Any]


# Field metadata: a live setting, which torch lets a loader change after construction;
# a setting torch keeps no loader attribute of.
_LIVE = MappingProxyType({"live": True})
_NOT_AN_ATTRIBUTE = MappingProxyType({"attribute": False})


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class LoaderSettings:
    """A loader's settings: its arguments checked, and what they settle (see the module docstring).

    Each field is a :class:`~aioload.DataLoader` argument of the same name and
    default, and a loader attribute of the same name (but ``shuffle``, which torch
    keeps none of); after it are the values derived from them.

    Attributes:
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
            (:data:`~aioload.settings.DEFAULT_WINDOW_BYTES`): the epoch starts
            with 4 batches in flight and sizes the window as it measures them.
            An explicit ``prefetch_factor`` is taken as it is.
        persistent_workers: keep the worker processes (and their dataset
            copies) between epochs; they stop at :meth:`~aioload.DataLoader.close`, when the loader
            is collected, or at exit.
        pin_memory_device: the device whose accelerator pins (``""``: CUDA).
        in_order: yield batches in sampler order; ``False`` yields them as
            they finish, so one slow fetch does not hold the others back.
        concurrency: the most item fetches in flight at once on one event
            loop (default :data:`~aioload.DEFAULT_CONCURRENCY` = 256). With an async
            dataset every item of every batch in the window is fetched
            concurrently up to this cap. With workers, the cap is per worker.
            ``"auto"`` (aioload's own; torch has no such argument) tunes it while
            the loader reads: from :data:`~aioload.settings.checks.AUTO_START_CONCURRENCY`,
            up while throughput grows, down when latency rises without a gain or the
            store throttles, at most
            :data:`~aioload.settings.checks.AUTO_MOST_CONCURRENCY` within the window's
            memory budget; ``loader.stats().concurrency`` shows where it stands
            (see the docs' "Tuning reads").
        max_worker_restarts: worker processes that die (killed, out of memory,
            ``os._exit``) are restarted and the batches they held are fetched
            again, so the epoch still yields every sample exactly once; after
            this many restarts in one epoch (default
            :data:`~aioload.DEFAULT_MAX_WORKER_RESTARTS` = 3) the epoch fails with
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
            ``"aioload"``, level WARNING) and listed by :attr:`~aioload.DataLoader.skipped`. When
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
        protocol: the dataset's :class:`~aioload.read.fetch.DatasetProtocol`.
        policy: the fault policy of ``retry``, ``item_timeout``, ``on_error`` and
            ``max_skipped``; None when it changes nothing (torch's behaviour), which
            keeps the default path free of any fault-policy machinery.
        auto_collation: automatic batching: a map-style dataset's keys come in
            sequences (from the batch sampler), an iterable's samples are batched.
        index_sampler: what the epoch draws from: the batch sampler, else the
            sampler (None for an iterable dataset, which has neither).
        sampler_offered: the sampler is the dataset's own ``default_sampler()``.
        window: the most batches in flight at once (see
            :func:`~aioload.settings.window.window_size`).
        window_bytes: the memory budget the epoch sizes the window down to (None:
            the window is the user's).

    Example::

        >>> settings = LoaderSettings(dataset=range(10), batch_size=4, shuffle=True, generator=0)
        >>> type(settings.batch_sampler).__name__, settings.concurrency, settings.window
        ('BatchSampler', 256, 16)
        >>> settings.batch_size = 8
        Traceback (most recent call last):
            ...
        dataclasses.FrozenInstanceError: cannot assign to field 'batch_size'
        >>> LoaderSettings(dataset=range(10), sampler=range(10), shuffle=True)
        Traceback (most recent call last):
            ...
        ValueError: sampler option is mutually exclusive with shuffle
    """

    dataset: Any
    batch_size: int | None = 1
    shuffle: bool | None = field(default=None, metadata=_NOT_AN_ATTRIBUTE)
    sampler: Any = None
    batch_sampler: Any = None
    num_workers: int = 0
    collate_fn: Collate | None = field(default=None, metadata=_LIVE)
    pin_memory: bool = field(default=False, metadata=_LIVE)
    drop_last: bool = False
    timeout: float = field(default=0, metadata=_LIVE)
    worker_init_fn: Callable[[int], None] | None = field(default=None, metadata=_LIVE)
    multiprocessing_context: Any = field(default=None, metadata=_LIVE)
    generator: GeneratorLike = None
    prefetch_factor: int | None = None
    persistent_workers: bool = False
    pin_memory_device: str = field(default="", metadata=_LIVE)
    in_order: bool = True
    concurrency: int | Literal["auto"] | None = None
    max_worker_restarts: int = field(default=DEFAULT_MAX_WORKER_RESTARTS, metadata=_LIVE)
    retry: RetryPolicy | None = None
    item_timeout: float | None = None
    on_error: Literal["raise", "skip"] = "raise"
    max_skipped: int | float | None = None
    executor: concurrent.futures.Executor | None = None
    # What collate_fn=None stands for, with automatic batching and without
    # (aioload.torch.DataLoader's return tensors).
    collate_defaults: InitVar[tuple[Collate, Collate]] = (default_collate, default_convert)

    protocol: DatasetProtocol = field(init=False, repr=False)
    policy: FaultPolicy | None = field(init=False, repr=False)
    auto_collation: bool = field(init=False, repr=False)
    index_sampler: Any = field(init=False, repr=False)
    sampler_offered: bool = field(init=False, repr=False)
    window: int = field(init=False, repr=False)
    window_bytes: int | None = field(init=False, repr=False)
    most_concurrency: int = field(init=False, repr=False)

    def __post_init__(self, collate_defaults: tuple[Collate, Collate]) -> None:
        # torch's order: the first error found is the one raised.
        num_workers, executor = self.num_workers, self.executor
        check_num_workers(num_workers)
        check_timeout(self.timeout)
        prefetch_factor = check_prefetch_factor(self.prefetch_factor, num_workers=num_workers)
        check_persistent_workers(
            self.persistent_workers, num_workers=num_workers, executor=executor
        )
        concurrency = check_concurrency(self.concurrency)
        # "auto" tunes a limit up to this; the window is sized for it.
        most_concurrency = AUTO_MOST_CONCURRENCY if concurrency == "auto" else concurrency
        check_in_order(self.in_order)
        check_multiprocessing_context(self.multiprocessing_context, num_workers=num_workers)
        check_max_worker_restarts(self.max_worker_restarts)
        policy = FaultPolicy(self.retry, self.item_timeout, self.on_error, self.max_skipped)
        protocol = inspect_dataset(self.dataset)
        if protocol.iterable and policy.active:
            check_stream_policy(self.dataset, policy)  # a stream applies it only if it opted in
        if executor is not None:
            check_executor(
                executor,
                num_workers=num_workers,
                persistent_workers=self.persistent_workers,
                iterable=protocol.iterable,
            )
        shuffle, batch_size, drop_last = check_sampling(
            iterable=protocol.iterable,
            shuffle=self.shuffle,
            sampler=self.sampler,
            batch_sampler=self.batch_sampler,
            batch_size=self.batch_size,
            drop_last=self.drop_last,
        )
        generator = as_generator(self.generator)
        sampler, batch_sampler, offered = build_samplers(
            self.dataset,
            iterable=protocol.iterable,
            shuffle=bool(shuffle),
            sampler=self.sampler,
            batch_sampler=self.batch_sampler,
            batch_size=batch_size,
            drop_last=drop_last,
            generator=generator,
        )
        check_max_skipped_fraction(self.max_skipped, sampler=sampler, batch_sampler=batch_sampler)
        auto_collation = batch_sampler is not None or (protocol.iterable and batch_size is not None)
        collate_fn = self.collate_fn
        if collate_fn is None:
            collate_fn = collate_defaults[0] if auto_collation else collate_defaults[1]
        window, window_bytes = window_size(
            protocol,
            num_workers=num_workers,
            prefetch_factor=prefetch_factor,
            concurrency=most_concurrency,
            batch_size=batch_size,
            batch_sampler=batch_sampler,
            executor=executor,
        )
        settled = {
            "shuffle": shuffle,
            "batch_size": batch_size,
            "drop_last": drop_last,
            "sampler": sampler,
            "batch_sampler": batch_sampler,
            "generator": generator,
            "prefetch_factor": prefetch_factor,
            "concurrency": concurrency,
            "collate_fn": collate_fn,
            "protocol": protocol,
            "policy": policy if policy.active else None,
            "auto_collation": auto_collation,
            "index_sampler": batch_sampler if batch_sampler is not None else sampler,
            "sampler_offered": offered,
            "window": window,
            "window_bytes": window_bytes,
            "most_concurrency": most_concurrency,
        }
        for name, value in settled.items():
            object.__setattr__(self, name, value)  # frozen: settled here, once

    def changed(self, name: str, value: Any) -> LoaderSettings:
        """A copy with the live setting ``name`` set to ``value``, unchecked, as torch sets it.

        Raises:
            ValueError: ``name`` is not a live setting (:data:`LIVE_SETTINGS`).

        Example::

            >>> settings = LoaderSettings(dataset=range(4))
            >>> settings.changed("timeout", 5).timeout, settings.timeout
            (5, 0)
        """
        if name not in LIVE_SETTINGS:
            raise ValueError(f"{name} is not a setting that may change after construction")
        changed = copy.copy(self)
        object.__setattr__(changed, name, value)
        return changed

    def epoch_items(self) -> int | None:
        """How many items an epoch asks for, when the samplers tell (None: unknown)."""
        return epoch_items(self.sampler, self.batch_sampler)

    def worker_setup(self, *, track_stream_state: bool) -> WorkerSetup:
        """What reading these settings' batches needs, wherever they are read.

        Args:
            track_stream_state: take an iterable dataset's state after each batch
                (for checkpoints).
        """
        assert self.concurrency is not None and self.collate_fn is not None  # settled
        return WorkerSetup(
            dataset=self.dataset,
            collate_fn=self.collate_fn,
            worker_init_fn=self.worker_init_fn,
            batch_size=self.batch_size,
            auto_collation=self.auto_collation,
            drop_last=self.drop_last,
            concurrency=self.most_concurrency,
            auto_concurrency=self.concurrency == "auto",
            num_workers=self.num_workers,
            policy=self.policy,
            track_stream_state=track_stream_state,
            ranks=ranks_for_workers(),
        )


LOADER_ARGUMENTS: tuple[str, ...] = tuple(f.name for f in fields(LoaderSettings) if f.init)
"""The settings made from a :class:`~aioload.DataLoader` argument of the same name: all but the
derived ones, in the order of torch's signature."""

LOADER_ATTRIBUTES: tuple[str, ...] = tuple(
    f.name for f in fields(LoaderSettings) if f.init and f.metadata.get("attribute", True)
)
"""The settings a :class:`~aioload.DataLoader` shows as attributes of the same name."""

LIVE_SETTINGS: frozenset[str] = frozenset(
    f.name for f in fields(LoaderSettings) if f.metadata.get("live", False)
)
"""The settings torch lets a loader change after construction; every other is frozen then."""


def arguments_doc() -> str:
    """The ``Args:`` section of :class:`~aioload.DataLoader`'s docstring, from this class's.

    Each argument's entry of the ``Attributes:`` section of :class:`LoaderSettings`
    (its doc is written once, there); empty when docstrings are stripped (``-OO``).
    """
    doc = LoaderSettings.__doc__
    if doc is None or "\n    Attributes:\n" not in doc:
        return ""
    arguments = set(LOADER_ARGUMENTS)
    lines, keep = ["    Args:"], False
    for line in doc.split("\n    Attributes:\n", 1)[1].splitlines():
        if line and not line.startswith("        "):
            break  # the section's end
        if not line.startswith("         "):  # an entry: "        name: ..."
            keep = line.strip().split(":", 1)[0] in arguments
        if keep:
            lines.append(line)
    return "\n".join(lines).rstrip() + "\n"
