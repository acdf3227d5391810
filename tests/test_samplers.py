"""Samplers: torch.utils.data semantics over numpy, sync and async."""

from __future__ import annotations

import math
import pickle
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import numpy as np
import pytest

from aioload.samplers.builtin import (
    BatchSampler,
    DistributedSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
    is_async_sampler,
)

# --- helpers -------------------------------------------------------------------------------


def epochs(sampler: Any, count: int = 3) -> list[list[Any]]:
    return [list(sampler) for _ in range(count)]


def reference_batches(keys: list[int], size: int, drop_last: bool) -> list[list[int]]:
    batches = [keys[i : i + size] for i in range(0, len(keys), size)]
    if drop_last and batches and len(batches[-1]) < size:
        batches.pop()
    return batches


async def slow_keys(n: int) -> AsyncIterator[int]:
    for i in range(n):
        await anyio.sleep(0)
        yield i


class AsyncKeys:
    """A reusable async sampler, optionally sized."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __aiter__(self) -> AsyncIterator[int]:
        return slow_keys(self.n)


class SizedAsyncKeys(AsyncKeys):
    def __len__(self) -> int:
        return self.n


class Dataset64:
    """The reference program's dataset: 64 items, labels ten times the data."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, idx: int) -> tuple[int, int]:
        return idx, idx * 10


# The reference program's samplers, written torch-style (see the reference data-flow note).
class EvenThenOddSampler:
    def __init__(self, data_source: Any) -> None:
        self.data_source = data_source

    def __len__(self) -> int:
        return len(self.data_source)

    def __iter__(self) -> Iterator[int]:
        n = len(self.data_source)
        yield from range(0, n, 2)
        yield from range(1, n, 2)


class EvenThenOddBatchSampler:
    def __init__(self, data_source: Any, batch_size: int, drop_last: bool = False) -> None:
        self.data_source = data_source
        self.batch_size = batch_size
        self.drop_last = drop_last

    def __len__(self) -> int:
        n = len(self.data_source)
        if self.drop_last:
            return n // self.batch_size
        return (n + self.batch_size - 1) // self.batch_size

    def __iter__(self) -> Iterator[list[int]]:
        n = len(self.data_source)
        batch: list[int] = []
        for idx in list(range(0, n, 2)) + list(range(1, n, 2)):
            batch.append(idx)
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch and not self.drop_last:
            yield batch


EVEN_THEN_ODD = list(range(0, 64, 2)) + list(range(1, 64, 2))

# --- Sampler, SequentialSampler ----------------------------------------------------------------


def test_sampler_base_accepts_and_ignores_data_source() -> None:
    sampler: Sampler[int] = Sampler(range(3))
    with pytest.raises(NotImplementedError):
        iter(sampler)
    with pytest.raises(TypeError):
        len(sampler)  # type: ignore[arg-type]


def test_sampler_subclass_torch_style() -> None:
    class EvenThenOdd(Sampler[int]):
        def __init__(self, data_source: Any) -> None:
            self.data_source = data_source

        def __len__(self) -> int:
            return len(self.data_source)

        def __iter__(self) -> Iterator[int]:
            yield from EvenThenOddSampler(self.data_source)

    assert list(EvenThenOdd(Dataset64())) == EVEN_THEN_ODD


def test_sequential_sampler() -> None:
    sampler = SequentialSampler(range(5))
    assert len(sampler) == 5
    assert epochs(sampler, 2) == [[0, 1, 2, 3, 4]] * 2


# --- the reference program's custom samplers ---------------------------------------------------


def test_custom_even_then_odd_sampler_order() -> None:
    sampler = EvenThenOddSampler(Dataset64())
    assert not is_async_sampler(sampler)
    assert len(sampler) == 64
    assert list(sampler) == EVEN_THEN_ODD


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("batch_size", [4, 5])
def test_custom_even_then_odd_batch_sampler(batch_size: int, drop_last: bool) -> None:
    custom = EvenThenOddBatchSampler(Dataset64(), batch_size=batch_size, drop_last=drop_last)
    ours = BatchSampler(EvenThenOddSampler(Dataset64()), batch_size, drop_last)
    expected = reference_batches(EVEN_THEN_ODD, batch_size, drop_last)
    assert list(custom) == expected
    assert list(ours) == expected
    assert len(custom) == len(ours) == len(expected)


def test_even_then_odd_batches_of_four() -> None:
    batches = list(EvenThenOddBatchSampler(Dataset64(), batch_size=4))
    assert batches[0] == [0, 2, 4, 6]
    assert batches[7] == [56, 58, 60, 62]
    assert batches[8] == [1, 3, 5, 7]
    assert batches[-1] == [57, 59, 61, 63]
    assert len(batches) == 16


# --- BatchSampler -------------------------------------------------------------------------------


def test_batch_sampler_torch_example() -> None:
    assert list(BatchSampler(SequentialSampler(range(10)), batch_size=3, drop_last=False)) == [
        [0, 1, 2],
        [3, 4, 5],
        [6, 7, 8],
        [9],
    ]
    assert list(BatchSampler(SequentialSampler(range(10)), batch_size=3, drop_last=True)) == [
        [0, 1, 2],
        [3, 4, 5],
        [6, 7, 8],
    ]


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 64])
@pytest.mark.parametrize("batch_size", [1, 3, 8, 100])
@pytest.mark.parametrize("drop_last", [False, True])
def test_batch_sampler_matches_reference(n: int, batch_size: int, drop_last: bool) -> None:
    sampler = BatchSampler(SequentialSampler(range(n)), batch_size, drop_last)
    expected = reference_batches(list(range(n)), batch_size, drop_last)
    assert epochs(sampler, 2) == [expected] * 2
    assert len(sampler) == len(expected)


def test_batch_sampler_over_plain_iterables() -> None:
    class GetItemOnly:  # iterable through the old __getitem__ protocol
        def __getitem__(self, i: int) -> int:
            if i >= 5:
                raise IndexError(i)
            return i

    assert list(BatchSampler([4, 3, 2, 1], 3, False)) == [[4, 3, 2], [1]]
    old_style = BatchSampler(GetItemOnly(), 2, False)  # type: ignore[arg-type]
    assert list(old_style) == [[0, 1], [2, 3], [4]]
    assert list(BatchSampler(iter(range(4)), 2, True)) == [[0, 1], [2, 3]]


def test_batch_sampler_len_needs_sized_sampler() -> None:
    with pytest.raises(TypeError, match="len"):
        len(BatchSampler(iter(range(4)), 2, False))


def test_batch_sampler_accepts_numpy_batch_size() -> None:
    sampler = BatchSampler(range(5), np.int64(2), False)  # type: ignore[arg-type]
    assert sampler.batch_size == 2
    assert type(sampler.batch_size) is int
    assert list(sampler) == [[0, 1], [2, 3], [4]]


@pytest.mark.parametrize("batch_size", [0, -1, 1.5, "2", True, None])
def test_batch_sampler_rejects_bad_batch_size(batch_size: Any) -> None:
    with pytest.raises(ValueError, match="batch_size should be a positive integer value"):
        BatchSampler(range(4), batch_size, False)


@pytest.mark.parametrize("drop_last", [0, 1, "yes", None])
def test_batch_sampler_rejects_non_bool_drop_last(drop_last: Any) -> None:
    with pytest.raises(ValueError, match="drop_last should be a boolean value"):
        BatchSampler(range(4), 2, drop_last)


@pytest.mark.parametrize("sampler", [10, None, 2.5])
def test_batch_sampler_rejects_non_iterable_sampler(sampler: Any) -> None:
    with pytest.raises(TypeError, match="sampler should be an iterable or async iterable"):
        BatchSampler(sampler, 2, False)


def test_batch_sampler_pickles() -> None:
    sampler = BatchSampler(SequentialSampler(range(5)), 2, True)
    clone = pickle.loads(pickle.dumps(sampler))
    assert type(clone) is BatchSampler
    assert list(clone) == [[0, 1], [2, 3]]


# --- plain-int keys from every built-in sampler -------------------------------------------------


@pytest.mark.parametrize(
    "sampler",
    [
        SequentialSampler(range(20)),
        RandomSampler(range(20), generator=0),
        RandomSampler(range(20), replacement=True, num_samples=30, generator=0),
        RandomSampler(range(20), num_samples=45, generator=0),
        SubsetRandomSampler(np.arange(5, 25), generator=0),
        SubsetRandomSampler(range(5, 25), generator=0),
        WeightedRandomSampler(np.ones(20), 30, generator=0),
        WeightedRandomSampler(np.ones(20), 15, replacement=False, generator=0),
        DistributedSampler(range(20), num_replicas=3, rank=1),
        DistributedSampler(range(20), num_replicas=3, rank=1, shuffle=False),
    ],
    ids=lambda s: type(s).__name__,
)
def test_keys_are_plain_ints(sampler: Any) -> None:
    keys = list(sampler)
    assert len(keys) == len(sampler)
    assert all(type(k) is int for k in keys)
    assert all(type(k) is int for batch in BatchSampler(sampler, 4, False) for k in batch)


# --- generator argument -------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 7, np.int64(3)])
def test_int_seed_becomes_generator(seed: Any) -> None:
    sampler = RandomSampler(range(10), generator=seed)
    assert isinstance(sampler.generator, np.random.Generator)


@pytest.mark.parametrize(
    "make",
    [
        lambda g: RandomSampler(range(4), generator=g),
        lambda g: SubsetRandomSampler([1, 2], generator=g),
        lambda g: WeightedRandomSampler([1.0, 2.0], 2, generator=g),
    ],
    ids=["RandomSampler", "SubsetRandomSampler", "WeightedRandomSampler"],
)
@pytest.mark.parametrize("generator", ["0", 1.5, True, np.random.RandomState(0), object()])
def test_generator_rejects_other_types(make: Any, generator: Any) -> None:
    with pytest.raises(TypeError, match=r"generator should be None, a numpy.random.Generator"):
        make(generator)


def test_generator_rejects_negative_seed() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        RandomSampler(range(4), generator=-1)


def test_seeded_samplers_never_touch_global_numpy_state() -> None:
    # Without a generator a sampler draws its seed from the global state, as torch's do
    # (see test_torch_habits.py); with one, the global state is left alone.
    np.random.seed(123)
    before = np.random.get_state()[1].copy()  # type: ignore[index]
    for sampler in [
        RandomSampler(range(50), generator=0),
        RandomSampler(range(50), replacement=True, generator=np.random.default_rng(1)),
        SubsetRandomSampler(list(range(50)), generator=2),
        WeightedRandomSampler(np.ones(50), 20, generator=3),
        WeightedRandomSampler(np.ones(50), 20, replacement=False, generator=4),
        DistributedSampler(range(50), num_replicas=2, rank=0),
    ]:
        list(sampler)
    assert np.array_equal(np.random.get_state()[1], before)  # type: ignore[index]


# --- RandomSampler -------------------------------------------------------------------------------


def test_random_sampler_is_a_permutation() -> None:
    sampler = RandomSampler(range(100), generator=0)
    assert len(sampler) == 100
    keys = list(sampler)
    assert sorted(keys) == list(range(100))
    assert keys != list(range(100))


def test_random_sampler_seeded_epochs_reproducible_and_distinct() -> None:
    runs = [epochs(RandomSampler(range(100), generator=42)) for _ in range(2)]
    assert runs[0] == runs[1]
    assert runs[0][0] != runs[0][1] != runs[0][2]
    same_generator = epochs(RandomSampler(range(100), generator=np.random.default_rng(42)))
    assert same_generator == runs[0]


def test_random_sampler_advances_a_shared_generator() -> None:
    rng = np.random.default_rng(5)
    first = list(RandomSampler(range(50), generator=rng))
    second = list(RandomSampler(range(50), generator=rng))
    assert first != second


def test_random_sampler_without_generator_reshuffles_each_epoch() -> None:
    sampler = RandomSampler(range(1000))
    a, b = epochs(sampler, 2)
    assert sorted(a) == sorted(b) == list(range(1000))
    assert a != b


def test_random_sampler_with_replacement() -> None:
    sampler = RandomSampler(range(10), replacement=True, num_samples=5000, generator=0)
    keys = list(sampler)
    assert len(sampler) == len(keys) == 5000
    assert set(keys) == set(range(10))  # every index shows up in 5000 draws
    assert len(RandomSampler(range(10), replacement=True, generator=0)) == 10


def test_random_sampler_num_samples_beyond_dataset_without_replacement() -> None:
    keys = list(RandomSampler(range(5), num_samples=12, generator=0))
    assert len(keys) == 12
    assert sorted(keys[:5]) == sorted(keys[5:10]) == list(range(5))
    assert len(set(keys[10:])) == 2


def test_random_sampler_num_samples_below_dataset() -> None:
    keys = list(RandomSampler(range(100), num_samples=10, generator=0))
    assert len(keys) == len(set(keys)) == 10


def test_random_sampler_follows_dataset_size() -> None:
    data = list(range(5))
    sampler = RandomSampler(data, generator=0)
    data.extend(range(5, 8))
    assert len(sampler) == 8
    assert sorted(sampler) == list(range(8))


@pytest.mark.parametrize("replacement", [0, 1, "True", None])
def test_random_sampler_rejects_non_bool_replacement(replacement: Any) -> None:
    with pytest.raises(TypeError, match="replacement should be a boolean value"):
        RandomSampler(range(4), replacement=replacement)


@pytest.mark.parametrize("num_samples", [0, -3, 2.0, "4", True])
def test_random_sampler_rejects_bad_num_samples(num_samples: Any) -> None:
    with pytest.raises(ValueError, match="num_samples should be a positive integer value"):
        RandomSampler(range(4), num_samples=num_samples)


def test_random_sampler_rejects_empty_data_source() -> None:
    with pytest.raises(ValueError, match=r"num_samples=0 \(data_source is empty\)"):
        RandomSampler([])
    with pytest.raises(ValueError, match="empty data_source"):
        RandomSampler([], replacement=True, num_samples=3)


# --- SubsetRandomSampler --------------------------------------------------------------------------


def test_subset_random_sampler() -> None:
    indices = [3, 14, 15, 92, 65]
    sampler = SubsetRandomSampler(indices, generator=1)
    assert len(sampler) == 5
    a, b, c = epochs(sampler)
    assert sorted(a) == sorted(indices)
    assert len({tuple(a), tuple(b), tuple(c)}) > 1
    assert epochs(SubsetRandomSampler(indices, generator=1)) == [a, b, c]


def test_subset_random_sampler_empty() -> None:
    sampler = SubsetRandomSampler([])
    assert len(sampler) == 0
    assert list(sampler) == []


@pytest.mark.parametrize("indices", [{1, 2}, 5, "abc", {0: 1}])
def test_subset_random_sampler_rejects_non_sequences(indices: Any) -> None:
    with pytest.raises(TypeError, match="indices should be a sequence of indices"):
        SubsetRandomSampler(indices)


def test_subset_random_sampler_rejects_2d_array() -> None:
    with pytest.raises(ValueError, match=r"1-D sequence.*\(2, 2\)"):
        SubsetRandomSampler(np.zeros((2, 2), dtype=int))


# --- WeightedRandomSampler ------------------------------------------------------------------------


def test_weighted_sampler_with_replacement_frequencies() -> None:
    weights = [0.0, 1.0, 2.0, 0.0, 3.0, 4.0, 0.0]
    keys = np.array(list(WeightedRandomSampler(weights, 40_000, generator=0)))
    counts = np.bincount(keys, minlength=len(weights))
    assert counts[[0, 3, 6]].tolist() == [0, 0, 0]  # zero weight: never drawn
    freqs = counts / counts.sum()
    assert np.allclose(freqs, np.array(weights) / sum(weights), atol=0.01)


def test_weighted_sampler_without_replacement() -> None:
    weights = np.array([0.0, 1.0, 5.0, 0.0, 2.0])
    full = list(WeightedRandomSampler(weights, 3, replacement=False, generator=0))
    assert sorted(full) == [1, 2, 4]
    partial = list(WeightedRandomSampler(weights, 2, replacement=False, generator=0))
    assert len(set(partial)) == 2 and set(partial) <= {1, 2, 4}


def test_weighted_sampler_without_replacement_first_draw_follows_weights() -> None:
    sampler = WeightedRandomSampler([1.0, 3.0], 2, replacement=False, generator=0)
    firsts = [next(iter(sampler)) for _ in range(4000)]
    assert abs(firsts.count(1) / 4000 - 0.75) < 0.03


def test_weighted_sampler_seeded_and_len() -> None:
    def make() -> WeightedRandomSampler:
        return WeightedRandomSampler([0.1, 0.9, 0.4, 0.7, 3.0, 0.6], 5, generator=3)

    assert len(make()) == 5
    assert epochs(make()) == epochs(make())
    assert isinstance(make().weights, np.ndarray)


@pytest.mark.parametrize(
    ("weights", "error", "message"),
    [
        ([1.0, -0.5], ValueError, "non-negative"),
        ([[1.0, 2.0]], ValueError, r"1d sequence but given weights have shape \(1, 2\)"),
        ([], ValueError, "non-empty"),
        ([0.0, 0.0], ValueError, "at least one positive weight"),
        ([1.0, float("nan")], ValueError, "finite"),
        ([1.0, float("inf")], ValueError, "finite"),
        (["a", "b"], TypeError, "weights should be a 1d sequence of numbers"),
        (None, ValueError, "1d sequence"),
    ],
)
def test_weighted_sampler_rejects_bad_weights(weights: Any, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        WeightedRandomSampler(weights, 1)


def test_weighted_sampler_rejects_too_many_samples_without_replacement() -> None:
    with pytest.raises(ValueError, match=r"num_samples=3 exceeds the 2 non-zero weights"):
        WeightedRandomSampler([1.0, 0.0, 2.0], 3, replacement=False)
    assert len(list(WeightedRandomSampler([1.0, 0.0, 2.0], 3, replacement=True))) == 3


@pytest.mark.parametrize("num_samples", [0, -1, 1.5, True, None])
def test_weighted_sampler_rejects_bad_num_samples(num_samples: Any) -> None:
    with pytest.raises(ValueError, match="num_samples should be a positive integer value"):
        WeightedRandomSampler([1.0], num_samples)


@pytest.mark.parametrize("replacement", [1, "no", None])
def test_weighted_sampler_rejects_non_bool_replacement(replacement: Any) -> None:
    with pytest.raises(ValueError, match="replacement should be a boolean value"):
        WeightedRandomSampler([1.0], 1, replacement=replacement)


# --- DistributedSampler ---------------------------------------------------------------------------


def shards(n: int, replicas: int, **kwargs: Any) -> list[list[int]]:
    return [
        list(DistributedSampler(range(n), num_replicas=replicas, rank=r, **kwargs))
        for r in range(replicas)
    ]


@pytest.mark.parametrize("n", [0, 1, 5, 10, 12, 13])
@pytest.mark.parametrize("replicas", [1, 3, 4, 16])
@pytest.mark.parametrize("shuffle", [False, True])
def test_distributed_padding_covers_dataset(n: int, replicas: int, shuffle: bool) -> None:
    parts = shards(n, replicas, shuffle=shuffle)
    expected = math.ceil(n / replicas)
    assert [len(p) for p in parts] == [expected] * replicas
    assert len(DistributedSampler(range(n), replicas, 0)) == expected
    assert set().union(*parts) == set(range(n))


@pytest.mark.parametrize("n", [0, 1, 5, 10, 12, 13])
@pytest.mark.parametrize("replicas", [1, 3, 4, 16])
@pytest.mark.parametrize("shuffle", [False, True])
def test_distributed_drop_last_truncates(n: int, replicas: int, shuffle: bool) -> None:
    parts = shards(n, replicas, shuffle=shuffle, drop_last=True)
    expected = n // replicas
    assert [len(p) for p in parts] == [expected] * replicas
    assert len(DistributedSampler(range(n), replicas, 0, drop_last=True)) == expected
    flat = [k for p in parts for k in p]
    assert len(flat) == len(set(flat)) == expected * replicas
    assert set(flat) <= set(range(n))


def test_distributed_order_without_shuffle() -> None:
    assert shards(5, 2, shuffle=False) == [[0, 2, 4], [1, 3, 0]]
    assert shards(2, 5, shuffle=False) == [[0], [1], [0], [1], [0]]
    assert shards(5, 2, shuffle=False, drop_last=True) == [[0, 2], [1, 3]]


def test_distributed_set_epoch_reshuffles_consistently() -> None:
    samplers = [DistributedSampler(range(40), 4, r, seed=1) for r in range(4)]
    seen = []
    for epoch in range(3):
        for s in samplers:
            s.set_epoch(epoch)
        parts = [list(s) for s in samplers]
        assert sorted(k for p in parts for k in p) == list(range(40))
        assert parts == [list(s) for s in samplers]  # same epoch, same order
        seen.append(parts)
    assert seen[0] != seen[1] != seen[2]
    assert shards(40, 4, seed=1) == seen[0]
    assert shards(40, 4, seed=2) != seen[0]


def test_distributed_seed_plus_epoch() -> None:
    later = DistributedSampler(range(30), 2, 0, seed=3)
    later.set_epoch(2)
    assert list(later) == list(DistributedSampler(range(30), 2, 0, seed=5))


def test_distributed_defaults_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "2")
    sampler = DistributedSampler(range(10))
    assert (sampler.num_replicas, sampler.rank) == (4, 2)
    assert list(sampler) == list(DistributedSampler(range(10), num_replicas=4, rank=2))
    assert DistributedSampler(range(10), num_replicas=8, rank=7).rank == 7


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RANK": "0"}, "num_replicas was not given and the WORLD_SIZE environment variable"),
        ({"WORLD_SIZE": "2"}, "rank was not given and the RANK environment variable"),
        ({"WORLD_SIZE": "two", "RANK": "0"}, "WORLD_SIZE environment variable should be"),
    ],
)
def test_distributed_environment_errors(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], message: str
) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=message):
        DistributedSampler(range(10))


@pytest.mark.parametrize(("replicas", "rank"), [(4, 4), (4, -1), (1, 1)])
def test_distributed_rejects_rank_out_of_range(replicas: int, rank: int) -> None:
    message = rf"Invalid rank {rank}, rank should be in the interval \[0, {replicas - 1}\]"
    with pytest.raises(ValueError, match=message):
        DistributedSampler(range(10), num_replicas=replicas, rank=rank)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"num_replicas": 0, "rank": 0}, ValueError, "num_replicas should be a positive"),
        ({"num_replicas": -2, "rank": 0}, ValueError, "num_replicas should be a positive"),
        ({"num_replicas": "2", "rank": 0}, TypeError, "num_replicas should be an integer"),
        ({"num_replicas": 2, "rank": 1.0}, TypeError, "rank should be an integer"),
        ({"num_replicas": True, "rank": 0}, TypeError, "num_replicas should be an integer"),
        ({"num_replicas": 2, "rank": 0, "shuffle": 1}, TypeError, "shuffle should be a boolean"),
        ({"num_replicas": 2, "rank": 0, "drop_last": "no"}, TypeError, "drop_last should be"),
        ({"num_replicas": 2, "rank": 0, "seed": 1.5}, TypeError, "seed should be an integer"),
        ({"num_replicas": 2, "rank": 0, "seed": -1}, ValueError, "seed should be a non-negative"),
    ],
)
def test_distributed_rejects_bad_arguments(
    kwargs: dict[str, Any], error: type, message: str
) -> None:
    with pytest.raises(error, match=message):
        DistributedSampler(range(10), **kwargs)


@pytest.mark.parametrize(("epoch", "error"), [(-1, ValueError), (1.0, TypeError), ("1", TypeError)])
def test_distributed_set_epoch_rejects_bad_epoch(epoch: Any, error: type) -> None:
    sampler = DistributedSampler(range(10), num_replicas=2, rank=0)
    with pytest.raises(error, match="epoch should be"):
        sampler.set_epoch(epoch)


# --- async samplers -------------------------------------------------------------------------------


def test_is_async_sampler() -> None:
    assert is_async_sampler(slow_keys(3))
    assert is_async_sampler(AsyncKeys(3))
    for sync in [range(3), [0, 1], SequentialSampler(range(3)), EvenThenOddSampler(range(4))]:
        assert not is_async_sampler(sync)


def test_batch_sampler_picks_async_class_from_inner_sampler() -> None:
    async_batches = BatchSampler(AsyncKeys(5), 2, False)
    sync_batches = BatchSampler(SequentialSampler(range(5)), 2, False)
    assert is_async_sampler(async_batches)
    assert not is_async_sampler(sync_batches)
    assert isinstance(async_batches, BatchSampler)
    assert is_async_sampler(BatchSampler(sampler=AsyncKeys(5), batch_size=2, drop_last=False))


async def collect(batches: Any) -> list[list[int]]:
    return [batch async for batch in batches]


@pytest.mark.asyncio
@pytest.mark.parametrize("n", [0, 1, 9, 10])
@pytest.mark.parametrize("drop_last", [False, True])
async def test_async_batch_sampler(n: int, drop_last: bool) -> None:
    sampler = BatchSampler(slow_keys(n), 3, drop_last)
    assert await collect(sampler) == reference_batches(list(range(n)), 3, drop_last)


@pytest.mark.asyncio
async def test_async_batch_sampler_is_reiterable_over_reusable_inner() -> None:
    sampler = BatchSampler(AsyncKeys(10), batch_size=3, drop_last=False)
    expected = [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    assert await collect(sampler) == expected
    assert await collect(sampler) == expected


@pytest.mark.asyncio
async def test_async_batch_sampler_rejects_sync_iteration() -> None:
    sampler = BatchSampler(AsyncKeys(4), 2, False)
    with pytest.raises(TypeError, match="async for"):
        iter(sampler)
    with pytest.raises(TypeError, match="async for"):
        list(sampler)


def test_async_batch_sampler_len() -> None:
    assert len(BatchSampler(SizedAsyncKeys(10), 3, False)) == 4
    assert len(BatchSampler(SizedAsyncKeys(10), 3, True)) == 3
    with pytest.raises(TypeError, match="len"):
        len(BatchSampler(AsyncKeys(10), 3, False))
    with pytest.raises(TypeError, match="len"):
        len(BatchSampler(slow_keys(10), 3, False))


@pytest.mark.parametrize("batch_size", [0, "3"])
def test_async_batch_sampler_validates_arguments(batch_size: Any) -> None:
    with pytest.raises(ValueError, match="batch_size should be a positive integer value"):
        BatchSampler(AsyncKeys(4), batch_size, False)


@pytest.mark.asyncio
async def test_async_batch_sampler_pickles() -> None:
    clone = pickle.loads(pickle.dumps(BatchSampler(AsyncKeys(5), 2, True)))
    assert is_async_sampler(clone)
    assert await collect(clone) == [[0, 1], [2, 3]]
