"""Observability: what a loader has done and where it stands, and the progress bar.

Modules:

- ``recorder``: ``LoaderStats``, ``IterationStats`` (what ``DataLoader.stats()`` returns)
  and the ``EpochRecorder`` the pipeline and the backends write to;
- ``source_counts``: ``SourceCounter`` / ``SourceCounts``, what a dataset counts of its
  reads (cache hits, bytes from the store);
- ``throttles``: the process's count of reads a store throttled (503, 429), which
  ``concurrency="auto"`` backs off on;
- ``measure``: the bytes and length of a batch, cheaply;
- ``progress``: ``progress(loader)``, a tqdm bar (tqdm imported on first use).

Used by the pipeline and the backends (``EpochRecorder``), the reader and the sources
(``SourceCounter``, ``SourceCounts``). The public names are exported by :mod:`aioload`.

Before the layout this path was one module (now ``recorder``): its names still resolve
here, on first use, for imports and pickles made then (:mod:`aioload.old_paths`).
"""

from __future__ import annotations

from typing import Any

from aioload.old_paths import old_name


def __getattr__(name: str) -> Any:
    return old_name(__name__, name)
