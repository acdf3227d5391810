"""Parquet files: ``ParquetDataset`` (map-style, by row) and ``IterableParquetDataset``.

Its modules need pyarrow (``pip install 'aioload-data[parquet]'``): nothing is imported
with the package.

Modules:

- ``dataset``: ``ParquetDataset``, map-style by global row, with ``row_group_cache``;
- ``iterable``: ``IterableParquetDataset``, streamed by row group on the stream engine,
  through ``stream`` (``RowStream``: read-ahead, a columnar shuffle buffer) and ``state``;
  ``early``: its first reads, started while the footers arrive;
- ``files``: what both share: listing, footers, row groups numbered across the files;
- ``footer``: a file's footer, read with one suffix GET and checked;
- ``read``: ranged GETs of the column chunks of some row groups;
- ``arrow_rows``: ``ArrowRows``, a row block over a ``pyarrow.Table``.

The public names are exported by :mod:`aioload.sources` (imported on first use).

Before the layout this path was one module (now ``dataset``): its names still resolve
here, on first use, for imports and pickles made then (:mod:`aioload.old_paths`).
"""

from __future__ import annotations

from typing import Any

from aioload.old_paths import old_name


def __getattr__(name: str) -> Any:
    return old_name(__name__, name)
