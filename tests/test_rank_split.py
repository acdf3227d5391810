"""The sample-granular split of an epoch between ranks and workers (pure arithmetic).

Checked against what it promises: ``DistributedSampler``'s shares (equal per rank, the
tail dropped or the start repeated), contiguous runs per rank, and worker shares in whole
batches whose batch counts add up to ``ceil(M / batch_size)`` for any ``num_workers``.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from aioload import DistributedSampler
from aioload.sources.streams.split import (
    Segment,
    rank_segments,
    samples_per_rank,
    take,
    worker_segments,
)

EXAMPLES = settings(max_examples=200, derandomize=True, deadline=None, database=None)


def positions(segments: list[Segment], counts: list[int]) -> list[tuple[int, int]]:
    """(shard, sample) of every sample the segments list, in order."""
    found = []
    for segment in segments:
        assert 0 <= segment.start < segment.stop <= counts[segment.shard]
        found += [(segment.shard, i) for i in range(segment.start, segment.stop)]
    return found


def sequence(order: list[int], counts: list[int]) -> list[tuple[int, int]]:
    return [(shard, i) for shard in order for i in range(counts[shard])]


@EXAMPLES
@given(
    counts=st.lists(st.integers(0, 30), min_size=1, max_size=12),
    world_size=st.integers(1, 7),
    drop_last=st.booleans(),
    shuffle=st.integers(0, 2**32 - 1),
)
def test_ranks_get_equal_shares_as_distributed_sampler(
    counts: list[int], world_size: int, drop_last: bool, shuffle: int
) -> None:
    order = [int(i) for i in np.random.default_rng(shuffle).permutation(len(counts))]
    epoch = sequence(order, counts)
    shares = [
        positions(rank_segments(order, counts, rank, world_size, drop_last), counts)
        for rank in range(world_size)
    ]
    share = samples_per_rank(len(epoch), world_size, drop_last)
    assert [len(s) for s in shares] == [share] * world_size
    # DistributedSampler over the epoch's sequence picks the same multiset of samples.
    sampler = DistributedSampler(
        range(len(epoch)), world_size, 0, shuffle=False, drop_last=drop_last
    )
    assert share == len(sampler)
    picked = Counter(
        epoch[i]
        for rank in range(world_size)
        for i in DistributedSampler(
            range(len(epoch)), world_size, rank, shuffle=False, drop_last=drop_last
        )
    )
    assert Counter(sample for s in shares for sample in s) == picked
    # Contiguous: the ranks' shares, one after the other, are the (padded) sequence itself.
    flat = [sample for s in shares for sample in s]
    if epoch:
        assert flat == [epoch[i % len(epoch)] for i in range(share * world_size)]
    if drop_last:
        assert len(set(flat)) == len(flat)  # nothing twice


@EXAMPLES
@given(
    sizes=st.lists(st.integers(1, 20), min_size=0, max_size=6),
    num_workers=st.integers(1, 6),
    batch_size=st.one_of(st.none(), st.integers(1, 9)),
)
def test_workers_take_whole_batches_but_one(
    sizes: list[int], num_workers: int, batch_size: int | None
) -> None:
    segments = [Segment(i, 1, 1 + size) for i, size in enumerate(sizes)]
    counts = [1 + size for size in sizes]
    parts = [worker_segments(segments, w, num_workers, batch_size) for w in range(num_workers)]
    flat = [sample for part in parts for sample in positions(part, counts)]
    assert flat == positions(segments, counts)  # the workers' runs, in order, are the rank's
    size = batch_size or 1
    lengths = [sum(len(s) for s in part) for part in parts]
    assert sum(length % size != 0 for length in lengths) <= 1  # one short batch at most
    total = sum(sizes)
    assert sum(-(-length // size) for length in lengths) == -(-total // size)  # len(loader)
    assert sum(length // size for length in lengths) == total // size  # with drop_last
    assert max(lengths, default=0) - min(lengths, default=0) <= size  # balanced


def test_examples() -> None:
    assert rank_segments([0, 1, 2], [5, 3, 4], 1, 2, False) == [Segment(1, 1, 3), Segment(2, 0, 4)]
    # Padding wraps to the epoch's start, repeatedly when there are fewer samples than ranks.
    assert rank_segments([0], [1], 2, 3, False) == [Segment(0, 0, 1)]
    assert rank_segments([0], [1], 2, 3, True) == []
    assert rank_segments([1, 0], [2, 2], 2, 3, False) == [Segment(1, 0, 2)]
    assert rank_segments([0, 1], [0, 0], 0, 2, False) == []
    assert take([Segment(0, 0, 4), Segment(1, 0, 4)], 2, 6) == [Segment(0, 2, 4), Segment(1, 0, 2)]
    assert worker_segments([Segment(0, 0, 10)], 0, 2, 4) == [Segment(0, 0, 4)]
    assert worker_segments([Segment(0, 0, 10)], 1, 2, 4) == [Segment(0, 4, 10)]
    assert worker_segments([Segment(0, 0, 10)], 2, 3, 4) == [Segment(0, 8, 10)]
    # Fewer batches than workers: the first workers go without.
    assert worker_segments([Segment(0, 0, 5)], 0, 3, 4) == []
    assert worker_segments([Segment(0, 0, 5)], 2, 3, 4) == [Segment(0, 4, 5)]
    assert len(Segment(3, 10, 25)) == 15
