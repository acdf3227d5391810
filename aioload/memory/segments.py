"""Shared-memory transport of worker results: numpy buffers cross without a pipe.

A worker pickles each result with pickle protocol 5, so numpy arrays come out
of band as raw buffers instead of bytes inside the pickle. The pickle and the
buffers are written into a *segment*: a shared-memory file (``memfd``) mapped
by the worker and, once its descriptor has crossed the result socket, by the
loader. The loader unpickles straight from its own mapping of the segment, so
the arrays the consumer gets are views of the shared memory.

A worker collates into an :class:`Arena` — room in the segment its result
will go to — so :func:`~aioload.default_collate` stacks samples straight into
shared memory and nothing is copied on the way to the consumer. Arrays made
elsewhere (a custom ``collate_fn``, a dataset's own batch) are copied into the
segment once.

torch tensors travel the same way: when torch is imported, the pickler reduces
a plain CPU tensor to its numpy view (``tensor.numpy()``, out of band like any
array, left in place when it lies in the arena), and the loader rebuilds it
with ``torch.from_numpy``, so the consumer's tensor is a view of the shared
memory too. Tensors numpy cannot view (``requires_grad``, bfloat16, other
devices, subclasses such as ``Parameter``) keep torch's own pickling.

Segment lifetime:

- A segment has no name in ``/dev/shm`` (a ``memfd``, or a POSIX segment
  unlinked the moment it is opened where ``memfd_create`` is missing), so
  nothing can be left behind there, even when a process is killed: the kernel
  frees the memory when the last mapping and descriptor are gone.
- The loader hands a segment's arrays a :class:`~aioload.memory.buffers.Lease` as
  their base. When the last array of a batch is garbage-collected, the lease
  queues the segment id; the next command to that worker carries it back, and
  the worker reuses the segment (its pages are already mapped on both sides,
  so a reused segment costs no page faults) or, past a bound on idle
  segments, both sides unmap it.
- Both sides ask for transparent huge pages on a segment's whole 2 MiB pages
  (:func:`~aioload.memory.buffers.advise_huge_pages`): where the kernel gives
  them to shared memory, a 16 MiB batch faults in 8 pages instead of 4096 and
  the consumer's reads miss the TLB as rarely.
"""

from __future__ import annotations

import collections
import functools
import io
import math
import mmap
import os
import pickle
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from aioload.memory.buffers import Lease, advise_huge_pages, mapping_address, size_class

__all__ = ["SegmentReader", "SegmentWriter", "Written", "shared_memory_fd"]

_ALIGN = 64  # cache-line alignment for every buffer inside a segment
_LAYOUT = struct.Struct("<QQ")  # pickle length, out-of-band buffer count
_SPAN = struct.Struct("<QQ")  # one buffer: offset, length
# Kept free at the end of an arena for the batch's small arrays, its pickle and the layout.
_ROOM_FOR_THE_REST = 64 << 10


def _aligned(offset: int) -> int:
    return -(-offset // _ALIGN) * _ALIGN


def shared_memory_fd(size: int, *, name: str = "aioload", sealable: bool = False) -> int:
    """A descriptor of ``size`` bytes of shared memory that has no name in the filesystem.

    ``name`` shows in ``/proc/PID/maps`` (``memfd:NAME``); ``sealable``: the
    descriptor accepts seals (``fcntl.F_ADD_SEALS``) where the kernel has them.
    """
    if hasattr(os, "memfd_create"):
        flags = os.MFD_CLOEXEC | (getattr(os, "MFD_ALLOW_SEALING", 0) if sealable else 0)
        fd = os.memfd_create(name, flags)
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
        layout_at: the offset of the result's layout (the pickle and where its
            buffers are).
        fd: the segment's descriptor when the loader has not seen this segment
            yet (it must cross the socket with this result), else None.
    """

    segment: int
    size: int
    layout_at: int
    fd: int | None


class _Segment:
    """A mapped segment on the worker's side."""

    __slots__ = ("address", "fd", "id", "mapping", "size", "view")

    def __init__(self, segment_id: int, size: int) -> None:
        fd = shared_memory_fd(size)
        try:
            self.mapping = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            raise
        advise_huge_pages(self.mapping, size)  # before the first write faults the pages in
        self.id = segment_id
        self.size = size
        self.fd: int | None = fd  # until it has crossed the socket once
        self.address = mapping_address(self.mapping)
        self.view = np.frombuffer(self.mapping, dtype=np.uint8)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
        del self.view  # the view exports the mapping's buffer, which close() refuses
        self.mapping.close()


class Arena:
    """Room in one segment for the arrays of one result, before the result is written.

    The worker collates into it (see :func:`aioload.collate.core.collate_into`), so a
    collated batch already lives in shared memory and :meth:`SegmentWriter.write`
    finds its buffers there instead of copying them. An arena whose result is
    not written (the collate failed) must be :meth:`released <release>`.
    """

    def __init__(self, writer: SegmentWriter) -> None:
        self._writer = writer
        self.segment: _Segment | None = None
        self.used = 0

    def allocate(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray[Any, Any] | None:
        """An uninitialised C-contiguous array in the arena, or None when it does not fit."""
        nbytes = math.prod(shape) * dtype.itemsize
        if self.segment is None:
            # Room for this array, the batch's other arrays (as large as the last
            # result's) and the pickle; the size class adds up to a fifth more.
            wanted = max(nbytes + _ROOM_FOR_THE_REST, self._writer.expected_size)
            self.segment = self._writer.take(size_class(wanted))
        start = _aligned(self.used)
        if start + nbytes + _ROOM_FOR_THE_REST > self.segment.size:
            return None
        self.used = start + nbytes
        return self.segment.view[start : start + nbytes].view(dtype).reshape(shape)

    def release(self) -> None:
        """Gives the segment back unused (the result went another way)."""
        if self.segment is not None:
            self._writer.recycle([self.segment.id])
            self.segment = None


class SegmentWriter:
    """The worker's side: writes results into recycled segments.

    Example::

        writer = SegmentWriter()
        written = writer.write({"x": np.zeros((64, 16), np.float32)})
        # send the Written fields (and written.fd if not None) to the loader
    """

    def __init__(self) -> None:
        self._segments: dict[int, _Segment] = {}
        self._free: dict[int, list[int]] = collections.defaultdict(list)
        self._next_id = 0
        self.expected_size = 0  # the last result's size: how large an arena to start with

    def arena(self) -> Arena:
        """Room for the arrays of the next result (see :class:`Arena`)."""
        return Arena(self)

    def write(self, obj: Any, arena: Arena | None = None) -> Written:
        """Pickles ``obj`` into a segment (numpy buffers out of band).

        Buffers that already live in ``arena`` stay where they are; the others,
        then the pickle and the layout, are copied after them.
        """
        buffers: list[pickle.PickleBuffer] = []
        data = _dumps(obj, buffers.append)
        raws = [buffer.raw() for buffer in buffers]
        segment = arena.segment if arena is not None else None
        kept: list[int | None] = [None] * len(raws)  # offsets of buffers already in place
        start = 0
        if segment is not None and arena is not None:
            start = arena.used
            kept = [_offset_within(segment.address, arena.used, raw) for raw in raws]
        spans, layout_at, end = _lay_out(raws, kept, start, len(data))
        target = segment
        if target is None or end > target.size:
            # No arena, or it overflowed: everything goes into one new segment.
            kept = [None] * len(raws)
            spans, layout_at, end = _lay_out(raws, kept, 0, len(data))
            target = self.take(size_class(end))
        for raw, (offset, length), in_place in zip(raws, spans, kept, strict=True):
            if in_place is None:
                target.mapping[offset : offset + length] = raw
        self._write_layout(target, layout_at, data, spans)
        if arena is not None and target is not segment:
            arena.release()
        self.expected_size = end
        return Written(target.id, target.size, layout_at, self._first_use(target))

    @staticmethod
    def _write_layout(
        segment: _Segment, layout_at: int, data: bytes, spans: list[tuple[int, int]]
    ) -> None:
        mapping = segment.mapping
        _LAYOUT.pack_into(mapping, layout_at, len(data), len(spans))
        position = layout_at + _LAYOUT.size
        for span in spans:
            _SPAN.pack_into(mapping, position, *span)
            position += _SPAN.size
        mapping[position : position + len(data)] = data

    @staticmethod
    def _first_use(segment: _Segment) -> int | None:
        fd, segment.fd = segment.fd, None
        return fd

    def take(self, size: int) -> _Segment:
        """A segment of at least ``size`` bytes: a free one up to twice as large, or a new one."""
        for candidate in (size, *sorted(s for s in self._free if size < s <= 2 * size)):
            free = self._free.get(candidate)
            if free:
                return self._segments[free.pop()]
        segment = _Segment(self._next_id, size)
        self._next_id += 1
        self._segments[segment.id] = segment
        return segment

    def recycle(self, segments: list[int]) -> None:
        """The loader no longer uses these segments: write later results into them."""
        for segment_id in segments:
            segment = self._segments.get(segment_id)
            if segment is not None:
                self._free[segment.size].append(segment_id)

    def drop(self, segments: list[int]) -> None:
        """The loader unmapped these segments: unmap them here too."""
        for segment_id in segments:
            segment = self._segments.pop(segment_id, None)
            if segment is not None:
                segment.close()


def _dumps(obj: Any, buffer_callback: Callable[[pickle.PickleBuffer], Any]) -> bytes:
    """Pickle protocol 5, buffers out of band; torch tensors as numpy views (see above)."""
    torch = sys.modules.get("torch")
    if torch is None:  # no tensor can exist: the plain pickler, at C speed
        return pickle.dumps(obj, protocol=5, buffer_callback=buffer_callback)
    file = io.BytesIO()
    _TensorPickler(file, torch.Tensor, buffer_callback).dump(obj)
    return file.getvalue()


class _TensorPickler(pickle.Pickler):
    """Reduces plain CPU tensors to their numpy views, so their data goes out of band."""

    def __init__(
        self, file: io.BytesIO, tensor: type, buffer_callback: Callable[[pickle.PickleBuffer], Any]
    ) -> None:
        super().__init__(file, protocol=5, buffer_callback=buffer_callback)
        self._tensor: Any = tensor

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is self._tensor:  # exactly Tensor: a subclass carries more than data
            try:
                array = obj.numpy()
            except (TypeError, RuntimeError):  # requires_grad, bfloat16, cuda, sparse, ...
                return NotImplemented
            return _tensor_from_numpy, (array,)
        return NotImplemented


def _tensor_from_numpy(array: np.ndarray[Any, Any]) -> Any:
    """The loader's side of a tensor sent by :class:`_TensorPickler`: a view of ``array``."""
    import torch

    if not array.flags.writeable:  # pickled in band (not contiguous): a private copy
        array = np.array(array)
    return torch.from_numpy(array)


def _offset_within(base: int, used: int, raw: memoryview) -> int | None:
    """Where ``raw`` lies in the ``used`` bytes at ``base``, or None if it lies elsewhere."""
    address = _address_of(raw)
    if base <= address and address + raw.nbytes <= base + used:
        return address - base
    return None


def _lay_out(
    raws: list[memoryview], kept: list[int | None], start: int, pickle_length: int
) -> tuple[list[tuple[int, int]], int, int]:
    """Spans of the buffers (those not kept in place go from ``start`` on), layout offset, end."""
    spans = []
    position = start
    for raw, offset in zip(raws, kept, strict=True):
        if offset is None:
            offset = position = _aligned(position)
            position += raw.nbytes
        spans.append((offset, raw.nbytes))
    layout_at = _aligned(position)
    return spans, layout_at, layout_at + _LAYOUT.size + _SPAN.size * len(raws) + pickle_length


def _address_of(raw: memoryview) -> int:
    address: int = np.frombuffer(raw, dtype=np.uint8).__array_interface__["data"][0]
    return address


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
            advise_huge_pages(mapping, size)  # the worker's huge pages map whole here too
            self._mappings[segment] = (mapping, mapping_address(mapping))
        self._idle_at_worker.discard(segment)
        return self._mappings[segment]

    def read(self, segment: int, size: int, layout_at: int, fd: int | None) -> Any:
        """Unpickles the result in ``segment``; its arrays keep the segment until they die."""
        mapping, address = self._map(segment, size, fd)
        release = functools.partial(self._returned.append, segment)
        raw = np.asarray(Lease(address, size, mapping, release))
        pickle_length, count = _LAYOUT.unpack_from(mapping, layout_at)
        position = layout_at + _LAYOUT.size
        buffers = []
        for _ in range(count):
            offset, length = _SPAN.unpack_from(mapping, position)
            buffers.append(raw[offset : offset + length])
            position += _SPAN.size
        payload = memoryview(raw[position : position + pickle_length])  # type: ignore[arg-type]
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
