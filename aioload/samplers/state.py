"""How the built-in samplers checkpoint themselves: iterations, positions, state checks.

A built-in sampler's ``state_dict()`` holds the generator state (or epoch, or inner state)
from the *start* of its latest iteration and how many keys (or batches) that iteration has
yielded; resuming redraws the iteration and drops what was yielded by slicing (see
:mod:`aioload.samplers` for the whole contract). This module holds the pieces they share:
:class:`SamplerIteration` (one iteration: what replays it and how far it got, counted at no cost
per key), :class:`ResumableSampler` (the base of the built-in key samplers: ``state_dict`` and
``load_state_dict``), and the checks a state goes through before it is loaded (its header,
its fields, a bit-generator state). The loader's checkpoints
(:mod:`aioload.pipeline.checkpoint`) use the same checks.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator, Mapping, Sequence
from itertools import chain
from operator import length_hint
from typing import Any, ClassVar, Protocol, TypeVar

import numpy as np

from aioload.checks import is_int
from aioload.samplers.base import Sampler

# For the built-in samplers, the samplers sources offer and the loader's checkpoints; only
# ``TorchGeneratorLike`` (``torch.Generator`` in type hints) is for users.
__all__ = [
    "SAMPLER_STATE_VERSION",
    "TORCH_GENERATOR",
    "ResumableSampler",
    "SamplerIteration",
    "TorchGeneratorLike",
    "check_generator_state",
    "check_state_header",
    "check_torch_generator_state",
    "global_seed",
    "is_stateful",
    "is_torch_generator",
    "plain_json",
    "seed_from",
    "set_torch_generator_state",
    "state_count",
    "state_field",
    "torch_generator_state",
    "torch_seed",
    "torch_state_json",
    "torch_state_tensor",
]

T = TypeVar("T")

SAMPLER_STATE_VERSION = 1
"""The ``"version"`` of a sampler state (:func:`check_state_header` refuses any other).

Bumped when the layout of a ``state_dict()`` changes, so an old state is refused clearly; a
sampler class whose states changed on their own has a version of its own (``_state_version``).
"""
# The numpy bit generators whose state a sampler state may carry.
_BIT_GENERATORS = ("MT19937", "PCG64", "PCG64DXSM", "Philox", "SFC64")
TORCH_GENERATOR = "torch.Generator"
"""What a state calls a torch generator's state (``{"bit_generator": ..., "state": [bytes]}``)."""


class TorchGeneratorLike(Protocol):
    """What aioload uses of a ``torch.Generator`` (torch itself is never imported for it)."""

    def get_state(self) -> Any: ...

    def set_state(self, new_state: Any, /) -> Any: ...


def is_torch_generator(obj: object) -> bool:
    """Whether ``obj`` is a ``torch.Generator`` (asked of torch only if someone imported it).

    Args:
        obj: a ``generator`` argument.

    Example::

        >>> is_torch_generator(np.random.default_rng(0))
        False
    """
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Generator)


def torch_seed(generator: Any = None) -> int:
    """torch's own seed draw: one int64 from ``generator`` (None: torch's default generator).

    The draw torch's loader makes for its base seed and its ``RandomSampler`` makes without a
    generator, so a ``torch.Generator`` (or ``torch.manual_seed``) advances as under torch.
    Only called once torch is imported.

    Args:
        generator: a ``torch.Generator``, or None for torch's default one.

    Example::

        seed = torch_seed(torch.Generator().manual_seed(0))
    """
    torch = sys.modules["torch"]
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())


def global_seed() -> int:
    """A seed from the process's global random state, for a ``generator=None``.

    torch's default generator when torch is imported (what torch draws from, so
    ``torch.manual_seed(0)`` reproduces a run), else numpy's legacy global state (so
    ``np.random.seed(0)`` does).

    Example::

        >>> 0 <= global_seed() < 2**63
        True
    """
    if sys.modules.get("torch") is not None:
        return torch_seed()
    return int(np.random.randint(np.iinfo(np.int64).max, dtype=np.int64))


def seed_from(generator: Any) -> int:
    """One seed drawn from a ``torch.Generator``, or from the global state for None.

    Args:
        generator: a ``torch.Generator`` or None (a numpy ``Generator`` draws its own).

    Example::

        >>> isinstance(seed_from(None), int)
        True
    """
    return global_seed() if generator is None else torch_seed(generator)


def torch_generator_state(generator: Any) -> dict[str, Any]:
    """A torch generator's state as JSON: its state bytes as a list of ints.

    Args:
        generator: a ``torch.Generator``.

    Example::

        state = torch_generator_state(torch.Generator().manual_seed(0))
        state["bit_generator"]  # "torch.Generator"
    """
    return torch_state_json(generator.get_state())


def torch_state_json(state: Any) -> dict[str, Any]:
    """A torch generator state (a ``get_state()`` tensor) as JSON.

    Args:
        state: what ``torch.Generator.get_state()`` returned.

    Example::

        >>> torch_state_json(np.array([1, 2], dtype=np.uint8))  # any array with tolist()
        {'bit_generator': 'torch.Generator', 'state': [1, 2]}
    """
    return {"bit_generator": TORCH_GENERATOR, "state": state.tolist()}


def torch_state_tensor(raw: list[int]) -> Any:
    """The ``get_state()`` tensor of state bytes checked by :func:`check_torch_generator_state`.

    Args:
        raw: the state bytes, as ints.

    Example::

        generator.set_state(torch_state_tensor(check_torch_generator_state(state, kind, field)))
    """
    torch = sys.modules["torch"]
    return torch.tensor(raw, dtype=torch.uint8)


def check_torch_generator_state(state: object, kind: str, field: str) -> list[int]:
    """The state bytes of a torch generator state, checked against a scratch generator.

    Args:
        state: the field's value, from :func:`torch_state_json` (through JSON).
        kind: what the state is of, as the error names it (``"RandomSampler"``).
        field: the state's field that holds it.

    Raises:
        ValueError: ``state`` is not a torch generator state, or torch refuses its bytes.

    Example::

        >>> check_torch_generator_state([], "RandomSampler", "g")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: RandomSampler state field 'g' should be a torch.Generator state ...
    """
    raw = state.get("state") if isinstance(state, Mapping) else None
    if (
        not isinstance(state, Mapping)
        or state.get("bit_generator") != TORCH_GENERATOR
        or not isinstance(raw, list)
        or not all(is_int(b) and 0 <= b < 256 for b in raw)
    ):
        raise ValueError(
            f"{kind} state field {field!r} should be a torch.Generator state "
            f'({{"bit_generator": "{TORCH_GENERATOR}", "state": [bytes as ints]}}), but got '
            f"{state!r:.100}"
        )
    torch = sys.modules["torch"]
    try:
        torch.Generator().set_state(torch.tensor(raw, dtype=torch.uint8))
    except (RuntimeError, ValueError, TypeError) as exc:
        raise ValueError(
            f"{kind} state field {field!r} is not a valid torch.Generator state: {exc}"
        ) from exc
    return raw


def set_torch_generator_state(generator: Any, raw: list[int]) -> None:
    """Set ``generator``'s state to the state bytes ``raw``.

    Args:
        generator: a ``torch.Generator``.
        raw: bytes from :func:`check_torch_generator_state`.

    Example::

        set_torch_generator_state(generator, check_torch_generator_state(state, kind, field))
    """
    generator.set_state(torch_state_tensor(raw))


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


def check_generator_state(
    state: Mapping[str, Any], kind: str, generator: np.random.Generator | None
) -> None:
    """Check that ``state`` is a bit-generator state that ``generator`` (if any) can take.

    Args:
        state: the state's ``"generator"`` field.
        kind: what the state is of, as the error names it.
        generator: the sampler's generator (None: it has none; any bit generator will do).

    Raises:
        ValueError: not a state of a numpy bit generator, of another one than ``generator``'s,
            or one numpy refuses.

    Example::

        >>> rng = np.random.default_rng(0)
        >>> check_generator_state(plain_json(rng.bit_generator.state), "RandomSampler", rng)
        >>> check_generator_state({"bit_generator": "MT19937"}, "R", rng)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: R state holds a MT19937 generator state, but this sampler's generator ...
    """
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
