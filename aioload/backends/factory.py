"""Choosing and building a loader's backend, once per epoch.

:class:`Backends` is the one place that knows which backend a loader's
arguments call for —

- ``num_workers > 0``: a :class:`~aioload.backends.processes.backend.ProcessBackend`
  over a :class:`~aioload.backends.processes.pool.WorkerPool` (one per epoch, or the
  loader's persistent one);
- ``executor=``: an :class:`~aioload.backends.executor.ExecutorBackend`;
- otherwise an :class:`~aioload.backends.inline.InlineBackend` on the loop —

and builds it for each epoch from the epoch's
:class:`~aioload.read.reader.WorkerSetup`. It owns the persistent worker
pool (``persistent_workers=True``) until :meth:`Backends.close`.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import threading
import uuid
import weakref
from collections.abc import Mapping
from typing import Any

import anyio.abc

from aioload.backends.base import Backend, BackendFactory, OutcomeSink
from aioload.backends.executor import ExecutorBackend, executor_size
from aioload.backends.inline import InlineBackend
from aioload.backends.processes.backend import ProcessBackend
from aioload.backends.processes.pool import WorkerPool, warm_forkserver
from aioload.backends.processes.start_method import (
    WorkerStart,
    keep_template_ready,
    start_method_context,
    worker_start,
)
from aioload.data.epochs import dataset_epochs
from aioload.data.protocol import DatasetProtocol
from aioload.pipeline.checkpoint import EpochPlan
from aioload.read.reader import BatchReader, WorkerSetup
from aioload.stats.recorder import EpochRecorder

__all__ = ["Backends"]


class Backends:
    """Picks a loader's backend and builds one per epoch (see the module docstring).

    Args:
        protocol: the dataset's protocol.
        num_workers: the loader's worker processes (0: inline or executor).
        executor: the loader's executor, or None.
        persistent_workers: keep one worker pool for the loader's life.
        prefetch_factor: batches in flight per worker (sizes what a worker keeps free).

    Example::

        backends = Backends(protocol, num_workers=2, executor=None,
                            persistent_workers=False, prefetch_factor=2)
        make_backend = backends.for_epoch(setup, plan, stats, ...)
    """

    def __init__(
        self,
        protocol: DatasetProtocol,
        *,
        num_workers: int,
        executor: concurrent.futures.Executor | None,
        persistent_workers: bool,
        prefetch_factor: int | None,
    ) -> None:
        self._protocol = protocol
        self._num_workers = num_workers
        self._executor = executor
        self._persistent = persistent_workers
        self._keep_free = (prefetch_factor or 2) + 2
        # Who this loader is to its executor's workers, which keep its setup per epoch.
        self._token = uuid.uuid4().hex
        self._epochs = itertools.count()  # numbers epochs within a worker pool or executor
        self._pool: WorkerPool | None = None  # the persistent workers, once started
        self._pool_lock = threading.Lock()

    def warm_up(self, multiprocessing_context: Any) -> None:
        """Readies now what the workers would start from were they started now.

        The fork server, if they would start from it: it then imports its
        preloads (torch's import takes seconds) while the caller goes on, rather
        than when the first epoch starts (starting it costs the caller a few
        milliseconds: it is spawned, not waited for). And the fork template,
        where the process may later start a runtime that a fork does not
        survive (see :mod:`aioload.backends.processes.start_method`).
        """
        if self._num_workers == 0 or self._executor is not None:
            return
        keep_template_ready(start_method_context(multiprocessing_context))
        start = self.start_now(multiprocessing_context)
        if start is not None and start.method == "forkserver":
            warm_forkserver(start.context)

    def start_now(
        self, multiprocessing_context: Any, objects: Mapping[str, object] | None = None
    ) -> WorkerStart | None:
        """How worker processes would start if an epoch began now; None: none would.

        ``multiprocessing_context``: the loader's; left unset, the rule of
        :mod:`aioload.backends.processes.start_method`. ``objects``: what the workers
        receive, by name. None for an inline or executor backend, or
        persistent workers that are running.
        """
        if self._num_workers == 0 or self._executor is not None:
            return None
        with self._pool_lock:
            if self._persistent and self._pool is not None and not self._pool.closed:
                return None
        return worker_start(start_method_context(multiprocessing_context), objects)

    def for_epoch(
        self,
        setup: WorkerSetup,
        plan: EpochPlan,
        stats: EpochRecorder,
        *,
        offload_sync: bool,
        multiprocessing_context: Any,
        max_worker_restarts: int,
        in_order: bool = True,
    ) -> BackendFactory:
        """What builds this epoch's backend inside the epoch's scope.

        Args:
            setup: the epoch's dataset, collate function and options (its
                ``num_workers`` is set here for each backend).
            plan: how the epoch starts (base seed, resumed stream states).
            stats: the epoch's recorder (worker restarts).
            offload_sync: inline: read a sync dataset in a thread.
            multiprocessing_context: the start method of new worker processes.
            max_worker_restarts: worker deaths (or dask resubmits) the epoch survives.
            in_order: batches are yielded in order (workers get them round-robin;
                otherwise the least busy worker gets the next one).
        """
        if self._num_workers > 0:
            return self._processes(
                setup, plan, stats, multiprocessing_context, max_worker_restarts, in_order
            )
        if self._executor is not None:
            return self._executor_tasks(setup, plan, stats, max_worker_restarts)
        protocol = self._protocol
        # A sync read that retries runs in a thread even under the sync facade: its
        # backoff waits then never hold the loop up, and closing the epoch cuts them short.
        retrying = setup.policy is not None and setup.policy.retry is not None
        concurrency = setup.concurrency

        def make_backend(task_group: anyio.abc.TaskGroup, sink: OutcomeSink) -> Backend:
            return InlineBackend(
                BatchReader(setup, protocol),
                concurrency=concurrency,
                offload_sync=offload_sync or retrying,
                task_group=task_group,
                sink=sink,
            )

        return make_backend

    def _processes(
        self,
        setup: WorkerSetup,
        plan: EpochPlan,
        stats: EpochRecorder,
        context: Any,
        max_restarts: int,
        in_order: bool,
    ) -> BackendFactory:
        setup = dataclasses.replace(setup, num_workers=self._num_workers)
        # While forking is still safe, a template for the moment it no longer is.
        keep_template_ready(start_method_context(context))
        if self._persistent:
            with self._pool_lock:
                if self._pool is None or self._pool.closed:
                    self._pool = self._new_pool(setup, context, plan.base_seed)
                pool = self._pool
        else:
            pool = self._new_pool(setup, context, plan.base_seed)
        # Before the epoch starts a thread of its own: forked now, the workers see none
        # of aioload's (and they start fast: the dataset is inherited, not pickled).
        pool.fork_now()
        epoch = next(self._epochs)
        # A tracked stream: a resumed epoch starts each worker's stream where the
        # checkpoint left it.
        resume_streams, first_worker = plan.worker_streams()
        # Read now, on the thread that iterates: the epochs set_epoch gave the dataset
        # before this iter(), which the workers' copies get before the epoch starts.
        epochs = dataset_epochs(setup.dataset)
        owns_pool = not self._persistent
        iterable = self._protocol.iterable

        def make_backend(task_group: anyio.abc.TaskGroup, sink: OutcomeSink) -> Backend:
            return ProcessBackend(
                pool,
                owns_pool=owns_pool,
                epoch=epoch,
                iterable=iterable,
                max_restarts=max_restarts,
                task_group=task_group,
                sink=sink,
                resume_streams=resume_streams,
                first_worker=first_worker,
                stats=stats,
                in_order=in_order,
                dataset_epochs=epochs,
            )

        return make_backend

    def _new_pool(self, setup: WorkerSetup, context: Any, base_seed: int) -> WorkerPool:
        pool = WorkerPool(
            setup, start_method_context(context), base_seed, keep_free=self._keep_free
        )
        if self._persistent:
            # The workers go when the loader is closed or collected, or at exit.
            weakref.finalize(self, pool.close)
        return pool

    def _executor_tasks(
        self, setup: WorkerSetup, plan: EpochPlan, stats: EpochRecorder, max_restarts: int
    ) -> BackendFactory:
        executor = self._executor
        assert executor is not None
        setup = dataclasses.replace(setup, num_workers=executor_size(executor) or 1)
        key = (self._token, next(self._epochs))
        base_seed = plan.base_seed

        def make_backend(task_group: anyio.abc.TaskGroup, sink: OutcomeSink) -> Backend:
            return ExecutorBackend(
                executor,
                setup,
                key=key,
                base_seed=base_seed,
                task_group=task_group,
                sink=sink,
                max_resubmits=max_restarts,
                stats=stats,
            )

        return make_backend

    def close(self) -> None:
        """Stops the persistent worker processes, if any (a later epoch starts new ones)."""
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()
