"""Writing the index files of existing shards: what ``aioload index URL...`` runs.

Shards written by other tools (WebDataset's ``TarWriter``, ``tar`` itself) have no
``<shard>.idx.json``; without one a :class:`~aioload.sources.ShardDataset` reads each such
shard whole to build its index, in every rank and every run. :func:`index_shards` writes
the files once, beside their shards, in the format :class:`~aioload.sources.ShardWriter`
writes (:class:`~aioload.sources.tar.index.ShardIndex`):

- **Resumable**: a shard whose index file is valid (it parses, and its ``shard_size`` is
  the shard's size now) is kept, not read; a damaged or stale one is built again.
  ``overwrite=True`` builds them all.
- **Atomic**: an index is put whole, in one request, once built: an object store's PUT
  replaces the object at once, and a local file is written under a temporary name and
  renamed into place (obstore's local store does so). A run stopped at any point
  (Ctrl-C, a crash) leaves every index file it did not finish absent, never half written.
- **Parallel, bounded**: ``concurrency`` shards are read at once (each a stream of its
  chunks, its headers walked and its bodies stepped over, never held).
- **Each shard on its own**: a shard that is missing or is not a tar archive is recorded
  (:class:`IndexOutcome` with its error) and the others go on; any other failure (access
  denied, an endpoint that does not answer) stops the run, as it would every shard.

Example::

    outcomes = await index_shards(expand_urls("s3://bucket/train-{000..099}.tar"),
                                  storage_options=credentials)
    [o.status for o in outcomes]   # ['written', 'kept', ...]
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

import obstore

from aioload.checks import is_int
from aioload.errors import TarFormatError
from aioload.sources.objects.listing import ObjectListing
from aioload.sources.stores.braces import expand_urls
from aioload.sources.stores.reads import open_read
from aioload.sources.stores.store import StoreLocation, StoreLocations, raise_translated
from aioload.sources.stores.tasks import bounded_gather
from aioload.sources.tar.index import ShardIndexError
from aioload.sources.tar.indexes import put_index, read_index_file
from aioload.sources.tar.reader import tar_compression
from aioload.sources.tar.scan import scan_tar
from aioload.stats.source_counts import SourceCounter
from aioload.urls import redact_url

__all__ = ["DEFAULT_CONCURRENCY", "IndexOutcome", "index_shards", "shard_urls"]

DEFAULT_CONCURRENCY = 16
"""Shards read at once by :func:`index_shards` by default."""

Status = Literal["written", "rebuilt", "kept", "failed"]


@dataclass(frozen=True)
class IndexOutcome:
    """What :func:`index_shards` did with one shard.

    Attributes:
        url: the shard's URL (a password shown as ``***``).
        status: ``"written"`` (it had no index file), ``"rebuilt"`` (its index file was
            damaged or stale, or ``overwrite``), ``"kept"`` (its index file is valid) or
            ``"failed"``.
        samples: the samples its index lists (0 when failed).
        read_bytes: the bytes read from the store to build it (0 when kept).
        error: why it failed (``FileNotFoundError``, ``TarFormatError``), else None.
    """

    url: str
    status: Status
    samples: int = 0
    read_bytes: int = 0
    error: Exception | None = None


async def shard_urls(
    urls: Sequence[str], storage_options: Mapping[str, Any] | None = None
) -> list[str]:
    """The shard URLs that ``urls`` name: each a shard, a brace pattern, or a prefix
    ending in ``/`` whose plain ``.tar`` objects are listed (in the store's order).

    Raises:
        ValueError: a compressed shard named (it cannot have an index: its samples cannot
            be read by byte range), or an unmatched brace.
        FileNotFoundError: a prefix with no ``.tar`` object under it.
    """
    stores = StoreLocations(storage_options)
    found: list[str] = []
    for url in urls:
        if not url.endswith("/"):
            for shard in expand_urls(url):
                if tar_compression(urlsplit(shard).path) != "none":
                    raise ValueError(
                        f"{redact_url(shard)} is a compressed shard: it has no index (its "
                        "samples cannot be read by byte range); index plain .tar shards"
                    )
                found.append(shard)
            continue
        location, path = stores.of(url)
        root = url[: len(url) - len(path)] if path else url
        keys = await ObjectListing(location, path, 1000).collect()
        shards = [root + key for key in keys if key.endswith(".tar")]
        if not shards:
            raise FileNotFoundError(f"no .tar shard under {redact_url(url)}")
        found += shards
    return list(dict.fromkeys(found))  # a shard named twice is indexed once


async def index_shards(
    urls: Sequence[str],
    *,
    overwrite: bool = False,
    concurrency: int = DEFAULT_CONCURRENCY,
    storage_options: Mapping[str, Any] | None = None,
    on_done: Callable[[IndexOutcome], None] | None = None,
) -> list[IndexOutcome]:
    """Writes the index file of every shard in ``urls`` that has no valid one, beside it.

    See the module docstring. Needs write access to the store.

    Args:
        urls: shard URLs (see :func:`shard_urls` for patterns and prefixes).
        overwrite: build every index again, valid or not (after shards were rewritten).
        concurrency: shards read at once (>= 1).
        storage_options: the stores' options, one mapping: ``{"endpoint": ...,
            "region": ...}``, any option of :func:`~aioload.sources.open_store`.
        on_done: called with each shard's outcome as soon as it is known (a progress bar).

    Returns:
        Every shard's :class:`IndexOutcome`, in the order of ``urls``.

    Raises:
        PermissionError, ConnectionError, ...: a failure that is not the shard's own
            (the run stops; the index files written so far are whole and stay).
    """
    if not is_int(concurrency) or concurrency < 1:
        raise ValueError(f"concurrency should be an int >= 1; got {concurrency!r}")
    stores = StoreLocations(storage_options)

    async def one(url: str) -> IndexOutcome:
        outcome = await _index_one(stores, url, overwrite)
        if on_done is not None:
            on_done(outcome)
        return outcome

    # A failure that is not one shard's own is raised as it is, the other reads cancelled.
    return await bounded_gather([functools.partial(one, url) for url in urls], concurrency)


async def _index_one(stores: StoreLocations, url: str, overwrite: bool) -> IndexOutcome:
    location, path = stores.of(url)
    shown = redact_url(url)
    stale = False
    try:
        if not overwrite:
            try:
                index = await read_index_file(location, path, shown)
            except ShardIndexError:
                index, stale = None, True  # damaged or of another version: built again
            if index is not None:
                if index.shard_size == await _size(location, path, shown):
                    return IndexOutcome(shown, "kept", len(index))
                stale = True  # the shard was rewritten since
        counts = SourceCounter()
        _, chunks = await open_read(location, path, shown, counts)
        async with aclosing(chunks):
            index = await scan_tar(chunks, shown)
        await put_index(location, path, shown, index)
    except (FileNotFoundError, TarFormatError) as error:
        return IndexOutcome(shown, "failed", error=error)
    taken = counts.take()
    read = 0 if taken is None else taken.store_bytes
    status: Status = "rebuilt" if stale or overwrite else "written"
    return IndexOutcome(shown, status, len(index), read)


async def _size(location: StoreLocation, path: str, url: str) -> int:
    try:
        meta = await obstore.head_async(location.store, path)
    except Exception as error:
        raise_translated(error, url)
    return int(meta["size"])
