"""A loader's settings: one frozen object, every argument a field of it, passed whole.

``DataLoader(...)`` makes one :class:`~aioload.settings.LoaderSettings`; the epoch, the
backend factory and the backends it builds receive that very object, not copies of its
fields, and the loader's attributes are its fields.
"""

from __future__ import annotations

import ast
import concurrent.futures
import dataclasses
import inspect
from pathlib import Path
from typing import Any

import pytest

import aioload.backends.factory as factory
import aioload.pipeline.assembly as assembly
from aioload import DataLoader
from aioload.settings import LIVE_SETTINGS, LOADER_ARGUMENTS, LOADER_ATTRIBUTES, LoaderSettings

PACKAGE = Path(__file__).resolve().parents[1] / "aioload"


class Items:
    def __init__(self, n: int) -> None:
        self.n = n

    def __getitem__(self, i: int) -> int:
        return i

    def __len__(self) -> int:
        return self.n


def test_the_settings_are_frozen_and_slotted() -> None:
    settings = LoaderSettings(dataset=Items(4), batch_size=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.batch_size = 3  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.in_order = False  # type: ignore[misc]
    assert not hasattr(settings, "__dict__")  # slotted: no attribute can be added either
    assert settings.batch_size == 2


def test_every_dataloader_argument_is_a_settings_field_with_the_same_default() -> None:
    parameters = list(inspect.signature(DataLoader).parameters.values())
    arguments = [field for field in dataclasses.fields(LoaderSettings) if field.init]
    assert [p.name for p in parameters] == [f.name for f in arguments] == list(LOADER_ARGUMENTS)
    for parameter, field in zip(parameters, arguments, strict=True):
        default = inspect.Parameter.empty if field.default is dataclasses.MISSING else field.default
        assert parameter.default == default, parameter.name


def test_the_loaders_attributes_are_its_settings() -> None:
    loader = DataLoader(Items(10), batch_size=4, shuffle=True, generator=0)
    settings = loader._settings
    for name in LOADER_ATTRIBUTES:
        assert getattr(loader, name) is getattr(settings, name), name
    assert loader.window == settings.window
    assert loader.sampler is settings.index_sampler.sampler  # the one sampler made


def test_the_attributes_frozen_after_init_are_the_settings_that_are_not_live() -> None:
    loader = DataLoader(Items(4))
    frozen = [name for name in LOADER_ATTRIBUTES if name not in LIVE_SETTINGS]
    # torch's own, and what sized the window and chose the backend
    assert {"batch_size", "batch_sampler", "sampler", "drop_last", "dataset"} <= set(frozen)
    assert {"persistent_workers", "num_workers", "prefetch_factor", "in_order"} <= set(frozen)
    for name in frozen:
        with pytest.raises(ValueError, match=f"{name} attribute should not be set after"):
            setattr(loader, name, getattr(loader, name))
    for name in LIVE_SETTINGS:  # as torch: they may change, and the next epoch takes them
        setattr(loader, name, getattr(loader, name))


def _record(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[Any]:
    """Records the settings each ``module.name(...)`` call receives (first positional or 2nd)."""
    seen: list[Any] = []
    real = getattr(module, name)

    def recording(*args: Any, **kwargs: Any) -> Any:
        seen.append(next(arg for arg in args if isinstance(arg, LoaderSettings)))
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, recording)
    return seen


@pytest.mark.timeout(60)
def test_the_epoch_and_the_backend_factory_receive_the_loaders_settings_object(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    epochs = _record(monkeypatch, assembly, "Epoch")
    factories: list[Any] = []
    real_for_epoch = factory.Backends.for_epoch

    def for_epoch(self: Any, settings: LoaderSettings, *args: Any, **kwargs: Any) -> Any:
        factories.append(settings)
        return real_for_epoch(self, settings, *args, **kwargs)

    monkeypatch.setattr(factory.Backends, "for_epoch", for_epoch)
    loader = DataLoader(Items(6), batch_size=2, in_order=False)
    assert sorted(x for batch in loader for x in batch.tolist()) == list(range(6))
    assert factories == epochs == [loader._settings]
    assert factories[0] is loader._settings and epochs[0] is loader._settings
    assert epochs[0].in_order is False and epochs[0].batch_size == 2


@pytest.mark.timeout(60)
def test_the_worker_and_executor_backends_receive_the_loaders_settings_object(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    processes = _record(monkeypatch, factory, "ProcessBackend")
    executors = _record(monkeypatch, factory, "ExecutorBackend")
    with DataLoader(Items(4), batch_size=2, num_workers=1) as loader:
        assert [batch.tolist() for batch in loader] == [[0, 1], [2, 3]]
    assert processes == [loader._settings] and processes[0] is loader._settings
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        loader = DataLoader(Items(4), batch_size=2, executor=pool)
        assert [batch.tolist() for batch in loader] == [[0, 1], [2, 3]]
    assert executors == [loader._settings] and executors[0] is loader._settings


@pytest.mark.timeout(60)
def test_a_live_setting_changed_after_init_reaches_the_next_epochs_backends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    epochs = _record(monkeypatch, assembly, "Epoch")
    loader = DataLoader(Items(4), batch_size=2)
    built = loader._settings
    loader.max_worker_restarts = 7
    loader.timeout = 5
    list(loader)
    (settings,) = epochs
    assert settings is loader._settings and settings is not built
    assert (settings.max_worker_restarts, settings.timeout) == (7, 5)
    assert (built.max_worker_restarts, built.timeout) == (3, 0)  # the first is left as it was
    assert settings.index_sampler is built.index_sampler  # what was settled is not made again


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


@pytest.mark.parametrize(
    ("package", "above"),
    [
        ("settings", ("aioload.backends", "aioload.pipeline", "aioload.loader")),
        ("backends", ("aioload.pipeline", "aioload.loader")),
    ],
)
def test_the_settings_sit_below_the_backends_which_sit_below_the_pipeline(
    package: str, above: tuple[str, ...]
) -> None:
    files = sorted((PACKAGE / package).rglob("*.py"))
    assert files
    upward = {
        f"{path.relative_to(PACKAGE)}: {name}"
        for path in files
        for name in _imports(path)
        if name.startswith(above)
    }
    assert not upward


def test_the_loader_types_every_setting_it_shows_as_an_attribute() -> None:
    # Type checkers see the attributes of the loader (read at run time through __getattr__)
    # only in the TYPE_CHECKING block of the class: it must name every one of them.
    import ast
    import inspect

    import aioload.loader
    from aioload.settings import LOADER_ATTRIBUTES

    tree = ast.parse(inspect.getsource(aioload.loader))
    loader = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "DataLoader")
    typed = [
        node.target.id
        for block in loader.body
        if isinstance(block, ast.If) and ast.unparse(block.test) == "TYPE_CHECKING"
        for node in block.body
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
    ]
    assert typed == list(LOADER_ATTRIBUTES)
