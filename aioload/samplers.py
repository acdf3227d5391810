"""Samplers: which keys to load, in what order, in what batches.

The classes follow ``torch.utils.data``'s samplers argument for argument; keys are drawn with
numpy. Every ``generator`` argument accepts:

- ``None``: each ``__iter__`` draws one seed from the process's global random state, as torch's
  samplers do: from torch's default generator when torch is imported (so ``torch.manual_seed(0)``
  reproduces the shuffles), else from numpy's legacy global state (so ``np.random.seed(0)``
  does). Unseeded, every epoch is reshuffled differently.
- a :class:`numpy.random.Generator`: advanced by each ``__iter__`` (epochs differ, yet the whole
  sequence of epochs is reproducible);
- a ``torch.Generator`` (CPU): each ``__iter__`` draws one seed from it with torch's draw
  (``torch.empty((), dtype=torch.int64).random_(generator=g)``) and shuffles with numpy from that
  seed, so the generator advances every epoch and a seeded one reproduces the run (the keys
  differ from torch's own, which come from ``torch.randperm``);
- an ``int`` seed (turned into a numpy Generator once, at construction).

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

This module defines the key samplers (sequential, random, subset, weighted). The others are
defined in modules of their own and importable from here too: :class:`Sampler` and
:func:`is_async_sampler` in :mod:`aioload.sampler_base`, :class:`BatchSampler` in
:mod:`aioload.batch_sampler`, :class:`DistributedSampler` in :mod:`aioload.distributed_sampler`;
what a state holds and how it is checked is in :mod:`aioload.sampler_state`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence, Sized
from typing import Any, TypeAlias, cast

import numpy as np
import numpy.typing as npt

from aioload.batch_sampler import BatchSampler
from aioload.distributed_sampler import DistributedSampler
from aioload.sampler_base import Sampler, is_async_sampler
from aioload.sampler_state import (
    TorchGeneratorLike,
    _check_generator_state,
    _check_torch_generator_state,
    _field,
    _is_torch_generator,
    _Iteration,
    _plain,
    _Resumable,
    _seed_from,
    _set_torch_generator_state,
    _torch_generator_state,
    _torch_seed,
)

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
    "is_async_sampler",
]

GeneratorLike: TypeAlias = np.random.Generator | TorchGeneratorLike | int | None
"""What a ``generator`` argument accepts: ``None``, a numpy ``Generator``, a ``torch.Generator``
or an ``int`` seed (see the module docstring)."""

Rng: TypeAlias = np.random.Generator | TorchGeneratorLike | None
"""A ``generator`` once checked: ``None``, a numpy ``Generator`` or a ``torch.Generator``."""

# Keys drawn with replacement are produced lazily in chunks, so that a huge ``num_samples``
# (an "infinite" sampler) costs no memory up front and an early ``break`` wastes little work.
_CHUNK = 1024


class _Shuffling(_Resumable):
    """A :class:`_Resumable` whose keys come from a numpy generator.

    An iteration starts from a numpy bit-generator state, which a state carries as
    ``"generator"``: the state at the start of the iteration in progress, or the current one
    between iterations (``None`` for a sampler without a numpy generator). Without one, the
    iteration's numpy generator is seeded by one draw from the ``torch.Generator`` or the global
    state (see :func:`~aioload.sampler_state._seed_from`); a sampler with a ``torch.Generator``
    adds ``"torch_generator"``: that generator's state before the draw of the iteration in
    progress, or its current one between iterations.
    """

    generator: Rng
    _loaded_source: dict[str, Any] | None = None

    def _begin(self) -> _Iteration:
        generator = self.generator
        if isinstance(generator, np.random.Generator):
            iteration = _Iteration(generator.bit_generator.state)
            iteration.rng = generator
            return iteration
        source = None if generator is None else _torch_generator_state(generator)
        rng = np.random.default_rng(_seed_from(generator))
        iteration = _Iteration(rng.bit_generator.state, source=source)
        iteration.rng = rng
        return iteration

    def _rng_of(self, iteration: _Iteration) -> np.random.Generator:
        """The generator to draw ``iteration`` with; a resumed one is set back to its start."""
        if iteration.rng is None:
            start = iteration.start
            generator = self.generator
            if isinstance(generator, np.random.Generator):
                rng = generator
            else:
                if generator is not None and iteration.source is not None:
                    # The torch generator moves past this iteration's draw, as it did then.
                    _set_torch_generator_state(generator, iteration.source["state"])
                    _torch_seed(generator)
                rng = np.random.Generator(getattr(np.random, start["bit_generator"])())
            rng.bit_generator.state = start
            iteration.rng = rng
        return iteration.rng

    def _state_fields(self, iteration: _Iteration | None) -> dict[str, Any]:
        generator = self.generator
        if iteration is not None:
            numpy_state = iteration.start
        elif isinstance(generator, np.random.Generator):
            numpy_state = generator.bit_generator.state
        else:
            numpy_state = None
        fields = {"generator": _plain(numpy_state)}
        if generator is not None and not isinstance(generator, np.random.Generator):
            source = iteration.source if iteration is not None else None
            fields["torch_generator"] = _plain(source or _torch_generator_state(generator))
        return fields

    def _load_fields(self, state: Mapping[str, Any], in_progress: bool) -> Any:
        kind = self._state_type
        generator = _field(state, kind, "generator", dict, optional=True)
        torch_state = self._torch_field(state)
        own = self.generator if isinstance(self.generator, np.random.Generator) else None
        if generator is None:
            if in_progress:
                raise ValueError(
                    f"{kind} state is in progress but has generator=None: an "
                    "iteration in progress needs the generator state it started from"
                )
            if own is not None:
                raise ValueError(
                    f"{kind} state has generator=None (its sampler had no numpy "
                    "generator), but this sampler has one: build it with the same arguments"
                )
            if torch_state is not None:
                _set_torch_generator_state(self.generator, torch_state)
            return None
        _check_generator_state(generator, kind, own)
        if not in_progress:
            if own is None:
                raise ValueError(
                    f"{kind} state has a generator state, but this sampler has "
                    f"generator={'None' if self.generator is None else 'a torch.Generator'}: "
                    "build it with the same arguments"
                )
            own.bit_generator.state = generator
        self._loaded_source = None
        if torch_state is not None:
            self._loaded_source = {**state["torch_generator"], "state": torch_state}
        return generator

    def _torch_field(self, state: Mapping[str, Any]) -> list[int] | None:
        """The checked ``"torch_generator"`` state bytes (None: the sampler has no torch one)."""
        theirs = state.get("torch_generator")
        if _is_torch_generator(self.generator):
            if theirs is None:
                raise ValueError(
                    f"{self._state_type} state has no 'torch_generator' (its sampler had no "
                    "torch.Generator), but this sampler has one: build it with the same arguments"
                )
            return _check_torch_generator_state(theirs, self._state_type, "torch_generator")
        if theirs is not None:
            raise ValueError(
                f"{self._state_type} state holds a torch.Generator state, but this sampler has "
                f"generator={'None' if self.generator is None else 'a numpy Generator'}: "
                "build it with the same arguments"
            )
        return None

    def _resumed(self, start: Any, yielded: int) -> _Iteration:
        source, self._loaded_source = self._loaded_source, None
        return _Iteration(start, yielded, source=source)


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
        generator: ``None`` (a seed from torch's default generator, or numpy's global state
            without torch, at each epoch), a ``numpy.random.Generator``, a
            ``torch.Generator`` or an ``int`` seed (see :mod:`aioload.samplers`).

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
        generator: ``None`` (a seed from torch's default generator, or numpy's global state
            without torch, at each epoch), a ``numpy.random.Generator``, a
            ``torch.Generator`` or an ``int`` seed (see :mod:`aioload.samplers`).

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
        generator: ``None`` (a seed from torch's default generator, or numpy's global state
            without torch, at each epoch), a ``numpy.random.Generator``, a
            ``torch.Generator`` or an ``int`` seed (see :mod:`aioload.samplers`).

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


def _as_generator(generator: object) -> Rng:
    if generator is None or isinstance(generator, np.random.Generator):
        return generator
    if _is_torch_generator(generator):
        device = getattr(generator, "device", None)
        if getattr(device, "type", "cpu") != "cpu":
            raise ValueError(
                "generator should be a CPU torch.Generator (seeds are drawn on the CPU, as "
                f"torch's samplers draw them), but got one on {device}"
            )
        return cast(TorchGeneratorLike, generator)
    if isinstance(generator, int | np.integer) and not isinstance(generator, bool):
        if generator < 0:
            raise ValueError(f"generator seed should be a non-negative integer, got {generator}")
        return np.random.default_rng(int(generator))
    raise TypeError(
        "generator should be None, a numpy.random.Generator, a torch.Generator or an int seed, "
        f"but got {type(generator).__name__}"
    )


def _rng(generator: Rng) -> np.random.Generator:
    """A numpy generator to draw with: ``generator`` itself, or one seeded by a draw from it
    (a ``torch.Generator``) or from the global state (None)."""
    if isinstance(generator, np.random.Generator):
        return generator
    return np.random.default_rng(_seed_from(generator))


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
