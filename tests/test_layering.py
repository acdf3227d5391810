"""The floors of aioload: no module imports a package above its own, nor another's private names.

Every module of ``aioload/`` is read with ``ast`` (nothing is imported): each ``import`` and
``from ... import`` anywhere in it counts, those under ``if TYPE_CHECKING:`` and inside
functions too. The floors are written once, here, as docs/architecture.md draws them:

- a module may import any unit (a package, or a module of the package root) on a floor
  below its own, and anything inside its own unit;
- units on the same floor may import one another, as long as they do not import one
  another in a cycle (``collate`` uses ``data``'s ``RowBlock``: so ``data`` may not use
  ``collate``);
- inside ``sources`` the same rules hold between its parts, with floors of their own;
- a ``_private`` name (or module) is used only inside the package that defines it: its
  directory package, or the module itself for a unit that is one module (``interop``,
  ``sources/mix``).

Every unit listed must exist (but ``settings``, which may not yet) and every module must be
on a floor: a new package or top-level module is placed here first. The checker is shown
to fail on a small tree with an upward import, a cycle and a private name on purpose.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

import aioload

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "aioload"

# Top to bottom. "__init__" is the package's own __init__.py.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("__init__", "loader", "torch", "interop", "__main__", "cli"),  # the face
    ("pipeline",),
    ("backends",),
    ("settings",),
    ("read", "memory"),
    ("sources",),
    ("faults", "collate", "data"),
    ("samplers", "stats"),
    (  # the leaves
        "errors",
        "checks",
        "eventloop",
        "groups",
        "urls",
        "ranks",
        "worker_info",
        "testing",
        "old_paths",
        "version",
    ),
)

# The floors inside a unit, top to bottom, for the units that have them.
SUBFLOORS: Mapping[str, tuple[tuple[str, ...], ...]] = {
    "sources": (
        ("__init__", "mix"),  # the public names; streams of any source mixed
        ("tar", "jsonl", "parquet"),  # the formats
        ("objects", "streams"),  # one object per sample; the engine of the stream formats
        ("cache",),
        ("stores",),
        ("decoders", "decompress", "sizes"),
    ),
}

# Units the floors name before they exist.
NOT_YET: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Place:
    """Where a module stands: its unit, its part inside the unit (if the unit has floors)."""

    unit: str
    part: str | None


@dataclass(frozen=True)
class Module:
    name: str  # dotted: aioload.sources.tar.dataset
    path: Path
    is_package: bool

    @property
    def package(self) -> str:
        """The package whose ``__init__`` (or which) this module is in."""
        return self.name if self.is_package else self.name.rpartition(".")[0]


@dataclass(frozen=True)
class Layers:
    """A package's floors, and the checks of its import graph against them."""

    root: Path  # the folder of the package (aioload/)
    floors: tuple[tuple[str, ...], ...]
    subfloors: Mapping[str, tuple[tuple[str, ...], ...]]
    not_yet: frozenset[str] = frozenset()

    @property
    def package(self) -> str:
        return self.root.name

    def modules(self) -> list[Module]:
        found = []
        for path in sorted(self.root.rglob("*.py")):
            parts = [self.package, *path.relative_to(self.root).with_suffix("").parts]
            is_package = parts[-1] == "__init__"
            if is_package:
                parts.pop()
            found.append(Module(".".join(parts), path, is_package))
        return found

    def exists(self, dotted: str) -> bool:
        """Whether ``dotted`` names a module or package of the tree."""
        relative = Path(*dotted.split(".")[1:]) if "." in dotted else Path()
        folder = self.root / relative
        return (folder / "__init__.py").exists() or folder.with_suffix(".py").exists()

    def place(self, dotted: str) -> Place:
        """The unit (and part, in a unit with floors of its own) of module ``dotted``."""
        parts = dotted.split(".")[1:]
        unit = parts[0] if parts else "__init__"
        if unit not in self.subfloors:
            return Place(unit, None)
        return Place(unit, parts[1] if len(parts) > 1 else "__init__")

    def floor(self, unit: str) -> int:
        for index, floor in enumerate(self.floors):
            if unit in floor:
                return index
        raise KeyError(unit)

    def subfloor(self, unit: str, part: str) -> int:
        for index, floor in enumerate(self.subfloors[unit]):
            if part in floor:
                return index
        raise KeyError(f"{unit}/{part}")

    def owner(self, dotted: str, is_package: bool) -> str:
        """The package a private name of module ``dotted`` belongs to.

        Its directory package; a unit (or part of a unit) that is one module is a package
        of its own.
        """
        parts = dotted.split(".")
        if is_package:
            return dotted
        place = self.place(dotted)
        own = [self.package, place.unit] + ([place.part] if place.part else [])
        if parts == own and place.unit != "__init__" and place.part != "__init__":
            return dotted
        return ".".join(parts[:-1])

    def imports(self, module: Module) -> Iterator[tuple[int, str, str | None]]:
        """(line, module imported, name imported from it or None) for every import."""
        tree = ast.parse(module.path.read_text(), filename=str(module.path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield node.lineno, alias.name, None
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = module.package.split(".")
                    base = base[: len(base) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                for alias in node.names:
                    yield node.lineno, target, alias.name

    def problems(self) -> list[str]:
        """Every breach of the floors, as ``module:line: what``; empty when none."""
        found: list[str] = []
        self._check_the_floors_name_the_tree(found)
        modules = self.modules()
        edges: dict[tuple[str, str], str] = {}  # (from, to) on one floor: first line
        for module in modules:
            here = self.place(module.name)
            for line, target, name in self.imports(module):
                if target != self.package and not target.startswith(self.package + "."):
                    continue
                where = f"{module.path.relative_to(self.root.parent)}:{line}"
                # `from aioload import old_paths` imports the module old_paths
                dotted = target
                if name is not None and self.exists(f"{target}.{name}"):
                    dotted = f"{target}.{name}"
                if not self.exists(dotted):
                    found.append(f"{where}: imports {dotted}, which is no module of the tree")
                    continue
                self._check_private(module, where, dotted, name, found)
                there = self.place(dotted)
                try:
                    self._check_direction(here, there, where, dotted, edges, found)
                except KeyError as unplaced:
                    found.append(f"{where}: {unplaced.args[0]} is on no floor")
        found += self._cycles(edges)
        return list(dict.fromkeys(found))  # a line that imports two names says it once

    def _check_the_floors_name_the_tree(self, found: list[str]) -> None:
        for unit in (unit for floor in self.floors for unit in floor):
            if (
                unit != "__init__"
                and unit not in self.not_yet
                and not self.exists(f"{self.package}.{unit}")
            ):
                found.append(f"the floors name {unit}, which is not in {self.package}/")
        for unit, floors in self.subfloors.items():
            for part in (part for floor in floors for part in floor):
                if part != "__init__" and not self.exists(f"{self.package}.{unit}.{part}"):
                    found.append(f"the floors of {unit} name {part}, which is not in it")
        for module in self.modules():
            place = self.place(module.name)
            try:
                self.floor(place.unit)
                if place.part is not None:
                    self.subfloor(place.unit, place.part)
            except KeyError as unplaced:
                found.append(f"{module.name} is on no floor ({unplaced.args[0]}): place it")

    def _check_private(
        self, module: Module, where: str, dotted: str, name: str | None, found: list[str]
    ) -> None:
        mine = self.owner(module.name, module.is_package)
        parts = dotted.split(".")
        for index, part in enumerate(parts):
            if _private(part):
                owner = ".".join(parts[:index])
                if owner != mine:
                    found.append(f"{where}: imports the private module {dotted} of {owner}")
                return
        if name is not None and _private(name) and dotted.rpartition(".")[2] != name:
            is_package = (
                self.exists(dotted) and (self.root / Path(*parts[1:]) / "__init__.py").exists()
            )
            owner = self.owner(dotted, is_package)
            if owner != mine:
                found.append(f"{where}: imports the private name {name} of {owner}")

    def _check_direction(
        self,
        here: Place,
        there: Place,
        where: str,
        dotted: str,
        edges: dict[tuple[str, str], str],
        found: list[str],
    ) -> None:
        if here.unit != there.unit:
            mine, theirs = self.floor(here.unit), self.floor(there.unit)
            if theirs < mine:
                found.append(
                    f"{where}: imports {dotted}: {there.unit} is on a floor above {here.unit}"
                )
            elif theirs == mine:
                edges.setdefault((here.unit, there.unit), where)
            return
        if here.part is None or there.part is None or here.part == there.part:
            return
        mine, theirs = self.subfloor(here.unit, here.part), self.subfloor(there.unit, there.part)
        if theirs < mine:
            found.append(
                f"{where}: imports {dotted}: {here.unit}/{there.part} is on a floor above "
                f"{here.unit}/{here.part}"
            )
        elif theirs == mine:
            edges.setdefault((f"{here.unit}/{here.part}", f"{there.unit}/{there.part}"), where)

    def _cycles(self, edges: Mapping[tuple[str, str], str]) -> list[str]:
        """Units of one floor that import each other in a cycle (each cycle once)."""
        graph: dict[str, set[str]] = {}
        for start, end in edges:
            graph.setdefault(start, set()).add(end)
        found = []
        for group in _strongly_connected(graph):
            if len(group) > 1:
                lines = sorted(
                    f"{start} -> {end} ({where})"
                    for (start, end), where in edges.items()
                    if start in group and end in group
                )
                found.append(f"units of one floor import each other in a cycle: {lines}")
        return found


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _strongly_connected(graph: Mapping[str, set[str]]) -> list[set[str]]:
    """Tarjan's strongly connected components of ``graph``."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            groups.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


AIOLOAD = Layers(ROOT / PACKAGE, FLOORS, SUBFLOORS, NOT_YET)


def test_no_module_imports_above_its_floor_or_another_packages_private_names() -> None:
    problems = AIOLOAD.problems()
    assert not problems, "\n".join(["the floors of aioload are broken:", *problems])


def test_the_architecture_page_draws_the_same_floors() -> None:
    # docs/architecture.md has the table of floors: a row per floor, numbered from 1 (the
    # face), naming its units in backquotes (`read/`, `errors.py`); the parts of a unit with
    # floors are rows numbered after it (6.1, 6.2 ... for sources).
    page = (ROOT / "docs" / "architecture.md").read_text()
    rows = dict(re.findall(r"^\| ([\d.]+) \| ([^|]+) \|", page, flags=re.MULTILINE))
    expected = {str(number): floor for number, floor in enumerate(FLOORS, 1)}
    for unit, floors in SUBFLOORS.items():
        number = next(n for n, floor in expected.items() if unit in floor and "." not in n)
        expected |= {f"{number}.{sub}": floor for sub, floor in enumerate(floors, 1)}
    assert sorted(rows) == sorted(expected)
    for number, floor in expected.items():
        named = {_unit(token) for token in re.findall(r"`([^`]+)`", rows[number])}
        assert named == set(floor), (number, rows[number])
    assert "tests/test_layering.py" in page


def _unit(token: str) -> str:
    """``aioload/__init__.py`` → ``__init__``, ``read/`` → ``read``, ``sources/mix.py``: ``mix``."""
    name = token.removeprefix("aioload/").removesuffix("/").removesuffix(".py")
    return name.rpartition("/")[2]


def test_every_package_names_its_modules_in_its_docstring() -> None:
    # Each package says what it offers in its __init__.py: its modules, at least by name.
    # (The root's docstring is the user's introduction; `aioload/__init__.py` is exempt.)
    missing = []
    for module in AIOLOAD.modules():
        if not module.is_package or module.name == PACKAGE:
            continue
        folder = module.path.parent
        doc = ast.get_docstring(ast.parse(module.path.read_text())) or ""
        for child in sorted(folder.iterdir()):
            name = child.stem if child.suffix == ".py" else child.name
            is_module = child.suffix == ".py" or (child / "__init__.py").exists()
            if is_module and name != "__init__" and f"``{name}``" not in doc:
                missing.append(f"{module.name}: ``{name}``")
    assert not missing, missing


# -- the checker itself, on a small tree written for it --------------------------------


def _tree(root: Path, files: Mapping[str, str]) -> Path:
    package = root / "pkg"
    for name, text in files.items():
        path = package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return package


_FAKE_FLOORS = (("__init__", "face"), ("middle",), ("low", "side"), ("leaf",))
_FAKE_SUB = {"middle": (("__init__", "top"), ("base",))}

_GOOD = {
    "__init__.py": "from pkg.face import run\n",
    "face.py": "from pkg.middle.top import Top\nfrom pkg import leaf\nrun = leaf\n",
    "middle/__init__.py": "",
    "middle/top.py": "from pkg.middle.base import Base\nfrom pkg.low import thing\n",
    "middle/base.py": "from pkg.leaf import value as Base\n",
    "low/__init__.py": "from pkg.low.inner import thing\n",
    "low/inner.py": "from pkg.side import other as thing\n",
    "side.py": "from pkg.leaf import value as other\n",
    "leaf.py": "value = 1\n_hidden = 2\n",
}


def _problems(tmp_path: Path, changes: Mapping[str, str]) -> list[str]:
    package = _tree(tmp_path, {**_GOOD, **changes})
    return Layers(package, _FAKE_FLOORS, _FAKE_SUB).problems()


def test_the_checker_passes_a_tree_that_keeps_its_floors(tmp_path: Path) -> None:
    assert _problems(tmp_path, {}) == []


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        pytest.param(
            {"leaf.py": "value = 1\n\ndef late():\n    from pkg.middle.top import Top\n"},
            "pkg/leaf.py:4: imports pkg.middle.top: middle is on a floor above leaf",
            id="an upward import inside a function",
        ),
        pytest.param(
            {
                "low/inner.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                "    from pkg import face\n"
            },
            "pkg/low/inner.py:3: imports pkg.face: face is on a floor above low",
            id="an upward import for type checking only",
        ),
        pytest.param(
            {"middle/base.py": "from .top import Top\n"},
            "pkg/middle/base.py:1: imports pkg.middle.top: middle/top is on a floor above "
            "middle/base",
            id="a relative import up inside a unit with floors",
        ),
        pytest.param(
            {"middle/top.py": "from pkg.leaf import _hidden\n"},
            "pkg/middle/top.py:1: imports the private name _hidden of pkg.leaf",
            id="a private name of another package",
        ),
        pytest.param(
            {"side.py": "import pkg.low.inner\n"},
            "units of one floor import each other in a cycle",
            id="a cycle on one floor",
        ),
        pytest.param(
            {"extra.py": "x = 1\n"},
            "pkg.extra is on no floor (extra): place it",
            id="a module on no floor",
        ),
    ],
)
def test_the_checker_fails_a_tree_that_breaks_them(
    tmp_path: Path, changes: Mapping[str, str], expected: str
) -> None:
    problems = _problems(tmp_path, changes)
    assert any(problem.startswith(expected) for problem in problems), problems


def test_the_checker_allows_private_names_at_home(tmp_path: Path) -> None:
    changes = {
        "low/inner.py": "from pkg.side import other as thing\nfrom pkg.low.deep import _own\n",
        "low/deep.py": "_own = 2\n",
        "face.py": "from pkg.middle.top import Top\nfrom pkg.middle import top as _top\n",
    }
    assert _problems(tmp_path, changes) == []


def _names(floors: Sequence[Sequence[str]]) -> list[str]:
    return [unit for floor in floors for unit in floor]


def test_each_unit_is_on_one_floor() -> None:
    units = _names(FLOORS)
    assert len(units) == len(set(units))
    for floors in SUBFLOORS.values():
        parts = _names(floors)
        assert len(parts) == len(set(parts))


def test_modules_stay_small_and_folders_few() -> None:
    # The layout's measures: no module over 600 lines, loader.py within 450, and no folder of
    # more than a dozen modules (aioload/ itself holds the face and the leaves).
    package = Path(aioload.__file__).parent
    sizes = {
        str(path.relative_to(package)): len(path.read_text().splitlines())
        for path in package.rglob("*.py")
    }
    assert {name: n for name, n in sizes.items() if n > 600} == {}
    assert sizes["loader.py"] <= 450
    folders = Counter(str(Path(name).parent) for name in sizes if not name.endswith("__init__.py"))
    assert {folder: n for folder, n in folders.items() if n > 13} == {}
