"""A ShardDataset's stream under the loader's fault policy: retried runs, skipped samples.

:meth:`ShardDataset.guarded_stream <aioload.sources.ShardDataset.guarded_stream>` builds
the same stream as iterating the dataset — the tracked stream of runs of
:mod:`aioload.sources.streams.tracked`, so a guarded stream checkpoints and resumes as an
unguarded one does — with two layers of this module in it (see
:mod:`aioload.faults.guard` for the protocol):

- every run (a shard, or part of one) is read through :func:`guarded_runs`: a read that
  fails with a transient error (``retry.retry_on``: by default ``OSError`` and
  ``TimeoutError``, which a missing object is too) is tried again after the policy's
  backoff, from the first sample not yet delivered (its byte offset is where the sample
  before it ends, as a resumed stream reads it; the attempts count again from 1 once a
  new sample arrives). A run that still cannot be read — a missing object, a truncated
  or corrupt tar, a store error after the retries — ends where it failed with one skip
  marker (key: the shard's URL; where: the byte offset of the first sample lost) and
  the stream goes on with the next run;
- after the shuffle buffer, :func:`decoded` decodes each sample; a sample whose
  ``decode`` raises is skipped (key: its ``__key__``; where: the shard's URL and the
  byte offset of the sample's first header, from its ref).

A skip marker comes out of its run as ``(marker, None, True)``: the run is over, and the
tracked stream hands the marker on at once, outside the shuffle buffer (it holds no
sample a checkpoint would have to read again), so the samples that remain come in the
order of a stream whose shard ended there. A sample that fails to decode takes its
place in the shuffle and is dropped only after it: the others come in the order they
would without it. Under ``on_error='raise'`` each of these failures raises where it
happened, with its error's type and a note naming the key and place.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Sequence
from contextlib import aclosing
from functools import partial
from typing import Any

from aioload.faults.guard import StreamGuard
from aioload.faults.policy import Skip
from aioload.sources.streams.state import Ref, Run
from aioload.sources.streams.tracked import OpenRun
from aioload.urls import redact_url

__all__ = ["decoded", "guarded_runs"]


def guarded_runs(
    open_run: OpenRun,
    urls: Sequence[str],
    guard: StreamGuard,
    where: Callable[[str, Run], str] | None = None,
) -> OpenRun:
    """``open_run`` under ``guard``: each run's ``(sample, ref, last)``, retried while its
    reads fail transiently, ended by ``(marker, None, True)`` where it fails for good.

    Args:
        open_run: a run's samples with their refs (the dataset's own reader).
        urls: the shards' URLs, by index (redacted for the records).
        guard: the stream's guard.
        where: ``where(url, left)``: how a skip record names the part of the run
            ``left`` lost (default: a shard's, from the byte of its first sample).
    """
    describe = _rest_of_shard if where is None else where

    def open_guarded(run: Run) -> AsyncGenerator[tuple[Any, Ref | None, bool], None]:
        return _guarded_run(open_run, run, redact_url(urls[run.shard]), guard, describe)

    return open_guarded


def _rest_of_shard(url: str, left: Run) -> str:
    return f"{url}: the rest of the shard, from byte {left.offset}"


async def _guarded_run(
    open_run: OpenRun, run: Run, url: str, guard: StreamGuard, where: Callable[[str, Run], str]
) -> AsyncGenerator[tuple[Any, Ref | None, bool], None]:
    left = run  # what is not delivered yet
    failures = 0  # failed attempts since the last new sample
    while True:
        try:
            async with aclosing(open_run(left)) as samples:
                async for sample, ref, last in samples:
                    assert ref is not None  # the dataset's reader makes no markers
                    failures = 0
                    after = ref[1] + 1
                    left = Run(left.shard, after, ref[3], after if last else left.stop)
                    yield sample, ref, last
            return
        except Exception as error:
            failures += 1
            if guard.again(error, failures):
                await guard.backoff(failures)
                continue
            yield guard.skip(url, error, attempts=failures, where=where(url, left)), None, True
            return


async def decoded(
    items: AsyncGenerator[tuple[Any, Ref | None], None],
    urls: Sequence[str],
    decode: Callable[[Any], Any] | None,
    guard: StreamGuard,
    describe: Callable[[Any, Ref | None], tuple[Any, str | None]] | None = None,
) -> AsyncGenerator[Any, None]:
    """The samples of ``items`` (``(sample, ref)``), decoded; skip markers pass through.

    A sample whose ``decode`` raises becomes a skip marker (or raises, under
    ``on_error='raise'``) naming its key and place: ``describe(sample, ref)`` gives
    them (default: a tar sample's ``__key__``, and its shard and byte offset).
    """
    if describe is None:
        describe = partial(_tar_sample, urls)
    async with aclosing(items):
        async for sample, ref in items:
            if decode is None or type(sample) is Skip:
                yield sample
                continue
            try:
                value = decode(sample)
            except Exception as error:
                key, where = describe(sample, ref)
                yield guard.skip(key, error, where=where)
                continue
            yield value


def _tar_sample(urls: Sequence[str], sample: Any, ref: Ref | None) -> tuple[Any, str | None]:
    """A tar sample's key, and where it is: its shard's URL and its first header's byte."""
    where = None if ref is None else f"{redact_url(urls[ref[0]])}, byte {ref[2]}"
    return sample.get("__key__"), where
