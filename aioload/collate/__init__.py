"""Collation: torch's batching rules, with numpy arrays as the leaves.

Modules:

- ``core``: ``default_collate``, ``collate``, ``default_convert``, ``collate_into``;
- ``fns``: the type-to-function registry (``default_collate_fn_map``) and its functions;
- ``errors``: the errors that name the field, the entry and its key (``name_keys``;
  ``CollateTypeError`` is :class:`aioload.errors.CollateTypeError`);
- ``streamed``: ``collate_as_read``, a batch of large arrays stacked sample by sample as it
  is read (``default_collate``'s result, with each sample copied while still in the cache).

Used by the reader (``default_collate``, ``name_keys``), the workers (``collate_into``,
``collate_as_read``),
the pin stage and ``ArrowRows``. The public names are exported by :mod:`aioload`.

Before the layout this path was one module (now ``core``): its names still resolve here,
on first use, for imports and pickles made then (:mod:`aioload.old_paths`).
"""

from __future__ import annotations

from typing import Any

from aioload.old_paths import old_name


def __getattr__(name: str) -> Any:
    return old_name(__name__, name)
