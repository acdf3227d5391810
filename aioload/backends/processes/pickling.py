"""Pickling what workers receive, and saying which part could not be pickled.

A worker setup (dataset, ``collate_fn``, ``worker_init_fn``, fault policy)
that cannot be pickled fails with an error of the same type that names the
attribute path at fault (``dataset.client``), what it is, and the ways out.
The process pool (:mod:`aioload.backends.processes.setup_parcel`) and the executor
backend both pickle through :func:`pickle_for_workers`.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

from aioload.read.reader import WorkerSetup

__all__ = ["pickle_for_workers", "pickle_setup"]


def _plain_dumps(obj: Any) -> bytes:
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def _unpicklable_part(
    obj: Any, path: str, depth: int = 0, dumps: Callable[[Any], bytes] = _plain_dumps
) -> tuple[str, Any, BaseException] | None:
    """The deepest attribute path under ``obj`` that ``dumps`` refuses, the object, its error."""
    try:
        dumps(obj)
    except Exception as error:
        if depth < 6:
            parts: list[tuple[str, Any]] = []
            state = getattr(obj, "__dict__", None)
            if isinstance(state, dict):
                parts = [(f"{path}.{name}", value) for name, value in state.items()]
            elif isinstance(obj, dict):
                parts = [(f"{path}[{key!r}]", value) for key, value in obj.items()]
            elif isinstance(obj, list | tuple):
                parts = [(f"{path}[{index}]", value) for index, value in enumerate(obj)]
            for part_path, value in parts:
                found = _unpicklable_part(value, part_path, depth + 1, dumps)
                if found is not None:
                    return found
        return path, obj, error
    return None


def pickle_setup(
    setup: WorkerSetup, start_method: str, *, dumps: Callable[[Any], bytes] = _plain_dumps
) -> bytes:
    """Pickles ``setup`` once for every worker; a failure names the object at fault."""
    return pickle_for_workers(
        setup,
        receivers="the worker processes",
        why=f"the {start_method!r} start method pickles",
        remedy="use multiprocessing_context='fork'",
        dumps=dumps,
    )


def pickle_for_workers(
    setup: WorkerSetup,
    *,
    receivers: str,
    why: str,
    remedy: str,
    dumps: Callable[[Any], bytes] = _plain_dumps,
) -> bytes:
    """Pickles ``setup`` for ``receivers``; a failure names the unpicklable object and a way out.

    ``why`` says who pickles (completing "… the dataset, collate_fn and
    worker_init_fn"); ``remedy`` is the alternative to creating the object lazily;
    ``dumps`` pickles (and so decides what cannot be pickled).
    """
    try:
        return dumps(setup)
    except Exception as error:
        found = None
        for name in ("dataset", "collate_fn", "worker_init_fn", "policy"):
            found = _unpicklable_part(getattr(setup, name), name, dumps=dumps)
            if found is not None:
                break
        path, culprit, cause = found if found is not None else ("the worker setup", setup, error)
        message = (
            f"cannot send {path} to {receivers}: {why} the dataset, collate_fn and "
            f"worker_init_fn, and {path} (a {type(culprit).__module__}."
            f"{type(culprit).__qualname__}) cannot be pickled: {cause}. Create such objects "
            f"lazily inside the worker (see aioload.get_worker_info()), or {remedy}."
        )
        try:
            replacement = type(error)(message)
        except Exception:
            replacement = TypeError(message)
        raise replacement from error
