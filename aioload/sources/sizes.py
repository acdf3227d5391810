"""Sizes in bytes written the way people write them: ``"50GB"``, ``"512MiB"``, ``"1.5 GB"``."""

from __future__ import annotations

import re
from decimal import Decimal

from aioload.checks import is_integral

__all__ = ["parse_size"]

# Decimal units are powers of 1000 (as disks are sold), binary ones of 1024.
_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "pb": 10**15,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "pib": 2**50,
}

_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*$")

ALLOWED = (
    "an int of bytes, or a str of a number and a unit: B, kB, MB, GB, TB, PB (powers of 1000) "
    'or KiB, MiB, GiB, TiB, PiB (powers of 1024), e.g. "50GB", "512MiB", "1.5 GB"'
)


def parse_size(size: int | str, what: str = "size") -> int:
    """The number of bytes ``size`` says: an int of bytes, or a number with a unit.

    Units (case does not matter): ``B``, ``kB``, ``MB``, ``GB``, ``TB``,
    ``PB`` are powers of 1000; ``KiB``, ``MiB``, ``GiB``, ``TiB``, ``PiB``
    powers of 1024. A fraction is rounded down to whole bytes. The size must
    be at least one byte.

    Args:
        size: the size.
        what: the argument's name, for the error message.

    Raises:
        ValueError, TypeError: naming ``what`` and what is allowed.

    Example::

        >>> parse_size("50GB"), parse_size("512MiB"), parse_size("1.5 GB"), parse_size(4096)
        (50000000000, 536870912, 1500000000, 4096)
    """
    if is_integral(size):
        nbytes = int(size)
    elif isinstance(size, str):
        match = _SIZE.match(size)
        unit = match.group(2).lower() if match else ""
        if match is None or unit not in _UNITS:
            raise ValueError(f"{what} should be {ALLOWED}; got {size!r}")
        # Decimal: "1.1MB" is 1100000 bytes exactly, not what a float makes of it.
        nbytes = int(Decimal(match.group(1)) * _UNITS[unit])
    else:
        raise TypeError(f"{what} should be {ALLOWED}; got {size!r}")
    if nbytes < 1:
        raise ValueError(f"{what} should be at least 1 byte; got {size!r}")
    return nbytes
