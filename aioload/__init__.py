"""aioload: an asyncio-native streaming data loader with torch.utils.data semantics over numpy.

Example::

    from aioload import ArrayDataset, DataLoader

    loader = DataLoader(ArrayDataset(images, labels), batch_size=64, shuffle=True)
    for x, y in loader:            # a classic training script
        ...
    async for x, y in loader:      # inside an asyncio service
        ...

``aioload.__version__`` is the installed version (``aioload --version`` prints it too).
"""

from aioload.collate.core import collate, default_collate, default_collate_fn_map, default_convert
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
from aioload.data.protocol import DatasetProtocol, inspect_dataset
from aioload.data.row_block import RowBlock
from aioload.data.shared_list import SharedList
from aioload.errors import (
    DatasetKindError,
    ItemTimeoutError,
    LoaderTimeoutError,
    TooManySkippedError,
    WorkerCrashedError,
    WorkerError,
)
from aioload.faults.guard import StreamGuard
from aioload.faults.policy import FaultPolicy, RetryPolicy, SkippedItem
from aioload.loader import DEFAULT_CONCURRENCY, DEFAULT_MAX_WORKER_RESTARTS, DataLoader
from aioload.old_paths import install as _install_old_paths
from aioload.ranks import rank_and_world_size, split_by_rank_and_worker
from aioload.samplers.builtin import (
    BatchSampler,
    DistributedSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
    is_async_sampler,
)
from aioload.stats.progress import progress
from aioload.stats.recorder import IterationStats, LoaderStats
from aioload.version import __version__ as __version__  # the installed version
from aioload.worker_info import WorkerInfo, get_worker_info

__all__ = [
    "DEFAULT_CONCURRENCY",
    "DEFAULT_MAX_WORKER_RESTARTS",
    "ArrayDataset",
    "BatchSampler",
    "ChainDataset",
    "ConcatDataset",
    "DataLoader",
    "Dataset",
    "DatasetKindError",
    "DatasetProtocol",
    "DistributedSampler",
    "FaultPolicy",
    "ItemTimeoutError",
    "IterableDataset",
    "IterationStats",
    "LoaderStats",
    "LoaderTimeoutError",
    "RandomSampler",
    "RetryPolicy",
    "RowBlock",
    "Sampler",
    "SequentialSampler",
    "SharedList",
    "SkippedItem",
    "StackDataset",
    "StreamGuard",
    "Subset",
    "SubsetRandomSampler",
    "TensorDataset",
    "TooManySkippedError",
    "WeightedRandomSampler",
    "WorkerCrashedError",
    "WorkerError",
    "WorkerInfo",
    "collate",
    "default_collate",
    "default_collate_fn_map",
    "default_convert",
    "get_worker_info",
    "inspect_dataset",
    "is_async_sampler",
    "progress",
    "random_split",
    "rank_and_world_size",
    "split_by_rank_and_worker",
]

# Pickles made before the modules moved into a package per job name the old module paths
# (aioload.datasets, aioload.sources.shards, ...): those paths import the new modules.
_install_old_paths()


def __dir__() -> list[str]:
    # The public namespace: what __all__ exports and the module's dunder names, not the
    # submodules the imports above bind as attributes (wire, handoff, eager, ...); those stay
    # importable as aioload.<name> but are not advertised to dir(), help() or tab completion.
    return sorted({*__all__, *(name for name in globals() if name.startswith("__"))})
