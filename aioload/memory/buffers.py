"""Raw memory shared by the pin stage and the worker transport: size classes and leases.

A *lease* is the ``base`` of numpy arrays that live in memory aioload manages
(a pinned buffer, a shared-memory segment). numpy keeps an array's base alive
through every view and slice, so the lease dies exactly when the last array
that uses the memory dies, and its ``release`` callback then hands the memory
back to whoever recycles it.
"""

from __future__ import annotations

import ctypes
import mmap
from collections.abc import Callable
from typing import Any

__all__ = ["HUGE_PAGE", "Lease", "advise_huge_pages", "mapping_address", "size_class"]

PAGESIZE = mmap.PAGESIZE
HUGE_PAGE = 2 << 20  # the transparent huge page of x86-64 and most arm64 kernels


def size_class(nbytes: int) -> int:
    """Rounds ``nbytes`` up to whole pages with at most three significant bits.

    Classes are 1, 2, ..., 8, 10, 12, 14, 16, 20, 24, 28, 32, ... pages: buffers
    of slightly different sizes share a class, and rounding whole pages up to a
    class wastes at most a fifth of the buffer.

    Example::

        >>> size_class(1) == mmap.PAGESIZE
        True
    """
    pages = max(1, -(-nbytes // PAGESIZE))
    shift = max(0, pages.bit_length() - 3)
    pages = -(-pages >> shift) << shift
    return pages * PAGESIZE


def mapping_address(mapping: mmap.mmap) -> int:
    """The address of a writable memory map's first byte."""
    # The ctypes view exports the mapping's buffer; dropping it at once keeps close() possible.
    view = ctypes.c_char.from_buffer(mapping)
    address = ctypes.addressof(view)
    del view
    return address


def advise_huge_pages(mapping: mmap.mmap, size: int) -> bool:
    """Asks for transparent huge pages on the whole huge pages of a shared-memory mapping.

    A 16 MiB batch in 4 KiB pages costs 4096 page faults the first time each side touches
    its segment and 4096 TLB misses each time the consumer reads a byte per page; in 2 MiB
    pages, 8 of each. Whether the kernel gives them is its setting for shared memory
    (``/sys/kernel/mm/transparent_hugepage/shmem_enabled``: ``advise``, ``within_size``
    or ``always``; with ``never``, the default of many kernels, the advice changes
    nothing). Only the whole 2 MiB pages at the start are advised, so a segment never
    takes more memory than its size. Returns whether the advice was taken (False where
    the platform has no ``MADV_HUGEPAGE`` or the mapping is under one huge page).

    Example::

        >>> advise_huge_pages(mmap.mmap(-1, 4096), 4096)
        False
    """
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    whole = size // HUGE_PAGE * HUGE_PAGE
    if advice is None or whole == 0:
        return False
    try:
        mapping.madvise(advice, 0, whole)
    except OSError:  # a kernel without transparent huge pages
        return False
    return True


class Lease:
    """The ``base`` of arrays served from ``size`` bytes at ``address``.

    Args:
        address: the first byte.
        size: the bytes the lease covers.
        keepalive: what owns the memory (a memory map); held as long as the lease.
        release: called once, from whatever thread drops the last array, when
            the lease dies; it must not block.

    Example::

        >>> import numpy as np
        >>> mapping = mmap.mmap(-1, 4096)
        >>> freed = []
        >>> lease = Lease(mapping_address(mapping), 4096, mapping, lambda: freed.append(1))
        >>> raw = np.asarray(lease)
        >>> del lease
        >>> raw.dtype, raw.shape
        (dtype('uint8'), (4096,))
        >>> x = raw[:64].view(np.float32)
        >>> del raw
        >>> freed   # x holds the lease
        []
        >>> del x
        >>> freed   # released once the last array is gone
        [1]
    """

    __slots__ = ("_address", "_keepalive", "_release", "_size")

    def __init__(
        self, address: int, size: int, keepalive: Any, release: Callable[[], None] | None
    ) -> None:
        self._address = address
        self._size = size
        self._keepalive = keepalive
        self._release = release

    @property
    def __array_interface__(self) -> dict[str, Any]:
        return {
            "version": 3,
            "shape": (self._size,),
            "typestr": "|u1",
            "data": (self._address, False),
        }

    def __del__(self) -> None:
        if self._release is not None:
            self._release()
