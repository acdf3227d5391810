"""Choosing and building a loader's backend, once per epoch.

:class:`Backends` is the one place that knows which backend a loader's
arguments call for —

- ``num_workers > 0``: a :class:`~aioload.backends.processes.backend.ProcessBackend`
  over a :class:`~aioload.backends.processes.pool.WorkerPool` (one per epoch, or the
  loader's persistent one);
- ``executor=``: an :class:`~aioload.backends.executor.ExecutorBackend`;
- otherwise an :class:`~aioload.backends.inline.InlineBackend` on the loop —

and builds it for each epoch from the loader's
:class:`~aioload.settings.LoaderSettings` (handed to the backend whole) and the epoch's
:class:`~aioload.read.reader.WorkerSetup`. It owns the persistent worker
pool (``persistent_workers=True``) until :meth:`Backends.close`.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import uuid
import weakref
from collections.abc import Mapping
from typing import Any

import anyio.abc

from aioload.backends.base import Backend, BackendFactory, OutcomeSink, StartPlan
from aioload.backends.executor import ExecutorBackend
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
from aioload.read.reader import BatchReader, WorkerSetup
from aioload.settings import LoaderSettings
from aioload.settings.executors import executor_size
from aioload.stats.recorder import EpochRecorder

__all__ = ["Backends"]


class Backends:
    """Picks a loader's backend and builds one per epoch (see the module docstring).

    Each call takes the loader's :class:`~aioload.settings.LoaderSettings` as they
    stand: the same object every time, but for a live setting changed since
    (``multiprocessing_context``, ``max_worker_restarts``, ...), which the next
    epoch then honours, as under torch.

    Example::

        backends = Backends()
        make_backend = backends.for_epoch(settings, setup, plan, stats, offload_sync=False)
    """

    def __init__(self) -> None:
        # Who this loader is to its executor's workers, which keep its setup per epoch.
        self._token = uuid.uuid4().hex
        self._epochs = itertools.count()  # numbers epochs within a worker pool or executor
        self._pool: WorkerPool | None = None  # the persistent workers, once started
        self._pool_lock = threading.Lock()

    def warm_up(self, settings: LoaderSettings) -> None:
        """Readies now what the workers would start from were they started now.

        The fork server, if they would start from it: it then imports its
        preloads (torch's import takes seconds) while the caller goes on, rather
        than when the first epoch starts (starting it costs the caller a few
        milliseconds: it is spawned, not waited for). And the fork template,
        where the process may later start a runtime that a fork does not
        survive (see :mod:`aioload.backends.processes.start_method`).
        """
        if settings.num_workers == 0 or settings.executor is not None:
            return
        keep_template_ready(start_method_context(settings.multiprocessing_context))
        start = self.start_now(settings)
        if start is not None and start.method == "forkserver":
            warm_forkserver(start.context)

    def start_now(
        self, settings: LoaderSettings, objects: Mapping[str, object] | None = None
    ) -> WorkerStart | None:
        """How worker processes would start if an epoch began now; None: none would.

        Left unset, ``settings.multiprocessing_context`` follows the rule of
        :mod:`aioload.backends.processes.start_method`. ``objects``: what the workers
        receive, by name. None for an inline or executor backend, or
        persistent workers that are running.
        """
        if settings.num_workers == 0 or settings.executor is not None:
            return None
        with self._pool_lock:
            if settings.persistent_workers and self._pool is not None and not self._pool.closed:
                return None
        return worker_start(start_method_context(settings.multiprocessing_context), objects)

    def for_epoch(
        self,
        settings: LoaderSettings,
        setup: WorkerSetup,
        plan: StartPlan,
        stats: EpochRecorder,
        *,
        offload_sync: bool,
    ) -> BackendFactory:
        """What builds this epoch's backend inside the epoch's scope.

        Args:
            settings: the loader's settings, handed to the backend whole.
            setup: the epoch's dataset, collate function and options (its
                ``num_workers`` is set here for each backend).
            plan: how the epoch starts (base seed, resumed stream states).
            stats: the epoch's recorder (worker restarts).
            offload_sync: inline: read a sync dataset in a thread.
        """
        if settings.num_workers > 0:
            return self._processes(settings, setup, plan, stats)
        if settings.executor is not None:
            return self._executor_tasks(settings, setup, plan, stats)
        protocol = settings.protocol
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
        self, settings: LoaderSettings, setup: WorkerSetup, plan: StartPlan, stats: EpochRecorder
    ) -> BackendFactory:
        setup = dataclasses.replace(setup, num_workers=settings.num_workers)
        context = start_method_context(settings.multiprocessing_context)
        # While forking is still safe, a template for the moment it no longer is.
        keep_template_ready(context)
        persistent = settings.persistent_workers
        if persistent:
            with self._pool_lock:
                if self._pool is None or self._pool.closed:
                    self._pool = self._new_pool(settings, setup, context, plan.base_seed)
                pool = self._pool
        else:
            pool = self._new_pool(settings, setup, context, plan.base_seed)
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

        def make_backend(task_group: anyio.abc.TaskGroup, sink: OutcomeSink) -> Backend:
            return ProcessBackend(
                pool,
                settings,
                owns_pool=not persistent,
                epoch=epoch,
                task_group=task_group,
                sink=sink,
                resume_streams=resume_streams,
                first_worker=first_worker,
                stats=stats,
                dataset_epochs=epochs,
            )

        return make_backend

    def _new_pool(
        self, settings: LoaderSettings, setup: WorkerSetup, context: Any, base_seed: int
    ) -> WorkerPool:
        # What a worker keeps free: its batches in flight, and two more.
        keep_free = (settings.prefetch_factor or 2) + 2
        pool = WorkerPool(setup, context, base_seed, keep_free=keep_free)
        if settings.persistent_workers:
            # The workers go when the loader is closed or collected, or at exit.
            weakref.finalize(self, pool.close)
        return pool

    def _executor_tasks(
        self, settings: LoaderSettings, setup: WorkerSetup, plan: StartPlan, stats: EpochRecorder
    ) -> BackendFactory:
        assert settings.executor is not None
        setup = dataclasses.replace(setup, num_workers=executor_size(settings.executor) or 1)
        key = (self._token, next(self._epochs))
        base_seed = plan.base_seed

        def make_backend(task_group: anyio.abc.TaskGroup, sink: OutcomeSink) -> Backend:
            return ExecutorBackend(
                settings,
                setup,
                key=key,
                base_seed=base_seed,
                task_group=task_group,
                sink=sink,
                stats=stats,
            )

        return make_backend

    def close(self) -> None:
        """Stops the persistent worker processes, if any (a later epoch starts new ones)."""
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()
