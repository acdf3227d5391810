"""aioload: an asyncio-native streaming data loader with torch.utils.data semantics over numpy.

Example::

    from aioload import ArrayDataset, DataLoader

    loader = DataLoader(ArrayDataset(images, labels), batch_size=64, shuffle=True)
    for x, y in loader:            # a classic training script
        ...
    async for x, y in loader:      # inside an asyncio service
        ...
"""

from aioload.collate import collate, default_collate, default_collate_fn_map, default_convert
from aioload.datasets import (
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
from aioload.fetch import DatasetProtocol, inspect_dataset
from aioload.loader import DEFAULT_CONCURRENCY, DataLoader
from aioload.samplers import (
    BatchSampler,
    DistributedSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
    is_async_sampler,
)
from aioload.scheduler import LoaderTimeoutError

__all__ = [
    "DEFAULT_CONCURRENCY",
    "ArrayDataset",
    "BatchSampler",
    "ChainDataset",
    "ConcatDataset",
    "DataLoader",
    "Dataset",
    "DatasetProtocol",
    "DistributedSampler",
    "IterableDataset",
    "LoaderTimeoutError",
    "RandomSampler",
    "Sampler",
    "SequentialSampler",
    "StackDataset",
    "Subset",
    "SubsetRandomSampler",
    "TensorDataset",
    "WeightedRandomSampler",
    "collate",
    "default_collate",
    "default_collate_fn_map",
    "default_convert",
    "inspect_dataset",
    "is_async_sampler",
    "random_split",
]
