"""One worker's shard stream, as it is read and as it stands: interleaving, shuffle, state.

:class:`TrackedStream` yields the samples of a list of :class:`~aioload.sources.streams.state.Run`
in the order ``ShardDataset`` has always yielded them — ``width`` runs read at once,
one sample from each in turn (as :func:`~aioload.sources.streams.interleave.interleave`), then
through a shuffle buffer — and knows, whenever it is suspended at a sample, what is left:
:meth:`TrackedStream.state` (see :mod:`aioload.sources.streams.state`). Every sample comes
with its :data:`~aioload.sources.streams.state.Ref`, and a run's reader marks its last
sample, so a run drained to its end is not opened again on resume.

Resuming from a state rebuilds the same rotation: the runs being read come first in the
state, from the one whose turn is next, so a fresh rotation of their first ``width``
continues the same cycle (a drained run replaced in place stays in place).
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from contextlib import aclosing
from functools import partial
from typing import Any

import numpy as np

from aioload.sources.stores.tasks import READS_AT_ONCE, bounded_gather
from aioload.sources.streams.interleave import END, ReadAhead
from aioload.sources.streams.state import Ref, Run, StreamState

__all__ = ["OpenRun", "ReadRefs", "TrackedStream", "reread", "resumed_stream"]

OpenRun = Callable[[Run], AsyncGenerator[tuple[Any, Ref | None, bool], None]]
"""A run's samples: ``(sample, ref, last)``, ``last`` true for the shard's last sample.

A guarded run (:mod:`aioload.sources.streams.faults`) may end with ``(marker, None, True)``:
a skip marker, handed on at once, the run then counted as done."""

ReadRefs = Callable[[list[Ref]], Awaitable[dict[tuple[int, int], Any]]]
"""Reads a group of refs again (see :func:`reread`): their samples by ``(unit, position)``."""


class _Slot:
    """A run being read: what is left of it, and its reader."""

    __slots__ = ("left", "reader")

    def __init__(self, run: Run, open_run: OpenRun, buffer: int) -> None:
        self.left = run
        self.reader = ReadAhead(open_run(run), buffer)


class TrackedStream:
    """The samples of ``runs``, ``width`` at a time in turn, through a shuffle buffer.

    Args:
        runs: what to read, in order.
        open_run: reads one run.
        width: runs read at once (``shards_in_flight``).
        shuffle: the shuffle buffer's size (0 or 1: none).
        rng: the shuffle buffer's generator.
        buffer: samples already in the buffer, with their refs (a resumed stream).
        draining: ``buffer`` is the tail still to come, in order (the runs are done).
        read_ahead: samples each run reads ahead.

    Example::

        stream = TrackedStream(runs, open_run, 4, 1000, rng)
        async for sample in stream.samples():
            state = stream.state(epoch, layout)   # what is left
    """

    def __init__(
        self,
        runs: Sequence[Run],
        open_run: OpenRun,
        width: int,
        shuffle: int,
        rng: np.random.Generator,
        buffer: Sequence[tuple[Any, Ref]] = (),
        draining: bool = False,
        read_ahead: int = 16,
    ) -> None:
        self._pending: deque[Run] = deque(runs)
        self._open = open_run
        self._width = width
        self._shuffle = shuffle if shuffle > 1 else 0
        self._rng = rng
        self._buffer: list[tuple[Any, Ref]] = [] if draining else list(buffer)
        self._drain: deque[tuple[Any, Ref]] = deque(buffer) if draining else deque()
        self._draining = draining
        self._read_ahead = read_ahead
        self._rotation: list[_Slot] = []
        self._in_line: deque[_Slot] = deque()
        self._turn = 0

    def state(self, epoch: int = 0, layout: dict[str, Any] | None = None) -> StreamState:
        """What is left, as of the last sample yielded, as a state of ``epoch`` and
        ``layout``."""
        rotation = self._rotation
        turn = self._turn
        runs = [slot.left for slot in rotation[turn:]]
        runs += [slot.left for slot in rotation[:turn]]
        runs += [slot.left for slot in self._in_line]
        runs += self._pending
        held = self._drain if self._draining else self._buffer
        rng = dict(self._rng.bit_generator.state) if self._shuffle else None
        buffer = [ref for _, ref in held]
        return StreamState(epoch, dict(layout or {}), runs, buffer, self._draining, rng)

    def _top_up(self) -> None:
        while len(self._rotation) + len(self._in_line) < 2 * self._width and self._pending:
            slot = _Slot(self._pending.popleft(), self._open, self._read_ahead)
            if len(self._rotation) < self._width:
                self._rotation.append(slot)
            else:
                self._in_line.append(slot)

    async def _interleaved(self) -> AsyncGenerator[tuple[Any, Ref | None], None]:
        rotation = self._rotation
        try:
            self._top_up()
            while rotation:
                slot = rotation[self._turn]
                item = await slot.reader.next()
                if item is END:
                    if self._in_line:
                        rotation[self._turn] = self._in_line.popleft()
                    else:
                        del rotation[self._turn]
                    self._top_up()
                    if rotation:
                        self._turn %= len(rotation)
                    continue
                sample, ref, last = item
                run = slot.left
                if ref is None:  # a skip marker (a guarded stream's): the run ends here
                    slot.left = Run(run.shard, run.start, run.offset, run.start)
                    self._turn = (self._turn + 1) % len(rotation)
                    yield sample, None
                    continue
                # What is left of the run: past this sample (nothing, after the shard's last).
                after = ref[1] + 1
                slot.left = Run(run.shard, after, ref[3], after if last else run.stop)
                self._turn = (self._turn + 1) % len(rotation)
                yield sample, ref
        finally:
            readers = [*rotation, *self._in_line]
            for held in readers:
                held.reader.task.cancel()
            for held in readers:
                try:
                    await held.reader.task
                except BaseException:
                    pass

    async def samples(self) -> AsyncGenerator[Any, None]:
        """The samples, in the stream's order (close it with ``aclosing``)."""
        async with aclosing(self.items()) as items:
            async for sample, _ in items:
                yield sample

    async def items(self) -> AsyncGenerator[tuple[Any, Ref | None], None]:
        """``(sample, ref)`` in the stream's order; a run's skip marker comes with ``None``,
        as it arrives (it does not enter the shuffle buffer, nor the state)."""
        size, rng = self._shuffle, self._rng
        if not self._draining:
            buffer = self._buffer
            async with aclosing(self._interleaved()) as source:
                async for item in source:
                    if item[1] is None:
                        yield item
                        continue
                    if len(buffer) < size:
                        buffer.append(item)  # type: ignore[arg-type]
                        continue
                    if size:
                        slot = int(rng.integers(size))
                        buffer[slot], item = item, buffer[slot]  # type: ignore[assignment]
                    yield item
            self._drain = deque(buffer[int(slot)] for slot in rng.permutation(len(buffer)))
            self._buffer = []
            self._draining = True
        drain = self._drain
        while drain:
            yield drain.popleft()


async def resumed_stream(
    plan: Sequence[Run],
    resumed: StreamState | None,
    open_run: OpenRun,
    read_again: Callable[[Sequence[Ref]], Awaitable[list[Any]]],
    width: int,
    shuffle: int,
    rng: np.random.Generator,
) -> TrackedStream:
    """The tracked stream of ``plan``, or exactly the one ``resumed`` describes: its runs,
    its buffer (the samples read again by ``read_again``) and its turn order."""
    if resumed is None:
        return TrackedStream(plan, open_run, width, shuffle, rng)
    samples = await read_again(resumed.buffer)
    buffer = list(zip(samples, resumed.buffer, strict=True))
    return TrackedStream(resumed.runs, open_run, width, shuffle, rng, buffer, resumed.draining)


async def reread(refs: Sequence[Ref], whole: Callable[[int], bool], read: ReadRefs) -> list[Any]:
    """The samples ``refs`` names, read again, in ``refs``' order.

    Refs are read in groups, several groups at once: neighbours of a unit (one sample's
    end is the next one's first byte) with one range request, every ref of a unit that
    is read ``whole`` (compressed: no range reaches into it) with one read.
    """
    if not refs:
        return []
    groups: list[list[Ref]] = []
    for ref in sorted(refs, key=lambda ref: (ref[0], ref[1])):
        last = groups[-1][-1] if groups else None
        if last is not None and last[0] == ref[0] and (last[3] == ref[2] or whole(ref[0])):
            groups[-1].append(ref)
        else:
            groups.append([ref])
    found: dict[tuple[int, int], Any] = {}
    for part in await bounded_gather([partial(read, group) for group in groups], READS_AT_ONCE):
        found.update(part)
    return [found[ref[0], ref[1]] for ref in refs]
