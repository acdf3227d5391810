"""MixDataset: samples drawn from several streams at random, by weight, reproducibly.

Each sample comes from a source chosen at random with probability proportional to its
weight. The choices come from a generator seeded with ``(seed, epoch, rank, worker)``
and from nothing else: the sequence is the same on every run, whatever the timing or
the order in which workers' batches arrive. Uniforms are drawn in blocks of
:data:`BLOCK` (block ``b`` from the seed words and ``b``), so the mixer's whole random
state is the number of draws made: a checkpoint holds that count and each source's own
state (``state_dict``), and a resumed mix continues exactly.

With workers every worker mixes its own split: each source splits itself by
:func:`~aioload.get_worker_info` (as :class:`~aioload.sources.ShardDataset` does), and
each worker's mixer has its own seed.

When a source runs out (``stop``):

- ``"first"``: the mix ends;
- ``"longest"``: the source is dropped, the others' weights renormalised (a new draw
  replaces the one that met the end), until every source has ended;
- ``"never"``: the source is iterated again from its start (a source that yields nothing
  from its start raises ``ValueError``), so the mix never ends: end the epoch yourself.

Under the loader's fault policy (:meth:`MixDataset.guarded_stream`) a skip marker from a
source (see :mod:`aioload.faults.guard`) uses up the draw that reached it, as its sample
would have: the draws do not depend on what fails, and the samples that remain come in
the order they come in a run where nothing fails, the bad ones left out.
"""

from __future__ import annotations

import math
from collections.abc import AsyncGenerator, Callable, Generator, Iterable, Iterator, Mapping
from typing import Any, Literal

import numpy as np

from aioload.checks import is_int, is_real
from aioload.data.datasets import IterableDataset
from aioload.data.iterable import is_iterable_dataset
from aioload.data.protocol import stream_is_async
from aioload.faults.guard import StreamGuard, can_guard
from aioload.ranks import rank_and_world_size
from aioload.samplers.state import is_stateful
from aioload.worker_info import get_worker_info

__all__ = ["BLOCK", "STOPS", "MixDataset"]

BLOCK = 1024
"""Uniforms the mixer draws at once (a resumed mix draws the block it stopped in again)."""

STOPS = ("first", "longest", "never")
"""The choices of ``MixDataset(stop=...)``."""

Stop = Literal["first", "longest", "never"]

_END = object()


class _Draws:
    """The mixer's choices: source numbers by weight, from blocks of seeded uniforms.

    Block ``b``'s uniforms come from ``default_rng([*words, b])``: the ``count``-th choice
    depends on the seed words, ``count`` and the sources still active only.
    """

    def __init__(
        self, words: list[int], weights: list[float], active: list[bool], count: int
    ) -> None:
        self._words = words
        self._weights = np.asarray(weights, dtype=np.float64)
        self._active = list(active)
        self.count = count
        self._block = count // BLOCK
        self._position = count % BLOCK
        self._uniforms = np.random.default_rng([*words, self._block]).random(BLOCK)
        self._choices = self._choose()

    def _choose(self) -> list[int]:
        sources = np.flatnonzero(self._active)
        if not len(sources):
            return []
        bounds = np.cumsum(self._weights[sources])
        picks = np.searchsorted(bounds, self._uniforms * bounds[-1], side="right")
        # u < 1, but u * total may round up to total: the last source takes it.
        chosen: list[int] = sources[np.minimum(picks, len(sources) - 1)].tolist()
        return chosen

    def next(self) -> int:
        """The source of the next sample."""
        if self._position == BLOCK:
            self._block += 1
            self._position = 0
            self._uniforms = np.random.default_rng([*self._words, self._block]).random(BLOCK)
            self._choices = self._choose()
        choice = self._choices[self._position]
        self._position += 1
        self.count += 1
        return choice

    def drop(self, source: int) -> bool:
        """Source ``source`` ended for good; False when none is left."""
        self._active[source] = False
        self._choices = self._choose()  # the same uniforms, over the sources left
        return any(self._active)


class MixDataset(IterableDataset[Any]):
    """Samples drawn from several iterable datasets at random, each chosen by its weight.

    See the module docstring for the guarantees: the sequence is a function of ``seed``,
    the epoch (:meth:`set_epoch`), the rank and the worker only; :meth:`state_dict`
    resumes it exactly; with workers each worker mixes its own split of every source.

    Args:
        datasets: the sources: iterable datasets, sync (``__iter__``) or async
            (``__aiter__``), e.g. :class:`~aioload.sources.ShardDataset`.
        weights: one positive weight per source (they need not sum to 1).
        seed: the seed of the draws (an int >= 0).
        stop: when a source runs out: ``"first"`` ends the mix, ``"longest"`` goes on
            with the others (renormalised) until all have ended, ``"never"`` starts
            the source again.

    The mix is a sync stream (``__iter__``, which the loader reads in a thread) when
    every source is sync, an async one otherwise; ``async for`` works either way. The
    rank (``torch.distributed``'s when it is initialised, else ``RANK``, as
    :class:`~aioload.DistributedSampler` reads it) is read at construction.

    Raises:
        ValueError, TypeError: no source, a source that is not an iterable dataset,
            weights of another length or not all positive and finite, a bad ``seed``
            or ``stop``.

    Example::

        >>> mix = MixDataset([range(0, 100), range(100, 200)], [0.9, 0.1], seed=1)
        >>> sum(sample >= 100 for sample in mix) < 30        # mostly the first source
        True
        >>> sorted(MixDataset([[1, 1], [2]], [1, 1], stop="longest"))   # all of both
        [1, 1, 2]

        web = ShardDataset("s3://bucket/web-{0000..0999}.tar", decode=default_decode,
                           storage_options=options)
        books = ShardDataset("s3://bucket/books-{000..099}.tar", decode=default_decode,
                             storage_options=options)
        mix = MixDataset([web, books], [0.7, 0.3], seed=0, stop="never")
        loader = DataLoader(mix, batch_size=32, num_workers=4)
    """

    def __init__(
        self,
        datasets: Iterable[Any],
        weights: Iterable[float],
        *,
        seed: int = 0,
        stop: Stop = "first",
    ) -> None:
        if isinstance(datasets, str | bytes | Mapping) or not isinstance(datasets, Iterable):
            raise TypeError(
                f"datasets should be a list of iterable datasets; got {type(datasets).__name__}"
            )
        self.datasets = list(datasets)
        if not self.datasets:
            raise ValueError("MixDataset needs at least one dataset")
        for number, source in enumerate(self.datasets):
            _check_source(number, source)
        if isinstance(weights, str | bytes) or not isinstance(weights, Iterable):
            raise TypeError(f"weights should be a list of numbers; got {weights!r:.100}")
        weights = list(weights)
        if len(weights) != len(self.datasets):
            raise ValueError(
                f"MixDataset has {len(self.datasets)} datasets but {len(weights)} weights: "
                "give one weight per dataset"
            )
        for number, weight in enumerate(weights):
            if not is_real(weight) or not math.isfinite(weight) or weight <= 0:
                raise ValueError(
                    f"weights should be positive finite numbers; weight {number} is {weight!r}"
                )
        if not is_int(seed) or seed < 0:
            raise ValueError(f"seed should be an int >= 0; got {seed!r}")
        if stop not in STOPS:
            raise ValueError(f"stop should be one of {', '.join(map(repr, STOPS))}; got {stop!r}")
        self.weights = [float(weight) for weight in weights]
        self.seed = seed
        self.stop: Stop = stop
        self.epoch = 0
        self.rank = rank_and_world_size()[0]
        # Where the running iteration stands (for state_dict), and a loaded state's start.
        self._draws: _Draws | None = None
        self._running_epoch = 0
        self._exhausted = [False] * len(self.datasets)
        self._resume: dict[str, Any] | None = None

    # -- the protocol's attributes --------------------------------------------------

    @property
    def is_async_stream(self) -> bool:
        """Whether the mix needs an event loop (some source is async): the loader's choice."""
        return any(_source_is_async(source) for source in self.datasets)

    @property
    def state_dict(self) -> Callable[[], dict[str, Any]]:
        """``state_dict()``: where the mix stands (draws made, each source's state).

        A JSON-serialisable dict: ``epoch``, ``draws`` (the mixer's draw count),
        ``exhausted`` (sources dropped by ``stop="longest"``) and ``sources`` (each
        source's ``state_dict()``; None for an exhausted one). Only a mix whose every
        source has ``state_dict``/``load_state_dict`` has one: otherwise reading the
        attribute raises ``AttributeError`` naming the source (and the loader refuses
        to checkpoint).
        """
        self._need_states("state_dict")
        return self._state_dict

    @property
    def load_state_dict(self) -> Callable[[Mapping[str, Any]], None]:
        """``load_state_dict(state)``: the next iteration continues from ``state``.

        Loads each source's state at once (their next iteration continues it) and
        keeps the draw count for the next iteration of the mix.

        Raises:
            ValueError: a state that is not a MixDataset's of as many sources.
        """
        self._need_states("load_state_dict")
        return self._load_state_dict

    @property
    def guarded_stream(self) -> Callable[[StreamGuard], Any]:
        """``guarded_stream(guard)``: the mix under the loader's fault policy.

        Each source is opened with its own ``guarded_stream``; a skip marker takes the
        place of its sample in the mix (see the module docstring). Only a mix whose
        every source has one has it (``AttributeError`` otherwise, naming the source).
        """
        missing = [n for n, source in enumerate(self.datasets) if not can_guard(source)]
        if missing:
            raise AttributeError(
                f"MixDataset cannot apply the fault policy: {_describe(missing, self.datasets)} "
                "cannot skip a sample without ending its stream (no guarded_stream)"
            )
        return self._guarded_stream

    def _need_states(self, method: str) -> None:
        missing = [n for n, source in enumerate(self.datasets) if not is_stateful(source)]
        if missing:
            verb = "has" if len(missing) == 1 else "have"
            raise AttributeError(
                f"MixDataset has no {method}(): {_describe(missing, self.datasets)} {verb} no "
                "state_dict()/load_state_dict(), so a checkpoint could not say where its "
                "stream stood"
            )

    # -- epochs and states -------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Sets the epoch of the next iteration, here and in every source that has ``set_epoch``.

        The draws depend on it, as the sources' orders may. With worker processes,
        persistent ones included, the epoch reaches every worker's copy of the mix (and
        so of its sources) when the next epoch starts (``iter(loader)``).

        Example::

            for epoch in range(10):
                mix.set_epoch(epoch)
                for batch in loader: ...
        """
        if not is_int(epoch) or epoch < 0:
            raise ValueError(f"epoch should be an int >= 0; got {epoch!r}")
        self.epoch = epoch
        for source in self.datasets:
            set_epoch = getattr(source, "set_epoch", None)
            if callable(set_epoch):
                set_epoch(epoch)

    def _state_dict(self) -> dict[str, Any]:
        draws = self._draws
        resume = self._resume
        if draws is None and resume is not None:
            return dict(resume)  # loaded, not yet resumed
        exhausted = list(self._exhausted)
        return {
            "type": "MixDataset",
            "epoch": self.epoch if draws is None else self._running_epoch,
            "draws": 0 if draws is None else draws.count,
            "exhausted": exhausted,
            "sources": [
                None if done else source.state_dict()
                for source, done in zip(self.datasets, exhausted, strict=True)
            ],
        }

    def _load_state_dict(self, state: Mapping[str, Any]) -> None:
        count = len(self.datasets)
        exhausted = state.get("exhausted") if isinstance(state, Mapping) else None
        sources = state.get("sources") if isinstance(state, Mapping) else None
        draws = state.get("draws") if isinstance(state, Mapping) else None
        epoch = state.get("epoch") if isinstance(state, Mapping) else None
        if (
            not isinstance(state, Mapping)
            or state.get("type") != "MixDataset"
            or not is_int(draws)
            or draws < 0
            or not is_int(epoch)
            or epoch < 0
            or not isinstance(exhausted, list)
            or len(exhausted) != count
            or not all(isinstance(done, bool) for done in exhausted)
            or not isinstance(sources, list)
            or len(sources) != count
        ):
            raise ValueError(
                f"a MixDataset state should be a dict from the state_dict() of a MixDataset "
                f"of {count} sources; got {state!r:.200}"
            )
        if all(exhausted):
            raise ValueError("a MixDataset state with every source exhausted has nothing left")
        for number, (source, source_state, done) in enumerate(
            zip(self.datasets, sources, exhausted, strict=True)
        ):
            if done or source_state is None:
                continue  # exhausted, or not started when the state was taken: starts afresh
            try:
                source.load_state_dict(source_state)
            except Exception as error:
                error.add_note(f"raised while loading the state of MixDataset source {number}")
                raise
        self._resume = {
            "type": "MixDataset",
            "epoch": epoch,
            "draws": draws,
            "exhausted": list(exhausted),
            "sources": list(sources),
        }

    # -- iteration ---------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        async_only = [
            n
            for n, s in enumerate(self.datasets)
            if not callable(getattr(type(s), "__iter__", None))
        ]
        if async_only:
            verb = "is" if len(async_only) == 1 else "are"
            raise TypeError(
                f"MixDataset {_describe(async_only, self.datasets)} {verb} async-only "
                "(__aiter__ but no __iter__); iterate the MixDataset with `async for`"
            )
        return self._mix_sync(iter)

    def __aiter__(self) -> AsyncGenerator[Any, None]:
        return self._mix_async(_open_async)

    def _guarded_stream(self, guard: StreamGuard) -> Any:
        def open_guarded(source: Any) -> Any:
            return source.guarded_stream(guard)

        if self.is_async_stream:
            return self._mix_async(open_guarded)
        return self._mix_sync(open_guarded)

    def _start(self) -> _Draws:
        """The draws of a new iteration: from a loaded state, or from the start."""
        resume, self._resume = self._resume, None
        epoch, count = self.epoch, 0
        exhausted = [False] * len(self.datasets)
        if resume is not None:
            epoch, count, exhausted = resume["epoch"], resume["draws"], resume["exhausted"]
        info = get_worker_info()
        worker = 0 if info is None else info.id
        self._running_epoch = epoch
        self._exhausted = list(exhausted)
        draws = _Draws(
            [self.seed, epoch, self.rank, worker],
            self.weights,
            [not done for done in exhausted],
            count,
        )
        self._draws = draws
        return draws

    def _restart_error(self, number: int) -> ValueError:
        return ValueError(
            f"MixDataset source {number} ({type(self.datasets[number]).__name__}) yields "
            "no sample from its start: stop='never' cannot start it again"
        )

    def _mix_sync(self, open_source: Callable[[Any], Any]) -> Generator[Any, None, None]:
        draws = self._start()
        exhausted = self._exhausted
        iterators: list[Any] = [
            None if done else iter(open_source(source))
            for source, done in zip(self.datasets, exhausted, strict=True)
        ]
        stop = self.stop
        try:
            while True:
                number = draws.next()
                fresh = False  # the source was just started again
                while True:
                    item = next(iterators[number], _END)
                    if item is _END:
                        if stop == "first":
                            return
                        if stop == "longest":
                            exhausted[number] = True
                            _close_sync(iterators[number])
                            iterators[number] = None
                            if not draws.drop(number):
                                return
                            number, fresh = draws.next(), False
                            continue
                        if fresh:
                            raise self._restart_error(number)
                        _close_sync(iterators[number])
                        iterators[number] = iter(open_source(self.datasets[number]))
                        fresh = True
                        continue
                    break
                yield item  # a skip marker too: it uses up its draw, as its sample would
        finally:
            for iterator in iterators:
                _close_sync(iterator)
            self._draws = None

    async def _mix_async(self, open_source: Callable[[Any], Any]) -> AsyncGenerator[Any, None]:
        draws = self._start()
        exhausted = self._exhausted
        # Per source: its iterator and whether it is async (sync sources are read inline).
        iterators: list[Any] = []
        is_async: list[bool] = []
        for source, done in zip(self.datasets, exhausted, strict=True):
            iterator = None if done else _as_iterator(open_source(source))
            iterators.append(iterator)
            is_async.append(hasattr(iterator, "__anext__"))
        stop = self.stop
        try:
            while True:
                number = draws.next()
                fresh = False
                while True:
                    iterator = iterators[number]
                    if is_async[number]:
                        try:
                            item = await iterator.__anext__()
                        except StopAsyncIteration:
                            item = _END
                    else:
                        item = next(iterator, _END)
                    if item is _END:
                        if stop == "first":
                            return
                        if stop == "longest":
                            exhausted[number] = True
                            await _close_async(iterator)
                            iterators[number] = None
                            if not draws.drop(number):
                                return
                            number, fresh = draws.next(), False
                            continue
                        if fresh:
                            raise self._restart_error(number)
                        await _close_async(iterator)
                        iterators[number] = _as_iterator(open_source(self.datasets[number]))
                        is_async[number] = hasattr(iterators[number], "__anext__")
                        fresh = True
                        continue
                    break
                yield item
        finally:
            for iterator in iterators:
                await _close_async(iterator)
            self._draws = None

    def __repr__(self) -> str:
        kinds = ", ".join(type(source).__name__ for source in self.datasets)
        return f"MixDataset([{kinds}], weights={self.weights}, stop={self.stop!r})"


def _check_source(number: int, source: Any) -> None:
    kind = type(source)
    if isinstance(source, str | bytes | Mapping) or not (
        is_iterable_dataset(source) or hasattr(kind, "__iter__")
    ):
        raise TypeError(
            f"MixDataset mixes iterable datasets (with __iter__ or __aiter__); dataset "
            f"{number} is a {kind.__name__}"
        )


def _source_is_async(source: Any) -> bool:
    return is_iterable_dataset(source) and stream_is_async(source)


def _open_async(source: Any) -> Any:
    return aiter(source) if _source_is_async(source) else iter(source)


def _as_iterator(stream: Any) -> Any:
    """An async iterator as it is; anything else as a sync iterator."""
    return stream if hasattr(stream, "__anext__") else iter(stream)


def _close_sync(iterator: Any) -> None:
    close = getattr(iterator, "close", None)
    if close is not None:
        close()


async def _close_async(iterator: Any) -> None:
    aclose = getattr(iterator, "aclose", None)
    if aclose is not None:
        await aclose()
    else:
        _close_sync(iterator)


def _describe(numbers: list[int], datasets: list[Any]) -> str:
    """``source 1 (Plain)``, or ``sources 1 (Plain), 2 (Lines)``: what a message names."""
    named = ", ".join(f"{n} ({type(datasets[n]).__name__})" for n in numbers)
    return f"source {named}" if len(numbers) == 1 else f"sources {named}"
