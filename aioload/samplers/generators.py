"""Generator states in sampler checkpoints: numpy's bit generators and ``torch.Generator``.

A built-in sampler's state carries its generator's state from the start of its latest
iteration, as plain JSON: a numpy bit generator's ``state`` dict, or a ``torch.Generator``'s
byte state as a list of ints. This module reads and writes both, checks a state before a
generator takes it, and draws the seeds torch would (:func:`torch_seed`, :func:`global_seed`).
The samplers (:mod:`aioload.samplers.state`), the listing shuffle of
:mod:`aioload.sources.objects` and the loader's checkpoints use it.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from aioload.checks import is_int

__all__ = [
    "TORCH_GENERATOR",
    "TorchGeneratorLike",
    "check_generator_state",
    "check_torch_generator_state",
    "global_seed",
    "is_torch_generator",
    "seed_from",
    "set_torch_generator_state",
    "torch_generator_state",
    "torch_seed",
    "torch_state_json",
    "torch_state_tensor",
]

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
        >>> check_generator_state(rng.bit_generator.state, "RandomSampler", rng)
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
