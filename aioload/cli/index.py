"""``aioload index URL...``: write the index files of existing tar shards, once.

With several ranks, ShardDataset splits an epoch between them at sample granularity,
which needs each shard's index: where each of its samples lies. ShardWriter writes it
beside every shard (``train-000017.tar.idx.json``); shards written by other tools have
none, and each rank then reads every such shard whole to build its index, every run.
This command writes the missing index files beside their shards, in the format
ShardWriter writes, so that every later run reads those small files instead.

URLs: shards (``s3://bucket/train-000000.tar``), brace patterns
(``s3://bucket/train-{000000..000999}.tar``, quoted against the shell), prefixes
ending in ``/`` (every plain ``.tar`` object under it), or local paths (a file, a
pattern, or a folder). Any store aioload reads: ``s3://``, ``gs://``, ``az://``,
``file://``; writing needs write access. Credentials come from the environment
(``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, ``GOOGLE_*``, ``AZURE_*``),
``--endpoint`` and ``--region`` from the options or
``AWS_ENDPOINT_URL``/``AWS_REGION``.

- **Resumable**: a shard whose index file is valid (it parses and its ``shard_size`` is
  the shard's size) is not read again; a damaged or stale one is rebuilt
  (``--overwrite`` rebuilds them all). Run the command again after an interruption.
- **Atomic**: each index file is put whole, in one request, once built: an
  interrupted run leaves no half-written index.
- **Parallel**: ``--concurrency`` shards are read at once (default 16), each as a stream
  (its headers walked, its bodies never held); a progress bar counts the shards.
- A shard that is missing or is not a tar archive is reported and the others go on; the
  exit code then says what failed (4 missing, 1 not a tar).

For example::

    $ aioload index 's3://bucket/train-{000000..000999}.tar' --endpoint http://127.0.0.1:8333
    $ aioload index /data/shards/
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from aioload.cli import (
    EXIT_CODES,
    CommandError,
    add_traceback_option,
    describe,
    plain_text,
    run_async,
)
from aioload.cli.meter import Meter
from aioload.cli.store_args import add_store_arguments, check_credentials, store_options

__all__ = ["add_parser", "as_url", "run"]


def add_parser(commands: Any) -> None:
    """Adds the ``index`` command to the ``aioload`` command line."""
    parser = commands.add_parser(
        "index",
        help="write the .idx.json index files of existing tar shards",
        description=plain_text(__doc__ or ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "urls",
        nargs="+",
        metavar="URL",
        help="shard URLs, brace patterns, prefixes ending in / (their .tar shards), local paths",
    )
    parser.add_argument(
        "--concurrency", type=int, default=None, help="shards read at once (default: 16)"
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="rebuild every index, even valid ones"
    )
    add_store_arguments(parser, reads="list and read")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    add_traceback_option(parser)
    parser.set_defaults(run=run)


def as_url(name: str) -> str:
    """``name`` as a URL: a URL as it is, a local path as a ``file://`` URL (a folder's
    ending in ``/``, so that its shards are listed).

    Example::

        >>> as_url("s3://bucket/a.tar"), as_url("/data/train-{0..3}.tar")
        ('s3://bucket/a.tar', 'file:///data/train-{0..3}.tar')
    """
    if "://" in name:
        return name
    path = os.path.abspath(name)
    folder = name.endswith("/") or os.path.isdir(path)
    # Not Path.as_uri(): it would percent-encode the braces of a pattern.
    return f"file://{path}{'/' if folder and not path.endswith('/') else ''}"


def run(arguments: argparse.Namespace) -> int:
    """Runs the command (see the module docstring); returns the exit code."""
    concurrency = arguments.concurrency
    if concurrency is not None and concurrency < 1:
        raise CommandError(f"--concurrency should be >= 1; got {concurrency}", 2)
    try:
        from aioload.sources.tar.index_files import (
            DEFAULT_CONCURRENCY,
            IndexOutcome,
            index_shards,
            shard_urls,
        )
    except ImportError as error:
        cause = error.__cause__ or error
        raise CommandError(
            f"aioload index needs obstore, the async object-store client: "
            f"pip install 'aioload-data[s3]' ({cause})",
            2,
        ) from None
    urls = [as_url(name) for name in arguments.urls]
    options = store_options(arguments, urls)
    for url in urls:
        check_credentials(url, options)
    started = time.perf_counter()
    outcomes: list[IndexOutcome] = []
    meter: Meter | None = None

    def done(outcome: IndexOutcome) -> None:
        assert meter is not None
        meter.add(1, outcome.read_bytes)

    async def main() -> None:
        nonlocal meter
        shards = await shard_urls(urls, options)
        meter = Meter("index", len(shards), show=not arguments.quiet, unit="shards", waits=False)
        outcomes.extend(
            await index_shards(
                shards,
                overwrite=arguments.overwrite,
                concurrency=concurrency or DEFAULT_CONCURRENCY,
                storage_options=options,
                on_done=done,
            )
        )

    try:
        run_async(main)
    except BaseException:
        if meter is not None:
            meter.close()
        raise
    assert meter is not None
    meter.finish()
    report = _report(outcomes, time.perf_counter() - started)
    _print(report, arguments)
    failed = [(o.url, o.error) for o in outcomes if o.error is not None]
    if not failed:
        return EXIT_CODES["ok"]
    for url, problem in failed:
        print(f"aioload index: {url}: {describe(problem)}", file=sys.stderr)
    missing = all(isinstance(problem, FileNotFoundError) for _, problem in failed)
    raise CommandError(
        f"{len(failed)} of {len(outcomes)} shards could not be indexed (their errors are "
        "above); the others were",
        EXIT_CODES["not_found"] if missing else EXIT_CODES["failed"],
    )


def _report(outcomes: list[Any], seconds: float) -> dict[str, Any]:
    counts = {status: 0 for status in ("written", "rebuilt", "kept", "failed")}
    for outcome in outcomes:
        counts[outcome.status] += 1
    return {
        "shards": len(outcomes),
        **counts,
        "samples": sum(outcome.samples for outcome in outcomes),
        "read_bytes": sum(outcome.read_bytes for outcome in outcomes),
        "seconds": round(seconds, 3),
        "failures": [
            {"url": o.url, "error": describe(o.error)} for o in outcomes if o.error is not None
        ],
    }


def _print(report: dict[str, Any], arguments: argparse.Namespace) -> None:
    if arguments.json:
        print(json.dumps(report, indent=2))
        return
    print(
        f"{report['shards']:,} shards: {report['written']:,} indexed, "
        f"{report['rebuilt']:,} rebuilt (stale, damaged or --overwrite), {report['kept']:,} "
        f"had a valid index, {report['failed']:,} failed; {report['samples']:,} samples; "
        f"read {report['read_bytes'] / 1e6:,.1f} MB in {report['seconds']:.2f} s"
    )
