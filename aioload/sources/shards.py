"""ShardDataset: an iterable async dataset over WebDataset-style tar shards in a store.

How the shards are shared out, every epoch:

1. the list of shards is put in order — the given order, or a permutation
   drawn from ``(seed, epoch)`` with ``shuffle_shards`` (the same in every
   rank and worker, so that the split below is a partition);
2. rank ``r`` of ``world_size`` takes shards ``r, r + world_size, ...``
   (``RANK``/``WORLD_SIZE`` from the environment by default, as torchrun sets
   them);
3. worker ``w`` of ``num_workers`` takes every ``num_workers``-th shard of its
   rank's share (:func:`~aioload.get_worker_info`; the loader's own loop takes
   them all with ``num_workers=0``).

So one epoch yields every sample exactly once across all ranks and workers
(a rank or worker left without a shard yields nothing: have at least
``world_size * num_workers`` shards). Each shard is streamed: its samples come
while the rest of it is still arriving. With ``resampled=True`` every rank and
worker instead draws shards at random, with replacement, forever (seeded from
``(seed, epoch, rank, worker)``): end the epoch yourself.

A shuffle buffer of ``shuffle_buffer`` samples (seeded per epoch, rank and
worker) mixes samples across neighbouring shards; memory stays bounded by it.

Under the loader's fault policy (``retry``, ``on_error='skip'``) the stream comes from
:meth:`ShardDataset.guarded_stream`: shard reads are retried, and a sample that fails to
decode or a shard that cannot be read is skipped (:mod:`aioload.sources.shard_faults`).
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator, Sequence
from contextlib import aclosing
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import obstore

from aioload.datasets import IterableDataset
from aioload.ranks import rank_and_world_size
from aioload.sources.interleave import interleave
from aioload.sources.shard_faults import decoded, guarded_shards
from aioload.sources.stores import StoreLocation, raise_translated
from aioload.sources.tar import TarPosition, group_samples, iter_tar
from aioload.stream_faults import StreamGuard
from aioload.urls import redact_url
from aioload.worker_info import get_worker_info

__all__ = ["ShardDataset", "default_decode", "expand_urls"]

STREAM_CHUNK = 1 << 20  # bytes: the least obstore hands over at once while streaming a shard

_BRACES = re.compile(r"\{(\d+)\.\.(\d+)\}")


def expand_urls(urls: str | Sequence[str]) -> list[str]:
    """A list of shard URLs from a list, or from a brace pattern (WebDataset's notation).

    ``{000..009}`` expands to ``000``, ``001``, ..., ``009`` (the width of the
    first bound is kept); a string may hold several patterns.

    Example::

        >>> expand_urls("s3://b/shard-{00..02}.tar")
        ['s3://b/shard-00.tar', 's3://b/shard-01.tar', 's3://b/shard-02.tar']
    """
    if isinstance(urls, str):
        match = _BRACES.search(urls)
        if match is None:
            return [urls]
        first, last = match.group(1), match.group(2)
        if int(last) < int(first):
            raise ValueError(f"the range {match.group(0)} in {redact_url(urls)!r} is empty")
        head, tail = urls[: match.start()], urls[match.end() :]
        width = len(first)
        return [
            url
            for number in range(int(first), int(last) + 1)
            for url in expand_urls(f"{head}{number:0{width}d}{tail}")
        ]
    expanded = []
    for url in urls:
        if not isinstance(url, str):
            raise TypeError(f"shard URLs should be str; got {url!r}")
        expanded += expand_urls(url)
    return expanded


def default_decode(sample: dict[str, Any]) -> dict[str, Any]:
    """Decodes the fields of a sample by their extension; others stay bytes.

    ``npy`` -> numpy array, ``json`` -> object, ``txt``/``text`` -> str,
    ``cls``/``cls2``/``index``/``label`` -> int.

    Example::

        >>> default_decode({"__key__": "a", "cls": b"7", "txt": b"cat"})
        {'__key__': 'a', 'cls': 7, 'txt': 'cat'}
    """
    decoded: dict[str, Any] = {}
    for field, value in sample.items():
        extension = field.rpartition(".")[2]
        if field.startswith("__") or not isinstance(value, bytes | bytearray):
            decoded[field] = value
        elif extension == "npy":
            decoded[field] = np.load(io.BytesIO(value), allow_pickle=False)
        elif extension == "json":
            decoded[field] = json.loads(value)
        elif extension in ("txt", "text"):
            decoded[field] = value.decode("utf-8")
        elif extension in ("cls", "cls2", "index", "label"):
            decoded[field] = int(value)
        else:
            decoded[field] = value
    return decoded


class ShardDataset(IterableDataset[Any]):
    """Streams the samples of WebDataset-style tar shards from an object store.

    A sample is a dict ``{"__key__": key, "__url__": shard_url, field: bytes}``
    (one field per member of the sample: ``jpg``, ``cls``, ``npy`` ...),
    passed through ``decode``; ``__url__`` shows a password in the URL's
    userinfo as ``***``, as reprs and error messages do. See the module docstring for how shards are
    split across ranks and workers.

    Args:
        urls: the shard URLs, or one string with a brace pattern
            (``"s3://bucket/train-{000000..000099}.tar"``).
        decode: turns a sample dict into the sample the loader collates; runs
            where the shard is read (in the worker with ``num_workers > 0``).
            :func:`default_decode` decodes ``npy``, ``json``, ``txt``, ``cls``.
            Default: the dict of bytes.
        shuffle_shards: a new order of the shards every epoch (from ``seed``
            and the epoch; see :meth:`set_epoch`).
        shuffle_buffer: samples held in a shuffle buffer (0 or 1: none).
        seed: the seed of every shuffle and of ``resampled``.
        resampled: draw shards at random with replacement, endlessly.
        rank: this process's rank (default: the ``RANK`` environment variable,
            else 0).
        world_size: the number of ranks (default: ``WORLD_SIZE``, else 1).
        shards_in_flight: shards each worker (or the loader's loop) streams at
            once, taking one sample from each in turn (see
            :mod:`aioload.sources.interleave`): a shard waits a round trip for
            its first byte and then arrives at one connection's pace, so
            several at once keep a latency-bound store busy. The order stays
            deterministic. Default: 1, one shard after the other.
        **store_options: options of :func:`~aioload.sources.open_store`
            (endpoint, credentials, ...).

    Example::

        dataset = ShardDataset("s3://bucket/train-{000000..000099}.tar",
                               decode=default_decode, shuffle_shards=True,
                               shuffle_buffer=1000, **credentials)
        loader = DataLoader(dataset, batch_size=32, num_workers=2)
        for epoch in range(10):
            dataset.set_epoch(epoch)
            for batch in loader:
                ...
    """

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        decode: Callable[[dict[str, Any]], Any] | None = None,
        shuffle_shards: bool = False,
        shuffle_buffer: int = 0,
        seed: int = 0,
        resampled: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        shards_in_flight: int = 1,
        **store_options: Any,
    ) -> None:
        self.urls = expand_urls(urls)
        if not self.urls:
            raise ValueError("ShardDataset needs at least one shard URL")
        if decode is not None and not callable(decode):
            raise TypeError(f"decode should be callable (sample dict -> sample); got {decode!r}")
        if not isinstance(shuffle_buffer, int) or shuffle_buffer < 0:
            raise ValueError(f"shuffle_buffer should be an int >= 0; got {shuffle_buffer!r}")
        if not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed should be an int >= 0; got {seed!r}")
        if not isinstance(shards_in_flight, int) or shards_in_flight < 1:
            raise ValueError(f"shards_in_flight should be an int >= 1; got {shards_in_flight!r}")
        rank, world_size = rank_and_world_size(rank, world_size)
        self.decode = decode
        self.shuffle_shards = bool(shuffle_shards)
        self.shuffle_buffer = shuffle_buffer
        self.seed = seed
        self.resampled = bool(resampled)
        self.rank = rank
        self.world_size = world_size
        self.shards_in_flight = shards_in_flight
        self.epoch = 0
        # One location per store root (scheme and bucket or host), built and checked now.
        self._locations: dict[str, StoreLocation] = {}
        self._paths: list[tuple[str, str]] = []
        for url in self.urls:
            parts = urlsplit(url)
            root = f"{parts.scheme}://{parts.netloc}/"
            if root not in self._locations:
                self._locations[root] = StoreLocation(root, store_options)
            path = parts.path.lstrip("/")
            if not path or path.endswith("/"):
                raise ValueError(f"{redact_url(url)!r} names no shard (a tar object) in its store")
            self._paths.append((root, path))

    def set_epoch(self, epoch: int) -> None:
        """Sets the epoch the next iteration shuffles for (as ``DistributedSampler``).

        Call it before each epoch, in every rank, with the same value; without
        it every epoch has the order of epoch 0. Worker processes copy the
        dataset when they start, so persistent workers keep the epoch they
        started with.
        """
        if not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch should be an int >= 0; got {epoch!r}")
        self.epoch = epoch

    def shards(self, worker: int = 0, num_workers: int = 1) -> list[str]:
        """The shard URLs that worker ``worker`` of ``num_workers`` of this rank reads this epoch.

        (Not for ``resampled``, which draws them as it goes.)
        """
        return [self.urls[i] for i in self._order(worker, num_workers)]

    def _order(self, worker: int, num_workers: int) -> list[int]:
        order = np.arange(len(self.urls))
        if self.shuffle_shards:
            order = np.random.default_rng([self.seed, self.epoch]).permutation(order)
        mine = order[self.rank :: self.world_size][worker::num_workers]
        return [int(i) for i in mine]

    def _draws(self, worker: int) -> Iterator[int]:
        rng = np.random.default_rng([self.seed, self.epoch, self.rank, worker, 1])
        count = len(self.urls)
        while True:
            yield int(rng.integers(count))

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._stream(None)

    def guarded_stream(self, guard: StreamGuard) -> AsyncIterator[Any]:
        """The stream under the loader's fault policy (see :mod:`aioload.stream_faults`).

        The loader calls it instead of ``aiter(dataset)`` when it has ``retry`` or
        ``on_error='skip'``. The samples and their order are those of ``aiter(dataset)``;
        what fails is handled as :mod:`aioload.sources.shard_faults` says: shard reads that
        fail transiently are retried with the policy's backoff, a sample that ``decode``
        cannot decode is skipped (its key, the shard's URL and its byte offset recorded),
        and a shard that cannot be read (missing, truncated, corrupt, a store error after
        the retries) is skipped from where it failed, the stream going on with the next.

        Example::

            loader = DataLoader(dataset, batch_size=32, retry=RetryPolicy(attempts=3),
                                on_error="skip", max_skipped=100)
            for batch in loader: ...
            loader.skipped   # [SkippedItem(key='000017', ..., where='s3://...tar, byte 10240')]
        """
        return self._stream(guard)

    async def _stream(self, guard: StreamGuard | None) -> AsyncGenerator[Any, None]:
        info = get_worker_info()
        worker, num_workers = (0, 1) if info is None else (info.id, info.num_workers)
        picks: Iterator[int] = (
            self._draws(worker) if self.resampled else iter(self._order(worker, num_workers))
        )
        open_shard: Callable[[int], AsyncGenerator[Any, None]] = self._samples
        if guard is not None:  # samples travel with their place until decoded
            open_shard = guarded_shards(self._samples, self.urls, guard)
        samples: AsyncGenerator[Any, None] = (
            self._one_by_one(picks, open_shard)
            if self.shards_in_flight == 1
            else interleave(picks, open_shard, self.shards_in_flight)
        )
        if self.shuffle_buffer > 1:
            rng = np.random.default_rng([self.seed, self.epoch, self.rank, worker])
            samples = _shuffled(samples, self.shuffle_buffer, rng)
        decode = self.decode
        if guard is not None:
            samples, decode = decoded(samples, decode, guard), None
        async with aclosing(samples):
            async for sample in samples:
                yield sample if decode is None else decode(sample)

    async def _one_by_one(
        self, picks: Iterator[int], open_shard: Callable[[int], AsyncGenerator[Any, None]]
    ) -> AsyncGenerator[Any, None]:
        for index in picks:
            async with aclosing(open_shard(index)) as samples:
                async for sample in samples:
                    yield sample

    async def _samples(
        self, index: int, position: TarPosition | None = None
    ) -> AsyncGenerator[dict[str, Any], None]:
        """The samples of shard ``index``, as its bytes arrive (``position``: where they are).

        Their ``__url__``, as every message, shows the URL's password as ``***``.
        """
        url = redact_url(self.urls[index])
        root, path = self._paths[index]
        location = self._locations[root]
        # Closed innermost last, whatever ends the iteration (the end, a break, an error).
        async with (
            aclosing(_shard_stream(location, path, url)) as stream,
            aclosing(iter_tar(stream, url, position)) as members,
            aclosing(group_samples(members, url, position)) as grouped,
        ):
            async for sample in grouped:
                yield sample

    def __repr__(self) -> str:
        return f"ShardDataset({len(self.urls)} shards, e.g. {redact_url(self.urls[0])!r})"


async def _shard_stream(
    location: StoreLocation, path: str, url: str
) -> AsyncGenerator[bytes, None]:
    """The bytes of one shard, chunk by chunk as they arrive; errors name the shard."""
    try:
        result = await obstore.get_async(location.store, path)
        chunks = aiter(result.stream(min_chunk_size=STREAM_CHUNK))
    except Exception as error:
        raise_translated(error, url)
    while True:
        try:
            chunk = await anext(chunks)
        except StopAsyncIteration:
            return
        except Exception as error:
            raise_translated(error, url)
        yield chunk


async def _shuffled(
    samples: AsyncGenerator[Any, None], size: int, rng: np.random.Generator
) -> AsyncGenerator[Any, None]:
    """The samples in a random order, through a buffer of ``size``."""
    buffer: list[Any] = []
    async with aclosing(samples):
        async for sample in samples:
            if len(buffer) < size:
                buffer.append(sample)
                continue
            slot = int(rng.integers(size))
            buffer[slot], sample = sample, buffer[slot]
            yield sample
    order = rng.permutation(len(buffer))
    for slot in order:
        yield buffer[int(slot)]
