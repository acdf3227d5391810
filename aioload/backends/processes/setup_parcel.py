"""The worker setup on its way to worker processes that pickle it: pickled once, arrays shared.

Under ``forkserver`` and ``spawn`` a worker receives the dataset, ``collate_fn``
and ``worker_init_fn`` pickled. Plain pickling would copy every numpy array
into every worker: a 4 GiB array and 8 workers make 32 GiB. A
:class:`SetupParcel` pickles the setup with protocol 5 instead, and every
buffer of at least :data:`OUT_OF_BAND_MIN` bytes (a contiguous numpy array, a
:class:`~aioload.SharedList`'s storage) leaves the pickle *out of band*: the
parent copies it once into one shared-memory segment, and every worker maps
that segment read-only and unpickles its arrays as views of the mapping. The
large arrays then exist twice in all (the parent's and the segment), whatever
the number of workers, and a worker starts without copying them.

The segment:

- is a ``memfd`` (no name in ``/dev/shm``, and not bound by its size; where
  ``memfd_create`` is missing, a POSIX segment unlinked at once), written once
  by the parent and then sealed against writes, growing and shrinking where
  the kernel supports seals;
- reaches each worker as a descriptor among the ``Process`` arguments
  (``multiprocessing.reduction.DupFd``, which ``spawn`` and ``forkserver``
  both pass on), so it lives exactly as long as the pool holds its descriptor
  (until :meth:`SetupParcel.close`, at the pool's shutdown) and any worker maps
  it: a worker started later (a replacement) still gets it;
- is mapped ``PROT_READ``: the large arrays a worker receives are read-only,
  and writing one raises ``ValueError: assignment destination is read-only``.
  Small arrays stay inside the pickle and arrive as writable copies.

Multiprocessing's own objects (``Value``, ``Array``, ``Lock``, ``Semaphore``,
``Queue`` made from the loader's context) travel as they do when a dataset is
handed to ``Process`` directly, as torch does: the pickler uses
multiprocessing's reducers, in a spawning context. Most of them (locks,
semaphores, events on Linux) pickle the same for every child, so the setup is
still pickled once. Some hand each child its own duplicate of a descriptor (a
``Value``'s memory, a ``Queue``'s pipe): those can only be pickled while
``Process.start`` spawns that child, so then the setup is pickled again for each
worker, inside ``Process.start`` — its large buffers still out of band, in the
segment written once (a buffer is recognised by its address and length).

Example::

    parcel = SetupParcel.pack(setup, "forkserver")
    context.Process(target=worker_main, args=(worker_id, seed, parcel, ...)).start()
    ...
    parcel.close()                  # when the pool shuts down

    # in the worker
    setup = open_setup(parcel)      # the WorkerSetup, its large arrays read-only views
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import mmap
import os
import pickle
import sys
import weakref
from collections.abc import Callable, Iterator
from multiprocessing import context as mp_context
from multiprocessing import reduction
from typing import Any, NoReturn

import numpy as np

from aioload.backends.processes.pickling import pickle_setup
from aioload.memory.segments import shared_memory_fd
from aioload.read.reader import WorkerSetup

__all__ = ["OUT_OF_BAND_MIN", "ReceivedParcel", "SetupParcel", "open_setup"]

OUT_OF_BAND_MIN = 64 << 10  # bytes: smaller buffers stay inside the pickle
_ALIGN = 64  # cache-line alignment of every buffer in the segment
_SEGMENT_NAME = "aioload-setup"  # how the segment shows in /proc/<pid>/maps and fd links

Span = tuple[int, int]  # a buffer's offset in the segment, and its length


def _aligned(offset: int) -> int:
    return -(-offset // _ALIGN) * _ALIGN


class _SetupPickler(pickle.Pickler):
    """Protocol 5, a buffer callback and multiprocessing's reducers.

    ``ForkingPickler`` itself cannot take ``buffer_callback`` (its ``__init__``
    passes positional arguments only), so this copies its dispatch table:
    copyreg's plus what multiprocessing (and torch, when imported) registered.
    """

    def __init__(
        self, file: io.BytesIO, buffer_callback: Callable[[pickle.PickleBuffer], Any]
    ) -> None:
        super().__init__(file, protocol=5, buffer_callback=buffer_callback)
        self.dispatch_table = reduction.ForkingPickler(io.BytesIO(), 5).dispatch_table


def _dumps(obj: Any, buffer_callback: Callable[[pickle.PickleBuffer], Any]) -> bytes:
    file = io.BytesIO()
    _SetupPickler(file, buffer_callback).dump(obj)
    return file.getvalue()


class _DryRunPopen:
    """Stands in for the ``Popen`` of a child being spawned while the setup is pickled once.

    multiprocessing's objects refuse to be pickled outside ``Process.start``
    (``assert_spawning``); inside it, most pickle the same for every child, and
    the ones that do not ask the spawning ``Popen`` for a per-child duplicate
    of a descriptor or handle. This one notes such a request (``per_child``)
    and returns a placeholder: the pickle it ends up in is thrown away.
    """

    def __init__(self) -> None:
        self.per_child = False

    def duplicate_for_child(self, handle: int) -> int:
        self.per_child = True
        return handle

    def DupFd(self, fd: int) -> None:  # multiprocessing's name for it
        self.per_child = True


@contextlib.contextmanager
def _spawning(popen: Any) -> Iterator[None]:
    """Pickles in this thread as ``Process.start`` does: with ``popen`` as the spawning one."""
    previous = mp_context.get_spawning_popen()
    mp_context.set_spawning_popen(popen)
    try:
        yield
    finally:
        mp_context.set_spawning_popen(previous)


def _address(raw: memoryview) -> int:
    """The address of a (possibly read-only) contiguous buffer's first byte."""
    address: int = np.frombuffer(raw, dtype=np.uint8).__array_interface__["data"][0]
    return address


class _Placement:
    """Where each large buffer goes in the segment, each placed once.

    A buffer is known by its address and length, so the same memory met again
    (a second view of an array, or the next worker's own pickle of the setup)
    takes the span it already has. The buffers placed are held (``sources``),
    so their memory cannot be freed and its address reused by another buffer.
    """

    def __init__(self, threshold: int) -> None:
        self.threshold = threshold
        self.sources: list[memoryview] = []  # in segment order
        self.spans: list[Span] = []
        self._by_memory: dict[tuple[int, int], Span] = {}
        self.size = 0

    def place(self, buffer: pickle.PickleBuffer) -> Span | None:
        """The span of ``buffer`` in the segment (given one now), or None: it stays in band."""
        raw = buffer.raw()
        if raw.nbytes < self.threshold:
            return None
        key = (_address(raw), raw.nbytes)
        span = self._by_memory.get(key)
        if span is None:
            span = (_aligned(self.size), raw.nbytes)
            self.size = span[0] + raw.nbytes
            self._by_memory[key] = span
            self.sources.append(raw)
            self.spans.append(span)
        return span

    def find(self, buffer: pickle.PickleBuffer) -> Span | None:
        """The span ``buffer`` was given, or None (too small, or memory not seen before)."""
        raw = buffer.raw()
        if raw.nbytes < self.threshold:
            return None
        return self._by_memory.get((_address(raw), raw.nbytes))


def _segment_fd(size: int) -> int:
    """A descriptor of ``size`` bytes of shared memory, sealable where the kernel can."""
    # Without memfd: a POSIX segment unlinked at once, so nothing is left anywhere either.
    return shared_memory_fd(size, name=_SEGMENT_NAME, sealable=True)


def _seal(fd: int) -> None:
    """Forbids writing, growing and shrinking the segment, and further seal changes.

    Only once nothing maps it writable (it is written with ``pwrite``, never
    mapped here). A segment that cannot be sealed (no memfd) is still mapped
    read-only by every worker.
    """
    seals = 0
    for name in ("F_SEAL_WRITE", "F_SEAL_GROW", "F_SEAL_SHRINK", "F_SEAL_SEAL"):
        seals |= getattr(fcntl, name, 0)
    add_seals = getattr(fcntl, "F_ADD_SEALS", None)
    if add_seals is None or not seals:
        return
    try:
        fcntl.fcntl(fd, add_seals, seals)
    except OSError:  # not a memfd made with MFD_ALLOW_SEALING
        pass


def _write_segment(placement: _Placement) -> int:
    """A sealed segment holding every buffer of ``placement`` at its span."""
    fd = _segment_fd(placement.size)
    try:
        for raw, (offset, length) in zip(placement.sources, placement.spans, strict=True):
            written = 0
            while written < length:
                written += os.pwrite(fd, raw[written:], offset + written)
        _seal(fd)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _explain(setup: WorkerSetup, start_method: str, error: Exception) -> NoReturn:
    """Raises the error that names the unpicklable part of ``setup`` (pickled as here)."""

    def dumps(obj: Any) -> bytes:
        # Out of band and thrown away: looking for the culprit copies no array.
        with _spawning(_DryRunPopen()):
            return _dumps(obj, lambda buffer: False)

    pickle_setup(setup, start_method, dumps=dumps)
    # The setup pickled this time: raise what the first attempt raised.
    error.add_note("raised while pickling the dataset, collate_fn and worker_init_fn for workers")
    raise error


class SetupParcel:
    """The loader's side of a worker setup that a start method pickles (see the module docstring).

    Made by :meth:`pack`; passed as the ``setup`` argument of each worker's
    ``Process`` (it can only be pickled there, while ``Process.start`` runs,
    and arrives in the worker as a :class:`ReceivedParcel`); closed when the
    pool that made it shuts down.

    Example::

        parcel = SetupParcel.pack(setup, "spawn")
        parcel.shared_bytes     # how big the segment of large buffers is (0: none)
        parcel.pickled_once     # False: pickled again for each worker as it starts
    """

    def __init__(
        self,
        setup: WorkerSetup,
        pickled: tuple[bytes, tuple[Span, ...]] | None,
        placement: _Placement,
        fd: int | None,
    ) -> None:
        self._setup = setup
        self._pickled = pickled  # None: pickled for each worker, inside Process.start
        self._size = placement.size
        self._fd = fd
        self._close_fd = None if fd is None else weakref.finalize(self, os.close, fd)
        self._closed = False
        if pickled is not None:
            placement.sources.clear()  # nothing is looked up again: let the memory go
        self._placement = placement

    @classmethod
    def pack(
        cls, setup: WorkerSetup, start_method: str, *, threshold: int = OUT_OF_BAND_MIN
    ) -> SetupParcel:
        """Pickles ``setup`` for workers started with ``start_method``, large buffers shared.

        Args:
            setup: what every worker receives.
            start_method: ``"forkserver"`` or ``"spawn"`` (named in errors).
            threshold: buffers of at least this many bytes go to the segment.

        Raises:
            Exception: of the type the pickler raised, naming the attribute
                that cannot be pickled and a remedy (see
                :func:`~aioload.backends.processes.pickling.pickle_setup`).

        Example::

            parcel = SetupParcel.pack(setup, "forkserver")
        """
        placement = _Placement(threshold)
        popen = _DryRunPopen()
        spans: list[Span] = []  # one per buffer out of band, in the pickle's order

        def out_of_band(buffer: pickle.PickleBuffer) -> bool:
            span = placement.place(buffer)
            if span is None:
                return True  # in band
            spans.append(span)
            return False

        try:
            with _spawning(popen):
                blob = _dumps(setup, out_of_band)
        except Exception as error:
            _explain(setup, start_method, error)
        fd = _write_segment(placement) if placement.size else None
        return cls(setup, None if popen.per_child else (blob, tuple(spans)), placement, fd)

    @property
    def shared_bytes(self) -> int:
        """The size of the segment of large buffers (0: every buffer stayed in the pickle)."""
        return self._size

    @property
    def pickled_once(self) -> bool:
        """True: one pickle for every worker; False: pickled again as each worker starts."""
        return self._pickled is not None

    @property
    def closed(self) -> bool:
        """Closed: no worker can start from it any more."""
        return self._closed

    def close(self) -> None:
        """Closes the parent's descriptor; workers that mapped the segment keep their mapping."""
        self._closed = True
        if self._close_fd is not None:
            self._close_fd()

    def _pickle_for_child(self) -> tuple[bytes, tuple[Span, ...]]:
        """The setup pickled for the child being spawned, its large buffers in the segment."""
        spans: list[Span] = []

        def out_of_band(buffer: pickle.PickleBuffer) -> bool:
            span = self._placement.find(buffer)
            if span is None:
                return True  # small, or memory the segment does not hold: in band
            spans.append(span)
            return False

        try:
            blob = _dumps(self._setup, out_of_band)
        except Exception as error:
            error.add_note("raised while pickling the worker setup for a worker process")
            raise
        return blob, tuple(spans)

    def __reduce__(self) -> tuple[Any, ...]:
        if mp_context.get_spawning_popen() is None:
            raise TypeError("a SetupParcel is only pickled as a worker Process starts")
        if self.closed:
            raise RuntimeError("the SetupParcel is closed: its worker pool has shut down")
        blob, spans = self._pickled if self._pickled is not None else self._pickle_for_child()
        fd = None if self._fd is None else reduction.DupFd(self._fd)
        return ReceivedParcel, (blob, fd, self._size, spans)


class ReceivedParcel:
    """A worker's side of a :class:`SetupParcel`: the pickle and the segment's descriptor.

    Args:
        blob: the pickled setup, its large buffers out of band.
        fd: the segment's descriptor as multiprocessing passed it (its
            ``detach()`` gives the descriptor), or None when there is no segment.
        size: the segment's size.
        spans: where each out-of-band buffer lies in the segment, in order.

    Example::

        setup = received.open()   # once: maps the segment, unpickles, closes the descriptor
    """

    __slots__ = ("_blob", "_fd", "_size", "_spans")

    def __init__(self, blob: bytes, fd: Any, size: int, spans: tuple[Span, ...]) -> None:
        self._blob = blob
        self._fd = fd
        self._size = size
        self._spans = spans

    def open(self) -> WorkerSetup:
        """The setup, its large arrays read-only views of the segment mapped here."""
        buffers: list[memoryview] = []
        if self._fd is not None:
            fd = self._fd.detach()
            self._fd = None
            try:
                # Python 3.13 can map without keeping a duplicate descriptor open.
                extra = {"trackfd": False} if sys.version_info >= (3, 13) else {}
                mapping = mmap.mmap(
                    fd, self._size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ, **extra
                )
            finally:
                os.close(fd)
            # The arrays' memoryviews keep the mapping alive, and it unmaps when they die.
            whole = memoryview(mapping)
            buffers = [whole[offset : offset + length] for offset, length in self._spans]
        setup = pickle.loads(self._blob, buffers=buffers)
        if not isinstance(setup, WorkerSetup):
            raise TypeError(f"a worker received {type(setup).__qualname__}, not a WorkerSetup")
        return setup


def open_setup(received: WorkerSetup | SetupParcel | ReceivedParcel) -> WorkerSetup:
    """The setup a worker's ``Process`` received: as is (``fork``), or from its parcel.

    A :class:`SetupParcel` given to ``Process`` arrives in the worker as a
    :class:`ReceivedParcel`; one that did not cross a process (the ``fork``
    start method does not pickle) gives its setup as it is.

    Example::

        setup = open_setup(setup_argument)   # in worker_main, before anything else
    """
    if isinstance(received, WorkerSetup):
        return received
    if isinstance(received, SetupParcel):
        return received._setup
    return received.open()
