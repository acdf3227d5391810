"""A plain ``for`` in a Jupyter notebook: real ipykernel kernels run the cells.

A kernel runs each cell inside its running event loop, where aioload refuses a
plain ``for`` anywhere else; there it must block the cell, like torch's loader.
The notebook tests execute an in-memory notebook with nbclient (what
``jupyter nbconvert --execute`` does); the interrupt tests drive a kernel with
jupyter_client and interrupt it the way Jupyter's stop button does (SIGINT).
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager

import aioload

pytestmark = [pytest.mark.slow]

_KERNEL = "aioload-test"

# The kernel's state after an interrupted cell: aioload's threads and any live child process.
_LEFTOVERS = """
import multiprocessing, threading, time
deadline = time.monotonic() + 10
while time.monotonic() < deadline:
    threads = [t.name for t in threading.enumerate() if t.name.startswith("aioload")]
    children = [p.pid for p in multiprocessing.active_children()]
    if not threads and not children:
        break
    time.sleep(0.05)
print("threads", threads, "children", children)
"""


@pytest.fixture
def kernel_manager(tmp_path: Path) -> Iterator[KernelManager]:
    """A kernel manager for this interpreter's ipykernel, importing the aioload under test.

    The kernel's working directory is ``tmp_path``; the kernel is shut down at the end.
    """
    spec = tmp_path / "kernels" / _KERNEL
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(
        json.dumps({"argv": argv, "display_name": _KERNEL, "language": "python"})
    )
    package_root = str(Path(aioload.__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    manager = KernelManager(
        kernel_name=_KERNEL,
        kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(tmp_path / "kernels")]),
    )
    manager.start_kernel(cwd=str(tmp_path), env=env)
    try:
        yield manager
    finally:
        manager.shutdown_kernel(now=True)
        manager.cleanup_resources()
        # The clients' sockets and the context's I/O thread, which would otherwise linger
        # (reconnecting to the dead kernel) and open descriptors during later tests.
        manager.context.destroy(linger=0)


@pytest.fixture
def kernel(kernel_manager: KernelManager) -> Iterator[BlockingKernelClient]:
    """A connected client of a started kernel, stopped before the kernel is shut down."""
    client = kernel_manager.blocking_client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=60)
        yield client
    finally:
        client.stop_channels()


def _run_notebook(manager: KernelManager, tmp_path: Path, cells: list[str]) -> list[list[Any]]:
    """Executes ``cells`` as a notebook in the kernel of ``manager``; each cell's outputs."""
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(textwrap.dedent(cell)) for cell in cells]
    client = NotebookClient(
        notebook,
        km=manager,
        timeout=60,
        allow_errors=False,
        resources={"metadata": {"path": str(tmp_path)}},
    )
    try:
        client.execute(cleanup_kc=False)
    finally:
        # nbclient leaves the heartbeat channel of a kernel it did not start running: its
        # thread would go on pinging the dead kernel, opening sockets during later tests.
        if client.kc is not None:
            client.kc.stop_channels()
    return [cell.outputs for cell in notebook.cells]


def _stdout(outputs: list[Any]) -> str:
    return "".join(out["text"] for out in outputs if out.get("name") == "stdout")


@pytest.mark.timeout(120)
def test_plain_for_and_next_iter_run_in_notebook_cells(
    kernel_manager: KernelManager, tmp_path: Path
) -> None:
    outputs = _run_notebook(
        kernel_manager,
        tmp_path,
        [
            """
            import asyncio
            import numpy as np
            from aioload import ArrayDataset, DataLoader
            print(asyncio.get_running_loop().is_running())   # cells run inside the kernel's loop
            loader = DataLoader(ArrayDataset(np.arange(20)), batch_size=4)
            for (batch,) in loader:
                print(batch.tolist())
            """,
            """
            (first,) = next(iter(loader))
            print(first.tolist())
            """,
            # an `await`-ing cell runs on the same loop
            """
            await asyncio.sleep(0)
            print([batch.tolist() for (batch,) in loader][-1])
            """,
            # workers, with a dataset importable by name
            """
            workers = DataLoader(ArrayDataset(np.arange(20)), batch_size=4, num_workers=2)
            print([batch.tolist() for (batch,) in workers])
            (first,) = next(iter(workers))
            print(first.tolist())
            """,
            # any other running loop still refuses `for`: here asyncio.run in a thread (the
            # kernel's own thread cannot call asyncio.run while its loop runs)
            """
            import concurrent.futures
            async def elsewhere():
                try:
                    for batch in loader:
                        pass
                except RuntimeError as error:
                    return str(error)
                return "iterated"
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                print(pool.submit(asyncio.run, elsewhere()).result())
            """,
            """
            import threading
            print([t.name for t in threading.enumerate() if t.name.startswith("aioload")])
            """,
        ],
    )
    assert _stdout(outputs[0]).splitlines() == [
        "True",
        "[0, 1, 2, 3]",
        "[4, 5, 6, 7]",
        "[8, 9, 10, 11]",
        "[12, 13, 14, 15]",
        "[16, 17, 18, 19]",
    ]
    assert _stdout(outputs[1]) == "[0, 1, 2, 3]\n"
    assert _stdout(outputs[2]) == "[16, 17, 18, 19]\n"
    assert _stdout(outputs[3]).splitlines() == [
        "[[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15], [16, 17, 18, 19]]",
        "[0, 1, 2, 3]",
    ]
    refusal = _stdout(outputs[4])
    assert "cannot be iterated with a plain `for` inside a running event loop" in refusal
    assert "IPython and Jupyter cells are exempt" in refusal
    assert _stdout(outputs[5]) == "[]\n"


@pytest.mark.timeout(120)
def test_a_dataset_defined_in_a_cell_reaches_forked_workers(
    kernel_manager: KernelManager, tmp_path: Path
) -> None:
    # As with torch: the kernel's threads do not keep the workers from forking, and a
    # forked worker inherits __main__; a start method that imports it instead cannot.
    outputs = _run_notebook(
        kernel_manager,
        tmp_path,
        [
            """
            import pickle
            from aioload import DataLoader

            class Squares:
                def __len__(self):
                    return 8

                def __getitem__(self, index):
                    return index * index

            loader = DataLoader(Squares(), batch_size=4, num_workers=2)
            print([batch.tolist() for batch in loader])
            """,
            """
            try:
                loader = DataLoader(
                    Squares(), batch_size=4, num_workers=2, multiprocessing_context="forkserver"
                )
                next(iter(loader))
            except pickle.PicklingError as error:
                print(error)
            """,
            # or no workers
            """
            print([batch.tolist() for batch in DataLoader(Squares(), batch_size=4)])
            """,
        ],
    )
    assert _stdout(outputs[0]) == "[[0, 1, 4, 9], [16, 25, 36, 49]]\n"
    message = _stdout(outputs[1])
    assert message.startswith("cannot send dataset (__main__.Squares) to the worker processes")
    assert "'forkserver'" in message
    assert "Define it in a module" in message
    assert "multiprocessing_context='fork'" in message
    assert _stdout(outputs[2]) == "[[0, 1, 4, 9], [16, 25, 36, 49]]\n"


# A slow dataset in a module of the kernel's working directory, so workers can import it.
_SLOW_MODULE = """
import time

class Slow:
    def __len__(self):
        return 10_000

    def __getitem__(self, index):
        time.sleep(0.05)
        return index
"""


def _execute(client: BlockingKernelClient, code: str, **kwargs: Any) -> tuple[str, dict[str, Any]]:
    """Runs ``code`` in the kernel: its stdout and its reply's content."""
    printed: list[str] = []
    hook = kwargs.pop("output_hook", None)

    def collect(message: dict[str, Any]) -> None:
        if message["msg_type"] == "stream" and message["content"]["name"] == "stdout":
            printed.append(message["content"]["text"])
        if hook is not None:
            hook(message)

    reply = client.execute_interactive(code, output_hook=collect, timeout=60, **kwargs)
    return "".join(printed), reply["content"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_interrupting_the_kernel_stops_a_for_and_leaves_nothing_running(
    kernel_manager: KernelManager, kernel: BlockingKernelClient, tmp_path: Path, num_workers: int
) -> None:
    (tmp_path / "slowdata.py").write_text(_SLOW_MODULE)
    code = f"""
from aioload import DataLoader
from slowdata import Slow
for batch in DataLoader(Slow(), batch_size=2, num_workers={num_workers}):
    print("batch", batch.tolist(), flush=True)
"""
    interrupted = []

    def interrupt_after_first_batch(message: dict[str, Any]) -> None:
        if message["msg_type"] == "stream" and not interrupted:
            interrupted.append(True)
            kernel_manager.interrupt_kernel()  # SIGINT, as Jupyter's stop button

    printed, reply = _execute(kernel, code, output_hook=interrupt_after_first_batch)
    assert interrupted
    assert printed.startswith("batch [0, 1]\n")
    assert reply["status"] == "error"
    assert reply["ename"] == "KeyboardInterrupt"
    printed, reply = _execute(kernel, _LEFTOVERS)
    assert reply["status"] == "ok"
    assert printed == "threads [] children []\n"
    # and the kernel still iterates
    printed, _ = _execute(
        kernel, "print([b.tolist() for b in DataLoader(list(range(4)), batch_size=2)])"
    )
    assert printed == "[[0, 1], [2, 3]]\n"
