"""Every public exception of aioload, in one place (re-exported by :mod:`aioload`).

The errors of a failing *read* keep the dataset's own exception type (an
``OSError`` stays an ``OSError``) with notes naming the batch, its keys and the
worker; the classes here are for what only the loader can tell: a stalled
iteration, a dead worker, an error that could not be rebuilt, a read past its
time, an epoch past its skip budget.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = [
    "DatasetKindError",
    "ItemTimeoutError",
    "LoaderTimeoutError",
    "ParquetFormatError",
    "TarFormatError",
    "TooManySkippedError",
    "WorkerCrashedError",
    "WorkerError",
]


class LoaderTimeoutError(TimeoutError, RuntimeError):
    """The next batch did not arrive within the loader's ``timeout``.

    Its message starts as torch's, ``DataLoader timed out after {timeout} seconds``, and goes
    on with the batch and keys it waited for. It is a ``TimeoutError`` and, as torch raises a
    ``RuntimeError`` there, a ``RuntimeError`` too: ``except RuntimeError`` written for torch
    catches it.

    Example::

        >>> issubclass(LoaderTimeoutError, RuntimeError)
        True
    """


class DatasetKindError(TypeError, AssertionError):
    """A dataset of the wrong kind for where it was given.

    An iterable dataset in a ``ConcatDataset`` (which indexes its members), or a map-style one
    in a ``ChainDataset`` (which iterates them). A ``TypeError``, and, as torch checks these
    with ``assert``, an ``AssertionError``: either ``except`` works.

    Example::

        >>> issubclass(DatasetKindError, AssertionError)
        True
    """


class ItemTimeoutError(TimeoutError):
    """One attempt at reading an item took longer than the loader's ``item_timeout``."""


class TooManySkippedError(RuntimeError):
    """An epoch skipped more items than ``max_skipped`` allows; the epoch ends with it.

    Attributes:
        skipped: every item the epoch skipped, in the order they were recorded
            (the last one crossed the limit), each a :class:`~aioload.SkippedItem`.
        limit: the most skips the epoch allowed.
    """

    def __init__(self, message: str, *, skipped: Sequence[Any], limit: int) -> None:
        super().__init__(message)
        self.skipped = tuple(skipped)
        self.limit = limit

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword-only arguments: the default reduce would call __init__(message) only.
        return _rebuild_too_many, (str(self), self.skipped, self.limit)


def _rebuild_too_many(message: str, skipped: tuple[Any, ...], limit: int) -> Any:
    return TooManySkippedError(message, skipped=skipped, limit=limit)


class TarFormatError(ValueError):
    """A shard is not a well-formed tar archive (or ends in the middle of a member).

    Its message names the shard and the byte offset of the header at fault
    (raised by :mod:`aioload.sources`, which re-exports it).
    """


class ParquetFormatError(ValueError):
    """A Parquet file is truncated, is not Parquet, or its footer does not describe it.

    Raised by :mod:`aioload.sources`, which re-exports it; defined here, without pyarrow,
    so that ``except ParquetFormatError`` works wherever aioload is installed.
    """


class WorkerCrashedError(RuntimeError):
    """A worker process died and could not be (or may not be) replaced.

    Attributes:
        worker_id: the worker's number.
        pid: its process id.
        exitcode: its exit code; negative: ``-signal`` (torch's convention).
        keys: the keys of the batches it held (None for "the next batch" of an
            iterable dataset).
    """

    def __init__(
        self,
        message: str,
        *,
        worker_id: int,
        pid: int | None,
        exitcode: int | None,
        keys: list[Any],
    ) -> None:
        super().__init__(message)
        self.worker_id = worker_id
        self.pid = pid
        self.exitcode = exitcode
        self.keys = keys


class WorkerError(RuntimeError):
    """An exception raised in a worker that could not be rebuilt in the loader.

    Its message names the original type; the worker's traceback is in a note.
    """
