"""Samplers: which keys to load, in what order, in what batches — torch's, draw for draw.

Modules:

- ``builtin``: the public samplers (``SequentialSampler``, ``RandomSampler``,
  ``SubsetRandomSampler``, ``WeightedRandomSampler``, and ``BatchSampler``,
  ``DistributedSampler``, ``Sampler`` from the modules below);
- ``base``: ``Sampler`` and ``is_async_sampler``;
- ``batch``: ``BatchSampler``; ``distributed``: ``DistributedSampler``;
- ``shuffling``: ``Rng`` and the base of the random samplers;
- ``draws``: torch's own draws (``randperm``, ``multinomial``), without torch;
- ``state``: how the samplers checkpoint themselves;
- ``generators``: generator states in checkpoints (numpy's and ``torch.Generator``'s);
- ``offered``: the sampler a dataset offers its loader (``default_sampler``).

Used by the pipeline (``BatchSampler``, ``RandomSampler``, ``Rng``, ``offered_sampler``),
the datasets (``random_split``'s generator) and ``ObjectListing``. The public names are
exported by :mod:`aioload`.

Before the layout this path was one module (now ``builtin``): its names still resolve
here, on first use, for imports and pickles made then (:mod:`aioload.old_paths`).
"""

from __future__ import annotations

from typing import Any

from aioload.old_paths import old_name


def __getattr__(name: str) -> Any:
    return old_name(__name__, name)
