"""Finding the indexes of a dataset's shards: their index files, else one read of each shard.

:func:`find_index` reads the index file beside a shard (``<shard>.tar.idx.json``,
checked by :meth:`~aioload.sources.tar.index.ShardIndex.from_json`); a shard without
one is read whole, once, and its index built from its tar headers
(:func:`~aioload.sources.tar.scan.scan_tar`): that costs the shard's full download,
which is why :class:`~aioload.sources.ShardWriter` writes index files, ``aioload index
URL...`` writes them for existing shards (:mod:`aioload.sources.tar.index_files`), and
:meth:`~aioload.sources.ShardDataset.write_indexes` puts the built ones beside their
shards for every later run. :class:`MissingIndexes` warns before the first such read,
naming the command that writes the files. The dataset runs such reads several at once
(:mod:`aioload.sources.stores.tasks`).
"""

from __future__ import annotations

import logging
import shlex
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import aclosing

import obstore

from aioload.sources.stores.braces import brace_pattern
from aioload.sources.stores.store import StoreLocation, raise_translated, translate
from aioload.sources.tar.index import INDEX_SUFFIX, ShardIndex
from aioload.sources.tar.scan import scan_tar
from aioload.urls import redact_url

__all__ = [
    "MissingIndexes",
    "find_index",
    "index_command",
    "put_index",
    "read_index_file",
    "warn_built",
]

logger = logging.getLogger("aioload")


async def read_index_file(location: StoreLocation, path: str, url: str) -> ShardIndex | None:
    """The index file beside the shard at ``path``, checked; None when there is none.

    Args:
        location: the shard's store.
        path: the shard's path in the store.
        url: the shard's URL, for messages (redacted).

    Raises:
        ShardIndexError: the file is not a valid index.
    """
    where = url + INDEX_SUFFIX
    if location.budget is not None:  # a request like any other of the dataset's
        await location.budget.acquire()
    try:
        result = await obstore.get_async(location.store, path + INDEX_SUFFIX)
        data = await result.bytes_async()
    except Exception as error:
        if isinstance(translate(error, where), FileNotFoundError):
            return None
        raise_translated(error, where)
    return ShardIndex.from_json(memoryview(data), where)


async def find_index(
    location: StoreLocation,
    path: str,
    url: str,
    open_shard: Callable[[], AsyncIterator[bytes]],
    *,
    build: bool = False,
    missing: MissingIndexes | None = None,
) -> tuple[ShardIndex, bool]:
    """A shard's index, and whether it was built by reading the shard (no index file).

    Args:
        location: the shard's store.
        path: the shard's path in the store.
        url: the shard's URL, for messages (redacted).
        open_shard: the shard's bytes as an async generator (read only when needed).
        build: build it from the shard even where an index file exists.
        missing: told before the shard is read whole for want of its index file.
    """
    if not build:
        index = await read_index_file(location, path, url)
        if index is not None:
            return index, False
        if missing is not None:
            missing.before_build(url)
    async with aclosing(open_shard()) as chunks:  # type: ignore[type-var]
        return await scan_tar(chunks, url), True


async def put_index(location: StoreLocation, path: str, url: str, index: ShardIndex) -> str:
    """Writes ``index`` beside the shard at ``path``; returns the file's URL."""
    where = url + INDEX_SUFFIX
    try:
        await obstore.put_async(location.store, path + INDEX_SUFFIX, index.to_json())
    except Exception as error:
        raise_translated(error, where)
    return where


def index_command(urls: Sequence[str]) -> str:
    """The ``aioload index`` command line that writes the index files of shards ``urls``.

    Their brace pattern when they are a numbered run, else their folder (``aioload index``
    lists a prefix's shards), else the first of them; passwords shown as ``***``.

    Example::

        >>> index_command(["s3://b/train-0.tar", "s3://b/train-1.tar"])
        "aioload index 's3://b/train-{0..1}.tar'"
    """
    shown = [redact_url(url) for url in urls]
    named = brace_pattern(shown)
    if named is None:
        folders = {url.rpartition("/")[0] for url in shown}
        named = f"{folders.pop()}/" if len(folders) == 1 else f"{shown[0]} ..."
    return f"aioload index {shlex.quote(named) if ' ' not in named else named}"


class MissingIndexes:
    """Warns once, before the first shard of ``urls`` read whole for want of its index
    file (logger ``aioload``), naming the command that writes the files
    (:func:`index_command`). Safe to share between loops and threads.

    Example::

        missing = MissingIndexes(dataset.urls)
        index, built = await find_index(location, path, url, stream, missing=missing)
    """

    def __init__(self, urls: Sequence[str]) -> None:
        self._urls = list(urls)
        self._lock = threading.Lock()
        self.warned = False

    def before_build(self, url: str) -> None:
        """Shard ``url`` has no index file and is about to be read whole."""
        with self._lock:
            if self.warned:
                return
            self.warned = True
        logger.warning(
            "%s has no index file (%s): reading it whole to build its index, as every "
            "shard without one is read, in every rank and worker, each run (the split of "
            "samples between ranks needs the indexes). Write the index files once: %s",
            url,
            url.rpartition("/")[2] + INDEX_SUFFIX,
            index_command(self._urls),
        )


def warn_built(built: Sequence[str], total: int, urls: Sequence[str] = ()) -> None:
    """Logs, once per load, that shards were read whole for want of an index file."""
    if built:
        logger.warning(
            "%d of %d shards have no index file (%s%s): their indexes were built by reading "
            "them whole; write the index files once (%s, await dataset.write_indexes(), or "
            "ShardWriter, which writes them) so that ranks and workers read those instead",
            len(built),
            total,
            built[0],
            ", ..." if len(built) > 1 else "",
            index_command(urls or built),
        )
