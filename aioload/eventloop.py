"""The event loop aioload creates wherever it runs a loop of its own.

One choice for every place that needs a loop — the sync facade's thread, a
worker process, an executor thread running an async dataset, the command line —
so they all get uvloop where it is installed.
"""

from __future__ import annotations

import asyncio

__all__ = ["new_event_loop"]


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A uvloop event loop where uvloop is installed, else asyncio's default.

    Example::

        >>> loop = new_event_loop()
        >>> loop.run_until_complete(asyncio.sleep(0))
        >>> loop.close()
    """
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency where it exists
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop
