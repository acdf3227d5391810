"""``python -m aioload`` (also the ``aioload`` script): the demo and the bucket speed test.

Commands:

- ``aioload demo``: streams a synthetic image dataset, stored as tar shards
  behind a local object server with injected latency, into a toy training
  step, and compares aioload with a serial reader (and torch's DataLoader when
  torch is installed) in the same run.
- ``aioload stream URL``: reads a user's own objects or shards and reports
  throughput and latency percentiles: how fast can this bucket be read, and
  with which settings?
- ``aioload index URL...``: writes the ``.idx.json`` index files of existing tar
  shards (those other tools wrote), in parallel, resumable, so that ranks split
  them by samples without reading every shard whole.

``aioload --version`` prints the installed version.

Exit codes (:data:`EXIT_CODES`): 0 success; 1 an unexpected failure; 2 bad
arguments (a malformed URL, missing credentials, an unknown option); 3 access
denied; 4 nothing found (a missing object, an empty prefix); 5 the endpoint
cannot be reached or keeps failing; 130 interrupted (Ctrl-C). Errors are one
line on stderr, never a traceback (``--traceback`` shows it). A password in
a URL's userinfo (in the URL or ``--endpoint``) is printed as ``***``.

Modules: this one (the parser, exit codes, ``CommandError``, ``run_async``), a module per
command (``demo``, ``stream``, ``index``), ``store_args`` (the store flags that ``stream``
and ``index`` share) and ``meter`` (the live meter and the result table).

Example::

    $ aioload stream s3://bucket/train/ --endpoint http://127.0.0.1:8333 \\
        --workers 2 --concurrency 256 --limit 10000
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import re
import sys
import textwrap
import traceback
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from aioload.eventloop import new_event_loop
from aioload.urls import redact_url
from aioload.version import __version__

__all__ = ["EXIT_CODES", "CommandError", "main", "run_async"]

EXIT_CODES = {
    "ok": 0,
    "failed": 1,
    "usage": 2,
    "denied": 3,
    "not_found": 4,
    "unreachable": 5,
    "interrupted": 130,
}


class CommandError(Exception):
    """A failure the command explains in one line, with the exit code it ends with."""

    def __init__(self, message: str, code: int = EXIT_CODES["failed"]) -> None:
        super().__init__(message)
        self.code = code


def run_async(main: Callable[[], Coroutine[Any, Any, Any]]) -> None:
    """Runs the coroutine ``main()`` to its end on a new event loop (uvloop's, as the loader's)."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        runner.run(main())


def exit_code(error: BaseException) -> int:
    """The exit code for an error that ended a command (see the module docstring)."""
    if isinstance(error, CommandError):
        return error.code
    if isinstance(error, PermissionError):
        return EXIT_CODES["denied"]
    if isinstance(error, FileNotFoundError):
        return EXIT_CODES["not_found"]
    if isinstance(error, ConnectionError | TimeoutError):
        return EXIT_CODES["unreachable"]
    if isinstance(error, ValueError | TypeError | ImportError):
        return EXIT_CODES["usage"]
    return EXIT_CODES["failed"]


def describe(error: BaseException) -> str:
    """One line for ``error``: its message and its one-line notes (which keys, which worker).

    URLs in it show the password of their userinfo as ``***``.
    """
    message = str(error).strip() or type(error).__name__
    if isinstance(error, OSError | ValueError | TypeError) and not isinstance(error, CommandError):
        message = f"{message} ({type(error).__name__})"
    notes = [n for n in getattr(error, "__notes__", ()) if "\n" not in n]
    # The messages of aioload.sources are redacted already; this also covers those of
    # anything else a command ran into (the loader, a decode function, obstore itself).
    return redact_url("; ".join([message.splitlines()[0], *notes]))


_ROLE = re.compile(r":[a-z:]+:`(~?)([^`<]+?)(?: <[^`]+>)?`")
_LITERAL = re.compile(r"``(.+?)``")
_STRONG = re.compile(r"\*\*(.+?)\*\*")


def plain_text(docstring: str, width: int = 79) -> str:
    """``docstring`` as a terminal shows it: reST roles, literals and bold as plain text.

    Paragraphs and ``- `` list items are filled to ``width``; indented blocks are kept.

    Example::

        >>> plain_text(":class:`~aioload.sources.ObjectServer` waits ``--latency-ms``")
        'ObjectServer waits --latency-ms'
    """

    def role(match: re.Match[str]) -> str:
        target = match.group(2)
        return target.rsplit(".", 1)[-1] if match.group(1) else target

    text = _ROLE.sub(role, inspect.cleandoc(docstring))
    text = _STRONG.sub(r"\1", _LITERAL.sub(r"\1", text))
    paragraphs = []
    for paragraph in text.split("\n\n"):
        if paragraph.startswith(" "):
            paragraphs.append(paragraph)
            continue
        items = re.split(r"\n(?=- )", paragraph)
        paragraphs.append(
            "\n".join(
                textwrap.fill(
                    " ".join(item.split()),
                    width,
                    subsequent_indent="  " if item.startswith("- ") else "",
                    break_on_hyphens=False,
                )
                for item in items
            )
        )
    return "\n\n".join(paragraphs).strip()


def add_traceback_option(parser: argparse.ArgumentParser, *, command: bool = True) -> None:
    """``--traceback`` on a command's parser (and on the top-level one, ``command=False``).

    It is accepted before or after the command. A command's copy defaults to unset
    (``SUPPRESS``), so that it never overwrites a ``--traceback`` given before the command.
    """
    parser.add_argument(
        "--traceback",
        action="store_true",
        default=argparse.SUPPRESS if command else False,
        help="show the traceback of a failure",
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aioload",
        description="aioload: an asyncio-native streaming data loader.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_traceback_option(parser, command=False)
    parser.add_argument(
        "--version", action="version", version=f"aioload {__version__}", help="show the version"
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    from aioload.cli import demo, index, stream  # they import the optional extras lazily

    demo.add_parser(commands)
    stream.add_parser(commands)
    index.add_parser(commands)
    # The epilog lists every command with its flags (`aioload COMMAND --help` explains them).
    lines = []
    for command in commands.choices.values():
        lines.extend(_wrap(command.format_usage().removeprefix("usage: "), 79))
    parser.epilog = (
        "commands and their flags (aioload COMMAND --help explains each flag):\n"
        + "\n".join(lines)
        + "\n\nexit codes: 0 ok, 1 failure, 2 bad arguments or credentials, 3 access denied,\n"
        "4 nothing found, 5 endpoint unreachable, 130 interrupted."
    )
    return parser


def _wrap(usage: str, width: int) -> list[str]:
    """One command's usage on lines of at most ``width``, broken between flags."""
    lines: list[str] = []
    line = ""
    for part in re.findall(r"\[[^\]]*\]|\S+", " ".join(usage.split())):
        if line and len(line) + 1 + len(part) > width:
            lines.append(line)
            line = "      " + part
        else:
            line = f"{line} {part}" if line else "  " + part
    return [*lines, line]


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line ``argv`` (default: ``sys.argv[1:]``) and returns its exit code."""
    parser = _parser()
    arguments = parser.parse_args(argv)
    if arguments.command is None:
        parser.print_help()
        return EXIT_CODES["usage"]
    try:
        return int(arguments.run(arguments))
    except KeyboardInterrupt:
        print("\naioload: interrupted", file=sys.stderr)
        return EXIT_CODES["interrupted"]
    except Exception as error:
        if arguments.traceback:
            traceback.print_exc()
        print(f"aioload {arguments.command}: error: {describe(error)}", file=sys.stderr)
        return exit_code(error)
