"""Row blocks: a batch of samples held by columns, collated without a row in sight.

A columnar source (Parquet, Arrow) reads rows by the thousand into arrays; building one
dict per row only for :func:`~aioload.collate.core.default_collate` to take them apart again
would cost more than the read. A :class:`RowBlock` is such a batch kept as columns. It is
a ``Sequence`` of its rows (``block[i]`` is row ``i`` as a dict), so anything that treats
a batch as a list of samples still works; and it collates itself:

- ``default_collate(block)`` is ``block.collate()``, which must equal
  ``default_collate(block.rows())`` — the same keys, values, dtypes and errors — only
  faster (the contract every subclass is tested against). One exception, where rows
  would make a batch depend on their order: a field whose rows hold ``None`` (a null)
  may come as the list of its values, ``None`` included, where ``default_collate`` of
  the rows would fail when the first row is null and pass when a later one is (see
  :mod:`aioload.sources.parquet.arrow_rows`);
- a ``collate_fn`` of the user's gets ``block.rows()``, a plain ``list`` of row dicts, as
  torch's loader would hand it (the batch reader converts, see :func:`as_samples`).

Two ways a block reaches the loader's batch reader: from a map-style dataset's
``__getitems__`` (it may return a block instead of a list), and from an iterable
dataset's batch stream (:data:`BATCH_STREAM`): a dataset that can cut its stream into
whole batches itself defines::

    def batch_stream(self, batch_size: int, drop_last: bool,
                     guard: StreamGuard | None) -> AsyncIterator[RowBlock | Skip marker]

and the loader, batching automatically, reads batches from it (one item, one batch:
``batch_size`` rows, the worker's last one shorter unless ``drop_last``) instead of
collecting ``batch_size`` samples from ``aiter(dataset)``. ``guard`` is the loader's
fault policy, as :mod:`aioload.faults.guard` describes it (None: no policy). The
dataset's ``state_dict`` after a batch then describes exactly the rows not yet delivered.

The loader takes a stream's state after every batch (a checkpoint may be asked between
any two), and most are never asked for. A dataset may define ``state_snapshot()``
(:data:`STATE_SNAPSHOT`): what ``state_dict()`` would return now, as a :class:`LazyState`
that makes the JSON only when a checkpoint asks (:func:`resolve_state`); pickled (a worker's
outcome), it travels as that JSON.

Example::

    class Columns(RowBlock):
        def __init__(self, x, y):
            self.x, self.y = x, y
        def __len__(self):
            return len(self.x)
        def row(self, i):
            return {"x": self.x[i], "y": self.y[i]}
        def collate(self):
            return {"x": self.x.copy(), "y": self.y.copy()}

    default_collate(Columns(np.arange(3), np.zeros(3)))   # {'x': array([0, 1, 2]), ...}
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator, Sequence
from typing import Any, overload

__all__ = [
    "BATCH_STREAM",
    "STATE_SNAPSHOT",
    "LazyState",
    "RowBlock",
    "as_samples",
    "batch_stream_of",
    "resolve_state",
    "rows_for_collate",
    "state_snapshot_of",
]

BATCH_STREAM = "batch_stream"
"""The method an iterable dataset defines to hand the loader whole batches (see above)."""

STATE_SNAPSHOT = "state_snapshot"
"""The method a stream dataset defines to hand the loader its state as a :class:`LazyState`."""


class RowBlock(Sequence[Any], abc.ABC):
    """A batch of rows held by columns (see the module docstring).

    Subclasses define ``__len__``, :meth:`row` and :meth:`collate`.
    """

    @abc.abstractmethod
    def __len__(self) -> int: ...

    @abc.abstractmethod
    def row(self, index: int) -> Any:
        """Row ``index`` (``0 <= index < len(self)``), as a sample."""

    @abc.abstractmethod
    def collate(self) -> Any:
        """The batch ``default_collate(self.rows())`` makes, made from the columns."""

    def rows(self) -> list[Any]:
        """Every row, as a list of samples."""
        return [self.row(i) for i in range(len(self))]

    @overload
    def __getitem__(self, index: int) -> Any: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Any]: ...

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return [self.row(i) for i in range(*index.indices(len(self)))]
        size = len(self)
        position = index + size if index < 0 else index
        if not 0 <= position < size:
            raise IndexError(f"row {index} of a block of {size}")
        return self.row(position)

    def __iter__(self) -> Iterator[Any]:
        for i in range(len(self)):
            yield self.row(i)


def as_samples(samples: Any) -> Any:
    """``samples`` as torch would hand them to a ``collate_fn``: a block becomes its rows."""
    return samples.rows() if isinstance(samples, RowBlock) else samples


def rows_for_collate(collate_fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``collate_fn``, handed a block's rows as a list instead of the block."""

    def collate_rows(samples: Any) -> Any:
        return collate_fn(as_samples(samples))

    return collate_rows


def batch_stream_of(dataset: Any) -> Callable[..., Any] | None:
    """The dataset's batch stream method (:data:`BATCH_STREAM`), or None."""
    method = getattr(dataset, BATCH_STREAM, None)
    return method if callable(method) else None


def state_snapshot_of(dataset: Any) -> Callable[[], Any] | None:
    """The dataset's state snapshot method (:data:`STATE_SNAPSHOT`), or None."""
    method = getattr(dataset, STATE_SNAPSHOT, None)
    return method if callable(method) else None


class LazyState(abc.ABC):
    """A stream's state as of one moment, made into ``state_dict()``'s JSON when asked.

    Whatever it needs is captured when it is made (a copy of what changes after), so that
    :meth:`resolve` later gives what ``state_dict()`` would have given then. Pickled, it
    travels as that JSON (a worker's outcome crosses to the loader so).

    Example::

        class Snapshot(LazyState):
            def __init__(self, position):
                self.position = position           # an int: nothing changes it later
            def resolve(self):
                return {"position": self.position}
    """

    __slots__ = ()

    @abc.abstractmethod
    def resolve(self) -> Any:
        """The state as ``state_dict()`` would have returned it then: a new object each time."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_resolved, (self.resolve(),))


def _resolved(state: Any) -> Any:
    return state


def resolve_state(state: Any) -> Any:
    """``state`` as JSON: a :class:`LazyState` resolved, anything else as it is."""
    return state.resolve() if isinstance(state, LazyState) else state
