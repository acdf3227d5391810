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

Checkpoint and resume: every built-in sampler has ``state_dict()`` and
``load_state_dict(state)``. A state is a small JSON-serialisable dict taken between iterations
or in the middle of one. A sampler built with the same arguments and given that state yields,
on its next ``iter()``, exactly the keys the interrupted iteration had not yet yielded, and the
iterations after that repeat the original's, reshuffles included. For that a state holds the
generator state from the *start* of the interrupted iteration and how many keys it had
yielded: resuming redraws the iteration in bulk, as numpy arrays, and drops those keys by
slicing, never one by one (except in a :class:`BatchSampler` over a sampler that is not built
in: see there). Every state has ``"type"`` (the sampler class), ``"version"``,
``"in_progress"`` (an iteration was started and its iterator not yet exhausted) and a count
(``"yielded"`` keys, or ``"batches"`` for :class:`BatchSampler`). The count of an in-progress
state may be lowered before loading, to resume after fewer items of the same iteration: a
loader that has drawn keys ahead of those it delivered rewinds this way. A state describes the
sampler's latest iteration. Loading one sets the state of the sampler's ``Generator``, the very
object given as ``generator``; a sampler without a generator reshuffles from fresh entropy
after the resumed iteration, as it always does.

Keys from the built-in samplers are plain Python ``int``\\ s. Invalid arguments raise the
exception type and message torch raises where torch checks the argument; arguments torch does
not check raise ``TypeError`` for a wrong type and ``ValueError`` for a wrong value.
"""

from __future__ import annotations

import math
import os
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
    Sized,
)
from itertools import chain, islice
from operator import length_hint
from typing import Any, ClassVar, Generic, TypeAlias, TypeGuard, TypeVar, cast

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

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

GeneratorLike: TypeAlias = np.random.Generator | int | None
"""What a ``generator`` argument accepts: ``None``, a numpy ``Generator`` or an ``int`` seed."""

# Keys drawn with replacement are produced lazily in chunks, so that a huge ``num_samples``
# (an "infinite" sampler) costs no memory up front and an early ``break`` wastes little work.
_CHUNK = 1024

# Bumped when the layout of a ``state_dict()`` changes, so an old state is refused clearly.
_STATE_VERSION = 1
# The numpy bit generators whose state a sampler state may carry.
_BIT_GENERATORS = ("MT19937", "PCG64", "PCG64DXSM", "Philox", "SFC64")


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


class _Iteration:
    """One iteration of a sampler: what regenerates it, how far it got, whether it ended.

    ``start`` is what the sampler needs to replay the iteration from its beginning (a
    generator state, an epoch, an inner sampler's state); ``rng`` is the generator drawing
    it, once the sampler has it at hand. Keys pass through :meth:`track`,
    which chains blocks of keys in C and reads the position off the current block iterator's
    length hint, so that counting costs nothing per key; batches pass through :meth:`count`.
    """

    def __init__(self, start: Any, count: int = 0) -> None:
        self.start = start
        self.rng: np.random.Generator | None = None
        self.finished = False
        # (items in finished blocks, length of the current block, its iterator), replaced as a
        # whole so that a reader on another thread never sees half an update.
        self._cursor: tuple[int, int, Iterator[Any] | None] = (count, 0, None)

    @property
    def position(self) -> int:
        """How many items this iteration has yielded (counting any skipped on resume)."""
        done, size, block = self._cursor
        return done if block is None else done + size - length_hint(block)

    def track(self, blocks: Iterable[Sequence[T]]) -> Iterator[T]:
        """Chain ``blocks`` (lists or ranges) into one iterator, keeping :attr:`position`."""
        return chain.from_iterable(self._tracked(blocks))

    def _tracked(self, blocks: Iterable[Sequence[T]]) -> Iterator[Iterator[T]]:
        for block in blocks:
            done, size, _ = self._cursor
            keys = iter(block)
            # ``chain`` asks for the next block only once the previous one is used up.
            self._cursor = (done + size, len(block), keys)
            yield keys
        self._cursor = (self.position, 0, None)
        self.finished = True

    def count(self, items: Iterable[T]) -> Iterator[T]:
        """Yield ``items``, adding one to :attr:`position` per item."""
        position = self.position
        for item in items:
            position += 1
            self._cursor = (position, 0, None)
            yield item
        self.finished = True

    async def acount(self, items: AsyncIterable[T]) -> AsyncIterator[T]:
        """:meth:`count` for an async iterable."""
        position = self.position
        async for item in items:
            position += 1
            self._cursor = (position, 0, None)
            yield item
        self.finished = True

    def __getstate__(self) -> dict[str, Any]:
        # A pickled sampler carries the count, not the live iterator of the current block.
        return {
            "start": self.start,
            "rng": self.rng,
            "finished": self.finished,
            "_cursor": (self.position, 0, None),
        }


class _Resumable(Sampler[int]):
    """Base of the built-in key samplers: tracks iterations; ``state_dict``/``load_state_dict``.

    A subclass says what starts an iteration (:meth:`_begin`), how to yield its keys after
    skipping those already yielded (:meth:`_keys`), and which fields of its own a state holds
    (:meth:`_state_fields`, :meth:`_load_fields`).
    """

    _state_type: ClassVar[str]
    _iteration: _Iteration | None = None  # the latest iteration
    _resume: _Iteration | None = None  # loaded by ``load_state_dict``, run by the next iter()

    def __iter__(self) -> Iterator[int]:
        iteration = self._resume if self._resume is not None else self._begin()
        self._resume = None
        self._iteration = iteration
        return self._keys(iteration)

    def __len__(self) -> int:  # every subclass is sized; a state's count is checked against it
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """Return this sampler's position as a small JSON-serialisable dict.

        Taken between iterations, the state restores what the next iteration will be; taken
        during one (after some keys of ``iter(sampler)`` were consumed), it also holds how many
        keys that iteration has yielded, and the next ``iter()`` of a sampler that loads it
        yields the rest of that iteration. Fields: ``"type"``, ``"version"``,
        ``"in_progress"``, ``"yielded"`` (``0`` between iterations) and the sampler's own
        (see its class docstring). An iteration stays in progress until its iterator is
        exhausted: after its last key, a resumed ``iter()`` yields nothing.

        Example:
            >>> import json
            >>> sampler = RandomSampler(range(6), generator=0)
            >>> keys = iter(sampler)
            >>> first = [next(keys), next(keys)]
            >>> state = json.loads(json.dumps(sampler.state_dict()))
            >>> state["in_progress"], state["yielded"]
            (True, 2)
            >>> resumed = RandomSampler(range(6), generator=0)
            >>> resumed.load_state_dict(state)
            >>> list(resumed) == list(keys)
            True
        """
        iteration = self._resume if self._resume is not None else self._iteration
        if iteration is not None and iteration.finished:
            iteration = None
        return {
            "type": self._state_type,
            "version": _STATE_VERSION,
            "in_progress": iteration is not None,
            "yielded": 0 if iteration is None else iteration.position,
            **self._state_fields(iteration),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a state from :meth:`state_dict` of a sampler built with the same arguments.

        If the state was taken during an iteration, the next ``iter()`` yields the rest of it
        (its first keys are skipped by slicing, at no per-key cost); the iterations after that
        are those the original sampler would have run.

        Args:
            state: the dict :meth:`state_dict` returned, possibly through JSON.

        Raises:
            ValueError: ``state`` comes from another sampler class or version, misses a field,
                has a field of the wrong type, or does not fit this sampler (more keys yielded
                than an iteration has, a generator state where there is no generator).

        Example:
            >>> sampler = SequentialSampler(range(5))
            >>> sampler.load_state_dict(
            ...     {"type": "SequentialSampler", "version": 1, "in_progress": True, "yielded": 3}
            ... )
            >>> list(sampler), list(sampler)
            ([3, 4], [0, 1, 2, 3, 4])
        """
        in_progress, yielded = _check_header(state, self._state_type, "yielded")
        if in_progress and yielded > len(self):
            raise ValueError(
                f"{self._state_type} state has yielded={yielded}, more than the {len(self)} "
                "keys an iteration of this sampler has: was it built with the same arguments?"
            )
        start = self._load_fields(state, in_progress)
        self._iteration = None
        self._resume = _Iteration(start, yielded) if in_progress else None

    def _begin(self) -> _Iteration:
        """A new iteration, with what replays it from its beginning."""
        return _Iteration(None)

    def _keys(self, iteration: _Iteration) -> Iterator[int]:
        """The keys of ``iteration`` (started or resumed) after the first ``position``."""
        raise NotImplementedError

    def _state_fields(self, iteration: _Iteration | None) -> dict[str, Any]:
        """The fields of a state beyond the common ones (``iteration``: the one in progress)."""
        return {}

    def _load_fields(self, state: Mapping[str, Any], in_progress: bool) -> Any:
        """Check and apply this sampler's own fields; return the resumed iteration's start."""
        return None


class _Shuffling(_Resumable):
    """A :class:`_Resumable` whose keys come from a numpy ``generator``.

    An iteration starts from the generator's bit-generator state, which a state carries as
    ``"generator"``: the state at the start of the iteration in progress, or the current one
    between iterations (``None`` for a sampler without a generator).
    """

    generator: np.random.Generator | None

    def _begin(self) -> _Iteration:
        rng = _rng(self.generator)
        iteration = _Iteration(rng.bit_generator.state)
        iteration.rng = rng
        return iteration

    def _rng_of(self, iteration: _Iteration) -> np.random.Generator:
        """The generator to draw ``iteration`` with; a resumed one is set back to its start."""
        if iteration.rng is None:
            start = iteration.start
            rng = self.generator
            if rng is None:
                rng = np.random.Generator(getattr(np.random, start["bit_generator"])())
            rng.bit_generator.state = start
            iteration.rng = rng
        return iteration.rng

    def _state_fields(self, iteration: _Iteration | None) -> dict[str, Any]:
        if iteration is not None:
            generator = iteration.start
        elif self.generator is not None:
            generator = self.generator.bit_generator.state
        else:
            generator = None
        return {"generator": _plain(generator)}

    def _load_fields(self, state: Mapping[str, Any], in_progress: bool) -> Any:
        generator = _field(state, self._state_type, "generator", dict, optional=True)
        if generator is None:
            if in_progress:
                raise ValueError(
                    f"{self._state_type} state is in progress but has generator=None: an "
                    "iteration in progress needs the generator state it started from"
                )
            if self.generator is not None:
                raise ValueError(
                    f"{self._state_type} state has generator=None (its sampler had no "
                    "generator), but this sampler has one: build it with the same arguments"
                )
            return None
        _check_generator_state(generator, self._state_type, self.generator)
        if not in_progress:
            if self.generator is None:
                raise ValueError(
                    f"{self._state_type} state has a generator state, but this sampler has "
                    "generator=None: build it with the same arguments"
                )
            self.generator.bit_generator.state = generator
        return generator


class SequentialSampler(_Resumable):
    """Yield ``0, 1, ..., len(data_source) - 1``, always in that order.

    Its state (see :meth:`state_dict`) holds only the common fields.

    Args:
        data_source: the dataset (anything with ``__len__``) to sample from.

    Example:
        >>> list(SequentialSampler(range(4)))
        [0, 1, 2, 3]
    """

    _state_type = "SequentialSampler"

    def __init__(self, data_source: Sized) -> None:
        self.data_source = data_source

    def _keys(self, iteration: _Iteration) -> Iterator[int]:
        return iteration.track([range(iteration.position, len(self.data_source))])

    def __len__(self) -> int:
        return len(self.data_source)


class RandomSampler(_Shuffling):
    """Yield the indices of ``data_source`` in random order.

    Without replacement each epoch is a random permutation; a ``num_samples`` larger than the
    dataset yields whole permutations followed by a partial one. With replacement,
    ``num_samples`` indices are drawn independently and uniformly.

    Its state (see :meth:`state_dict`) adds ``"generator"``, a bit-generator state. Resuming
    in the middle of an iteration redraws it from its start, in bulk, and skips what was
    yielded.

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

    _state_type = "RandomSampler"

    def _keys(self, iteration: _Iteration) -> Iterator[int]:
        return iteration.track(self._blocks(self._rng_of(iteration), iteration.position))

    def _blocks(self, rng: np.random.Generator, skip: int) -> Iterator[list[int]]:
        # Blocks are drawn exactly as in an uninterrupted iteration, so that the generator
        # ends where it would have; those wholly skipped are drawn but not turned into lists.
        n = len(self.data_source)
        count = self.num_samples
        if self.replacement:
            for first in range(0, count, _CHUNK):
                block = rng.integers(n, size=min(_CHUNK, count - first))
                yield _after(block, first, skip)
            return
        for first in range(0, count - count % n, n):
            yield _after(rng.permutation(n), first, skip)
        if count % n:
            yield _after(rng.choice(n, size=count % n, replace=False), count - count % n, skip)

    def __len__(self) -> int:
        return self.num_samples


class SubsetRandomSampler(_Shuffling):
    """Yield the elements of ``indices`` in random order, without replacement.

    Its state (see :meth:`state_dict`) adds ``"generator"``, a bit-generator state.

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

    _state_type = "SubsetRandomSampler"

    def _keys(self, iteration: _Iteration) -> Iterator[int]:
        order = self._rng_of(iteration).permutation(len(self.indices))[iteration.position :]
        if isinstance(self.indices, np.ndarray):
            return iteration.track([self.indices[order].tolist()])
        # ``map`` takes one position at a time, so the count of positions is that of keys.
        return map(self.indices.__getitem__, iteration.track([order.tolist()]))

    def __len__(self) -> int:
        return len(self.indices)


class WeightedRandomSampler(_Shuffling):
    """Yield indices ``0..len(weights)-1`` drawn with probability proportional to ``weights``.

    Its state (see :meth:`state_dict`) adds ``"generator"``, a bit-generator state. Resuming
    in the middle of an iteration redraws it from its start, in bulk, and skips what was
    yielded.

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

    _state_type = "WeightedRandomSampler"

    def _keys(self, iteration: _Iteration) -> Iterator[int]:
        return iteration.track(self._blocks(self._rng_of(iteration), iteration.position))

    def _blocks(self, rng: np.random.Generator, skip: int) -> Iterator[list[int]]:
        count = self.num_samples
        if not self.replacement:
            # Successive sampling without replacement (Efraimidis-Spirakis): the k smallest
            # Exp(1)/w keys, in increasing order, are the first k draws.
            keys = rng.standard_exponential(self._nonzero.size) / self.weights[self._nonzero]
            first = np.argpartition(keys, count - 1)[:count]
            yield _after(self._nonzero[first[np.argsort(keys[first])]], 0, skip)
            return
        total = self._cdf[-1]
        last = self._nonzero[-1]  # rounding may push u * total onto the end of the cdf
        # As in RandomSampler, skipped chunks are still drawn, so the generator ends in place.
        for offset in range(0, count, _CHUNK):
            u = rng.random(min(_CHUNK, count - offset))
            if offset + u.size <= skip:
                continue
            u = u[max(skip - offset, 0) :] * total
            yield np.minimum(np.searchsorted(self._cdf, u, side="right"), last).tolist()

    def __len__(self) -> int:
        return self.num_samples


class BatchSampler(Sampler[list[int]]):
    """Wrap a sampler to yield lists of ``batch_size`` keys.

    The inner sampler may be sync (any iterable) or async (anything with ``__aiter__``). Over an
    async sampler the batch sampler is async-iterable only (``async for``), and
    :func:`is_async_sampler` is ``True`` for it; ``len()`` works when the inner sampler has
    ``__len__``.

    Checkpoints: its state (see :meth:`state_dict`) holds ``"batches"``, the number of batches
    the iteration in progress has yielded, and ``"sampler"``, the inner sampler's state (or
    ``None`` for an inner sampler without ``state_dict``). Resuming after ``k`` batches skips
    ``k * batch_size`` keys of the inner sampler: by slicing for a built-in sampler, by
    loading the inner state from the start of the iteration and then drawing and dropping
    that many keys for another sampler with ``state_dict``, and by drawing and dropping them
    alone for a sampler without one (which must then yield the same keys on every pass). The
    last two cost O(keys skipped).

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
    _iteration: _Iteration | None = None  # the latest iteration; ``start``: the inner state
    _resume: _Iteration | None = None  # loaded by ``load_state_dict``, run by the next iter()

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
        iteration, it, skip = self._open(lambda: iter(cast(Iterable[int], self.sampler)))
        if skip:
            next(islice(it, skip, skip), None)  # drops ``skip`` keys, in C
        # zip over one iterator repeated, and islice, fill each batch in C.
        if self.drop_last:
            return iteration.count(map(list, zip(*[it] * size, strict=False)))
        return iteration.count(self._islice_batches(it, size))

    def _open(self, open_keys: Callable[[], T]) -> tuple[_Iteration, T, int]:
        """Start an iteration: the iteration, the inner keys and how many of them to drop."""
        inner = self.sampler
        iteration = self._resume
        self._resume = None
        if iteration is not None:
            # ``load_state_dict`` already moved a built-in inner sampler to the right key.
            keys = open_keys()
            skip = 0 if isinstance(inner, _Resumable) else iteration.position * self.batch_size
        elif isinstance(inner, _Resumable):
            # Taken after iter(): the state of the iteration just started, whose count
            # ``load_state_dict`` sets; its generator state is there even with generator=None.
            keys = open_keys()
            iteration, skip = _Iteration(inner.state_dict()), 0
        else:
            start = cast(Any, inner).state_dict() if _stateful(inner) else None
            keys = open_keys()
            iteration, skip = _Iteration(start), 0
        self._iteration = iteration
        return iteration, keys, skip

    def state_dict(self) -> dict[str, Any]:
        """Return this batch sampler's position as a small JSON-serialisable dict.

        Fields: ``"type"`` (``"BatchSampler"``), ``"version"``, ``"in_progress"``,
        ``"batches"`` (batches the iteration in progress has yielded, ``0`` between
        iterations) and ``"sampler"``: during an iteration the inner sampler's state from its
        start, between iterations its current state (``None`` if it has no ``state_dict``).

        Example:
            >>> import json
            >>> batches = BatchSampler(RandomSampler(range(10), generator=0), 3, False)
            >>> it = iter(batches)
            >>> first = next(it)
            >>> state = json.loads(json.dumps(batches.state_dict()))
            >>> state["batches"], state["sampler"]["type"]
            (1, 'RandomSampler')
            >>> resumed = BatchSampler(RandomSampler(range(10), generator=0), 3, False)
            >>> resumed.load_state_dict(state)
            >>> list(resumed) == list(it)
            True
        """
        iteration = self._resume if self._resume is not None else self._iteration
        if iteration is not None and not iteration.finished:
            return self._state(True, iteration.position, iteration.start)
        inner = self.sampler
        return self._state(False, 0, cast(Any, inner).state_dict() if _stateful(inner) else None)

    def _state(self, in_progress: bool, batches: int, inner: Any) -> dict[str, Any]:
        return {
            "type": "BatchSampler",
            "version": _STATE_VERSION,
            "in_progress": in_progress,
            "batches": batches,
            "sampler": inner,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a state from :meth:`state_dict` of a batch sampler built the same way.

        If the state was taken during an iteration, the next ``iter()`` (or ``aiter()``)
        yields the rest of its batches; the iterations after that are the original's. The
        inner sampler's state is loaded at once.

        Args:
            state: the dict :meth:`state_dict` returned, possibly through JSON.

        Raises:
            ValueError: ``state`` comes from another sampler class or version, misses a field,
                has a field of the wrong type, has an inner state where the inner sampler has
                no ``state_dict`` (or none where it has), or more batches than an iteration
                has; or the inner sampler rejects its state.

        Example:
            >>> batches = BatchSampler(SequentialSampler(range(7)), 3, False)
            >>> state = batches.state_dict()
            >>> state.update(in_progress=True, batches=2)
            >>> batches.load_state_dict(state)
            >>> list(batches)
            [[6]]
        """
        in_progress, batches = _check_header(state, "BatchSampler", "batches")
        inner_state = _field(state, "BatchSampler", "sampler", dict, optional=True)
        inner = self.sampler
        if _stateful(inner) != (inner_state is not None):
            raise ValueError(
                f"BatchSampler state has {'no' if inner_state is None else 'an'} inner sampler "
                f"state, but the inner {type(inner).__name__} has "
                f"{'' if inner_state is None else 'no '}state_dict(): build the BatchSampler "
                "with the same arguments"
            )
        if in_progress and isinstance(inner, Sized) and batches > len(self):
            raise ValueError(
                f"BatchSampler state has batches={batches}, more than the {len(self)} "
                "batches an iteration of this sampler has: was it built with the same arguments?"
            )
        if inner_state is not None:
            to_load = inner_state
            if in_progress and isinstance(inner, _Resumable):
                # Batches are whole, so ``batches`` of them are that many keys of the inner
                # iteration; a last, short batch ends it.
                keys = min(batches * self.batch_size, len(inner))
                to_load = {**inner_state, "in_progress": True, "yielded": keys}
            try:
                cast(Any, inner).load_state_dict(to_load)
            except Exception as exc:
                exc.add_note("raised while loading the BatchSampler's inner sampler state")
                raise
        self._iteration = None
        self._resume = _Iteration(inner_state, batches) if in_progress else None

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

    def __aiter__(self) -> AsyncIterator[list[int]]:
        iteration, keys, skip = self._open(lambda: aiter(cast(AsyncIterable[int], self.sampler)))
        return iteration.acount(self._batches(keys, skip))

    async def _batches(self, keys: AsyncIterator[int], skip: int) -> AsyncIterator[list[int]]:
        if skip:
            async for _ in keys:  # fast-forward a resumed iteration, one key at a time
                skip -= 1
                if not skip:
                    break
        size = self.batch_size
        batch: list[int] = []
        async for key in keys:
            batch.append(key)
            if len(batch) == size:
                yield batch
                batch = []
        if batch and not self.drop_last:
            yield batch


class DistributedSampler(_Resumable, Generic[T_co]):
    """Restrict sampling to the share of the dataset that belongs to one replica (rank).

    Each of ``num_replicas`` replicas gets an equal number of indices; together they cover the
    dataset. Without ``drop_last`` the index list is padded by repeating indices from its start
    until it divides evenly; with ``drop_last`` its tail is dropped instead. With ``shuffle``
    the order is a permutation seeded by ``seed + epoch``: identical on every replica, and
    different each epoch once :meth:`set_epoch` is called before each epoch.

    Its state (see :meth:`state_dict`) adds ``"epoch"`` (as set by :meth:`set_epoch`) and
    ``"iteration_epoch"``, the epoch the iteration in progress shuffles with (``None`` between
    iterations).

    As torch's, the class is generic (``DistributedSampler[int]`` in annotations); it yields
    the dataset's int indices.

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

    _state_type = "DistributedSampler"

    def _begin(self) -> _Iteration:
        return _Iteration(self.epoch)

    def _keys(self, iteration: _Iteration) -> Iterator[int]:
        n = len(self.dataset)
        if self.shuffle:
            indices = np.random.default_rng(self.seed + iteration.start).permutation(n)
        else:
            indices = np.arange(n)
        # ``np.resize`` repeats the array cyclically (padding) or cuts it (drop_last).
        indices = np.resize(indices, self.total_size)
        mine = indices[self.rank :: self.num_replicas][iteration.position :]
        return iteration.track([mine.tolist()])

    def _state_fields(self, iteration: _Iteration | None) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "iteration_epoch": None if iteration is None else iteration.start,
        }

    def _load_fields(self, state: Mapping[str, Any], in_progress: bool) -> Any:
        epoch = _count_field(state, self._state_type, "epoch")
        if not in_progress:
            self.epoch = epoch
            return None
        if state.get("iteration_epoch") is None:
            raise ValueError(
                "DistributedSampler state is in progress but has no 'iteration_epoch' (the "
                "epoch its iteration shuffles with)"
            )
        iteration_epoch = _count_field(state, self._state_type, "iteration_epoch")
        self.epoch = epoch
        return iteration_epoch

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


def _after(block: npt.NDArray[Any], first: int, skip: int) -> list[int]:
    """The keys of ``block`` (whose first key is key number ``first``) after key ``skip``."""
    return cast(list[int], block[max(skip - first, 0) :].tolist())


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


def _stateful(sampler: object) -> bool:
    return callable(getattr(sampler, "state_dict", None)) and callable(
        getattr(sampler, "load_state_dict", None)
    )


def _plain(value: Any) -> Any:
    """``value`` with numpy arrays and scalars (as in a bit-generator state) made JSON types."""
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value


def _field(
    state: Mapping[str, Any],
    kind: str,
    name: str,
    types: type | tuple[type, ...],
    *,
    optional: bool = False,
) -> Any:
    """``state[name]``, checked to be of ``types`` (or ``None`` if ``optional``)."""
    if name not in state:
        raise ValueError(f"{kind} state is missing the field {name!r}")
    value = state[name]
    if value is None and optional:
        return None
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in _tuple(types)):
        expected = " or ".join(t.__name__ for t in _tuple(types)) + (" or None" * optional)
        raise ValueError(
            f"{kind} state field {name!r} should be {expected}, but got {type(value).__name__}"
        )
    return value


def _tuple(types: type | tuple[type, ...]) -> tuple[type, ...]:
    return types if isinstance(types, tuple) else (types,)


def _count_field(state: Mapping[str, Any], kind: str, name: str) -> int:
    value: int = _field(state, kind, name, int)
    if value < 0:
        raise ValueError(f"{kind} state field {name!r} should be non-negative, but got {value}")
    return value


def _check_header(state: object, expected: str, count: str) -> tuple[bool, int]:
    """Check the fields every sampler state has; return ``in_progress`` and the count."""
    if not isinstance(state, Mapping):
        raise ValueError(
            f"a {expected} state should be a dict from state_dict(), but got {type(state).__name__}"
        )
    given = state.get("type")
    if given != expected:
        raise ValueError(
            f"expected a state from a {expected}, but got one from "
            + (f"a {given}" if isinstance(given, str) else f"something else (type={given!r})")
        )
    version = state.get("version")
    if version != _STATE_VERSION:
        raise ValueError(
            f"{expected} state has version={version!r}, but this aioload reads version "
            f"{_STATE_VERSION}"
        )
    in_progress: bool = _field(state, expected, "in_progress", bool)
    return in_progress, _count_field(state, expected, count)


def _check_generator_state(
    state: Mapping[str, Any], kind: str, generator: np.random.Generator | None
) -> None:
    """Check that ``state`` is a bit-generator state that ``generator`` (if any) can take."""
    name = state.get("bit_generator")
    if name not in _BIT_GENERATORS:
        raise ValueError(
            f"{kind} state field 'generator' should be a numpy bit-generator state with "
            f"bit_generator one of {', '.join(_BIT_GENERATORS)}, but got bit_generator={name!r}"
        )
    if generator is not None:
        own = generator.bit_generator.state["bit_generator"]
        if own != name:
            raise ValueError(
                f"{kind} state holds a {name} generator state, but this sampler's generator "
                f"is a {own}: build it with the same arguments"
            )
    try:
        # A scratch bit generator validates the state without touching the sampler's.
        getattr(np.random, name)().state = dict(state)
    except (TypeError, ValueError, KeyError, OverflowError) as exc:
        raise ValueError(
            f"{kind} state field 'generator' is not a valid {name} state: {exc}"
        ) from exc
