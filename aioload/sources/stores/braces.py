"""Brace patterns, as bash expands them: ``train-{000..099}.tar``, ``{train,val}/``, nested.

WebDataset names a set of shards by a brace pattern; :func:`expand_braces` expands one
with bash's semantics, and :func:`expand_urls` the URLs every dataset is given (a list, or
one pattern) (the ``braceexpand`` package's, which WebDataset uses):

- a list ``{a,b,c}`` gives each alternative in turn (an empty one too: ``{,.bak}``);
- a range ``{N..M}`` counts from ``N`` to ``M``, up or down, ``{N..M..S}`` by steps of
  ``S`` (its sign ignored; 0 counts as 1); ``{a..e}`` counts letters;
- a bound written with a leading zero (``{000..099}``, ``{1..010}``) pads every number to
  the widest bound;
- groups nest (``{a,b{1,2}}``) and several in a row give every combination, the first
  group's changing slowest (``{a,b}{1,2}``: ``a1 a2 b1 b2``);
- braces around anything else (``{x}``, ``{}``) are kept as they are, and a backslash
  makes the next character plain (``\\{``, ``\\,``; ``\\\\`` for a backslash).

Unlike bash, an unmatched brace is an error (``ValueError`` naming the pattern), never
left as literal text: a URL with a stray brace names no object anyone meant.

Example::

    >>> expand_braces("s3://b/{train,val}/part-{0..10..5}.tar")
    ['s3://b/train/part-0.tar', 's3://b/train/part-5.tar', 's3://b/train/part-10.tar', \
's3://b/val/part-0.tar', 's3://b/val/part-5.tar', 's3://b/val/part-10.tar']
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from aioload.urls import redact_url

__all__ = ["brace_pattern", "expand_braces", "expand_urls"]

_INT_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)(?:\.\.(-?\d+))?$")
_CHAR_RANGE = re.compile(r"^([A-Za-z])\.\.([A-Za-z])(?:\.\.(-?\d+))?$")

# A token: what it is, and its character. An escaped character is text, told apart so that
# it never takes part in a range.
_TEXT, _ESCAPED, _BRACE = 0, 1, 2  # _BRACE: a structural "{", "}" or ","
Token = tuple[int, str]


def expand_braces(pattern: str) -> list[str]:
    """Every string the brace pattern ``pattern`` stands for, in bash's order.

    Raises:
        ValueError: an unmatched ``{`` or ``}`` (its position named).

    Example::

        >>> expand_braces("shard-{08..11}.tar")
        ['shard-08.tar', 'shard-09.tar', 'shard-10.tar', 'shard-11.tar']
        >>> expand_braces("a{b,c{1,2}}")
        ['ab', 'ac1', 'ac2']
    """
    tokens = _tokens(pattern)
    _check_balanced(tokens, pattern)
    return _expand(tokens)


def expand_urls(urls: str | Sequence[str]) -> list[str]:
    """A list of URLs from a list, or from a brace pattern (WebDataset's notation).

    A pattern expands as bash expands it (:func:`~aioload.sources.stores.braces.expand_braces`):
    lists ``{train,val}``, ranges ``{000..099}`` (zero padded as the bounds are written)
    and ``{0..100..10}`` (with a step), nested and several groups; each string of a list
    is expanded too.

    Raises:
        ValueError: an unmatched brace (never left in a URL as literal text).
        TypeError: a URL that is not a str.

    Example::

        >>> expand_urls("s3://b/shard-{00..02}.tar")
        ['s3://b/shard-00.tar', 's3://b/shard-01.tar', 's3://b/shard-02.tar']
        >>> expand_urls("s3://b/{train,val}-{0..10..5}.tar")[:4]
        ['s3://b/train-0.tar', 's3://b/train-5.tar', 's3://b/train-10.tar', 's3://b/val-0.tar']
    """
    if isinstance(urls, str):
        return expand_braces(urls)
    expanded = []
    for url in urls:
        if not isinstance(url, str):
            raise TypeError(f"shard URLs should be str; got {url!r}")
        expanded += expand_braces(url)
    return expanded


def _tokens(pattern: str) -> list[tuple[Token, int]]:
    """The pattern's tokens, each with its position in the pattern."""
    tokens: list[tuple[Token, int]] = []
    at = 0
    while at < len(pattern):
        char = pattern[at]
        if char == "\\" and at + 1 < len(pattern):
            tokens.append(((_ESCAPED, pattern[at + 1]), at))
            at += 2
            continue
        tokens.append(((_BRACE if char in "{}," else _TEXT, char), at))
        at += 1
    return tokens


def _check_balanced(tokens: list[tuple[Token, int]], pattern: str) -> None:
    opened: list[int] = []
    for (kind, char), at in tokens:
        if kind != _BRACE:
            continue
        if char == "{":
            opened.append(at)
        elif char == "}":
            if not opened:
                raise _unmatched(pattern, "}", at)
            opened.pop()
    if opened:
        raise _unmatched(pattern, "{", opened[-1])


def _unmatched(pattern: str, brace: str, at: int) -> ValueError:
    return ValueError(
        f"the brace pattern {redact_url(pattern)!r} has an unmatched {brace!r} at character "
        f"{at + 1}: braces come in pairs, {{a,b}} or {{0..9}} (write \\{brace} for a brace "
        "that is part of the name)"
    )


def _expand(tokens: list[tuple[Token, int]]) -> list[str]:
    """The strings of a balanced run of tokens."""
    results = [""]
    text: list[str] = []  # the plain text since the last group
    at = 0
    while at < len(tokens):
        (kind, char), _ = tokens[at]
        if (kind, char) != (_BRACE, "{"):
            text.append(char)
            at += 1
            continue
        end = _closing(tokens, at)
        inner = tokens[at + 1 : end]
        options = _alternatives(inner)
        if options is None:  # no list, no range: the braces are text, what they hold expands
            options = ["{" + option + "}" for option in _expand(inner)]
        head = "".join(text)
        text = []
        results = [result + head + option for result in results for option in options]
        at = end + 1
    tail = "".join(text)
    return [result + tail for result in results]


def _closing(tokens: list[tuple[Token, int]], start: int) -> int:
    """The index of the brace that closes the one at ``start`` (the tokens are balanced)."""
    depth = 0
    for at in range(start, len(tokens)):
        token = tokens[at][0]
        if token == (_BRACE, "{"):
            depth += 1
        elif token == (_BRACE, "}"):
            depth -= 1
            if depth == 0:
                return at
    raise AssertionError("unbalanced tokens")  # pragma: no cover - checked before


def _alternatives(inner: list[tuple[Token, int]]) -> list[str] | None:
    """What a group stands for: its list's alternatives or its range; None: neither."""
    pieces: list[list[tuple[Token, int]]] = [[]]
    depth = 0
    for token in inner:
        if token[0] == (_BRACE, "{"):
            depth += 1
        elif token[0] == (_BRACE, "}"):
            depth -= 1
        elif token[0] == (_BRACE, ",") and depth == 0:
            pieces.append([])
            continue
        pieces[-1].append(token)
    if len(pieces) > 1:
        return [option for piece in pieces for option in _expand(piece)]
    if any(kind != _TEXT for (kind, _), _ in inner):
        return None  # a group inside, or an escaped character: no range
    return _range("".join(char for (_, char), _ in inner))


def _range(text: str) -> list[str] | None:
    """The terms of a range ``N..M[..S]`` (numbers or letters); None: not a range."""
    match = _INT_RANGE.match(text)
    if match is not None:
        first, last, step = match.groups()
        width = max(len(first), len(last)) if _padded(first) or _padded(last) else 0
        return [f"{n:0{width}d}" for n in _counted(int(first), int(last), step)]
    match = _CHAR_RANGE.match(text)
    if match is not None:
        first, last, step = match.groups()
        return [chr(n) for n in _counted(ord(first), ord(last), step)]
    return None


def _padded(bound: str) -> bool:
    """Whether a bound is written with a leading zero (``07``, ``-05``; not ``0``)."""
    digits = bound.lstrip("-")
    return len(digits) > 1 and digits.startswith("0")


def _counted(first: int, last: int, step: str | None) -> range:
    by = abs(int(step)) if step else 1
    by = by or 1
    return range(first, last + 1, by) if first <= last else range(first, last - 1, -by)


def brace_pattern(strings: Sequence[str]) -> str | None:
    """A pattern ``prefix{N..M}suffix`` that expands to exactly ``strings``, else None.

    What names a numbered run of shards in a message (a command to copy): the strings
    must differ only by a number counting up by one, zero-padded alike (or not at all).

    Example::

        >>> brace_pattern(["s3://b/train-08.tar", "s3://b/train-09.tar", "s3://b/train-10.tar"])
        's3://b/train-{08..10}.tar'
        >>> brace_pattern(["a-1.tar", "a-3.tar"]) is None
        True
    """
    if not strings or any(char in text for text in strings for char in "{},\\"):
        return None
    if len(strings) == 1:
        return strings[0]
    prefix = _common_start(list(strings)).rstrip("0123456789")
    suffix = _common_start([text[::-1] for text in strings])[::-1].lstrip("0123456789")
    if len(prefix) + len(suffix) > min(len(text) for text in strings):
        return None
    first = strings[0][len(prefix) : len(strings[0]) - len(suffix)]
    last = strings[-1][len(prefix) : len(strings[-1]) - len(suffix)]
    if not (first.isdigit() and last.isdigit()):
        return None
    pattern = f"{prefix}{{{first}..{last}}}{suffix}"
    return pattern if expand_braces(pattern) == list(strings) else None


def _common_start(strings: list[str]) -> str:
    """The characters every one of ``strings`` starts with."""
    shortest = min(strings, key=len)
    for position, char in enumerate(shortest):
        if any(text[position] != char for text in strings):
            return shortest[:position]
    return shortest
