"""``from aioload.torch import DataLoader``: the same loader, yielding torch tensors.

The one switch a torch script needs. :class:`DataLoader` here is
:class:`aioload.DataLoader` whose default ``collate_fn`` is
:func:`~aioload.interop.torch_collate` (:func:`~aioload.interop.torch_convert`
without automatic batching): every numeric leaf of a batch is a
``torch.Tensor``, as under ``torch.utils.data.DataLoader`` — numpy arrays and
numbers become tensors (``int`` -> ``int64``, ``float`` -> ``float64``,
arrays keep their dtype, through ``torch.from_numpy``: no copy), tensors in
the samples are stacked, strings stay lists. With worker processes the
tensors cross through the same shared memory as numpy arrays: the consumer's
tensors are views of it, nothing is pickled or copied on the way.

A ``collate_fn`` of your own is used as it is (as torch does). The module
also offers the rest of the vocabulary, so a script changes its import line
only::

    # from torch.utils.data import DataLoader, Dataset, random_split
    from aioload.torch import DataLoader, Dataset, random_split

:func:`default_collate` and :func:`default_convert` here are the tensor ones
(torch's names, torch's results). Importing this module imports torch.
"""

from __future__ import annotations

from typing import TypeVar

from aioload.data.datasets import (
    ArrayDataset,
    ChainDataset,
    ConcatDataset,
    Dataset,
    IterableDataset,
    StackDataset,
    Subset,
    TensorDataset,
    random_split,
)
from aioload.interop import import_torch, to_torch, torch_collate, torch_convert
from aioload.loader import DataLoader as _NumpyDataLoader
from aioload.samplers.builtin import (
    BatchSampler,
    DistributedSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)
from aioload.worker_info import get_worker_info

__all__ = [
    "ArrayDataset",
    "BatchSampler",
    "ChainDataset",
    "ConcatDataset",
    "DataLoader",
    "Dataset",
    "DistributedSampler",
    "IterableDataset",
    "RandomSampler",
    "Sampler",
    "SequentialSampler",
    "StackDataset",
    "Subset",
    "SubsetRandomSampler",
    "TensorDataset",
    "WeightedRandomSampler",
    "default_collate",
    "default_convert",
    "get_worker_info",
    "random_split",
    "to_torch",
]

import_torch()  # imports torch: a missing torch fails here, saying what to install

T_co = TypeVar("T_co", covariant=True)

default_collate = torch_collate
default_convert = torch_convert


class DataLoader(_NumpyDataLoader[T_co]):
    """:class:`aioload.DataLoader` yielding torch tensors (see :mod:`aioload.torch`).

    The arguments are :class:`aioload.DataLoader`'s (torch's, and aioload's
    own); only ``collate_fn=None`` differs: it means
    :func:`~aioload.interop.torch_collate` (or
    :func:`~aioload.interop.torch_convert` with ``batch_size=None``).

    Example::

        >>> import numpy as np
        >>> import torch
        >>> from aioload.torch import DataLoader
        >>> loader = DataLoader([(np.zeros(2, np.float32), 1)] * 4, batch_size=2)
        >>> x, y = next(iter(loader))
        >>> isinstance(x, torch.Tensor), y
        (True, tensor([1, 1]))
    """

    _default_collate_fn = staticmethod(torch_collate)
    _default_convert_fn = staticmethod(torch_convert)
