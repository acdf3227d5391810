"""Sharing an epoch of shards out between ranks and workers at sample granularity.

Pure arithmetic over the shards' sample counts (from their indexes); nothing is read here.

1. **The epoch's sequence**: the shards' samples one shard after the other, in the
   epoch's shard order: ``N`` samples.
2. **Ranks**, as :class:`~aioload.DistributedSampler` shares indices: every rank gets
   ``M`` samples, ``N // world_size`` with ``drop_last`` (the last ``N % world_size``
   samples of the sequence are left out) or ``ceil(N / world_size)`` without (the
   sequence is padded by repeating it from its start, ``numpy.resize``'s way, until it
   divides evenly: fewer than ``world_size`` samples are repeated). Unlike the sampler's
   interleaving, rank ``r`` takes the *contiguous* positions ``r * M`` to
   ``(r + 1) * M - 1``: a rank reads whole shards but for at most two, cut at a sample.
3. **Workers** of a rank: its ``M`` samples are cut in chunks of ``batch_size`` (the
   last one may be short) and worker ``w`` of ``W`` takes a contiguous run of whole
   chunks, ``ceil(M / B) // W`` of them plus one for the last ``ceil(M / B) % W``
   workers (the very last holds the short chunk: shares differ by at most one batch).
   Every worker's share but one is then whole batches, so the batches the
   workers make add up to ``ceil(M / B)`` (``M // B`` with the loader's ``drop_last``):
   what ``len(loader)`` says, on every rank, whatever its ``num_workers``.

A :class:`Segment` is a run of consecutive samples of one shard: what one read fetches.

Example::

    >>> rank_segments([0, 1, 2], [5, 3, 4], rank=1, world_size=2, drop_last=False)
    [Segment(shard=1, start=1, stop=3), Segment(shard=2, start=0, stop=4)]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "Segment",
    "epoch_order",
    "rank_segments",
    "samples_per_rank",
    "take",
    "worker_segments",
]


@dataclass(frozen=True, slots=True)
class Segment:
    """Samples ``start`` to ``stop - 1`` of shard number ``shard`` (in the dataset's URLs).

    Example::

        >>> len(Segment(shard=3, start=10, stop=25))
        15
    """

    shard: int
    start: int
    stop: int

    def __len__(self) -> int:
        return self.stop - self.start


def epoch_order(count: int, shuffle: bool, seed: int, epoch: int) -> list[int]:
    """The order of ``count`` shards (files, row groups) in epoch ``epoch``: as given, or a
    permutation drawn from ``(seed, epoch)``, the same in every rank and worker.

    Example::

        >>> epoch_order(4, False, 0, 3)
        [0, 1, 2, 3]
    """
    order = np.arange(count)
    if shuffle:
        order = np.random.default_rng([seed, epoch]).permutation(order)
    return [int(i) for i in order]


def samples_per_rank(total: int, world_size: int, drop_last: bool) -> int:
    """The samples every rank gets of an epoch of ``total`` (as ``DistributedSampler``).

    Example::

        >>> samples_per_rank(10, 3, drop_last=True), samples_per_rank(10, 3, drop_last=False)
        (3, 4)
    """
    if drop_last:
        return total // world_size
    return -(-total // world_size)


def take(segments: Sequence[Segment], begin: int, end: int) -> list[Segment]:
    """Positions ``begin`` to ``end - 1`` of the samples ``segments`` lists, as segments.

    Example::

        >>> take([Segment(0, 0, 4), Segment(1, 0, 4)], 2, 6)
        [Segment(shard=0, start=2, stop=4), Segment(shard=1, start=0, stop=2)]
    """
    taken = []
    position = 0
    for segment in segments:
        if position >= end:
            break
        size = len(segment)
        first, last = max(begin - position, 0), min(end - position, size)
        if first < last:
            taken.append(Segment(segment.shard, segment.start + first, segment.start + last))
        position += size
    return taken


def rank_segments(
    order: Sequence[int],
    counts: Sequence[int],
    rank: int,
    world_size: int,
    drop_last: bool,
) -> list[Segment]:
    """Rank ``rank``'s share of the epoch (see the module docstring).

    Args:
        order: the shards (numbers into ``counts``) in the epoch's order.
        counts: every shard's number of samples.
        rank: this rank, ``0 <= rank < world_size``.
        world_size: the number of ranks.
        drop_last: drop the tail (else pad by repeating the sequence's start).
    """
    sequence = [Segment(shard, 0, counts[shard]) for shard in order if counts[shard] > 0]
    total = sum(len(segment) for segment in sequence)
    share = samples_per_rank(total, world_size, drop_last)
    begin, end = rank * share, (rank + 1) * share
    segments: list[Segment] = []
    while begin < end:  # positions past the sequence's end wrap to its start: the padding
        first = begin % total
        last = min(total, first + end - begin)
        segments += take(sequence, first, last)
        begin += last - first
    return segments


def worker_segments(
    segments: Sequence[Segment], worker: int, num_workers: int, batch_size: int | None
) -> list[Segment]:
    """Worker ``worker``'s part of a rank's ``segments``, in whole batches but one.

    Args:
        segments: the rank's share (:func:`rank_segments`).
        worker: this worker, ``0 <= worker < num_workers``.
        num_workers: the rank's workers (1 without worker processes).
        batch_size: the loader's batch size (None: no batching, a chunk is one sample).
    """
    total = sum(len(segment) for segment in segments)
    chunk = batch_size or 1
    chunks = -(-total // chunk)
    each, extra = divmod(chunks, num_workers)
    # The extra chunks go to the last workers: the last of them holds the short chunk,
    # so that no share is more than one batch larger than another.
    plain = num_workers - extra
    first = worker * each + max(0, worker - plain)
    mine = each + (worker >= plain)
    return take(segments, first * chunk, min((first + mine) * chunk, total))
