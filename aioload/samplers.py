"""Samplers: which keys to load, in what order, in what batches.

The classes follow ``torch.utils.data``'s samplers argument for argument, with numpy's
:class:`numpy.random.Generator` in place of ``torch.Generator``. Every ``generator`` argument
accepts ``None`` (fresh OS entropy on each ``__iter__``, so every epoch is reshuffled), a
:class:`numpy.random.Generator` (advanced by each ``__iter__``: epochs differ, yet the whole
sequence of epochs is reproducible) or an ``int`` seed (turned into a Generator once, at
construction). Randomness never comes from numpy's global state.

Any iterable of keys is a sampler, and so is any *async* iterable of keys (an object with
``__aiter__``, such as an async generator); :func:`is_async_sampler` tells them apart.
:class:`BatchSampler` batches either kind: over an async sampler it is itself async-iterable
only. Its constructor picks the right class (``BatchSampler`` or its private async subclass)
so that ``__aiter__`` exists exactly when the inner sampler is async, and a plain ``hasattr``
/ :func:`is_async_sampler` check is all a consumer needs.

Keys from the built-in samplers are plain Python ``int``\\ s. Invalid arguments raise the
exception type and message torch raises where torch checks the argument; arguments torch does
not check raise ``TypeError`` for a wrong type and ``ValueError`` for a wrong value.
"""

from __future__ import annotations

import math
import os
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator, Sequence, Sized
from itertools import chain, islice
from typing import Any, Generic, TypeAlias, TypeGuard, TypeVar, cast

import numpy as np
import numpy.typing as npt

__all__ = [
    "BatchSampler",
    "DistributedSampler",
    "GeneratorLike",
    "RandomSampler",
    "Sampler",
    "SequentialSampler",
    "SubsetRandomSampler",
    "WeightedRandomSampler",
    "is_async_sampler",
]

T_co = TypeVar("T_co", covariant=True)

GeneratorLike: TypeAlias = np.random.Generator | int | None
"""What a ``generator`` argument accepts: ``None``, a numpy ``Generator`` or an ``int`` seed."""

# Keys drawn with replacement are produced lazily in chunks, so that a huge ``num_samples``
# (an "infinite" sampler) costs no memory up front and an early ``break`` wastes little work.
_CHUNK = 1024


def is_async_sampler(obj: object) -> TypeGuard[AsyncIterable[Any]]:
    """Return ``True`` if ``obj`` is an async sampler, i.e. its type defines ``__aiter__``.

    Objects with only ``__iter__`` (every torch-style sampler) are sync samplers.

    Example:
        >>> async def keys():
        ...     yield 0
        >>> is_async_sampler(keys()), is_async_sampler(range(3))
        (True, False)
    """
    return isinstance(obj, AsyncIterable)


class Sampler(Generic[T_co]):
    """Base class for all samplers.

    A subclass provides ``__iter__`` yielding keys (or lists of keys, for a batch sampler) and
    may provide ``__len__``. Subclassing is optional: any iterable with the same methods works.
    An async sampler provides ``__aiter__`` instead.

    Args:
        data_source: ignored; accepted for compatibility with older torch code.

    Example:
        >>> class EvenThenOdd(Sampler[int]):
        ...     def __init__(self, n: int) -> None:
        ...         self.n = n
        ...     def __len__(self) -> int:
        ...         return self.n
        ...     def __iter__(self) -> Iterator[int]:
        ...         yield from range(0, self.n, 2)
        ...         yield from range(1, self.n, 2)
        >>> list(EvenThenOdd(5))
        [0, 2, 4, 1, 3]
    """

    # No default ``__len__``: ``list(sampler)`` and friends must be able to tell an unsized
    # sampler from a sized one (see torch's note on abstract base classes and ``__len__``).

    def __init__(self, data_source: Sized | None = None) -> None:
        pass

    def __iter__(self) -> Iterator[T_co]:
        raise NotImplementedError


class SequentialSampler(Sampler[int]):
    """Yield ``0, 1, ..., len(data_source) - 1``, always in that order.

    Args:
        data_source: the dataset (anything with ``__len__``) to sample from.

    Example:
        >>> list(SequentialSampler(range(4)))
        [0, 1, 2, 3]
    """

    def __init__(self, data_source: Sized) -> None:
        self.data_source = data_source

    def __iter__(self) -> Iterator[int]:
        return iter(range(len(self.data_source)))

    def __len__(self) -> int:
        return len(self.data_source)


class RandomSampler(Sampler[int]):
    """Yield the indices of ``data_source`` in random order.

    Without replacement each epoch is a random permutation; a ``num_samples`` larger than the
    dataset yields whole permutations followed by a partial one. With replacement,
    ``num_samples`` indices are drawn independently and uniformly.

    Args:
        data_source: the dataset (anything with ``__len__``) to sample from.
        replacement: draw with replacement if ``True``. Default: ``False``.
        num_samples: number of indices per epoch. Default: ``len(data_source)``, read at each
            epoch since the dataset may change size.
        generator: ``None``, a ``numpy.random.Generator`` or an ``int`` seed.

    Example:
        >>> sorted(RandomSampler(range(5), generator=0))
        [0, 1, 2, 3, 4]
        >>> len(list(RandomSampler(range(5), replacement=True, num_samples=12)))
        12
    """

    def __init__(
        self,
        data_source: Sized,
        replacement: bool = False,
        num_samples: int | None = None,
        generator: GeneratorLike = None,
    ) -> None:
        if not isinstance(replacement, bool):
            raise TypeError(
                f"replacement should be a boolean value, but got replacement={replacement!r}"
            )
        self.data_source = data_source
        self.replacement = replacement
        self._num_samples = None if num_samples is None else _check_num_samples(num_samples)
        self.generator = _as_generator(generator)
        if len(data_source) == 0:
            # torch reports an empty data_source as num_samples=0 when num_samples is unset.
            raise ValueError(
                "num_samples should be a positive integer value, but got num_samples=0 "
                "(data_source is empty)"
                if num_samples is None
                else f"cannot draw num_samples={num_samples} indices from an empty data_source"
            )

    @property
    def num_samples(self) -> int:
        """Number of indices per epoch."""
        if self._num_samples is None:
            return len(self.data_source)
        return self._num_samples

    def __iter__(self) -> Iterator[int]:
        return chain.from_iterable(self._blocks())

    def _blocks(self) -> Iterator[list[int]]:
        n = len(self.data_source)
        rng = _rng(self.generator)
        count = self.num_samples
        if self.replacement:
            for start in range(0, count, _CHUNK):
                yield rng.integers(n, size=min(_CHUNK, count - start)).tolist()
            return
        for _ in range(count // n):
            yield rng.permutation(n).tolist()
        if count % n:
            yield rng.choice(n, size=count % n, replace=False).tolist()

    def __len__(self) -> int:
        return self.num_samples


class SubsetRandomSampler(Sampler[int]):
    """Yield the elements of ``indices`` in random order, without replacement.

    Args:
        indices: a sequence of keys (list, tuple, range or 1-D numpy array).
        generator: ``None``, a ``numpy.random.Generator`` or an ``int`` seed.

    Example:
        >>> sorted(SubsetRandomSampler([10, 20, 30], generator=0))
        [10, 20, 30]
    """

    def __init__(
        self, indices: Sequence[int] | npt.NDArray[Any], generator: GeneratorLike = None
    ) -> None:
        if not (hasattr(indices, "__len__") and hasattr(indices, "__getitem__")) or isinstance(
            indices, str | bytes | dict
        ):
            raise TypeError(
                "indices should be a sequence of indices (list, tuple, range or 1-D numpy "
                f"array), but got {type(indices).__name__}"
            )
        if isinstance(indices, np.ndarray) and indices.ndim != 1:
            raise ValueError(
                f"indices should be a 1-D sequence, but got an array of shape {indices.shape}"
            )
        self.indices = indices
        self.generator = _as_generator(generator)

    def __iter__(self) -> Iterator[int]:
        order = _rng(self.generator).permutation(len(self.indices))
        if isinstance(self.indices, np.ndarray):
            return iter(self.indices[order].tolist())
        return map(self.indices.__getitem__, order.tolist())

    def __len__(self) -> int:
        return len(self.indices)


class WeightedRandomSampler(Sampler[int]):
    """Yield indices ``0..len(weights)-1`` drawn with probability proportional to ``weights``.

    Args:
        weights: a 1-D sequence of non-negative, finite weights, not all zero; they need not
            sum to one.
        num_samples: number of indices per epoch.
        replacement: if ``True`` (default) indices are drawn independently; if ``False`` each
            index is drawn at most once, so ``num_samples`` may not exceed the number of
            non-zero weights.
        generator: ``None``, a ``numpy.random.Generator`` or an ``int`` seed.

    Example:
        >>> keys = list(WeightedRandomSampler([0.0, 1.0, 3.0], 100, generator=0))
        >>> len(keys), 0 in keys
        (100, False)
        >>> sorted(WeightedRandomSampler([0.1, 0.9, 0.4, 0.0], 3, replacement=False))
        [0, 1, 2]
    """

    weights: npt.NDArray[np.float64]

    def __init__(
        self,
        weights: Sequence[float] | npt.NDArray[Any],
        num_samples: int,
        replacement: bool = True,
        generator: GeneratorLike = None,
    ) -> None:
        num_samples = _check_num_samples(num_samples)
        if not isinstance(replacement, bool):
            raise ValueError(
                f"replacement should be a boolean value, but got replacement={replacement!r}"
            )
        try:
            w = np.asarray(weights, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"weights should be a 1d sequence of numbers, but got {type(weights).__name__}"
            ) from exc
        if w.ndim != 1:
            raise ValueError(
                f"weights should be a 1d sequence but given weights have shape {w.shape}"
            )
        if w.size == 0:
            raise ValueError("weights should be a non-empty sequence, but got no weights")
        if not np.isfinite(w).all():
            raise ValueError("weights should all be finite, but got inf or nan")
        if (w < 0).any():
            raise ValueError(f"weights should all be non-negative, but got {w.min()}")
        nonzero = int(np.count_nonzero(w))
        if nonzero == 0:
            raise ValueError("weights should have at least one positive weight, but all are 0")
        if not replacement and num_samples > nonzero:
            raise ValueError(
                f"num_samples={num_samples} exceeds the {nonzero} non-zero weights; without "
                "replacement num_samples should be at most the number of non-zero weights"
            )
        self.weights = w
        self.num_samples = num_samples
        self.replacement = replacement
        self.generator = _as_generator(generator)
        self._cdf = np.cumsum(w)
        self._nonzero = np.flatnonzero(w)

    def __iter__(self) -> Iterator[int]:
        return chain.from_iterable(self._blocks())

    def _blocks(self) -> Iterator[list[int]]:
        rng = _rng(self.generator)
        count = self.num_samples
        if not self.replacement:
            # Successive sampling without replacement (Efraimidis-Spirakis): the k smallest
            # Exp(1)/w keys, in increasing order, are the first k draws.
            keys = rng.standard_exponential(self._nonzero.size) / self.weights[self._nonzero]
            first = np.argpartition(keys, count - 1)[:count]
            yield self._nonzero[first[np.argsort(keys[first])]].tolist()
            return
        total = self._cdf[-1]
        last = self._nonzero[-1]  # rounding may push u * total onto the end of the cdf
        for start in range(0, count, _CHUNK):
            u = rng.random(min(_CHUNK, count - start)) * total
            yield np.minimum(np.searchsorted(self._cdf, u, side="right"), last).tolist()

    def __len__(self) -> int:
        return self.num_samples


class BatchSampler(Sampler[list[int]]):
    """Wrap a sampler to yield lists of ``batch_size`` keys.

    The inner sampler may be sync (any iterable) or async (anything with ``__aiter__``). Over an
    async sampler the batch sampler is async-iterable only (``async for``), and
    :func:`is_async_sampler` is ``True`` for it; ``len()`` works when the inner sampler has
    ``__len__``.

    Args:
        sampler: the sampler (iterable or async iterable of keys) to batch.
        batch_size: size of each batch.
        drop_last: if ``True``, drop the last batch when it is smaller than ``batch_size``.

    Example:
        >>> list(BatchSampler(SequentialSampler(range(10)), batch_size=3, drop_last=False))
        [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
        >>> list(BatchSampler(SequentialSampler(range(10)), batch_size=3, drop_last=True))
        [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    """

    sampler: Iterable[int] | AsyncIterable[int]

    def __new__(cls, *args: Any, **kwargs: Any) -> BatchSampler:
        # Pick the async class when the inner sampler is async, so that ``__aiter__`` exists
        # exactly when it works. Unpickling calls ``__new__`` with no arguments, hence ``get``.
        sampler = args[0] if args else kwargs.get("sampler")
        if cls is BatchSampler and is_async_sampler(sampler):
            cls = _AsyncBatchSampler
        return super().__new__(cls)

    def __init__(
        self,
        sampler: Sampler[int] | Iterable[int] | AsyncIterable[int],
        batch_size: int,
        drop_last: bool,
    ) -> None:
        # Iterables defined through ``__getitem__`` alone are not ``Iterable`` instances.
        if not isinstance(sampler, Iterable | AsyncIterable) and not hasattr(
            type(sampler), "__getitem__"
        ):
            raise TypeError(
                "sampler should be an iterable or async iterable of keys, but got "
                f"{type(sampler).__name__}"
            )
        if (
            not isinstance(batch_size, int | np.integer)
            or isinstance(batch_size, bool)
            or batch_size <= 0
        ):
            raise ValueError(
                f"batch_size should be a positive integer value, but got batch_size={batch_size!r}"
            )
        if not isinstance(drop_last, bool):
            raise ValueError(
                f"drop_last should be a boolean value, but got drop_last={drop_last!r}"
            )
        self.sampler = sampler
        self.batch_size = int(batch_size)
        self.drop_last = drop_last

    def __iter__(self) -> Iterator[list[int]]:
        size = self.batch_size
        it = iter(cast(Iterable[int], self.sampler))
        # zip over one iterator repeated, and islice, fill each batch in C.
        if self.drop_last:
            return map(list, zip(*[it] * size, strict=False))
        return self._islice_batches(it, size)

    @staticmethod
    def _islice_batches(it: Iterator[int], size: int) -> Iterator[list[int]]:
        batch = [*islice(it, size)]
        while batch:
            yield batch
            batch = [*islice(it, size)]

    def __len__(self) -> int:
        n = len(cast(Sized, self.sampler))
        if self.drop_last:
            return n // self.batch_size
        return (n + self.batch_size - 1) // self.batch_size


class _AsyncBatchSampler(BatchSampler):
    """A :class:`BatchSampler` over an async sampler; ``BatchSampler(...)`` builds it."""

    def __iter__(self) -> Iterator[list[int]]:
        raise TypeError(
            "this BatchSampler wraps an async sampler and is async-iterable only: use "
            "`async for batch in batch_sampler`"
        )

    async def __aiter__(self) -> AsyncIterator[list[int]]:
        size = self.batch_size
        batch: list[int] = []
        async for key in cast(AsyncIterable[int], self.sampler):
            batch.append(key)
            if len(batch) == size:
                yield batch
                batch = []
        if batch and not self.drop_last:
            yield batch


class DistributedSampler(Sampler[int]):
    """Restrict sampling to the share of the dataset that belongs to one replica (rank).

    Each of ``num_replicas`` replicas gets an equal number of indices; together they cover the
    dataset. Without ``drop_last`` the index list is padded by repeating indices from its start
    until it divides evenly; with ``drop_last`` its tail is dropped instead. With ``shuffle``
    the order is a permutation seeded by ``seed + epoch``: identical on every replica, and
    different each epoch once :meth:`set_epoch` is called before each epoch.

    Args:
        dataset: the dataset (anything with ``__len__``), of constant size.
        num_replicas: number of replicas. Default: the ``WORLD_SIZE`` environment variable
            (as set by ``torchrun``).
        rank: this replica's rank in ``[0, num_replicas - 1]``. Default: the ``RANK``
            environment variable.
        shuffle: shuffle the indices. Default: ``True``.
        seed: shuffling seed, the same on every replica. Default: ``0``.
        drop_last: drop the tail instead of padding. Default: ``False``.

    Example:
        >>> [list(DistributedSampler(range(5), 2, r, shuffle=False)) for r in (0, 1)]
        [[0, 2, 4], [1, 3, 0]]
        >>> sampler = DistributedSampler(range(5), num_replicas=2, rank=0)
        >>> for epoch in range(3):
        ...     sampler.set_epoch(epoch)
        ...     keys = list(sampler)
    """

    def __init__(
        self,
        dataset: Sized,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        num_replicas = _from_env("num_replicas", num_replicas, "WORLD_SIZE")
        rank = _from_env("rank", rank, "RANK")
        if num_replicas <= 0:
            raise ValueError(
                f"num_replicas should be a positive integer value, but got "
                f"num_replicas={num_replicas}"
            )
        if rank >= num_replicas or rank < 0:
            raise ValueError(
                f"Invalid rank {rank}, rank should be in the interval [0, {num_replicas - 1}]"
            )
        if not isinstance(shuffle, bool):
            raise TypeError(f"shuffle should be a boolean value, but got shuffle={shuffle!r}")
        if not isinstance(drop_last, bool):
            raise TypeError(f"drop_last should be a boolean value, but got drop_last={drop_last!r}")
        self.dataset = dataset
        self.num_replicas = num_replicas
        self.rank = rank
        self.shuffle = shuffle
        self.seed = _non_negative_int("seed", seed)
        self.drop_last = drop_last
        self.epoch = 0
        n = len(dataset)
        if drop_last:
            self.num_samples = n // num_replicas
        else:
            self.num_samples = math.ceil(n / num_replicas)
        self.total_size = self.num_samples * num_replicas

    def __iter__(self) -> Iterator[int]:
        n = len(self.dataset)
        if self.shuffle:
            indices = np.random.default_rng(self.seed + self.epoch).permutation(n)
        else:
            indices = np.arange(n)
        # ``np.resize`` repeats the array cyclically (padding) or cuts it (drop_last).
        indices = np.resize(indices, self.total_size)
        return iter(indices[self.rank :: self.num_replicas].tolist())

    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch, which seeds the shuffle together with ``seed``.

        Call it at the start of every epoch, before iterating, on every replica; otherwise
        each epoch repeats the same order.

        Args:
            epoch: the epoch number, a non-negative integer.
        """
        self.epoch = _non_negative_int("epoch", epoch)


def _as_generator(generator: object) -> np.random.Generator | None:
    if generator is None or isinstance(generator, np.random.Generator):
        return generator
    if isinstance(generator, int | np.integer) and not isinstance(generator, bool):
        if generator < 0:
            raise ValueError(f"generator seed should be a non-negative integer, got {generator}")
        return np.random.default_rng(int(generator))
    raise TypeError(
        "generator should be None, a numpy.random.Generator or an int seed, but got "
        f"{type(generator).__name__}"
    )


def _rng(generator: np.random.Generator | None) -> np.random.Generator:
    # Without a generator every epoch gets fresh OS entropy, as torch draws a fresh seed.
    return np.random.default_rng() if generator is None else generator


def _check_num_samples(num_samples: object) -> int:
    if (
        not isinstance(num_samples, int | np.integer)
        or isinstance(num_samples, bool)
        or num_samples <= 0
    ):
        raise ValueError(
            f"num_samples should be a positive integer value, but got num_samples={num_samples!r}"
        )
    return int(num_samples)


def _non_negative_int(name: str, value: object) -> int:
    if not isinstance(value, int | np.integer) or isinstance(value, bool):
        raise TypeError(f"{name} should be an integer, but got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} should be a non-negative integer, but got {name}={value}")
    return int(value)


def _from_env(name: str, value: object, variable: str) -> int:
    if value is None:
        text = os.environ.get(variable)
        if text is None:
            raise ValueError(
                f"{name} was not given and the {variable} environment variable is not set; "
                f"pass {name}= explicitly or set {variable} (torchrun sets it)"
            )
        try:
            return int(text)
        except ValueError:
            raise ValueError(
                f"the {variable} environment variable should be an integer, but got {text!r}"
            ) from None
    if not isinstance(value, int | np.integer) or isinstance(value, bool):
        raise TypeError(f"{name} should be an integer, but got {type(value).__name__}")
    return int(value)
