"""DataLoader: torch's arguments and semantics, iterated with ``async for`` or ``for``.

The public class and nothing more: its arguments, made once into a
:class:`~aioload.settings.LoaderSettings` (which checks them, settles what they leave
open and is passed whole to what loads), its attributes (the settings'), ``len``,
``__iter__``/``__aiter__``, checkpoints, ``close``. Its epochs are assembled from
the settings by :class:`~aioload.pipeline.assembly.EpochAssembly`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from aioload.collate.core import default_collate, default_convert
from aioload.faults.policy import RetryPolicy, SkippedItem
from aioload.pipeline.assembly import EpochAssembly
from aioload.pipeline.handoff import LoopOutput, ThreadOutput
from aioload.pipeline.iteration import AsyncBatchIterator, ReportedLength, SyncBatchIterator
from aioload.pipeline.notebook import is_ipython_loop
from aioload.pipeline.scheduler import Epoch
from aioload.samplers.builtin import GeneratorLike
from aioload.samplers.offered import unsized_message
from aioload.settings import (
    DEFAULT_CONCURRENCY,
    DEFAULT_MAX_WORKER_RESTARTS,
    LIVE_SETTINGS,
    LOADER_ARGUMENTS,
    LOADER_ATTRIBUTES,
    LoaderSettings,
)
from aioload.settings.checks import warn_excessive_workers
from aioload.settings.core import arguments_doc
from aioload.stats.recorder import LoaderStats

__all__ = ["DEFAULT_CONCURRENCY", "DEFAULT_MAX_WORKER_RESTARTS", "DataLoader"]

T_co = TypeVar("T_co", covariant=True)

# torch's (and aioload's) attributes, read from the settings; all but the live ones
# (which torch reads per iterator) are fixed once the loader is built.
_ATTRIBUTES = frozenset(LOADER_ATTRIBUTES)
_FROZEN_AFTER_INIT = tuple(name for name in LOADER_ATTRIBUTES if name not in LIVE_SETTINGS)


class DataLoader(Generic[T_co]):
    """Combines a dataset and a sampler and iterates over batches of the dataset.

    The arguments, defaults and errors are torch's ``DataLoader``'s; batches
    are numpy arrays (see :func:`aioload.default_collate`), or torch tensors
    with ``from aioload.torch import DataLoader`` (see :mod:`aioload.torch`). Iterate with
    ``async for`` inside an event loop (the loop never blocks: sync datasets
    are read in a thread) or with plain ``for`` (aioload runs its pipeline on
    its own uvloop loop in a background thread, so fetching overlaps your
    compute). Every iteration is a new epoch.

    Each argument is the field of the same name and default of
    :class:`~aioload.settings.LoaderSettings`, where its doc and its check are
    written once (``help(DataLoader)`` lists them, under "Args", at the end),
    and an attribute of the loader (but ``shuffle``, as under torch).

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

    if TYPE_CHECKING:  # the settings, as attributes (read through __getattr__), typed once more
        dataset: Any
        batch_size: int | None
        sampler: Any
        batch_sampler: Any
        num_workers: int
        collate_fn: Callable[[Any], Any] | None
        pin_memory: bool
        drop_last: bool
        timeout: float
        worker_init_fn: Callable[[int], None] | None
        multiprocessing_context: Any
        generator: GeneratorLike
        prefetch_factor: int | None
        persistent_workers: bool
        pin_memory_device: str
        in_order: bool
        concurrency: int | Literal["auto"] | None
        max_worker_restarts: int
        retry: RetryPolicy | None
        item_timeout: float | None
        on_error: Literal["raise", "skip"]
        max_skipped: int | float | None
        executor: concurrent.futures.Executor | None

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
        concurrency: int | Literal["auto"] | None = None,
        max_worker_restarts: int = DEFAULT_MAX_WORKER_RESTARTS,
        retry: RetryPolicy | None = None,
        item_timeout: float | None = None,
        on_error: Literal["raise", "skip"] = "raise",
        max_skipped: int | float | None = None,
        executor: concurrent.futures.Executor | None = None,
    ) -> None:
        # The signature is torch's; the arguments it was given are the settings' fields.
        given = locals()
        settings = LoaderSettings(
            **{name: given[name] for name in LOADER_ARGUMENTS},
            collate_defaults=(self._default_collate_fn, self._default_convert_fn),
        )
        self._settings = settings
        # What len(loader) last reported for an iterable dataset (torch's
        # _IterableDataset_len_called): an epoch that overruns it warns.
        self._len_reported: int | None = None
        self._epochs = EpochAssembly(settings)
        warn_excessive_workers(num_workers, stacklevel=2)  # as torch: here and at every iter()

    def __getattr__(self, name: str) -> Any:
        # Only for what is not found otherwise: torch's attributes, the settings'.
        settings = self.__dict__.get("_settings")
        if settings is not None and name in _ATTRIBUTES:
            return getattr(settings, name)
        raise AttributeError(
            f"{type(self).__name__!r} object has no attribute {name!r}", name=name, obj=self
        )

    def __setattr__(self, attr: str, value: Any) -> None:
        settings: LoaderSettings | None = self.__dict__.get("_settings")
        if settings is None or attr not in _ATTRIBUTES:
            super().__setattr__(attr, value)
        elif attr in _FROZEN_AFTER_INIT:
            raise ValueError(
                f"{attr} attribute should not be set after {type(self).__name__} is initialized"
            )
        else:  # live: the next epoch takes it, as torch's next iterator does
            super().__setattr__("_settings", settings.changed(attr, value))

    @property
    def window(self) -> int:
        """The most batches in flight at once: ``prefetch_factor × max(1, num_workers)``.

        With an ``executor``: ``prefetch_factor`` (default 2) × the executor's
        workers (its threads, processes, or the dask cluster's threads when the
        loader was built).
        """
        return self._settings.window

    def __len__(self) -> int:
        settings = self._settings
        if settings.protocol.iterable:
            length = self._len_reported = len(settings.dataset)
            batch_size = settings.batch_size
            if batch_size is not None:
                if settings.drop_last:
                    return length // batch_size
                return math.ceil(length / batch_size)
            return int(length)
        try:
            return len(settings.index_sampler)
        except TypeError as error:
            if not settings.sampler_offered:
                raise
            raise TypeError(unsized_message(settings.dataset, settings.sampler)) from error

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
        log = self._epochs.skip_log
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
        return self._epochs.stats.snapshot()

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
        settings = self._settings
        self._epochs.check_workers_can_start(settings)
        warn_excessive_workers(settings.num_workers, stacklevel=2)
        self._warn_if_tensors_cannot_pin()
        new_epoch = self._epochs.prepare(settings, offload_sync=settings.timeout > 0)
        return SyncBatchIterator(new_epoch, settings.timeout, self._reported_length())

    def __aiter__(self) -> AsyncBatchIterator:
        settings = self._settings
        self._epochs.check_workers_can_start(settings)
        warn_excessive_workers(settings.num_workers, stacklevel=2)
        self._warn_if_tensors_cannot_pin()
        return AsyncBatchIterator(self._new_epoch, settings.timeout, self._reported_length())

    def _new_epoch(
        self, loop: asyncio.AbstractEventLoop, output: LoopOutput | ThreadOutput, offload: bool
    ) -> Epoch:
        # Made on the loop at once (the first __anext__ of async for): workers fork on
        # the loop's thread if nothing else runs.
        return self._epochs.parts(self._settings, offload_sync=offload)(loop, output, offload)

    def _reported_length(self) -> ReportedLength | None:
        reported, settings = self._len_reported, self._settings
        if reported is None:
            return None
        return ReportedLength(settings.dataset, reported, settings.num_workers)

    def _warn_if_tensors_cannot_pin(self) -> None:
        # Called by __iter__/__aiter__: the warning points at the line that iterates.
        if self._settings.pin_memory:
            from aioload.memory.pinned import warn_if_tensors_cannot_pin

            warn_if_tensors_cannot_pin(self._settings.pin_memory_device, stacklevel=3)

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
        return self._epochs.checkpoints.state_dict()

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
        self._epochs.checkpoints.load_state_dict(state)

    def close(self) -> None:
        """Stops the persistent worker processes (``persistent_workers=True``).

        They also stop when the loader is garbage-collected and at interpreter
        exit; a later iteration starts new ones. Without persistent workers
        there is nothing to close: every epoch stops its own workers.
        """
        self._epochs.backends.close()

    def __enter__(self) -> DataLoader[T_co]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


# Each argument's doc is written once, in LoaderSettings; help(DataLoader) lists them too.
if DataLoader.__doc__ is not None:
    DataLoader.__doc__ += "\n" + arguments_doc()
