"""WebDataset-style tar shards: ``ShardDataset``, its index files, ``ShardWriter``.

Modules:

- ``dataset``: ``ShardDataset`` (streamed, split by rank and worker, resumable) and
  ``expand_urls``;
- ``reader``: the streaming tar reader (``iter_tar``, ``group_samples``, ``split_name``);
- ``index``: ``ShardIndex``, a shard's samples by byte offset, and its file format
  (``ShardIndexError`` is :class:`aioload.errors.ShardIndexError`);
- ``indexes``: finding the indexes of a dataset's shards (``MissingIndexes``);
- ``index_files``: ``index_shards``, writing the index files of existing shards
  (``aioload index``);
- ``scan``: an index from a shard's bytes; ``reads`` and ``segments``: the ranged reads
  of a resumed or split stream;
- ``writer``: ``ShardWriter``, shards on local disk;
- ``resampled``: the resampled stream (shards drawn with replacement, no end).

The public names are exported by :mod:`aioload.sources`; the command line uses
``index_shards`` and ``split_name``.

Before the layout this path was one module (now ``reader``): its names still resolve
here, on first use, for imports and pickles made then (:mod:`aioload.old_paths`).
"""

from __future__ import annotations

from typing import Any

from aioload.old_paths import old_name


def __getattr__(name: str) -> Any:
    return old_name(__name__, name)
