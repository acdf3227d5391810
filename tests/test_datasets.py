"""Datasets: torch.utils.data semantics over numpy, sync and async, plain objects too."""

from __future__ import annotations

import asyncio
import inspect
import time
import warnings
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import numpy as np
import pytest

from aioload import (
    ArrayDataset,
    ChainDataset,
    ConcatDataset,
    DataLoader,
    Dataset,
    IterableDataset,
    StackDataset,
    Subset,
    TensorDataset,
    inspect_dataset,
    random_split,
)

# --- helpers: plain (not subclassed) datasets, sync and async ------------------------------


class Squares:
    """A plain map-style dataset: no base class."""

    def __init__(self, n: int, offset: int = 0) -> None:
        self.n = n
        self.offset = offset

    def __getitem__(self, i: int) -> int:
        return (i + self.offset) ** 2

    def __len__(self) -> int:
        return self.n


class AsyncSquares:
    """``async def __getitem__``: every item is a coroutine."""

    def __init__(self, n: int, offset: int = 0) -> None:
        self.n = n
        self.offset = offset

    async def __getitem__(self, i: int) -> int:
        await asyncio.sleep(0)
        return (i + self.offset) ** 2

    def __len__(self) -> int:
        return self.n


class BatchedAsyncSquares(Squares):
    """A sync ``__getitem__`` and an ``async def __getitems__`` that records its calls."""

    def __init__(self, n: int, offset: int = 0) -> None:
        super().__init__(n, offset)
        self.batches: list[list[int]] = []

    async def __getitems__(self, keys: list[int]) -> list[int]:
        await asyncio.sleep(0)
        self.batches.append(list(keys))
        return [self[k] for k in keys]


class BatchedSquares(Squares):
    """A sync ``__getitems__`` that records its calls."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.batches: list[list[int]] = []

    def __getitems__(self, keys: list[int]) -> list[int]:
        self.batches.append(list(keys))
        return [self[k] for k in keys]


class Unsized:
    def __getitem__(self, i: int) -> int:
        return i


class Stream:
    """A plain iterable-style dataset (``__iter__`` only)."""

    def __init__(self, n: int, start: int = 0) -> None:
        self.n = n
        self.start = start

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.start, self.start + self.n))

    def __len__(self) -> int:
        return self.n


class AsyncStream:
    """A plain async-only iterable dataset (``__aiter__`` only)."""

    def __init__(self, n: int, start: int = 0) -> None:
        self.n = n
        self.start = start

    async def __aiter__(self) -> AsyncIterator[int]:
        for i in range(self.start, self.start + self.n):
            await asyncio.sleep(0)
            yield i

    def __len__(self) -> int:
        return self.n


class CountTo(IterableDataset[int]):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.n))


class AsyncCountTo(IterableDataset[int]):
    def __init__(self, n: int) -> None:
        self.n = n

    async def __aiter__(self) -> AsyncIterator[int]:
        for i in range(self.n):
            await asyncio.sleep(0)
            yield i


class Letters(Dataset[str]):
    def __getitem__(self, i: int) -> str:
        return "abcdef"[i]

    def __len__(self) -> int:
        return 6


async def resolve(item: Any) -> Any:
    return await item if inspect.isawaitable(item) else item


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


async def drain(stream: Any) -> list[Any]:
    return [x async for x in stream]


def as_lists(batches: Any) -> list[Any]:
    """Batches with numpy leaves turned into lists, for comparing runs."""
    if isinstance(batches, np.ndarray):
        return batches.tolist()  # type: ignore[no-any-return]
    if isinstance(batches, dict):
        return [(k, as_lists(v)) for k, v in batches.items()]
    if isinstance(batches, list | tuple):
        return [as_lists(b) for b in batches]
    return batches  # type: ignore[no-any-return]


# --- Dataset / IterableDataset base classes ------------------------------------------------


def test_dataset_base_getitem_is_abstract() -> None:
    with pytest.raises(NotImplementedError, match="__getitem__"):
        Dataset()[0]


def test_dataset_add_gives_concat_dataset() -> None:
    both = Letters() + Letters()
    assert isinstance(both, ConcatDataset)
    assert len(both) == 12
    assert [both[i] for i in range(12)] == list("abcdef" * 2)


def test_dataset_add_accepts_a_plain_dataset() -> None:
    plain: Any = ["x", "y"]
    both = Letters() + plain
    assert isinstance(both, ConcatDataset)
    assert both[6] == "x" and both[-1] == "y"


def test_iterable_dataset_add_gives_chain_dataset() -> None:
    chain = CountTo(2) + CountTo(3)
    assert isinstance(chain, ChainDataset)
    assert list(chain) == [0, 1, 0, 1, 2]


def test_iterable_dataset_add_of_a_map_style_dataset_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="iterable datasets"):
        CountTo(2) + Letters()


# --- ArrayDataset / TensorDataset ----------------------------------------------------------


def test_tensor_dataset_is_array_dataset() -> None:
    assert TensorDataset is ArrayDataset


def test_array_dataset_item_is_a_tuple_of_rows() -> None:
    x = np.arange(12).reshape(4, 3)
    y = np.array([0, 1, 0, 1])
    ds = ArrayDataset(x, y)
    assert len(ds) == 4
    item = ds[2]
    assert isinstance(item, tuple) and len(item) == 2
    np.testing.assert_array_equal(item[0], [6, 7, 8])
    assert item[1] == 0
    assert ds.tensors is ds.arrays


def test_array_dataset_single_array_gives_one_tuples() -> None:
    ds = ArrayDataset(np.arange(3))
    assert ds[1] == (1,)


def test_array_dataset_first_dimension_mismatch() -> None:
    with pytest.raises(ValueError, match="Size mismatch between tensors"):
        ArrayDataset(np.zeros((3, 2)), np.zeros(4))


def test_array_dataset_mismatch_names_the_sizes() -> None:
    with pytest.raises(ValueError, match=r"\[3, 3, 5\]"):
        ArrayDataset(np.zeros(3), np.zeros((3, 7)), np.zeros(5))


def test_array_dataset_needs_an_array() -> None:
    with pytest.raises(ValueError, match="at least one array"):
        ArrayDataset()


def test_array_dataset_rejects_a_0d_array() -> None:
    with pytest.raises(ValueError, match="at least one dimension"):
        ArrayDataset(np.array(3))


def test_array_dataset_rejects_a_non_array() -> None:
    with pytest.raises(TypeError, match=r"shape or a length.*int"):
        ArrayDataset(3)


@pytest.mark.parametrize(
    "arrays",
    [
        (np.arange(20).reshape(5, 4), np.arange(5) * 1.5),
        (np.arange(5), ["a", "b", "c", "d", "e"]),
        ([[1, 2], [3], [4, 5, 6], [], [7]], np.arange(5)),  # ragged: not one numpy array
    ],
    ids=["numpy", "list-of-str", "ragged-list"],
)
def test_array_dataset_getitems_equals_per_key_reads(arrays: tuple[Any, ...]) -> None:
    ds = ArrayDataset(*arrays)
    keys = [4, 0, 2, 2, -1]
    batched = ds.__getitems__(keys)
    single = [ds[k] for k in keys]
    assert len(batched) == len(single)
    for got, want in zip(batched, single, strict=True):
        assert isinstance(got, tuple) and len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert type(g) is type(w)
            np.testing.assert_array_equal(g, w)


def test_array_dataset_getitems_of_no_keys() -> None:
    assert ArrayDataset(np.arange(3)).__getitems__([]) == []


def test_array_dataset_through_the_loader() -> None:
    x = np.arange(10).reshape(5, 2)
    y = np.arange(5)
    batches = list(DataLoader(ArrayDataset(x, y), batch_size=2))
    assert [b[1].tolist() for b in batches] == [[0, 1], [2, 3], [4]]
    np.testing.assert_array_equal(batches[0][0], x[:2])


def test_array_dataset_of_strings_through_the_loader() -> None:
    # As in torch, strings transposed out of tuple samples stay a tuple of str.
    batches = list(DataLoader(ArrayDataset(["a", "b", "c"]), batch_size=2))
    assert batches == [[("a", "b")], [("c",)]]
    assert all(type(s) is str for batch in batches for s in batch[0])


# --- StackDataset -------------------------------------------------------------------------


def test_stack_dataset_tuple_mode() -> None:
    images, labels = [10, 11, 12], [0, 1, 0]
    ds = StackDataset(images, labels)
    assert len(ds) == 3
    assert ds[1] == (11, 1)
    assert ds.datasets == (images, labels)


def test_stack_dataset_dict_mode() -> None:
    images, texts = Squares(4), ["a", "b", "c", "d"]
    ds = StackDataset(image=images, text=texts)
    assert ds[2] == {"image": 4, "text": "c"}
    assert list(ds[0]) == ["image", "text"]
    assert ds.datasets == {"image": images, "text": texts}


def test_stack_dataset_matches_members_like_torch_example() -> None:
    images, texts = Squares(5), Letters()
    texts5: Subset[str] = Subset(texts, range(5))
    tuple_stack = StackDataset(images, texts5)
    dict_stack = StackDataset(image=images, text=texts5)
    for i in range(5):
        assert tuple_stack[i] == (images[i], texts5[i])
        assert dict_stack[i] == {"image": images[i], "text": texts5[i]}


def test_stack_dataset_both_args_and_kwargs() -> None:
    with pytest.raises(ValueError, match="both types are given"):
        StackDataset([1], label=[2])


def test_stack_dataset_nothing_given() -> None:
    with pytest.raises(ValueError, match="At least one dataset should be passed"):
        StackDataset()


@pytest.mark.parametrize("as_kwargs", [False, True])
def test_stack_dataset_length_mismatch(as_kwargs: bool) -> None:
    with pytest.raises(ValueError, match="Size mismatch between datasets"):
        if as_kwargs:
            StackDataset(a=[1, 2, 3], b=[1, 2])
        else:
            StackDataset([1, 2, 3], [1, 2])


def test_stack_dataset_rejects_an_iterable_member() -> None:
    with pytest.raises(TypeError, match=r"map-style.*Stream"):
        StackDataset([1, 2], Stream(2))


def test_stack_dataset_rejects_an_unsized_member() -> None:
    with pytest.raises(TypeError, match=r"length.*Unsized"):
        StackDataset([1, 2], Unsized())


def test_stack_dataset_over_async_members_tuple() -> None:
    ds = StackDataset(AsyncSquares(4), ["a", "b", "c", "d"])
    item = ds[3]
    assert inspect.isawaitable(item)
    assert run(resolve(item)) == (9, "d")
    assert inspect_dataset(ds).is_async


def test_stack_dataset_over_async_members_dict() -> None:
    ds = StackDataset(x=AsyncSquares(4), y=AsyncSquares(4, offset=1))
    assert run(resolve(ds[1])) == {"x": 1, "y": 4}


def test_stack_dataset_over_sync_members_is_not_awaitable() -> None:
    ds = StackDataset(Squares(3), Squares(3))
    assert ds[2] == (4, 4)
    assert not inspect_dataset(ds).is_async


# --- ConcatDataset ------------------------------------------------------------------------


def test_concat_dataset_cumulative_sizes_and_indexing() -> None:
    ds: ConcatDataset[Any] = ConcatDataset([[0, 1], [2, 3, 4], [], [5]])
    assert ds.cumulative_sizes == [2, 5, 5, 6]
    assert ConcatDataset.cumsum([[0], [1, 2]]) == [1, 3]
    assert len(ds) == 6
    assert [ds[i] for i in range(6)] == [0, 1, 2, 3, 4, 5]


def test_concat_dataset_negative_indices() -> None:
    ds: ConcatDataset[Any] = ConcatDataset([[0, 1], [2, 3, 4]])
    assert [ds[-i] for i in range(1, 6)] == [4, 3, 2, 1, 0]


def test_concat_dataset_negative_index_beyond_length() -> None:
    ds: ConcatDataset[Any] = ConcatDataset([[0, 1], [2, 3, 4]])
    with pytest.raises(
        ValueError, match="absolute value of index should not exceed dataset length"
    ):
        ds[-6]


def test_concat_dataset_index_out_of_range() -> None:
    ds: ConcatDataset[Any] = ConcatDataset([[0, 1], [2, 3, 4]])
    with pytest.raises(IndexError, match="5"):
        ds[5]


def test_concat_dataset_accepts_any_iterable_of_datasets() -> None:
    ds: ConcatDataset[Any] = ConcatDataset(iter([Squares(2), Squares(2, offset=2)]))
    assert [ds[i] for i in range(4)] == [0, 1, 4, 9]
    assert isinstance(ds.datasets, list)


def test_concat_dataset_empty() -> None:
    with pytest.raises(ValueError, match="datasets should not be an empty iterable"):
        ConcatDataset([])


@pytest.mark.parametrize("member", [CountTo(3), Stream(3), AsyncStream(3)], ids=type)
def test_concat_dataset_rejects_iterable_members(member: Any) -> None:
    with pytest.raises(TypeError, match=r"ConcatDataset does not support IterableDataset.*Chain"):
        ConcatDataset([[1, 2], member])


def test_concat_dataset_rejects_a_member_without_len() -> None:
    with pytest.raises(TypeError, match="Unsized has no __len__"):
        ConcatDataset([[1, 2], Unsized()])


def test_concat_dataset_items_awaitable_exactly_when_member_is_async() -> None:
    ds: ConcatDataset[Any] = ConcatDataset([Squares(3), AsyncSquares(2, offset=3)])
    assert inspect_dataset(ds).is_async
    sync_items = [ds[i] for i in range(3)]
    assert sync_items == [0, 1, 4]
    async_items = [ds[i] for i in (3, 4, -1)]
    assert all(inspect.isawaitable(item) for item in async_items)

    async def gather() -> list[Any]:
        return list(await asyncio.gather(*async_items))

    assert run(gather()) == [9, 16, 16]


def test_concat_dataset_of_sync_members_is_sync() -> None:
    assert not inspect_dataset(ConcatDataset([Squares(2), [1, 2]])).is_async


def test_concat_dataset_nested_async() -> None:
    inner: ConcatDataset[Any] = ConcatDataset([AsyncSquares(2)])
    outer: ConcatDataset[Any] = ConcatDataset([Squares(1), inner])
    assert inspect_dataset(outer).is_async
    assert run(resolve(outer[2])) == 1


# --- ChainDataset -------------------------------------------------------------------------


def test_chain_dataset_sync() -> None:
    chain = ChainDataset([CountTo(2), Stream(2, start=5), range(3)])
    assert list(chain) == [0, 1, 5, 6, 0, 1, 2]
    assert list(chain) == [0, 1, 5, 6, 0, 1, 2]  # re-iterable
    assert not inspect_dataset(chain).is_async
    assert inspect_dataset(chain).iterable


def test_chain_dataset_async_for_mixes_sync_and_async() -> None:
    chain = ChainDataset([CountTo(2), AsyncStream(2, start=10), Stream(1, start=20)])
    assert inspect_dataset(chain).is_async
    assert run(drain(chain)) == [0, 1, 10, 11, 20]


def test_chain_dataset_async_for_over_sync_members() -> None:
    assert run(drain(ChainDataset([range(2), Stream(2, start=2)]))) == [0, 1, 2, 3]


def test_chain_dataset_sync_iteration_of_async_member() -> None:
    chain = ChainDataset([Stream(2), AsyncStream(2)])
    iterator = iter(chain)
    assert [next(iterator), next(iterator)] == [0, 1]  # members before it are read first
    with pytest.raises(TypeError, match=r"AsyncStream is async-only.*async for"):
        next(iterator)


def test_chain_dataset_len() -> None:
    assert len(ChainDataset([Stream(2), AsyncStream(3), range(4)])) == 9


def test_chain_dataset_len_of_an_unsized_member() -> None:
    with pytest.raises(TypeError, match="CountTo has no __len__"):
        len(ChainDataset([Stream(2), CountTo(3)]))


def test_chain_dataset_rejects_a_non_iterable_member() -> None:
    with pytest.raises(TypeError, match=r"ChainDataset only supports IterableDataset.* got int"):
        ChainDataset([Stream(2), 3])


def test_a_dataset_of_the_wrong_kind_is_the_assertion_error_torch_raises() -> None:
    # torch checks both with assert: an except AssertionError written for it still catches them.
    with pytest.raises(AssertionError, match="ConcatDataset does not support IterableDataset"):
        ConcatDataset([[1, 2], Stream(3)])
    with pytest.raises(AssertionError, match="ChainDataset only supports IterableDataset"):
        ChainDataset([Stream(2), ArrayDataset(np.arange(3))])


def test_chain_dataset_nested_async_is_async() -> None:
    inner = ChainDataset([AsyncCountTo(2)])
    outer = ChainDataset([Stream(1), inner])
    assert inspect_dataset(outer).is_async
    assert run(drain(outer)) == [0, 0, 1]


def test_empty_chain_dataset() -> None:
    chain = ChainDataset([])
    assert list(chain) == [] and len(chain) == 0


# --- Subset -------------------------------------------------------------------------------


def test_subset_indexing_and_len() -> None:
    sub: Subset[Any] = Subset(["a", "b", "c", "d"], [3, 0])
    assert len(sub) == 2
    assert [sub[0], sub[1], sub[-1]] == ["d", "a", "a"]


def test_subset_list_index_forwards_to_the_parent() -> None:
    seen: list[Any] = []

    class ListIndexed:
        def __getitem__(self, idx: Any) -> Any:
            seen.append(idx)
            return idx

        def __len__(self) -> int:
            return 10

    assert Subset(ListIndexed(), [5, 6, 7])[[2, 0]] == [7, 5]
    assert seen == [[7, 5]]


def test_subset_getitems_forwards_to_a_parent_with_getitems() -> None:
    parent = BatchedSquares(10)
    sub: Subset[Any] = Subset(parent, [9, 8, 7, 1])
    assert sub.__getitems__([0, 3]) == [81, 1]
    assert parent.batches == [[9, 1]]


def test_subset_getitems_without_parent_getitems() -> None:
    assert Subset(Squares(10), [9, 3]).__getitems__([1, 0]) == [9, 81]


def test_subset_of_async_getitem_parent() -> None:
    sub: Subset[Any] = Subset(AsyncSquares(10), [4, 5])
    assert inspect_dataset(sub).is_async
    assert run(resolve(sub[1])) == 25
    items = sub.__getitems__([0, 1])
    assert all(inspect.isawaitable(x) for x in items)

    async def gather() -> list[Any]:
        return list(await asyncio.gather(*items))

    assert run(gather()) == [16, 25]


def test_subset_of_async_getitems_parent() -> None:
    parent = BatchedAsyncSquares(10)
    sub: Subset[Any] = Subset(parent, [4, 5, 6])
    protocol = inspect_dataset(sub)
    assert protocol.is_async and protocol.batched
    assert run(resolve(sub.__getitems__([2, 0]))) == [36, 16]
    assert parent.batches == [[6, 4]]


def test_subset_of_subset() -> None:
    sub: Subset[Any] = Subset(Subset(list(range(10)), [9, 8, 7, 6]), [3, 0])
    assert [sub[0], sub[1]] == [6, 9]
    assert not inspect_dataset(sub).is_async


# --- inspect_dataset: plain objects, async protocols ---------------------------------------


def test_inspect_a_list() -> None:
    protocol = inspect_dataset([1, 2, 3])
    assert not protocol.iterable and not protocol.is_async and not protocol.batched


def test_inspect_plain_map_style_class() -> None:
    protocol = inspect_dataset(Squares(3))
    assert (protocol.iterable, protocol.is_async, protocol.batched) == (False, False, False)


def test_inspect_plain_iter_only_class() -> None:
    protocol = inspect_dataset(Stream(3))
    assert protocol.iterable and not protocol.is_async


def test_inspect_plain_aiter_only_class() -> None:
    protocol = inspect_dataset(AsyncStream(3))
    assert protocol.iterable and protocol.is_async


def test_inspect_iterable_dataset_subclasses() -> None:
    assert inspect_dataset(CountTo(2)).iterable
    assert not inspect_dataset(CountTo(2)).is_async
    assert inspect_dataset(AsyncCountTo(2)).is_async


def test_inspect_async_getitem() -> None:
    protocol = inspect_dataset(AsyncSquares(3))
    assert not protocol.iterable and protocol.is_async and not protocol.batched


def test_inspect_async_getitems() -> None:
    protocol = inspect_dataset(BatchedAsyncSquares(3))
    assert not protocol.iterable and protocol.is_async and protocol.batched


def test_inspect_sync_getitems() -> None:
    protocol = inspect_dataset(BatchedSquares(3))
    assert protocol.batched and not protocol.is_async


def test_inspect_thread_safe_flag() -> None:
    class Safe(Squares):
        thread_safe = True

    assert inspect_dataset(Safe(2)).thread_safe
    assert not inspect_dataset(Squares(2)).thread_safe


def test_inspect_wrappers_over_async_members() -> None:
    assert inspect_dataset(ConcatDataset([Squares(2), AsyncSquares(2)])).is_async
    assert inspect_dataset(StackDataset(Squares(2), AsyncSquares(2))).is_async
    assert inspect_dataset(StackDataset(a=Subset(AsyncSquares(4), [0, 1]), b=[1, 2])).is_async
    assert inspect_dataset(Subset(AsyncSquares(2), [1])).is_async


def test_inspect_not_a_dataset() -> None:
    with pytest.raises(TypeError, match=r"int is not a dataset.*__getitem__.*__iter__"):
        inspect_dataset(3)


def test_map_style_wins_over_iter_for_plain_objects() -> None:
    # A list has both __getitem__ and __iter__: it is map-style, as in torch.
    assert not inspect_dataset(list(range(3))).iterable


# --- random_split -------------------------------------------------------------------------


def split_lengths(splits: list[Subset[Any]]) -> list[int]:
    return [len(s) for s in splits]


def test_random_split_integer_lengths() -> None:
    splits = random_split(range(10), [3, 7], generator=42)
    assert split_lengths(splits) == [3, 7]
    assert all(isinstance(s, Subset) for s in splits)


def test_random_split_reference_fractions() -> None:
    assert split_lengths(random_split(range(30), [0.3, 0.3, 0.4], generator=42)) == [9, 9, 12]


def test_random_split_remainder_round_robin() -> None:
    # floor(3.3), floor(3.3), floor(3.4) = 3, 3, 3; the one left over goes to split 0.
    assert split_lengths(random_split(range(10), [0.33, 0.33, 0.34], generator=0)) == [4, 3, 3]
    # floor(1.4) * 5 = 5; 2 left over go to splits 0 and 1.
    assert split_lengths(random_split(range(7), [0.2] * 5, generator=0)) == [2, 2, 1, 1, 1]


@pytest.mark.parametrize(("n", "fractions"), [(30, [0.3, 0.3, 0.4]), (101, [0.5, 0.25, 0.25])])
def test_random_split_is_a_partition(n: int, fractions: list[float]) -> None:
    splits = random_split(range(n), fractions, generator=7)
    seen = [split[i] for split in splits for i in range(len(split))]
    assert sorted(seen) == list(range(n))


def test_random_split_items_come_from_the_dataset() -> None:
    data = [f"item{i}" for i in range(20)]
    splits = random_split(data, [5, 15], generator=1)
    assert all(split.dataset is data for split in splits)
    assert sorted(s[i] for s in splits for i in range(len(s))) == sorted(data)


def test_random_split_same_seed_same_split() -> None:
    a = random_split(range(30), [0.3, 0.3, 0.4], generator=42)
    b = random_split(range(30), [0.3, 0.3, 0.4], generator=42)
    assert [list(s.indices) for s in a] == [list(s.indices) for s in b]


def test_random_split_different_seeds_different_splits() -> None:
    a = random_split(range(30), [0.5, 0.5], generator=1)
    b = random_split(range(30), [0.5, 0.5], generator=2)
    assert [list(s.indices) for s in a] != [list(s.indices) for s in b]


def test_random_split_accepts_a_numpy_generator() -> None:
    a = random_split(range(30), [10, 20], generator=np.random.default_rng(5))
    b = random_split(range(30), [10, 20], generator=np.random.default_rng(5))
    c = random_split(range(30), [10, 20], generator=5)
    assert [list(s.indices) for s in a] == [list(s.indices) for s in b]
    assert [list(s.indices) for s in a] == [list(s.indices) for s in c]


def test_random_split_without_generator_is_random() -> None:
    a = random_split(range(50), [25, 25])
    b = random_split(range(50), [25, 25])
    assert [list(s.indices) for s in a] != [list(s.indices) for s in b]


def test_random_split_accepts_tuples_and_numpy_lengths() -> None:
    assert split_lengths(random_split(range(10), (4, 6), generator=0)) == [4, 6]
    assert split_lengths(random_split(range(10), np.array([4, 6]), generator=0)) == [4, 6]  # type: ignore[arg-type]
    assert split_lengths(random_split(range(10), np.array([0.5, 0.5]), generator=0)) == [5, 5]  # type: ignore[arg-type]


def test_random_split_of_an_async_dataset() -> None:
    first, second = random_split(AsyncSquares(6), [0.5, 0.5], generator=0)
    assert inspect_dataset(first).is_async
    values = sorted(run(resolve(s[i])) for s in (first, second) for i in range(3))
    assert values == [i * i for i in range(6)]


def test_random_split_zero_length_split_warns() -> None:
    with pytest.warns(UserWarning, match="Length of split at index 2 is 0"):
        splits = random_split(range(3), [0.5, 0.5, 0.0], generator=0)
    assert split_lengths(splits) == [2, 1, 0]


def test_random_split_integer_zero_length_does_not_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        splits = random_split(range(5), [0, 5], generator=0)
    assert split_lengths(splits) == [0, 5]


def test_random_split_lengths_do_not_add_up() -> None:
    with pytest.raises(ValueError, match="Sum of input lengths does not equal the length"):
        random_split(range(10), [3, 6])


def test_random_split_fractions_do_not_sum_to_one() -> None:
    with pytest.raises(ValueError, match="fractions summing to 1"):
        random_split(range(10), [0.5, 0.6])


def test_random_split_fraction_out_of_range() -> None:
    with pytest.raises(ValueError, match="Fraction at index 1 is not between 0 and 1"):
        random_split(range(10), [0.5, 1.5, -1.0])


def test_random_split_negative_lengths() -> None:
    with pytest.raises(ValueError, match="must not be negative"):
        random_split(range(10), [-1, 11])


def test_random_split_empty_lengths() -> None:
    with pytest.raises(ValueError, match="must not be empty"):
        random_split(range(10), [])


@pytest.mark.parametrize("lengths", ["ab", 10, None])
def test_random_split_lengths_not_a_sequence(lengths: Any) -> None:
    with pytest.raises(TypeError, match="lengths must be a sequence"):
        random_split(range(10), lengths)


def test_random_split_mixed_or_non_numeric_lengths() -> None:
    with pytest.raises(TypeError, match="all ints or all fractions"):
        random_split(range(10), [True, 9])


def test_random_split_bad_generator_type() -> None:
    with pytest.raises(TypeError, match=r"generator should be None, a numpy.random.Generator"):
        random_split(range(10), [5, 5], generator="seed")  # type: ignore[arg-type]


def test_random_split_negative_seed() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        random_split(range(10), [5, 5], generator=-1)


# --- through the loader (Fetcher): for and async for give the same batches -----------------


async def collect(loader: DataLoader) -> list[Any]:
    return [batch async for batch in loader]


MAP_DATASETS: dict[str, Callable[[], Any]] = {
    "sync": lambda: Squares(11),
    "async-getitem": lambda: AsyncSquares(11),
    "async-getitems": lambda: BatchedAsyncSquares(11),
    "sync-getitems": lambda: BatchedSquares(11),
    "list": lambda: [i * i for i in range(11)],
    "concat-sync-async": lambda: ConcatDataset([Squares(4), AsyncSquares(7, offset=4)]),
    "concat-async-sync": lambda: ConcatDataset([AsyncSquares(4), Squares(7, offset=4)]),
    "subset-async": lambda: Subset(BatchedAsyncSquares(20), list(range(11))),
}


@pytest.mark.parametrize("name", list(MAP_DATASETS))
def test_loader_for_gives_the_documented_batches(name: str) -> None:
    batches = list(DataLoader(MAP_DATASETS[name](), batch_size=4))
    assert as_lists(batches) == [[0, 1, 4, 9], [16, 25, 36, 49], [64, 81, 100]]


@pytest.mark.asyncio
@pytest.mark.parametrize("name", list(MAP_DATASETS))
async def test_loader_async_for_gives_the_same_batches(name: str) -> None:
    batches = await collect(DataLoader(MAP_DATASETS[name](), batch_size=4))
    assert as_lists(batches) == [[0, 1, 4, 9], [16, 25, 36, 49], [64, 81, 100]]


def test_loader_uses_getitems_of_an_async_dataset() -> None:
    dataset = BatchedAsyncSquares(6)
    list(DataLoader(dataset, batch_size=4))
    assert dataset.batches == [[0, 1, 2, 3], [4, 5]]


@pytest.mark.parametrize("mode", ["tuple", "dict"])
def test_loader_over_async_stack_dataset(mode: str) -> None:
    if mode == "tuple":
        dataset: StackDataset = StackDataset(AsyncSquares(5), Squares(5, offset=1))
        expected: Any = [[[0, 1, 4], [1, 4, 9]], [[9, 16], [16, 25]]]
    else:
        dataset = StackDataset(x=AsyncSquares(5), y=Squares(5, offset=1))
        expected = [[("x", [0, 1, 4]), ("y", [1, 4, 9])], [("x", [9, 16]), ("y", [16, 25])]]
    loader = DataLoader(dataset, batch_size=3)
    assert as_lists(list(loader)) == expected
    assert as_lists(run(collect(loader))) == expected


def test_loader_shuffled_async_concat_matches_sync_with_same_seed() -> None:
    sync = DataLoader(Squares(12), batch_size=5, shuffle=True, generator=3)
    mixed = DataLoader(
        ConcatDataset([AsyncSquares(6), Squares(6, offset=6)]),
        batch_size=5,
        shuffle=True,
        generator=3,
    )
    assert as_lists(list(sync)) == as_lists(list(mixed))


ITERABLE_DATASETS: dict[str, Callable[[], Any]] = {
    "sync": lambda: Stream(7),
    "async": lambda: AsyncStream(7),
    "chain-sync": lambda: ChainDataset([Stream(3), range(3, 7)]),
    "chain-mixed": lambda: CountTo(3) + AsyncStream(4, start=3),
}


@pytest.mark.parametrize("name", list(ITERABLE_DATASETS))
def test_loader_over_iterable_datasets_for_and_async_for(name: str) -> None:
    loader = DataLoader(ITERABLE_DATASETS[name](), batch_size=3)
    expected = [[0, 1, 2], [3, 4, 5], [6]]
    assert as_lists(list(loader)) == expected
    assert as_lists(run(collect(loader))) == expected


def test_loader_over_a_sync_iterable_dataset_does_not_block_the_loop() -> None:
    # A sync chain is read in a thread under `async for`, so other tasks keep running.
    ticks = 0

    class Slow:
        def __iter__(self) -> Iterator[int]:
            for i in range(3):
                time.sleep(0.08)
                yield i

    async def ticker(stop: asyncio.Event) -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            await asyncio.sleep(0.005)

    async def main() -> list[Any]:
        stop = asyncio.Event()
        task = asyncio.create_task(ticker(stop))
        try:
            return await collect(DataLoader(ChainDataset([Slow()]), batch_size=None))
        finally:
            stop.set()
            await task

    assert as_lists(run(main())) == [0, 1, 2]
    assert ticks >= 10


# --- StackDataset.__getitems__ ------------------------------------------------------------


class ShortBatches(Squares):
    """A ``__getitems__`` that drops the last key: a broken batched read."""

    def __getitems__(self, keys: list[int]) -> list[int]:
        return [self[k] for k in keys[:-1]]


def test_stack_dataset_getitems_tuple_mode_uses_members_batched_reads() -> None:
    batched = BatchedSquares(5)
    ds = StackDataset(batched, ["a", "b", "c", "d", "e"])
    assert ds.__getitems__([4, 0, 2]) == [(16, "e"), (0, "a"), (4, "c")]
    assert batched.batches == [[4, 0, 2]]


def test_stack_dataset_getitems_dict_mode() -> None:
    batched = BatchedSquares(4)
    ds = StackDataset(image=batched, label=[0, 1, 0, 1])
    out = ds.__getitems__([3, 1])
    assert out == [{"image": 9, "label": 1}, {"image": 1, "label": 1}]
    assert [list(sample) for sample in out] == [["image", "label"]] * 2
    assert batched.batches == [[3, 1]]


def test_stack_dataset_getitems_of_no_keys() -> None:
    assert StackDataset(BatchedSquares(3), [1, 2, 3]).__getitems__([]) == []


@pytest.mark.parametrize("as_kwargs", [False, True])
def test_stack_dataset_getitems_rejects_a_member_batch_of_the_wrong_length(
    as_kwargs: bool,
) -> None:
    members = [ShortBatches(4), [0, 1, 2, 3]]
    ds = StackDataset(a=members[0], b=members[1]) if as_kwargs else StackDataset(*members)
    with pytest.raises(ValueError, match=r"output size mismatch\. Expected 3, got 2"):
        ds.__getitems__([0, 1, 2])


@pytest.mark.parametrize("batched", [False, True])
def test_stack_dataset_getitems_index_out_of_range_is_an_index_error(batched: bool) -> None:
    first: Any = ArrayDataset(np.arange(3)) if batched else [0, 1, 2]
    with pytest.raises(IndexError):
        StackDataset(first, [5, 6, 7]).__getitems__([0, 3])


def test_stack_dataset_getitems_over_async_members() -> None:
    parent = BatchedAsyncSquares(4)
    ds = StackDataset(x=parent, y=AsyncSquares(4), z=Subset(AsyncSquares(4), [3, 2, 1, 0]))
    out = ds.__getitems__([2, 0])
    assert inspect.isawaitable(out)
    assert run(out) == [{"x": 4, "y": 4, "z": 1}, {"x": 0, "y": 0, "z": 9}]
    assert parent.batches == [[2, 0]]


def test_stack_dataset_getitems_over_async_members_checks_the_length() -> None:
    class AsyncShort(BatchedAsyncSquares):
        async def __getitems__(self, keys: list[int]) -> list[int]:
            return [self[k] for k in keys[:1]]

    with pytest.raises(ValueError, match="Expected 2, got 1"):
        run(StackDataset(AsyncShort(3), [1, 2, 3]).__getitems__([0, 1]))


def test_stack_dataset_is_read_by_the_loader_one_batched_call_per_member() -> None:
    batched = BatchedSquares(5)
    loader = DataLoader(StackDataset(batched, np.arange(5) * 10), batch_size=2)
    assert as_lists(list(loader)) == [[[0, 1], [0, 10]], [[4, 9], [20, 30]], [[16], [40]]]
    assert batched.batches == [[0, 1], [2, 3], [4]]


def test_stack_dataset_getitems_matches_torch() -> None:
    torch_data = pytest.importorskip("torch.utils.data")
    for as_kwargs in (False, True):
        members: list[Any] = [BatchedSquares(4), ["a", "b", "c", "d"]]

        def build(cls: Any, members: list[Any] = members, as_kwargs: bool = as_kwargs) -> Any:
            return cls(p=members[0], q=members[1]) if as_kwargs else cls(*members)

        ours, theirs = build(StackDataset), build(torch_data.StackDataset)
        assert ours.__getitems__([3, 0, 3]) == theirs.__getitems__([3, 0, 3])
    for bad, keys, error in [
        ([ShortBatches(4), [0, 1, 2, 3]], [0, 1], ValueError),
        ([[0, 1, 2], [0, 1, 2]], [1, 5], IndexError),
    ]:
        with pytest.raises(error) as theirs_info:
            torch_data.StackDataset(*bad).__getitems__(keys)
        with pytest.raises(error) as ours_info:
            StackDataset(*bad).__getitems__(keys)
        assert type(ours_info.value) is type(theirs_info.value)


# --- subclasses that override __getitem__ ------------------------------------------------


class DoubledSubset(Subset[int]):
    def __getitem__(self, idx: Any) -> int:
        return 2 * int(self.dataset[self.indices[idx]])


class DoubledSubsetWithGetitems(DoubledSubset):
    def __getitems__(self, indices: list[int]) -> list[int]:
        return [self[i] for i in indices]


class ParentOnlySubset(Subset[int]):
    def __getitems__(self, indices: list[int]) -> list[int]:
        return [-1 for _ in indices]


def test_subset_subclass_overriding_only_getitem_is_refused_at_construction() -> None:
    with pytest.raises(NotImplementedError, match=r"DoubledSubset overrides __getitem__") as info:
        DoubledSubset([1, 2, 3], [1, 2])
    assert "def __getitems__(self, indices):" in str(info.value)


def test_subset_subclass_overriding_both_is_read_through_its_own_methods() -> None:
    sub = DoubledSubsetWithGetitems([1, 2, 3], [1, 2])
    assert sub[0] == 4
    assert as_lists(list(DataLoader(sub, batch_size=2, num_workers=0))) == [[4, 6]]
    assert as_lists(list(DataLoader(sub, batch_size=None))) == [4, 6]
    assert ParentOnlySubset([1, 2, 3], [0]).__getitems__([0]) == [-1]


def test_subset_subclass_refusal_matches_torch() -> None:
    torch_data = pytest.importorskip("torch.utils.data")

    def shapes(base: type) -> list[type]:
        def getitem(self: Any, idx: Any) -> Any:
            return 0

        def getitems(self: Any, indices: Any) -> Any:
            return [0 for _ in indices]

        return [
            type("OnlyGetitem", (base,), {"__getitem__": getitem}),
            type("Both", (base,), {"__getitem__": getitem, "__getitems__": getitems}),
            type("OnlyGetitems", (base,), {"__getitems__": getitems}),
            type("Neither", (base,), {}),
        ]

    def outcome(cls: type) -> str:
        try:
            cls([1, 2], [0])
        except NotImplementedError:
            return "refused"
        return "accepted"

    ours = [outcome(cls) for cls in shapes(Subset)]
    assert ours == [outcome(cls) for cls in shapes(torch_data.Subset)]
    assert ours == ["refused", "accepted", "accepted", "accepted"]


class TimesTen(ArrayDataset):
    def __getitem__(self, index: Any) -> tuple[Any, ...]:
        return tuple(10 * array[index] for array in self.arrays)


class AsyncTimesTen(ArrayDataset):
    async def __getitem__(self, index: Any) -> tuple[Any, ...]:
        await asyncio.sleep(0)
        return tuple(10 * array[index] for array in self.arrays)


class TimesTenBatched(TimesTen):
    """Overrides both, reusing the batched read: the rows are transformed once."""

    def __getitems__(self, indices: Any) -> list[tuple[Any, ...]]:
        return [tuple(10 * x for x in row) for row in ArrayDataset.__getitems__(self, indices)]


@pytest.mark.parametrize("cls", [TimesTen, AsyncTimesTen, TimesTenBatched])
def test_array_dataset_subclass_overriding_getitem_is_honoured_by_the_loader(cls: type) -> None:
    ds = cls(np.arange(5), np.arange(5) + 1)
    loader = DataLoader(ds, batch_size=2, num_workers=0)
    assert as_lists(list(loader)) == [[[0, 10], [10, 20]], [[20, 30], [30, 40]], [[40], [50]]]


def test_tensor_dataset_subclass_overriding_getitem_matches_torch() -> None:
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader as TorchLoader
    from torch.utils.data import TensorDataset as TorchTensorDataset

    def shifted(base: type) -> type:
        def getitem(self: Any, index: Any) -> Any:
            return tuple(t[index] + 100 for t in self.tensors)

        return type("Shifted", (base,), {"__getitem__": getitem})

    theirs = [b[0].tolist() for b in TorchLoader(shifted(TorchTensorDataset)(torch.arange(5)), 2)]
    ours = [b[0].tolist() for b in DataLoader(shifted(TensorDataset)(np.arange(5)), 2)]
    assert ours == theirs == [[100, 101], [102, 103], [104]]


def test_stack_dataset_subclass_overriding_getitem_is_honoured() -> None:
    class Flipped(StackDataset[tuple[Any, ...]]):
        def __getitem__(self, index: Any) -> tuple[Any, ...]:
            return tuple(reversed(super().__getitem__(index)))

    ds = Flipped(BatchedSquares(3), ["a", "b", "c"])
    assert ds.__getitems__([2, 0]) == [("c", 4), ("a", 0)]
    assert as_lists(list(DataLoader(ds, batch_size=3))) == [[["a", "b", "c"], [0, 1, 4]]]


# (A Subset subclass is left out: the loader decides whether a Subset is async from its parent.)
@pytest.mark.parametrize(
    ("base", "args"), [(ConcatDataset, ([[7, 8, 9]],)), (StackDataset, ([7, 8, 9],))]
)
def test_a_wrapper_subclass_with_an_async_getitem_is_read_as_async(
    base: type, args: tuple[Any, ...]
) -> None:
    class Awaited(base):  # type: ignore[valid-type,misc]
        async def __getitem__(self, index: Any) -> Any:
            await asyncio.sleep(0)
            return index + 100

        def __getitems__(self, indices: list[int]) -> list[Any]:
            return [self[i] for i in indices]

    ds = Awaited(*args)
    assert inspect_dataset(ds).is_async
    assert as_lists(list(DataLoader(ds, batch_size=2))) == [[100, 101], [102]]
