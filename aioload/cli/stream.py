"""``aioload stream URL``: how fast can this bucket be read, and with which settings?

It reads a store's objects through aioload exactly as a training job would —
``ObjectDataset`` over a prefix (``--format raw``) or ``ShardDataset`` over tar
shards (``--format tar``) — and reports throughput, time to the first batch
and latency percentiles. Objects are read in full where the fetch runs (in
each worker with ``--workers``); only their sizes and timings travel to the
report, so the figure is the store's and the client's, not the transport's.

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
from urllib.parse import urlsplit

import numpy as np

from aioload.cli import EXIT_CODES, CommandError, run_async
from aioload.cli.meter import Meter
from aioload.urls import redact_url

__all__ = ["TimedObjects", "add_parser", "run", "sample_size"]


def add_parser(commands: Any) -> None:
    """Adds the ``stream`` command to the ``aioload`` command line."""
    parser = commands.add_parser(
        "stream",
        help="read your own objects or shards and report throughput and latency",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("url", help="s3://, gs://, az://, http(s):// or file:// URL")
    parser.add_argument(
        "--format",
        choices=("auto", "raw", "tar"),
        default="auto",
        help="raw: every object is a sample; tar: WebDataset tar shards "
        "(auto: tar when the URL names .tar shards)",
    )
    parser.add_argument("--batch-size", type=int, default=32, help="default: 32")
    parser.add_argument("--workers", type=int, default=0, help="worker processes (default: 0)")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="reads in flight per event loop (default: the loader's)",
    )
    parser.add_argument("--limit", type=int, default=None, help="stop after N samples")
    parser.add_argument("--endpoint", help="the store's endpoint, e.g. http://127.0.0.1:8333")
    parser.add_argument("--region", help="the store's region")
    parser.add_argument("--anonymous", action="store_true", help="unsigned requests (public data)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--quiet", action="store_true", help="no progress line")
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


def run(arguments: argparse.Namespace) -> int:
    """Runs the command (see the module docstring); returns the exit code."""
    for name in ("batch_size", "concurrency", "limit"):
        value = getattr(arguments, name)
        if value is not None and value < 1:
            raise CommandError(f"--{name.replace('_', '-')} should be >= 1; got {value}", 2)
    if arguments.workers < 0:
        raise CommandError(f"--workers should be >= 0; got {arguments.workers}", 2)
    try:
        from aioload.sources import ObjectDataset, ShardDataset, expand_urls
    except ImportError as error:
        raise CommandError(f"{error}: pip install 'aioload[s3]'", 2) from None
    options = _store_options(arguments)
    url = arguments.url
    tar = arguments.format == "tar" or (
        arguments.format == "auto" and (url.endswith(".tar") or "{" in url)
    )
    from aioload import DataLoader

    dataset: Any
    sampler: Any = None
    if tar:
        urls = (
            expand_urls(url) if url.endswith(".tar") or "{" in url else _list_shards(url, options)
        )
        dataset = ShardDataset(urls, decode=sample_size, **options)
        what = f"{len(urls)} tar shard{'s' if len(urls) != 1 else ''}"
    else:
        objects = ObjectDataset(url, **options)
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
    _print(report, arguments)
    return EXIT_CODES["ok"]


def _store_options(arguments: argparse.Namespace) -> dict[str, Any]:
    options: dict[str, Any] = {}
    scheme = urlsplit(arguments.url).scheme.lower()
    cloud = scheme in ("s3", "s3a", "gs", "az", "abfs", "abfss", "adl", "azure")
    if arguments.endpoint:
        if not cloud:
            raise CommandError(
                f"--endpoint applies to s3://, gs:// and az:// URLs, not {scheme}://", 2
            )
        options["endpoint"] = arguments.endpoint
    if arguments.region:
        if scheme not in ("s3", "s3a"):
            raise CommandError("--region applies to s3:// URLs", 2)
        options["region"] = arguments.region
    if arguments.anonymous:
        if not cloud:
            raise CommandError(f"--anonymous applies to cloud URLs, not {scheme}://", 2)
        options["skip_signature"] = True
    return options


def _list_shards(url: str, options: dict[str, Any]) -> list[str]:
    """The URLs of the ``.tar`` objects under ``url``."""
    from aioload.sources import ObjectDataset

    base = url if url.endswith("/") else url + "/"
    keys = asyncio.run(ObjectDataset(base, **options).listing().collect())
    shards = [base + key for key in keys if key.endswith(".tar")]
    if not shards:
        raise CommandError(f"no .tar shards under {redact_url(base)}", 4)
    return shards


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
    print(
        f"settings: --workers {report['workers']} --batch-size {report['batch_size']} "
        f"--concurrency {report['concurrency']}"
    )
