"""Exceptions at aioload's edges: no task group's ExceptionGroup reaches the user.

An epoch runs in an anyio task group (so does each epoch in a worker), and a
task group wraps whatever its tasks raise in a ``BaseExceptionGroup``, so
``except RuntimeError`` would miss a dataset's ``RuntimeError``. The user
asked for no group: where a task group ends, :func:`ungroup` turns its group
back into the exception it carries (:func:`raise_ungrouped` raises it).

:func:`reported` says which exceptions a read reports as its batch's outcome
instead of letting them tear down the loop, the worker or the executor's
task: every one but a cancellation, so a dataset's ``SystemExit`` or
``KeyboardInterrupt`` reaches the consumer as itself, like any other error.
"""

from __future__ import annotations

import asyncio
from typing import NoReturn

__all__ = ["raise_ungrouped", "reported", "ungroup"]


def reported(error: BaseException) -> bool:
    """Whether a read that raised ``error`` reports it (everything but a cancellation)."""
    return not isinstance(error, asyncio.CancelledError | GeneratorExit)


def ungroup(error: BaseException) -> BaseException:
    """The exception a task group's ``error`` stands for (``error`` itself if not a group).

    One level only: the task group's own group is unwrapped, and a group that
    one of its tasks raised (the user's own) is kept as it is. A single
    exception is returned as it is; of several, the first is returned, with a
    note naming each of the others. anyio leaves cancellations out of its
    groups, so every member is a real error.
    """
    if not isinstance(error, BaseExceptionGroup) or not error.exceptions:
        return error
    first, *others = error.exceptions
    for other in others:
        kind = type(other)
        first.add_note(
            f"the same task group also raised {kind.__module__}.{kind.__qualname__}: {other}"
        )
    return first


def raise_ungrouped(group: BaseExceptionGroup[BaseException]) -> NoReturn:
    """Raises the exception ``group`` stands for (see :func:`ungroup`), as it was raised.

    Raised from the handler that caught the group, it would get the group as
    its context, and every traceback would print the group again: its own
    context is put back.
    """
    error = ungroup(group)
    context, suppress = error.__context__, error.__suppress_context__
    try:
        raise error
    finally:
        error.__context__, error.__suppress_context__ = context, suppress
        del error, context
