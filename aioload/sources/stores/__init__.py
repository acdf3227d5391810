"""Object stores: URLs to obstore stores, their credentials, their errors, and the GET path.

Its one job: reaching a store — which store a URL names (``StoreLocation``, one per store
root in ``StoreLocations``), the credentials it takes and the guard against a metadata
lookup, obstore's errors as built-in exceptions naming the URL, and the one GET path.

Modules:

- ``store``: ``open_store``, ``StoreLocation``, ``StoreLocations``, ``join_key``,
  ``raise_translated``, ``is_transient``, ``DEFAULT_RETRY_CONFIG``;
- ``reads``: ``open_read`` and ``read_bytes``, one GET (whole, from an offset, a range);
- ``hedge``: ``Hedge`` and ``hedged``, a slow GET sent again (``hedge=``), the first answer kept;
- ``budget``: ``RequestBudget``, at most so many GETs a second from every copy of a dataset
  (``max_requests_per_second=``);
- ``credentials``: where a store's credentials come from;
- ``errors``: ``translate``, ``raise_translated``, ``is_transient``;
- ``identity``: ``store_identity``, the settings that tell one store from another;
- ``braces``: ``expand_braces`` and ``expand_urls``, brace patterns as bash expands them;
- ``tasks``: ``bounded_gather`` and ``run_blocking``, many store requests at once, bounded.

Used by every dataset of :mod:`aioload.sources` and by the cache.

Before the layout this path was one module (now ``store``): its names still resolve here,
on first use, for imports and pickles made then (:mod:`aioload.old_paths`).
"""

from __future__ import annotations

from typing import Any

from aioload.old_paths import old_name


def __getattr__(name: str) -> Any:
    return old_name(__name__, name)
