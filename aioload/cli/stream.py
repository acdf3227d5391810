"""``aioload stream URL``: how fast can this bucket be read, and with which settings?

It reads a store's objects through aioload exactly as a training job would —
``ObjectDataset`` over a prefix (``--format raw``) or ``ShardDataset`` over tar
shards (``--format tar``; the default, ``--format auto``, picks tar when the
URL names ``.tar`` shards or every object under the prefix is one) — and
reports throughput, time to the first batch and latency percentiles. Objects
are read in full where the fetch runs (in each worker with ``--workers``); only
their sizes and timings travel to the report, so the figure is the store's and
the client's, not the transport's.

URLs: ``s3://bucket/prefix/``, ``gs://...``, ``az://...``, ``http(s)://...``,
``file:///path/``; a single ``.tar`` shard or a brace pattern of shards
(``s3://bucket/train-{000..099}.tar``). Credentials come from the
environment (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, ``GOOGLE_*``,
``AZURE_*``), ``--endpoint`` and ``--region`` from the options or
``AWS_ENDPOINT_URL``/``AWS_REGION``; ``--anonymous`` reads public data unsigned.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np

from aioload.cli import EXIT_CODES, CommandError, add_traceback_option, plain_text, run_async
from aioload.cli.meter import Meter
from aioload.cli.store_args import add_store_arguments, check_credentials, store_options
from aioload.urls import redact_url

__all__ = ["TimedObjects", "add_parser", "run", "sample_size"]


def add_parser(commands: Any) -> None:
    """Adds the ``stream`` command to the ``aioload`` command line."""
    parser = commands.add_parser(
        "stream",
        help="read your own objects or shards and report throughput and latency",
        description=plain_text(__doc__ or ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("url", help="s3://, gs://, az://, http(s):// or file:// URL")
    parser.add_argument(
        "--format",
        choices=("auto", "raw", "tar"),
        default="auto",
        help="raw: every object is a sample; tar: WebDataset tar shards "
        "(auto: tar when the URL names .tar shards or every object under the prefix is one)",
    )
    parser.add_argument("--batch-size", type=int, default=32, help="default: 32")
    parser.add_argument("--workers", type=int, default=0, help="worker processes (default: 0)")
    parser.add_argument(
        "--concurrency",
        type=_concurrency,
        default=None,
        help="reads in flight per event loop, or 'auto': tuned while reading "
        "(default: the loader's)",
    )
    parser.add_argument("--limit", type=int, default=None, help="stop after N samples")
    add_store_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--quiet", action="store_true", help="no progress line")
    add_traceback_option(parser)
    parser.set_defaults(run=run)


class TimedObjects:
    """An :class:`~aioload.sources.ObjectDataset` whose items are (size, seconds) of each read."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    async def __getitem__(self, key: Any) -> tuple[int, float]:
        started = time.perf_counter()
        data = await self.dataset[key]
        return len(data), time.perf_counter() - started


def sample_size(sample: dict[str, Any]) -> tuple[int, float]:
    """The bytes of one tar sample's fields (and no read time: a shard is one read)."""
    return sum(len(v) for k, v in sample.items() if not k.startswith("__")), float("nan")


class _Limited:
    """The first ``limit`` keys of an async listing (all of them with ``limit=None``)."""

    def __init__(self, listing: Any, limit: int | None) -> None:
        self.listing = listing
        self.limit = limit

    async def __aiter__(self) -> AsyncIterator[str]:
        count = 0
        async for key in self.listing:
            if self.limit is not None and count >= self.limit:
                return
            yield key
            count += 1


def _concurrency(text: str) -> int | str:
    """``--concurrency``: a number, or ``auto``."""
    if text == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"should be a number or 'auto'; got {text!r}") from None


def run(arguments: argparse.Namespace) -> int:
    """Runs the command (see the module docstring); returns the exit code."""
    for name in ("batch_size", "concurrency", "limit"):
        value = getattr(arguments, name)
        if isinstance(value, int) and value < 1:
            raise CommandError(f"--{name.replace('_', '-')} should be >= 1; got {value}", 2)
    if arguments.workers < 0:
        raise CommandError(f"--workers should be >= 0; got {arguments.workers}", 2)
    try:
        from aioload.sources import ObjectDataset, ShardDataset, expand_urls
    except ImportError as error:
        cause = error.__cause__ or error  # aioload.sources' own message has a hint of its own
        raise CommandError(
            f"aioload stream needs obstore, the async object-store client: "
            f"pip install 'aioload-data[s3]' ({cause})",
            2,
        ) from None
    url = arguments.url
    options = store_options(arguments, [url])
    check_credentials(url, options)
    names_shards = url.endswith(".tar") or "{" in url
    shards: list[str] | None = None
    if arguments.format == "tar" or (arguments.format == "auto" and names_shards):
        shards = expand_urls(url) if names_shards else _list_shards(url, options)
        chosen = "tar" if arguments.format == "tar" else "tar: the URL names .tar shards"
    elif arguments.format == "auto":
        shards = _only_shards(url, options)
        chosen = "tar: every object under the prefix is a .tar shard" if shards else "raw"
    else:
        chosen = "raw"
    tar = shards is not None
    from aioload import DataLoader

    dataset: Any
    sampler: Any = None
    if shards is not None:
        dataset = ShardDataset(shards, decode=sample_size, storage_options=options)
        what = f"{len(shards)} tar shard{'s' if len(shards) != 1 else ''}"
    else:
        objects = ObjectDataset(url, storage_options=options)
        dataset = TimedObjects(objects)
        sampler = _Limited(objects.listing(), arguments.limit)
        what = "objects"
    extra: dict[str, Any] = {}
    if arguments.concurrency is not None:
        extra["concurrency"] = arguments.concurrency
    loader: DataLoader[Any] = DataLoader(
        dataset,
        batch_size=arguments.batch_size,
        sampler=sampler,
        num_workers=arguments.workers,
        **extra,
    )
    try:
        report = _measure(loader, arguments, tar)
    finally:
        loader.close()
    if report["samples"] == 0:
        raise CommandError(f"no {'samples' if tar else 'objects'} found at {redact_url(url)}", 4)
    report.update(url=redact_url(url), format="tar" if tar else "raw", source=what)
    if arguments.format == "auto":
        report["format_chosen"] = f"auto, {chosen}"
    _print(report, arguments)
    return EXIT_CODES["ok"]


def _prefix(url: str) -> str:
    return url if url.endswith("/") else url + "/"


def _list_shards(url: str, options: dict[str, Any]) -> list[str]:
    """The URLs of the ``.tar`` objects under ``url``."""
    from aioload.sources import ObjectDataset

    base = _prefix(url)
    keys = asyncio.run(ObjectDataset(base, storage_options=options).listing().collect())
    shards = [base + key for key in keys if key.endswith(".tar")]
    if not shards:
        raise CommandError(f"no .tar shards under {redact_url(base)}", 4)
    return shards


def _only_shards(url: str, options: dict[str, Any]) -> list[str] | None:
    """The URLs of the objects under ``url`` if every one is a ``.tar`` shard, else None.

    The listing stops at the first other object: a prefix of raw objects costs one page.
    """
    from aioload.sources import ObjectDataset

    base = _prefix(url)

    async def shards() -> list[str] | None:
        found = []
        async for key in ObjectDataset(base, storage_options=options).listing():
            if not key.endswith(".tar"):
                return None
            found.append(base + key)
        return found or None

    return asyncio.run(shards())


def _measure(loader: Any, arguments: argparse.Namespace, tar: bool) -> dict[str, Any]:
    meter = Meter("stream", arguments.limit, show=not arguments.quiet)
    latencies: list[np.ndarray] = []
    first_batch: float | None = None

    async def read() -> None:
        nonlocal first_batch
        started = time.perf_counter()
        async for sizes, seconds in loader:
            if first_batch is None:
                first_batch = time.perf_counter() - started
            count = len(sizes)
            if arguments.limit is not None:
                count = min(count, arguments.limit - meter.samples)
            meter.add(count, int(np.sum(sizes[:count])))
            if not tar:
                latencies.append(np.asarray(seconds[:count]))
            if arguments.limit is not None and meter.samples >= arguments.limit:
                break

    try:
        run_async(read)
    except BaseException:
        meter.close()
        raise
    result = meter.finish()
    report: dict[str, Any] = {
        "samples": result.samples,
        "bytes": result.nbytes,
        "seconds": round(result.seconds, 4),
        "samples_per_second": round(result.samples_per_second, 1),
        "megabytes_per_second": round(result.megabytes_per_second, 2),
        "first_batch_seconds": None if first_batch is None else round(first_batch, 4),
        "workers": arguments.workers,
        "batch_size": arguments.batch_size,
        "concurrency": loader.concurrency,
    }
    if loader.concurrency == "auto":
        # What the tuner settled on (None: nothing to tune, a stream of shards say).
        report["concurrency_settled"] = loader.stats().concurrency
    if latencies:
        seconds = np.concatenate(latencies)
        for q in (50, 90, 99):
            report[f"latency_p{q}_ms"] = round(float(np.percentile(seconds, q)) * 1000, 2)
    return report


def _print(report: dict[str, Any], arguments: argparse.Namespace) -> None:
    if arguments.json:
        print(json.dumps(report, indent=2))
        return
    unit = "samples" if report["format"] == "tar" else "objects"
    print(
        f"read {report['samples']:,} {unit} ({report['bytes'] / 1e6:,.1f} MB) from "
        f"{report['source']} in {report['seconds']:.2f} s: "
        f"{report['samples_per_second']:,.0f} {unit}/s, {report['megabytes_per_second']:,.1f} MB/s"
    )
    if report["first_batch_seconds"] is not None:
        print(f"first batch after {1000 * report['first_batch_seconds']:.0f} ms")
    if "latency_p50_ms" in report:
        print(
            "read latency: "
            + ", ".join(f"p{q} {report[f'latency_p{q}_ms']:.1f} ms" for q in (50, 90, 99))
        )
    settled = report.get("concurrency_settled")
    print(
        f"settings: --format {report['format']} --workers {report['workers']} "
        f"--batch-size {report['batch_size']} --concurrency {report['concurrency']}"
        + ("" if settled is None else f" (settled on {settled} reads in flight)")
    )
    if "format_chosen" in report:
        print(f"format: {report['format_chosen']}")
