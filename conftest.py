"""What every test of the suite shares: the skips CI allows, and the doctests of aioload/.

The README's test command runs aioload/'s docstring examples with the tests (pyproject.toml:
``testpaths``, ``--doctest-modules``). Each is a doctest, run in a copy of its module's
namespace. An optional dependency (``pip install 'aioload-data[...]'``) may be missing, as
torch is on Python 3.12 and 3.13 in CI; then

- an example that imports it (``>>> import torch``) skips, saying what it needs;
- a module that imports it at import time skips as a whole, saying so, where a plain
  ``--doctest-modules`` would fail the collection. Any other import error still fails.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import sys
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

# The skips CI allows: torch is absent on Python 3.12 and 3.13 (its tests importorskip it, and
# the doctests and docs blocks that need it skip naming it so), a doctest whose every example
# is marked +SKIP, a docs block marked not to run (tests/test_docs_blocks.py: the page gives
# the reason), one that needs a CUDA device (CI has none) and, off Python 3.11, the examples
# of the integrations extra (below). With AIOLOAD_STRICT_SKIPS=1 (set
# by .ci/run) any other skip fails the run: it is a test CI should have run (a dependency
# missing from the `test` extra, a limit of the machine too low), not one to lose quietly.
ALLOWED_SKIPS: tuple[str, ...] = (
    "No module named 'torch'",
    "all tests skipped by +SKIP option",
    "not run: ",
    "there is no CUDA device",
)

# CI installs the `integrations` extra (Lightning, Accelerate, JAX) on Python 3.11 only, where
# torch is: tests/test_integrations.py skips with this reason elsewhere, and only elsewhere is
# the skip allowed. On 3.11 a missing package of the extra fails the run like any other skip.
INTEGRATIONS_ON_311_ONLY = "the integrations extra is installed on Python 3.11 only"
if sys.version_info[:2] != (3, 11):
    ALLOWED_SKIPS += (INTEGRATIONS_ON_311_ONLY,)


def _fail_a_disallowed_skip(report: pytest.CollectReport | pytest.TestReport) -> None:
    if not report.skipped or hasattr(report, "wasxfail"):
        return
    if os.environ.get("AIOLOAD_STRICT_SKIPS") != "1":
        return
    longrepr: Any = report.longrepr
    reason = str(longrepr[2] if isinstance(longrepr, tuple) else longrepr)
    if any(allowed in reason for allowed in ALLOWED_SKIPS):
        return
    report.outcome = "failed"
    report.longrepr = (
        f"{reason}\nAIOLOAD_STRICT_SKIPS=1: this test may not skip (allowed: "
        f"{', '.join(ALLOWED_SKIPS)}; see conftest.py)"
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    _fail_a_disallowed_skip(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Any:
    report = yield  # a module that skips itself (pytest.importorskip at its top)
    _fail_a_disallowed_skip(report)
    return report


ROOT = Path(__file__).resolve().parent
PACKAGE = ROOT / "aioload"

# The import names of the optional dependencies (pyproject.toml's extras).
OPTIONAL = frozenset(
    {"aiohttp", "dask", "distributed", "obstore", "PIL", "pyarrow", "torch", "tqdm", "zstandard"}
)


def _missing(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is None
    except (ImportError, ValueError):
        return True


def _imported(source: str) -> set[str]:
    """The top-level packages the import statements of ``source`` name."""
    try:
        tree = ast.parse(source)
    except SyntaxError:  # doctest reports it when the example runs
        return set()
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.partition(".")[0])
    return names


def _missing_extra(error: BaseException | None) -> str | None:
    """The optional dependency whose absence ``error`` reports (or is caused by), if any."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, ModuleNotFoundError):
            package = (error.name or "").partition(".")[0]
            if package in OPTIONAL:
                return package
        error = error.__cause__ or error.__context__
    return None


class MissingExtra(pytest.File):
    """A module of aioload/ whose import needs a missing optional dependency: it skips."""

    reason = ""

    def collect(self) -> list[pytest.Item]:
        pytest.skip(self.reason)


@pytest.hookimpl(wrapper=True)
def pytest_collect_file(
    file_path: Path, parent: pytest.Collector
) -> Generator[None, list[pytest.Collector], list[pytest.Collector]]:
    collectors = yield
    if file_path.suffix != ".py" or not file_path.is_relative_to(PACKAGE):
        return collectors
    doctests = [c for c in collectors if type(c).__name__ == "DoctestModule"]
    if not doctests:
        return collectors
    parts = file_path.relative_to(ROOT).with_suffix("").parts
    module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    try:
        importlib.import_module(module)
    except ImportError as error:
        package = _missing_extra(error)
        if package is None:
            raise
        skipped = MissingExtra.from_parent(parent, path=file_path)
        skipped.reason = f"{module} needs {package} (No module named {package!r})"
        return [c for c in collectors if c not in doctests] + [skipped]
    return collectors


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        test = getattr(item, "dtest", None)  # a DoctestItem's doctest.DocTest
        if test is None:
            continue
        needed = set().union(*(_imported(example.source) for example in test.examples))
        missing = sorted(name for name in needed & OPTIONAL if _missing(name))
        if missing:
            names = ", ".join(f"No module named {name!r}" for name in missing)
            reason = f"the example needs {' and '.join(missing)} ({names})"
            item.add_marker(pytest.mark.skip(reason=reason))
