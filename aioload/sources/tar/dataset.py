"""ShardDataset: an iterable async dataset over WebDataset-style tar shards in a store.

How an epoch is shared out: the list of shards is put in order — the given order, or a
permutation drawn from ``(seed, epoch)`` with ``shuffle_shards`` (the same in every rank
and worker, so that the split below is a partition) — and then split in one of two ways
(``split``):

- ``"samples"`` (the default with ``world_size > 1``): every rank gets the same number of
  samples, as :class:`~aioload.DistributedSampler` shares indices (``drop_last`` drops the
  tail of the epoch, else it is padded by repeating samples from its start), in contiguous
  runs cut at sample boundaries; each of a rank's workers gets whole batches of its share
  (:mod:`aioload.sources.streams.split`). A shard cut in the middle is read with one
  byte-range request from a sample's offset. It needs every shard's sample count and
  offsets: its index (:mod:`aioload.sources.tar.index`), read from the index file
  beside the shard or, without one, built by reading the shard whole, once
  (:meth:`ShardDataset.load_indexes`). ``len(dataset)`` is the samples per rank, and
  ``len(loader)`` is true and the same on every rank whatever ``num_workers``.
- ``"shards"`` (the default with one rank): rank ``r`` of ``world_size`` takes shards
  ``r, r + world_size, ...`` (by default from ``torch.distributed`` when it is
  initialised, else ``RANK``/``WORLD_SIZE`` from the environment, as torchrun sets them)
  and worker ``w`` of ``num_workers`` every ``num_workers``-th shard
  of its rank's share (:func:`~aioload.get_worker_info`; the loader's own loop takes them
  all with ``num_workers=0``). No index is needed; ranks and workers get what their
  shards hold (a rank or worker left without a shard yields nothing), and the dataset has
  no length.

Either way one epoch yields every sample exactly once across all ranks and workers (plus
the padding). Each shard is streamed: its samples come while the rest of it is still
arriving. With ``resampled=True`` every rank and worker instead draws shards at random,
with replacement, forever (seeded from ``(seed, epoch, rank, worker)``): end the epoch
yourself (:mod:`aioload.sources.tar.resampled`).

A shuffle buffer of ``shuffle_buffer`` samples (seeded per epoch, rank and
worker) mixes samples across neighbouring shards; memory stays bounded by it.

The split, the epochs and the checkpoints are every stream dataset's
(:class:`~aioload.sources.streams.dataset.StreamDataset`): ``state_dict`` after any batch,
an exact resume with the same layout, a re-split of what is left over other workers
(:meth:`ShardDataset.resume_streams`) or over the ranks of a job of another size
(:meth:`ShardDataset.merge_states`). What is the shards' own is here — their indexes,
and checking a state against them — and in :mod:`aioload.sources.tar.reads`: reading a
shard, or part of one from a sample's byte offset, and the shuffle buffer's samples again.

With ``cache_dir`` a shard read once is kept on local disk, and later epochs
read it from there (:mod:`aioload.sources.cache`).

A shard compressed as a whole (``.tar.gz`` or ``.tgz``; ``.tar.zst``, ``.tar.bz2``,
``.tar.xz`` too) is decompressed as it arrives (:mod:`aioload.sources.decompress`; the
cache keeps it as stored). Its samples cannot be read by byte range, so it has no index:
the ``"samples"`` split, the default with several ranks, falls back to whole shards for a
dataset with compressed shards (a warning says so; asking for it by name is an error),
and a resumed shard is read again from its start, decompressed, and its samples already
delivered passed over (its byte positions are the decompressed tar's).

Under the loader's fault policy (``retry``, ``on_error='skip'``) the stream comes from
:meth:`ShardDataset.guarded_stream`: shard reads are retried, and a sample that fails to
decode or a shard that cannot be read is skipped (:mod:`aioload.sources.streams.faults`);
it checkpoints and resumes as the plain stream does.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from contextlib import aclosing
from functools import partial
from typing import Any, Literal
from urllib.parse import urlsplit

import numpy as np

from aioload.faults.guard import StreamGuard
from aioload.old_paths import upgrade_objects
from aioload.sources.cache.local import LocalCache
from aioload.sources.decoders import Decoder, as_decoder, default_decode
from aioload.sources.decompress import zstd_decompressor
from aioload.sources.stores.braces import expand_urls
from aioload.sources.stores.reads import CountedReads
from aioload.sources.stores.store import StoreLocation, StoreLocations
from aioload.sources.stores.tasks import READS_AT_ONCE, bounded_gather, run_blocking
from aioload.sources.streams.dataset import StreamDataset
from aioload.sources.streams.faults import decoded, guarded_runs
from aioload.sources.streams.split import Segment
from aioload.sources.streams.state import Ref, Run, ShardStateError, StreamState, check_state
from aioload.sources.streams.tracked import OpenRun, reread, resumed_stream
from aioload.sources.tar.index import BLOCK, ShardIndex
from aioload.sources.tar.indexes import MissingIndexes, find_index, put_index, warn_built
from aioload.sources.tar.reader import tar_compression
from aioload.sources.tar.reads import ShardReads, stored_shard
from aioload.sources.tar.resampled import (
    guarded_shards,
    plain_shards,
    resampled_stream,
    shard_draws,
)
from aioload.stats.source_counts import SourceCounter
from aioload.urls import redact_url
from aioload.worker_info import get_worker_info

__all__ = ["ShardDataset", "default_decode"]


class ShardDataset(CountedReads, StreamDataset[StreamState]):
    """Streams the samples of WebDataset-style tar shards from an object store.

    A sample is a dict ``{"__key__": key, "__url__": shard_url, field: bytes}``
    (one field per member of the sample: ``jpg``, ``cls``, ``npy`` ...),
    passed through ``decode``; ``__url__`` shows a password in the URL's
    userinfo as ``***``, as reprs and error messages do. See the module docstring for how shards are
    split across ranks and workers.

    With ``split="samples"`` it has a length: ``len(dataset)`` is the samples this rank
    yields per epoch, the same on every rank, and ``len(loader)`` (``ceil(len / batch_size)``,
    or ``len // batch_size`` with the loader's ``drop_last``) is the batches every rank's
    loader yields, with any ``num_workers``: every worker's share is whole batches but one
    (the loader tells its workers the batch size through
    :attr:`~aioload.WorkerInfo.batch_size`).

    Args:
        urls: the shard URLs, or one string with a brace pattern
            (``"s3://bucket/train-{000000..000099}.tar"``). A name ending with
            ``.tar.gz`` or ``.tgz`` (``.tar.zst``, ``.tar.bz2``, ``.tar.xz``) is a
            compressed shard, decompressed as it arrives.
        decode: turns a sample dict into the sample the loader collates; runs
            where the shard is read (in the worker with ``num_workers > 0``).
            A callable, a :class:`~aioload.sources.Decoder`, or a mapping of
            extension -> ``fn(bytes)`` merged over the default decoders
            (``decode={"jpg": my_fn}``). :func:`default_decode` decodes
            images, ``npy``, ``npz``, ``json``, ``txt``, ``cls`` (see
            :mod:`aioload.sources.decoders`). Default: the dict of bytes.
        shuffle_shards: a new order of the shards every epoch (from ``seed``
            and the epoch; see :meth:`set_epoch`).
        shuffle_buffer: samples held in a shuffle buffer (0 or 1: none).
        seed: the seed of every shuffle and of ``resampled``.
        resampled: draw shards at random with replacement, endlessly.
        rank: this process's rank (default: ``torch.distributed``'s when it is
            initialised, else the ``RANK`` environment variable, else 0; see
            :func:`~aioload.rank_and_world_size`).
        world_size: the number of ranks (default: likewise, else ``WORLD_SIZE``, else 1).
        shards_in_flight: shards each worker (or the loader's loop) streams at
            once, taking one sample from each in turn (see
            :mod:`aioload.sources.streams.interleave`): a shard waits a round trip for
            its first byte and then arrives at one connection's pace, so
            several at once keep a latency-bound store busy. The order stays
            deterministic. Default: 1, one shard after the other.
        cache_dir: a local folder that keeps every shard read, so that later
            epochs read it from disk and send the store no request for it
            (shared safely by workers and processes; see
            :class:`~aioload.sources.LocalCache`). Default: no cache.
        cache_limit: the most bytes the cache takes on disk, partial
            downloads included: an int, or a size such as ``"50GB"``,
            ``"512MiB"``; least recently used shards go first. Default: no
            limit but the disk's.
        split: ``"samples"``: the same number of samples on every rank, split at
            sample granularity (needs the shards' indexes); ``"shards"``: whole shards
            per rank and worker (see the module docstring). Default: ``"samples"``
            with ``world_size > 1``, else ``"shards"``; ``"shards"``, with a
            warning, when some shards are compressed (they have no index).
        drop_last: with ``split="samples"``, drop the epoch's last
            ``total % world_size`` samples instead of padding the ranks' shares by
            repeating samples from the epoch's start (``DistributedSampler``'s
            choice, and its default: pad).
        storage_options: the stores' options, one mapping for every shard's store:
            ``{"endpoint": ..., "region": ..., "access_key_id": ...}``, any option of
            :func:`~aioload.sources.open_store` (default: from the environment).
        hedge: send a read again when it is slow, and take the first answer (see
            :mod:`aioload.sources.stores.hedge`): True, after the 95th percentile of
            the store's recent reads; a float, after that many seconds; False (the
            default), never. At most about five hedges per hundred reads.
        max_requests_per_second: the most GET requests a second the dataset sends, all
            its copies in the loader's worker processes together (see
            :mod:`aioload.sources.stores.budget`). Default: no limit.

    Example::

        >>> import os, tempfile
        >>> from pathlib import Path
        >>> from aioload import DataLoader
        >>> from aioload.sources import ShardWriter, default_decode
        >>> folder = tempfile.TemporaryDirectory()
        >>> with ShardWriter(os.path.join(folder.name, "train-%06d.tar"), maxcount=10) as writer:
        ...     for i in range(30):
        ...         writer.write({"__key__": f"{i:04d}", "cls": i % 10, "txt": f"sample {i}"})
        >>> urls = Path(folder.name).as_uri() + "/train-{000000..000002}.tar"  # or s3://...
        >>> dataset = ShardDataset(urls, decode=default_decode, shuffle_shards=True,
        ...                        shuffle_buffer=8, split="samples")
        >>> loader = DataLoader(dataset, batch_size=8)
        >>> len(loader)   # under torchrun: the same on every rank (split="samples")
        4
        >>> for epoch in range(2):
        ...     dataset.set_epoch(epoch)
        ...     keys = [key for batch in loader for key in batch["__key__"]]
        ...     print(f"epoch {epoch}: {len(keys)} samples, {len(set(keys))} different")
        epoch 0: 30 samples, 30 different
        epoch 1: 30 samples, 30 different
        >>> folder.cleanup()
    """

    _whole_split, _sized_split, _unit_name = "shards", "samples", "shard"
    _shuffle_key, _in_flight_key = "shuffle_shards", "shards_in_flight"
    _state_prefix = "shard stream state"
    split: Literal["samples", "shards"]

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        decode: Callable[[dict[str, Any]], Any]
        | Mapping[str, Callable[[bytes], Any] | None]
        | Decoder
        | None = None,
        shuffle_shards: bool = False,
        shuffle_buffer: int = 0,
        seed: int = 0,
        resampled: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        shards_in_flight: int = 1,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | str | None = None,
        split: Literal["samples", "shards"] | None = None,
        drop_last: bool = False,
        storage_options: Mapping[str, Any] | None = None,
        hedge: bool | float = False,
        max_requests_per_second: float | None = None,
    ) -> None:
        self.urls = expand_urls(urls)
        if not self.urls:
            raise ValueError("ShardDataset needs at least one shard URL")
        decode = as_decoder(decode, "sample dict -> sample")
        if cache_dir is None and cache_limit is not None:
            raise ValueError("cache_limit was given without cache_dir: name the cache's folder")
        self._compressions = [tar_compression(urlsplit(url).path) for url in self.urls]
        if "zstd" in self._compressions:
            zstd_decompressor()  # the extra is missing: say so now
        compressed = self._compressed()
        if compressed and split == "samples":
            raise ValueError(
                f"split='samples' reads samples by byte range, which a compressed shard "
                f"({redact_url(compressed[0])!r}) does not allow: pass split='shards', or "
                "store the shards as plain .tar"
            )
        self._init_stream(
            shuffle_units=shuffle_shards,
            shuffle_buffer=shuffle_buffer,
            seed=seed,
            rank=rank,
            world_size=world_size,
            split=split,
            drop_last=drop_last,
            in_flight=shards_in_flight,
        )
        self.decode = decode
        self.resampled = bool(resampled)
        self.cache = None if cache_dir is None else LocalCache(cache_dir, cache_limit)
        self._counts = SourceCounter()
        self._indexes: list[ShardIndex] | None = None  # loaded once, sent to workers
        self._built: set[int] = set()  # shards whose index was built: no index file yet
        # One location per store root (scheme and bucket or host), built and checked now.
        stores = StoreLocations(
            storage_options, hedge=hedge, max_requests_per_second=max_requests_per_second
        )
        self._objects: list[tuple[StoreLocation, str]] = []  # each shard's store and path
        for url in self.urls:
            location, path = stores.of(url)
            if not path or path.endswith("/"):
                raise ValueError(f"{redact_url(url)!r} names no shard (a tar object) in its store")
            self._objects.append((location, path))
        self._reads = ShardReads(
            self.urls, self._objects, self._compressions, self.cache, self._counts
        )

    def _compressed(self) -> list[str]:
        return [
            url for url, kind in zip(self.urls, self._compressions, strict=True) if kind != "none"
        ]

    def _default_split(self, world_size: int) -> str:
        compressed = self._compressed()
        if world_size > 1 and compressed:
            warnings.warn(
                f"ShardDataset: {len(compressed)} of the {len(self.urls)} shards are "
                f"compressed (e.g. {redact_url(compressed[0])!r}), so the {world_size} "
                "ranks split whole shards (split='shards'), not samples: ranks may get "
                "different numbers of samples, and the dataset has no length. Stop "
                "every rank at the same step, or store the shards as plain .tar",
                UserWarning,
                stacklevel=4,
            )
            return "shards"
        return super()._default_split(world_size)

    @property
    def shuffle_shards(self) -> bool:
        """Whether every epoch has a new order of the shards."""
        return self.shuffle_units

    @property
    def shards_in_flight(self) -> int:
        """The shards each worker streams at once."""
        return self.units_in_flight

    def shards(
        self, worker: int = 0, num_workers: int = 1, batch_size: int | None = None
    ) -> list[str]:
        """The shard URLs that worker ``worker`` of ``num_workers`` of this rank reads this epoch.

        With ``split="samples"`` some may be read in part and a shard may come twice (the
        padding); which ones a worker reads depends on the loader's ``batch_size`` (see
        :meth:`segments`). Not for ``resampled``, which draws them as it goes.
        """
        plan = self._plan(self.epoch, self.rank, self.world_size, worker, num_workers, batch_size)
        return [self.urls[run.shard] for run in plan]

    def segments(
        self, worker: int = 0, num_workers: int = 1, batch_size: int | None = None
    ) -> list[Segment]:
        """What worker ``worker`` of ``num_workers`` of this rank reads this epoch (``"samples"``).

        Runs of consecutive samples, each of one shard (``segment.shard`` numbers
        :attr:`urls`), in the order they are read; a loader's worker makes batches of
        ``batch_size`` of them. Loads the indexes first (see :meth:`indexes`).

        Example::

            dataset.segments()   # rank 1 of 3, e.g.
            # [Segment(shard=2, start=40, stop=100), Segment(shard=7, start=0, stop=13)]
        """
        if self.split != "samples":
            raise ValueError("segments() describes split='samples'; this dataset splits shards")
        plan = self._plan(self.epoch, self.rank, self.world_size, worker, num_workers, batch_size)
        return [Segment(run.shard, run.start, run.stop) for run in plan]

    def __len__(self) -> int:
        """The samples this rank yields per epoch, the same on every rank (``split="samples"``).

        Loads the shards' indexes first (see :meth:`indexes`).

        Raises:
            TypeError: ``resampled`` (endless), or ``split="shards"`` (a rank gets
                what its shards hold: no length is promised).
        """
        if self.resampled:
            raise TypeError(f"{self!r} is resampled: it draws shards endlessly and has no length")
        return self._samples_per_rank()

    def indexes(self) -> list[ShardIndex]:
        """Every shard's :class:`~aioload.sources.tar.index.ShardIndex`, in :attr:`urls` order.

        Loaded once (see :meth:`load_indexes`) and kept; this waits for it. Called
        where an event loop runs (inside a coroutine), it holds that loop up while
        it loads: there, ``await dataset.load_indexes()`` first.
        """
        if self._indexes is None:
            return run_blocking(self.load_indexes)
        return self._indexes

    async def load_indexes(self) -> list[ShardIndex]:
        """Loads every shard's index once, and keeps it (for the dataset's life).

        An index comes from the file beside its shard (``<shard>.idx.json``, as
        :class:`~aioload.sources.ShardWriter` writes it), checked; a shard without
        one is read whole and its index built from its tar headers (a warning is logged
        before the first such read, naming the ``aioload index`` command that writes
        the files: it costs the shard's download; :meth:`write_indexes` saves them too).
        Loaded before an epoch starts its worker processes (by ``len(loader)``, or
        this call), the indexes travel to the workers with the dataset; otherwise
        every worker loads them itself.

        Raises:
            ShardIndexError: an index file that is malformed or of another version.
            FileNotFoundError, ...: a shard (or index file) that cannot be read.
        """
        if self._indexes is None:
            missing = MissingIndexes(self.urls)  # warns before the first shard read whole
            found = await bounded_gather(
                [partial(self._find_index, i, missing=missing) for i in range(len(self.urls))],
                READS_AT_ONCE,
            )
            warn_built(
                [redact_url(self.urls[i]) for i, (_, built) in enumerate(found) if built],
                len(found),
                self.urls,
            )
            self._indexes = [index for index, _ in found]
            self._built = {i for i, (_, built) in enumerate(found) if built}
        return self._indexes

    async def write_indexes(self, *, overwrite: bool = False) -> list[str]:
        """Writes the index file of every shard that has none, beside it; returns their URLs.

        Every later run (and every rank and worker) then reads the small index files
        instead of reading shards whole. Needs write access to the store.

        Args:
            overwrite: build every index from its shard again and write it, even where
                a file exists (after shards were rewritten).

        Example::

            dataset = ShardDataset("s3://bucket/train-{000000..000099}.tar",
                                   storage_options=options)
            written = asyncio.run(dataset.write_indexes())
        """
        if self._indexes is not None and not overwrite:
            # Loaded already: the shards read to build their indexes are not read again.
            indexes, built = self._indexes, sorted(self._built)
        else:
            found = await bounded_gather(
                [partial(self._find_index, i, build=overwrite) for i in range(len(self.urls))],
                READS_AT_ONCE,
            )
            indexes = [index for index, _ in found]
            built = [i for i, (_, was_built) in enumerate(found) if was_built]

        async def write(number: int) -> str:
            location, path = self._objects[number]
            url = redact_url(self.urls[number])
            return await put_index(location, path, url, indexes[number])

        written = await bounded_gather([partial(write, i) for i in built], READS_AT_ONCE)
        self._indexes, self._built = indexes, set()
        return written

    async def _find_index(
        self, number: int, build: bool = False, missing: MissingIndexes | None = None
    ) -> tuple[ShardIndex, bool]:
        url = redact_url(self.urls[number])
        if self._compressions[number] != "none":
            raise ValueError(
                f"{url} is a compressed shard: it has no index (its samples cannot be read "
                "by byte range)"
            )
        location, path = self._objects[number]
        stream = partial(stored_shard, location, path, url, self._counts)
        return await find_index(location, path, url, stream, build=build, missing=missing)

    async def _stream(self, guard: StreamGuard | None) -> AsyncGenerator[Any, None]:
        info = get_worker_info()
        worker, num_workers = (0, 1) if info is None else (info.id, info.num_workers)
        if self.resampled:
            items = self._resampled(worker, guard)
        else:
            batch_size = None if info is None else info.batch_size
            items = await self._tracked(worker, num_workers, batch_size, guard)
        decode = self.decode
        if guard is not None:  # decoded after the shuffle, a failure skipped by its ref
            async with aclosing(decoded(items, self.urls, decode, guard)) as samples:
                async for sample in samples:
                    yield sample
            return
        async with aclosing(items):
            async for sample, _ in items:
                yield sample if decode is None else decode(sample)

    def _resampled(
        self, worker: int, guard: StreamGuard | None
    ) -> AsyncGenerator[tuple[Any, Ref | None], None]:
        """Shards drawn at random, endlessly (:mod:`aioload.sources.tar.resampled`)."""
        draws = shard_draws(len(self.urls), [self.seed, self.epoch, self.rank, worker, 1])
        open_shard = (
            plain_shards(self._reads.samples)
            if guard is None
            else guarded_shards(
                guarded_runs(self._run_samples, self.urls, guard, self._reads.rest_of_shard)
            )
        )
        rng = np.random.default_rng([self.seed, self.epoch, self.rank, worker])
        return resampled_stream(draws, open_shard, self.shards_in_flight, self.shuffle_buffer, rng)

    async def _tracked(
        self, worker: int, num_workers: int, batch_size: int | None, guard: StreamGuard | None
    ) -> AsyncGenerator[tuple[Any, Ref | None], None]:
        """This worker's stream, as ``(sample, ref)``: fresh, or resumed from the state
        loaded last. Under ``guard`` its runs are read by :func:`guarded_runs`."""
        if self.split == "samples":
            await self.load_indexes()
        start = self._start(worker, num_workers, batch_size)
        open_run: OpenRun = self._run_samples
        if guard is not None:
            open_run = guarded_runs(open_run, self.urls, guard, self._reads.rest_of_shard)
        stream = await resumed_stream(
            start.plan,
            start.resumed,
            open_run,
            self._reread,
            self.shards_in_flight,
            self.shuffle_buffer,
            start.rng,
        )
        self._live = partial(stream.state, self.epoch, start.layout)
        return stream.items()

    # -- the stream's units and states (StreamDataset's hooks) -----------------------

    def _unit_count(self) -> int:
        return len(self.urls)

    def _unit_counts(self) -> list[int]:
        return [len(index) for index in self.indexes()]

    def _offset_of(self, shard: int, position: int) -> int:
        index = self.indexes()[shard]
        return int(index.offsets[position]) if position < len(index) else index.shard_size

    def _check_state(self, state: Any) -> StreamState:
        self._refuse_resampled([state])
        checked = check_state(state, shards=len(self.urls))
        for span in checked.spans():
            if any(byte is not None and byte % BLOCK for byte in (span.first, span.end)):
                self._refuse(
                    f"samples {span} of shard {span.unit} at bytes {span.first} to "
                    f"{span.end}: a tar sample starts and ends at a {BLOCK}-byte block"
                )
        if self.split == "samples" or self._indexes is not None:
            self._check_known(checked)  # the indexes of a sample split: loaded here if need be
        return checked

    def _check_known(self, state: StreamState) -> None:
        """Refuses a state naming samples or bytes the shards' indexes do not have."""
        indexes = self.indexes()
        keys = {(ref[0], ref[1]): ref[4] for ref in state.buffer}
        for span in state.spans():
            index = indexes[span.unit]
            count = len(index)
            stop = count if span.stop == -1 else span.stop
            if span.empty or (span.start == count and span.stop == -1):
                continue
            url = redact_url(self.urls[span.unit])
            if not span.start < stop <= count:
                self._refuse(f"it names samples {span} of {url}, which has {count}")
            first, size = int(index.offsets[span.start]), int(index.sizes[span.start])
            key = keys.get((span.unit, span.start)) if span.end is not None else None
            if (
                span.first != first
                or (span.end is not None and not first < span.end <= first + size)
                or key not in (None, index.keys[span.start])
            ):
                self._refuse(
                    f"{url} has sample {span.start} ({index.keys[span.start]!r}) at byte "
                    f"{first}, not where the state says: the state is of other shards"
                )

    def _state_json(self, state: StreamState) -> dict[str, Any]:
        return state.to_json(len(self.urls))

    def _new_state(self, epoch: int, layout: dict[str, Any], runs: list[Run]) -> StreamState:
        return StreamState(epoch, layout, runs)

    def _run_samples(self, run: Run) -> AsyncGenerator[tuple[Any, Ref, bool], None]:
        """The samples of ``run`` with their refs, as they arrive, checked by the shard's
        index where the split loaded it (:meth:`ShardReads.run
        <aioload.sources.tar.reads.ShardReads.run>`)."""
        indexes = self._indexes if self.split == "samples" else None
        return self._reads.run(run, indexes[run.shard] if indexes else None)

    async def _reread(self, refs: Sequence[Ref]) -> list[Any]:
        """The samples ``refs`` name, read again: one range request per run of neighbours,
        one read of each compressed shard (:func:`~aioload.sources.streams.tracked.reread`)."""
        compressed = self._compressions
        return await reread(refs, lambda shard: compressed[shard] != "none", self._reads.refs)

    def state_dict(self) -> dict[str, Any] | None:
        """Where this process's stream stands: the samples it has not yielded, as JSON.

        Taken by the loader after every batch (see :meth:`DataLoader.state_dict()
        <aioload.DataLoader.state_dict>`): shard numbers, sample positions, byte offsets
        and the shuffle buffer's keys, never sample bytes (the layout is
        :mod:`aioload.sources.streams.state`). None before the first iteration.

        Example::

            state = dataset.state_dict()       # within an iteration, e.g. in a worker
            json.dumps(state)                  # plain JSON
        """
        if self.resampled:
            return {"format": "aioload.shard-stream", "resampled": True}
        return super().state_dict()

    def _refuse_resampled(self, states: Sequence[Any]) -> None:
        resampled = any(isinstance(s, Mapping) and s.get("resampled") for s in states)
        if self.resampled or resampled:
            raise ShardStateError(
                "shard stream state: a resampled ShardDataset draws shards endlessly and "
                "does not resume mid-epoch; start a new epoch (set_epoch) instead"
            )

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(upgrade_objects(state))  # a pickle of the old layout, too
        if "_reads" not in state:
            self._reads = ShardReads(
                self.urls, self._objects, self._compressions, self.cache, self._counts
            )

    def __repr__(self) -> str:
        return f"ShardDataset({len(self.urls)} shards, e.g. {redact_url(self.urls[0])!r})"
