"""A ShardDataset's stream under the loader's fault policy: retried shards, skipped samples.

:meth:`ShardDataset.guarded_stream <aioload.sources.ShardDataset.guarded_stream>` builds
the same stream as iterating the dataset, with two layers of this module in it (see
:mod:`aioload.stream_faults` for the protocol):

- every shard is read through :func:`guarded_shards`: a read that fails with a
  transient error (``retry.retry_on``: by default ``OSError`` and ``TimeoutError``,
  which a missing object is too) is tried again after the policy's backoff, from the
  start of the shard, its samples already delivered passed over (the attempts count
  again from 1 once a new sample arrives). A shard that still cannot be read — a
  missing object, a truncated or corrupt tar, a store error after the retries — ends
  where it failed with one skip record (key: the shard's URL; where: the byte offset
  of the first sample lost) and the stream goes on with the next shard;
- after the shuffle buffer, :func:`decoded` decodes each sample; a sample whose
  ``decode`` raises is skipped (key: its ``__key__``; where: the shard's URL and the
  byte offset of the sample's first header).

Until decoded, a sample travels with its shard's URL and offset, as a tuple. The skip
markers take their place in the stream like samples, through the rotation of
``shards_in_flight`` and the shuffle buffer, so the order depends on the seed and on
what failed, never on timing. A sample that fails to decode takes its place in the
shuffle and is dropped only after it: the others come in the order they would without
it. Under ``on_error='raise'`` each of these failures raises where it happened, with
its error's type and a note naming the key and place.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Sequence
from contextlib import aclosing
from typing import Any

from aioload.fetch import Skip
from aioload.sources.tar import TarPosition
from aioload.stream_faults import StreamGuard
from aioload.urls import redact_url

__all__ = ["OpenShard", "decoded", "guarded_shards"]

OpenShard = Callable[[int, TarPosition], AsyncGenerator[dict[str, Any], None]]
"""Opens shard ``index``'s samples, keeping a :class:`TarPosition` up to date."""


def guarded_shards(
    open_shard: OpenShard, urls: Sequence[str], guard: StreamGuard
) -> Callable[[int], AsyncGenerator[Any, None]]:
    """``open_shard`` under ``guard``: each shard's samples (with their URL and offset),
    retried while its reads fail transiently, ended by a skip marker where it fails for good.

    Args:
        open_shard: a shard's samples by index (the dataset's own reader).
        urls: the shards' URLs, by index (redacted for the records).
        guard: the stream's guard.
    """

    def open_guarded(index: int) -> AsyncGenerator[Any, None]:
        return _guarded_shard(open_shard, index, redact_url(urls[index]), guard)

    return open_guarded


async def _guarded_shard(
    open_shard: OpenShard, index: int, url: str, guard: StreamGuard
) -> AsyncGenerator[Any, None]:
    delivered = 0  # samples of this shard yielded so far, whatever the attempt
    failures = 0  # failed attempts since the last new sample
    lost_from = 0  # where the first sample not yet yielded starts
    while True:
        position = TarPosition()
        seen = 0
        try:
            async with aclosing(open_shard(index, position)) as samples:
                async for sample in samples:
                    seen += 1
                    if seen <= delivered:
                        continue  # read again after a retry: yielded before it
                    delivered += 1
                    failures = 0
                    lost_from = position.pending
                    yield (sample, url, position.sample)
            return
        except Exception as error:
            failures += 1
            if guard.again(error, failures):
                await guard.backoff(failures)
                continue
            where = f"{url}: the rest of the shard, from byte {lost_from}"
            yield guard.skip(url, error, attempts=failures, where=where)
            return


async def decoded(
    samples: AsyncGenerator[Any, None],
    decode: Callable[[dict[str, Any]], Any] | None,
    guard: StreamGuard,
) -> AsyncGenerator[Any, None]:
    """The samples of :func:`guarded_shards`' shards, decoded; skip markers pass through.

    A sample whose ``decode`` raises becomes a skip marker (or raises, under
    ``on_error='raise'``) naming its key, shard and byte offset.
    """
    async with aclosing(samples):
        async for item in samples:
            if type(item) is Skip:
                yield item
                continue
            sample, url, offset = item
            if decode is None:
                yield sample
                continue
            try:
                value = decode(sample)
            except Exception as error:
                key = sample.get("__key__")
                yield guard.skip(key, error, where=f"{url}, byte {offset}")
                continue
            yield value
