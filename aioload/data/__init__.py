"""The datasets torch users know, knowing nothing of loading.

Its one job: the containers a loader reads and their protocols, map-style and iterable,
sync or async.

Modules:

- ``datasets``: ``Dataset``, ``ArrayDataset`` (``TensorDataset``), ``Subset``,
  ``ConcatDataset``, ``StackDataset``, ``random_split``;
- ``iterable``: ``IterableDataset`` and ``ChainDataset``;
- ``row_block``: ``RowBlock``, a batch held by columns that collates itself;
- ``shared_list``: ``SharedList``, a read-only list that workers share;
- ``epochs``: the epochs ``set_epoch`` gave a dataset, for a worker's copy;
- ``protocol``: which protocol a dataset speaks (``DatasetProtocol``, ``inspect_dataset``).

Used by the reader, the backends and the sources (``Dataset``, ``IterableDataset``,
``RowBlock``). The public names are exported by :mod:`aioload`; nothing is re-exported
here.
"""
