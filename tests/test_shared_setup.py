"""The worker setup reaches workers shared, not copied, and multiprocessing's objects work in it.

Under ``forkserver`` and ``spawn`` a dataset's large arrays reach every worker
as read-only views of one ``memfd`` segment (no per-worker copy), small ones
inside the pickle; ``Value``, ``Lock`` and ``Semaphore`` made from the
loader's context are shared with the workers under every start method, as
with torch. The first tests look at :class:`SetupParcel` in this process; the
rest run loaders.

Datasets live at module level: workers start with ``forkserver`` or ``spawn``,
which pickle them.
"""

from __future__ import annotations

import fcntl
import gc
import multiprocessing
import multiprocessing.context
import multiprocessing.reduction
import os
import pickle
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import aioload
from aioload import DataLoader, SharedList
from aioload.backends.processes.setup_parcel import OUT_OF_BAND_MIN, SetupParcel, open_setup
from aioload.collate.core import default_collate
from aioload.read.reader import WorkerSetup
from tests.conftest import wait_until
from tests.mappings import address_of, in_setup_segment, new_segments, segments

BIG = 1 << 21  # float64 elements: a 16 MiB array
PICKLING = ["forkserver", pytest.param("spawn", marks=pytest.mark.slow)]
EVERY_METHOD = ["fork", *PICKLING]


def write_error(array: np.ndarray[Any, Any]) -> str:
    """The message writing into ``array`` raises ("" when the write succeeds, and is undone)."""
    try:
        array[0] = array[0]
    except ValueError as error:
        return str(error)
    return ""


# -- datasets ------------------------------------------------------------------------


class Probe(aioload.Dataset[dict[str, Any]]):
    """Each sample tells how the reading worker sees the dataset's arrays."""

    def __init__(self, n: int = 8, big: bool = True, victim: int = -1, marker: str = "") -> None:
        self.n = n
        self.big = np.arange(BIG, dtype=np.float64) if big else None
        self.small = np.arange(1000, dtype=np.int64)  # 8 KB: stays inside the pickle
        self.victim, self.marker = victim, marker

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> dict[str, Any]:
        if index == self.victim and not Path(self.marker).exists():
            Path(self.marker).write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
        sample: dict[str, Any] = {
            "pid": os.getpid(),
            "small_writeable": self.small.flags.writeable,
            "small_right": bool(self.small[index] == index),
        }
        if self.big is not None:
            sample.update(
                big_writeable=self.big.flags.writeable,
                big_write_error=write_error(self.big),
                big_shared=in_setup_segment(self.big),
                big_right=bool(self.big[index * 1000] == index * 1000 and self.big[-1] == BIG - 1),
            )
        return sample


class Shares(aioload.Dataset[dict[str, Any]]):
    """Counts its reads in a ``Value``; says whether its ``Lock`` and ``Semaphore`` were free.

    The test holds the lock and the semaphore while it iterates: a worker that
    shares them finds them taken; a worker with copies would find them free.
    """

    def __init__(self, context: multiprocessing.context.BaseContext, n: int = 8) -> None:
        self.n = n
        self.reads = context.Value("i", 0)
        self.lock = context.Lock()
        self.slots = context.Semaphore(1)
        self.big = np.arange(BIG, dtype=np.float64)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> dict[str, Any]:
        with self.reads.get_lock():
            self.reads.value += 1
        lock_free = self.lock.acquire(timeout=0.01)
        if lock_free:
            self.lock.release()
        slot_free = self.slots.acquire(timeout=0.01)
        if slot_free:
            self.slots.release()
        return {
            "lock_free": lock_free,
            "slot_free": slot_free,
            "big_shared": in_setup_segment(self.big),
            "big_right": bool(self.big[index] == index),
        }


class Holds:
    """A dataset of one item holding what the test gives it (in the order given)."""

    def __init__(self, **parts: Any) -> None:
        self.__dict__.update(parts)

    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: int) -> int:
        return index


# -- a parcel in this process -----------------------------------------------------------


class _Detached:
    """What multiprocessing's ``DupFd`` gives a child: ``detach()`` hands the descriptor over."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def detach(self) -> int:
        return self.fd


class _HerePopen:
    """Plays the spawning ``Popen`` for a child that is this very process: descriptors are dups."""

    def duplicate_for_child(self, fd: int) -> int:
        return os.dup(fd)

    def DupFd(self, fd: int) -> _Detached:  # multiprocessing's name
        return _Detached(fd)


def cross(parcel: SetupParcel) -> WorkerSetup:
    """``parcel`` pickled as ``Process.start`` pickles it, and opened as a worker opens it."""
    previous = multiprocessing.context.get_spawning_popen()
    multiprocessing.context.set_spawning_popen(_HerePopen())
    try:
        data = bytes(multiprocessing.reduction.ForkingPickler.dumps(parcel))
    finally:
        multiprocessing.context.set_spawning_popen(previous)
    return open_setup(pickle.loads(data))


def setup_of(dataset: Any) -> WorkerSetup:
    return WorkerSetup(dataset, default_collate, None, 1, True, False, 1, 2)


@pytest.fixture
def parcels() -> Iterator[list[SetupParcel]]:
    """Parcels the test makes; closed after it."""
    made: list[SetupParcel] = []
    yield made
    for parcel in made:
        parcel.close()


def pack(parcels: list[SetupParcel], dataset: Any, method: str = "forkserver") -> SetupParcel:
    parcel = SetupParcel.pack(setup_of(dataset), method)
    parcels.append(parcel)
    return parcel


def test_large_arrays_leave_the_pickle_for_a_read_only_segment(
    parcels: list[SetupParcel],
) -> None:
    dataset = Probe()
    parcel = pack(parcels, dataset)
    assert parcel.pickled_once
    assert dataset.big is not None
    assert dataset.big.nbytes <= parcel.shared_bytes < dataset.big.nbytes + 4096
    received = cross(parcel).dataset
    np.testing.assert_array_equal(received.big, dataset.big)
    assert not received.big.flags.writeable
    assert write_error(received.big) == "assignment destination is read-only"
    assert in_setup_segment(received.big)
    # The small array travelled inside the pickle: a writable copy.
    assert received.small.flags.writeable and write_error(received.small) == ""
    np.testing.assert_array_equal(received.small, dataset.small)


def test_small_buffers_stay_in_the_pickle_and_no_segment_is_made(
    parcels: list[SetupParcel],
) -> None:
    before = segments()
    just_small = Holds(below=np.zeros(OUT_OF_BAND_MIN - 1, dtype=np.uint8))
    parcel = pack(parcels, just_small)
    assert parcel.shared_bytes == 0 and not new_segments(before)
    received = cross(parcel).dataset
    assert received.below.flags.writeable and received.below.nbytes == OUT_OF_BAND_MIN - 1
    at_threshold = pack(parcels, Holds(at=np.zeros(OUT_OF_BAND_MIN, dtype=np.uint8)))
    assert at_threshold.shared_bytes == OUT_OF_BAND_MIN


def test_memory_met_twice_is_placed_once(parcels: list[SetupParcel]) -> None:
    big = np.arange(BIG // 4, dtype=np.float64)  # 4 MiB
    twin = big[:]  # another array object over the same memory
    parcel = pack(parcels, Holds(big=big, twin=twin, again=big, copy=big.copy()))
    assert parcel.shared_bytes == 2 * big.nbytes
    received = cross(parcel).dataset
    assert received.again is received.big  # pickle's own memo
    assert address_of(received.twin) == address_of(received.big)
    np.testing.assert_array_equal(received.copy, big)


def test_the_segment_is_sealed_and_its_descriptor_closed_with_the_parcel() -> None:
    before = segments()
    parcel = SetupParcel.pack(setup_of(Probe(n=1)), "forkserver")
    ((fd, _),) = new_segments(before)
    assert fcntl.fcntl(fd, fcntl.F_GET_SEALS) & fcntl.F_SEAL_WRITE
    with pytest.raises(PermissionError):
        os.pwrite(fd, b"x", 0)
    parcel.close()
    assert parcel.closed and not new_segments(before)
    with pytest.raises(RuntimeError, match="closed"):
        cross(parcel)
    # A parcel dropped without close() closes its descriptor too.
    SetupParcel.pack(setup_of(Probe(n=1)), "forkserver")
    gc.collect()
    assert not new_segments(before)


def test_a_parcel_is_only_pickled_by_process_start(parcels: list[SetupParcel]) -> None:
    parcel = pack(parcels, Probe(n=1, big=False))
    with pytest.raises(TypeError, match="only pickled as a worker Process starts"):
        pickle.dumps(parcel)


def test_locks_and_semaphores_are_pickled_once_values_per_worker(
    parcels: list[SetupParcel],
) -> None:
    context = multiprocessing.get_context("forkserver")
    once = pack(parcels, Holds(lock=context.Lock(), slots=context.Semaphore(2)))
    assert once.pickled_once
    dataset = Shares(context)
    per_worker = pack(parcels, dataset)
    assert not per_worker.pickled_once
    # Each worker's own pickle still finds the large array in the segment written once.
    assert dataset.big.nbytes <= per_worker.shared_bytes < dataset.big.nbytes + 4096
    first, second = cross(per_worker).dataset, cross(per_worker).dataset
    assert in_setup_segment(first.big)
    assert not first.big.flags.writeable
    first.reads.value += 5
    assert second.reads.value == dataset.reads.value == 5  # the same shared memory


def test_an_unpicklable_part_is_named_even_after_a_value(parcels: list[SetupParcel]) -> None:
    context = multiprocessing.get_context("forkserver")
    # Plain pickle refuses the Value too: the error must name the lock, which is at fault.
    dataset = Holds(counter=context.Value("i", 0), handle=threading.Lock())
    with pytest.raises(TypeError, match=r"cannot send dataset\.handle to the worker") as caught:
        pack(parcels, dataset)
    assert "dataset.handle (a _thread.lock) cannot be pickled" in str(caught.value)
    assert "multiprocessing_context='fork'" in str(caught.value)


def test_a_lock_of_another_context_is_named(parcels: list[SetupParcel]) -> None:
    dataset = Holds(lock=multiprocessing.get_context("fork").Lock())
    with pytest.raises(RuntimeError, match=r"cannot send dataset\.lock\b.*'spawn'") as caught:
        pack(parcels, dataset, "spawn")
    assert "created in a fork context" in str(caught.value.__cause__)


def test_a_shared_list_rides_the_segment(parcels: list[SetupParcel]) -> None:
    records = SharedList({"id": i, "name": f"item-{i}"} for i in range(20_000))
    parcel = pack(parcels, Holds(records=records))
    assert parcel.pickled_once and parcel.shared_bytes >= records._data.nbytes
    received = cross(parcel).dataset.records
    assert len(received) == 20_000 and received[-1] == {"id": 19_999, "name": "item-19999"}
    assert in_setup_segment(received._data)


# -- loaders ---------------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("method", PICKLING)
def test_workers_read_the_large_array_from_one_shared_segment(method: str) -> None:
    shm_before, before = set(os.listdir("/dev/shm")), segments()
    with DataLoader(
        Probe(), batch_size=None, num_workers=2, multiprocessing_context=method
    ) as loader:
        samples = list(loader)
    assert len(samples) == 8 and len({s["pid"] for s in samples}) == 2
    for sample in samples:
        assert sample["big_right"] and sample["small_right"]
        assert not sample["big_writeable"]
        assert sample["big_write_error"] == "assignment destination is read-only"
        assert sample["big_shared"]  # no copy of its own
        assert sample["small_writeable"]
    assert wait_until(lambda: not new_segments(before))
    assert set(os.listdir("/dev/shm")) <= shm_before  # nothing new there


@pytest.mark.timeout(60)
def test_a_replacement_worker_still_receives_the_shared_array(tmp_path: Path) -> None:
    dataset = Probe(n=24, victim=13, marker=str(tmp_path / "killed"))
    before = segments()
    loader = DataLoader(
        dataset,
        batch_size=None,
        num_workers=2,
        persistent_workers=True,
        multiprocessing_context="forkserver",
    )
    try:
        first = list(loader)
        assert (tmp_path / "killed").exists()
        second = list(loader)
        # The pool's own descriptor keeps the segment for replacements, no more.
        assert len(new_segments(before)) == 1
    finally:
        loader.close()
    killed = int((tmp_path / "killed").read_text())
    second_pids = {s["pid"] for s in second}
    assert killed not in second_pids and len(second_pids) == 2  # the survivor and its new peer
    assert len({s["pid"] for s in first} | second_pids) == 3
    assert len(first) == len(second) == 24
    for sample in first + second:
        assert sample["big_right"] and not sample["big_writeable"]
        assert sample["big_shared"]
    assert wait_until(lambda: not new_segments(before))


@pytest.mark.timeout(60)
def test_a_setup_of_small_arrays_needs_no_segment() -> None:
    before = segments()
    loader = DataLoader(
        Probe(big=False),
        batch_size=None,
        num_workers=2,
        persistent_workers=True,
        multiprocessing_context="forkserver",
    )
    with loader:
        samples = list(loader)
        assert not new_segments(before)
    assert all(s["small_writeable"] and s["small_right"] for s in samples)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("method", EVERY_METHOD)
def test_value_lock_and_semaphore_are_shared_with_the_workers(method: str) -> None:
    context = multiprocessing.get_context(method)
    dataset = Shares(context, n=16)
    loader = DataLoader(dataset, batch_size=None, num_workers=2, multiprocessing_context=method)
    with dataset.lock, dataset.slots:  # taken here: a worker that shares them finds them taken
        samples = list(loader)
    assert dataset.reads.value == 16  # the workers' increments, seen here
    assert not any(s["lock_free"] or s["slot_free"] for s in samples)
    assert all(s["big_right"] for s in samples)
    if method != "fork":  # fork inherits the parent's memory: nothing is pickled
        assert all(s["big_shared"] for s in samples)


@pytest.mark.timeout(60)
def test_an_unpicklable_dataset_is_still_named_by_the_loader() -> None:
    dataset = Holds(counter=multiprocessing.get_context("forkserver").Value("i"), fn=lambda: 0)
    # The pickler's own error type (AttributeError for a local object on Python 3.11).
    with pytest.raises((AttributeError, pickle.PicklingError), match=r"send dataset\.fn to the"):
        list(DataLoader(dataset, num_workers=1, multiprocessing_context="forkserver"))
