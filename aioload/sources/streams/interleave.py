"""Reading several shards at once and taking their samples in turn, in a fixed order.

One shard stream waits a full round trip before its first byte, and then
delivers at the pace of one connection. :func:`interleave` keeps ``width``
shards in the rotation and ``width`` more already requested, each read ahead
by its own task into a bounded buffer, and yields one sample from each shard
of the rotation in turn. The order depends only on the shards' contents and
``width``, never on timing: a drained shard is replaced, in its place in the
rotation, by the next shard in line.

Memory stays bounded: at most ``2 * width`` shards are open, each holding at
most ``buffer`` samples read ahead (a :class:`ReadAhead` each, which the tracked stream of
:mod:`aioload.sources.streams.tracked` reads its runs through too).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncGenerator, Callable, Iterator
from contextlib import aclosing
from typing import Any

__all__ = ["END", "ReadAhead", "interleave"]

END = object()
"""What :meth:`ReadAhead.next` returns once the stream it reads has ended."""


class ReadAhead:
    """One shard's samples, read ahead by a task into a bounded queue.

    The task starts at once, on the running loop, and stops when the queue holds
    ``buffer`` samples until one is taken; cancel :attr:`task` to stop reading early
    (it closes the stream).

    Args:
        samples: the stream to read (closed when read to its end, or on cancellation).
        buffer: the most samples read ahead.

    Example::

        reader = ReadAhead(open_shard(3), 16)
        while (sample := await reader.next()) is not END: ...
    """

    def __init__(self, samples: AsyncGenerator[Any, None], buffer: int) -> None:
        self._queue: asyncio.Queue[Any] = asyncio.Queue(buffer)
        self.task = asyncio.get_running_loop().create_task(self._read(samples))

    async def _read(self, samples: AsyncGenerator[Any, None]) -> None:
        try:
            async with aclosing(samples):
                async for sample in samples:
                    await self._queue.put(sample)
        except Exception as error:
            # Raised in the consumer when it reaches this point of the shard.
            await self._queue.put(_Failure(error))
            return
        await self._queue.put(END)

    async def next(self) -> Any:
        """The shard's next sample, or :data:`END`; raises the error that ended the shard."""
        item = await self._queue.get()
        if isinstance(item, _Failure):
            raise item.error
        return item


class _Failure:
    def __init__(self, error: Exception) -> None:
        self.error = error


async def interleave(
    picks: Iterator[int],
    open_shard: Callable[[int], AsyncGenerator[Any, None]],
    width: int,
    buffer: int = 16,
) -> AsyncGenerator[Any, None]:
    """The samples of the shards ``picks`` names, ``width`` shards at a time, in turn.

    Args:
        picks: the shards to read, in order (may be endless).
        open_shard: a shard's samples, as an async generator.
        width: shards in the rotation.
        buffer: samples each shard reads ahead.
    """
    rotation: list[ReadAhead] = []
    in_line: deque[ReadAhead] = deque()

    def top_up() -> None:
        while len(rotation) + len(in_line) < 2 * width:
            index = next(picks, None)
            if index is None:
                return
            reader = ReadAhead(open_shard(index), buffer)
            if len(rotation) < width:
                rotation.append(reader)
            else:
                in_line.append(reader)

    try:
        top_up()
        turn = 0
        while rotation:
            sample = await rotation[turn].next()
            if sample is END:
                if in_line:
                    rotation[turn] = in_line.popleft()
                else:
                    del rotation[turn]
                top_up()
                if rotation:
                    turn %= len(rotation)
                continue
            yield sample
            turn = (turn + 1) % len(rotation)
    finally:
        readers = [*rotation, *in_line]
        for reader in readers:
            reader.task.cancel()
        if readers:
            await asyncio.wait([reader.task for reader in readers])
