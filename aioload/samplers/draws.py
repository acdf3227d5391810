"""Torch's own draws, for the samplers and ``random_split``: the keys torch would give.

Where a run's randomness comes from torch — a ``torch.Generator`` the user passed, or, without a
generator, torch's default generator once torch is imported (``torch.manual_seed``) — the
built-in samplers and :func:`~aioload.random_split` draw with the very calls torch's own make
(``torch.randperm``, ``torch.randint`` in blocks of 32, ``torch.multinomial``), so the same seed
gives the same keys as under torch. torch is never imported here: these functions are called only
where a torch object exists, so ``sys.modules`` holds it.

:func:`seeded_randperm` is the one draw that needs no torch: ``torch.randperm(n)`` from a
``torch.Generator().manual_seed(seed)``, as :class:`~aioload.DistributedSampler` draws its
shuffle. With torch imported it asks torch; without, it replays torch's CPU algorithm (its
Mersenne Twister, seeded as ``manual_seed`` seeds it, and its Fisher-Yates swaps) with numpy, so a
process without torch gets the same order as one with it (about 0.6 s a million keys, where torch
takes 0.07 s; torch only, from 214,748,364 keys).
"""

from __future__ import annotations

import sys
from typing import Any, cast

import numpy as np
import numpy.typing as npt

__all__ = [
    "TORCH_BLOCK",
    "default_generator",
    "multinomial",
    "randint",
    "randperm",
    "scratch_generator",
    "seeded_generator",
    "seeded_randperm",
    "torch_is_imported",
]

#: torch's ``RandomSampler`` draws keys with replacement in blocks of this many.
TORCH_BLOCK = 32


def torch_is_imported() -> bool:
    """Whether torch is imported (so its default generator is the global random state)."""
    return sys.modules.get("torch") is not None


def _torch() -> Any:
    return sys.modules["torch"]


def default_generator() -> Any:
    """torch's default generator: what ``torch.manual_seed`` seeds."""
    return _torch().default_generator


def scratch_generator(state: Any) -> Any:
    """A new CPU ``torch.Generator`` set to ``state`` (a ``get_state()`` tensor)."""
    generator = _torch().Generator()
    generator.set_state(state)
    return generator


def seeded_generator(seed: int) -> Any:
    """``torch.Generator().manual_seed(seed)``."""
    return _torch().Generator().manual_seed(seed)


def randperm(n: int, generator: Any) -> list[int]:
    """``torch.randperm(n, generator=generator)`` as a list."""
    keys: list[int] = _torch().randperm(n, generator=generator).tolist()
    return keys


def randint(high: int, size: int, generator: Any) -> list[int]:
    """``torch.randint(high, (size,), dtype=torch.int64, generator=generator)`` as a list."""
    torch = _torch()
    keys: list[int] = torch.randint(
        high=high, size=(size,), dtype=torch.int64, generator=generator
    ).tolist()
    return keys


def multinomial(
    weights: npt.NDArray[np.float64], count: int, replacement: bool, generator: Any
) -> list[int]:
    """``torch.multinomial`` of the float64 ``weights``, as torch's ``WeightedRandomSampler``."""
    torch = _torch()
    tensor = torch.as_tensor(weights, dtype=torch.double)
    keys: list[int] = torch.multinomial(tensor, count, replacement, generator=generator).tolist()
    return keys


# torch's CPU randperm swaps with ``random() % (n - i)`` below this size (and draws 64-bit numbers
# above it, which only torch itself replays here).
_SMALL_PERMUTATION = (2**32 - 1) // 20


def seeded_randperm(seed: int, n: int) -> list[int]:
    """``torch.randperm(n, generator=torch.Generator().manual_seed(seed))``, with or without torch.

    Args:
        seed: the seed (a non-negative int; as torch, only its low 32 bits count).
        n: the permutation's length; without torch imported, below 214,748,364.

    Raises:
        ValueError: ``n`` is that large and torch is not imported.

    Example:
        >>> seeded_randperm(0, 6)
        [2, 5, 3, 0, 1, 4]
    """
    if torch_is_imported():
        return randperm(n, seeded_generator(seed))
    if n >= _SMALL_PERMUTATION:
        raise ValueError(
            f"shuffling {n} keys as torch does needs torch for {_SMALL_PERMUTATION} keys or "
            "more: import torch before iterating"
        )
    keys = list(range(n))
    if n < 2:
        return keys
    # torch seeds its Mersenne Twister with the seed's low 32 bits, as numpy's legacy seeding.
    twister = np.random.MT19937()
    twister.state = cast(Any, np.random.RandomState(seed & 0xFFFFFFFF).get_state(legacy=False))
    first = np.arange(n - 1, dtype=np.uint64)
    targets = (twister.random_raw(n - 1) % (np.uint64(n) - first) + first).tolist()
    for i, j in enumerate(targets):  # sequential by nature: each swap sees the ones before
        keys[i], keys[j] = keys[j], keys[i]
    return keys
