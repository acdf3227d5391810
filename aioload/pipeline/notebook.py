"""Whether the running event loop is an IPython kernel's: where a plain ``for`` may block it.

A Jupyter kernel (ipykernel ≥ 6) runs each cell inside its own event loop, in
the loop's thread, while that loop is running; IPython's terminal runs an
``await``-ing cell (``%autoawait``) on a loop of its own the same way. Blocking
that loop for the length of a cell is what a notebook user wants from
``for batch in loader`` (torch's DataLoader does it), whereas blocking any
other running loop would stall everything else it serves. So the sync facade
accepts exactly these loops, and refuses the rest.

Workers are the other thing a notebook may change: a class or function defined
in a cell lives in ``__main__``, which pickles it by name. Forked workers (the
default on Linux, as in torch, kernel threads or not) and those of the fork
template inherit it; a worker started with ``forkserver`` or ``spawn`` has no
such name (an interactive ``__main__`` has no file to run again).
:func:`check_workers_can_import` says so before any worker starts, naming the
object and the ways out.

A leaf module: it never imports IPython or ipykernel, it only looks at the
modules this process has already imported, so it costs a few dictionary
lookups and nothing where IPython is not loaded.
"""

from __future__ import annotations

import asyncio
import pickle
import sys
import threading
from collections.abc import Mapping

from aioload.backends.processes.main_module import main_defined, runs_main

__all__ = ["check_workers_can_import", "is_ipython_loop"]


def is_ipython_loop(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether ``loop`` (running in this thread) is the loop IPython runs this cell on.

    True for the event loop of an ipykernel kernel (the main shell's, or a
    subshell's in ipykernel ≥ 7) when the shell is ipykernel's
    ``ZMQInteractiveShell`` or a subclass (Jupyter, JupyterLab, VS Code, Colab,
    Spyder), and for the loop IPython's terminal runs ``await``-ing cells on.
    False for every other loop, e.g. one started by ``asyncio.run`` in a thread
    of a kernel.

    Example::

        >>> import asyncio
        >>> async def probe() -> bool:
        ...     return is_ipython_loop(asyncio.get_running_loop())
        >>> asyncio.run(probe())
        False
    """
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    get_ipython = getattr(ipython, "get_ipython", None)
    shell = get_ipython() if callable(get_ipython) else None
    if shell is None:
        return False
    zmqshell = sys.modules.get("ipykernel.zmqshell")
    kernel_shell = getattr(zmqshell, "ZMQInteractiveShell", None)
    if isinstance(kernel_shell, type) and isinstance(shell, kernel_shell):
        # The main shell's cells run on the kernel's tornado IOLoop; a subshell's
        # (ipykernel ≥ 7) on the IOLoop of the subshell's own thread.
        kernel_loop = getattr(
            getattr(getattr(shell, "kernel", None), "io_loop", None), "asyncio_loop", None
        )
        if kernel_loop is loop:
            return True
        subshell = sys.modules.get("ipykernel.subshell")
        subshell_thread = getattr(subshell, "SubshellThread", None)
        current = threading.current_thread()
        if isinstance(subshell_thread, type) and isinstance(current, subshell_thread):
            thread_loop = getattr(getattr(current, "io_loop", None), "asyncio_loop", None)
            return thread_loop is loop
        return False
    # IPython's terminal: an `await`-ing cell runs on IPython's own loop (IPython ≥ 8).
    helpers = sys.modules.get("IPython.core.async_helpers")
    return helpers is not None and getattr(helpers, "_asyncio_event_loop", None) is loop


def check_workers_can_import(objects: Mapping[str, object], start_method: str) -> None:
    """Refuses what workers would fail to unpickle: objects defined in an interactive ``__main__``.

    ``objects`` maps a name (``"dataset"``) to what the workers receive, which
    start with ``start_method``. Only an interactive ``__main__`` (a notebook
    or a REPL: no file to run again in the worker) and a start method that
    runs the main script again (``spawn``, ``forkserver``) are concerned; the
    check then looks a few levels into the objects' attributes and containers
    (:func:`aioload.backends.processes.main_module.main_defined`).

    Raises:
        pickle.PicklingError: naming the object defined in ``__main__`` and the
            fixes (define it in a module, ``multiprocessing_context="fork"``,
            or ``num_workers=0``).

    Example::

        >>> check_workers_can_import({"dataset": [1, 2, 3]}, "spawn")   # nothing from __main__
    """
    main = sys.modules.get("__main__")
    if main is None or getattr(main, "__file__", None) or getattr(main, "__spec__", None):
        return
    if not runs_main(start_method):
        return
    for path, culprit in main_defined(objects):
        named = culprit if isinstance(culprit, type) or callable(culprit) else type(culprit)
        what = getattr(named, "__qualname__", None) or type(culprit).__qualname__
        raise pickle.PicklingError(
            f"cannot send {path} (__main__.{what}) to the worker processes: it is "
            f"defined in the notebook or interactive session (module __main__), and "
            f"workers started with {start_method!r} import it by name from their own "
            f"__main__, where it does not exist. Define it in a module and import it "
            f"from there, or pass multiprocessing_context='fork', or use num_workers=0"
        )
