"""ParquetDataset: a map-style async dataset over the rows of Parquet files in a store.

Row ``i`` is the ``i``-th row of the files taken in order (their row groups, in order):
the footers give every row group's row count, so a global row number finds its file and
row group by a binary search, and every sampler of the loader — ``shuffle=True``,
:class:`~aioload.DistributedSampler`, :class:`~aioload.WeightedRandomSampler`, checkpoint
and resume — works unchanged.

A batch (``__getitems__``, which the loader calls with a batch's rows) groups its rows by
row group, reads each row group it needs once — only the requested columns, with ranged
GETs, several at once — and returns an :class:`~aioload.sources.parquet.arrow_rows.ArrowRows`
block: ``default_collate`` makes a dict of numpy arrays of it straight from Arrow, and a
``collate_fn`` of yours gets the rows as a list of dicts (see
:mod:`aioload.data.row_block`). Decoded row groups are kept in memory up to
``row_group_cache`` bytes per process
(:class:`~aioload.sources.parquet.row_group_cache.RowGroupCache`),
so a shuffled epoch over data that fits reads every row group once; over more, a
shuffle reads row groups again and again (use :class:`~aioload.sources.IterableParquetDataset`
for a stream that reads each once).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from aioload.checks import is_integral
from aioload.data.datasets import Dataset
from aioload.sources.parquet.arrow_rows import ArrowRows, take_rows
from aioload.sources.parquet.files import ParquetFiles
from aioload.sources.parquet.row_group_cache import RowGroupCache
from aioload.sources.sizes import parse_size
from aioload.sources.stores.reads import CountedReads
from aioload.urls import redact_url

__all__ = ["ParquetDataset"]

Rows = np.ndarray[Any, Any]

DEFAULT_ROW_GROUP_CACHE = 256 << 20
"""Bytes of decoded row groups a ParquetDataset keeps per process, by default."""


class ParquetDataset(CountedReads, Dataset[Any]):
    """Rows of Parquet files by global row number, read a batch at a time (map-style).

    Args:
        urls_or_prefix: the files: a list of URLs, one URL with a brace pattern
            (``"s3://bucket/train-{000..099}.parquet"``), or a prefix ending in ``/``
            whose ``.parquet`` objects are listed (sorted). Any store
            :func:`~aioload.sources.open_store` reaches: ``s3://``, ``gs://``, ``az://``,
            ``http(s)://``, ``file://``.
        columns: the columns to read, in this order (None: every column). Only their
            column chunks are fetched.
        row_group_cache: the most bytes of decoded row groups kept in memory per
            process: an int or a size such as ``"1GiB"`` (0: none kept).
        cache_dir: a local folder that keeps every byte range read (footers, column
            chunks), so that later epochs read them from disk (shared by workers and
            processes; see :class:`~aioload.sources.LocalCache`). Default: no cache.
        cache_limit: the most bytes the disk cache takes (``"50GB"``).
        storage_options: the stores' options, one mapping: ``{"endpoint": ...,
            "region": ...}``, any option of :func:`~aioload.sources.open_store`
            (default: from the environment).
        hedge: send a read again when it is slow, and take the first answer (see
            :mod:`aioload.sources.stores.hedge`): True, after the 95th percentile of
            the store's recent reads; a float, after that many seconds; False (the
            default), never. At most about five hedges per hundred reads.
        max_requests_per_second: the most GET requests a second the dataset sends, all
            its copies in the loader's worker processes together (see
            :mod:`aioload.sources.stores.budget`). Default: no limit.

    The footers are read on first need — ``len(dataset)``, which the loader's samplers
    call, or ``await dataset.load()`` — and travel to worker processes with the
    dataset. A row is a dict of column name to value; what a value is for each Arrow
    type is in :mod:`aioload.sources.parquet.arrow_rows` (numbers as numpy scalars, strings as
    ``str``, lists of numbers as arrays).

    Raises (on first read):
        ParquetFormatError: a file that is truncated, not Parquet, whose footer does not
            describe it, or whose data does not decode (the message names the file and
            row group). A footer that cannot be read fails the dataset under any fault
            policy (its length counts every file's rows, and a sampler's indices are
            drawn before any read); ``IterableParquetDataset`` skips such a file under
            ``on_error="skip"``.
        KeyError: a column that a file does not have.

    Example::

        >>> import os, tempfile
        >>> from pathlib import Path
        >>> import numpy as np
        >>> import pyarrow as pa
        >>> import pyarrow.parquet as pq
        >>> from aioload import DataLoader
        >>> folder = tempfile.TemporaryDirectory()
        >>> table = pa.table({"text": [f"row {i}" for i in range(1000)], "label": np.arange(1000)})
        >>> pq.write_table(table, os.path.join(folder.name, "part-0.parquet"), row_group_size=250)
        >>> dataset = ParquetDataset(Path(folder.name).as_uri() + "/", columns=["text", "label"])
        >>> loader = DataLoader(dataset, batch_size=256, shuffle=True, generator=0)
        >>> for batch in loader:
        ...     labels, texts = batch["label"], batch["text"]   # a numpy array, a list of str
        >>> len(dataset), len(loader), labels.shape, type(texts[0]).__name__
        (1000, 4, (232,), 'str')
        >>> folder.cleanup()
    """

    def __init__(
        self,
        urls_or_prefix: str | Sequence[str],
        columns: Sequence[str] | None = None,
        *,
        row_group_cache: int | str = DEFAULT_ROW_GROUP_CACHE,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | str | None = None,
        storage_options: Mapping[str, Any] | None = None,
        hedge: bool | float = False,
        max_requests_per_second: float | None = None,
    ) -> None:
        self.files = ParquetFiles(
            urls_or_prefix,
            columns,
            cache_dir,
            cache_limit,
            storage_options,
            hedge=hedge,
            max_requests_per_second=max_requests_per_second,
        )
        self._counts = self.files.counts  # what the files read is what this dataset read
        keep = (
            0
            if row_group_cache == 0 and not isinstance(row_group_cache, bool)
            else parse_size(row_group_cache, "row_group_cache")
        )
        self._row_groups = RowGroupCache(self.files.read, keep)

    @property
    def columns(self) -> list[str] | None:
        """The columns read (None: all)."""
        return self.files.columns

    @property
    def schema(self) -> pa.Schema:
        """The Arrow schema of the columns read (loads the footers first)."""
        self.files.load_blocking()
        assert self.files.schema is not None
        return self.files.schema

    @property
    def urls(self) -> list[str]:
        """The files' URLs (a prefix is listed first)."""
        return self.files.load_blocking().urls

    async def load(self) -> None:
        """Reads the footers (listing a prefix first), once; ``len`` needs them."""
        await self.files.load()

    def __len__(self) -> int:
        return self.files.num_rows

    def row_group_of(self, index: int) -> tuple[str, int, int]:
        """``(file URL, row group, row within it)`` of row ``index``."""
        unit, row = self._locate(np.array([self._check_index(index)], dtype=np.int64))
        file, group = self.files.units[int(unit[0])]
        return redact_url(self.files.urls[file]), group, int(row[0])

    def _check_index(self, index: Any) -> int:
        if not is_integral(index):
            raise TypeError(f"a ParquetDataset is indexed by row number (an int); got {index!r}")
        total = len(self)
        position = int(index) + total if index < 0 else int(index)
        if not 0 <= position < total:
            raise IndexError(f"row {index} is out of range: the dataset has {total} rows")
        return position

    def _locate(
        self, rows: np.ndarray[Any, Any]
    ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        starts = self.files.unit_starts
        units = np.searchsorted(starts, rows, side="right") - 1
        return units, rows - starts[units]

    async def __getitem__(self, index: int) -> dict[str, Any]:
        block = await self.__getitems__([index])
        return block.row(0)

    async def __getitems__(self, indices: Sequence[int]) -> ArrowRows:
        """The rows ``indices``, in that order, as one block (each row group read once)."""
        await self.files.load()
        rows = np.array([self._check_index(index) for index in indices], dtype=np.int64)
        units, within = self._locate(rows)
        needed = [int(unit) for unit in np.unique(units)]
        tables = await asyncio.gather(*(self._row_groups.get(unit) for unit in needed))
        if not needed:
            return ArrowRows(self.files.schema.empty_table())  # type: ignore[union-attr]
        return ArrowRows(take_rows(needed, tables, units, within))

    def __repr__(self) -> str:
        files = self.files
        where = files.prefix if files.prefix is not None else files.urls[0]
        return f"ParquetDataset({redact_url(where)!r}, columns={files.columns!r})"
