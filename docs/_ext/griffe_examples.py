"""A griffe extension for the API reference: aioload's docstrings as Markdown.

aioload's docstrings follow torch's spirit: their examples are headed ``Example::`` or
``Example:``, and they refer to other objects with Sphinx roles (``:class:`~aioload.X```).
griffe's Google-style parser knows only ``Examples:`` as the examples section, and would render
the others as admonitions with doctest lines as plain text; Markdown has no roles. Before a
docstring is parsed, this renames the headings to ``Examples:`` (so doctests render as Python
sessions) and turns each role into a code span of the name it shows.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_HEADING = re.compile(r"^(?P<indent>[ \t]*)Examples?::?[ \t]*$", re.MULTILINE)
# :class:`~aioload.DataLoader` shows "DataLoader"; :func:`aioload.collate` shows the full path.
_ROLE = re.compile(r":(?:class|func|meth|attr|data|mod|exc|obj):`(?P<tilde>~?)(?P<target>[^`]+)`")


def _code_span(match: re.Match[str]) -> str:
    target = match["target"]
    return f"``{target.rsplit('.', 1)[-1] if match['tilde'] else target}``"


class ExampleSections(griffe.Extension):
    """Renames ``Example:``/``Example::`` headings to ``Examples:`` and roles to code spans."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        docstring = obj.docstring
        if docstring is not None:
            value = _HEADING.sub(r"\g<indent>Examples:", docstring.value)
            docstring.value = _ROLE.sub(_code_span, value)
