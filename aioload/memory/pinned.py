"""The pin stage: copy batches into page-locked host memory.

With ``pin_memory=True`` the loader's pin thread calls :func:`pin_batch` on every batch before
the consumer sees it. What a batch's parts become depends on what pins them:

- **torch imported, its accelerator available** (CUDA, or ``pin_memory_device``'s): torch
  tensors are pinned by torch (``tensor.pin_memory()``), objects with a ``pin_memory()`` method
  pin themselves, and every numpy array is copied into torch's pinned memory
  (``torch.empty(..., pin_memory=True)``) and handed back as a numpy array over it. CUDA knows
  that memory as pinned: ``torch.from_numpy(x).to("cuda", non_blocking=True)`` is an
  asynchronous copy, and torch's host allocator, which finds the allocation by the array's
  address, keeps it from being reused until the copy is done.
- **torch imported, no accelerator**: as torch's loader, which then turns pinning off, tensors
  and objects with a ``pin_memory()`` method are left as they are (a warning says so); numpy
  arrays are still copied into locked buffers, as below.
- **torch not imported**: numpy arrays are copied into buffers from a
  :class:`PinnedBufferPool`: page-aligned and locked with ``mlock``, so they stay in RAM, but
  CUDA does not know them as pinned (a copy from them is not asynchronous). Objects with a
  ``pin_memory()`` method pin themselves.

How a pool buffer lives
-----------------------
A buffer is an anonymous private ``mmap`` (so page-aligned), its length rounded up to a size
class, locked with ``mlock`` when it is created. Each array served from it gets a fresh *lease*
object as its ``base``; numpy keeps the lease alive through every view and slice of the array.
When the last of them dies, the lease's finalizer hands the buffer back and the pool can serve it
again. A buffer is therefore never rewritten while the consumer can still see its data.

The finalizer may run in any thread, and even inside the pool's own critical section (a garbage
collection can start on any allocation). So it never blocks: it appends the buffer to a deque and
drains that deque only if it can take the pool's lock without waiting. Whoever holds the lock
drains the deque again right after releasing it, so nothing returned is ever stranded.

The bound
---------
``max_bytes`` bounds the memory the pool holds, in use and free together; since only pool
buffers are locked, it also bounds the locked memory. When a new buffer would cross it, free
buffers of other size classes are freed first; if that is not enough, the request gets a plain,
unlocked, page-aligned buffer outside the pool, freed normally when its arrays die. The pool never
blocks waiting for the consumer and never locks more than ``max_bytes``.
"""

from __future__ import annotations

import collections
import ctypes
import ctypes.util
import errno
import functools
import math
import mmap
import os
import sys
import threading
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import numpy as np
import numpy.typing as npt

from aioload.checks import is_int
from aioload.collate.core import rebuild_mapping, rebuild_sequence
from aioload.memory.buffers import Lease, mapping_address, size_class

__all__ = [
    "DEFAULT_MAX_BYTES",
    "PinMemoryWarning",
    "PinnedBufferPool",
    "PinnedPoolStats",
    "pin_batch",
    "torch_pins",
    "warn_if_tensors_cannot_pin",
]

T = TypeVar("T")

#: Default bound on the memory a :class:`PinnedBufferPool` holds (and locks): 1 GiB.
DEFAULT_MAX_BYTES = 1 << 30

# Private, so that forked worker processes get copy-on-write pages rather than shared memory.
_MMAP_FLAGS = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)


class PinMemoryWarning(RuntimeWarning):
    """Warned (once per pool) when host memory cannot be locked.

    The pool then serves plain page-aligned buffers: results stay correct, but they are not
    locked in RAM. Raise the locked-memory limit (``ulimit -l``, ``RLIMIT_MEMLOCK``) or run with
    ``CAP_IPC_LOCK`` to lock. (A pool of your own whose ``max_bytes`` is below the limit never
    asks for more; the loader's pool holds up to :data:`DEFAULT_MAX_BYTES`.)
    """


@functools.cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name, use_errno=True)
        mlock = libc.mlock
    except (OSError, AttributeError):
        return None
    mlock.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    mlock.restype = ctypes.c_int
    return libc


def _mlock(address: int, size: int) -> None:
    """Lock ``size`` bytes at ``address`` in RAM; raise ``OSError`` when not allowed."""
    libc = _libc()
    if libc is None:
        raise OSError(errno.ENOSYS, "mlock is not available on this platform")
    if libc.mlock(address, size) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


class _Buffer:
    """One anonymous mapping, its address and whether it is locked and owned by a pool."""

    __slots__ = ("address", "locked", "mapping", "pooled", "size")

    def __init__(self, size: int, pooled: bool) -> None:
        self.mapping = (
            mmap.mmap(-1, size, flags=_MMAP_FLAGS) if _MMAP_FLAGS else mmap.mmap(-1, size)
        )
        self.address = mapping_address(self.mapping)
        self.size = size
        self.pooled = pooled
        self.locked = False

    def free(self) -> None:
        # munmap also unlocks the pages, so no munlock call is needed.
        self.mapping.close()


@dataclass(frozen=True, slots=True)
class PinnedPoolStats:
    """A snapshot of a :class:`PinnedBufferPool`.

    Attributes:
        max_bytes: the pool's bound.
        pooled_bytes: bytes of the buffers the pool holds, in use and free (``<= max_bytes``).
        locked_bytes: the part of ``pooled_bytes`` locked in RAM.
        bytes_in_use: bytes of pool buffers that arrays still use.
        buffers_in_use: pool buffers that arrays still use.
        buffers_free: pool buffers ready to be served again.
        created: pool buffers created so far.
        reused: requests served by a free buffer.
        unpooled: requests served outside the pool because the bound was reached.
        locking: whether new buffers are still locked (``False`` once ``mlock`` failed).
    """

    max_bytes: int
    pooled_bytes: int
    locked_bytes: int
    bytes_in_use: int
    buffers_in_use: int
    buffers_free: int
    created: int
    reused: int
    unpooled: int
    locking: bool


class PinnedBufferPool:
    r"""A bounded, recycled pool of page-aligned, page-locked host buffers for numpy arrays.

    Buffers are anonymous memory maps rounded up to a size class and locked with ``mlock``. An
    array served by the pool keeps its buffer until the array and every view of it are gone; the
    buffer is then reused for a later array of the same size class. All methods are thread-safe:
    one thread may pin while others use, drop or inspect earlier results.

    If memory cannot be locked (``mlock`` fails, e.g. ``RLIMIT_MEMLOCK`` is too low), the pool
    warns once with :class:`PinMemoryWarning` and goes on with unlocked, still pooled buffers.
    If a new buffer would take the pool past ``max_bytes`` even after freeing its idle buffers,
    the array gets an unlocked page-aligned buffer outside the pool, freed when the array dies.

    Args:
        max_bytes (int): bound on the bytes the pool holds, in use and free together, and so on
            the bytes it locks (default: :data:`DEFAULT_MAX_BYTES`, 1 GiB). ``0`` pools nothing.

    Example::

        >>> pool = PinnedBufferPool(max_bytes=64 << 20)
        >>> x = pool.pin_array(np.arange(6.0).reshape(2, 3))
        >>> x.ctypes.data % mmap.PAGESIZE
        0
        >>> del x  # the buffer goes back to the pool
        >>> pool.close()
    """

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if not is_int(max_bytes):
            raise TypeError(
                f"max_bytes should be an integer number of bytes, but got "
                f"max_bytes={max_bytes!r} of type {type(max_bytes).__name__}"
            )
        if max_bytes < 0:
            raise ValueError(
                f"max_bytes should be a non-negative integer value, but got max_bytes={max_bytes}"
            )
        self._max_bytes = max_bytes
        self._lock = threading.Lock()
        self._returned: collections.deque[_Buffer] = collections.deque()
        self._free: dict[int, list[_Buffer]] = {}
        self._closed = False
        self._locking = True
        self._pooled_bytes = 0
        self._locked_bytes = 0
        self._free_bytes = 0
        self._free_count = 0
        self._in_use = 0
        self._created = 0
        self._reused = 0
        self._unpooled = 0

    @property
    def max_bytes(self) -> int:
        """The bound on the bytes the pool holds and locks."""
        return self._max_bytes

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has been called."""
        return self._closed

    def empty(self, shape: int | Sequence[int], dtype: npt.DTypeLike = float) -> npt.NDArray[Any]:
        """Return a new, uninitialized, C-contiguous, page-aligned array from the pool.

        Args:
            shape (int or sequence of ints): shape of the array.
            dtype (data-type): its dtype; it must not hold Python objects (default: ``float``).

        Example::

            >>> with PinnedBufferPool() as pool:
            ...     out = pool.empty((4, 3), np.uint8)
            ...     out[:] = 7
            ...     out.shape, out.ctypes.data % mmap.PAGESIZE
            ((4, 3), 0)
        """
        dtype = np.dtype(dtype)
        if dtype.hasobject:
            raise TypeError(
                f"cannot pin an array of dtype {dtype}: it holds Python objects, not raw data"
            )
        dims = (shape,) if isinstance(shape, int) else tuple(shape)
        if any(d < 0 for d in dims):
            raise ValueError("negative dimensions are not allowed")
        buffer, failure = self._acquire(math.prod(dims) * dtype.itemsize)
        release = functools.partial(self._release, buffer) if buffer.pooled else buffer.free
        raw = np.asarray(Lease(buffer.address, buffer.size, buffer, release))
        out: npt.NDArray[Any] = np.ndarray(dims, dtype=dtype, buffer=raw)
        if failure is not None:
            # Warned only now: if a warnings filter raises, the lease already returns the buffer.
            warnings.warn(
                f"could not lock host memory ({failure}); pinned batches use unlocked "
                "page-aligned buffers instead. Raise RLIMIT_MEMLOCK (ulimit -l) to lock them.",
                PinMemoryWarning,
                stacklevel=2,
            )
        return out

    def pin_array(self, array: npt.NDArray[Any]) -> npt.NDArray[Any]:
        """Return a copy of ``array`` in a pool buffer: same dtype, shape and values.

        The copy is C-contiguous, page-aligned and writeable, whatever the layout of ``array``.

        Example::

            >>> with PinnedBufferPool() as pool:
            ...     y = pool.pin_array(np.ones((2, 4), dtype=np.float32)[:, ::2])
            ...     y.dtype, y.shape, y.flags.c_contiguous, y.tolist()
            (dtype('float32'), (2, 2), True, [[1.0, 1.0], [1.0, 1.0]])
        """
        if not isinstance(array, np.ndarray):
            raise TypeError(f"pin_array expects a numpy.ndarray, but got {type(array).__name__}")
        out = self.empty(array.shape, array.dtype)
        np.copyto(out, array, casting="no")
        return out

    def stats(self) -> PinnedPoolStats:
        """Return a :class:`PinnedPoolStats` snapshot of the pool."""
        self._enter()
        try:
            return PinnedPoolStats(
                max_bytes=self._max_bytes,
                pooled_bytes=self._pooled_bytes,
                locked_bytes=self._locked_bytes,
                bytes_in_use=self._pooled_bytes - self._free_bytes,
                buffers_in_use=self._in_use,
                buffers_free=self._free_count,
                created=self._created,
                reused=self._reused,
                unpooled=self._unpooled,
                locking=self._locking,
            )
        finally:
            self._exit()

    def close(self) -> None:
        """Free the idle buffers and stop serving; buffers in use are freed when their arrays die.

        Arrays already served stay valid. Calling ``close`` again does nothing; calling
        :meth:`empty` or :meth:`pin_array` afterwards raises ``RuntimeError``.
        """
        self._enter()
        try:
            if self._closed:
                return
            self._closed = True
            for stack in self._free.values():
                for buffer in stack:
                    self._destroy(buffer)
            self._free.clear()
            self._free_bytes = self._free_count = 0
        finally:
            self._exit()

    def __enter__(self) -> PinnedBufferPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        s = self.stats()
        return (
            f"{type(self).__name__}(max_bytes={s.max_bytes}, pooled_bytes={s.pooled_bytes}, "
            f"locked_bytes={s.locked_bytes}, buffers_in_use={s.buffers_in_use}, "
            f"buffers_free={s.buffers_free}, closed={self._closed})"
        )

    # -- internals; attributes other than _returned are guarded by _lock ----------------------

    def _enter(self) -> None:
        self._lock.acquire()
        try:
            self._drain()
        except BaseException:
            self._lock.release()
            raise

    def _exit(self) -> None:
        self._lock.release()
        # A lease that died while the lock was held left its buffer in the deque; take it now.
        self._drain_if_unlocked()

    def _release(self, buffer: _Buffer) -> None:
        # Called from lease finalizers, in any thread and at any allocation: must never block.
        self._returned.append(buffer)
        self._drain_if_unlocked()

    def _drain_if_unlocked(self) -> None:
        while self._returned and self._lock.acquire(blocking=False):
            try:
                self._drain()
            finally:
                self._lock.release()

    def _drain(self) -> None:
        while True:
            try:
                buffer = self._returned.popleft()
            except IndexError:
                return
            self._in_use -= 1
            if self._closed:
                self._destroy(buffer)
            else:
                self._free.setdefault(buffer.size, []).append(buffer)
                self._free_bytes += buffer.size
                self._free_count += 1

    def _destroy(self, buffer: _Buffer) -> None:
        self._pooled_bytes -= buffer.size
        if buffer.locked:
            self._locked_bytes -= buffer.size
        buffer.free()

    def _take_free(self, size: int) -> _Buffer:
        buffer = self._free[size].pop()
        if not self._free[size]:
            del self._free[size]
        self._free_bytes -= size
        self._free_count -= 1
        return buffer

    def _acquire(self, nbytes: int) -> tuple[_Buffer, OSError | None]:
        """Serve a buffer for ``nbytes``, and the ``mlock`` failure to warn about, if new."""
        size = size_class(nbytes)
        self._enter()
        try:
            if self._closed:
                raise RuntimeError("cannot pin into a closed PinnedBufferPool")
            if size in self._free:
                self._reused += 1
                self._in_use += 1
                return self._take_free(size), None
            if self._pooled_bytes - self._free_bytes + size > self._max_bytes:
                # Buffers in use hold the bound; never wait for the consumer to drop them.
                self._unpooled += 1
                return _Buffer(size, pooled=False), None
            # Idle buffers of other classes make room, largest first.
            while self._pooled_bytes + size > self._max_bytes:
                self._destroy(self._take_free(max(self._free)))
            buffer = _Buffer(size, pooled=True)
            self._pooled_bytes += size
            self._created += 1
            self._in_use += 1
            if not self._locking:
                return buffer, None
            try:
                _mlock(buffer.address, size)
            except OSError as exc:
                self._locking = False
                return buffer, exc
            buffer.locked = True
            self._locked_bytes += size
            return buffer, None
        finally:
            self._exit()


def _torch_tensor_type() -> type | None:
    # A tensor can only exist once torch is imported, so never import it here.
    torch = sys.modules.get("torch")
    tensor: type | None = getattr(torch, "Tensor", None)
    return tensor


def _unpinned_message(device: str) -> str:
    return (
        f"pin_memory=True, but no {device} accelerator is available: torch tensors (and objects "
        "with a pin_memory() method) are left as they are, not pinned; numpy arrays are copied "
        "into mlock-ed host memory, which CUDA does not know as pinned"
    )


def _accelerator_available(torch: Any, device: str) -> bool:
    accelerator = getattr(torch, device.split(":")[0] or "cuda", None)
    is_available = getattr(accelerator, "is_available", None)
    return bool(callable(is_available) and is_available())


def torch_pins(device: str) -> bool:
    """Whether torch pins (torch is imported and its ``device`` accelerator is available).

    ``device`` is the loader's ``pin_memory_device`` (``""``: CUDA). aioload never imports
    torch for it: without torch imported, this is False.
    """
    torch = sys.modules.get("torch")
    return torch is not None and _accelerator_available(torch, device)


def warn_if_tensors_cannot_pin(device: str, *, stacklevel: int) -> None:
    """Warns, as torch's loader does at every ``iter()``, that tensors will not be pinned.

    Only when torch is imported (a tensor cannot exist before) and the accelerator
    (CUDA, or ``device``'s type) is not available. ``stacklevel`` counts from the caller
    of this function, so that the warning points at the user's line that iterates the
    loader (torch's points inside torch).
    """
    if sys.modules.get("torch") is None or torch_pins(device):
        return
    _warned_at_iter.add(device or "cuda")
    warnings.warn(_unpinned_message(device or "cuda"), UserWarning, stacklevel=stacklevel + 1)


# Devices warned about at iter(), so that the pin thread does not warn again.
_warned_at_iter: set[str] = set()


@functools.cache
def _warn_unpinned_tensors(device: str) -> None:
    # The pin thread's fallback, once per process and device, for tensors met when torch was
    # not yet imported at iter() (the thread has no user line to point at).
    if device not in _warned_at_iter:
        warnings.warn(_unpinned_message(device), UserWarning, stacklevel=3)


def _torch_pinned_array(torch: Any, array: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """A numpy copy of ``array`` in torch's pinned memory, at the start of its allocation.

    The array's base holds the pinned tensor, so the memory lives as long as the array or any
    view of it; torch's host allocator then keeps it from reuse until a copy from it is done.
    """
    pinned = torch.empty(array.nbytes, dtype=torch.uint8, pin_memory=True)
    out: npt.NDArray[Any] = np.ndarray(array.shape, dtype=array.dtype, buffer=pinned.numpy())
    np.copyto(out, array, casting="no")
    return out


@dataclass(frozen=True, slots=True)
class _Pinning:
    """How one batch is pinned: the pool, the device, and whether torch pins."""

    pool: PinnedBufferPool
    device: str
    torch: Any  # the torch module where torch pins, else None
    torch_imported: bool


def _pin(data: Any, how: _Pinning) -> Any:
    tensor_type = _torch_tensor_type()
    if tensor_type is not None and isinstance(data, tensor_type):
        if how.torch is None:
            # Without the accelerator torch cannot pin; like a CPU-only torch loader, leave it.
            _warn_unpinned_tensors(how.device or "cuda")
            return data
        tensor = cast(Any, data)
        return tensor.pin_memory(how.device) if how.device else tensor.pin_memory()
    if isinstance(data, np.ndarray):
        # Other ndarray subclasses (masked arrays, matrices) carry more than their data.
        if (type(data) is np.ndarray or isinstance(data, np.memmap)) and not data.dtype.hasobject:
            if how.torch is not None:
                return _torch_pinned_array(how.torch, data)
            return how.pool.pin_array(data)
        return data
    if isinstance(data, str | bytes | bytearray | memoryview):
        return data
    if isinstance(data, Mapping):
        return rebuild_mapping(data, {key: _pin(value, how) for key, value in data.items()})
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(_pin(item, how) for item in data))
    if isinstance(data, Sequence):
        rebuilt = rebuild_sequence(data, [_pin(item, how) for item in data])
        if isinstance(data, tuple) and not isinstance(rebuilt, tuple):
            return tuple(rebuilt)  # a tuple whose type could not be rebuilt stays a tuple
        return rebuilt
    method = getattr(data, "pin_memory", None)
    if callable(method) and not isinstance(data, type):
        if how.torch_imported and how.torch is None:
            return data  # torch's loader pins nothing without an accelerator
        return method()
    return data


def pin_batch(batch: T, pool: PinnedBufferPool, device: str = "") -> T:
    r"""Return ``batch`` with its data in page-locked host memory, recursing like torch's pinning.

    Where torch is imported and its accelerator (CUDA, or ``device``'s type) is available:

    * torch tensors: ``tensor.pin_memory()``;
    * numpy arrays: copied into torch's pinned memory, and still numpy arrays, each at the start
      of its own allocation (so ``torch.from_numpy(x).to("cuda", non_blocking=True)`` copies
      asynchronously, and torch keeps the memory until the copy is done);
    * other objects with a ``pin_memory()`` method (custom batch types): ``obj.pin_memory()``.

    Otherwise (aioload never imports torch):

    * numpy arrays: copied by ``pool.pin_array`` into page-aligned, ``mlock``-ed buffers, which
      CUDA does not know as pinned;
    * torch tensors, and objects with a ``pin_memory()`` method once torch is imported: left as
      they are, as torch's loader leaves them without an accelerator; without torch imported,
      such objects' ``pin_memory()`` is called.

    In both, arrays of Python objects and ndarray subclasses other than ``np.memmap`` are left
    as they are; ``str``, ``bytes``: unchanged; mappings, namedtuples, tuples, lists and other
    sequences: recursed, keeping their type where it can be rebuilt (a copy for mutable ones),
    else a ``dict`` / ``list``; anything else: unchanged.

    As in torch, containers are recursed before a ``pin_memory()`` method is looked for. Unlike
    torch, plain tuples stay tuples rather than becoming lists.

    Thread-safe: call it from the pin thread while the consumer uses earlier batches.

    Args:
        batch: a collated batch.
        pool (PinnedBufferPool): the pool that serves the numpy buffers where torch does not pin.
        device (str, optional): the ``pin_memory_device`` to pin for; ``""`` (default) pins for
            CUDA.

    Example::

        >>> with PinnedBufferPool() as pool:
        ...     out = pin_batch({"x": np.zeros((8, 3)), "y": [1, 2]}, pool)
        ...     out["x"].ctypes.data % mmap.PAGESIZE
        0
    """
    if not isinstance(pool, PinnedBufferPool):
        raise TypeError(f"pool should be a PinnedBufferPool, but got {type(pool).__name__}")
    if not isinstance(device, str):
        raise TypeError(f"device should be a str, but got {type(device).__name__}")
    torch = sys.modules.get("torch")
    pins = torch is not None and _accelerator_available(torch, device)
    how = _Pinning(pool, device, torch if pins else None, torch is not None)
    pinned: T = _pin(batch, how)
    return pinned
