"""The data-flow picture of docs/architecture.md is what its script draws from its table."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "docs" / "img" / "dataflow.py"
PICTURE = ROOT / "docs" / "img" / "dataflow.svg"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dataflow", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


def test_the_committed_picture_is_what_the_script_draws() -> None:
    drawn = _script().render()
    assert PICTURE.read_text() == drawn, "run: python docs/img/dataflow.py"


def test_the_picture_is_svg_with_every_stage_and_arrow() -> None:
    script = _script()
    root = ElementTree.fromstring(PICTURE.read_text())
    svg = "{http://www.w3.org/2000/svg}"
    assert root.tag == f"{svg}svg"
    texts = [element.text for element in root.iter(f"{svg}text")]
    for stage in script.STAGES.values():
        assert stage.title in texts and stage.where in texts
    arrows = list(root.iter(f"{svg}line"))
    assert len(arrows) == len(script.FLOW) - 1 + len(script.ALSO)
    assert "img/dataflow.svg" in (ROOT / "docs" / "architecture.md").read_text()


def test_every_place_the_picture_names_is_in_the_tree() -> None:
    for stage in _script().STAGES.values():
        for where in stage.where.split():
            assert (ROOT / "aioload" / where).exists(), where


@pytest.mark.timeout(60)
def test_the_script_writes_the_picture(tmp_path: Path) -> None:
    copy = tmp_path / "dataflow.py"
    copy.write_text(SCRIPT.read_text())
    subprocess.run([sys.executable, str(copy)], check=True, timeout=60, capture_output=True)
    assert (tmp_path / "dataflow.svg").read_text() == PICTURE.read_text()
