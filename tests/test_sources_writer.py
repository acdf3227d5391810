"""ShardWriter refuses keys and fields that would make a member name unsafe to extract."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

import pytest

from aioload.sources import ShardWriter


@pytest.mark.parametrize(
    ("key", "problem"),
    [
        ("../../x", "has a path component '..'"),
        ("a/../../b", "has a path component '..'"),
        ("..", "has a path component '..'"),
        ("/abs/x", "is an absolute path"),
        ("//host/x", "is an absolute path"),
        ("a//b", "has an empty path component"),
        ("a/", "has an empty path component"),
        ("./a", "has a path component '.'"),
        ("a/./b", "has a path component '.'"),
        ("a\x00b", "holds a NUL byte"),
        ("..\\..\\x", "holds a backslash"),
        ("a\\b", "holds a backslash"),
        ("C:/x", "starts with a drive letter"),
        ("c:x", "starts with a drive letter"),
    ],
)
def test_unsafe_keys_are_refused(tmp_path: Path, key: str, problem: str) -> None:
    writer = ShardWriter(str(tmp_path / "out" / "s-%d.tar"))
    with pytest.raises(ValueError, match="relative path of '/'-separated names") as caught:
        writer.write({"__key__": key, "cls": 1})
    assert problem in str(caught.value)
    assert repr(key) in str(caught.value)
    writer.close()
    assert not (tmp_path / "out").exists()  # refused before the first shard was opened


@pytest.mark.parametrize("field", ["../../../x", "x/y", "a\\b", "", "a\x00"])
def test_unsafe_field_names_are_refused(tmp_path: Path, field: str) -> None:
    with (
        ShardWriter(str(tmp_path / "s-%d.tar")) as writer,
        pytest.raises(ValueError, match="is not a member extension"),
    ):
        writer.write({"__key__": "0001", "cls": 1, field: b"x"})
    assert writer.shards == []  # refused before anything of the sample was written


def test_a_field_name_must_be_a_str(tmp_path: Path) -> None:
    with (
        ShardWriter(str(tmp_path / "s-%d.tar")) as writer,
        pytest.raises(TypeError, match="field name should be a str"),
    ):
        writer.write({"__key__": "0001", 3: b"x"})  # type: ignore[dict-item]


def test_a_shard_extracts_inside_its_folder_without_a_filter(tmp_path: Path) -> None:
    keys = ["0001", "train/0002", "a/b/c/0003", "..x/0004", "x../0005", "ok:1/0006"]
    with ShardWriter(str(tmp_path / "s-%d.tar")) as writer:
        for key in keys[:3]:
            writer.write({"__key__": key, "cls": 1})
        for key in ("../escaped", "/tmp/escaped", "a/../../escaped"):
            with pytest.raises(ValueError, match="relative path"):
                writer.write({"__key__": key, "cls": 1})
        for key in keys[3:]:
            writer.write({"__key__": key, "cls": 1})
    target = tmp_path / "extracted"
    # No filter: what tarfile did before Python 3.14 (and all it could before 3.11.4).
    unfiltered = {"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}
    with tarfile.open(writer.shards[0]) as archive:
        assert archive.getnames() == [f"{key}.cls" for key in keys]
        archive.extractall(target, **unfiltered)  # type: ignore[arg-type]
    written = sorted(
        os.path.relpath(os.path.join(folder, name), tmp_path)
        for folder, _, names in os.walk(tmp_path)
        for name in names
    )
    extracted = [os.path.join("extracted", f"{k}.cls") for k in keys]
    assert written == sorted(["s-0.tar", "s-0.tar.idx.json", *extracted])  # and its index
