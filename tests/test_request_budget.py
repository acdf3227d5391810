"""The request budget (``max_requests_per_second=``): turns spaced by 1/rate, shared by every
copy of a dataset (pickled to worker processes), so that four workers together stay within
the rate the ObjectServer sees over any 1-second window; its file goes with its maker."""

from __future__ import annotations

import gc
import itertools
import os
import pickle
import struct
import time
from pathlib import Path

import pytest

from aioload import DataLoader
from aioload.sources import ObjectDataset
from aioload.sources.stores.budget import RequestBudget
from aioload.testing import ObjectServer
from aioload.testing.arrivals import most_in_window


def test_turns_are_spaced_by_one_over_the_rate() -> None:
    budget = RequestBudget(100)
    waits = [budget.reserve() for _ in range(5)]
    # each turn 10 ms after the previous one, less the microseconds between the calls
    assert all(later > earlier for earlier, later in itertools.pairwise(waits))
    assert waits[4] - waits[0] > 0.035
    budget.close()


def test_threads_sharing_one_budget_take_turns_each_their_own() -> None:
    # one open file for every thread: the flock alone would not keep their turns apart
    import threading

    budget = RequestBudget(10)  # turns 0.1 s apart; reserve() only takes them, waits not
    before = time.monotonic()

    def take() -> None:
        for _ in range(500):
            budget.reserve()

    threads = [threading.Thread(target=take) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    with open(budget.path, "rb") as file:
        (next_turn,) = struct.unpack("d", file.read(8))
    # 2000 turns, none lost to another thread's update: the next is 200 s after the first
    assert before + 200 <= next_turn <= time.monotonic() + 200
    budget.close()


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded")  # 3.12+: the child
def test_a_forked_copy_opens_the_file_anew() -> None:  # only takes a turn and exits
    # a lock belongs to an open file: sharing the parent's would exclude nothing
    budget = RequestBudget(10)
    descriptor = budget._descriptor
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its own descriptor, and the maker's file left in place
        try:
            budget.reserve()
            os.write(write, b"1" if budget._descriptor != descriptor else b"0")
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 1) == b"1"
    assert budget.reserve() > 0.05  # after the child's turn
    assert os.path.exists(budget.path)
    budget.close()


def test_a_copy_takes_its_turns_from_the_same_budget() -> None:
    budget = RequestBudget(10)
    copy = pickle.loads(pickle.dumps(budget))
    assert copy.path == budget.path
    first = budget.reserve()
    assert copy.reserve() > first + 0.05  # the copy's turn comes after the maker's
    path = budget.path
    del copy
    gc.collect()
    assert os.path.exists(path)  # a copy leaves the maker's file
    del budget
    gc.collect()
    assert not os.path.exists(path)  # the maker removes it


@pytest.mark.parametrize("rate", [0, -5, True, "10", float("inf")])
def test_a_bad_rate_is_refused(rate: object) -> None:
    with pytest.raises(ValueError, match="max_requests_per_second"):
        ObjectDataset("memory:///x/", keys=["a"], max_requests_per_second=rate)  # type: ignore[arg-type]


RATE = 40
OBJECTS = 120


@pytest.mark.slow  # four worker processes
@pytest.mark.timeout(120)
@pytest.mark.filterwarnings("ignore:This DataLoader will create")  # 4 workers on 2 cores
def test_four_workers_share_one_budget(tmp_path: Path) -> None:
    # forkserver: each worker unpickles its copy of the budget (forked copies are
    # test_a_forked_copy_opens_the_file_anew's; forked workers of a process that has
    # already read through obstore hang, with or without a budget)
    (tmp_path / "objects").mkdir()
    keys = [f"{i:04d}.bin" for i in range(OBJECTS)]
    for i, key in enumerate(keys):
        (tmp_path / "objects" / key).write_bytes(bytes([i % 251]) * 64)
    with ObjectServer(tmp_path) as server:
        dataset = ObjectDataset(server.url + "/objects/", keys=keys, max_requests_per_second=RATE)
        loader = DataLoader(
            dataset,
            batch_size=5,
            num_workers=4,
            collate_fn=list,
            multiprocessing_context="forkserver",
        )
        got = [item for batch in loader for item in batch]
        arrivals = server.arrivals()
        stats = loader.stats().epoch
    assert got == [bytes([i % 251]) * 64 for i in range(OBJECTS)]
    assert len(arrivals) == OBJECTS == stats.store_requests
    # Four workers, one budget: not four times the rate (unbudgeted, all 120 requests arrive
    # within a second). The budget spaces the sends; the server's arrival times also carry
    # the scheduling jitter of five processes on a loaded machine, which can bunch a few
    # requests into one window (43 of 40 seen once): hence the slack over 1.05x. The
    # benchmark (benchmarks/bench_hedge.py) measures the 1.05x figure at 1,000 requests/s.
    assert most_in_window(arrivals) <= 1.25 * RATE
