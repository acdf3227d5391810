"""Where a process keeps an array: its mapping in ``/proc/self/maps``, and the setup segments.

Used in worker processes too (a dataset reports what its worker sees), so it is
a plain module the workers can import.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

SETUP_SEGMENT = "/memfd:aioload-setup"  # how a worker setup's segment is named
RESULT_SEGMENT = "/memfd:aioload "  # a worker's result segment ("/memfd:aioload (deleted)")


def address_of(array: np.ndarray[Any, Any]) -> int:
    """The address of ``array``'s first byte."""
    address: int = array.__array_interface__["data"][0]
    return address


def mapping_of(address: int) -> str:
    """The path of this process's mapping that holds ``address`` ("" when anonymous)."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        low, high = (int(bound, 16) for bound in fields[0].split("-"))
        if low <= address < high:
            return fields[5] if len(fields) > 5 else ""
    raise AssertionError(f"{address:#x} is not mapped")


def segment_inode(array: np.ndarray[Any, Any]) -> int:
    """The inode of the worker result segment (``memfd:aioload``) that holds ``array``'s data.

    Every segment a worker creates is a new memfd with an inode of its own, so the inodes
    the batches of an epoch lie in count the segments the workers created for them.
    """
    address = address_of(array)
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        low, high = (int(bound, 16) for bound in fields[0].split("-"))
        if low <= address < high:
            path = fields[5] if len(fields) > 5 else ""
            assert path.startswith(RESULT_SEGMENT), f"{address:#x} lies in {path!r}"
            return int(fields[4])
    raise AssertionError(f"{address:#x} is not mapped")


def in_setup_segment(array: np.ndarray[Any, Any]) -> bool:
    """Whether ``array``'s data lies in a mapping of a worker setup's segment."""
    return mapping_of(address_of(array)).startswith(SETUP_SEGMENT)


def segments() -> set[tuple[int, int]]:
    """This process's descriptors of worker setup segments, as (descriptor, inode) pairs.

    The inode tells a new segment from an old one whose descriptor number was reused.
    """
    found = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}").startswith(SETUP_SEGMENT):
                found.add((int(name), os.stat(f"/proc/self/fd/{name}").st_ino))
        except OSError:  # the descriptor listdir itself used, closed since
            pass
    return found


def new_segments(before: set[tuple[int, int]]) -> set[tuple[int, int]]:
    """The setup segments this process holds that it did not hold ``before``."""
    return segments() - before
