"""BatchSampler: a sampler's keys in lists of ``batch_size``, over a sync or async sampler.

``BatchSampler(...)`` picks its class: over an async sampler (see
:func:`~aioload.samplers.base.is_async_sampler`) it builds the private async subclass, which is
async-iterable only, so that ``__aiter__`` exists exactly when the inner sampler is async.
Its state holds the batches yielded and the inner sampler's state (see
:meth:`BatchSampler.state_dict`); the built-in inner samplers resume by slicing.
"""

from __future__ import annotations

from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sized,
)
from itertools import chain, islice
from typing import Any, TypeVar, cast

from aioload.checks import is_integral
from aioload.samplers.base import Sampler, is_async_sampler
from aioload.samplers.state import (
    SAMPLER_STATE_VERSION,
    ResumableSampler,
    SamplerIteration,
    check_state_header,
    is_stateful,
    state_field,
)

__all__ = ["BatchSampler"]

T = TypeVar("T")


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
        >>> from aioload import SequentialSampler
        >>> list(BatchSampler(SequentialSampler(range(10)), batch_size=3, drop_last=False))
        [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
        >>> list(BatchSampler(SequentialSampler(range(10)), batch_size=3, drop_last=True))
        [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    """

    sampler: Iterable[int] | AsyncIterable[int]
    _iteration: SamplerIteration | None = None  # the latest iteration; ``start``: the inner state
    _resume: SamplerIteration | None = None  # loaded by ``load_state_dict``, run by the next iter()

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
        if not is_integral(batch_size) or batch_size <= 0:
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
        # As torch's (a generator function), the inner sampler is iterated from the first batch
        # on; the batches pass through one more chain, in C.
        return chain.from_iterable(self._opening())

    def _opening(self) -> Iterator[Iterator[list[int]]]:
        size = self.batch_size
        iteration, it, skip = self._open(lambda: iter(cast(Iterable[int], self.sampler)))
        if skip:
            next(islice(it, skip, skip), None)  # drops ``skip`` keys, in C
        # zip over one iterator repeated, and islice, fill each batch in C.
        if self.drop_last:
            yield iteration.count(map(list, zip(*[it] * size, strict=False)))
        else:
            yield iteration.count(self._islice_batches(it, size))

    def _open(self, open_keys: Callable[[], T]) -> tuple[SamplerIteration, T, int]:
        """Start an iteration: the iteration, the inner keys and how many of them to drop."""
        inner = self.sampler
        iteration = self._resume
        self._resume = None
        if iteration is not None:
            # ``load_state_dict`` already moved a built-in inner sampler to the right key.
            keys = open_keys()
            skip = (
                0 if isinstance(inner, ResumableSampler) else iteration.position * self.batch_size
            )
        elif isinstance(inner, ResumableSampler):
            # Taken once the inner iteration began (a random sampler begins at its first key):
            # its state, whose count ``load_state_dict`` sets, has its generator state then,
            # even with generator=None.
            keys = open_keys()
            first = list(islice(cast(Iterator[int], keys), 1))
            iteration, skip = SamplerIteration(inner.state_dict()), 0
            keys = cast(T, chain(first, cast(Iterator[int], keys)))
        else:
            start = cast(Any, inner).state_dict() if is_stateful(inner) else None
            keys = open_keys()
            iteration, skip = SamplerIteration(start), 0
        self._iteration = iteration
        return iteration, keys, skip

    def state_dict(self) -> dict[str, Any]:
        """Return this batch sampler's position as a small JSON-serialisable dict.

        Fields: ``"type"`` (``"BatchSampler"``), ``"version"``, ``"in_progress"``,
        ``"batches"`` (batches the iteration in progress has yielded, ``0`` between
        iterations) and ``"sampler"``: during an iteration the inner sampler's state from its
        start, between iterations its current state (``None`` if it has no ``state_dict``).

        Example:
            >>> from aioload import RandomSampler
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
        return self._state(False, 0, cast(Any, inner).state_dict() if is_stateful(inner) else None)

    def _state(self, in_progress: bool, batches: int, inner: Any) -> dict[str, Any]:
        return {
            "type": "BatchSampler",
            "version": SAMPLER_STATE_VERSION,
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
            >>> from aioload import SequentialSampler
            >>> batches = BatchSampler(SequentialSampler(range(7)), 3, False)
            >>> state = batches.state_dict()
            >>> state.update(in_progress=True, batches=2)
            >>> batches.load_state_dict(state)
            >>> list(batches)
            [[6]]
        """
        in_progress, batches = check_state_header(state, "BatchSampler", "batches")
        inner_state = state_field(state, "BatchSampler", "sampler", dict, optional=True)
        inner = self.sampler
        if is_stateful(inner) != (inner_state is not None):
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
            if in_progress and isinstance(inner, ResumableSampler):
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
        self._resume = SamplerIteration(inner_state, batches) if in_progress else None

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
