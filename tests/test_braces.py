"""Brace patterns: bash's expansion (lists, ranges with steps and padding, nesting), checked
against bash's own answers and the braceexpand package; an unmatched brace is an error."""

from __future__ import annotations

import re
from pathlib import Path

import braceexpand
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aioload.sources import JsonLinesDataset, ShardDataset, expand_urls
from aioload.sources.stores.braces import expand_braces

# What bash 5 answers (echo PATTERN), empty words kept.
BASH = {
    "{0..10}": [str(n) for n in range(11)],
    "{00..3}": ["00", "01", "02", "03"],
    "{1..010}": [f"{n:03d}" for n in range(1, 11)],
    "{-01..3}": ["-01", "000", "001", "002", "003"],
    "{-1..01}": ["-1", "00", "01"],
    "{1..10..0}": [str(n) for n in range(1, 11)],
    "{0..10..5}": ["0", "5", "10"],
    "{5..1..2}": ["5", "3", "1"],
    "{1..5..-2}": ["1", "3", "5"],
    "{3..1}": ["3", "2", "1"],
    "{a..e..2}": ["a", "c", "e"],
    "{e..a}": ["e", "d", "c", "b", "a"],
    "{Z..a}": ["Z", "[", "\\", "]", "^", "_", "`", "a"],
    "{a}": ["{a}"],
    "{}": ["{}"],
    "{1..a}": ["{1..a}"],
    "x{a,b{1,2}}y": ["xay", "xb1y", "xb2y"],
    "{a{b,c}}": ["{ab}", "{ac}"],
    "{,a}": ["", "a"],
    "{a,}": ["a", ""],
    "{a..c}{1,2}": ["a1", "a2", "b1", "b2", "c1", "c2"],
    "a\\{b,c\\}": ["a{b,c}"],
    "{a\\,b,c}": ["a,b", "c"],
    "{\\\\}": ["{\\}"],  # braceexpand answers "{}" for these two
    "{\\\\},": ["{\\},"],
    "s3://b/{train,val}/{0..2}.tar": [
        f"s3://b/{part}/{n}.tar" for part in ("train", "val") for n in range(3)
    ],
    "no braces": ["no braces"],
}


@pytest.mark.parametrize("pattern", list(BASH))
def test_patterns_expand_as_bash_expands_them(pattern: str) -> None:
    assert expand_braces(pattern) == BASH[pattern]


@pytest.mark.parametrize(
    ("pattern", "where"),
    [
        ("a-{0..3.tar", "unmatched '{' at character 3"),
        ("a-0..3}.tar", "unmatched '}' at character 7"),
        ("{a,b}c}", "unmatched '}' at character 7"),
        ("{1{2,3}", "unmatched '{' at character 1"),
        ("}{", "unmatched '}' at character 1"),
    ],
)
def test_an_unmatched_brace_is_an_error_naming_the_pattern(pattern: str, where: str) -> None:
    with pytest.raises(ValueError, match=re.escape(repr(pattern)) + ".*" + re.escape(where)):
        expand_braces(pattern)


def test_the_datasets_expand_every_kind_of_pattern(tmp_path: Path) -> None:
    for name in ("train-0.jsonl", "train-5.jsonl", "val-0.jsonl", "val-5.jsonl"):
        (tmp_path / name).write_bytes(b"{}\n")
    root = tmp_path.as_uri()
    dataset = JsonLinesDataset(f"{root}/{{train,val}}-{{0..9..5}}.jsonl")
    assert [url.rpartition("/")[2] for url in dataset.urls] == [
        "train-0.jsonl",
        "train-5.jsonl",
        "val-0.jsonl",
        "val-5.jsonl",
    ]
    shards = ShardDataset(f"{root}/{{a,b{{1..2}}}}.tar")
    assert [url.rpartition("/")[2] for url in shards.urls] == ["a.tar", "b1.tar", "b2.tar"]
    for make in (ShardDataset, JsonLinesDataset):
        with pytest.raises(ValueError, match=r"unmatched '\{'"):
            make(f"{root}/{{train,val-{{0..9}}.jsonl")
    # A password in the URL stays hidden in the message.
    with pytest.raises(ValueError, match=r"u:\*\*\*@") as info:
        expand_urls("http://u:hunter2@127.0.0.1:9/a-{5..1.tar")
    assert "hunter2" not in str(info.value)


PIECES = ["{", "}", ",", "..", "0", "1", "2", "05", "-", "a", "c", "x", "\\", "..2"]


def _balanced(pattern: str) -> bool:
    depth, at = 0, 0
    while at < len(pattern):
        if pattern[at] == "\\":
            at += 2
            continue
        depth += {"{": 1, "}": -1}.get(pattern[at], 0)
        if depth < 0:
            return False
        at += 1
    return depth == 0


@settings(max_examples=2000, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=14).map("".join))
def test_patterns_expand_as_braceexpand_does(pattern: str) -> None:
    if not _balanced(pattern):
        with pytest.raises(ValueError, match="unmatched"):
            expand_braces(pattern)
        return
    if "\\\\" in pattern:
        # An escaped backslash: braceexpand drops it from a group it leaves as text ("{\\\\}"
        # gives "{}"), bash keeps it ("{\\}"); bash's answers are tested above.
        return
    assert expand_braces(pattern) == list(braceexpand.braceexpand(pattern))
