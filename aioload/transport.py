"""Shared-memory transport of worker results: numpy buffers cross without a pipe.

A worker pickles each result with pickle protocol 5, so numpy arrays come out
of band as raw buffers instead of bytes inside the pickle. The pickle and the
buffers are written into a *segment*: a shared-memory file (``memfd``) mapped
by the worker and, once its descriptor has crossed the result socket, by the
loader. The loader unpickles straight from its own mapping of the segment, so
the arrays the consumer gets are views of the shared memory: the worker's
``memcpy`` into the segment is the only copy on the way.

Segment lifetime:

- A segment has no name in ``/dev/shm`` (a ``memfd``, or a POSIX segment
  unlinked the moment it is opened where ``memfd_create`` is missing), so
  nothing can be left behind there, even when a process is killed: the kernel
  frees the memory when the last mapping and descriptor are gone.
- The loader hands a segment's arrays a :class:`~aioload.buffers.Lease` as
  their base. When the last array of a batch is garbage-collected, the lease
  queues the segment id; the next command to that worker carries it back, and
  the worker reuses the segment (its pages are already mapped on both sides,
  so a reused segment costs no page faults) or, past a bound on idle
  segments, both sides unmap it.
"""

from __future__ import annotations

import collections
import functools
import mmap
import os
import pickle
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from aioload.buffers import Lease, mapping_address, size_class

__all__ = ["SegmentReader", "SegmentWriter", "Written", "shared_memory_fd"]

_ALIGN = 64  # cache-line alignment for every buffer inside a segment
_LAYOUT = struct.Struct("<QQ")  # pickle length, out-of-band buffer count
_SPAN = struct.Struct("<QQ")  # one buffer: offset, length


def _aligned(offset: int) -> int:
    return -(-offset // _ALIGN) * _ALIGN


def shared_memory_fd(size: int) -> int:
    """A descriptor of ``size`` bytes of shared memory that has no name in the filesystem."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("aioload", os.MFD_CLOEXEC)
    else:  # pragma: no cover - platforms without memfd (macOS)
        import _posixshmem  # type: ignore[import-not-found]

        name = f"/aioload-{os.getpid()}-{int.from_bytes(os.urandom(6), 'little')}"
        fd = _posixshmem.shm_open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
        _posixshmem.shm_unlink(name)
    try:
        os.ftruncate(fd, size)
    except BaseException:
        os.close(fd)
        raise
    return fd


@dataclass(frozen=True, slots=True)
class Written:
    """Where :meth:`SegmentWriter.write` put a result.

    Attributes:
        segment: the segment's id (unique within one worker process).
        size: the segment's size in bytes.
        fd: the segment's descriptor when the loader has not seen this segment
            yet (it must cross the socket with this result), else None.
    """

    segment: int
    size: int
    fd: int | None


class SegmentWriter:
    """The worker's side: writes results into recycled segments.

    Example::

        writer = SegmentWriter()
        written = writer.write({"x": np.zeros((64, 16), np.float32)})
        # send (written.segment, written.size) and written.fd to the loader
    """

    def __init__(self) -> None:
        self._mappings: dict[int, mmap.mmap] = {}
        self._free: dict[int, list[int]] = collections.defaultdict(list)
        self._next_id = 0

    def write(self, obj: Any) -> Written:
        """Pickles ``obj`` into a segment (numpy buffers out of band)."""
        buffers: list[pickle.PickleBuffer] = []
        data = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
        raws = [buffer.raw() for buffer in buffers]
        position = _aligned(_LAYOUT.size + _SPAN.size * len(raws))
        pickle_at = position
        spans = []
        position = _aligned(position + len(data))
        for raw in raws:
            spans.append((position, raw.nbytes))
            position = _aligned(position + raw.nbytes)
        segment, size, fd = self._take(size_class(position))
        mapping = self._mappings[segment]
        _LAYOUT.pack_into(mapping, 0, len(data), len(raws))
        for index, span in enumerate(spans):
            _SPAN.pack_into(mapping, _LAYOUT.size + index * _SPAN.size, *span)
        mapping[pickle_at : pickle_at + len(data)] = data
        for (offset, length), raw in zip(spans, raws, strict=True):
            mapping[offset : offset + length] = raw
        return Written(segment, size, fd)

    def _take(self, size: int) -> tuple[int, int, int | None]:
        # A free segment of the same class, or one up to twice as large.
        for candidate in (size, *sorted(s for s in self._free if size < s <= 2 * size)):
            free = self._free.get(candidate)
            if free:
                return free.pop(), candidate, None
        fd = shared_memory_fd(size)
        try:
            mapping = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            raise
        segment = self._next_id
        self._next_id += 1
        self._mappings[segment] = mapping
        return segment, size, fd

    def recycle(self, segments: list[int]) -> None:
        """The loader no longer uses these segments: write later results into them."""
        for segment in segments:
            mapping = self._mappings.get(segment)
            if mapping is not None:
                self._free[len(mapping)].append(segment)

    def drop(self, segments: list[int]) -> None:
        """The loader unmapped these segments: unmap them here too."""
        for segment in segments:
            mapping = self._mappings.pop(segment, None)
            if mapping is not None:
                mapping.close()


class SegmentReader:
    """The loader's side for one worker: maps segments and rebuilds results from them.

    Args:
        keep_free: the most segments left idle at the worker for reuse; a
            segment returned beyond that is unmapped on both sides.

    Example::

        reader = SegmentReader(keep_free=4)
        batch = reader.read(segment, size, fd)    # arrays are views of the segment
        recycle, drop = reader.take_returned()    # piggybacked on the next command
    """

    def __init__(self, keep_free: int) -> None:
        self._keep_free = keep_free
        self._mappings: dict[int, tuple[mmap.mmap, int]] = {}
        self._idle_at_worker: set[int] = set()
        # Appended by lease finalizers in any thread; drained on the loop.
        self._returned: collections.deque[int] = collections.deque()

    def _map(self, segment: int, size: int, fd: int | None) -> tuple[mmap.mmap, int]:
        if fd is not None:
            try:
                mapping = mmap.mmap(fd, size)
            finally:
                os.close(fd)
            self._mappings[segment] = (mapping, mapping_address(mapping))
        self._idle_at_worker.discard(segment)
        return self._mappings[segment]

    def read(self, segment: int, size: int, fd: int | None) -> Any:
        """Unpickles the result in ``segment``; its arrays keep the segment until they die."""
        mapping, address = self._map(segment, size, fd)
        release = functools.partial(self._returned.append, segment)
        raw = np.asarray(Lease(address, size, mapping, release))
        pickle_length, count = _LAYOUT.unpack_from(mapping, 0)
        buffers = []
        for index in range(count):
            offset, length = _SPAN.unpack_from(mapping, _LAYOUT.size + index * _SPAN.size)
            buffers.append(raw[offset : offset + length])
        pickle_at = _aligned(_LAYOUT.size + _SPAN.size * count)
        payload = memoryview(raw[pickle_at : pickle_at + pickle_length])  # type: ignore[arg-type]
        return pickle.loads(payload, buffers=buffers)

    def discard(self, segment: int, size: int, fd: int | None) -> None:
        """A result nobody will read (a stale epoch): its segment goes straight back."""
        self._map(segment, size, fd)
        self._returned.append(segment)

    def take_returned(self) -> tuple[list[int], list[int]]:
        """Segments whose arrays died since the last call: ``(recycle, drop)`` at the worker."""
        recycle: list[int] = []
        drop: list[int] = []
        returned = self._returned
        while returned:
            segment = returned.popleft()
            if segment not in self._mappings:
                continue
            if len(self._idle_at_worker) < self._keep_free:
                self._idle_at_worker.add(segment)
                recycle.append(segment)
            else:
                # No array uses the mapping any more (its lease is dead): unmap it.
                del self._mappings[segment]
                drop.append(segment)
        return recycle, drop

    def close(self) -> None:
        """Forgets every mapping; arrays still in use keep theirs through their leases."""
        self._mappings.clear()
        self._idle_at_worker.clear()
        self._returned.clear()
