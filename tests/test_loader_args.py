"""DataLoader's arguments: torch's defaults, mutual exclusions, error messages and ``len()``.

Messages are matched against torch's ``DataLoader.__init__`` wherever torch has one.
"""

from __future__ import annotations

import math
import multiprocessing
import random
import re
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from aioload import (
    DEFAULT_CONCURRENCY,
    BatchSampler,
    DataLoader,
    Dataset,
    IterableDataset,
    RandomSampler,
    Sampler,
    SequentialSampler,
    default_collate,
    default_convert,
)


class Items(Dataset[int]):
    def __init__(self, n: int) -> None:
        self.n = n

    def __getitem__(self, i: int) -> int:
        return i

    def __len__(self) -> int:
        return self.n


class Stream(IterableDataset[int]):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.n))


class SizedStream(Stream):
    def __len__(self) -> int:
        return self.n


class UnsizedSampler(Sampler[int]):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.n))


# The reference program from the torch.utils.data notes (seed 001), over numpy.


class EvenThenOddSampler(Sampler[int]):
    def __init__(self, data_source: Any) -> None:
        self.data_source = data_source

    def __len__(self) -> int:
        return len(self.data_source)

    def __iter__(self) -> Iterator[int]:
        n = len(self.data_source)
        yield from range(0, n, 2)
        yield from range(1, n, 2)


class EvenThenOddBatchSampler(Sampler[list[int]]):
    def __init__(self, data_source: Any, batch_size: int, drop_last: bool = False) -> None:
        self.data_source = data_source
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.epochs = 0

    def __len__(self) -> int:
        n = len(self.data_source)
        if self.drop_last:
            return n // self.batch_size
        return (n + self.batch_size - 1) // self.batch_size

    def __iter__(self) -> Iterator[list[int]]:
        self.epochs += 1
        n = len(self.data_source)
        batch: list[int] = []
        for idx in [*range(0, n, 2), *range(1, n, 2)]:
            batch.append(idx)
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch and not self.drop_last:
            yield batch


class MyDataset(Dataset[tuple[Any, Any]]):
    def __init__(self) -> None:
        self.data = np.arange(64)
        self.labels = np.arange(64) * 10

    def __getitem__(self, idx: int) -> tuple[Any, Any]:
        return self.data[idx], self.labels[idx]

    def __len__(self) -> int:
        return len(self.data)


# Defaults


def test_defaults_match_torch() -> None:
    dataset = Items(10)
    loader = DataLoader(dataset)
    assert loader.dataset is dataset
    assert loader.batch_size == 1
    assert loader.drop_last is False
    assert isinstance(loader.sampler, SequentialSampler)
    assert isinstance(loader.batch_sampler, BatchSampler)
    assert loader.batch_sampler.sampler is loader.sampler
    assert (loader.batch_sampler.batch_size, loader.batch_sampler.drop_last) == (1, False)
    assert loader.collate_fn is default_collate
    assert loader.num_workers == 0
    assert loader.pin_memory is False
    assert loader.timeout == 0
    assert loader.worker_init_fn is None
    assert loader.multiprocessing_context is None
    assert loader.generator is None
    assert loader.prefetch_factor is None
    assert loader.persistent_workers is False
    assert loader.pin_memory_device == ""
    assert loader.in_order is True
    assert loader.concurrency == DEFAULT_CONCURRENCY == 256


@pytest.mark.parametrize("shuffle", [None, False])
def test_unshuffled_map_style_uses_a_sequential_sampler(shuffle: bool | None) -> None:
    loader = DataLoader(Items(10), shuffle=shuffle)
    assert isinstance(loader.sampler, SequentialSampler)
    assert [b.tolist() for b in loader] == [[i] for i in range(10)]


def test_shuffle_uses_a_random_sampler_with_the_loaders_generator() -> None:
    loader = DataLoader(Items(10), shuffle=True, generator=3)
    assert isinstance(loader.sampler, RandomSampler)
    assert isinstance(loader.generator, np.random.Generator)
    assert loader.sampler.generator is loader.generator


def test_an_int_seed_makes_the_epochs_reproducible() -> None:
    def epochs(seed: int) -> list[list[int]]:
        loader = DataLoader(Items(20), batch_size=20, shuffle=True, generator=seed)
        return [next(iter(loader)).tolist() for _ in range(3)]

    first = epochs(7)
    assert first == epochs(7)
    assert first[0] != first[1]  # reshuffled each epoch
    assert sorted(first[0]) == list(range(20))


def test_a_numpy_generator_is_kept_as_given() -> None:
    rng = np.random.default_rng(0)
    loader = DataLoader(Items(5), shuffle=True, generator=rng)
    assert loader.generator is rng


def test_batch_size_and_drop_last_build_the_batch_sampler() -> None:
    loader = DataLoader(Items(10), batch_size=4, drop_last=True)
    assert isinstance(loader.batch_sampler, BatchSampler)
    assert (loader.batch_sampler.batch_size, loader.batch_sampler.drop_last) == (4, True)
    assert [b.tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_batch_size_none_turns_auto_batching_off() -> None:
    loader = DataLoader(Items(3), batch_size=None)
    assert loader.batch_sampler is None
    assert isinstance(loader.sampler, SequentialSampler)
    assert loader.collate_fn is default_convert
    assert [int(x) for x in loader] == [0, 1, 2]


def test_a_given_sampler_is_batched() -> None:
    sampler = EvenThenOddSampler(range(6))
    loader = DataLoader(Items(6), batch_size=2, sampler=sampler)
    assert loader.sampler is sampler
    assert isinstance(loader.batch_sampler, BatchSampler)
    assert loader.batch_sampler.sampler is sampler


def test_a_given_batch_sampler_resets_batch_size_and_drop_last() -> None:
    batch_sampler = EvenThenOddBatchSampler(range(6), batch_size=2)
    loader = DataLoader(Items(6), batch_sampler=batch_sampler)
    assert loader.batch_sampler is batch_sampler
    assert loader.batch_size is None
    assert loader.drop_last is False
    assert isinstance(loader.sampler, SequentialSampler)
    assert loader.collate_fn is default_collate


def test_a_given_collate_fn_is_kept() -> None:
    def collate(batch: list[int]) -> int:
        return sum(batch)

    loader = DataLoader(Items(6), batch_size=3, collate_fn=collate)
    assert loader.collate_fn is collate
    assert list(loader) == [3, 12]


@pytest.mark.parametrize(("batch_size", "collate_fn"), [(3, default_collate), (None, None)])
def test_iterable_dataset_defaults(batch_size: int | None, collate_fn: Any) -> None:
    loader = DataLoader(Stream(4), batch_size=batch_size)
    assert loader.collate_fn is (collate_fn or default_convert)


@pytest.mark.parametrize("shuffle", [None, False])
def test_iterable_dataset_accepts_an_unspecified_or_false_shuffle(shuffle: bool | None) -> None:
    loader = DataLoader(Stream(5), batch_size=2, shuffle=shuffle)
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3], [4]]


# Mutual exclusions and bad values, with torch's messages

BATCH_SAMPLER_EXCLUSIVE = (
    "batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, and drop_last"
)


def test_sampler_excludes_shuffle() -> None:
    with pytest.raises(ValueError, match="sampler option is mutually exclusive with shuffle"):
        DataLoader(Items(4), sampler=SequentialSampler(range(4)), shuffle=True)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"batch_size": 2},
        {"batch_size": None},  # torch tests `batch_size != 1`, so None clashes too
        {"shuffle": True},
        {"sampler": SequentialSampler(range(4))},
        {"drop_last": True},
    ],
)
def test_batch_sampler_excludes_the_batching_options(kwargs: dict[str, Any]) -> None:
    batch_sampler = BatchSampler(SequentialSampler(range(4)), 2, False)
    with pytest.raises(ValueError, match=BATCH_SAMPLER_EXCLUSIVE):
        DataLoader(Items(4), batch_sampler=batch_sampler, **kwargs)


def test_batch_sampler_allows_the_batching_options_at_their_defaults() -> None:
    batch_sampler = BatchSampler(SequentialSampler(range(4)), 2, False)
    loader = DataLoader(
        Items(4),
        batch_size=1,
        shuffle=False,
        sampler=None,
        drop_last=False,
        batch_sampler=batch_sampler,
    )
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3]]


def test_batch_size_none_excludes_drop_last() -> None:
    with pytest.raises(
        ValueError,
        match="batch_size=None option disables auto-batching and is mutually exclusive with "
        "drop_last",
    ):
        DataLoader(Items(4), batch_size=None, drop_last=True)


def test_batch_size_none_only_tests_the_truth_of_drop_last() -> None:
    # As torch: drop_last is checked as a bool only where a BatchSampler is built.
    loader = DataLoader(Items(3), batch_size=None, drop_last=0)  # type: ignore[arg-type]
    assert [int(x) for x in loader] == [0, 1, 2]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"shuffle": True}, "expected unspecified shuffle option, but got shuffle=True"),
        ({"sampler": [0, 1]}, r"expected unspecified sampler option, but got sampler=\[0, 1\]"),
        (
            {"batch_sampler": [[0, 1]]},
            r"expected unspecified batch_sampler option, but got batch_sampler=\[\[0, 1\]\]",
        ),
        # The dataset kind is checked first, as in torch.
        ({"sampler": [0], "shuffle": True}, "expected unspecified shuffle option"),
    ],
)
def test_iterable_dataset_rejects_samplers_and_shuffle(
    kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match="DataLoader with IterableDataset: " + message):
        DataLoader(Stream(4), **kwargs)


def test_negative_num_workers() -> None:
    with pytest.raises(
        ValueError,
        match=re.escape(
            "num_workers option should be non-negative; "
            "use num_workers=0 to disable multiprocessing."
        ),
    ):
        DataLoader(Items(4), num_workers=-1)


@pytest.mark.parametrize("num_workers", [1.5, "2", True])
def test_num_workers_must_be_an_int(num_workers: Any) -> None:
    with pytest.raises(TypeError, match="num_workers should be an int"):
        DataLoader(Items(4), num_workers=num_workers)


@pytest.mark.parametrize("timeout", [-1, -0.5])
def test_negative_timeout(timeout: float) -> None:
    with pytest.raises(ValueError, match="timeout option should be non-negative"):
        DataLoader(Items(4), timeout=timeout)


def test_persistent_workers_need_workers() -> None:
    with pytest.raises(ValueError, match=r"persistent_workers option needs num_workers > 0"):
        DataLoader(Items(4), persistent_workers=True)


@pytest.mark.parametrize("context", ["spawn", multiprocessing.get_context("spawn")])
def test_multiprocessing_context_needs_workers(context: Any) -> None:
    with pytest.raises(
        ValueError,
        match=r"multiprocessing_context can only be used with multi-process loading "
        r"\(num_workers > 0\), but got num_workers=0",
    ):
        DataLoader(Items(4), multiprocessing_context=context)


def test_multiprocessing_context_must_name_a_start_method() -> None:
    with pytest.raises(
        ValueError,
        match=re.escape(
            "multiprocessing_context option should specify a valid start method in "
            f"{multiprocessing.get_all_start_methods()!r}, "
            "but got multiprocessing_context='threads'"
        ),
    ):
        DataLoader(Items(4), num_workers=2, multiprocessing_context="threads")


def test_multiprocessing_context_must_be_a_context_or_a_string() -> None:
    with pytest.raises(
        TypeError,
        match="multiprocessing_context option should be a valid context object or a string "
        "specifying the start method",
    ):
        DataLoader(Items(4), num_workers=2, multiprocessing_context=42)


@pytest.mark.parametrize("batch_size", [0, -1, 1.5, True, "4"])
@pytest.mark.parametrize("dataset", [Items(4), Stream(4)], ids=["map", "iterable"])
def test_bad_batch_size(batch_size: Any, dataset: Any) -> None:
    with pytest.raises(ValueError, match="batch_size should be a positive integer value"):
        DataLoader(dataset, batch_size=batch_size)


@pytest.mark.parametrize("drop_last", ["yes", 1, None])
@pytest.mark.parametrize("dataset", [Items(4), Stream(4)], ids=["map", "iterable"])
def test_drop_last_must_be_a_bool(drop_last: Any, dataset: Any) -> None:
    with pytest.raises(ValueError, match="drop_last should be a boolean value, but got drop_last="):
        DataLoader(dataset, batch_size=2, drop_last=drop_last)


@pytest.mark.parametrize("prefetch_factor", [0, -1])
def test_prefetch_factor_must_be_positive(prefetch_factor: int) -> None:
    with pytest.raises(ValueError, match="prefetch_factor should be a positive integer"):
        DataLoader(Items(4), prefetch_factor=prefetch_factor)


@pytest.mark.parametrize("prefetch_factor", [1.5, "2", True])
def test_prefetch_factor_must_be_an_int(prefetch_factor: Any) -> None:
    with pytest.raises(TypeError, match="prefetch_factor should be an int"):
        DataLoader(Items(4), prefetch_factor=prefetch_factor)


@pytest.mark.parametrize("concurrency", [0, -3])
def test_concurrency_must_be_positive(concurrency: int) -> None:
    with pytest.raises(ValueError, match="concurrency should be at least 1"):
        DataLoader(Items(4), concurrency=concurrency)


@pytest.mark.parametrize("concurrency", [2.0, "8", True])
def test_concurrency_must_be_an_int(concurrency: Any) -> None:
    with pytest.raises(TypeError, match="concurrency should be an int"):
        DataLoader(Items(4), concurrency=concurrency)


@pytest.mark.parametrize("in_order", [1, None, "yes"])
def test_in_order_must_be_a_bool(in_order: Any) -> None:
    with pytest.raises(TypeError, match="in_order should be a bool"):
        DataLoader(Items(4), in_order=in_order)


@pytest.mark.parametrize("generator", ["seed", 1.5, True, random.Random(0)])
def test_generator_must_be_a_numpy_generator_or_a_seed(generator: Any) -> None:
    with pytest.raises(
        TypeError,
        match=re.escape(
            "generator should be None, a numpy.random.Generator, a torch.Generator or an int"
        ),
    ):
        DataLoader(Items(4), shuffle=True, generator=generator)


def test_generator_seed_must_be_non_negative() -> None:
    with pytest.raises(ValueError, match="generator seed should be a non-negative integer"):
        DataLoader(Items(4), generator=-1)


@pytest.mark.parametrize(
    "attr", ["batch_size", "sampler", "batch_sampler", "drop_last", "dataset", "persistent_workers"]
)
def test_sampling_attributes_are_frozen_after_init(attr: str) -> None:
    loader = DataLoader(Items(4))
    with pytest.raises(
        ValueError, match=f"{attr} attribute should not be set after DataLoader is initialized"
    ):
        setattr(loader, attr, getattr(loader, attr))


def test_the_frozen_message_names_a_subclass() -> None:
    class MyLoader(DataLoader):
        pass

    with pytest.raises(ValueError, match="should not be set after MyLoader is initialized"):
        MyLoader(Items(4)).batch_size = 2


def test_other_attributes_can_be_set_after_init() -> None:
    loader = DataLoader(Items(4), batch_size=2)
    loader.collate_fn = default_convert
    loader.timeout = 5
    assert list(loader) == [[0, 1], [2, 3]]  # default_convert leaves the lists of ints as they are


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2", None])
def test_max_worker_restarts_must_be_a_non_negative_int(bad: object) -> None:
    with pytest.raises(ValueError, match="max_worker_restarts should be a non-negative integer"):
        DataLoader(Items(4), num_workers=1, max_worker_restarts=bad)  # type: ignore[arg-type]


# prefetch_factor and the window of batches in flight


@pytest.mark.parametrize("prefetch_factor", [1, 3, 50])
def test_prefetch_factor_is_allowed_without_workers_and_sets_the_window(
    prefetch_factor: int,
) -> None:
    # Unlike torch: with num_workers=0 it sizes the window of batches in flight on the loop.
    loader = DataLoader(Items(10), batch_size=2, prefetch_factor=prefetch_factor)
    assert loader.prefetch_factor == prefetch_factor
    assert loader.window == prefetch_factor
    assert len(list(loader)) == 5


class AsyncItems(Items):
    async def __getitem__(self, i: int) -> int:  # type: ignore[override]
        return i


class ThreadSafeItems(Items):
    thread_safe = True


@pytest.mark.parametrize(
    ("batch_size", "concurrency"),
    [(1, None), (64, None), (32, None), (100, None), (3, 10), (7, 100), (10, 1000)],
)
def test_default_window_keeps_concurrency_items_of_an_async_dataset_in_flight(
    batch_size: int, concurrency: int | None
) -> None:
    loader = DataLoader(AsyncItems(10), batch_size=batch_size, concurrency=concurrency)
    expected = max(16, 2 * math.ceil((concurrency or DEFAULT_CONCURRENCY) / batch_size))
    assert loader.window == expected


def test_default_window_without_auto_batching_counts_items() -> None:
    assert DataLoader(AsyncItems(10), batch_size=None, concurrency=100).window == 200


def test_default_window_uses_the_batch_samplers_batch_size() -> None:
    batch_sampler = BatchSampler(SequentialSampler(range(100)), 16, False)
    assert DataLoader(AsyncItems(100), batch_sampler=batch_sampler).window == 2 * 256 // 16


def test_default_window_where_concurrency_does_not_apply() -> None:
    # A stream and a sync dataset read one batch after another: 128 batches in flight at
    # batch size 4 would only hold memory; 16 let the loop run ahead of the consumer.
    assert DataLoader(Stream(10), batch_size=4).window == 16
    assert DataLoader(Items(10), batch_size=4).window == 16
    assert DataLoader(Items(10), batch_size=None).window == 16
    # A thread-safe sync dataset is read by up to 8 threads.
    assert DataLoader(ThreadSafeItems(10), batch_size=1).window == 16
    assert DataLoader(AsyncItems(10), batch_size=4).window == 128


# len()


@pytest.mark.parametrize(
    ("batch_size", "drop_last", "expected"),
    [(1, False, 10), (3, False, 4), (3, True, 3), (5, False, 2), (5, True, 2), (20, True, 0)],
)
def test_len_of_a_map_style_loader(batch_size: int, drop_last: bool, expected: int) -> None:
    loader = DataLoader(Items(10), batch_size=batch_size, drop_last=drop_last)
    assert len(loader) == expected == len(list(loader))


def test_len_without_auto_batching_is_the_samplers() -> None:
    assert len(DataLoader(Items(10), batch_size=None)) == 10
    assert len(DataLoader(Items(10), batch_size=None, sampler=range(0, 10, 3))) == 4


def test_len_with_a_custom_batch_sampler() -> None:
    loader = DataLoader(Items(6), batch_sampler=[[0, 1, 2], [3], [4, 5]])
    assert len(loader) == 3
    assert [b.tolist() for b in loader] == [[0, 1, 2], [3], [4, 5]]


@pytest.mark.parametrize(
    ("batch_size", "drop_last", "expected"),
    [(3, False, 4), (3, True, 3), (5, False, 2), (None, False, 10)],
)
def test_len_of_a_sized_iterable_dataset_is_torchs_estimate(
    batch_size: int | None, drop_last: bool, expected: int
) -> None:
    loader = DataLoader(SizedStream(10), batch_size=batch_size, drop_last=drop_last)
    assert len(loader) == expected == len(list(loader))


def test_len_of_an_unsized_iterable_dataset_raises() -> None:
    loader = DataLoader(Stream(4), batch_size=2)
    with pytest.raises(TypeError):
        len(loader)
    assert len(list(loader)) == 2


@pytest.mark.parametrize("batch_size", [2, None])
def test_len_with_an_unsized_sampler_raises(batch_size: int | None) -> None:
    loader = DataLoader(Items(4), batch_size=batch_size, sampler=UnsizedSampler(4))
    with pytest.raises(TypeError):
        len(loader)
    assert len(list(loader)) == (2 if batch_size else 4)


# The reference program


def assert_even_then_odd_batches(loader: DataLoader) -> None:
    batches = list(loader)
    assert len(batches) == len(loader) == 16
    first = batches[0]
    assert isinstance(first, list)
    assert len(first) == 2
    np.testing.assert_array_equal(first[0], [0, 2, 4, 6])
    np.testing.assert_array_equal(first[1], [0, 20, 40, 60])
    np.testing.assert_array_equal(batches[8][0], [1, 3, 5, 7])
    np.testing.assert_array_equal(batches[8][1], [10, 30, 50, 70])
    keys = [int(k) for data, _ in batches for k in data]
    assert keys == [*range(0, 64, 2), *range(1, 64, 2)]
    assert all(np.array_equal(labels, data * 10) for data, labels in batches)


def test_reference_program_with_a_batch_sampler() -> None:
    dataset = MyDataset()
    batch_sampler = EvenThenOddBatchSampler(dataset, batch_size=4, drop_last=False)
    loader = DataLoader(
        dataset,
        batch_sampler=batch_sampler,
        num_workers=0,
        collate_fn=None,
        pin_memory=False,
        drop_last=False,
    )
    assert_even_then_odd_batches(loader)
    assert batch_sampler.epochs == 1


def test_reference_program_with_a_sampler_and_batch_size() -> None:
    dataset = MyDataset()
    loader = DataLoader(dataset, batch_size=4, sampler=EvenThenOddSampler(dataset))
    assert_even_then_odd_batches(loader)
