"""The sampler a map-style dataset offers its loader: the ``default_sampler`` protocol.

A ``DataLoader`` given neither ``sampler`` nor ``batch_sampler`` takes its keys from
torch's defaults, ``SequentialSampler(dataset)`` or, with ``shuffle=True``,
``RandomSampler(dataset)``: both need ``len(dataset)`` and index it with ``0 .. len-1``.
A dataset whose keys are not known up front (a bucket listed as it goes) can instead
offer the sampler itself, by defining::

    def default_sampler(self, shuffle: bool, generator) -> sampler | None

- ``shuffle``: the loader's ``shuffle``; the sampler should then give a new random
  order every epoch (what that costs is the dataset's to document);
- ``generator``: the loader's ``generator``, already checked: None, a
  ``numpy.random.Generator`` (an int seed arrives as one) or a ``torch.Generator``;
  draw the order from it, so that a seeded loader is reproducible;
- the result: any sampler the loader accepts (an iterable or async iterable of keys,
  sized or not), or None to take the loader's own default.

The loader batches the offered sampler as it batches any (``batch_size``,
``drop_last``). Without a length ``len(loader)`` raises a ``TypeError`` saying why, and
``max_skipped`` must be a count; a checkpoint of such a sampler is resumed by drawing
and dropping the keys already received (see :meth:`aioload.DataLoader.load_state_dict`),
from its ``state_dict()`` if it has one.

Example::

    class Listed(aioload.Dataset):
        async def __getitem__(self, key): ...
        def default_sampler(self, shuffle, generator):
            return ShuffledKeys(self, generator) if shuffle else ListedKeys(self)

    loader = DataLoader(Listed(...), batch_size=32, shuffle=True)
"""

from __future__ import annotations

from typing import Any

from aioload.samplers.shuffling import Rng

__all__ = ["offered_sampler", "unsized_message"]


def offered_sampler(dataset: Any, shuffle: bool, generator: Rng) -> Any | None:
    """The sampler ``dataset.default_sampler(shuffle, generator)`` offers; None without one.

    Raises:
        TypeError: ``default_sampler`` is not callable, or returned something that is
            not a sampler (neither iterable nor async iterable).
    """
    method = getattr(dataset, "default_sampler", None)
    if method is None:
        return None
    if not callable(method):
        raise TypeError(
            f"{type(dataset).__name__}.default_sampler should be a method "
            f"default_sampler(shuffle, generator) -> sampler; got {method!r:.80}"
        )
    sampler = method(shuffle=shuffle, generator=generator)
    if sampler is not None and not (hasattr(sampler, "__iter__") or hasattr(sampler, "__aiter__")):
        raise TypeError(
            f"{type(dataset).__name__}.default_sampler() should return a sampler (an iterable "
            f"or async iterable of keys) or None; got {sampler!r:.80}"
        )
    return sampler


def unsized_message(dataset: Any, sampler: Any) -> str:
    """Why ``len(loader)`` fails for a dataset whose offered sampler has no length."""
    return (
        f"len() of this DataLoader needs its sampler's length, but the sampler {sampler!r:.120} "
        f"that {type(dataset).__name__}.default_sampler() offered has none (it produces keys "
        "as it goes, such as a listing of a store): count the batches as they come, or give "
        "the dataset its keys up front so that it has a length"
    )
