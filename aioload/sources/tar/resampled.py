"""The resampled shard stream: shards drawn at random, with replacement, forever.

With ``ShardDataset(resampled=True)`` every rank and worker draws its own shards from a
generator seeded by ``(seed, epoch, rank, worker)`` (:func:`shard_draws`) and streams
them whole, ``shards_in_flight`` at a time (:func:`~aioload.sources.streams.interleave.interleave`)
and through a shuffle buffer: an endless stream, which has no length and no checkpoint
(the user ends the epoch). A shard is opened as ``(sample, ref)`` pairs, by
:func:`plain_shards` (no ref) or, under the loader's fault policy, :func:`guarded_shards`
(a skip marker where a shard fails).

Example::

    draws = shard_draws(len(urls), [seed, epoch, rank, worker, 1])
    stream = resampled_stream(draws, plain_shards(reads.samples), 2, 1000, rng)
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Iterator, Sequence
from contextlib import aclosing
from typing import Any

import numpy as np

from aioload.sources.streams.interleave import interleave
from aioload.sources.streams.state import Ref, Run
from aioload.sources.streams.tracked import OpenRun

__all__ = ["OpenShard", "guarded_shards", "plain_shards", "resampled_stream", "shard_draws"]

OpenShard = Callable[[int], AsyncGenerator[tuple[Any, Ref | None], None]]
"""A whole shard's samples, by its number, as ``(sample, ref)`` (``ref`` None: not kept)."""


def shard_draws(count: int, seed: Sequence[int]) -> Iterator[int]:
    """Shard numbers below ``count``, drawn uniformly with replacement, endlessly.

    Example::

        >>> draws = shard_draws(4, [0, 0, 0, 0, 1])   # seed, epoch, rank, worker, 1
        >>> sorted({next(draws) for _ in range(100)})
        [0, 1, 2, 3]
    """
    rng = np.random.default_rng(list(seed))
    while True:
        yield int(rng.integers(count))


def plain_shards(
    samples: Callable[[int], AsyncGenerator[dict[str, Any], None]],
) -> OpenShard:
    """Opens a shard as its ``samples``, each as ``(sample, None)``."""

    async def open_shard(shard: int) -> AsyncGenerator[tuple[Any, Ref | None], None]:
        async with aclosing(samples(shard)) as opened:
            async for sample in opened:
                yield sample, None

    return open_shard


def guarded_shards(open_run: OpenRun) -> OpenShard:
    """Opens a shard as one whole run of ``open_run`` (a guarded one: ``(sample, ref)``, or
    ``(marker, None)`` where the shard failed)."""

    async def open_shard(shard: int) -> AsyncGenerator[tuple[Any, Ref | None], None]:
        async with aclosing(open_run(Run(shard, 0, 0, -1))) as samples:
            async for sample, ref, _ in samples:
                yield sample, ref

    return open_shard


def resampled_stream(
    draws: Iterator[int],
    open_shard: OpenShard,
    in_flight: int,
    shuffle_buffer: int,
    rng: np.random.Generator,
) -> AsyncGenerator[tuple[Any, Ref | None], None]:
    """The samples of the shards ``draws`` names, ``in_flight`` shards at a time in turn,
    through a shuffle buffer of ``shuffle_buffer`` samples (0 or 1: none) drawn from ``rng``."""
    samples: AsyncGenerator[Any, None] = (
        _one_by_one(draws, open_shard)
        if in_flight == 1
        else interleave(draws, open_shard, in_flight)
    )
    if shuffle_buffer > 1:
        samples = _shuffled(samples, shuffle_buffer, rng)
    return samples


async def _one_by_one(
    picks: Iterator[int], open_shard: OpenShard
) -> AsyncGenerator[tuple[Any, Ref | None], None]:
    for pick in picks:
        async with aclosing(open_shard(pick)) as samples:
            async for sample in samples:
                yield sample


async def _shuffled(
    samples: AsyncGenerator[Any, None], size: int, rng: np.random.Generator
) -> AsyncGenerator[Any, None]:
    """The samples in a random order, through a buffer of ``size``."""
    buffer: list[Any] = []
    async with aclosing(samples):
        async for sample in samples:
            if len(buffer) < size:
                buffer.append(sample)
                continue
            slot = int(rng.integers(size))
            buffer[slot], sample = sample, buffer[slot]
            yield sample
    order = rng.permutation(len(buffer))
    for slot in order:
        yield buffer[int(slot)]
