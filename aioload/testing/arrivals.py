"""Counting when requests arrived: the busiest window, and the count in each second.

What a test or a benchmark of a request rate reads from
:meth:`~aioload.testing.ObjectServer.arrivals` (each request's arrival, in seconds since the
server started).

Example::

    >>> most_in_window([0.0, 0.5, 1.2]), per_second([0.0, 0.5, 1.2])
    (2, [2, 1])
"""

from __future__ import annotations

__all__ = ["most_in_window", "per_second"]


def most_in_window(times: list[float], window: float = 1.0) -> int:
    """The most of ``times`` (sorted seconds) in any span of ``window`` seconds (half-open).

    Example::

        >>> most_in_window([0.0, 0.2, 0.9, 1.0, 1.5])
        3
    """
    most = start = 0
    for end, moment in enumerate(times):
        while times[start] <= moment - window:
            start += 1
        most = max(most, end - start + 1)
    return most


def per_second(times: list[float]) -> list[int]:
    """How many of ``times`` (seconds since the start) fell in each whole second.

    Example::

        >>> per_second([0.1, 0.5, 2.2])
        [2, 0, 1]
    """
    counts = [0] * (int(max(times)) + 1 if times else 0)
    for moment in times:
        counts[int(moment)] += 1
    return counts
