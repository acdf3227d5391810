"""The files of a local cache folder, and the locks that let processes share it safely.

Layout (flat; nothing else in the folder is ever touched):

- ``<digest>-<name>.data``: a complete entry. Only ever made by renaming a
  finished, fsynced ``.part``, so a ``.data`` file is always whole.
- ``<digest>-<name>.part``: an entry being written, created at its full size
  (a sparse file) so that it counts in full against the limit from the start.
- ``<digest>-<name>.lock``: an exclusive ``flock`` on it marks the one
  process writing the entry; it is removed when the writer is done.
- ``.aioload-cache``: the folder's lock and ledger: an exclusive ``flock`` on
  it guards every change to the entries' files (creating a ``.part``,
  renaming it, evicting), and it holds the bytes the ``.data`` and ``.part``
  files take, as decimal text.

``<digest>`` is a hash of the entry's identity (its URL, the store's
endpoint, a byte range); ``<name>`` the end of the object's name, for people
looking at the folder.

Readers hold a shared ``flock`` on the ``.data`` file they read (on its
inode, so a reader that opened the ``.part`` keeps it after the rename), and
eviction takes an exclusive one without waiting, so an entry being read is
never removed. Least recently used goes first: a hit touches the ``.data``
file's modification time.

The ledger makes a reservation O(1) while it fits; when it does not, the
folder is scanned again: the ledger is recomputed from the files (the
reservations of processes that crashed mid-write disappear then: a ``.part``
whose ``.lock`` nobody holds is removed), and entries are evicted, oldest
first, until the new one fits with a little room to spare
(:data:`EVICTION_SLACK` of the limit, so that a full cache is not scanned at
every miss). The ledger can only over-count between scans (a crashed
writer's reservation), never under-count, so the limit holds.

A crash at any point leaves nothing that passes for whole: at worst a
``.part`` and a ``.lock``, cleaned up by the next scan.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no flock, no cache (the rest works)
    fcntl = None  # type: ignore[assignment]

__all__ = ["EVICTION_SLACK", "CacheFolder", "EntryFiles"]

EVICTION_SLACK = 1 / 64
"""The share of the limit an eviction frees beyond what the new entry needs."""

LEDGER = ".aioload-cache"
_ENTRY = re.compile(r"^([0-9a-f]{32}-[A-Za-z0-9._-]*)\.(data|part|lock)$")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_FLAGS = os.O_CLOEXEC


@dataclass(frozen=True, slots=True)
class EntryFiles:
    """The paths of one entry's files."""

    data: str
    part: str
    lock: str


class CacheFolder:
    """One cache folder: entry names, locks, the ledger and eviction (all blocking calls).

    Every call is short (a few system calls) except a scan, which lists the
    folder and happens only when the cache is full. Holds no open file
    between calls, so it pickles as its path and limit, and a forked child
    never shares a lock with its parent.

    Args:
        path: the folder (created if missing).
        limit: the most bytes its entries may take, partial ones included
            (None: no limit).

    Example::

        folder = CacheFolder("/tmp/cache", 1 << 30)
        files = folder.files("s3://bucket/shard-0001.tar", "shard-0001.tar")
        fd = folder.open_entry(files)   # a file descriptor to read, or None
    """

    def __init__(self, path: str, limit: int | None) -> None:
        if fcntl is None:  # pragma: no cover - Windows
            raise NotImplementedError("a local cache needs flock(), which this platform lacks")
        os.makedirs(path, exist_ok=True)
        if not os.access(path, os.W_OK | os.X_OK):
            raise PermissionError(f"the cache folder {path!r} is not writable")
        self.path = path
        self.limit = limit
        self._ledger_path = os.path.join(path, LEDGER)

    def files(self, identity: str, name: str) -> EntryFiles:
        """The files of the entry that ``identity`` names (``name``: for people, at most 64)."""
        digest = hashlib.sha256(identity.encode("utf-8", "surrogatepass")).hexdigest()[:32]
        stem = os.path.join(self.path, f"{digest}-{_UNSAFE.sub('_', name)[-64:]}")
        return EntryFiles(stem + ".data", stem + ".part", stem + ".lock")

    # -- readers ------------------------------------------------------------

    def open_entry(self, files: EntryFiles) -> int | None:
        """The complete entry, opened and held against eviction; None when there is none.

        Close the descriptor when done. Marks the entry as just used.
        """
        try:
            fd = os.open(files.data, os.O_RDONLY | _FLAGS)
        except FileNotFoundError:
            return None
        try:
            # Blocks only while an eviction unlinks this very file (microseconds).
            fcntl.flock(fd, fcntl.LOCK_SH)
            if not _still_at(fd, files.data):
                os.close(fd)  # evicted between the open and the lock
                return None
            try:
                os.utime(fd)  # the LRU clock
            except OSError:
                pass  # a folder shared read-only: eviction order is approximate then
        except BaseException:
            os.close(fd)
            raise
        return fd

    def hold(self, fd: int) -> None:
        """Holds the file ``fd`` has open against eviction (until it is closed)."""
        fcntl.flock(fd, fcntl.LOCK_SH)

    # -- the one writer of an entry -----------------------------------------

    def lock_entry(self, files: EntryFiles) -> int | None:
        """Becomes the entry's one writer (a descriptor to pass back); None when another is."""
        return _try_lock(files.lock)

    def unlock_entry(self, files: EntryFiles, lock: int) -> None:
        """Stops being the entry's writer (removes the lock file: the lock goes with it)."""
        try:
            os.unlink(files.lock)
        except FileNotFoundError:
            pass
        finally:
            os.close(lock)

    def writing_since(self, files: EntryFiles) -> int | None:
        """When another process last wrote to the entry's ``.part`` (ns), or None."""
        try:
            return os.stat(files.part).st_mtime_ns
        except OSError:
            return None

    def reserve(self, files: EntryFiles, size: int) -> int | None:
        """Room for ``size`` bytes: the entry's ``.part``, opened for writing; None: no room.

        Call as the entry's writer. Evicts least recently used entries when
        needed; there is no room when ``size`` exceeds the limit or when what
        could be evicted is being read.
        """
        with self._ledger() as ledger:
            limit = self.limit
            if limit is not None:
                if size > limit:
                    return None
                used = ledger.used
                if used is None or used + size > limit:
                    used = self._scan(size)
                    if used + size > limit:
                        ledger.write(used)
                        return None
                ledger.write(used + size)
            fd = os.open(files.part, os.O_RDWR | os.O_CREAT | os.O_TRUNC | _FLAGS, 0o644)
            try:
                # Its full size at once (sparse): a scan counts it as reserved.
                os.ftruncate(fd, size)
            except BaseException:
                os.close(fd)
                os.unlink(files.part)
                raise
        return fd

    def commit(self, files: EntryFiles) -> None:
        """The ``.part`` is complete and fsynced: it becomes the entry."""
        with self._ledger():
            os.rename(files.part, files.data)

    def abandon(self, files: EntryFiles, size: int) -> None:
        """The ``.part`` of ``size`` reserved bytes will not be completed: removes it."""
        with self._ledger() as ledger:
            try:
                os.unlink(files.part)
            except FileNotFoundError:
                pass
            used = ledger.used
            if used is not None and self.limit is not None:
                ledger.write(used - size if used >= size else None)

    # -- accounting ---------------------------------------------------------

    def usage(self) -> int:
        """The bytes the entries take now, partial ones included (scans the folder)."""
        with self._ledger() as ledger:
            used = self._scan(0)
            if self.limit is not None:
                ledger.write(used)
        return used

    def _scan(self, needed: int) -> int:
        """The bytes taken, from the files; evicts until ``needed`` more fit (ledger held)."""
        complete: list[tuple[int, int, str]] = []
        used = 0
        try:
            listing = list(os.scandir(self.path))
        except FileNotFoundError:
            listing = []
        for entry in listing:
            match = _ENTRY.match(entry.name)
            if match is None or match.group(2) == "lock":
                continue
            try:
                status = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if match.group(2) == "data":
                complete.append((status.st_mtime_ns, status.st_size, entry.path))
                used += status.st_size
            elif not _remove_if_stale(entry.path, os.path.join(self.path, match.group(1))):
                used += status.st_size
        limit = self.limit
        if limit is None or used + needed <= limit:
            return used
        target = limit - needed - int(limit * EVICTION_SLACK)
        complete.sort()
        for _, size, path in complete:
            if used <= target:
                break
            if _evict(path):
                used -= size
        return used

    @contextmanager
    def _ledger(self) -> Iterator[_Ledger]:
        fd = os.open(self._ledger_path, os.O_RDWR | os.O_CREAT | _FLAGS, 0o644)
        try:
            # Held for a few system calls (a scan when full); every process takes it the same way.
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield _Ledger(fd)
        finally:
            os.close(fd)  # releases the lock

    def __repr__(self) -> str:
        return f"CacheFolder({self.path!r}, limit={self.limit!r})"


class _Ledger:
    """The bytes taken, as the ledger file says (None: unknown, scan)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        text = os.pread(fd, 32, 0).strip()
        self.used: int | None = int(text) if text.isdigit() else None

    def write(self, used: int | None) -> None:
        data = b"" if used is None else str(used).encode()
        os.ftruncate(self._fd, 0)
        if data:
            os.pwrite(self._fd, data, 0)
        self.used = used


def _still_at(fd: int, path: str) -> bool:
    """Whether ``path`` still names the file ``fd`` has open."""
    try:
        named = os.stat(path)
    except FileNotFoundError:
        return False
    opened = os.fstat(fd)
    return (named.st_ino, named.st_dev) == (opened.st_ino, opened.st_dev)


def _try_lock(path: str) -> int | None:
    """An exclusive lock on the file at ``path`` (created if missing), or None if held."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | _FLAGS, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        if _still_at(fd, path):
            return fd
        # The holder removed the file as it let go: lock the one there now, if any.
        os.close(fd)


def _remove_if_stale(part: str, stem: str) -> bool:
    """Removes a ``.part`` nobody is writing (its writer crashed); True if it did."""
    lock = _try_lock(stem + ".lock")
    if lock is None:
        return False  # its writer is alive
    try:
        os.unlink(part)
    except FileNotFoundError:
        pass
    finally:
        try:
            os.unlink(stem + ".lock")
        finally:
            os.close(lock)
    return True


def _evict(path: str) -> bool:
    """Removes a complete entry unless someone is reading it; True if it is gone."""
    try:
        fd = os.open(path, os.O_RDONLY | _FLAGS)
    except FileNotFoundError:
        return True
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return False  # being read
            raise
        os.unlink(path)
        return True
    finally:
        os.close(fd)
