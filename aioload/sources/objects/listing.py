"""The keys under a store prefix as samplers: listed page by page, or shuffled every epoch.

:class:`ObjectListing` yields the keys as the store's paginated listing returns them
(what ``DataLoader(ObjectDataset(url))`` samples with, and how Parquet datasets and
``aioload index`` list a prefix). :class:`ShuffledListing` collects them once and draws
a new order every epoch: what ``DataLoader(ObjectDataset(url), shuffle=True)`` samples with (through
:meth:`ObjectDataset.default_sampler <aioload.sources.ObjectDataset.default_sampler>`).
A shuffle needs every key before the first one, so the first epoch starts by listing the
whole prefix (one request per ``chunk_size`` keys: a million keys at 1,000 per page is a
thousand round trips) and holds all keys in memory; the list is kept, sorted, for the
sampler's life, and every epoch draws a new permutation of it. Objects added under the
prefix later are not seen: build a new loader for them.

Checkpoints: the state holds the generator's state and, once the keys are collected,
their number and a digest of them; a loader resumed with a listing that no longer gives
those keys fails with a ``ValueError`` instead of resuming at the wrong keys (a state
taken during the first epoch, before the listing was collected, cannot tell: resume that
over an unchanged prefix).
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import Any, Protocol

import numpy as np
import obstore

from aioload.checks import is_integral
from aioload.samplers.builtin import GeneratorLike, as_generator
from aioload.samplers.generators import check_generator_state, seed_from
from aioload.samplers.state import (
    SAMPLER_STATE_VERSION,
    check_state_header,
    plain_json,
    state_field,
)
from aioload.sources.stores.store import StoreLocation, join_key, raise_translated

__all__ = ["ObjectListing", "ShuffledListing"]

_STATE_TYPE = "ShuffledListing"


class ObjectListing:
    """An async sampler of the keys under a prefix, listed lazily, page by page.

    Keys are relative to the dataset's URL, so they index the dataset that made
    the listing. The order is the store's (lexicographic for S3 and GCS).
    Directory markers (keys ending in ``/``) are skipped. Every ``async for``
    lists again.

    Made by :meth:`ObjectDataset.listing`.

    Example::

        listing = dataset.listing()
        loader = DataLoader(dataset, sampler=listing, batch_size=32)
        keys = await listing.collect()      # or all of them at once
    """

    def __init__(self, location: StoreLocation, prefix: str, chunk_size: int) -> None:
        if not is_integral(chunk_size) or chunk_size < 1:
            raise ValueError(f"chunk_size should be a positive int; got {chunk_size!r}")
        self._location = location
        self.prefix = prefix
        self.chunk_size = int(chunk_size)

    async def __aiter__(self) -> AsyncGenerator[str, None]:
        location, prefix = self._location, self.prefix
        # obstore lists whole path segments: list the folder, keep the keys that
        # start with the (possibly partial) last segment.
        folder = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        listed = join_key(location.prefix, folder)
        where = location.describe(listed)
        try:
            stream = obstore.list(location.store, listed or None, chunk_size=self.chunk_size)
            pages = aiter(stream)
        except Exception as error:
            raise_translated(error, where)
        budget = location.budget
        while True:
            if budget is not None:  # a page is a request (the first's turn taken early)
                await budget.acquire()
            try:
                page = await anext(pages)
            except StopAsyncIteration:
                return
            except Exception as error:
                raise_translated(error, where)
            for meta in page:
                key = location.relative(meta["path"])
                if key.startswith(prefix) and not key.endswith("/"):
                    yield key

    async def collect(self) -> list[str]:
        """Every key of the listing, as a list."""
        return [key async for key in self]

    def __repr__(self) -> str:
        location = self._location
        return f"ObjectListing({location.describe(join_key(location.prefix, self.prefix))!r})"


class _Collects(Protocol):
    async def collect(self) -> list[str]: ...


class ShuffledListing:
    """An async sampler of a listing's keys in a new random order every epoch.

    The keys are collected, and sorted, at the first iteration (see the module
    docstring for what that costs) and kept.

    Args:
        listing: an :class:`~aioload.sources.ObjectListing` (anything with an async
            ``collect()`` returning the keys).
        generator: what the permutations are drawn from: a ``numpy.random.Generator``
            (advanced every epoch; the loader's own with ``DataLoader(generator=...)``),
            an int seed, a ``torch.Generator`` or None (one seed drawn from it, or from
            the global state, when the sampler is made).

    Example::

        sampler = ShuffledListing(dataset.listing(), generator=0)
        loader = DataLoader(dataset, sampler=sampler, batch_size=32)
        # the same as DataLoader(dataset, shuffle=True, generator=0, batch_size=32)
    """

    def __init__(self, listing: _Collects, generator: GeneratorLike = None) -> None:
        if not callable(getattr(listing, "collect", None)):
            raise TypeError(f"listing should have an async collect(); got {listing!r}")
        rng = as_generator(generator)
        self.listing = listing
        self._rng = (
            rng if isinstance(rng, np.random.Generator) else np.random.default_rng(seed_from(rng))
        )
        self._keys: list[str] | None = None
        self._digest: str | None = None
        self._expected: tuple[int, str] | None = None  # from a loaded state

    async def keys(self) -> list[str]:
        """Every key of the listing, sorted: collected at the first call, then kept."""
        if self._keys is None:
            keys = sorted(await self.listing.collect())
            digest = _digest(keys)
            self._check(len(keys), digest)
            self._keys, self._digest = keys, digest
        return self._keys

    async def __aiter__(self) -> AsyncIterator[str]:
        keys = await self.keys()
        for position in self._rng.permutation(len(keys)).tolist():
            yield keys[position]

    def state_dict(self) -> dict[str, Any]:
        """The generator's state and, once collected, the keys' count and digest (JSON)."""
        return {
            "type": _STATE_TYPE,
            "version": SAMPLER_STATE_VERSION,
            "in_progress": False,
            "yielded": 0,
            "generator": plain_json(self._rng.bit_generator.state),
            "keys": None if self._keys is None else len(self._keys),
            "digest": self._digest,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores :meth:`state_dict`'s state: the next permutation is the one it led to.

        Raises:
            ValueError: a state of something else, or one whose keys are not this
                listing's (once both are known).
        """
        check_state_header(state, _STATE_TYPE, "yielded")
        generator = state_field(state, _STATE_TYPE, "generator", dict)
        check_generator_state(generator, _STATE_TYPE, self._rng)
        count = state_field(state, _STATE_TYPE, "keys", int, optional=True)
        digest = state_field(state, _STATE_TYPE, "digest", str, optional=True)
        if (count is None) != (digest is None):
            raise ValueError(f"{_STATE_TYPE} state has 'keys' and 'digest' both or neither")
        expected = None if count is None or digest is None else (count, digest)
        if expected is not None and self._keys is not None:
            self._expected = expected
            self._check(len(self._keys), _digest(self._keys))
        self._expected = expected
        self._rng.bit_generator.state = generator

    def _check(self, count: int, digest: str) -> None:
        expected = self._expected
        if expected is not None and expected != (count, digest):
            raise ValueError(
                f"{self.listing!r} now lists {count} keys, not the {expected[0]} keys (or not "
                "the same ones) it listed when the checkpoint was taken: resuming would not "
                "continue the interrupted epoch; start a new one from a fresh loader"
            )

    def __repr__(self) -> str:
        return f"ShuffledListing({self.listing!r})"


def _digest(keys: list[str]) -> str:
    hasher = hashlib.sha256()
    for key in keys:
        hasher.update(key.encode("utf-8", "surrogateescape"))
        hasher.update(b"\x00")
    return hasher.hexdigest()
