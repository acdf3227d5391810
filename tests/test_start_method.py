"""How worker processes start: forked where that is safe, the fork server otherwise.

Scripts run as subprocesses, each in a fresh interpreter: whether a fork is
safe depends on every thread of the process, and the test process has its own.
A worker tells how it was started by its parent: a forked worker's parent is
the loader's process, a fork server's worker's is the server.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

from aioload import DataLoader, Dataset, get_worker_info
from aioload.backends import start_method
from aioload.backends.start_method import auto_start_method, fork_is_safe, other_threads

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="aioload forks only on Linux")

_REPO = Path(__file__).resolve().parent.parent

# A torch-style script: the Dataset in the script, no __main__ guard.
GUARDLESS = """
import os
import numpy as np
from {package} import DataLoader, Dataset

class Squares(Dataset):
    def __len__(self):
        return 40

    def __getitem__(self, index):
        return np.array([index * index, os.getppid() == {loader_pid}])

loader = DataLoader(Squares(), batch_size=8, num_workers=2{options})
for epoch in range(2):
    batches = [batch.tolist() for batch in loader]
    print([row[0] for batch in batches for row in batch])
    print("forked" if all(row[1] for batch in batches for row in batch) else "not forked")
"""


def run_script(tmp_path: Path, source: str, *flags: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(source))
    env = {**os.environ, "PYTHONPATH": str(_REPO)}
    return subprocess.run(
        [sys.executable, *flags, str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=env,
    )


def guardless(package: str = "aioload", options: str = "") -> str:
    # The workers compare their parent with the loader's pid, known only at run time.
    source = GUARDLESS.format(package=package, options=options, loader_pid="LOADER_PID")
    return "import os\nLOADER_PID = os.getpid()\n" + source


@pytest.mark.timeout(120)
def test_a_guardless_script_runs_with_forked_workers(tmp_path: Path) -> None:
    done = run_script(tmp_path, guardless(), "-W", "always")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    squares = str([i * i for i in range(40)])
    assert lines == [squares, "forked", squares, "forked"]
    # Python 3.12's warning about forking a multi-threaded process never shows.
    assert "multi-threaded" not in done.stderr
    assert "bootstrapping" not in done.stderr


@pytest.mark.timeout(120)
def test_a_guardless_script_yields_what_torch_yields(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    ours = run_script(tmp_path, guardless())
    torch_source = guardless("torch.utils.data").replace("batch.tolist()", "batch.numpy().tolist()")
    theirs = run_script(tmp_path, torch_source)
    assert ours.returncode == 0, ours.stderr
    assert theirs.returncode == 0, theirs.stderr
    assert ours.stdout == theirs.stdout


@pytest.mark.timeout(120)
def test_an_async_for_forks_on_the_loop_thread_when_nothing_else_runs(tmp_path: Path) -> None:
    source = """
    import asyncio, os
    import numpy as np
    from aioload import DataLoader, Dataset

    LOADER_PID = os.getpid()

    class Parents(Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, index):
            return np.array(os.getppid())

    async def main():
        loader = DataLoader(Parents(), batch_size=4, num_workers=2)
        parents = {int(p) for batch in [b async for b in loader] for p in batch}
        print(parents == {LOADER_PID})

    if __name__ == "__main__":
        asyncio.run(main())
    """
    done = run_script(tmp_path, source, "-W", "always")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True"]
    assert "multi-threaded" not in done.stderr


@pytest.mark.timeout(120)
@pytest.mark.parametrize("held", ["lock", "logging", "queue"])
def test_a_lock_held_by_another_thread_never_hangs_a_worker(tmp_path: Path, held: str) -> None:
    # Forking now would copy the held lock, locked, into every worker, and the
    # worker's first read would wait for it for ever: the fork server it is.
    source = """
    import logging, os, queue, threading
    import numpy as np
    from aioload import DataLoader, Dataset

    LOCK = threading.Lock()
    QUEUE = queue.Queue()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    LOG = logging.getLogger("data")

    class Reads(Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, index):
            with LOCK:
                pass
            LOG.info("read %d", index)   # takes the handler's lock
            QUEUE.put(index)             # takes the queue's mutex
            return np.array(os.getppid())

    def hold(taken, release):
        lock = {"lock": LOCK, "logging": logging.getLogger().handlers[0].lock,
                "queue": QUEUE.mutex}["HELD"]
        with lock:
            taken.set()
            release.wait()

    if __name__ == "__main__":
        taken, release = threading.Event(), threading.Event()
        holder = threading.Thread(target=hold, args=(taken, release))
        holder.start()
        taken.wait()
        try:
            loader = DataLoader(Reads(), batch_size=4, num_workers=2)
            parents = {int(p) for batch in loader for p in batch}
            print("forked" if parents == {os.getpid()} else "fork server")
        finally:
            release.set()
            holder.join()
    """.replace("HELD", held)
    done = run_script(tmp_path, source, "-W", "always")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["fork", "server"]
    assert "multi-threaded" not in done.stderr


@pytest.mark.timeout(120)
def test_a_guardless_script_that_cannot_fork_gets_one_clear_error(tmp_path: Path) -> None:
    source = guardless().replace(
        "loader = DataLoader",
        "import threading\nstop = threading.Event()\n"
        "threading.Thread(target=stop.wait, daemon=True, name='metrics').start()\n"
        "loader = DataLoader",
    )
    done = run_script(tmp_path, source)
    assert done.returncode == 1
    assert done.stderr.count("Traceback") == 1, done.stderr
    assert 'if __name__ == "__main__":' in done.stderr
    assert "'metrics'" in done.stderr  # the thread that stood in the way
    assert "bootstrapping" not in done.stderr
    assert "WorkerCrashedError" not in done.stderr


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_guardless_script_with_a_method_that_reruns_it_gets_one_clear_error(
    tmp_path: Path, method: str
) -> None:
    done = run_script(tmp_path, guardless(options=f", multiprocessing_context={method!r}"))
    assert done.returncode == 1
    assert done.stderr.count("Traceback") == 1, done.stderr
    assert f"workers start with {method!r}" in done.stderr
    assert re.search(r"at its top level \(line 17\)", done.stderr)  # the loop there
    assert "bootstrapping" not in done.stderr


@pytest.mark.timeout(120)
def test_a_class_defined_under_the_guard_is_refused_before_workers_start(tmp_path: Path) -> None:
    source = """
    import numpy as np
    from aioload import DataLoader, Dataset

    if __name__ == "__main__":
        class Hidden(Dataset):
            def __len__(self):
                return 4

            def __getitem__(self, index):
                return np.array(index)

        loader = DataLoader(Hidden(), batch_size=2, num_workers=1,
                            multiprocessing_context="spawn")
        print(list(loader))
    """
    done = run_script(tmp_path, source)
    assert done.returncode == 1
    assert done.stderr.count("Traceback") == 1, done.stderr
    assert "defines Hidden only under its `if __name__" in done.stderr
    assert "WorkerCrashedError" not in done.stderr


@pytest.mark.timeout(120)
def test_multiprocessing_context_still_overrides(tmp_path: Path) -> None:
    source = guardless().replace(
        "loader = DataLoader", "if __name__ == '__main__':\n    loader = DataLoader"
    )
    source = source.replace(
        "\nfor epoch in range(2):\n    batches", "\n    for epoch in range(2):\n        batches"
    )
    source = source.replace("\n    print([row", "\n        print([row").replace(
        '\n    print("forked"', '\n        print("forked"'
    )
    source = source.replace(
        "num_workers=2)", "num_workers=2, multiprocessing_context='forkserver')"
    )
    done = run_script(tmp_path, source)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1::2] == ["not forked", "not forked"]


def test_fork_is_unsafe_while_another_thread_runs() -> None:
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, name="other")
    thread.start()
    try:
        assert thread in other_threads()
        assert not fork_is_safe()
        assert auto_start_method() == "forkserver"
    finally:
        stop.set()
        thread.join()


class _WorkerOfItem(Dataset[np.ndarray]):
    """Item ``i`` is ``(i, worker id)``; worker 0 stalls for a second on its first item."""

    def __init__(self) -> None:
        self.stalled = False

    def __len__(self) -> int:
        return 40

    def __getitem__(self, index: int) -> np.ndarray:
        info = get_worker_info()
        assert info is not None
        if info.id == 0 and not self.stalled:
            self.stalled = True  # this worker's copy
            import time

            time.sleep(1.0)
        return np.array([index, info.id])


@pytest.mark.timeout(60)
def test_out_of_order_a_stalled_worker_holds_back_only_its_own_batches() -> None:
    loader = DataLoader(_WorkerOfItem(), batch_size=2, num_workers=2, in_order=False)
    workers = [int(batch[0, 1]) for batch in loader]
    assert sorted(workers).count(0) >= 1
    first_zero = workers.index(0)
    # Every batch of worker 1 comes before any of the stalled worker's.
    assert all(worker == 0 for worker in workers[first_zero:]), workers
    assert workers.count(1) > len(workers) // 2  # worker 1 took what worker 0 could not


@pytest.mark.timeout(60)
def test_in_order_batches_still_go_round_robin() -> None:
    loader = DataLoader(_WorkerOfItem(), batch_size=2, num_workers=2)
    workers = [int(batch[0, 1]) for batch in loader]
    assert workers == [0, 1] * 10


@pytest.mark.timeout(120)
def test_workers_are_not_forked_once_a_native_runtime_runs(tmp_path: Path) -> None:
    # obstore's first request starts tokio's threads, which a fork does not carry over:
    # a worker forked after it would hang at its own first request.
    (tmp_path / "data").mkdir()
    for index in range(4):
        (tmp_path / "data" / f"{index}.bin").write_bytes(bytes([index]) * 8)
    source = """
    import os
    import numpy as np
    import obstore
    from obstore.store import LocalStore
    from aioload import DataLoader, Dataset

    class Objects(Dataset):
        def __init__(self, root):
            self.root = root

        def __len__(self):
            return 4

        def __getitem__(self, index):
            data = obstore.get(LocalStore(self.root), f"{index}.bin").bytes()
            return np.array([bytes(data)[0], os.getppid()])

    if __name__ == "__main__":
        root = os.path.abspath("data")
        obstore.get(LocalStore(root), "0.bin").bytes()  # the parent's runtime starts
        rows = [row.tolist() for batch in DataLoader(Objects(root), batch_size=2,
                                                     num_workers=2) for row in batch]
        print([row[0] for row in rows], all(row[1] != os.getpid() for row in rows))
    """
    done = run_script(tmp_path, source)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[0,", "1,", "2,", "3]", "True"]


def test_named_native_threads_make_a_fork_unsafe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(start_method, "named_native_threads", lambda: ["tokio-rt-worker"])
    assert not start_method.fork_is_safe()
    assert "tokio-rt-worker" in start_method.threads_in_the_way()


@pytest.mark.timeout(120)
def test_a_package_main_is_not_run_again_so_needs_no_guard(tmp_path: Path) -> None:
    # `python -m package` runs package/__main__.py in the main process only: workers from the
    # fork server (a thread runs) never iterate it again, and nothing is refused.
    package = tmp_path / "trainer"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "data.py").write_text(
        textwrap.dedent(
            """
            import numpy as np
            from aioload import Dataset

            class Squares(Dataset):
                def __len__(self):
                    return 8

                def __getitem__(self, index):
                    return np.array(index * index)
            """
        )
    )
    (package / "__main__.py").write_text(
        textwrap.dedent(
            """
            import threading
            from aioload import DataLoader
            from trainer.data import Squares

            stop = threading.Event()
            threading.Thread(target=stop.wait, daemon=True, name="metrics").start()
            print([int(x) for batch in DataLoader(Squares(), batch_size=4, num_workers=2)
                   for x in batch])
            """
        )
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(_REPO), str(tmp_path)])}
    done = subprocess.run(
        [sys.executable, "-m", "trainer"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[0,", "1,", "4,", "9,", "16,", "25,", "36,", "49]"]
