"""Old module paths: where each module of aioload's earlier flat layout lives now.

aioload's modules moved into one package per job (``aioload/datasets.py`` became
``aioload/data/datasets.py``, ``aioload/sources/shards.py`` ``aioload/sources/tar/dataset.py``,
...). A pickle names the module of every class and function it holds, so one made before the
move names the old paths. :data:`MOVED` is the table of moves, old path to new; :func:`install`
(called once by ``import aioload``) adds an import finder that makes an old path import its new
module, the very same module object: no copy, no warning, and only the paths in the table.

Ten old modules became packages of the same name (``aioload/samplers.py`` is now the package
``aioload/samplers/``, its code in ``builtin.py``). Such a path is the package now, and the
package gives what the old module defined, on first use, through :func:`old_name` in its
``__getattr__``.

One old module had the name its package gives a function: ``aioload.sources.index_shards``.
Imported through the finder, the module would be bound to that name, in place of the
function; :func:`keep_names`, called by the package, registers such a path beforehand.

A leaf: it imports no other module of aioload (the new modules are imported by name, when
an old path is).

Example::

    >>> import importlib
    >>> MOVED["aioload.datasets"]
    'aioload.data.datasets'
    >>> importlib.import_module("aioload.datasets") is importlib.import_module(
    ...     "aioload.data.datasets"
    ... )
    True
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any

__all__ = ["MOVED", "OldPathFinder", "install", "keep_names", "old_name", "upgrade_objects"]

MOVED: Mapping[str, str] = {
    "aioload.arguments": "aioload.settings.core",
    "aioload.backends.fork_template": "aioload.backends.processes.fork_template",
    "aioload.backends.pickling": "aioload.backends.processes.pickling",
    "aioload.backends.pool": "aioload.backends.processes.pool",
    "aioload.backends.processes": "aioload.backends.processes.backend",
    "aioload.backends.reader": "aioload.read.reader",
    "aioload.backends.setup_parcel": "aioload.backends.processes.setup_parcel",
    "aioload.backends.start_method": "aioload.backends.processes.start_method",
    "aioload.backends.streams": "aioload.read.streams",
    "aioload.backends.worker_process": "aioload.backends.processes.worker",
    "aioload.batch_measure": "aioload.stats.measure",
    "aioload.batch_sampler": "aioload.samplers.batch",
    "aioload.buffers": "aioload.memory.buffers",
    "aioload.checkpoint": "aioload.pipeline.checkpoint",
    "aioload.collate": "aioload.collate.core",
    "aioload.collate_errors": "aioload.collate.errors",
    "aioload.collate_fns": "aioload.collate.fns",
    "aioload.dataset_epochs": "aioload.data.epochs",
    "aioload.dataset_sampler": "aioload.samplers.offered",
    "aioload.datasets": "aioload.data.datasets",
    "aioload.distributed_sampler": "aioload.samplers.distributed",
    "aioload.eager": "aioload.read.eager",
    "aioload.fetch": "aioload.read.fetch",
    "aioload.handoff": "aioload.pipeline.handoff",
    "aioload.iterable_datasets": "aioload.data.iterable",
    "aioload.iteration": "aioload.pipeline.iteration",
    "aioload.main_module": "aioload.backends.processes.main_module",
    "aioload.notebook": "aioload.pipeline.notebook",
    "aioload.outcome": "aioload.read.outcome",
    "aioload.pin_stage": "aioload.pipeline.pin_stage",
    "aioload.pinning": "aioload.memory.pinned",
    "aioload.policy": "aioload.faults.policy",
    "aioload.progressbar": "aioload.stats.progress",
    "aioload.received": "aioload.pipeline.received",
    "aioload.retrier": "aioload.faults.retrier",
    "aioload.row_block": "aioload.data.row_block",
    "aioload.sampler_base": "aioload.samplers.base",
    "aioload.sampler_draws": "aioload.samplers.draws",
    "aioload.sampler_shuffling": "aioload.samplers.shuffling",
    "aioload.sampler_state": "aioload.samplers.state",
    "aioload.samplers": "aioload.samplers.builtin",
    "aioload.scheduler": "aioload.pipeline.scheduler",
    "aioload.shared_list": "aioload.data.shared_list",
    "aioload.source_stats": "aioload.stats.source_counts",
    "aioload.sources.arrow_rows": "aioload.sources.parquet.arrow_rows",
    "aioload.sources.braces": "aioload.sources.stores.braces",
    "aioload.sources.cache": "aioload.sources.cache.local",
    "aioload.sources.cache_folder": "aioload.sources.cache.folder",
    "aioload.sources.credentials": "aioload.sources.stores.credentials",
    "aioload.sources.index_shards": "aioload.sources.tar.index_files",
    "aioload.sources.interleave": "aioload.sources.streams.interleave",
    "aioload.sources.jsonl": "aioload.sources.jsonl.dataset",
    "aioload.sources.jsonl_lines": "aioload.sources.jsonl.lines",
    "aioload.sources.listing_shuffle": "aioload.sources.objects.listing",
    "aioload.sources.objects": "aioload.sources.objects.dataset",
    "aioload.sources.parquet": "aioload.sources.parquet.dataset",
    "aioload.sources.parquet_files": "aioload.sources.parquet.files",
    "aioload.sources.parquet_footer": "aioload.sources.parquet.footer",
    "aioload.sources.parquet_iterable": "aioload.sources.parquet.iterable",
    "aioload.sources.parquet_read": "aioload.sources.parquet.read",
    "aioload.sources.parquet_state": "aioload.sources.parquet.state",
    "aioload.sources.parquet_stream": "aioload.sources.parquet.stream",
    "aioload.sources.rank_split": "aioload.sources.streams.split",
    "aioload.sources.row_group_cache": "aioload.sources.parquet.row_group_cache",
    "aioload.sources.seaweedfs": "aioload.testing.seaweedfs",
    "aioload.sources.segments": "aioload.sources.tar.segments",
    "aioload.sources.server": "aioload.testing.object_server",
    "aioload.sources.shard_faults": "aioload.sources.streams.faults",
    "aioload.sources.shard_index": "aioload.sources.tar.index",
    "aioload.sources.shard_indexes": "aioload.sources.tar.indexes",
    "aioload.sources.shard_reads": "aioload.sources.tar.reads",
    "aioload.sources.shard_state": "aioload.sources.streams.state",
    "aioload.sources.shard_stream": "aioload.sources.streams.tracked",
    "aioload.sources.shards": "aioload.sources.tar.dataset",
    "aioload.sources.store_errors": "aioload.sources.stores.errors",
    "aioload.sources.store_identity": "aioload.sources.stores.identity",
    "aioload.sources.store_reads": "aioload.sources.stores.reads",
    "aioload.sources.stores": "aioload.sources.stores.store",
    "aioload.sources.stream_checks": "aioload.sources.streams.checks",
    "aioload.sources.stream_dataset": "aioload.sources.streams.dataset",
    "aioload.sources.tar": "aioload.sources.tar.reader",
    "aioload.sources.tar_scan": "aioload.sources.tar.scan",
    "aioload.sources.writer": "aioload.sources.tar.writer",
    "aioload.stats": "aioload.stats.recorder",
    "aioload.stream_faults": "aioload.faults.guard",
    "aioload.transport": "aioload.memory.segments",
    "aioload.wire": "aioload.backends.processes.wire",
}
"""Every module of the layout before the package per job, by its old path: its new path."""


class OldPathFinder(importlib.abc.MetaPathFinder):
    """Finds the old module paths of :data:`MOVED`, each as the module it became.

    It sits last on ``sys.meta_path``: a path that exists (a package that took an old
    module's name) is found before it is asked.
    """

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        """The spec of old path ``fullname``: a loader that gives its new module; else None."""
        new = MOVED.get(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Alias(new))


class _Alias(importlib.abc.Loader):
    """Loads an old path as the module it became (imported by its new path first)."""

    def __init__(self, new: str) -> None:
        self._new = new
        self._spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self._new)
        self._spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The module ran already, under its new path. The import machinery has just set its
        # __spec__ to the old path's: give it back its own, which reload() and pickle rely on.
        module.__spec__ = self._spec


_FINDER = OldPathFinder()


def install() -> None:
    """Adds the finder of old paths at the end of ``sys.meta_path`` (once)."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.append(_FINDER)


def keep_names(package: str) -> None:
    """Registers the old paths under ``package`` whose name the package binds to another object.

    The import system binds a module it imports to its name in the parent package: through
    the finder, an old path ``package.name`` would rebind a function ``package.name``. Each
    such path is put in ``sys.modules`` at once (its new module is imported then), where an
    import finds it without binding it. For the end of a package's ``__init__``.

    Example::

        >>> import aioload.sources, sys
        >>> sys.modules["aioload.sources.index_shards"].__name__
        'aioload.sources.tar.index_files'
        >>> callable(aioload.sources.index_shards)
        True
    """
    names = vars(sys.modules[package])
    for old, new in MOVED.items():
        parent, _, child = old.rpartition(".")
        if parent != package or child not in names or isinstance(names[child], ModuleType):
            continue
        if not _is_submodule(package, child):
            sys.modules.setdefault(old, importlib.import_module(new))


def old_name(package: str, name: str) -> Any:
    """Attribute ``name`` of the old module that package ``package`` replaced.

    For the ``__getattr__`` of a package whose path was a module before the move: the
    module's code is now one module of the package (:data:`MOVED`), and what that module
    defined or exported resolves from the package too, imported on first use.

    Raises:
        AttributeError: ``name`` is not one of that module's names.

    Example::

        >>> old_name("aioload.samplers", "RandomSampler").__module__
        'aioload.samplers.builtin'
    """
    # A dunder (__wrapped__, __test__: what inspect and doctest look for) or a submodule not
    # imported yet (`from package import submodule` asks for the attribute first) is not the
    # old module's: it is not worth importing that module, and pyarrow with it, to say no.
    if not name.startswith("__") and not _is_submodule(package, name):
        module = importlib.import_module(MOVED[package])
        value = getattr(module, name, _MISSING)
        exported = name in getattr(module, "__all__", ())
        if value is not _MISSING and (
            exported or getattr(value, "__module__", None) == module.__name__
        ):
            return value
    raise AttributeError(f"module {package!r} has no attribute {name!r}")


def _is_submodule(package: str, name: str) -> bool:
    path = getattr(sys.modules.get(package), "__path__", None)
    if path is None:
        return False
    return importlib.machinery.PathFinder.find_spec(f"{package}.{name}", path) is not None


_MISSING = object()


def upgrade_objects(state: dict[str, Any]) -> dict[str, Any]:
    """The pickled ``__dict__`` of a stream dataset, with its objects as the layout keeps them now.

    Before the layout, ``ShardDataset`` and ``JsonLinesDataset`` held their objects twice:
    ``_locations`` (a store location by store root) and ``_paths`` (each object's root and
    path). They now hold one list ``_objects`` of ``(location, path)`` pairs. A pickle made
    before (a dataset sent to a worker, saved with the model) is given the new attribute on
    load; a state already in the new form is returned as it is.

    Args:
        state: the ``__dict__`` a pickle restores.

    Example::

        >>> upgrade_objects({"_locations": {"s3://b": "store"}, "_paths": [("s3://b", "a.tar")]})
        {'_objects': [('store', 'a.tar')]}
    """
    if "_paths" not in state or "_objects" in state:
        return state
    state = dict(state)
    locations = state.pop("_locations")
    state["_objects"] = [(locations[root], path) for root, path in state.pop("_paths")]
    return state
