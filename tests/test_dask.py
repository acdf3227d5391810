"""``DataLoader(executor=client.get_executor(pure=False))`` on a real dask cluster.

One ``LocalCluster`` for the module: two worker processes (with nannies, which
restart a killed worker) on 127.0.0.1 only, no dashboard; closed at the end,
and its processes are checked to be gone. Datasets live at module level: dask
pickles them (the workers import this module).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

import distributed
import numpy as np
import pytest

import aioload
from aioload import DataLoader

pytestmark = pytest.mark.slow

# -- datasets ------------------------------------------------------------------

_inits = 0  # worker_init_fn calls in this (worker) process


def count_init(worker_id: int) -> None:
    global _inits
    _inits += 1


class WhereAmI(aioload.Dataset):
    def __init__(self, n: int, delay: float = 0.0) -> None:
        self.n, self.delay = n, delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[int, int, int, int, int, int]:
        if self.delay:
            import time

            time.sleep(self.delay)
        info = aioload.get_worker_info()
        assert info is not None
        return index, os.getpid(), info.id, info.num_workers, id(self), _inits


class AsyncItems(aioload.Dataset):
    def __len__(self) -> int:
        return 32

    async def __getitem__(self, index: int) -> tuple[int, int, int]:
        await asyncio.sleep(0.001)
        return index, id(asyncio.get_running_loop()), threading.get_ident()


class Failing(aioload.Dataset):
    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> int:
        if index == 9:
            raise LookupError(f"object {index} is missing")
        return index


# -- the cluster ---------------------------------------------------------------


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    cluster = distributed.LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        # Not None: the scheduler's HTTP server would still listen, on port 8787.
        dashboard_address="127.0.0.1:0",
        scheduler_kwargs={"dashboard": False},
    )
    client = distributed.Client(cluster)
    pids: dict[str, int] = {}
    try:
        assert cluster.scheduler_address.startswith("tcp://127.0.0.1:")
        assert cluster.dashboard_link.startswith("http://127.0.0.1:")  # the health routes
        workers = client.scheduler_info(n_workers=-1)["workers"]
        assert len(workers) == 2
        assert all(address.startswith("tcp://127.0.0.1:") for address in workers)
        yield client
        pids = client.run(os.getpid)
    finally:
        client.close()
        cluster.close()
    for pid in pids.values():  # nothing is left running
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


@pytest.fixture
def executor(client: Any) -> Any:
    return client.get_executor(pure=False)


# -- tests -----------------------------------------------------------------------


def test_pure_executors_are_refused(client: Any) -> None:
    with pytest.raises(ValueError, match=r"pure=True.*get_executor\(pure=False\)"):
        DataLoader(WhereAmI(8), executor=client.get_executor())


def test_every_sample_once_with_worker_info_and_setup_once(executor: Any) -> None:
    dataset = WhereAmI(64)
    loader = DataLoader(
        dataset,
        batch_size=4,
        shuffle=True,
        generator=7,
        executor=executor,
        worker_init_fn=count_init,
    )
    assert loader.window == 4  # 2 per dask thread
    epochs: list[dict[int, int]] = []
    for _ in range(2):
        samples = [s for batch in loader for s in zip(*batch, strict=True)]
        assert sorted(int(s[0]) for s in samples) == list(range(64))
        ids = {int(s[1]): int(s[2]) for s in samples}
        assert set(ids.values()) <= {0, 1}  # LocalCluster's worker names
        assert len(set(ids.values())) == len(ids)
        assert {int(s[3]) for s in samples} == {2}
        # 16 tasks, one setup per worker and epoch: every task of a worker reads the same
        # copy of the dataset, after the same single worker_init_fn call.
        seen: dict[int, set[tuple[int, int]]] = {}
        for s in samples:
            seen.setdefault(int(s[1]), set()).add((int(s[4]), int(s[5])))
        assert all(len(setups) == 1 for setups in seen.values())
        inits = {pid: next(iter(setups))[1] for pid, setups in seen.items()}
        for pid, count in inits.items():  # once per epoch
            assert count == (epochs[-1].get(pid, 0) if epochs else 0) + 1
        epochs.append(inits)


def test_async_items_on_one_loop_per_worker_thread(executor: Any) -> None:
    samples = [
        s
        for _ in range(2)
        for batch in DataLoader(AsyncItems(), batch_size=8, executor=executor)
        for s in zip(*batch, strict=True)
    ]
    assert sorted(int(s[0]) for s in samples) == sorted(list(range(32)) * 2)
    loops: dict[int, set[int]] = {}
    for _, loop, thread in samples:
        loops.setdefault(int(thread), set()).add(int(loop))
    assert all(len(seen) == 1 for seen in loops.values())


def test_errors_keep_their_type_and_name_keys_and_worker(executor: Any) -> None:
    with pytest.raises(LookupError, match="object 9 is missing") as caught:
        list(DataLoader(Failing(), batch_size=4, executor=executor))
    notes = "\n".join(caught.value.__notes__)
    assert "keys [8, 9, 10, 11]" in notes
    assert "dask worker" in notes


def cancel_batches_in_flight(client: Any) -> int:
    """Cancels every batch task the cluster holds, as dask does when a result is lost."""
    keys = [key for key in list(client.futures) if str(key).startswith("run_batch")]
    client.cancel([distributed.Future(key, client) for key in keys])
    return len(keys)


def test_batches_dask_gives_up_are_submitted_again(client: Any, executor: Any) -> None:
    def loader(restarts: int) -> DataLoader:
        dataset = WhereAmI(64, delay=0.005)
        return DataLoader(dataset, batch_size=4, executor=executor, max_worker_restarts=restarts)

    keys: list[int] = []
    cancelled = 0
    for step, batch in enumerate(loader(16)):
        keys.extend(int(k) for k in batch[0])
        if step >= 2 and not cancelled:
            cancelled = cancel_batches_in_flight(client)
    assert cancelled
    assert sorted(keys) == list(range(64))
    # Past max_worker_restarts the batch fails, naming its keys.
    with pytest.raises(concurrent.futures.CancelledError, match="max_worker_restarts=0") as caught:
        for step, _ in enumerate(loader(0)):
            if step >= 2:
                cancel_batches_in_flight(client)
    assert any("keys [" in note for note in caught.value.__notes__)


def test_a_task_dask_gave_up_is_resubmitted_and_counted_as_a_restart(
    executor: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # dask cancels a task whose result died with its worker; the backend submits the batch
    # again. Stand in for that loss on batch 2's first submission, deterministically.
    from aioload.backends.executor import ExecutorBackend

    submit = ExecutorBackend._submit_to_dask
    lost: list[int] = []

    def losing_batch_two(self: Any, seq: int, args: tuple[Any, ...]) -> Any:
        if seq == 2 and not lost:
            lost.append(seq)
            gone: concurrent.futures.Future[Any] = concurrent.futures.Future()
            gone.cancel()
            return gone
        return submit(self, seq, args)

    monkeypatch.setattr(ExecutorBackend, "_submit_to_dask", losing_batch_two)
    loader = DataLoader(WhereAmI(24), batch_size=4, executor=executor)
    keys = [int(k) for batch in loader for k in batch[0]]
    assert keys == list(range(24))
    assert lost == [2]
    assert loader.stats().epoch.worker_restarts == 1


def test_a_killed_worker_loses_no_sample(client: Any, executor: Any) -> None:
    # Runs last: the cluster's nanny restarts the killed worker.
    pids = client.run(os.getpid)
    victim = next(iter(pids.values()))
    loader = DataLoader(WhereAmI(160, delay=0.005), batch_size=4, executor=executor)
    keys = []
    for step, batch in enumerate(loader):
        keys.extend(int(k) for k in batch[0])
        if step == 4:
            os.kill(victim, signal.SIGKILL)
    assert sorted(keys) == list(range(160))
    client.wait_for_workers(2, timeout=30)
    assert victim not in client.run(os.getpid).values()  # it was killed and replaced
    np.testing.assert_array_equal(
        np.concatenate([b[0] for b in DataLoader(WhereAmI(8), batch_size=4, executor=executor)]),
        np.arange(8),
    )
