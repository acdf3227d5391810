"""Assembling a loader's epochs from its settings, and what lives across them.

:class:`EpochAssembly` is what a :class:`~aioload.DataLoader` keeps between epochs —
its checkpoint record (:class:`~aioload.pipeline.checkpoint.Checkpoints`), its backends
and their persistent workers (:class:`~aioload.backends.factory.Backends`), its stats,
its pinned buffers, the latest epoch's skips — and makes each epoch from the loader's
:class:`~aioload.settings.LoaderSettings` as they stand when it starts (a live setting
may have changed since the last): the checkpoint's plan for it, its skip log, the
workers' setup, the backend, the pin stage, and the :class:`~aioload.pipeline.scheduler.Epoch`
that runs them, which gets the settings whole.

Example::

    assembly = EpochAssembly(settings)
    new_epoch = assembly.prepare(settings, offload_sync=False)   # in the iterating thread
    epoch = new_epoch(loop, output, False)                       # on the epoch's loop
"""

from __future__ import annotations

import asyncio
from typing import Any

from aioload.backends.factory import Backends
from aioload.backends.processes.main_module import check_script_for_workers
from aioload.faults.policy import SkipLog
from aioload.pipeline.checkpoint import Checkpoints
from aioload.pipeline.handoff import LoopOutput, ThreadOutput
from aioload.pipeline.iteration import EpochFactory
from aioload.pipeline.notebook import check_workers_can_import
from aioload.pipeline.pin_stage import Pinner
from aioload.pipeline.scheduler import Epoch
from aioload.settings import LoaderSettings
from aioload.stats.recorder import StatsRecorder

__all__ = ["EpochAssembly"]


class EpochAssembly:
    """A loader's parts that outlive an epoch, and the making of each (see the module docstring).

    Args:
        settings: the loader's settings when it is built (its checkpoints read the
            ones that never change; each epoch is made from the settings then).

    Attributes:
        checkpoints: the loader's checkpoint record.
        backends: picks and builds each epoch's backend; owns persistent workers.
        stats: the loader's stats recorder.
        skip_log: the latest epoch's skips (``on_error='skip'``), or None.
    """

    def __init__(self, settings: LoaderSettings) -> None:
        self.checkpoints = Checkpoints(settings)
        self.backends = Backends()
        self.stats = StatsRecorder()
        self.skip_log: SkipLog | None = None
        self._pinner = Pinner()
        self.backends.warm_up(settings)

    def check_workers_can_start(self, settings: LoaderSettings) -> None:
        """Refuses, before a worker starts, what workers would fail to import or run."""
        objects = {
            "dataset": settings.dataset,
            "collate_fn": settings.collate_fn,
            "worker_init_fn": settings.worker_init_fn,
            "policy": settings.policy,
        }
        start = self.backends.start_now(settings, objects)
        if start is None:
            return
        check_workers_can_import(objects, start.method)
        check_script_for_workers(objects, start.method, in_the_way=start.in_the_way)

    def prepare(self, settings: LoaderSettings, *, offload_sync: bool) -> EpochFactory:
        """Everything of a new epoch but its loop: what makes the epoch on the loop.

        Called in the thread that iterates, before aioload starts a thread for
        the epoch, so that the epoch's workers can be forked (see
        :mod:`aioload.backends.processes.start_method`). An error is raised where the
        epoch would have been made, as if it had happened there.
        """
        try:
            return self.parts(settings, offload_sync=offload_sync)
        except Exception as error:
            failure = error

            def fail(*_: Any) -> Epoch:
                raise failure

            return fail

    def parts(self, settings: LoaderSettings, *, offload_sync: bool) -> EpochFactory:
        """Starts a new epoch of the checkpoint record and builds its parts; returns what
        makes the epoch on its loop.

        Args:
            settings: the loader's settings as they stand.
            offload_sync: the inline backend reads a sync dataset in a thread.
        """
        plan = self.checkpoints.start_epoch()
        policy = settings.policy
        skips = None
        if policy is not None and policy.on_error == "skip":
            skips = SkipLog(policy.skip_limit(settings.epoch_items()), policy.max_skipped)
        self.skip_log = skips
        stats = self.stats.new_epoch(
            collated=settings.auto_collation, batch_size=settings.batch_size
        )
        setup = settings.worker_setup(track_stream_state=self.checkpoints.tracks_stream)
        make_backend = self.backends.for_epoch(
            settings, setup, plan, stats, offload_sync=offload_sync
        )
        # Here, in the thread that iterates: the pin thread pins for this thread's CUDA device.
        pin = self._pinner.for_device(settings.pin_memory_device) if settings.pin_memory else None

        def made(
            loop: asyncio.AbstractEventLoop, output: LoopOutput | ThreadOutput, _offload: bool
        ) -> Epoch:
            return Epoch(
                settings,
                make_backend,
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
