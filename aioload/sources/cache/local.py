"""LocalCache: keeps what a dataset read from a store on local disk, for the next epochs.

``ShardDataset(..., cache_dir=..., cache_limit=...)`` and the same arguments of
``ObjectDataset`` build one. A shard (or object) read once is kept in the
folder; later reads of it, in any epoch, worker or process on the machine,
read the file and send the store no request.

- **Streaming on a miss.** A shard's samples come while it downloads: a
  task writes the store's bytes into a ``.part`` file in the folder, and the
  reader follows it through that file. The task runs at the store's pace,
  not the reader's, so two readers waiting on each other's shards (several
  shards in flight, two processes) never block each other. Once complete,
  the file is fsynced and renamed into place (:mod:`.cache_folder`).
- **Small entries, fetched together.** :meth:`LocalCache.read` reads one small object
  (an object of an ``ObjectDataset``, a Parquet footer); :meth:`LocalCache.read_many`
  several (a Parquet read's column chunks): those not kept are fetched with one call, so
  that neighbours share a request, and each is kept as an entry of its own.
- **One download per entry.** The process that downloads an entry holds its
  lock file; another reader of the same entry (another worker or process)
  waits for that download, then reads the file. A waiter whose writer makes
  no progress for :data:`WAIT_STALL` seconds reads from the store itself.
  Within one process, two readers of one shard (``resampled``) are handled
  the same way.
- **Bounded.** At most ``limit`` bytes on disk, partial downloads included;
  least recently used entries go first, and never one being read. An entry
  that does not fit (larger than the limit, or everything else is being read)
  is streamed from the store without being kept, and evicts nothing. The
  limit is the folder's, recorded in it: every instance that shares the
  folder keeps to it, one given no limit included, and one given another
  limit replaces it for all (with a warning).
- **This user's own folder.** Created ``0700``; refused when another user
  owns it or others can write it; its files are never opened through a link
  (:mod:`.cache_folder`).
- **Kept only whole.** A reader that stops early (a ``break``) cancels the
  download and the entry is not kept, unless what it left is a tar
  archive's end-of-archive padding (:data:`FINISH_LEFT`).
- **Never worse than the store.** If writing to the folder fails (a full
  disk), the reader goes on from the store where the file left off; a folder
  that cannot be used at all (removed, read-only) is read past.

The cache trusts that an object does not change under its URL (shards and
datasets are written once): it never asks the store whether its copy is
current. Clear the folder after rewriting a dataset in place.

Counts go to the dataset's :class:`~aioload.stats.source_counts.SourceCounter`:
one hit or miss per entry read (a miss also when the entry is not kept);
the bytes from the store are counted where they arrive (the dataset's
opener).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from contextlib import aclosing
from typing import TYPE_CHECKING, Any

import anyio

from aioload.sources.cache.folder import CacheFolder, EntryFiles
from aioload.sources.sizes import parse_size
from aioload.stats.source_counts import SourceCounter

if TYPE_CHECKING:
    from aioload.sources.stores.store import StoreLocation

__all__ = ["WAIT_STALL", "Buffer", "LocalCache", "Opener", "entry_identity"]

READ_CHUNK = 1 << 20  # bytes handed on at a time from a cached file
# A reader that stops this close to the end still has the entry kept: a tar reader stops at
# the end-of-archive marker, before the padding that rounds the archive up to a record.
FINISH_LEFT = 64 << 10
WAIT_STALL = 30.0
"""Seconds a reader waits for another process's download that makes no progress."""
_POLL_FIRST, _POLL_MOST = 0.005, 0.1  # seconds between looks at an entry someone else writes

Opener = Callable[[int], Awaitable[tuple[int, AsyncIterator[bytes]]]]
"""``open(offset)``: the object's size and an iterator of its bytes from ``offset`` on."""

_HIT, _MISS, _BYPASS, _BUSY = "hit", "miss", "bypass", "busy"

Buffer = bytes | memoryview
"""The bytes of an entry: as read from the cache, or as fetched (a view of a larger read)."""


def entry_identity(url: str, location: StoreLocation) -> str:
    """What names an object in a cache: its URL (password hidden) and its store's identity.

    Two S3-compatible servers may both have ``s3://bucket/shard.tar``, two
    Azure accounts both ``az://container/shard.tar``: the store's identity
    (its endpoint, account, region ..., from the options and the environment,
    :attr:`StoreLocation.identity <aioload.sources.stores.store.StoreLocation>`)
    tells them apart. Credentials play no part (the same object, whoever
    reads it).
    """
    return f"{url} @ {location.identity}"


class LocalCache:
    """A local disk cache shared by every worker and process that names the same folder.

    Picklable (its folder and limit): worker processes receive it with their
    dataset and hold no file open between reads.

    Args:
        folder: where the cache lives (created ``0700`` if missing). Several
            datasets, workers and processes of this user may share one
            folder. Refused (``PermissionError``) if another user owns it,
            if its group or others can write it, or if it is a link another
            user made.
        limit: the most bytes the folder may take on disk, partial downloads
            included: an int of bytes or a size such as ``"50GB"``,
            ``"512MiB"``, ``"1.5 GB"`` (see
            :func:`~aioload.sources.sizes.parse_size`). It is recorded in the
            folder and every instance sharing the folder keeps to it; another
            limit than the one recorded replaces it, with a ``UserWarning``.
            None: the folder's recorded limit (see :meth:`folder_limit`),
            else no limit but the disk's.

    Example::

        >>> import tempfile
        >>> folder = tempfile.TemporaryDirectory()   # a local disk: "/scratch/cache"
        >>> cache = LocalCache(folder.name, "50GB")
        >>> cache.usage()   # bytes taken now
        0
        >>> folder.cleanup()
    """

    def __init__(self, folder: str | os.PathLike[str], limit: int | str | None = None) -> None:
        if not isinstance(folder, str | os.PathLike):
            raise TypeError(f"cache_dir should be a path (str or os.PathLike); got {folder!r}")
        self.limit = None if limit is None else parse_size(limit, "cache_limit")
        self._folder = CacheFolder(os.path.abspath(os.fspath(folder)), self.limit)

    @property
    def folder(self) -> str:
        """The cache's folder (absolute)."""
        return self._folder.path

    def usage(self) -> int:
        """The bytes the cache takes on disk now, partial downloads included."""
        return self._folder.usage()

    def folder_limit(self) -> int | None:
        """The folder's limit, which every process sharing the folder keeps to (None: none).

        It is recorded in the folder: ``limit`` when this instance was given
        one, else the last limit any instance gave the folder.
        """
        return self._folder.folder_limit()

    async def stream(
        self, identity: str, name: str, open_remote: Opener, counter: SourceCounter
    ) -> AsyncGenerator[bytes, None]:
        """The bytes of the entry ``identity``, from the cache or, the first time, the store.

        Args:
            identity: what names the object uniquely (its URL and store endpoint).
            name: the object's name, to make the cache's file names readable.
            open_remote: opens the object in the store (errors name the object).
            counter: counts the hit or the miss.
        """
        files = self._folder.files(identity, name)
        kind, fd = await self._claim(files)
        if kind == _HIT:
            counter.hit()
            try:
                async for chunk in _read_file(fd):
                    yield chunk
            finally:
                os.close(fd)
            return
        counter.miss()
        # aclosing: a reader that stops early closes the download now, not when collected.
        source = (
            _from_store(open_remote, 0)
            if kind == _BYPASS
            else self._download(files, fd, open_remote)
        )
        async with aclosing(source):
            async for chunk in source:
                yield chunk

    async def read(
        self,
        identity: str,
        name: str,
        fetch: Callable[[], Awaitable[bytes]],
        counter: SourceCounter,
    ) -> bytes:
        """The bytes of the small object ``identity``: from the cache, or fetched and kept.

        Args:
            identity: what names the object uniquely (its URL, endpoint, byte range).
            name: the object's name, for the cache's file names.
            fetch: reads it from the store (errors name the object).
            counter: counts the hit or the miss.
        """
        files = self._folder.files(identity, name)
        kind, fd = await self._claim(files)
        if kind == _HIT:
            counter.hit()
            try:
                return _read_all(fd)
            finally:
                os.close(fd)
        counter.miss()
        if kind == _BYPASS:
            return await fetch()
        try:
            data = await fetch()
            await self._keep([(files, data)])
        finally:
            self._folder.unlock_entry(files, fd)
        return data

    async def read_many(
        self,
        entries: Sequence[tuple[str, str]],
        fetch: Callable[[list[int]], Awaitable[Sequence[Buffer]]],
        counter: SourceCounter,
    ) -> list[Buffer]:
        """The bytes of several small entries: each from the cache, or fetched and kept.

        What is not in the cache is fetched with one call, so that neighbours can share
        a request (a Parquet file's column chunks, fetched as coalesced ranges), and
        each entry is kept on its own. An entry another reader is writing is waited for
        after this call's own are kept (no reader waits while it holds an entry another
        waits for).

        Args:
            entries: ``(identity, name)`` of each entry (see :meth:`read`).
            fetch: ``fetch(numbers)``: the bytes of the entries ``numbers`` (positions
                in ``entries``, in order) from the store, in that order.
            counter: counts a hit or a miss per entry.

        Example::

            chunks = await cache.read_many(
                [(f"{url} [{a}:{b}]", name) for a, b in ranges],
                fetch_ranges, counts)
        """
        folder = self._folder
        files = [folder.files(identity, name) for identity, name in entries]
        found: list[Buffer | None] = [None] * len(entries)
        locks: dict[int, int] = {}  # the entries this call writes: their locks
        unkept: list[int] = []  # fetched, not kept (the folder is unusable)
        busy: list[int] = []  # another reader writes them
        try:
            for number, entry in enumerate(files):
                kind, fd = self._try_claim(entry)
                if kind == _HIT:
                    counter.hit()
                    try:
                        found[number] = _read_all(fd)
                    finally:
                        os.close(fd)
                elif kind == _MISS:
                    locks[number] = fd
                elif kind == _BYPASS:
                    unkept.append(number)
                else:
                    busy.append(number)
            missed = sorted([*locks, *unkept])
            if missed:
                for _ in missed:
                    counter.miss()
                fetched = dict(zip(missed, await fetch(missed), strict=True))
                for number, data in fetched.items():
                    found[number] = data
                await self._keep([(files[number], fetched[number]) for number in locks])
        finally:
            for number, lock in locks.items():
                folder.unlock_entry(files[number], lock)
        for number in busy:
            identity, name = entries[number]

            async def one(number: int = number) -> bytes:
                (data,) = await fetch([number])
                return bytes(data)

            found[number] = await self.read(identity, name, one, counter)
        return found  # type: ignore[return-value]  # every entry is filled

    # -- claiming an entry ----------------------------------------------------

    async def _claim(self, files: EntryFiles) -> tuple[str, int]:
        """Hit (a descriptor to read), miss (the entry's lock: we write it), or bypass."""
        try:
            return await self._claim_in_folder(files)
        except OSError:
            return _BYPASS, -1  # the folder is unusable (removed, read-only): read past it

    async def _claim_in_folder(self, files: EntryFiles) -> tuple[str, int]:
        folder = self._folder
        delay = _POLL_FIRST
        progress: int | None = None
        since = time.monotonic()
        while True:
            kind, fd = self._try_claim_in_folder(files)
            if kind != _BUSY:
                return kind, fd
            # Another reader is writing it: wait for it, as long as it makes progress.
            now = time.monotonic()
            written = folder.writing_since(files)
            if written != progress:
                progress, since = written, now
            elif now - since > WAIT_STALL:
                return _BYPASS, -1
            await asyncio.sleep(delay)
            delay = min(2 * delay, _POLL_MOST)

    def _try_claim(self, files: EntryFiles) -> tuple[str, int]:
        """Hit, miss or bypass as :meth:`_claim`, or busy (another reader writes it) at once."""
        try:
            return self._try_claim_in_folder(files)
        except OSError:
            return _BYPASS, -1

    def _try_claim_in_folder(self, files: EntryFiles) -> tuple[str, int]:
        folder = self._folder
        fd = folder.open_entry(files)
        if fd is not None:
            return _HIT, fd
        lock = folder.lock_entry(files)
        if lock is None:
            return _BUSY, -1
        try:
            fd = folder.open_entry(files)  # written while we looked?
        except BaseException:
            folder.unlock_entry(files, lock)
            raise
        if fd is None:
            return _MISS, lock
        folder.unlock_entry(files, lock)
        return _HIT, fd

    # -- a miss -------------------------------------------------------------------

    async def _download(
        self, files: EntryFiles, lock: int, open_remote: Opener
    ) -> AsyncGenerator[bytes, None]:
        """Streams the entry from the store while a task writes it into the cache."""
        folder = self._folder
        try:
            size, chunks = await open_remote(0)
            try:
                part = folder.reserve(files, size)
            except OSError:
                part = None  # the folder is unusable: read past it
        except BaseException:
            folder.unlock_entry(files, lock)
            raise
        if part is None:
            folder.unlock_entry(files, lock)
            try:
                async for chunk in chunks:
                    yield chunk
            finally:
                await _aclose(chunks)
            return
        reader = -1
        try:
            reader = folder.open_part(files, part)
            # On the inode: after the rename the entry is ours until we are done reading.
            folder.hold(reader)
        except BaseException:
            if reader >= 0:
                os.close(reader)
            os.close(part)
            folder.abandon(files, size)
            folder.unlock_entry(files, lock)
            raise
        progress = _Progress()
        task = asyncio.get_running_loop().create_task(
            _write(folder, files, lock, part, size, chunks, progress)
        )
        try:
            position = 0
            while position < size:
                if position < progress.written:
                    chunk = os.pread(reader, min(READ_CHUNK, progress.written - position), position)
                    if not chunk:
                        raise OSError(f"the cache file {files.part!r} ended early")
                    position += len(chunk)
                    yield chunk
                    continue
                error = progress.error
                if isinstance(error, _CacheWriteError):
                    # The folder failed us (a full disk): go on from the store.
                    async with aclosing(_from_store(open_remote, position)) as rest:
                        async for chunk in rest:
                            yield chunk
                    return
                if error is not None:
                    raise error
                progress.changed.clear()
                await progress.changed.wait()
        finally:
            os.close(reader)
            if size - position > FINISH_LEFT:
                task.cancel()  # the reader stopped early: the entry is not kept
            # Until the file is renamed (or removed) and the lock let go, whatever cancels us.
            with anyio.CancelScope(shield=True):
                await asyncio.wait([task])

    async def _keep(self, fetched: Sequence[tuple[EntryFiles, Buffer]]) -> None:
        """Writes fetched objects into the cache (as their writer), fsynced together; a
        failure only leaves an entry out (the read itself succeeded)."""
        folder = self._folder
        written: list[tuple[EntryFiles, int, int]] = []  # files, .part, size
        committed: set[int] = set()
        try:
            for files, data in fetched:
                size = len(data)
                try:
                    part = folder.reserve(files, size)
                except OSError:
                    continue
                if part is None:
                    continue
                try:
                    _write_all(part, data, 0)
                except OSError:
                    os.close(part)
                    folder.abandon(files, size)
                    continue
                written.append((files, part, size))
            synced = await _fsync_all([part for _, part, _ in written])
            for number, (files, _, _) in enumerate(written):
                if synced[number]:
                    try:
                        folder.commit(files)
                    except OSError:
                        continue
                    committed.add(number)
        finally:
            for number, (files, part, size) in enumerate(written):
                os.close(part)
                if number not in committed:
                    folder.abandon(files, size)

    def __repr__(self) -> str:
        return f"LocalCache({self.folder!r}, limit={self.limit!r})"


class _Progress:
    """How far a download task has written, and why it stopped."""

    def __init__(self) -> None:
        self.written = 0
        self.error: BaseException | None = None
        self.changed = asyncio.Event()


class _CacheWriteError(Exception):
    """Writing the cache's file failed (the store's bytes were fine)."""


async def _write(
    folder: CacheFolder,
    files: EntryFiles,
    lock: int,
    part: int,
    size: int,
    chunks: AsyncIterator[bytes],
    progress: _Progress,
) -> None:
    """Writes the store's bytes into the ``.part``; renames it once complete and fsynced."""
    kept = False
    try:
        written = 0
        async for chunk in chunks:
            if written + len(chunk) > size:
                raise ConnectionError(
                    f"the store sent more than the {size} bytes it announced for "
                    f"{os.path.basename(files.data)!r}"
                )
            try:
                _write_all(part, chunk, written)
            except OSError as error:
                raise _CacheWriteError(str(error)) from error
            written += len(chunk)
            progress.written = written
            progress.changed.set()
        if written != size:
            raise ConnectionError(
                f"the store's stream ended after {written} of the {size} bytes it announced"
            )
        try:
            await _fsync(part)
            folder.commit(files)
        except OSError as error:
            raise _CacheWriteError(str(error)) from error
        kept = True
    except Exception as error:
        progress.error = error  # the reader raises it (or reads on past a cache failure)
    finally:
        progress.changed.set()
        await _aclose(chunks)
        os.close(part)
        if not kept:
            folder.abandon(files, size)
        folder.unlock_entry(files, lock)


async def _fsync(fd: int) -> None:
    """fsync in a thread, on a descriptor of its own (the thread may outlive a cancellation)."""
    own = os.dup(fd)

    def sync() -> None:
        try:
            os.fsync(own)
        finally:
            os.close(own)

    await asyncio.to_thread(sync)


async def _fsync_all(fds: Sequence[int]) -> list[bool]:
    """fsyncs every file, in one thread (each on a descriptor of its own, as :func:`_fsync`);
    whether each succeeded."""
    if not fds:
        return []
    own = [os.dup(fd) for fd in fds]

    def sync() -> list[bool]:
        done = []
        for fd in own:
            try:
                os.fsync(fd)
                done.append(True)
            except OSError:
                done.append(False)
            finally:
                os.close(fd)
        return done

    return await asyncio.to_thread(sync)


def _write_all(fd: int, data: Buffer, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def _read_all(fd: int) -> bytes:
    size = os.fstat(fd).st_size
    parts = []
    while size > 0:
        chunk = os.read(fd, size)
        if not chunk:
            break
        parts.append(chunk)
        size -= len(chunk)
    return b"".join(parts)


async def _read_file(fd: int) -> AsyncGenerator[bytes, None]:
    while chunk := os.read(fd, READ_CHUNK):
        yield chunk
        # A cached shard never waits on I/O: let the loop's other tasks (and a cancellation) in.
        await asyncio.sleep(0)


async def _from_store(open_remote: Opener, offset: int) -> AsyncGenerator[bytes, None]:
    _, chunks = await open_remote(offset)
    try:
        async for chunk in chunks:
            yield chunk
    finally:
        await _aclose(chunks)


async def _aclose(chunks: Any) -> None:
    close = getattr(chunks, "aclose", None)
    if close is not None:
        await close()
