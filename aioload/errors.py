"""Every public exception of aioload, in one place.

The errors of a failing *read* keep the dataset's own exception type (an
``OSError`` stays an ``OSError``) with notes naming the batch, its keys and the
worker; the classes here are for what only aioload can tell: a stalled
iteration, a dead worker, an error that could not be rebuilt, a read past its
time, an epoch past its skip budget, a batch that does not collate, and the
sources' malformed shards, indexes, states and fields.

Each is also exported where its users look for it: the loader's by :mod:`aioload`,
the sources' (``TarFormatError``, ``ParquetFormatError``, ``ShardIndexError``,
``ShardStateError``, ``DecodeError``) by :mod:`aioload.sources`, ``CollateTypeError`` by
:mod:`aioload.collate`. A skip record or a worker's error report names each by this
module (``aioload.errors.DecodeError``). A leaf: it imports nothing of aioload.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = [
    "CollateTypeError",
    "DatasetKindError",
    "DecodeError",
    "ItemTimeoutError",
    "LoaderTimeoutError",
    "ParquetFormatError",
    "ShardIndexError",
    "ShardStateError",
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


class CollateTypeError(TypeError, RuntimeError):
    """An entry of a batch whose type cannot be collated with the field's other entries.

    For example ``None`` among arrays. The message names the type, the entry (the sample's
    index in the batch) and the field (its path in the sample, e.g. ``['image']``). It is a
    ``TypeError``, as torch raises for a tensor followed by ``None``, and a ``RuntimeError``,
    as torch raises for a numpy array or an int followed by ``None``: either ``except`` that
    works with torch catches it.

    Example::

        >>> import numpy as np
        >>> from aioload import default_collate
        >>> try:
        ...     default_collate([{"image": np.zeros(3)}, {"image": None}])
        ... except RuntimeError as error:  # or TypeError
        ...     print(str(error).split("; ")[1])
        found <class 'NoneType'> in field ['image'] at entry 1
    """


class ShardIndexError(ValueError):
    """A shard index is malformed, of another version, or does not match its shard.

    Its message names the index (or the shard) and what is wrong (raised by
    :mod:`aioload.sources`, which re-exports it).
    """


class ShardStateError(ValueError):
    """A shard stream state is malformed, of another version, or of another dataset.

    Raised by the stream datasets of :mod:`aioload.sources` (which re-exports it) before
    anything is read from the state.
    """


class DecodeError(ValueError):
    """A field of a sample could not be decoded.

    Attributes:
        key: the sample's key (``__key__``), or the object's key.
        field: the field (``"jpg"``, ``"seg.png"``) or the object's file name.
        url: the shard (or object) the sample came from, password hidden.

    The original error is the ``__cause__`` (raised by :mod:`aioload.sources`, which
    re-exports it).

    Example::

        >>> error = DecodeError("bad jpg", key="000017", field="jpg")
        >>> (error.key, error.field, isinstance(error, ValueError))
        ('000017', 'jpg', True)
    """

    def __init__(
        self,
        message: str,
        *,
        key: str | None = None,
        field: str | None = None,
        url: str | None = None,
    ) -> None:
        super().__init__(message)
        self.key = key
        self.field = field
        self.url = url

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword-only attributes: the default reduce would call __init__(message) only; the
        # state carries the notes (where it was raised) across a worker's pickle too.
        return (_rebuild_decode_error, (str(self), self.key, self.field, self.url), self.__dict__)


def _rebuild_decode_error(
    message: str, key: str | None, field: str | None, url: str | None
) -> DecodeError:
    return DecodeError(message, key=key, field=field, url=url)
