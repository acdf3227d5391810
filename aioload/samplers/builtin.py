"""Samplers: which keys to load, in what order, in what batches.

The classes follow ``torch.utils.data``'s samplers argument for argument. Where the randomness is
torch's they draw torch's own keys; elsewhere they draw with numpy. Every ``generator`` argument
accepts:

- a ``torch.Generator`` (CPU): keys drawn from it with torch's own calls (``torch.randperm``,
  ``torch.randint`` in blocks of 32, ``torch.multinomial``; see :mod:`aioload.samplers.draws`), so
  a seed gives the keys torch's samplers give and the generator advances as under torch;
- ``None``: from torch's default generator when torch is imported, as torch's samplers draw
  (``RandomSampler`` draws a seed from it, ``torch.empty((), dtype=torch.int64).random_()``, and
  shuffles with a generator of its own; the others draw from it directly), so after
  ``torch.manual_seed(0)`` the keys are torch's; without torch, from a numpy generator seeded by
  numpy's legacy global state (so ``np.random.seed(0)`` reproduces them). Unseeded, every epoch
  is reshuffled differently;
- a :class:`numpy.random.Generator`: advanced by each iteration (epochs differ, yet the whole
  sequence of epochs is reproducible);
- an ``int`` seed (turned into a numpy Generator once, at construction).

As in torch, whose random samplers' ``__iter__`` is a generator function, an iteration of
:class:`RandomSampler`, :class:`SubsetRandomSampler`, :class:`WeightedRandomSampler` or
:class:`BatchSampler` begins at its first key, not at ``iter()``: a ``torch.manual_seed`` between
the two counts. :class:`SequentialSampler` and :class:`DistributedSampler` begin at ``iter()``,
as torch's.

Any iterable of keys is a sampler, and so is any *async* iterable of keys (an object with
``__aiter__``, such as an async generator); :func:`is_async_sampler` tells them apart.
:class:`BatchSampler` batches either kind: over an async sampler it is itself async-iterable
only. Its constructor picks the right class (``BatchSampler`` or its private async subclass)
so that ``__aiter__`` exists exactly when the inner sampler is async, and a plain ``hasattr``
/ :func:`is_async_sampler` check is all a consumer needs.

Checkpoint and resume: every built-in sampler has ``state_dict()`` and
``load_state_dict(state)``. A state is a small JSON-serialisable dict taken between iterations
or in the middle of one (an iteration of a random sampler is in progress from its first key).
A sampler built with the same arguments and given that state yields, on its next ``iter()``,
exactly the keys the interrupted iteration had not yet yielded, and the iterations after that
repeat the original's, reshuffles included. For that a state holds the generator state from
the *start* of the interrupted iteration and how many keys it had yielded: resuming redraws
the iteration in bulk, as arrays (or torch's blocks), and drops those keys by
slicing, never one by one (except in a :class:`BatchSampler` over a sampler that is not built
in: see there). Every state has ``"type"`` (the sampler class), ``"version"``,
``"in_progress"`` (an iteration was started and its iterator not yet exhausted) and a count
(``"yielded"`` keys, or ``"batches"`` for :class:`BatchSampler`). The count of an in-progress
state may be lowered before loading, to resume after fewer items of the same iteration: a
loader that has drawn keys ahead of those it delivered rewinds this way. A state describes the
sampler's latest iteration. Loading one sets the state of the sampler's ``Generator``, the very
object given as ``generator``; a sampler without a generator redraws the resumed iteration from
the state it recorded (never setting the global one) and reshuffles from the global state after
it, as it always does.

Keys from the built-in samplers are plain Python ``int``\\ s. Invalid arguments raise the
exception type and message torch raises where torch checks the argument; arguments torch does
not check raise ``TypeError`` for a wrong type and ``ValueError`` for a wrong value.

This module defines the key samplers (sequential, random, subset, weighted). The others are
defined in modules of their own and importable from here too: :class:`Sampler` and
:func:`is_async_sampler` in :mod:`aioload.samplers.base`, :class:`BatchSampler` in
:mod:`aioload.samplers.batch`, :class:`DistributedSampler` in :mod:`aioload.samplers.distributed`;
what a state holds and how it is checked is in :mod:`aioload.samplers.state`, how a random
sampler draws and replays an iteration in :mod:`aioload.samplers.shuffling`, and torch's draws in
:mod:`aioload.samplers.draws`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence, Sized
from typing import Any, TypeAlias, cast

import numpy as np
import numpy.typing as npt

from aioload.checks import is_integral
from aioload.samplers.base import Sampler, is_async_sampler
from aioload.samplers.batch import BatchSampler
from aioload.samplers.distributed import DistributedSampler
from aioload.samplers.draws import (
    TORCH_BLOCK,
    default_generator,
    multinomial,
    randint,
    randperm,
    seeded_generator,
    torch_is_imported,
)
from aioload.samplers.generators import (
    TorchGeneratorLike,
    global_seed,
    is_torch_generator,
    torch_seed,
)
from aioload.samplers.shuffling import Rng, Shuffling
from aioload.samplers.state import ResumableSampler, SamplerIteration

__all__ = [
    "BatchSampler",
    "DistributedSampler",
    "GeneratorLike",
    "RandomSampler",
    "Sampler",
    "SequentialSampler",
    "SubsetRandomSampler",
    "TorchGeneratorLike",
    "WeightedRandomSampler",
    "as_generator",
    "is_async_sampler",
    "split_order",
]

GeneratorLike: TypeAlias = np.random.Generator | TorchGeneratorLike | int | None
"""What a ``generator`` argument accepts: ``None``, a numpy ``Generator``, a ``torch.Generator``
or an ``int`` seed (see the module docstring)."""


# Keys drawn with replacement are produced lazily in chunks, so that a huge ``num_samples``
# (an "infinite" sampler) costs no memory up front and an early ``break`` wastes little work.
_CHUNK = 1024


class SequentialSampler(ResumableSampler):
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

    def _keys(self, iteration: SamplerIteration) -> Iterator[int]:
        return iteration.track([range(iteration.position, len(self.data_source))])

    def __len__(self) -> int:
        return len(self.data_source)


class RandomSampler(Shuffling):
    """Yield the indices of ``data_source`` in random order.

    Without replacement each epoch is a random permutation; a ``num_samples`` larger than the
    dataset yields whole permutations followed by a partial one. With replacement,
    ``num_samples`` indices are drawn independently and uniformly.

    Its state (see :meth:`state_dict`) adds ``"generator"`` and ``"torch_generator"``, the
    states that replay an iteration (see :mod:`aioload.samplers`). Resuming in the middle of an
    iteration redraws it from its start, in bulk, and skips what was yielded.

    Args:
        data_source: the dataset (anything with ``__len__``) to sample from.
        replacement: draw with replacement if ``True``. Default: ``False``.
        num_samples: number of indices per epoch. Default: ``len(data_source)``, read at each
            epoch since the dataset may change size.
        generator: ``None`` (torch's default generator once torch is imported, else numpy's
            global state, at each epoch), a ``torch.Generator`` (torch's keys), a
            ``numpy.random.Generator`` or an ``int`` seed (see :mod:`aioload.samplers`).

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
        self.generator = as_generator(generator)
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

    def _keys(self, iteration: SamplerIteration) -> Iterator[int]:
        rng = self._rng_of(iteration)
        skip = iteration.position
        if isinstance(rng, np.random.Generator):
            return iteration.track(self._blocks(rng, skip))
        return iteration.track(self._torch_blocks(rng, skip))

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

    def _torch_blocks(self, rng: Any, skip: int) -> Iterator[list[int]]:
        # torch's RandomSampler, draw for draw: each block when its first key is asked for, and
        # a last (maybe empty) one when the key after the last is.
        n = len(self.data_source)
        count = self.num_samples
        if self.generator is None:
            rng = seeded_generator(torch_seed(rng))  # torch's own generator for the iteration
        size = TORCH_BLOCK if self.replacement else n
        for first in range(0, count - count % size, size):
            block = randint(n, size, rng) if self.replacement else randperm(n, rng)
            yield block[max(skip - first, 0) :]
        first = count - count % size
        if self.replacement:
            last = randint(n, count % size, rng)
        else:
            last = randperm(n, rng)[: count % size]
        yield last[max(skip - first, 0) :]

    def __len__(self) -> int:
        return self.num_samples


class SubsetRandomSampler(Shuffling):
    """Yield the elements of ``indices`` in random order, without replacement.

    Its state (see :meth:`state_dict`) adds ``"generator"`` and ``"torch_generator"``, the
    states that replay an iteration (see :mod:`aioload.samplers`).

    Args:
        indices: a sequence of keys (list, tuple, range or 1-D numpy array).
        generator: ``None`` (torch's default generator once torch is imported, else numpy's
            global state, at each epoch), a ``torch.Generator`` (torch's keys), a
            ``numpy.random.Generator`` or an ``int`` seed (see :mod:`aioload.samplers`).

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
        self.generator = as_generator(generator)

    _state_type = "SubsetRandomSampler"

    def _keys(self, iteration: SamplerIteration) -> Iterator[int]:
        order = _permutation(len(self.indices), self._rng_of(iteration))[iteration.position :]
        if isinstance(self.indices, np.ndarray):
            return iteration.track([self.indices[order].tolist()])
        # ``map`` takes one position at a time, so the count of positions is that of keys.
        return map(self.indices.__getitem__, iteration.track([order]))

    def __len__(self) -> int:
        return len(self.indices)


class WeightedRandomSampler(Shuffling):
    """Yield indices ``0..len(weights)-1`` drawn with probability proportional to ``weights``.

    Its state (see :meth:`state_dict`) adds ``"generator"`` and ``"torch_generator"``, the
    states that replay an iteration (see :mod:`aioload.samplers`). Resuming in the middle of an
    iteration redraws it from its start, in bulk, and skips what was yielded.

    Args:
        weights: a 1-D sequence of non-negative, finite weights, not all zero; they need not
            sum to one.
        num_samples: number of indices per epoch.
        replacement: if ``True`` (default) indices are drawn independently; if ``False`` each
            index is drawn at most once, so ``num_samples`` may not exceed the number of
            non-zero weights.
        generator: ``None`` (torch's default generator once torch is imported, else numpy's
            global state, at each epoch), a ``torch.Generator`` (torch's keys), a
            ``numpy.random.Generator`` or an ``int`` seed (see :mod:`aioload.samplers`).

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
        self.generator = as_generator(generator)
        self._cdf = np.cumsum(w)
        self._nonzero = np.flatnonzero(w)

    _state_type = "WeightedRandomSampler"

    def _keys(self, iteration: SamplerIteration) -> Iterator[int]:
        rng = self._rng_of(iteration)
        skip = iteration.position
        if isinstance(rng, np.random.Generator):
            return iteration.track(self._blocks(rng, skip))
        # torch's one multinomial draw for the whole iteration, at its first key.
        keys = multinomial(self.weights, self.num_samples, self.replacement, rng)
        return iteration.track([keys[skip:]])

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


def as_generator(generator: object) -> Rng:
    """A ``generator`` argument as what draws keys: None, a numpy ``Generator`` or a CPU
    ``torch.Generator`` as given, an ``int`` seed (numpy's included) as a numpy ``Generator``.

    Args:
        generator: what the user passed (see the module docstring).

    Raises:
        TypeError: anything else (a ``bool`` too).
        ValueError: a negative seed, or a ``torch.Generator`` on another device.

    Example::

        >>> int(as_generator(0).integers(10)) == int(as_generator(np.int64(0)).integers(10))
        True
        >>> as_generator(True)
        Traceback (most recent call last):
        ...
        TypeError: generator should be None, a numpy.random.Generator, a torch.Generator or \
an int seed, but got bool
    """
    if generator is None or isinstance(generator, np.random.Generator):
        return generator
    if is_torch_generator(generator):
        device = getattr(generator, "device", None)
        if getattr(device, "type", "cpu") != "cpu":
            raise ValueError(
                "generator should be a CPU torch.Generator (seeds are drawn on the CPU, as "
                f"torch's samplers draw them), but got one on {device}"
            )
        return cast(TorchGeneratorLike, generator)
    if is_integral(generator):
        if generator < 0:
            raise ValueError(f"generator seed should be a non-negative integer, got {generator}")
        return np.random.default_rng(int(generator))
    raise TypeError(
        "generator should be None, a numpy.random.Generator, a torch.Generator or an int seed, "
        f"but got {type(generator).__name__}"
    )


def _permutation(n: int, rng: Any) -> list[int]:
    """A permutation of ``range(n)`` drawn from a numpy Generator, or torch's from a torch one."""
    if isinstance(rng, np.random.Generator):
        return cast(list[int], rng.permutation(n).tolist())
    return randperm(n, rng)


def split_order(n: int, generator: Rng) -> list[int]:
    """``random_split``'s order: torch's ``randperm`` from a ``torch.Generator``, or without one
    from torch's default generator once torch is imported; else numpy's, from ``generator`` or
    from a generator seeded by numpy's legacy global state.

    Args:
        n: the dataset's length.
        generator: from :func:`as_generator`.

    Example::

        >>> sorted(split_order(5, np.random.default_rng(0)))
        [0, 1, 2, 3, 4]
    """
    if generator is None:
        generator = default_generator() if torch_is_imported() else None
    if generator is None:
        return _permutation(n, np.random.default_rng(global_seed()))
    return _permutation(n, generator)


def _after(block: npt.NDArray[Any], first: int, skip: int) -> list[int]:
    """The keys of ``block`` (whose first key is key number ``first``) after key ``skip``."""
    return cast(list[int], block[max(skip - first, 0) :].tolist())


def _check_num_samples(num_samples: object) -> int:
    if not is_integral(num_samples) or num_samples <= 0:
        raise ValueError(
            f"num_samples should be a positive integer value, but got num_samples={num_samples!r}"
        )
    return int(num_samples)
