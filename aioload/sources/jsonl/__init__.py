"""JSON-lines files: ``JsonLinesDataset``, streamed line by line on the stream engine.

Modules:

- ``dataset``: ``JsonLinesDataset`` (split by rank and worker, resumable, a line that does
  not parse skipped alone under ``on_error="skip"``);
- ``lines``: the lines of a file as its bytes arrive, decompressed.

``JsonLinesDataset`` is exported by :mod:`aioload.sources`.

Before the layout this path was one module (now ``dataset``): its names still resolve
here, on first use, for imports and pickles made then (:mod:`aioload.old_paths`).
"""

from __future__ import annotations

from typing import Any

from aioload.old_paths import old_name


def __getattr__(name: str) -> Any:
    return old_name(__name__, name)
