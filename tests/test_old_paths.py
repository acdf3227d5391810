"""Pickles made before the modules moved into a package per job still load, and behave.

``tests/data/public_pickles_before_layout.pkl`` holds, by name, pickles of public objects
made with the flat layout: they name ``aioload.datasets``, ``aioload.samplers`` (then a
module), ``aioload.sources.shards``, ``aioload.source_stats``, ``aioload.sources.stores``...
"""

from __future__ import annotations

import importlib
import pickle
import pickletools
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

import aioload
from aioload.old_paths import MOVED

ROOT = Path(__file__).resolve().parent.parent
PICKLES = ROOT / "tests" / "data" / "public_pickles_before_layout.pkl"


def _old_pickles() -> dict[str, bytes]:
    with PICKLES.open("rb") as file:
        found: dict[str, bytes] = pickle.load(file)
    return found


def _modules_named(blob: bytes) -> set[str]:
    """The modules whose names a pickle's globals use."""
    names: set[str] = set()
    strings: list[str] = []
    for opcode, argument, _ in pickletools.genops(blob):
        if isinstance(argument, str):
            strings.append(argument)
        if opcode.name == "STACK_GLOBAL":
            names.add(strings[-2])
        elif opcode.name == "GLOBAL":
            names.add(str(argument).split(" ")[0])
    return {name for name in names if name.startswith("aioload")}


def _items(dataset: Any) -> list[Any]:
    return [dataset[i] for i in range(len(dataset))]


def _same_items(old: Any, fresh: Any) -> None:
    assert type(old) is type(fresh)
    old_items, fresh_items = _items(old), _items(fresh)
    assert len(old_items) == len(fresh_items) > 0
    for a, b in zip(old_items, fresh_items, strict=True):
        assert repr(a) == repr(b)


def _random_sampler(old: Any) -> None:
    # The same keys as a fresh sampler given a generator in the same state.
    generator = np.random.Generator(np.random.PCG64())
    generator.bit_generator.state = old.generator.bit_generator.state
    fresh = aioload.RandomSampler(range(5), generator=generator)
    assert list(old) == list(fresh)
    assert sorted(fresh) == [0, 1, 2, 3, 4]


def _stream(old: Any, fresh: Any) -> None:
    # Everything equal but the store locations (objects without a value repr): those are of
    # the same kind, for the same paths, and the old pickle's reads use them.
    assert type(old) is type(fresh)
    own = {"_objects", "_reads"}
    plain = {name: value for name, value in vars(fresh).items() if name not in own}
    assert {name: repr(vars(old)[name]) for name in plain} == {
        name: repr(value) for name, value in plain.items()
    }
    assert [(type(where), path) for where, path in old._objects] == [
        (type(where), path) for where, path in fresh._objects
    ]
    if hasattr(fresh, "_reads"):
        assert old._reads.objects is old._objects


def _sources() -> Any:
    return pytest.importorskip("aioload.sources")


def _shards(old: Any) -> None:
    urls = ["file:///nowhere/train-000.tar", "file:///nowhere/train-001.tar"]
    _stream(old, _sources().ShardDataset(urls))


def _json_lines(old: Any) -> None:
    _stream(old, _sources().JsonLinesDataset(["file:///nowhere/a.jsonl"]))


def _error(kind: str) -> Callable[[Any], None]:
    def check(old: Any) -> None:
        assert type(old) is getattr(_sources(), kind) and isinstance(old, ValueError)
        assert type(old).__module__ == "aioload.errors"
        assert str(old) in {"bad index", "bad state"}

    return check


def _policies(old: Any) -> None:
    if isinstance(old, aioload.RetryPolicy):
        assert old == aioload.RetryPolicy()
    else:
        retry = aioload.RetryPolicy(attempts=2)
        assert old == aioload.FaultPolicy(retry=retry, on_error="skip", max_skipped=3)


def _shared_list(old: Any) -> None:
    assert isinstance(old, aioload.SharedList) and list(old) == ["a", "bc"]
    assert list(aioload.SharedList(list(old))) == list(old)


def _same_keys(fresh: Any) -> Callable[[Any], None]:
    def check(old: Any) -> None:
        assert type(old) is type(fresh)
        assert list(old) == list(fresh)

    return check


def _drawn_from(kind: type, keys: set[int], length: int) -> Callable[[Any], None]:
    def check(old: Any) -> None:
        assert type(old) is kind
        drawn = list(old)
        assert len(drawn) == len(old) == length and set(drawn) <= keys

    return check


def _default_collate(old: Any) -> None:
    assert old is aioload.default_collate


def _arrays(*lengths: int) -> list[Any]:
    return [aioload.ArrayDataset(np.arange(n)) for n in lengths]


CHECKS: dict[str, Callable[[Any], None]] = {
    "TensorDataset": lambda old: _same_items(old, aioload.TensorDataset(np.arange(6))),
    "ArrayDataset": lambda old: _same_items(
        old, aioload.ArrayDataset(np.arange(4), np.arange(4) * 2)
    ),
    "Subset": lambda old: _same_items(
        old, aioload.Subset(aioload.ArrayDataset(np.arange(6)), [1, 3])
    ),
    "ConcatDataset": lambda old: _same_items(old, aioload.ConcatDataset(_arrays(3, 2))),
    "StackDataset": lambda old: _same_items(old, aioload.StackDataset(a=_arrays(3)[0])),
    "SharedList": _shared_list,
    "SequentialSampler": _same_keys(aioload.SequentialSampler(range(5))),
    "RandomSampler": _random_sampler,
    "SubsetRandomSampler": _drawn_from(aioload.SubsetRandomSampler, {0, 2, 4}, 3),
    "WeightedRandomSampler": _drawn_from(aioload.WeightedRandomSampler, {0, 1}, 4),
    "BatchSampler": _same_keys(aioload.BatchSampler(aioload.SequentialSampler(range(5)), 2, False)),
    "DistributedSampler": _same_keys(
        aioload.DistributedSampler(range(8), num_replicas=2, rank=1, shuffle=False)
    ),
    "RetryPolicy": _policies,
    "FaultPolicy": _policies,
    "ShardIndexError": _error("ShardIndexError"),
    "ShardStateError": _error("ShardStateError"),
    "default_collate": _default_collate,
    "ShardDataset": _shards,
    "JsonLinesDataset": _json_lines,
}


def test_the_file_holds_the_pickles_this_test_checks_and_they_name_old_paths() -> None:
    pickles = _old_pickles()
    assert set(pickles) == set(CHECKS)
    named = set().union(*(_modules_named(blob) for blob in pickles.values()))
    assert {"aioload.datasets", "aioload.sources.shards", "aioload.source_stats"} <= named
    assert named <= set(MOVED), named - set(MOVED)


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_a_pickle_made_before_the_move_loads_and_behaves(name: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning per old path
        old = pickle.loads(_old_pickles()[name])
    CHECKS[name](old)
    # Pickled again, it names the new modules only.
    again = pickle.dumps(old)
    assert not _modules_named(again) & set(MOVED).difference(MOVED.values())
    CHECKS[name](pickle.loads(again))


@pytest.mark.timeout(60)
def test_old_pickles_load_in_a_fresh_interpreter_that_never_imported_aioload() -> None:
    code = (
        "import pickle, sys\n"
        f"with open({str(PICKLES)!r}, 'rb') as file:\n"
        "    pickles = pickle.load(file)\n"
        "assert 'aioload' not in sys.modules\n"
        "print(type(pickle.loads(pickles['RandomSampler'])).__module__)\n"
        "print(sorted(pickle.loads(pickles['SubsetRandomSampler'])))\n"
    )
    result = subprocess.run(
        [sys.executable, "-W", "error", "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert result.stdout.split("\n")[:2] == ["aioload.samplers.builtin", "[0, 2, 4]"]
    assert result.stderr == ""


@pytest.mark.parametrize("old", sorted(MOVED))
def test_each_old_path_imports_its_new_module(old: str) -> None:
    new = MOVED[old]
    if new.startswith("aioload.sources.parquet"):
        pytest.importorskip("pyarrow")
    if new.startswith("aioload.sources"):
        pytest.importorskip("obstore")
    module = importlib.import_module(new)
    assert (ROOT / Path(*new.split("."))).with_suffix(".py").exists(), new
    if (ROOT / Path(*old.split(".")) / "__init__.py").exists():
        # The old module's path is a package now: the package gives its names.
        package = importlib.import_module(old)
        assert package is not module
        for name in module.__all__:
            assert getattr(package, name) is getattr(module, name), name
        with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
            package.no_such_name  # noqa: B018
    else:
        assert not (ROOT / Path(*old.split("."))).with_suffix(".py").exists()
        parent, _, child = old.rpartition(".")
        before = vars(importlib.import_module(parent)).get(child)
        assert importlib.import_module(old) is module
        assert module.__spec__ is not None and module.__spec__.name == new
        if before is not None and not isinstance(before, ModuleType):
            # aioload.sources.index_shards, the function, stays the function.
            assert vars(sys.modules[parent])[child] is before


def test_only_the_old_paths_of_the_table_are_found() -> None:
    for missing in ("aioload.no_such_module", "aioload.sources.no_such_module"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(missing)
    assert "aioload.no_such_module" not in MOVED


@pytest.mark.timeout(60)
def test_a_package_that_was_a_module_answers_for_a_submodule_without_importing_it() -> None:
    # `from package import submodule` asks the package for the name first: the package of
    # Parquet, once a module needing pyarrow, must not import that module to say no.
    pytest.importorskip("obstore")
    code = (
        "import sys\n"
        "sys.modules['pyarrow'] = None\n"
        "import aioload.sources.parquet as parquet\n"
        "assert not hasattr(parquet, '__wrapped__')\n"
        "from aioload.sources.parquet import state\n"
        "print(state.__name__, 'aioload.sources.parquet.dataset' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "aioload.sources.parquet.state False"
