"""``python -m aioload`` (also the ``aioload`` script): the demo and the bucket speed test.

Commands:

- ``aioload demo``: streams a synthetic image dataset, stored as tar shards
  behind a local object server with injected latency, into a toy training
  step, and compares aioload with a serial reader (and torch's DataLoader when
  torch is installed) in the same run.
- ``aioload stream URL``: reads a user's own objects or shards and reports
  throughput and latency percentiles: how fast can this bucket be read, and
  with which settings?

Exit codes (:data:`EXIT_CODES`): 0 success; 1 an unexpected failure; 2 bad
arguments (a malformed URL, missing credentials, an unknown option); 3 access
denied; 4 nothing found (a missing object, an empty prefix); 5 the endpoint
cannot be reached or keeps failing; 130 interrupted (Ctrl-C). Errors are one
line on stderr, never a traceback (``--traceback`` shows it). A password in
a URL's userinfo (in the URL or ``--endpoint``) is printed as ``***``.

Example::

    $ aioload stream s3://bucket/train/ --endpoint http://127.0.0.1:8333 \\
        --workers 2 --concurrency 256 --limit 10000
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import traceback
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from aioload.eventloop import new_event_loop
from aioload.urls import redact_url

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


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aioload",
        description="aioload: an asyncio-native streaming data loader.",
        epilog="Exit codes: 0 ok, 1 failure, 2 bad arguments or credentials, 3 access denied, "
        "4 nothing found, 5 endpoint unreachable, 130 interrupted.",
    )
    parser.add_argument("--traceback", action="store_true", help="show the traceback of a failure")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    from aioload.cli import demo, stream  # the commands import the optional extras lazily

    demo.add_parser(commands)
    stream.add_parser(commands)
    return parser


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
