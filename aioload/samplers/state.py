"""How the built-in samplers checkpoint themselves: iterations, positions, state checks.

A built-in sampler's ``state_dict()`` holds the generator state (or epoch, or inner state)
from the *start* of its latest iteration and how many keys (or batches) that iteration has
yielded; resuming redraws the iteration and drops what was yielded by slicing (see
:mod:`aioload.samplers` for the whole contract). This module holds the pieces they share:
:class:`SamplerIteration` (one iteration: what replays it and how far it got, counted at no cost
per key), :class:`ResumableSampler` (the base of the built-in key samplers: ``state_dict`` and
``load_state_dict``), and the checks a state goes through before it is loaded (its header,
its fields; a generator's state is checked in :mod:`aioload.samplers.generators`). The
loader's checkpoints (:mod:`aioload.pipeline.checkpoint`) use the same checks.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator, Mapping, Sequence
from itertools import chain
from operator import length_hint
from typing import Any, ClassVar, TypeVar

import numpy as np

from aioload.samplers.base import Sampler

# For the built-in samplers, the samplers sources offer and the loader's checkpoints.
__all__ = [
    "SAMPLER_STATE_VERSION",
    "ResumableSampler",
    "SamplerIteration",
    "check_state_header",
    "is_stateful",
    "plain_json",
    "state_count",
    "state_field",
]

T = TypeVar("T")

SAMPLER_STATE_VERSION = 1
"""The ``"version"`` of a sampler state (:func:`check_state_header` refuses any other).

Bumped when the layout of a ``state_dict()`` changes, so an old state is refused clearly; a
sampler class whose states changed on their own has a version of its own (``_state_version``).
"""


class SamplerIteration:
    """One iteration of a sampler: what regenerates it, how far it got, whether it ended.

    Args:
        start: what replays the iteration (see below).
        count: the items it has yielded already (a resumed iteration's).
        source: the torch generator state it draws from, if torch draws it.

    ``start`` is what the sampler needs to replay the iteration from its beginning (a
    generator state, an epoch, an inner sampler's state); ``rng`` is the generator drawing
    it, once the sampler has it at hand. Keys pass through :meth:`track`,
    which chains blocks of keys in C and reads the position off the current block iterator's
    length hint, so that counting costs nothing per key; batches pass through :meth:`count`.

    Example::

        >>> iteration = SamplerIteration(None, count=2)
        >>> keys = iteration.track([range(2, 4), range(4, 6)])
        >>> next(keys), iteration.position
        (2, 3)
    """

    def __init__(self, start: Any, count: int = 0, source: Any = None) -> None:
        self.start = start
        # The state (a ``get_state()`` tensor) of the torch generator the iteration draws from,
        # at its start, if torch draws it.
        self.source = source
        self.rng: Any = None  # a numpy Generator or a torch one
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
            "source": self.source,
            "rng": self.rng,
            "finished": self.finished,
            "_cursor": (self.position, 0, None),
        }


class ResumableSampler(Sampler[int]):
    """Base of the built-in key samplers: tracks iterations; ``state_dict``/``load_state_dict``.

    A subclass says what starts an iteration (:meth:`_begin`), how to yield its keys after
    skipping those already yielded (:meth:`_keys`), and which fields of its own a state holds
    (:meth:`_state_fields`, :meth:`_load_fields`).

    Example::

        >>> class Evens(ResumableSampler):
        ...     _state_type = "Evens"
        ...     def __len__(self): return 3
        ...     def _keys(self, iteration):
        ...         return iteration.track([range(2 * iteration.position, 6, 2)])
        >>> sampler = Evens()
        >>> sampler.load_state_dict(
        ...     {"type": "Evens", "version": 1, "in_progress": True, "yielded": 1}
        ... )
        >>> list(sampler), list(sampler)
        ([2, 4], [0, 2, 4])
    """

    _state_type: ClassVar[str]
    _state_version: ClassVar[int] = SAMPLER_STATE_VERSION
    # Whether an iteration begins (draws, takes up a loaded state) at its first key rather than
    # at iter(): torch's random samplers are generator functions, its others are not.
    _lazy: ClassVar[bool] = False
    _iteration: SamplerIteration | None = None  # the latest iteration
    _resume: SamplerIteration | None = None  # loaded by ``load_state_dict``, run by the next iter()

    def __iter__(self) -> Iterator[int]:
        if self._lazy:
            # Chained in C: the first key opens the iteration, and no key pays for it.
            return chain.from_iterable(self._opening())
        return self._open()

    def _opening(self) -> Iterator[Iterator[int]]:
        yield self._open()

    def _open(self) -> Iterator[int]:
        """Begins the next iteration (or takes up the loaded one) and returns its keys."""
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
            >>> from aioload import RandomSampler
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
            "version": self._state_version,
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
            >>> from aioload import SequentialSampler
            >>> sampler = SequentialSampler(range(5))
            >>> sampler.load_state_dict(
            ...     {"type": "SequentialSampler", "version": 1, "in_progress": True, "yielded": 3}
            ... )
            >>> list(sampler), list(sampler)
            ([3, 4], [0, 1, 2, 3, 4])
        """
        in_progress, yielded = check_state_header(
            state, self._state_type, "yielded", self._state_version
        )
        if in_progress and yielded > len(self):
            raise ValueError(
                f"{self._state_type} state has yielded={yielded}, more than the {len(self)} "
                "keys an iteration of this sampler has: was it built with the same arguments?"
            )
        start = self._load_fields(state, in_progress)
        self._iteration = None
        self._resume = self._resumed(start, yielded) if in_progress else None

    def _resumed(self, start: Any, yielded: int) -> SamplerIteration:
        """The iteration a loaded in-progress state resumes (``start``: from _load_fields)."""
        return SamplerIteration(start, yielded)

    def _begin(self) -> SamplerIteration:
        """A new iteration, with what replays it from its beginning."""
        return SamplerIteration(None)

    def _keys(self, iteration: SamplerIteration) -> Iterator[int]:
        """The keys of ``iteration`` (started or resumed) after the first ``position``."""
        raise NotImplementedError

    def _state_fields(self, iteration: SamplerIteration | None) -> dict[str, Any]:
        """The fields of a state beyond the common ones (``iteration``: the one in progress)."""
        return {}

    def _load_fields(self, state: Mapping[str, Any], in_progress: bool) -> Any:
        """Check and apply this sampler's own fields; return the resumed iteration's start."""
        return None


def is_stateful(sampler: object) -> bool:
    """Whether ``sampler`` (or a dataset) has callable ``state_dict`` and ``load_state_dict``.

    Args:
        sampler: a sampler, a batch sampler or a stream.

    Example::

        >>> from aioload import SequentialSampler
        >>> is_stateful(SequentialSampler(range(3))), is_stateful(range(3))
        (True, False)
    """
    return callable(getattr(sampler, "state_dict", None)) and callable(
        getattr(sampler, "load_state_dict", None)
    )


def plain_json(value: Any) -> Any:
    """``value`` with numpy arrays and scalars (as in a bit-generator state) made JSON types.

    Args:
        value: a dict, list or tuple (tuples become lists), nested, or a leaf.

    Example::

        >>> plain_json({"state": np.array([1, 2]), "pos": np.uint64(3), "has": (1,)})
        {'state': [1, 2], 'pos': 3, 'has': [1]}
    """
    if isinstance(value, Mapping):
        return {str(key): plain_json(item) for key, item in value.items()}
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, list | tuple):
        return [plain_json(item) for item in value]
    return value


def state_field(
    state: Mapping[str, Any],
    kind: str,
    name: str,
    types: type | tuple[type, ...],
    *,
    optional: bool = False,
) -> Any:
    """``state[name]``, checked to be of ``types`` (or ``None`` if ``optional``).

    A ``bool`` is of ``types`` only if ``bool`` is one of them (it is an ``int`` to Python,
    not to a state).

    Args:
        state: the state (a mapping, from JSON).
        kind: what the state is of, as the error names it.
        name: the field.
        types: the types it may have.
        optional: whether it may be ``None``.

    Raises:
        ValueError: the field is missing or of another type.

    Example::

        >>> state_field({"yielded": True}, "SequentialSampler", "yielded", int)
        Traceback (most recent call last):
        ...
        ValueError: SequentialSampler state field 'yielded' should be int, but got bool
    """
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


def state_count(state: Mapping[str, Any], kind: str, name: str) -> int:
    """``state[name]``, checked to be an ``int >= 0`` (see :func:`state_field`).

    Args:
        state: the state.
        kind: what the state is of, as the error names it.
        name: the field.

    Example::

        >>> state_count({"epoch": -1}, "DistributedSampler", "epoch")
        Traceback (most recent call last):
        ...
        ValueError: DistributedSampler state field 'epoch' should be non-negative, but got -1
    """
    value: int = state_field(state, kind, name, int)
    if value < 0:
        raise ValueError(f"{kind} state field {name!r} should be non-negative, but got {value}")
    return value


def check_state_header(
    state: object, expected: str, count: str, version_read: int = SAMPLER_STATE_VERSION
) -> tuple[bool, int]:
    """Check the fields every sampler state has; return ``in_progress`` and the count.

    Args:
        state: the state (from JSON, perhaps).
        expected: the ``"type"`` it must have (the sampler's class).
        count: the name of its count field (``"yielded"``, ``"batches"``).
        version_read: the ``"version"`` it must have.

    Raises:
        ValueError: not a mapping, another type or version, or a bad field.

    Example::

        >>> check_state_header(
        ...     {"type": "RandomSampler", "version": 1, "in_progress": True, "yielded": 4},
        ...     "RandomSampler",
        ...     "yielded",
        ... )
        (True, 4)
    """
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
    if version != version_read:
        raise ValueError(
            f"{expected} state has version={version!r}, but this aioload reads version "
            f"{version_read}"
        )
    in_progress: bool = state_field(state, expected, "in_progress", bool)
    return in_progress, state_count(state, expected, count)
