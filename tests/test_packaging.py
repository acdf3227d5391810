"""What a user of the installed package sees: its namespace, its install hints, its extras."""

from __future__ import annotations

import email
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_dir_shows_the_public_names_only() -> None:
    import aioload.backends.processes.wire  # a submodule stays importable

    names = dir(aioload)
    assert aioload.backends.processes.wire.__name__ == "aioload.backends.processes.wire"
    assert {name for name in names if not name.startswith("__")} == set(aioload.__all__)
    for internal in ("wire", "handoff", "eager", "loader", "transport", "iteration"):
        assert internal not in names
    assert {"__name__", "__doc__", "__all__"} <= set(names)
    assert names == sorted(names)


def _hint(module: str, code: str) -> str:
    """What ``code`` prints when ``module`` cannot be imported (a fresh process)."""
    prelude = f"import sys; sys.modules[{module!r}] = None\n"
    result = subprocess.run(
        [sys.executable, "-c", prelude + code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=True,
    )
    return result.stdout.strip()


@pytest.mark.timeout(60)
def test_the_progress_bar_without_tqdm_names_one_install_command() -> None:
    code = (
        "import aioload\n"
        "try:\n"
        "    aioload.progress(aioload.DataLoader([1, 2, 3]))\n"
        "except ImportError as error:\n"
        "    print(error)\n"
    )
    message = _hint("tqdm", code)
    assert message.count("pip install") == 1, message
    assert message.endswith("pip install 'aioload-data[progress]'")


@pytest.mark.timeout(60)
def test_interop_without_torch_names_one_install_command() -> None:
    code = (
        "import numpy as np\n"
        "from aioload.interop import to_torch\n"
        "try:\n"
        "    to_torch(np.zeros(2))\n"
        "except ImportError as error:\n"
        "    print(error)\n"
    )
    message = _hint("torch", code)
    assert message.count("pip install") == 1, message
    assert "pip install torch" in message


def test_the_extras_name_the_distribution_and_leave_torch_out() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    name = project["name"]
    assert name == "aioload-data"  # "aioload" on the package index is another project
    extras = project["optional-dependencies"]
    for extra, requirements in extras.items():
        for requirement in requirements:
            own = re.match(r"([A-Za-z0-9_.-]+)\[", requirement)
            if own and own.group(1).startswith("aioload"):
                assert own.group(1) == name, (extra, requirement)

    def expanded(extra: str) -> set[str]:
        found = set()
        for requirement in extras[extra]:
            own = re.match(rf"{re.escape(name)}\[([^\]]+)\]", requirement)
            if own:
                for inner in own.group(1).split(","):
                    found |= expanded(inner.strip())
            else:
                found.add(re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].lower())
        return found

    # torch, only where it is asked for: pip would pick its CUDA build on Linux
    for extra in ("test", "demo", "bench", "docs"):
        assert "torch" not in expanded(extra), extra
    assert expanded("torch") == {"torch"}


@pytest.mark.timeout(60)
def test_sources_star_import_without_pyarrow_fails_only_where_pyarrow_is_used() -> None:
    # The demo's install (s3, progress) has no pyarrow: every name still imports, and the
    # Parquet ones say which extra they need when used; ParquetFormatError is a real class.
    code = (
        "from aioload.sources import *\n"
        "import aioload.sources as sources\n"
        "assert all(name in globals() for name in sources.__all__)\n"
        "assert issubclass(ParquetFormatError, ValueError)\n"
        "assert not isinstance(object(), ParquetDataset)\n"
        "for name, use in [\n"
        "    ('ParquetDataset', lambda: ParquetDataset('file:///t.parquet')),\n"
        "    ('IterableParquetDataset', lambda: IterableParquetDataset('file:///t.parquet')),\n"
        "    ('ArrowRows', lambda: ArrowRows(None)),\n"
        "    ('a subclass of ArrowRows', lambda: type('Mine', (ArrowRows,), {})),\n"
        "]:\n"
        "    try:\n"
        "        use()\n"
        "    except ImportError as error:\n"
        "        print(error)\n"
        "    else:\n"
        "        print(name, 'worked without pyarrow')\n"
        "print(len(JsonLinesDataset.__mro__) > 1, MixDataset.__name__)\n"
    )
    lines = _hint("pyarrow", code).splitlines()
    assert lines[:3] == [
        f"aioload.sources.{name} needs pyarrow: pip install 'aioload-data[parquet]'"
        for name in ("ParquetDataset", "IterableParquetDataset", "ArrowRows")
    ]
    assert (
        lines[3] == "aioload.sources.ArrowRows needs pyarrow: pip install 'aioload-data[parquet]'"
    )
    assert lines[4:] == ["True MixDataset"]


# A qualified name in the docs (`aioload.sources.ShardIndexError`, `::: aioload.X`), or a bare
# one (`ShardStateError`) of an error that is not a built-in; the bare ones must be importable
# from where users import aioload's names.
_QUALIFIED_ERROR = re.compile(r"\b(aioload(?:\.\w+)*)\.(\w+Error)\b")
_BARE_ERROR = re.compile(r"(?<![\w.])([A-Z]\w*Error)\b")
_PUBLIC = ("aioload", "aioload.sources")
_OTHER_LIBRARIES = {"PicklingError": "pickle", "UnidentifiedImageError": "PIL"}


def _doc_pages() -> list[Path]:
    return sorted((ROOT / "docs").rglob("*.md"))


def test_every_error_the_docs_name_is_importable_where_they_say() -> None:
    import builtins
    import importlib

    qualified: set[tuple[str, str]] = set()
    bare: set[str] = set()
    for page in _doc_pages():
        text = page.read_text()
        qualified |= set(_QUALIFIED_ERROR.findall(text))
        bare |= set(_BARE_ERROR.findall(text))
    assert ("aioload.sources", "ParquetFormatError") in qualified and "ShardStateError" in bare
    missing = []
    for module, name in sorted(qualified):
        if not isinstance(getattr(importlib.import_module(module), name, None), type):
            missing.append(f"{module}.{name}")
    for name in sorted(bare):
        if hasattr(builtins, name):
            continue
        homes = [_OTHER_LIBRARIES[name]] if name in _OTHER_LIBRARIES else _PUBLIC
        found = [getattr(importlib.import_module(home), name, None) for home in homes]
        if not any(isinstance(error, type) and issubclass(error, Exception) for error in found):
            missing.append(f"{name} (from {' or '.join(homes)})")
    assert not missing, f"the docs name errors that do not import: {missing}"


def _built_metadata(tmp_path: Path) -> Path:
    """The ``.dist-info`` folder a wheel built from this checkout would hold (no wheel made).

    The build backend (setuptools, which the ``test`` extra installs) runs in a child
    process in the project's root, as ``pip wheel`` would run it; nothing is downloaded.
    """
    code = (
        "import sys\n"
        "from setuptools import build_meta\n"
        "print(build_meta.prepare_metadata_for_build_wheel(sys.argv[1]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return tmp_path / done.stdout.strip().splitlines()[-1]


@pytest.mark.timeout(120)
def test_the_version_is_one_string_everywhere(tmp_path: Path) -> None:
    import importlib.metadata

    import aioload

    version = aioload.__version__
    assert re.fullmatch(r"\d+\.\d+\.\d+(\w+\d*)?", version), version
    # the installed distribution (an editable install: rebuilt by `pip install -e .`)
    assert importlib.metadata.version("aioload-data") == version
    # what a wheel built from this checkout says
    built = _built_metadata(tmp_path)
    assert email.message_from_string((built / "METADATA").read_text())["Version"] == version
    # what the command line says
    done = subprocess.run(
        [sys.executable, "-m", "aioload", "--version"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"aioload {version}"


@pytest.mark.timeout(120)
def test_the_licence_is_apache_2_and_ships_with_the_wheel(tmp_path: Path) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    built = _built_metadata(tmp_path)
    metadata = email.message_from_string((built / "METADATA").read_text())
    assert metadata["License-Expression"] == "Apache-2.0"
    assert metadata.get_all("License-File") == ["LICENSE"]
    assert (built / "licenses" / "LICENSE").read_text() == text
    urls = dict(url.split(", ", 1) for url in metadata.get_all("Project-URL") or [])
    assert set(urls) == {"Homepage", "Documentation", "Changelog", "Issues"}


def test_the_changelog_keeps_an_unreleased_section() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    assert "keepachangelog.com" in text  # the form it follows
    headings = re.findall(r"^## \[([^\]]+)\]", text, flags=re.MULTILINE)
    assert headings and headings[0] == "Unreleased", headings
    sections = re.findall(r"^### (\w+)", text, flags=re.MULTILINE)
    kinds = {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}
    assert sections and set(sections) <= kinds, sections


def test_the_s3_extra_holds_no_test_only_dependency() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    names = [re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].lower() for r in extras["s3"]]
    assert names == ["obstore"]
    # obstore before 1.0: bounded below its next minor version (see the comment in pyproject)
    (obstore,) = extras["s3"]
    assert re.search(r"<0\.\d+", obstore), obstore
    assert any(r.startswith("aiohttp") for r in extras["test"])
    assert any(r.startswith("aiohttp") for r in extras["demo"])


@pytest.mark.timeout(60)
def test_the_test_servers_are_in_aioload_testing_and_cost_no_optional_import() -> None:
    # aioload.testing gives both servers; importing it, or aioload, imports no optional
    # dependency (aiohttp runs in the server's own process); aioload.sources gives the
    # same classes, on first use.
    code = (
        "import sys\n"
        "import aioload\n"
        "from aioload.testing import ObjectServer, SeaweedFS\n"
        "heavy = ('torch', 'pyarrow', 'obstore', 'aiohttp', 'tqdm', 'aioload.sources')\n"
        "print(sorted({m for m in sys.modules if m.split('.')[0] in heavy or m in heavy}))\n"
        "import aioload.sources as sources\n"
        "print(sources.ObjectServer is ObjectServer, sources.SeaweedFS is SeaweedFS)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=True,
    )
    assert result.stdout.split("\n")[:2] == ["[]", "True True"], result.stdout
