"""The contenders of ``bench_streaming.py``: the samples, every format written from them,
and each loader as the benchmark builds it (in a child process of its own).

One definition of the samples (``payload``, ``tokens``), one writer per format (``WRITERS``) and
one :class:`Loader` per contender (``LOADERS``), with the settings its documentation recommends
(``Loader.settings``, which the report quotes). A loader yields batches; ``unpack`` gives their ids
and payloads, which :class:`Checker` compares with the samples' definition.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

SEED = 0
BATCH = 64
WORKERS = 2
SHUFFLE_BUFFER = 1000  # samples, for every loader that has a sample shuffle buffer
PAYLOAD_MIN, PAYLOAD_MAX = 20_000, 100_000  # bytes of an image-like sample's payload
TOKENS_MIN, TOKENS_MAX, VOCABULARY = 64, 1024, 50_000
SHARDS = 20  # tar shards, Parquet and JSON-lines files of a dataset (but the equal-steps one)
PARQUET_IMAGE_ROW_GROUP = 100  # rows: the row group `datasets` writes for image data
TEXT_ROW_GROUP = 1000  # rows: `datasets`' default batch of rows written at once
RANK_SHARES = (0.36, 0.02, 0.22, 0.07, 0.30, 0.03)  # six shards of unequal sizes
RANK_PAYLOAD = 1024
BUCKET = "bench"
REGION = "us-east-1"


# -- the samples: one definition, every format written from it --------------------------------


def payload_sizes(count: int) -> np.ndarray:
    """The payload size of every image-like sample, by id."""
    return np.random.default_rng(SEED).integers(PAYLOAD_MIN, PAYLOAD_MAX + 1, count)


def payload(i: int, size: int) -> bytes:
    """Sample ``i``'s payload: its id (8 bytes, little-endian), then random bytes."""
    return i.to_bytes(8, "little") + np.random.default_rng([SEED, i]).bytes(size - 8)


def label(i: int) -> int:
    return i % 1000


def token_counts(count: int) -> np.ndarray:
    """The token count of every text sample, by id."""
    return np.random.default_rng(SEED + 1).integers(TOKENS_MIN, TOKENS_MAX + 1, count)


def tokens(i: int, count: int) -> np.ndarray:
    """Text sample ``i``'s tokens: ``i % VOCABULARY`` first, then random ones."""
    values = np.random.default_rng([SEED + 1, i]).integers(0, VOCABULARY, count, dtype=np.int32)
    values[0] = i % VOCABULARY
    return values


def rank_shard_counts(count: int) -> list[int]:
    """Samples per shard of the equal-steps dataset: six shards of unequal sizes."""
    counts = [int(count * share) for share in RANK_SHARES]
    counts[0] += count - sum(counts)
    return counts


class Checker:
    """Checks the samples a loader yields against their definition; counts what it saw."""

    def __init__(self, kind: str, count: int) -> None:
        self.kind = kind
        self.count = count
        if kind == "text":
            self.sizes = token_counts(count)
        elif kind == "ranks":
            self.sizes = np.full(count, RANK_PAYLOAD)
        else:
            self.sizes = payload_sizes(count)

    def check(self, ids: Any, items: Any) -> list[int]:
        """The ids of one batch, each checked with its payload (bytes) or tokens."""
        out = [int(i) for i in ids]
        for i, item in zip(out, items, strict=True):
            if not 0 <= i < self.count or len(item) != self.sizes[i]:
                own = int.from_bytes(bytes(item[:8]), "little") if self.kind != "text" else None
                raise AssertionError(
                    f"sample {i}: {len(item)} bytes or tokens, not its own (its payload is "
                    f"sample {own}'s; the batch's ids: {out[:8]}...)"
                )
            if self.kind == "text":
                if int(item[0]) != i % VOCABULARY:
                    raise AssertionError(f"sample {i}: the tokens of another sample")
            elif bytes(item[:8]) != i.to_bytes(8, "little"):
                raise AssertionError(f"sample {i}: the payload of another sample")
        return out


# -- writing every format ----------------------------------------------------------------------


def image_rows(start: int, stop: int, sizes: np.ndarray) -> Iterator[dict[str, Any]]:
    for i in range(start, stop):
        yield {"id": i, "label": label(i), "payload": payload(i, int(sizes[i]))}


def rank_rows(start: int, stop: int) -> Iterator[dict[str, Any]]:
    for i in range(start, stop):
        yield {"id": i, "label": label(i), "payload": payload(i, RANK_PAYLOAD)}


def shard_bounds(kind: str, count: int) -> list[tuple[int, int]]:
    """``(start, stop)`` of every shard (tar, Parquet or JSON-lines file) of a dataset."""
    if kind == "ranks":
        counts = rank_shard_counts(count)
    else:
        per = max(1, math.ceil(count / SHARDS))
        counts = [min(per, count - start) for start in range(0, count, per)]
    bounds, start = [], 0
    for n in counts:
        bounds.append((start, start + n))
        start += n
    return bounds


def rows_of(kind: str, count: int, start: int, stop: int) -> Iterator[dict[str, Any]]:
    if kind == "ranks":
        return rank_rows(start, stop)
    return image_rows(start, stop, payload_sizes(count))


def write_tar(folder: Path, kind: str, count: int) -> None:
    """Tar shards (aioload's ``ShardWriter``, index files beside): ``{id:08d}.cls``, ``.bin``."""
    from aioload.sources import ShardWriter

    for number, (start, stop) in enumerate(shard_bounds(kind, count)):
        pattern = str(folder / "shard-%06d.tar")
        with ShardWriter(pattern, maxcount=stop - start, start_shard=number) as writer:
            for row in rows_of(kind, count, start, stop):
                writer.write(
                    {"__key__": f"{row['id']:08d}", "cls": row["label"], "bin": row["payload"]}
                )


def write_parquet(folder: Path, kind: str, count: int) -> None:
    """Parquet files (pyarrow's defaults: snappy), ``id``, ``label``, ``payload`` or ``tokens``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    row_group = TEXT_ROW_GROUP if kind == "text" else PARQUET_IMAGE_ROW_GROUP
    counts = token_counts(count) if kind == "text" else None
    for number, (start, stop) in enumerate(shard_bounds(kind, count)):
        ids = np.arange(start, stop, dtype=np.int64)
        if counts is not None:
            column = pa.array([tokens(int(i), int(counts[i])) for i in ids], pa.list_(pa.int32()))
            table = pa.table({"id": ids, "tokens": column})
        else:
            rows = list(rows_of(kind, count, start, stop))
            table = pa.table(
                {
                    "id": ids,
                    "label": pa.array([r["label"] for r in rows], pa.int64()),
                    "payload": pa.array([r["payload"] for r in rows], pa.binary()),
                }
            )
        pq.write_table(table, folder / f"part-{number:05d}.parquet", row_group_size=row_group)


def write_jsonl(folder: Path, kind: str, count: int) -> None:
    """JSON-lines files of ``{"id": i, "tokens": [...]}``."""
    counts = token_counts(count)
    for number, (start, stop) in enumerate(shard_bounds(kind, count)):
        with open(folder / f"part-{number:05d}.jsonl", "w") as file:
            for i in range(start, stop):
                values = tokens(i, int(counts[i])).tolist()
                file.write(json.dumps({"id": i, "tokens": values}, separators=(",", ":")) + "\n")


def litdata_item(index: int) -> dict[str, Any]:
    """One item of LitData's ``optimize`` (the process's environment names the dataset)."""
    kind, count = os.environ["BENCH_KIND"], int(os.environ["BENCH_COUNT"])
    size = RANK_PAYLOAD if kind == "ranks" else int(payload_sizes(count)[index])
    return {"id": index, "label": label(index), "payload": payload(index, size)}


def write_litdata(folder: Path, kind: str, count: int) -> None:
    """LitData's ``optimize`` output (64 MB chunks, one worker process per core)."""
    from litdata import optimize

    os.environ["BENCH_KIND"], os.environ["BENCH_COUNT"] = kind, str(count)
    optimize(
        fn=litdata_item,
        inputs=list(range(count)),
        output_dir=str(folder),
        chunk_bytes="64MB",
        num_workers=WORKERS,
    )


def write_mds(folder: Path, kind: str, count: int) -> None:
    """Mosaic's MDS shards (``MDSWriter``, 64 MB shards, no compression: its default)."""
    mosaic_import()
    from streaming import MDSWriter

    columns = {"id": "int64", "label": "int64", "payload": "bytes"}
    with MDSWriter(out=str(folder), columns=columns, size_limit=1 << 26) as writer:
        for start, stop in shard_bounds(kind, count):
            for row in rows_of(kind, count, start, stop):
                writer.write(row)


WRITERS: dict[str, Callable[[Path, str, int], None]] = {
    "tar": write_tar,
    "parquet": write_parquet,
    "jsonl": write_jsonl,
    "litdata": write_litdata,
    "mds": write_mds,
}


# -- the loaders (run in the child processes) --------------------------------------------------


def mosaic_import() -> str:
    """Imports Mosaic Streaming; where torchvision cannot be loaded, with an empty
    ``streaming.vision`` (its vision datasets, unused here) in its place. Returns a note."""
    import types

    try:
        import torchvision  # noqa: F401
    except Exception as error:
        sys.modules.pop("torchvision", None)
        sys.modules["streaming.vision"] = types.ModuleType("streaming.vision")
        import streaming

        return (
            f"torchvision does not load here ({type(error).__name__}: {str(error)[:80]}); "
            "streaming.vision stubbed"
        )
    import streaming  # noqa: F401

    return ""


@dataclass
class Context:
    """What a child needs to build its loader."""

    kind: str  # "images", "text" or "ranks"
    count: int  # samples in the dataset
    prefix: str  # s3://bucket/<format>-<kind>
    endpoint: str
    access_key_id: str
    secret_access_key: str
    cache: str  # a local folder for the loader's cache
    rank: int = 0
    world_size: int = 1

    @property
    def store_options(self) -> dict[str, Any]:
        return {
            "endpoint": self.endpoint,
            "access_key_id": self.access_key_id,
            "secret_access_key": self.secret_access_key,
            "region": REGION,
            "allow_http": True,
        }

    def keys(self, suffix: str) -> list[str]:
        """The object keys (under the bucket) of the dataset's shards, in order."""
        name = self.prefix.split("/", 3)[3]
        count = len(shard_bounds(self.kind, self.count))
        if suffix == ".tar":
            return [f"{name}/shard-{n:06d}.tar" for n in range(count)]
        return [f"{name}/part-{n:05d}{suffix}" for n in range(count)]

    def urls(self, suffix: str) -> list[str]:
        return [f"s3://{BUCKET}/{key}" for key in self.keys(suffix)]


class Loader:
    """One contender in a child process: builds its loader, yields checked batches."""

    library = ""  # the distribution whose version the report gives
    settings = ""  # the settings, as the documentation table shows them
    checkpoint = "none"  # what it offers to resume: "none" restarts the epoch
    kinds: tuple[str, ...] = ("images",)
    fmt = "tar"

    def __init__(self, context: Context) -> None:
        self.context = context
        self.note = ""

    def imports(self) -> None:
        """Imports the library (timed apart from building the loader)."""

    def build(self) -> None:
        raise NotImplementedError

    def epoch(self, epoch: int) -> Iterator[Any]:
        raise NotImplementedError

    def unpack(self, batch: Any) -> tuple[Any, Any]:
        """``(ids, payloads or token lists)`` of a batch."""
        raise NotImplementedError

    def state(self) -> Any:
        raise NotImplementedError

    def load(self, state: Any) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


def _torch_ints(values: Any) -> Any:
    return values.tolist() if hasattr(values, "tolist") else values


class AioloadTar(Loader):
    library = "aioload-data"
    settings = (
        "`ShardDataset(shuffle_shards=True, shuffle_buffer=1000, shards_in_flight=4, "
        "cache_dir=...)`, `DataLoader(batch_size=64, num_workers=2)`"
    )
    checkpoint = "`loader.state_dict()`"
    kinds = ("images", "ranks")

    def build(self) -> None:
        from aioload import DataLoader
        from aioload.sources import ShardDataset

        c = self.context
        self.dataset = ShardDataset(
            c.urls(".tar"),
            decode=lambda s: (int(s["__key__"]), int(s["cls"]), s["bin"]),
            shuffle_shards=True,
            shuffle_buffer=SHUFFLE_BUFFER,
            shards_in_flight=4,
            seed=SEED,
            cache_dir=c.cache,
            storage_options=c.store_options,
        )
        self.loader: DataLoader[Any] = DataLoader(
            self.dataset, batch_size=BATCH, num_workers=WORKERS
        )

    def epoch(self, epoch: int) -> Iterator[Any]:
        self.dataset.set_epoch(epoch)
        return iter(self.loader)

    def unpack(self, batch: Any) -> tuple[Any, Any]:
        return batch[0], batch[2]

    def state(self) -> Any:
        return self.loader.state_dict()

    def load(self, state: Any) -> None:
        self.loader.load_state_dict(state)

    def close(self) -> None:
        self.loader.close()


class AioloadParquet(Loader):
    library = "aioload-data"
    settings = (
        "`IterableParquetDataset(columns=[...], shuffle_row_groups=True, shuffle_buffer=1000, "
        "cache_dir=...)`, `DataLoader(batch_size=64, num_workers=2)` (text: `collate_fn=list`)"
    )
    checkpoint = "`loader.state_dict()`"
    kinds = ("images", "text", "ranks")
    fmt = "parquet"

    def build(self) -> None:
        from aioload import DataLoader
        from aioload.sources import IterableParquetDataset

        c = self.context
        self.column = "tokens" if c.kind == "text" else "payload"
        self.dataset = IterableParquetDataset(
            c.urls(".parquet"),
            columns=["id", self.column],
            shuffle_row_groups=True,
            shuffle_buffer=SHUFFLE_BUFFER,
            seed=SEED,
            cache_dir=c.cache,
            storage_options=c.store_options,
        )
        # ragged token lists: the rows as a list, as for every text contender
        collate = list if c.kind == "text" else None
        self.loader: DataLoader[Any] = DataLoader(
            self.dataset, batch_size=BATCH, num_workers=WORKERS, collate_fn=collate
        )

    def epoch(self, epoch: int) -> Iterator[Any]:
        self.dataset.set_epoch(epoch)
        return iter(self.loader)

    def unpack(self, batch: Any) -> tuple[Any, Any]:
        if isinstance(batch, list):
            return [row["id"] for row in batch], [row[self.column] for row in batch]
        return batch["id"], batch[self.column]

    state = AioloadTar.state
    load = AioloadTar.load
    close = AioloadTar.close


class AioloadJsonl(Loader):
    library = "aioload-data"
    settings = (
        "`JsonLinesDataset(shuffle_files=True, shuffle_buffer=1000, files_in_flight=2, "
        "cache_dir=...)`, `DataLoader(batch_size=64, num_workers=2, collate_fn=list)`"
    )
    checkpoint = "`loader.state_dict()`"
    kinds = ("text",)
    fmt = "jsonl"

    def build(self) -> None:
        from aioload import DataLoader
        from aioload.sources import JsonLinesDataset

        c = self.context
        self.dataset = JsonLinesDataset(
            c.urls(".jsonl"),
            shuffle_files=True,
            shuffle_buffer=SHUFFLE_BUFFER,
            files_in_flight=2,
            seed=SEED,
            cache_dir=c.cache,
            storage_options=c.store_options,
        )
        self.loader: DataLoader[Any] = DataLoader(
            self.dataset, batch_size=BATCH, num_workers=WORKERS, collate_fn=list
        )

    def epoch(self, epoch: int) -> Iterator[Any]:
        self.dataset.set_epoch(epoch)
        return iter(self.loader)

    def unpack(self, batch: Any) -> tuple[Any, Any]:
        return [row["id"] for row in batch], [row["tokens"] for row in batch]

    state = AioloadTar.state
    load = AioloadTar.load
    close = AioloadTar.close


class WebDataset(Loader):
    library = "webdataset"
    settings = (
        "`WebDataset(urls, shardshuffle=100, nodesplitter=split_by_node, cache_dir=...)"
        ".shuffle(1000).to_tuple(...).batched(64)`, `WebLoader(batch_size=None, "
        "num_workers=2)`; presigned HTTP URLs, read with curl (its `gopen`)"
    )
    kinds = ("images", "ranks")

    def imports(self) -> None:
        import webdataset  # noqa: F401

    def build(self) -> None:
        import boto3
        import webdataset as wds

        c = self.context
        client = boto3.client(
            "s3",
            endpoint_url=c.endpoint,
            aws_access_key_id=c.access_key_id,
            aws_secret_access_key=c.secret_access_key,
            region_name=REGION,
        )
        urls = [
            client.generate_presigned_url(
                "get_object", Params={"Bucket": BUCKET, "Key": key}, ExpiresIn=3600
            )
            for key in c.keys(".tar")
        ]
        os.makedirs(c.cache, exist_ok=True)
        dataset = (
            wds.WebDataset(
                urls,
                shardshuffle=100,
                nodesplitter=wds.split_by_node,
                cache_dir=c.cache,
                seed=SEED,
            )
            .shuffle(SHUFFLE_BUFFER)
            .to_tuple("__key__", "cls", "bin")
            .batched(BATCH, partial=True)
        )
        self.loader = wds.WebLoader(dataset, batch_size=None, num_workers=WORKERS)

    def epoch(self, epoch: int) -> Iterator[Any]:
        return iter(self.loader)

    def unpack(self, batch: Any) -> tuple[Any, Any]:
        return [int(key) for key in batch[0]], batch[2]


class _CheckpointedTorchLoader(Loader):
    """LitData's and Mosaic's: a torch ``StreamingDataLoader`` with its own ``state_dict``,
    batches of an ``id`` tensor and a ``payload`` list."""

    loader: Any

    def epoch(self, epoch: int) -> Iterator[Any]:
        return iter(self.loader)

    def unpack(self, batch: Any) -> tuple[Any, Any]:
        return _torch_ints(batch["id"]), batch["payload"]

    def state(self) -> Any:
        return self.loader.state_dict()

    def load(self, state: Any) -> None:
        self.loader.load_state_dict(state)


class LitData(_CheckpointedTorchLoader):
    library = "litdata"
    settings = (
        "`StreamingDataset(shuffle=True, cache_dir=..., storage_options=...)`, "
        "`StreamingDataLoader(batch_size=64, num_workers=2)`"
    )
    checkpoint = "`StreamingDataLoader.state_dict()`"
    kinds = ("images", "ranks")
    fmt = "litdata"

    def imports(self) -> None:
        import litdata  # noqa: F401
        from litdata.streaming import downloader

        # Its obstore client (chunk downloads) is built with client options that leave
        # plain HTTP off, whatever the endpoint's scheme: every GET from an http:// endpoint
        # fails ("BadScheme"). Turned on here, as for its boto3 client.
        options = getattr(downloader, "_OBSTORE_CLIENT_OPTIONS", None)
        if isinstance(options, dict) and "allow_http" not in options:
            options["allow_http"] = True
            self.note = (
                "its obstore client options leave plain HTTP off (every chunk GET from an "
                "http:// endpoint fails); the benchmark sets allow_http in them"
            )

    def build(self) -> None:
        from litdata import StreamingDataLoader, StreamingDataset

        c = self.context
        storage = {
            "endpoint_url": c.endpoint,
            "aws_access_key_id": c.access_key_id,
            "aws_secret_access_key": c.secret_access_key,
            "region_name": REGION,
        }
        self.dataset = StreamingDataset(
            c.prefix, cache_dir=c.cache, shuffle=True, seed=SEED, storage_options=storage
        )
        self.loader = StreamingDataLoader(self.dataset, batch_size=BATCH, num_workers=WORKERS)


class Mosaic(_CheckpointedTorchLoader):
    library = "mosaicml-streaming"
    settings = (
        "`StreamingDataset(remote=..., local=..., shuffle=True, batch_size=64)`, "
        "`StreamingDataLoader(batch_size=64, num_workers=2)`"
    )
    checkpoint = "`StreamingDataLoader.state_dict()`"
    kinds = ("images", "ranks")
    fmt = "mds"

    def imports(self) -> None:
        self.note = mosaic_import()

    def build(self) -> None:
        from streaming import StreamingDataLoader, StreamingDataset

        # Not streaming.base.util.clean_stale_shared_memory(): called before the dataset is
        # made, in a process with nothing stale, it led to wrong samples in 3 of 5 runs
        # here. The benchmark removes what a killed run left (Bench.resume) instead.
        c = self.context
        self.dataset = StreamingDataset(
            remote=c.prefix,
            local=c.cache,
            shuffle=True,
            shuffle_seed=SEED,
            batch_size=BATCH,
        )
        self.loader = StreamingDataLoader(self.dataset, batch_size=BATCH, num_workers=WORKERS)


class HuggingFace(Loader):
    library = "datasets"
    settings = (
        '`load_dataset("parquet" or "json", data_files=..., streaming=True, '
        "storage_options=...).shuffle(seed=0, buffer_size=1000)`, torchdata's "
        "`StatefulDataLoader(batch_size=64, num_workers=2)` (text: `collate_fn=list`)"
    )
    checkpoint = "`StatefulDataLoader.state_dict()` (torchdata)"
    kinds: tuple[str, ...] = ("images", "text", "ranks")
    fmt = "parquet"
    builder = "parquet"

    def imports(self) -> None:
        import datasets  # noqa: F401

    def build(self) -> None:
        from datasets import load_dataset
        from datasets.distributed import split_dataset_by_node

        c = self.context
        storage = {
            "key": c.access_key_id,
            "secret": c.secret_access_key,
            "endpoint_url": c.endpoint,
            "client_kwargs": {"region_name": REGION},
        }
        suffix = ".jsonl" if self.builder == "json" else ".parquet"
        dataset = load_dataset(
            self.builder,
            data_files={"train": c.urls(suffix)},
            split="train",
            streaming=True,
            storage_options=storage,
        )
        if c.kind != "text":
            dataset = dataset.select_columns(["id", "payload"])
        # shuffle() interleaves up to 10 files (its max_buffer_input_shards) into one shard:
        # with fewer files than 10 x workers (x ranks), workers (and ranks) go without
        shards = dataset.shuffle(seed=SEED, buffer_size=SHUFFLE_BUFFER).num_shards
        if c.world_size > 1:
            if shards % c.world_size:
                self.note = (
                    f"{shards} shard(s) after shuffle(), not a multiple of {c.world_size} "
                    f"ranks: split_dataset_by_node keeps one sample in {c.world_size}, and "
                    "every rank reads every file"
                )
            dataset = split_dataset_by_node(dataset, rank=c.rank, world_size=c.world_size)
            shards = max(1, shards // c.world_size) if not shards % c.world_size else shards
        dataset = dataset.shuffle(seed=SEED, buffer_size=SHUFFLE_BUFFER)
        if shards < WORKERS and not self.note:
            self.note = f"{shards} shard(s) after shuffle(): {shards} of its {WORKERS} workers read"
        self.dataset = dataset
        collate = list if c.kind == "text" else None
        self.loader: Any
        try:
            from torchdata.stateful_dataloader import StatefulDataLoader
        except ImportError:
            from torch.utils.data import DataLoader

            self.note = "torchdata missing: torch's DataLoader, no checkpoint"
            self.stateful = False
            self.loader = DataLoader(
                dataset, batch_size=BATCH, num_workers=WORKERS, collate_fn=collate
            )
        else:
            self.stateful = True
            self.loader = StatefulDataLoader(
                dataset, batch_size=BATCH, num_workers=WORKERS, collate_fn=collate
            )

    def epoch(self, epoch: int) -> Iterator[Any]:
        self.dataset.set_epoch(epoch)
        return iter(self.loader)

    def unpack(self, batch: Any) -> tuple[Any, Any]:
        if isinstance(batch, list):
            return [row["id"] for row in batch], [row["tokens"] for row in batch]
        return _torch_ints(batch["id"]), batch["payload"]

    def state(self) -> Any:
        if not self.stateful:
            raise NotImplementedError
        return self.loader.state_dict()

    def load(self, state: Any) -> None:
        self.loader.load_state_dict(state)


class HuggingFaceJson(HuggingFace):
    kinds = ("text",)
    fmt = "jsonl"
    builder = "json"


LOADERS: dict[str, type[Loader]] = {
    "aioload-tar": AioloadTar,
    "webdataset": WebDataset,
    "litdata": LitData,
    "mosaic": Mosaic,
    "hf-parquet": HuggingFace,
    "aioload-parquet": AioloadParquet,
    "hf-parquet-text": HuggingFace,
    "aioload-parquet-text": AioloadParquet,
    "hf-jsonl-text": HuggingFaceJson,
    "aioload-jsonl-text": AioloadJsonl,
}
"""Every contender: its name -> its loader; a name ending in ``-text`` reads the text set."""

LABELS = {
    "aioload-tar": "aioload ShardDataset (tar)",
    "webdataset": "webdataset (tar)",
    "litdata": "LitData (optimize)",
    "mosaic": "Mosaic Streaming (MDS)",
    "hf-parquet": "HF datasets (Parquet)",
    "aioload-parquet": "aioload IterableParquetDataset",
    "hf-parquet-text": "HF datasets (Parquet)",
    "aioload-parquet-text": "aioload IterableParquetDataset",
    "hf-jsonl-text": "HF datasets (JSON lines)",
    "aioload-jsonl-text": "aioload JsonLinesDataset",
}
AIOLOAD = tuple(name for name in LOADERS if name.startswith("aioload"))


def kind_of(name: str) -> str:
    return "text" if name.endswith("-text") else "images"


def dataset_prefix(fmt: str, kind: str) -> str:
    return f"s3://{BUCKET}/{fmt}-{kind}"


def has_cache(name: str) -> bool:
    return not name.startswith("hf-")
