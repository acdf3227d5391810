"""What a sampler is: the :class:`Sampler` base class and :func:`is_async_sampler`.

Any iterable of keys is a sampler, and so is any *async* iterable of keys (an object with
``__aiter__``, such as an async generator); :func:`is_async_sampler` tells them apart.
Subclassing :class:`Sampler` is optional. The built-in samplers live in
:mod:`aioload.samplers` (key samplers), :mod:`aioload.samplers.batch` and
:mod:`aioload.samplers.distributed`; all of them are importable from :mod:`aioload.samplers`.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Iterator, Sized
from typing import Any, Generic, TypeGuard, TypeVar

__all__ = ["Sampler", "is_async_sampler"]

T_co = TypeVar("T_co", covariant=True)


def is_async_sampler(obj: object) -> TypeGuard[AsyncIterable[Any]]:
    """Return ``True`` if ``obj`` is an async sampler, i.e. its type defines ``__aiter__``.

    Objects with only ``__iter__`` (every torch-style sampler) are sync samplers.

    Example:
        >>> async def keys():
        ...     yield 0
        >>> is_async_sampler(keys()), is_async_sampler(range(3))
        (True, False)
    """
    return isinstance(obj, AsyncIterable)


class Sampler(Generic[T_co]):
    """Base class for all samplers.

    A subclass provides ``__iter__`` yielding keys (or lists of keys, for a batch sampler) and
    may provide ``__len__``. Subclassing is optional: any iterable with the same methods works.
    An async sampler provides ``__aiter__`` instead.

    Args:
        data_source: ignored; accepted for compatibility with older torch code.

    Example:
        >>> class EvenThenOdd(Sampler[int]):
        ...     def __init__(self, n: int) -> None:
        ...         self.n = n
        ...     def __len__(self) -> int:
        ...         return self.n
        ...     def __iter__(self) -> Iterator[int]:
        ...         yield from range(0, self.n, 2)
        ...         yield from range(1, self.n, 2)
        >>> list(EvenThenOdd(5))
        [0, 2, 4, 1, 3]
    """

    # No default ``__len__``: ``list(sampler)`` and friends must be able to tell an unsized
    # sampler from a sized one (see torch's note on abstract base classes and ``__len__``).

    def __init__(self, data_source: Sized | None = None) -> None:
        pass

    def __iter__(self) -> Iterator[T_co]:
        raise NotImplementedError
