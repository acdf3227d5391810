"""The files of a local cache folder, and the locks that let processes share it safely.

Layout (flat; nothing else in the folder is ever touched):

- ``v2-<digest>-<name>.data``: a complete entry. Only ever made by renaming a
  finished, fsynced ``.part``, so a ``.data`` file is always whole.
- ``v2-<digest>-<name>.part``: an entry being written, created at its full
  size (a sparse file) so that it counts in full against the limit from the
  start.
- ``v2-<digest>-<name>.lock``: an exclusive ``flock`` on it marks the one
  process writing the entry; it is removed when the writer is done.
- ``.aioload-cache``: the folder's lock and ledger: an exclusive ``flock`` on
  it guards every change to the entries' files (creating a ``.part``,
  renaming it, evicting), and it records the folder's limit and the bytes the
  ``.data`` and ``.part`` files take (a few lines of text).

``<digest>`` is a hash of the entry's identity (its URL, the store's
settings, a byte range); ``<name>`` the end of the object's name, for people
looking at the folder. Entries of an earlier version (named
``<digest>-<name>``, by an identity that did not tell every store apart) are
never read; they are removed when the folder is first opened by this version
(and by any later scan, should an older version still write some).

**One limit per folder.** The limit is the folder's, kept in its ledger, and
every process that uses the folder keeps to it: one that opens the folder
without a limit adopts the folder's; one that opens it with another limit
replaces it, for everyone, with a warning (the last limit given wins, as a
cache's configured size does in ccache: a limit is the disk space the folder
may take, and a user raises or lowers it by passing another one).

**This user's own folder.** The folder is created ``0700``, and refused (a
``PermissionError`` naming it) when another user owns it, when its group or
others can write it, or when it is reached through a link another user made:
whoever can write the folder could plant links there that the cache would
write through. Every file in it is opened with ``O_NOFOLLOW`` and
``O_CLOEXEC`` and checked with ``fstat`` (a regular file of this user's); a
``.part`` is always created afresh (``O_EXCL``), never truncated in place.

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
every miss). Nothing is evicted when that cannot make room (an entry larger
than the limit, or the rest being read or written). The ledger can only
over-count between scans (a crashed writer's reservation), never
under-count, so the limit holds.

A crash at any point leaves nothing that passes for whole: at worst a
``.part`` and a ``.lock``, cleaned up by the next scan.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import stat
import warnings
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
_VERSION = "v2"
_ENTRY = re.compile(r"^(v2-[0-9a-f]{32}-[A-Za-z0-9._-]*)\.(data|part|lock)$")
# An entry of the first version: its identity did not tell every store apart.
_OLD_ENTRY = re.compile(r"^([0-9a-f]{32}-[A-Za-z0-9._-]*)\.(data|part|lock)$")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_FLAGS = os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
_MODE = 0o600
_HEADER = b"aioload-cache 2"
# Entries held for one eviction at most (each a descriptor): past it, evicting goes on
# without the guarantee that it makes room (an eviction of thousands of entries at once).
_HELD_MOST = 64


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
        path: the folder (created ``0700`` if missing; refused if another
            user owns it or others can write it).
        limit: the most bytes its entries may take, partial ones included:
            recorded in the folder's ledger for every process that shares it
            (a warning when it replaces another). None: the folder's own
            limit, if one was ever given, else none.

    Example::

        folder = CacheFolder("/tmp/cache", 1 << 30)
        files = folder.files("s3://bucket/shard-0001.tar", "shard-0001.tar")
        fd = folder.open_entry(files)   # a file descriptor to read, or None
    """

    def __init__(self, path: str, limit: int | None) -> None:
        if fcntl is None:  # pragma: no cover - Windows
            raise NotImplementedError("a local cache needs flock(), which this platform lacks")
        _make_private_folder(path)
        self.path = path
        self.limit = limit
        self._ledger_path = os.path.join(path, LEDGER)
        with self._ledger() as ledger:
            if not ledger.current:
                # A new folder, or one of an earlier version: its old entries go now.
                ledger.set_used(self._scan(0, None))
            if limit is not None and ledger.limit != limit:
                if ledger.limit is not None:
                    warnings.warn(
                        f"the cache folder {path!r} had a limit of {ledger.limit} bytes; it "
                        f"changes from {ledger.limit} to {limit} for every process that "
                        "shares the folder (a folder has one limit: the last one given)",
                        UserWarning,
                        stacklevel=4,
                    )
                ledger.set_limit(limit)

    def files(self, identity: str, name: str) -> EntryFiles:
        """The files of the entry that ``identity`` names (``name``: for people, at most 64)."""
        digest = hashlib.sha256(identity.encode("utf-8", "surrogatepass")).hexdigest()[:32]
        stem = os.path.join(self.path, f"{_VERSION}-{digest}-{_UNSAFE.sub('_', name)[-64:]}")
        return EntryFiles(stem + ".data", stem + ".part", stem + ".lock")

    def folder_limit(self) -> int | None:
        """The limit every process sharing the folder keeps to now (its ledger's)."""
        with self._ledger() as ledger:
            return ledger.limit

    # -- readers ------------------------------------------------------------

    def open_entry(self, files: EntryFiles) -> int | None:
        """The complete entry, opened and held against eviction; None when there is none.

        Close the descriptor when done. Marks the entry as just used.
        """
        try:
            fd = _open(files.data, os.O_RDONLY)
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
                pass  # eviction order is approximate then
        except BaseException:
            os.close(fd)
            raise
        return fd

    def open_part(self, files: EntryFiles, part: int) -> int:
        """The entry's ``.part`` (which ``part`` has open for writing), opened to read it."""
        fd = _open(files.part, os.O_RDONLY)
        if not _same_file(fd, part):
            os.close(fd)
            raise PermissionError(f"the cache file {files.part!r} was replaced while written")
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
            return os.lstat(files.part).st_mtime_ns
        except OSError:
            return None

    def reserve(self, files: EntryFiles, size: int) -> int | None:
        """Room for ``size`` bytes: the entry's ``.part``, opened for writing; None: no room.

        Call as the entry's writer. Evicts least recently used entries when
        needed; there is no room (and nothing is evicted) when ``size``
        exceeds the folder's limit or when what could be evicted is being
        read.
        """
        with self._ledger() as ledger:
            limit = ledger.limit
            if limit is None and self.limit is not None:
                # The ledger lost its limit (removed, or written by an earlier version).
                limit = self.limit
                ledger.set_limit(limit)
            used = ledger.used
            if limit is not None:
                if size > limit:
                    return None
                if used is None or used + size > limit:
                    used = self._scan(size, limit)
                    if used + size > limit:
                        ledger.set_used(used)
                        return None
            # A .part left by a crashed writer (or anything else under its name) goes first:
            # the new one is created afresh, never opened through what was there.
            try:
                os.unlink(files.part)
            except FileNotFoundError:
                pass
            fd = _open(files.part, os.O_RDWR | os.O_CREAT | os.O_EXCL)
            try:
                # Its full size at once (sparse): a scan counts it as reserved.
                os.ftruncate(fd, size)
            except BaseException:
                os.close(fd)
                os.unlink(files.part)
                raise
            ledger.set_used(None if used is None else used + size)
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
            if used is not None:
                ledger.set_used(used - size if used >= size else None)

    # -- accounting ---------------------------------------------------------

    def usage(self) -> int:
        """The bytes the entries take now, partial ones included (scans the folder)."""
        with self._ledger() as ledger:
            used = self._scan(0, None)
            ledger.set_used(used)
        return used

    def _scan(self, needed: int, limit: int | None) -> int:
        """The bytes taken, from the files; evicts until ``needed`` more fit (ledger held).

        Removes what no one writes any more (a crashed writer's ``.part``) and
        entries of an earlier version. Evicts nothing unless that makes room.
        """
        complete: list[tuple[int, int, str]] = []
        used = 0
        try:
            listing = list(os.scandir(self.path))
        except FileNotFoundError:
            listing = []
        for entry in listing:
            match = _ENTRY.match(entry.name) or _OLD_ENTRY.match(entry.name)
            if match is None or (match.group(2) == "lock" and match.re is _ENTRY):
                continue
            try:
                status = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if not stat.S_ISREG(status.st_mode):
                continue  # not the cache's: never touched
            if match.re is _OLD_ENTRY:
                stem = os.path.join(self.path, match.group(1))
                if not _remove_old(entry.path, stem, match.group(2)):
                    used += status.st_size  # still read or written: it takes room
                continue
            if match.group(2) == "data":
                complete.append((status.st_mtime_ns, status.st_size, entry.path))
                used += status.st_size
            elif not _remove_if_stale(entry.path, os.path.join(self.path, match.group(1))):
                used += status.st_size
        if limit is None or used + needed <= limit:
            return used
        return used - _evict_for(complete, used, limit - needed, int(limit * EVICTION_SLACK))

    @contextmanager
    def _ledger(self) -> Iterator[_Ledger]:
        try:
            fd = _open(self._ledger_path, os.O_RDWR | os.O_CREAT, ledger=True)
        except OSError as error:
            if error.errno == errno.ELOOP:
                raise PermissionError(
                    f"the cache's ledger {self._ledger_path!r} is a symbolic link; the cache "
                    "never opens its files through links (remove it, or pass another cache_dir)"
                ) from error
            raise
        try:
            # Held for a few system calls (a scan when full); every process takes it the same way.
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield _Ledger(fd)
        finally:
            os.close(fd)  # releases the lock

    def __repr__(self) -> str:
        return f"CacheFolder({self.path!r}, limit={self.limit!r})"


class _Ledger:
    """The folder's limit and the bytes taken, as the ledger file says (None: none, or
    unknown: scan). A ledger of an earlier version (the bytes alone) reads as unknown."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self.limit: int | None = None
        self.used: int | None = None
        lines = os.pread(fd, 256, 0).split(b"\n")
        self.current = lines[0] == _HEADER
        if not self.current:
            return
        for line in lines[1:]:
            key, _, value = line.partition(b" ")
            number = int(value) if value.isdigit() else None
            if key == b"limit":
                self.limit = number
            elif key == b"used":
                self.used = number

    def set_used(self, used: int | None) -> None:
        """Records the bytes taken (None: unknown, the next reservation scans)."""
        self.used = used
        self._save()

    def set_limit(self, limit: int | None) -> None:
        """Records the folder's limit."""
        self.limit = limit
        self._save()

    def _save(self) -> None:
        data = b"%s\nlimit %s\nused %s\n" % (
            _HEADER,
            b"none" if self.limit is None else str(self.limit).encode(),
            b"unknown" if self.used is None else str(self.used).encode(),
        )
        # Over the old text, then cut: the file never reads empty (its limit lost) midway.
        os.pwrite(self._fd, data, 0)
        os.ftruncate(self._fd, len(data))


def _make_private_folder(path: str) -> None:
    """Creates ``path`` (``0700``) or checks that it is this user's, written by no one else."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    me = os.geteuid()
    allowed = (
        "a cache folder must be owned by the user who runs the cache and writable by no one "
        "else (mode 0700, or 0755 to let others read it)"
    )
    link = os.lstat(path)
    if stat.S_ISLNK(link.st_mode) and link.st_uid not in (me, 0):
        raise PermissionError(
            f"the cache folder {path!r} is a link made by {_user(link.st_uid)}: {allowed}; "
            "pass the folder itself as cache_dir"
        )
    status = os.stat(path)
    if not stat.S_ISDIR(status.st_mode):
        raise NotADirectoryError(f"the cache folder {path!r} is not a folder")
    if status.st_uid != me:
        raise PermissionError(
            f"the cache folder {path!r} is owned by {_user(status.st_uid)}, not by this user "
            f"({_user(me)}): {allowed}. Pass a cache_dir of your own"
        )
    if status.st_mode & 0o022:
        raise PermissionError(
            f"the cache folder {path!r} (mode {stat.S_IMODE(status.st_mode):04o}) can be "
            f"written by its group or others: {allowed}. Run chmod go-w {path!r}, or pass "
            "another cache_dir"
        )
    if not os.access(path, os.W_OK | os.X_OK):
        raise PermissionError(f"the cache folder {path!r} is not writable")


def _user(uid: int) -> str:
    try:
        import pwd

        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def _open(path: str, flags: int, *, ledger: bool = False) -> int:
    """Opens a file of the folder, never through a link; checks what was opened.

    It must be a regular file of this user's (a ledger, which is written in place, also
    with no other name: no hard link to someone's file).
    """
    fd = os.open(path, flags | _FLAGS, _MODE)
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode) or status.st_uid != os.geteuid():
            raise PermissionError(
                f"the cache file {path!r} is not a regular file of this user's; the cache "
                "opens no other"
            )
        if ledger and status.st_nlink != 1:
            raise PermissionError(
                f"the cache's ledger {path!r} has other names (hard links); remove it"
            )
    except BaseException:
        os.close(fd)
        raise
    return fd


def _same_file(fd: int, other: int) -> bool:
    first, second = os.fstat(fd), os.fstat(other)
    return (first.st_ino, first.st_dev) == (second.st_ino, second.st_dev)


def _still_at(fd: int, path: str) -> bool:
    """Whether ``path`` still names the file ``fd`` has open."""
    try:
        named = os.lstat(path)
    except FileNotFoundError:
        return False
    opened = os.fstat(fd)
    return (named.st_ino, named.st_dev) == (opened.st_ino, opened.st_dev)


def _try_lock(path: str) -> int | None:
    """An exclusive lock on the file at ``path`` (created if missing), or None if held."""
    while True:
        fd = _open(path, os.O_RDWR | os.O_CREAT)
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
    try:
        lock = _try_lock(stem + ".lock")
    except OSError:
        return False  # not a lock of ours: leave it all
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


def _remove_old(path: str, stem: str, kind: str) -> bool:
    """Removes a file of an earlier version's entry unless it is being read or written;
    True if it is gone."""
    try:
        if kind == "part":
            return _remove_if_stale(path, stem)
        if kind == "lock":
            lock = _try_lock(path)
            if lock is not None:
                try:
                    os.unlink(path)
                finally:
                    os.close(lock)
            return True  # a lock takes no room
        fd = _hold_for_eviction(path)
        if fd is None:
            return False
        if fd >= 0:
            try:
                os.unlink(path)
            finally:
                os.close(fd)
        return True
    except OSError:
        return False  # left for a later scan


def _evict_for(complete: list[tuple[int, int, str]], used: int, most: int, slack: int) -> int:
    """Evicts least recently used entries until ``used`` is at most ``most - slack``;
    the bytes freed. Evicts nothing if it cannot get ``used`` down to ``most``."""
    complete.sort()
    target = most - slack
    held: list[tuple[int, str, int]] = []
    freed = gone = 0  # bytes held for eviction; bytes gone already
    try:
        for _, size, path in complete:
            if used - gone - freed <= target:
                break
            fd = _hold_for_eviction(path)
            if fd is None:
                continue  # being read
            if fd < 0:
                gone += size
                continue
            held.append((fd, path, size))
            freed += size
            if len(held) >= _HELD_MOST:
                gone += _unlink_held(held)  # too many to hold at once: these go now
                freed = 0
        if used - gone - freed <= most:
            gone += _unlink_held(held)
        return gone  # else no room to be made: the held entries stay (let go below)
    finally:
        for fd, _, _ in held:
            os.close(fd)


def _unlink_held(held: list[tuple[int, str, int]]) -> int:
    """Removes the held entries; the bytes they took."""
    freed = 0
    while held:
        fd, path, size = held.pop()
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        finally:
            os.close(fd)
        freed += size
    return freed


def _hold_for_eviction(path: str) -> int | None:
    """An exclusive lock on a complete entry (a descriptor); None if it is being read,
    -1 if it is gone."""
    try:
        fd = _open(path, os.O_RDONLY)
    except FileNotFoundError:
        return -1
    except OSError:
        return None  # not a file of ours (a link): never removed
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        os.close(fd)
        if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return None  # being read
        raise
    if not _still_at(fd, path):
        os.close(fd)
        return -1
    return fd
