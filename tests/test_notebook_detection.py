"""Which running loops may be blocked by a plain ``for``, without a real kernel.

The modules an IPython kernel imports are stood in for by fakes in
``sys.modules`` (aioload only looks at what is already imported); the real
kernels are in ``test_notebook.py``.
"""

from __future__ import annotations

import asyncio
import pickle
import sys
import types
from collections.abc import Iterator

import numpy as np
import pytest

from aioload import ArrayDataset, DataLoader, Subset
from aioload.pipeline.notebook import check_workers_can_import, is_ipython_loop


class ZMQInteractiveShell:
    """Stands in for ipykernel.zmqshell.ZMQInteractiveShell."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None) -> None:
        self.kernel = types.SimpleNamespace(io_loop=types.SimpleNamespace(asyncio_loop=loop))


class ColabShell(ZMQInteractiveShell):
    """A kernel's shell deriving from ipykernel's (Colab's, Spyder's)."""


class TerminalInteractiveShell:
    """Stands in for IPython's terminal shell."""


@pytest.fixture
def ipython(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.SimpleNamespace]:
    """Fake IPython, ipykernel.zmqshell and IPython.core.async_helpers modules; set ``.shell``."""
    state = types.SimpleNamespace(shell=None)
    fake = types.ModuleType("IPython")
    fake.get_ipython = lambda: state.shell  # type: ignore[attr-defined]
    zmqshell = types.ModuleType("ipykernel.zmqshell")
    zmqshell.ZMQInteractiveShell = ZMQInteractiveShell  # type: ignore[attr-defined]
    helpers = types.ModuleType("IPython.core.async_helpers")
    helpers._asyncio_event_loop = None  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "IPython", fake)
    monkeypatch.setitem(sys.modules, "ipykernel.zmqshell", zmqshell)
    monkeypatch.setitem(sys.modules, "IPython.core.async_helpers", helpers)
    state.helpers = helpers
    yield state


def _loader() -> DataLoader[object]:
    return DataLoader(ArrayDataset(np.arange(6)), batch_size=4)


def test_without_ipython_no_loop_is_exempt(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "IPython", raising=False)

    async def main() -> bool:
        return is_ipython_loop(asyncio.get_running_loop())

    assert not asyncio.run(main())


def test_ipython_without_a_shell_is_not_exempt(ipython: types.SimpleNamespace) -> None:
    async def main() -> None:
        with pytest.raises(RuntimeError, match="async for"):
            iter(_loader())

    asyncio.run(main())


@pytest.mark.parametrize("shell_type", [ZMQInteractiveShell, ColabShell])
def test_for_blocks_the_kernel_loop(
    ipython: types.SimpleNamespace, shell_type: type[ZMQInteractiveShell]
) -> None:
    async def cell() -> list[list[int]]:
        ipython.shell = shell_type(asyncio.get_running_loop())
        batches = [batch.tolist() for (batch,) in _loader()]
        (first,) = next(iter(_loader()))
        return [*batches, first.tolist()]

    assert asyncio.run(cell()) == [[0, 1, 2, 3], [4, 5], [0, 1, 2, 3]]


def test_any_other_loop_in_a_kernel_still_refuses_for(ipython: types.SimpleNamespace) -> None:
    async def elsewhere() -> None:
        ipython.shell = ZMQInteractiveShell(asyncio.new_event_loop())  # the kernel's: another
        try:
            with pytest.raises(RuntimeError, match="IPython and Jupyter cells are exempt"):
                iter(_loader())
        finally:
            ipython.shell.kernel.io_loop.asyncio_loop.close()

    asyncio.run(elsewhere())


def test_ipython_terminal_exempts_its_own_loop_only(ipython: types.SimpleNamespace) -> None:
    ipython.shell = TerminalInteractiveShell()

    async def cell() -> list[list[int]]:
        return [batch.tolist() for (batch,) in _loader()]

    loop = asyncio.new_event_loop()
    try:
        ipython.helpers._asyncio_event_loop = loop  # an `await`-ing cell runs on it
        assert loop.run_until_complete(cell()) == [[0, 1, 2, 3], [4, 5]]
        with pytest.raises(RuntimeError, match="cannot be iterated with a plain `for`"):
            asyncio.run(cell())  # a loop of the user's
    finally:
        loop.close()


class Squares:
    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> int:
        return index * index


def _collate(batch: list[int]) -> list[int]:
    return batch


@pytest.fixture
def interactive_main(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """``__main__`` as a notebook's or a REPL's: no file; ``Squares`` and ``_collate`` in it."""
    main = types.ModuleType("__main__")
    monkeypatch.setitem(sys.modules, "__main__", main)
    monkeypatch.setattr(Squares, "__module__", "__main__")
    monkeypatch.setattr(_collate, "__module__", "__main__")
    return main


def test_workers_refuse_a_dataset_of_an_interactive_main(
    interactive_main: types.ModuleType,
) -> None:
    with pytest.raises(pickle.PicklingError, match=r"cannot send dataset \(__main__\.Squares\)"):
        iter(
            DataLoader(Squares(), batch_size=4, num_workers=2, multiprocessing_context="forkserver")
        )
    with pytest.raises(pickle.PicklingError, match=r"dataset\.dataset \(__main__\.Squares\)"):
        iter(
            DataLoader(
                Subset(Squares(), [0, 1]), num_workers=2, multiprocessing_context="forkserver"
            )
        )
    with pytest.raises(pickle.PicklingError, match=r"collate_fn \(__main__\._collate\).*'spawn'"):
        DataLoader(
            ArrayDataset(np.arange(4)),
            num_workers=1,
            collate_fn=_collate,
            multiprocessing_context="spawn",
        ).__aiter__()


def test_what_workers_can_import_passes(interactive_main: types.ModuleType) -> None:
    check_workers_can_import({"dataset": Squares()}, "fork")  # fork inherits __main__
    check_workers_can_import({"dataset": ArrayDataset(np.arange(4))}, "forkserver")
    check_workers_can_import({"dataset": list(range(10_000)), "collate_fn": None}, "spawn")
    assert [batch.tolist() for batch in DataLoader(Squares(), batch_size=4)] == [
        [0, 1, 4, 9],
        [16, 25, 36, 49],
    ]  # no workers, nothing to import


def test_a_script_main_is_not_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    main = types.ModuleType("__main__")
    main.__file__ = "train.py"  # workers import the script again
    monkeypatch.setitem(sys.modules, "__main__", main)
    monkeypatch.setattr(Squares, "__module__", "__main__")
    check_workers_can_import({"dataset": Squares()}, "forkserver")
