"""The local cache: what a dataset read from a store, kept on local disk for the next epochs.

Modules:

- ``local``: ``LocalCache`` (streaming, one download per entry) and ``entry_identity``;
- ``folder``: the folder's files, locks and ledger, and the checks that keep it its
  user's own (``CacheFolder``, ``EntryFiles``).

Used by the datasets of :mod:`aioload.sources` (``LocalCache``, ``entry_identity``);
``LocalCache`` is exported by :mod:`aioload.sources`.

Before the layout this path was one module (now ``local``): its names still resolve here,
on first use, for imports and pickles made then (:mod:`aioload.old_paths`).
"""

from __future__ import annotations

from typing import Any

from aioload.old_paths import old_name


def __getattr__(name: str) -> Any:
    return old_name(__name__, name)
