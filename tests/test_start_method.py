"""How worker processes start: the rule of ``aioload.backends.processes.start_method``.

Scripts run as subprocesses, each in a fresh interpreter: how workers start
depends on the process's start method, its threads and the runtimes it has
started, and the test process has its own. A worker tells how it was started
by its parent: a forked worker's parent is the loader's process, a fork
server's worker's is the server, a fork template's worker's is the template.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import subprocess
import sys
import textwrap
import threading
import types
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from aioload import DataLoader, Dataset, get_worker_info
from aioload.backends.processes import fork_template, start_method
from aioload.backends.processes.start_method import other_threads, worker_start

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
def test_an_async_for_forks_on_the_loop_thread(tmp_path: Path) -> None:
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


_HOLDS_A_LOCK = """
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
        loader = DataLoader(Reads(), batch_size=4, num_workers=2OPTIONS)
        parents = {int(p) for batch in loader for p in batch}
        print("forked" if parents == {os.getpid()} else "not forked")
    finally:
        release.set()
        holder.join()
"""


@pytest.mark.timeout(120)
def test_a_logging_lock_held_by_another_thread_does_not_hang_a_forked_worker(
    tmp_path: Path,
) -> None:
    # The thread does not change the start method (nor torch's), and Python
    # re-creates logging's locks in a forked child.
    source = _HOLDS_A_LOCK.replace("HELD", "logging").replace("OPTIONS", "")
    done = run_script(tmp_path, source)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["forked"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("held", ["lock", "queue"])
def test_a_lock_held_by_another_thread_never_hangs_a_fork_server_worker(
    tmp_path: Path, held: str
) -> None:
    # A fork copies a lock another thread holds, held, into the worker, as under torch:
    # a script whose threads hold their own locks starts its workers from the fork server.
    options = ", multiprocessing_context='forkserver'"
    done = run_script(tmp_path, _HOLDS_A_LOCK.replace("HELD", held).replace("OPTIONS", options))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["not", "forked"]


@pytest.mark.timeout(120)
def test_a_guardless_script_with_another_thread_runs_with_forked_workers(tmp_path: Path) -> None:
    # A metrics exporter, a logging QueueListener, tqdm's monitor: any Python thread.
    source = guardless().replace(
        "loader = DataLoader",
        "import threading\nstop = threading.Event()\n"
        "threading.Thread(target=stop.wait, daemon=True, name='metrics').start()\n"
        "loader = DataLoader",
    )
    done = run_script(tmp_path, source)
    assert done.returncode == 0, done.stderr
    squares = str([i * i for i in range(40)])
    assert done.stdout.splitlines() == [squares, "forked", squares, "forked"]
    assert "bootstrapping" not in done.stderr


# The most common loop in torch code, in a script without a guard: tqdm's monitor
# thread runs when the workers start. Rows are (float32[16], label) pairs.
TQDM_SCRIPT = """
import hashlib, os, threading
import numpy as np
from tqdm import tqdm
from {package} import DataLoader, Dataset

print("top level", flush=True)

class Pairs(Dataset):
    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, index):
        return self.rows[index], index % 10

rows = np.random.default_rng(0).random((200, 16), np.float32)
loader = DataLoader(Pairs(rows), batch_size=16, num_workers=2)
threads = []
for x, y in tqdm(loader, file=open(os.devnull, "w")):
    threads.append(threading.active_count())
    print(tuple(x.shape), hashlib.sha1(np.asarray(x).tobytes()).hexdigest(), y.tolist())
print("monitor ran", min(threads) > 1)
"""


@pytest.mark.timeout(120)
def test_a_guardless_tqdm_loop_yields_what_torch_yields(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    ours = run_script(tmp_path, TQDM_SCRIPT.format(package="aioload"))
    theirs = run_script(tmp_path, TQDM_SCRIPT.format(package="torch.utils.data"))
    assert ours.returncode == 0, ours.stderr
    assert theirs.returncode == 0, theirs.stderr
    lines = ours.stdout.splitlines()
    assert lines.count("top level") == 1  # the script ran once
    assert lines[-1] == "monitor ran True"
    assert len(lines) == 2 + 13  # 200 rows in batches of 16
    assert ours.stdout == theirs.stdout


_START_METHOD_SCRIPT = """
import multiprocessing, sys
import numpy as np
from {package} import DataLoader, Dataset

class WhereAmI(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, index):
        # A worker that ran the script again knows it as __mp_main__.
        return np.array(sys.modules["__main__"].__name__ == "__mp_main__")

if __name__ == "__main__":
    multiprocessing.set_start_method("{method}")
    loader = DataLoader(WhereAmI(), batch_size=2, num_workers=2)
    print([bool(x) for batch in loader for x in batch])
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", ["forkserver", pytest.param("spawn", marks=pytest.mark.slow)])
def test_set_start_method_is_honoured(tmp_path: Path, method: str) -> None:
    done = run_script(tmp_path, _START_METHOD_SCRIPT.format(package="aioload", method=method))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[True,", "True,", "True,", "True]"]


@pytest.mark.timeout(120)
def test_set_start_method_is_honoured_as_by_torch(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    script = _START_METHOD_SCRIPT.format(package="torch.utils.data", method="forkserver")
    theirs = run_script(tmp_path, script)
    ours = run_script(tmp_path, script.replace("torch.utils.data", "aioload"))
    assert theirs.returncode == 0, theirs.stderr
    assert ours.returncode == 0, ours.stderr
    assert ours.stdout == theirs.stdout


# A worker that dies is replaced mid-epoch, while aioload's loop thread runs.
_RESTART_SCRIPT = """
import os, signal, sys
import numpy as np
from aioload import DataLoader, Dataset

print("top level", flush=True)
MARK = sys.argv[1]

class KillsItsWorkerOnce(Dataset):
    def __len__(self):
        return 40

    def __getitem__(self, index):
        if index == 13 and not os.path.exists(MARK):
            open(MARK, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return np.array(index)

loader = DataLoader(KillsItsWorkerOnce(), batch_size=4, num_workers=2{options})
print(sorted(int(x) for batch in loader for x in batch) == list(range(40)))
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("options", ["", ", multiprocessing_context='fork'"])
def test_a_worker_restart_never_runs_the_script_again(tmp_path: Path, options: str) -> None:
    mark = tmp_path / "killed"
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(_RESTART_SCRIPT.format(options=options)))
    done = subprocess.run(
        [sys.executable, str(script), str(mark)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(_REPO)},
    )
    assert done.returncode == 0, done.stderr
    assert mark.exists()  # a worker was killed, and replaced
    assert done.stdout.splitlines() == ["top level", "True"]  # the script ran once


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


def test_another_thread_does_not_change_the_start_method(monkeypatch: pytest.MonkeyPatch) -> None:
    # Earlier tests of this process may have started obstore's runtime: that is not under test.
    monkeypatch.setattr(start_method, "named_native_threads", lambda: [])
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, name="other")
    thread.start()
    try:
        assert thread in other_threads()
        assert worker_start(None).method == "fork"
        assert not worker_start(None).in_the_way
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


def _objects_dir(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    for index in range(8):
        (tmp_path / "data" / f"{index}.bin").write_bytes(bytes([index]) * 8)


_OBJECTS = """
import os, sys
import numpy as np
import obstore
from obstore.store import LocalStore
from aioload import DataLoader, Dataset

print("top level", flush=True)

class Objects(Dataset):
    def __init__(self, root, kill_at=-1):
        self.root, self.kill_at = root, kill_at

    def __len__(self):
        return 8

    def __getitem__(self, index):
        if index == self.kill_at and not os.path.exists("killed"):
            open("killed", "w").close()
            os._exit(3)
        data = obstore.get(LocalStore(self.root), f"{index}.bin").bytes()
        return np.array([bytes(data)[0], os.getppid()])
"""


@pytest.mark.timeout(120)
def test_workers_are_not_forked_once_a_native_runtime_runs(tmp_path: Path) -> None:
    # obstore's first request starts tokio's threads, which a fork does not carry over:
    # a worker forked after it would hang at its own first request. Here the request
    # comes before any loader (no fork template yet): the fork server, and the guard.
    _objects_dir(tmp_path)
    source = (
        _OBJECTS
        + """
if __name__ == "__main__":
    root = os.path.abspath("data")
    obstore.get(LocalStore(root), "0.bin").bytes()  # the parent's runtime starts
    rows = [row.tolist() for batch in DataLoader(Objects(root), batch_size=2,
                                                 num_workers=2) for row in batch]
    print([row[0] for row in rows], all(row[1] != os.getpid() for row in rows))
"""
    )
    done = run_script(tmp_path, source)
    assert done.returncode == 0, done.stderr
    # Each fork server's worker runs the script again (its top level, not the guarded part).
    assert done.stdout.splitlines()[-1] == f"{list(range(8))} True"


@pytest.mark.timeout(120)
def test_a_guardless_script_whose_runtime_left_only_the_fork_server_gets_one_clear_error(
    tmp_path: Path,
) -> None:
    _objects_dir(tmp_path)
    source = (
        _OBJECTS
        + """
root = os.path.abspath("data")
obstore.get(LocalStore(root), "0.bin").bytes()  # before any loader
print(list(DataLoader(Objects(root), batch_size=2, num_workers=2)))
"""
    )
    done = run_script(tmp_path, source)
    assert done.returncode == 1
    assert done.stderr.count("Traceback") == 1, done.stderr
    assert 'if __name__ == "__main__":' in done.stderr
    assert "'tokio-rt-worker'" in done.stderr  # what stood in the way
    assert "make the DataLoader before the script's first object-store request" in done.stderr


@pytest.mark.timeout(120)
def test_a_guardless_script_that_starts_a_runtime_after_its_loader_gets_workers_anyway(
    tmp_path: Path,
) -> None:
    # The loader was made before obstore's first request: its workers, the restarted one
    # included, come from the fork template forked then, and the script never runs again.
    _objects_dir(tmp_path)
    source = (
        _OBJECTS
        + """
root = os.path.abspath("data")
loader = DataLoader(Objects(root, kill_at=5), batch_size=2, num_workers=2)
obstore.get(LocalStore(root), "0.bin").bytes()  # the parent's runtime starts now
for epoch in range(2):
    rows = [row.tolist() for batch in loader for row in batch]
    parents = {row[1] for row in rows}
    print(sorted(row[0] for row in rows), len(parents), os.getpid() in parents)
"""
    )
    done = run_script(tmp_path, source)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "killed").exists()  # a worker died and was replaced
    every = str(list(range(8)))
    # One parent for every worker, the replacement included: the template, not the loader.
    assert done.stdout.splitlines() == ["top level", f"{every} 1 False", f"{every} 1 False"]


def test_named_native_threads_stand_in_the_way(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(start_method, "named_native_threads", lambda: ["tokio-rt-worker"])
    monkeypatch.setattr(fork_template, "current", lambda: None)
    assert start_method.runtimes_in_the_way() == ["tokio-rt-worker"]
    start = worker_start(None)
    assert start.fallback and start.method == "forkserver" and start.runs_main
    assert start.in_the_way == ("tokio-rt-worker",)
    # Named by the user, fork is fork.
    assert worker_start(multiprocessing.get_context("fork")).method == "fork"


def test_other_named_native_threads_do_not(monkeypatch: pytest.MonkeyPatch) -> None:
    # libzmq's, in every Jupyter kernel: torch forks from there, and so does aioload.
    monkeypatch.setattr(start_method, "named_native_threads", lambda: ["ZMQbg/IO/0"])
    assert start_method.runtimes_in_the_way() == []
    assert worker_start(None).method == "fork"


class _FakeTorch(types.ModuleType):
    """What the rule reads of torch: its build's CUDA version, and whether CUDA is initialised."""

    def __init__(self, initialised: bool) -> None:
        super().__init__("torch")
        self.version = types.SimpleNamespace(cuda="12.8", hip=None)
        self.cuda = types.SimpleNamespace(is_initialized=lambda: self.initialised)
        self.initialised = initialised


@pytest.fixture
def own_template() -> Iterator[None]:
    """This test's fork templates: whatever it forks is stopped, and the process's is kept."""
    kept = fork_template._template
    fork_template._template = None
    try:
        yield
    finally:
        made, fork_template._template = fork_template._template, kept
        if made is not None:
            made.close()
            process = made._process
            process.join(5)
            assert process.exitcode is not None, "the fork template did not exit"


def test_cuda_alone_forks_as_torch_does(
    monkeypatch: pytest.MonkeyPatch, own_template: None
) -> None:
    monkeypatch.setitem(sys.modules, "torch", _FakeTorch(initialised=True))
    # Earlier tests of this process may have started obstore's runtime: CUDA alone is tested.
    monkeypatch.setattr(start_method, "named_native_threads", lambda: [])
    assert start_method.cuda_initialised()
    assert start_method.runtimes_in_the_way() == [start_method.CUDA]
    start = worker_start(None)
    # No template made before CUDA started: forked all the same, as torch does.
    assert start.method == "fork" and not start.fallback


@pytest.mark.timeout(60)
def test_workers_come_from_the_template_once_cuda_is_initialised(
    monkeypatch: pytest.MonkeyPatch, own_template: None
) -> None:
    cuda = {"initialised": False}
    # A CUDA build of torch, imported; no GPU here, so its initialisation is pretended.
    monkeypatch.setattr(start_method, "runtime_may_start", lambda: True)
    monkeypatch.setattr(start_method, "cuda_initialised", lambda: cuda["initialised"])
    monkeypatch.setattr(start_method, "named_native_threads", lambda: [])
    loader = DataLoader(_Parents(), batch_size=2, num_workers=2)  # the template is forked
    template = fork_template.current()
    assert template is not None and template.pid is not None
    cuda["initialised"] = True  # model.cuda(), say
    assert worker_start(None).method == "template"
    parents = {int(parent) for batch in loader for parent in batch}
    assert parents == {template.pid}
    # A second epoch, and a second loader, from the same template.
    assert {int(parent) for batch in loader for parent in batch} == {template.pid}
    second = DataLoader(_Parents(), batch_size=2, num_workers=1)
    assert {int(parent) for batch in second for parent in batch} == {template.pid}


class _Parents(Dataset[np.ndarray]):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> np.ndarray:
        return np.array(os.getppid())


def test_a_template_is_stale_once_a_class_of_the_script_is_defined_again(
    monkeypatch: pytest.MonkeyPatch, own_template: None
) -> None:
    main = sys.modules["__main__"]
    monkeypatch.setattr(main, "Transform", type("Transform", (), {}), raising=False)
    template = fork_template.replace()
    assert template.fresh() and template.complete()
    monkeypatch.setattr(main, "Transform", type("Transform", (), {}))  # a cell run again
    assert not template.fresh()
    monkeypatch.setattr(start_method, "runtimes_in_the_way", lambda: ["tokio-rt-worker"])
    assert worker_start(None).method == "forkserver"  # a stale template is not used


def test_a_template_serves_only_what_it_can_find_in_main(
    monkeypatch: pytest.MonkeyPatch, own_template: None
) -> None:
    main = sys.modules["__main__"]
    old = type("Old", (), {"__module__": "__main__"})
    monkeypatch.setattr(main, "Old", old, raising=False)
    template = fork_template.replace()
    new = type("New", (), {"__module__": "__main__"})
    monkeypatch.setattr(main, "New", new, raising=False)  # defined after the template's fork
    assert template.fresh() and not template.complete()
    monkeypatch.setattr(start_method, "runtimes_in_the_way", lambda: ["tokio-rt-worker"])
    assert worker_start(None, {"dataset": old()}).method == "template"
    # Its workers could not unpickle a New: the fork server it is (with its guard check).
    start = worker_start(None, {"dataset": old(), "collate_fn": new})
    assert start.method == "forkserver" and start.fallback
    # While forking is still safe, a template that lacks a name is forked again.
    monkeypatch.setattr(start_method, "runtimes_in_the_way", lambda: [])
    monkeypatch.setattr(start_method, "runtime_may_start", lambda: True)
    start_method.keep_template_ready(None)
    again = fork_template.current()
    assert again is not None and again is not template and again.complete()
    template._process.join(5)
    assert template._process.exitcode is not None  # the old one retired (no workers left)


@pytest.mark.timeout(120)
def test_a_package_main_is_not_run_again_so_needs_no_guard(tmp_path: Path) -> None:
    # `python -m package` runs package/__main__.py in the main process only: workers that run
    # the main module again (set_start_method("forkserver")) never iterate it again.
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
            import multiprocessing
            from aioload import DataLoader
            from trainer.data import Squares

            multiprocessing.set_start_method("forkserver")
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
