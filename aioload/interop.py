"""Torch interop: torch tensors from aioload's numpy batches, without a copy.

aioload never depends on torch; these functions import it when called.

- :func:`to_torch` turns the numpy arrays of a batch into tensors with
  ``torch.from_numpy``: the tensor shares the array's memory, nothing is
  copied. It recurses through dicts, lists, tuples and namedtuples like
  :func:`~aioload.default_collate`'s structure, and leaves strings, Python
  scalars and arrays torch cannot hold (strings, objects) alone.
- :func:`torch_collate` is :func:`~aioload.default_collate` followed by
  :func:`to_torch`: pass it as ``collate_fn`` and the loader yields tensors,
  as torch's ``DataLoader`` would. With ``pin_memory=True`` the pin thread
  then pins those tensors with ``tensor.pin_memory()`` when an accelerator is
  present (without one they are left as they are, as torch does).

:mod:`aioload.torch` is the switch built on them: its ``DataLoader`` has
:func:`torch_collate` (or :func:`torch_convert`) as its default ``collate_fn``.

With worker processes a ``collate_fn`` runs inside each worker, so
:func:`torch_collate` there imports torch in every worker; it collates into the
shared memory the batch travels in, and the tensors cross as numpy views of
it (see :mod:`aioload.memory.segments`), so they arrive as views of shared memory,
not pickled copies. Keeping the default ``collate_fn`` and converting in the
consumer (``to_torch(batch)``) costs the same and keeps torch out of the workers.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from aioload.collate.core import default_collate, default_convert, rebuild_mapping, rebuild_sequence

__all__ = ["import_torch", "to_torch", "torch_collate", "torch_convert"]

# dtype kinds torch has no tensor for: strings, bytes, objects, void, datetimes.
_NOT_NUMERIC = frozenset("USOVMm")

ReadOnly = Literal["copy", "share"]


def import_torch() -> Any:
    """The ``torch`` module, imported; without torch, an ``ImportError`` saying what to install.

    Example::

        torch = import_torch()
    """
    try:
        import torch
    except ImportError as error:
        raise ImportError(
            "aioload.interop needs torch, which is not installed: "
            "pip install torch (any build: the CPU one is enough)"
        ) from error
    return torch


def _tensor(torch: Any, array: np.ndarray[Any, Any], readonly: ReadOnly) -> Any:
    if not array.flags.writeable:
        if readonly == "copy":
            return torch.from_numpy(np.array(array, order="C"))
        # The caller promised not to write: share, without torch's warning
        # that writing through the tensor would be undefined behaviour.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*not writable.*")
            return _shared(torch, array)
    return _shared(torch, array)


def _shared(torch: Any, array: np.ndarray[Any, Any]) -> Any:
    try:
        return torch.from_numpy(array)
    except (ValueError, TypeError):
        # Negative strides or a foreign byte order: torch cannot view these,
        # so they are copied once into a native, contiguous array.
        native = array.dtype.newbyteorder("=")
        return torch.from_numpy(np.ascontiguousarray(array, dtype=native))


def _convert(torch: Any, data: Any, readonly: ReadOnly) -> Any:
    if isinstance(data, np.ndarray):
        if type(data) is not np.ndarray and not isinstance(data, np.memmap):
            return data  # masked arrays, matrices: more than their data
        if data.dtype.kind in _NOT_NUMERIC:
            return data
        return _tensor(torch, data, readonly)
    if isinstance(data, np.generic):
        if data.dtype.kind in _NOT_NUMERIC:
            return data
        return torch.from_numpy(np.asarray(data))  # a 0-d tensor, as torch collates scalars
    if isinstance(data, str | bytes | bytearray | memoryview):
        return data
    if isinstance(data, Mapping):
        return rebuild_mapping(
            data, {key: _convert(torch, value, readonly) for key, value in data.items()}
        )
    if isinstance(data, tuple) and hasattr(data, "_fields"):  # namedtuple
        return type(data)(*(_convert(torch, item, readonly) for item in data))
    if isinstance(data, Sequence):
        rebuilt = rebuild_sequence(data, [_convert(torch, item, readonly) for item in data])
        if isinstance(data, tuple) and not isinstance(rebuilt, tuple):
            return tuple(rebuilt)
        return rebuilt
    return data


def to_torch(batch: Any, *, readonly: ReadOnly = "copy") -> Any:
    """Returns ``batch`` with its numpy arrays turned into torch tensors, sharing memory.

    Each array becomes ``torch.from_numpy(array)``: the tensor is a view of
    the array's memory (writes through one show in the other), whatever its
    size, and keeps the array alive. numpy scalars become 0-d tensors. Dicts
    (and other mappings), namedtuples, tuples and lists are rebuilt with
    their type, recursively; strings, bytes, Python numbers, arrays of strings
    or objects, and anything else are returned unchanged. An array torch
    cannot view (negative strides, a non-native byte order) is copied once.

    Args:
        batch: a batch, e.g. what :func:`~aioload.default_collate` returns.
        readonly: what to do with a read-only array (say, a view of
            ``bytes`` or of a read-only memory map), which a tensor cannot
            protect: ``"copy"`` (the default) gives the tensor a writable
            copy; ``"share"`` shares the memory anyway, and the tensor must
            then never be written to (torch calls that undefined behaviour).

    Raises:
        ImportError: torch is not installed.

    Example::

        >>> import numpy as np
        >>> import torch
        >>> from aioload import default_collate
        >>> batch = default_collate([{"x": np.ones(3), "y": 1}] * 2)
        >>> tensors = to_torch(batch)
        >>> tensors["x"].shape, tensors["y"]
        (torch.Size([2, 3]), tensor([1, 1]))
        >>> tensors["x"].data_ptr() == batch["x"].ctypes.data   # no copy
        True
    """
    if readonly not in ("copy", "share"):
        raise ValueError(f"readonly should be 'copy' or 'share'; got {readonly!r}")
    return _convert(import_torch(), batch, readonly)


def torch_collate(batch: Sequence[Any]) -> Any:
    """:func:`~aioload.default_collate`, then :func:`to_torch`: batches of torch tensors.

    Use it as a loader's ``collate_fn`` to get what torch's ``DataLoader``
    yields. With ``pin_memory=True`` the tensors are pinned in the pin thread
    (``tensor.pin_memory()``) when an accelerator is present. With worker
    processes the tensors travel through shared memory (see the module docstring).

    Example::

        >>> import numpy as np
        >>> import torch
        >>> from aioload import ArrayDataset, DataLoader
        >>> dataset = ArrayDataset(np.ones((8, 3), np.float32), np.arange(8))
        >>> loader = DataLoader(dataset, batch_size=4, collate_fn=torch_collate)
        >>> for x, y in loader:   # torch tensors
        ...     pass   # with pin_memory=True and a GPU: x.to("cuda", non_blocking=True)
        >>> x.shape, y
        (torch.Size([4, 3]), tensor([4, 5, 6, 7]))
    """
    return to_torch(default_collate(batch))


def torch_convert(sample: Any) -> Any:
    """:func:`~aioload.default_convert`, then :func:`to_torch`: for ``batch_size=None``.

    Example::

        >>> import numpy as np
        >>> import torch
        >>> from aioload import ArrayDataset, DataLoader
        >>> dataset = ArrayDataset(np.ones((8, 3), np.float32), np.arange(8))
        >>> loader = DataLoader(dataset, batch_size=None, collate_fn=torch_convert)
        >>> [(x.shape, y) for x, y in loader][-1]
        (torch.Size([3]), tensor(7))
    """
    return to_torch(default_convert(sample))
