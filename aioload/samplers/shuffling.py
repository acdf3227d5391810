"""The base of the random samplers: torch's draws where torch has the randomness, numpy's
elsewhere, and the states that replay an iteration (see :mod:`aioload.samplers`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeAlias, cast

import numpy as np

from aioload.samplers.draws import default_generator, scratch_generator, torch_is_imported
from aioload.samplers.generators import (
    TorchGeneratorLike,
    check_generator_state,
    check_torch_generator_state,
    global_seed,
    is_torch_generator,
    set_torch_generator_state,
    torch_state_json,
    torch_state_tensor,
)
from aioload.samplers.state import ResumableSampler, SamplerIteration, plain_json, state_field

__all__ = ["Rng", "Shuffling"]

Rng: TypeAlias = np.random.Generator | TorchGeneratorLike | None
"""A ``generator`` once checked: ``None``, a numpy ``Generator`` or a ``torch.Generator``."""


class Shuffling(ResumableSampler):
    """A :class:`ResumableSampler` whose keys are random, drawn as torch draws them where torch
    has the randomness, with numpy otherwise.

    An iteration begins at its first key (torch's random samplers are generator functions). It
    draws with torch's own calls (see :mod:`aioload.samplers.draws`) from the sampler's
    ``torch.Generator``, or, for a sampler without a generator, from torch's default generator
    when torch is imported by then; else with numpy, from the sampler's numpy ``Generator`` or
    from one seeded by numpy's legacy global state. What replays an iteration is in its state:

    - ``"generator"``: the numpy bit-generator state the iteration in progress started from
      (between iterations, a numpy ``Generator``'s current state); None otherwise;
    - ``"torch_generator"``: the state of the torch generator the iteration in progress draws
      from, at its start (the sampler's own, or torch's default generator); between iterations,
      the sampler's ``torch.Generator``'s current state; None otherwise.

    A resumed iteration redraws from that state: with the sampler's own generator, which then
    ends where it would have, or with a scratch one (the global states are never set).
    """

    generator: Rng
    _lazy = True
    _state_version = 2  # 2: torch's draws for a torch generator (1 drew with numpy from a seed)
    _loaded_source: Any = None  # the torch state a loaded in-progress state resumes from

    def _begin(self) -> SamplerIteration:
        generator = self.generator
        if isinstance(generator, np.random.Generator):
            iteration = SamplerIteration(generator.bit_generator.state)
            iteration.rng = generator
            return iteration
        if generator is None and torch_is_imported():
            generator = default_generator()
        if generator is not None:
            iteration = SamplerIteration(None, source=generator.get_state())
            iteration.rng = generator
            return iteration
        rng = np.random.default_rng(global_seed())
        iteration = SamplerIteration(rng.bit_generator.state)
        iteration.rng = rng
        return iteration

    def _rng_of(self, iteration: SamplerIteration) -> Any:
        """What draws ``iteration``: a numpy Generator or a torch one, set back to its start if
        resumed."""
        if iteration.rng is None:
            generator = self.generator
            if iteration.source is not None:
                if generator is None:
                    iteration.rng = scratch_generator(iteration.source)
                else:
                    cast(TorchGeneratorLike, generator).set_state(iteration.source)
                    iteration.rng = generator
                return iteration.rng
            start = iteration.start
            if isinstance(generator, np.random.Generator):
                rng = generator
            else:
                rng = np.random.Generator(getattr(np.random, start["bit_generator"])())
            rng.bit_generator.state = start
            iteration.rng = rng
        return iteration.rng

    def _state_fields(self, iteration: SamplerIteration | None) -> dict[str, Any]:
        generator = self.generator
        numpy_state = torch_state = None
        if iteration is not None:
            numpy_state, torch_state = iteration.start, iteration.source
        elif isinstance(generator, np.random.Generator):
            numpy_state = generator.bit_generator.state
        elif generator is not None:
            torch_state = generator.get_state()
        return {
            "generator": plain_json(numpy_state),
            "torch_generator": None if torch_state is None else torch_state_json(torch_state),
        }

    def _load_fields(self, state: Mapping[str, Any], in_progress: bool) -> Any:
        kind = self._state_type
        generator = state_field(state, kind, "generator", dict, optional=True)
        theirs = state_field(state, kind, "torch_generator", dict, optional=True)
        own = self.generator
        has = "a numpy Generator" if isinstance(own, np.random.Generator) else "a torch.Generator"
        mine = "generator=None" if own is None else f"{has} as generator"
        if generator is not None and not isinstance(own, np.random.Generator | None):
            raise ValueError(
                f"{kind} state holds a numpy generator state, but this sampler has {mine}: "
                "build it with the same arguments"
            )
        if theirs is not None and isinstance(own, np.random.Generator):
            raise ValueError(
                f"{kind} state holds a torch.Generator state, but this sampler has {mine}: "
                "build it with the same arguments"
            )
        if theirs is None and is_torch_generator(own):
            raise ValueError(
                f"{kind} state has no 'torch_generator' (its sampler had no torch.Generator), "
                "but this sampler has one: build it with the same arguments"
            )
        if generator is None and isinstance(own, np.random.Generator):
            raise ValueError(
                f"{kind} state has generator=None (its sampler had no numpy generator), but "
                "this sampler has one: build it with the same arguments"
            )
        if own is None and not in_progress and (generator is not None or theirs is not None):
            raise ValueError(
                f"{kind} state has a generator state, but this sampler has generator=None: "
                "build it with the same arguments"
            )
        if own is None and in_progress and (generator is None) == (theirs is None):
            raise ValueError(
                f"{kind} state is in progress but has "
                + ("neither" if generator is None else "both")
                + " a 'generator' and a 'torch_generator' state: an iteration in progress "
                "needs the one generator state it started from"
            )
        self._loaded_source = None
        if theirs is not None:
            if not torch_is_imported():
                raise ValueError(
                    f"{kind} state was drawn from torch's default generator: import torch "
                    "before loading it"
                )
            raw = check_torch_generator_state(theirs, kind, "torch_generator")
            if not in_progress:
                set_torch_generator_state(own, raw)
                return None
            self._loaded_source = torch_state_tensor(raw)
            return None
        if generator is None:
            return None
        numpy_own = own if isinstance(own, np.random.Generator) else None
        check_generator_state(generator, kind, numpy_own)
        if not in_progress and numpy_own is not None:
            numpy_own.bit_generator.state = generator
        return generator

    def _resumed(self, start: Any, yielded: int) -> SamplerIteration:
        source, self._loaded_source = self._loaded_source, None
        return SamplerIteration(start, yielded, source=source)
