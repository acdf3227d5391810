"""One object per sample: ``ObjectDataset`` over a store's objects, and their listings.

Modules:

- ``dataset``: ``ObjectDataset`` (map-style, async) and ``ObjectListing`` (a store's keys,
  listed as they are read), which the tar index writer and Parquet use too;
- ``listing``: ``ShuffledListing``, a listing collected once and reshuffled every epoch.

The public names are exported by :mod:`aioload.sources`.

Before the layout this path was one module (now ``dataset``): its names still resolve
here, on first use, for imports and pickles made then (:mod:`aioload.old_paths`).
"""

from __future__ import annotations

from typing import Any

from aioload.old_paths import old_name


def __getattr__(name: str) -> Any:
    return old_name(__name__, name)
