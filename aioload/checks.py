"""Small checks of values, written once: integers that are not bools, counts above a floor.

``bool`` is a subclass of ``int``, so ``isinstance(True, int)`` holds and a bare
``isinstance`` check lets ``batch_size=True`` through as ``1``. Every check of an
argument, a checkpoint field or an index file's number goes through these
predicates instead, so the rule is written once. This module imports nothing of
aioload: every package may use it.

Example::

    >>> from aioload.checks import is_int, is_integral, require_count
    >>> is_int(3), is_int(True), is_int(3.0)
    (True, False, False)
    >>> import numpy as np
    >>> is_int(np.int64(3)), is_integral(np.int64(3))
    (False, True)
    >>> require_count(0, "max_skipped")
    0
    >>> require_count(0, "batch_size", low=1)
    Traceback (most recent call last):
    ...
    ValueError: batch_size must be an integer >= 1, got 0
"""

from __future__ import annotations

import numbers
from typing import Any, TypeGuard


def is_int(value: Any) -> TypeGuard[int]:
    """Whether ``value`` is a Python ``int`` and not a ``bool`` (what JSON gives back).

    Args:
        value: anything.

    Example::

        >>> is_int(0), is_int(False)
        (True, False)
    """
    return isinstance(value, int) and not isinstance(value, bool)


def is_integral(value: Any) -> TypeGuard[numbers.Integral]:
    """Whether ``value`` is an integer of any kind (numpy's included) and not a ``bool``.

    Args:
        value: anything.

    Example::

        >>> import numpy as np
        >>> is_integral(np.uint8(7)), is_integral(np.bool_(True)), is_integral(7.0)
        (True, False, False)
    """
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_real(value: Any) -> TypeGuard[numbers.Real]:
    """Whether ``value`` is a real number (an integer or a float) and not a ``bool``.

    Args:
        value: anything.

    Example::

        >>> is_real(0.5), is_real(2), is_real(True), is_real("1")
        (True, True, False, False)
    """
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def require_count(value: Any, name: str, *, low: int = 0) -> int:
    """``value`` as an ``int`` if it is an integer ``>= low``; else raise, naming ``name``.

    Args:
        value: the value to check; numpy integers are accepted and returned as ``int``.
        name: what the value is, as the error message names it (an argument's name).
        low: the smallest value allowed.

    Raises:
        TypeError: ``value`` is not an integer, or is a ``bool``.
        ValueError: ``value`` is below ``low``.

    Example::

        >>> require_count(4, "concurrency", low=1)
        4
        >>> require_count(True, "concurrency", low=1)
        Traceback (most recent call last):
        ...
        TypeError: concurrency must be an integer >= 1, got True (a bool)
    """
    if not is_integral(value):
        kind = type(value).__name__
        raise TypeError(f"{name} must be an integer >= {low}, got {value!r} (a {kind})")
    count = int(value)
    if count < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {count}")
    return count
