"""What a user of the installed package sees: its namespace, its install hints, its extras."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_dir_shows_the_public_names_only() -> None:
    import aioload.wire  # a submodule stays importable

    names = dir(aioload)
    assert aioload.wire.__name__ == "aioload.wire"
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
