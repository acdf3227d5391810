"""A script's ``__main__`` as the workers see it: its guard, and the names it defines.

``spawn`` and the fork server start a worker by running the main script
again (as ``__mp_main__``) before they unpickle the dataset, so that what the
script defines can be found by name. A script without an ``if __name__ ==
"__main__":`` guard then iterates its loader again inside every worker, and
multiprocessing fails there with its bootstrapping error, once per worker.
torch users on Linux never needed the guard, because their workers fork; so
do aioload's (the rule: :mod:`aioload.backends.processes.start_method`). Where they
would not — the user chose ``spawn`` or ``forkserver``, Python's default is
``forkserver``, or a runtime that a fork does not survive left only the fork
server — :func:`check_script_for_workers` refuses such a script in the
loader's own process, before any worker starts, with one error naming the
fix. It refuses too what the workers could not find: a class or function the
script defines only under its guard (the workers' run of the script skips that
block).

:func:`main_defined` is the walk both this check and the notebook check
(:mod:`aioload.pipeline.notebook`) make over what the workers receive.
"""

from __future__ import annotations

import ast
import functools
import itertools
import os
import sys
import threading
import types
from collections.abc import Iterator, Mapping, Sequence

__all__ = ["check_script_for_workers", "main_defined", "main_names", "runs_main"]

_WALK_DEPTH = 3  # how deep into the objects' attributes and containers the walk looks
_WALK_LIMIT = 1000  # and how many objects it looks at, at most


def main_defined(objects: Mapping[str, object]) -> Iterator[tuple[str, object]]:
    """Every object under ``objects`` (themselves included) defined in ``__main__``.

    Yields ``(path, object)``, the path spelled from the names of ``objects``
    (``"dataset.transform"``). The walk looks a few levels into attributes,
    dicts, lists and tuples, and at a bounded number of objects.

    Example::

        >>> list(main_defined({"dataset": [1, 2]}))
        []
    """
    seen: set[int] = set()
    for name, obj in objects.items():
        yield from _walk(obj, name, 0, seen)


def _walk(obj: object, path: str, depth: int, seen: set[int]) -> Iterator[tuple[str, object]]:
    if id(obj) in seen or len(seen) >= _WALK_LIMIT:
        return
    seen.add(id(obj))
    try:
        module = getattr(obj, "__module__", None)
    except Exception:  # an object whose attribute lookup fails pickles (or fails) on its own
        return
    if module == "__main__":
        yield path, obj
        return
    if depth >= _WALK_DEPTH or isinstance(obj, str | bytes | int | float | type):
        return
    parts: list[tuple[str, object]] = []
    if isinstance(obj, dict):
        items = itertools.islice(obj.items(), _WALK_LIMIT)
        parts = [(f"{path}[{key!r}]", value) for key, value in items]
    elif isinstance(obj, list | tuple):
        values = itertools.islice(obj, _WALK_LIMIT)
        parts = [(f"{path}[{index}]", value) for index, value in enumerate(values)]
    else:
        try:
            state = vars(obj)
        except TypeError:
            state = None
        if isinstance(state, dict):
            parts = [(f"{path}.{name}", value) for name, value in state.items()]
    for part_path, value in parts:
        yield from _walk(value, part_path, depth + 1, seen)


def runs_main(start_method: str) -> bool:
    """Whether workers started with ``start_method`` run the main script again.

    Example::

        >>> runs_main("forkserver"), runs_main("fork")
        (True, False)
    """
    return start_method in ("spawn", "forkserver")


def main_names(objects: Mapping[str, object]) -> set[str]:
    """The top-level names of ``__main__`` by which ``objects`` pickle what they hold of it.

    A class or function is pickled by its module and qualified name; an
    instance, by its class's. ``Outer.Inner`` is found through ``Outer``.

    Example::

        >>> main_names({"dataset": [1, 2]})
        set()
    """
    names = set()
    for _, obj in main_defined(objects):
        named = obj if isinstance(obj, type | types.FunctionType) else type(obj)
        name = getattr(named, "__qualname__", "").partition(".")[0]
        if name:
            names.add(name)
    return names


def check_script_for_workers(
    objects: Mapping[str, object], start_method: str, *, in_the_way: Sequence[str] = ()
) -> None:
    """Refuses a script that workers started with ``start_method`` would fail to run.

    Only start methods that run the main script again in every worker are
    concerned (``spawn``, ``forkserver``), and only a main module run from a
    file. ``in_the_way``: aioload chose the method, because these runtimes,
    which a fork does not survive, run in the process (the message names them).

    Raises:
        RuntimeError: the loader is iterated from the script's top level
            without the ``if __name__ == "__main__":`` guard, or something the
            workers receive (a class, a function) is defined in the script only
            under that guard. The message names the line or the object, and the
            fixes.

    Example::

        check_script_for_workers({"dataset": dataset}, "forkserver")
    """
    if not runs_main(start_method):
        return
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or not path or not _run_again(main, path):
        return
    script = _Script.of(os.path.abspath(path))
    if script is None:
        return
    shown = os.path.basename(path)
    line = _unguarded_line(main, script)
    if line is not None:
        raise RuntimeError(
            f"{shown} iterates a DataLoader with worker processes at its top level (line "
            f'{line}) without an `if __name__ == "__main__":` guard, and its workers start '
            f"with {start_method!r}, which runs the script again in every worker: each "
            f"would iterate the loader again. Put the script's work under "
            f'`if __name__ == "__main__":`{_fork_hint(in_the_way)}'
        )
    for where, obj in main_defined(objects):
        named = obj if isinstance(obj, type | types.FunctionType) else type(obj)
        name = getattr(named, "__qualname__", "").partition(".")[0]
        if name and name not in script.top_level_names and name in script.guarded_names:
            raise RuntimeError(
                f"cannot send {where} (__main__.{name}) to the worker processes: {shown} "
                f'defines {name} only under its `if __name__ == "__main__":` guard, and '
                f"workers started with {start_method!r} run the script without that block, "
                f"so they cannot find it. Define {name} at the top level of the script (above "
                f"the guard) or in a module{_fork_hint(in_the_way)}"
            )


def _run_again(main: types.ModuleType, path: str) -> bool:
    """Whether workers run this main module again: not a package's ``__main__.py``.

    multiprocessing's own rule (``spawn._fixup_main_from_name`` and
    ``_fixup_main_from_path``): ``python -m package`` and a directory or zip
    run their ``__main__`` module's code only in the main process.
    """
    name = getattr(getattr(main, "__spec__", None), "name", None)
    if name is not None and (name == "__main__" or name.endswith(".__main__")):
        return False
    return os.path.splitext(os.path.basename(path))[0] != "__main__"


def _fork_hint(in_the_way: Sequence[str]) -> str:
    if in_the_way:
        names = ", ".join(repr(name) for name in in_the_way[:5])
        return (
            f" (aioload does not fork workers from a process where {names} runs: a forked "
            "worker would hang; nor from its fork template, which is made with the first "
            "DataLoader that has workers, here after that runtime started: make the "
            "DataLoader before the script's first object-store request)."
        )
    return ", or pass multiprocessing_context='fork'."


def _unguarded_line(main: types.ModuleType, script: _Script) -> int | None:
    """The line of the script's top level that is running now, if outside the guard."""
    stacks: list[types.FrameType | None] = [sys._getframe()]
    main_thread = threading.main_thread()
    if threading.current_thread() is not main_thread and main_thread.ident is not None:
        frame = sys._current_frames().get(main_thread.ident)
        if frame is not None:
            stacks.append(frame)
    for frame in stacks:
        while frame is not None:
            if frame.f_code.co_name == "<module>" and frame.f_globals is vars(main):
                line = frame.f_lineno
                return None if script.guarded(line) else line
            frame = frame.f_back
    return None


class _Script:
    """What the main script's source says: its guard blocks, and the names it defines."""

    def __init__(self, tree: ast.Module) -> None:
        self.guards: list[tuple[int, int]] = []
        self.top_level_names: set[str] = set()
        self.guarded_names: set[str] = set()
        for node in tree.body:
            if isinstance(node, ast.If) and _is_main_test(node.test):
                self.guards.append((node.lineno, node.end_lineno or node.lineno))
                self.guarded_names.update(_defined_names(node))
            else:
                self.top_level_names.update(_defined_names(node))

    def guarded(self, line: int) -> bool:
        return any(first <= line <= last for first, last in self.guards)

    @staticmethod
    def of(path: str) -> _Script | None:
        try:
            stamp = os.stat(path).st_mtime_ns
        except OSError:
            return None
        return _parse(path, stamp)


@functools.lru_cache(maxsize=4)
def _parse(path: str, stamp: int) -> _Script | None:
    try:
        with open(path, "rb") as file:
            tree = ast.parse(file.read(), path)
    except (OSError, SyntaxError, ValueError):
        return None
    return _Script(tree)


def _is_main_test(test: ast.expr) -> bool:
    """``__name__ == "__main__"``, either way round."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return False
    if not isinstance(test.ops[0], ast.Eq):
        return False
    sides = [test.left, test.comparators[0]]
    names = [side for side in sides if isinstance(side, ast.Name) and side.id == "__name__"]
    values = [side for side in sides if isinstance(side, ast.Constant)]
    return len(names) == 1 and len(values) == 1 and values[0].value == "__main__"


def _defined_names(node: ast.AST) -> set[str]:
    """The names a statement binds in its module (those of nested blocks too, not of defs)."""
    if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
        return {node.name}
    if isinstance(node, ast.Import | ast.ImportFrom):
        return {(alias.asname or alias.name).partition(".")[0] for alias in node.names}
    targets: list[ast.expr] = []
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, ast.AnnAssign | ast.AugAssign):
        targets = [node.target]
    names: set[str] = set()
    for target in targets:
        names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    for field in ("body", "orelse", "finalbody", "handlers"):
        for child in getattr(node, field, ()):
            names.update(_defined_names(child))
    return names
