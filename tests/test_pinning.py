"""Tests for the pin stage: pinned copies, recycling, the locked-memory bound and fallbacks."""

from __future__ import annotations

import collections
import ctypes
import errno
import gc
import mmap
import queue
import resource
import subprocess
import sys
import threading
import types
import warnings
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np
import pytest

from aioload.memory import pinned as pinning
from aioload.memory.buffers import size_class
from aioload.memory.pinned import (
    DEFAULT_MAX_BYTES,
    PinMemoryWarning,
    PinnedBufferPool,
    pin_batch,
)

PAGE = mmap.PAGESIZE
MiB = 1 << 20


def vmlck_kib() -> int | None:
    """The process's locked memory in KiB, or None where /proc does not report it."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmLck:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def can_lock(nbytes: int) -> bool:
    probe = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    view = ctypes.c_char.from_buffer(probe)
    address = ctypes.addressof(view)
    del view
    try:
        pinning._mlock(address, nbytes)
    except OSError:
        return False
    finally:
        probe.close()
    return True


# The most a test below locks at once: within the usual 8 MiB limit (``ulimit -l`` 8192).
LOCKS_AT_MOST = 4 * MiB


@pytest.fixture
def may_lock() -> None:
    """Skips, saying why, where this process may not lock ``LOCKS_AT_MOST``.

    In CI such a skip fails the run (see ``AIOLOAD_STRICT_SKIPS`` in conftest.py).
    """
    if can_lock(LOCKS_AT_MOST):
        return
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    limit = "unlimited" if soft == resource.RLIM_INFINITY else f"{soft >> 10} KiB"
    reason = (
        f"this process may not lock {LOCKS_AT_MOST >> 20} MiB of memory (RLIMIT_MEMLOCK "
        f"{limit}, minus what it has locked): raise `ulimit -l`"
    )
    pytest.skip(reason)


def address(array: np.ndarray) -> int:
    return int(array.ctypes.data)


@pytest.fixture
def pool() -> Iterator[PinnedBufferPool]:
    with PinnedBufferPool(max_bytes=64 * MiB) as p:
        yield p


class Point(NamedTuple):
    x: Any
    y: Any


class CustomBatch:
    def __init__(self, data: np.ndarray) -> None:
        self.data = data
        self.pinned = False

    def pin_memory(self) -> CustomBatch:
        self.pinned = True
        return self


class FrozenSeq(Sequence[Any]):
    def __init__(self, items: list[Any]) -> None:
        self._items = list(items)

    def __getitem__(self, index: Any) -> Any:
        return self._items[index]

    def __len__(self) -> int:
        return len(self._items)


class PairSeq(FrozenSeq):
    def __init__(self, first: Any, second: Any) -> None:
        super().__init__([first, second])


def assert_pinned_copy(out: np.ndarray, source: np.ndarray) -> None:
    assert type(out) is np.ndarray
    assert out.dtype == source.dtype
    assert out.shape == source.shape
    np.testing.assert_array_equal(out, source)
    assert out.flags.c_contiguous
    assert out.flags.writeable
    assert address(out) % PAGE == 0
    assert not np.shares_memory(out, source)


# -- arrays -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "source",
    [
        np.arange(12, dtype=np.float32).reshape(3, 4),
        np.arange(10, dtype=">i4"),
        np.array(3.5),
        np.zeros((0, 7), dtype=np.int16),
        np.array([b"ab", b"c"]),
        np.array(["x", "yz"]),
        np.array([(1, 2.0)], dtype=[("a", "<i2"), ("b", "<f8")]),
        np.arange(2 * PAGE, dtype=np.uint8),
        np.arange(40, dtype=np.float64).reshape(5, 8)[::2, 1::3],
        np.asfortranarray(np.arange(6).reshape(2, 3)),
        np.ones(3, dtype=bool),
    ],
    ids=[
        "2d",
        "bigendian",
        "0d",
        "empty",
        "bytes",
        "str",
        "struct",
        "pages",
        "strided",
        "F",
        "bool",
    ],
)
def test_pin_array_preserves_dtype_shape_values(pool: PinnedBufferPool, source: np.ndarray) -> None:
    source.flags.writeable = False
    assert_pinned_copy(pool.pin_array(source), source)


def test_pinned_array_is_writeable_and_independent(pool: PinnedBufferPool) -> None:
    source = np.zeros(5)
    out = pool.pin_array(source)
    out[:] = 1
    assert source.sum() == 0


def test_empty_returns_aligned_array(pool: PinnedBufferPool) -> None:
    out = pool.empty((3, 5), np.int64)
    assert out.shape == (3, 5) and out.dtype == np.int64
    assert address(out) % PAGE == 0 and out.flags.c_contiguous
    assert pool.empty(4).dtype == np.float64


def test_size_classes_round_up_to_pages_with_bounded_waste() -> None:
    assert size_class(0) == PAGE
    assert size_class(1) == PAGE
    assert size_class(PAGE + 1) == 2 * PAGE
    assert size_class(9 * PAGE) == 10 * PAGE
    for nbytes in range(1, 300 * PAGE, 997):
        size = size_class(nbytes)
        assert size % PAGE == 0
        assert nbytes <= size
        assert size <= max(PAGE, 1.25 * nbytes + PAGE)


# -- batches ------------------------------------------------------------------------------


def test_pin_batch_recurses_and_preserves_structure(
    pool: PinnedBufferPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # as before torch is imported
    x = np.arange(6.0).reshape(2, 3)
    custom = CustomBatch(np.ones(2))
    batch: dict[str, Any] = {
        "x": x,
        "point": Point(x, [x, "s"]),
        "tuple": (x, 1),
        "list": [x, None],
        "custom": custom,
        "text": "hello",
        "raw": b"bytes",
        "number": 3,
        "ordered": collections.OrderedDict(a=x),
        "default": collections.defaultdict(list, a=x),
        "proxy": types.MappingProxyType({"a": x}),
        "frozen": FrozenSeq([x]),
        "pair": PairSeq(x, 1),
        "range": range(2),
    }
    out = pin_batch(batch, pool)

    assert type(out) is dict and list(out) == list(batch)
    assert_pinned_copy(out["x"], x)
    assert type(out["point"]) is Point
    assert_pinned_copy(out["point"].x, x)
    assert type(out["point"].y) is list and out["point"].y[1] == "s"
    assert_pinned_copy(out["point"].y[0], x)
    assert type(out["tuple"]) is tuple and out["tuple"][1] == 1
    assert_pinned_copy(out["tuple"][0], x)
    assert type(out["list"]) is list and out["list"][1] is None
    assert out["custom"] is custom and custom.pinned
    assert out["text"] == "hello" and out["raw"] == b"bytes" and out["number"] == 3
    assert type(out["ordered"]) is collections.OrderedDict
    assert type(out["default"]) is collections.defaultdict
    assert out["default"].default_factory is list
    assert type(out["proxy"]) is types.MappingProxyType
    assert type(out["frozen"]) is FrozenSeq
    assert type(out["pair"]) is list and out["pair"][1] == 1  # cannot be rebuilt from a list
    assert out["range"] == [0, 1]
    for pinned in (
        out["ordered"]["a"],
        out["default"]["a"],
        out["proxy"]["a"],
        out["frozen"][0],
        out["pair"][0],
    ):
        assert_pinned_copy(pinned, x)
    assert batch["list"][0] is x  # the input is not modified


def test_pin_batch_leaves_unpinnable_arrays_alone(pool: PinnedBufferPool) -> None:
    objects = np.array([{"a": 1}, None], dtype=object)
    masked = np.ma.masked_array([1, 2], mask=[False, True])
    scalar = np.float32(2.5)
    out = pin_batch([objects, masked, scalar], pool)
    assert out[0] is objects and out[1] is masked and out[2] is scalar


def test_pin_batch_copies_memmap_into_plain_array(pool: PinnedBufferPool, tmp_path: Any) -> None:
    source = np.memmap(tmp_path / "m.bin", dtype=np.int32, mode="w+", shape=(4,))
    source[:] = [1, 2, 3, 4]
    assert_pinned_copy(pin_batch(source, pool), np.asarray(source))


def test_pin_batch_tensors_untouched_without_accelerator(
    pool: PinnedBufferPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[Any, ...]] = []

    class Tensor:
        def pin_memory(self, *args: Any) -> str:
            calls.append(args)
            return "pinned"

    available = [False]
    fake_torch = types.SimpleNamespace(
        Tensor=Tensor,
        cuda=types.SimpleNamespace(is_available=lambda: available[0]),
    )
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    tensor = Tensor()
    assert pin_batch([tensor], pool)[0] is tensor
    assert calls == []

    available[0] = True
    pinned: Any = pin_batch({"t": tensor}, pool)
    assert pinned == {"t": "pinned"}
    pinned = pin_batch(tensor, pool, device="cuda:1")
    assert pinned == "pinned"
    assert calls == [(), ("cuda:1",)]
    assert pin_batch(tensor, pool, device="xpu") is tensor  # no such accelerator


def test_pin_batch_with_real_torch_tensor(pool: PinnedBufferPool) -> None:
    torch = pytest.importorskip("torch")
    tensor = torch.arange(4)
    out = pin_batch([tensor], pool)[0]
    assert out.is_pinned() == torch.cuda.is_available()
    assert torch.equal(out, tensor)


def test_module_import_does_not_import_torch() -> None:
    code = "import sys, aioload.memory.pinned; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# -- recycling ----------------------------------------------------------------------------


def test_dropped_buffer_is_reused(pool: PinnedBufferPool) -> None:
    first = pool.pin_array(np.ones(1000))
    where = address(first)
    del first
    second = pool.pin_array(np.full(990, 2.0))  # same size class
    assert address(second) == where
    stats = pool.stats()
    assert (stats.created, stats.reused, stats.buffers_in_use, stats.buffers_free) == (1, 1, 1, 0)


def test_buffer_held_through_a_view_is_never_reused(pool: PinnedBufferPool) -> None:
    first = pool.pin_array(np.arange(1000.0))
    where = address(first)
    view = first[10:20]
    del first
    second = pool.pin_array(np.full(1000, -1.0))
    assert address(second) != where
    np.testing.assert_array_equal(view, np.arange(10.0, 20.0))
    assert pool.stats().buffers_in_use == 2

    del view
    third = pool.pin_array(np.zeros(1000))
    assert address(third) == where


def test_concurrent_pinning_never_overwrites_held_batches() -> None:
    handoff: queue.Queue[tuple[int, dict[str, np.ndarray]] | None] = queue.Queue(maxsize=4)
    errors: list[BaseException] = []

    with PinnedBufferPool(max_bytes=8 * MiB) as pool:

        def pin_thread() -> None:
            try:
                for seq in range(300):
                    rows = 50 + seq % 7
                    batch = {"x": np.full((rows, 256), seq, np.int32), "y": np.full(rows, seq)}
                    handoff.put((seq, pin_batch(batch, pool)))
            except BaseException as exc:
                errors.append(exc)
            finally:
                handoff.put(None)

        thread = threading.Thread(target=pin_thread)
        thread.start()
        held: collections.deque[tuple[int, dict[str, np.ndarray]]] = collections.deque()
        while (item := handoff.get()) is not None:
            held.append(item)
            if len(held) > 3:  # the consumer keeps a few batches, views included
                seq, batch = held.popleft()
                assert (batch["x"] == seq).all() and (batch["y"] == seq).all()
                held[0] = (held[0][0], {"x": held[0][1]["x"][1:], "y": held[0][1]["y"]})
        thread.join()
        for seq, batch in held:
            assert (batch["x"] == seq).all() and (batch["y"] == seq).all()
        assert not errors
        del held, item, batch
        stats = pool.stats()
        assert stats.reused > 250
        assert stats.buffers_in_use == 0


# -- locked memory ------------------------------------------------------------------------


@pytest.mark.usefixtures("may_lock")
def test_vmlck_grows_by_the_locked_size_while_arrays_live() -> None:
    gc.collect()
    before = vmlck_kib()
    with PinnedBufferPool(max_bytes=64 * MiB) as pool:
        batch = pin_batch({"a": np.ones((256, 1024)), "b": np.arange(3)}, pool)
        stats = pool.stats()
        assert stats.locked_bytes == stats.pooled_bytes == 2 * MiB + PAGE
        assert stats.buffers_in_use == 2
        if before is not None:
            assert vmlck_kib() == before + stats.locked_bytes // 1024
        del batch
        assert pool.stats().buffers_free == 2
    assert pool.stats().locked_bytes == 0
    if before is not None:
        assert vmlck_kib() == before


@pytest.mark.usefixtures("may_lock")
def test_locked_memory_stays_bounded_over_many_batches() -> None:
    gc.collect()
    before = vmlck_kib()
    limit = LOCKS_AT_MOST
    peak = 0
    with PinnedBufferPool(max_bytes=limit) as pool:
        held: collections.deque[dict[str, np.ndarray]] = collections.deque(maxlen=3)
        for seq in range(200):
            rows = 120 + seq % 8  # slightly different sizes (480 to 508 KiB) share a size class
            batch: dict[str, np.ndarray] = {
                "x": np.full((rows, 1024), seq, np.float32),
                "y": np.arange(rows),
            }
            pinned = pin_batch(batch, pool)
            assert (pinned["x"] == seq).all()
            held.append(pinned)
            stats = pool.stats()
            assert stats.locked_bytes <= limit
            if before is not None:
                peak = max(peak, (vmlck_kib() or 0) - before)
        stats = pool.stats()
        assert stats.created <= 8
        assert stats.reused >= 2 * 200 - 8
        assert stats.unpooled == 0
        if before is not None:
            assert peak * 1024 <= limit
        del held, pinned
    if before is not None:
        assert vmlck_kib() == before


def test_bound_reached_serves_unpooled_buffers() -> None:
    with PinnedBufferPool(max_bytes=4 * PAGE) as pool:
        held = [pool.pin_array(np.full(2 * PAGE, i, np.uint8)) for i in range(3)]
        stats = pool.stats()
        assert (stats.created, stats.unpooled, stats.pooled_bytes) == (2, 1, 4 * PAGE)
        assert stats.locked_bytes <= 4 * PAGE
        for i, array in enumerate(held):
            assert (array == i).all() and address(array) % PAGE == 0

        too_big = pool.pin_array(np.ones(5 * PAGE, np.uint8))
        assert too_big.sum() == 5 * PAGE
        assert pool.stats().unpooled == 2
        del held, too_big
        assert pool.stats().buffers_free == 2


def test_idle_buffers_of_other_sizes_make_room() -> None:
    with PinnedBufferPool(max_bytes=4 * PAGE) as pool:
        small = pool.pin_array(np.ones(PAGE, np.uint8))
        del small
        big = pool.pin_array(np.ones(4 * PAGE, np.uint8))
        stats = pool.stats()
        assert (stats.created, stats.unpooled, stats.buffers_free) == (2, 0, 0)
        assert stats.pooled_bytes == 4 * PAGE
        del big


def test_zero_bound_pools_nothing() -> None:
    with PinnedBufferPool(max_bytes=0) as pool:
        out = pool.pin_array(np.arange(5))
        np.testing.assert_array_equal(out, np.arange(5))
        assert pool.stats().pooled_bytes == 0 and pool.stats().unpooled == 1


@pytest.mark.parametrize("code", [errno.EPERM, errno.ENOMEM])
def test_mlock_refused_warns_once_and_falls_back(
    monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    attempts: list[int] = []

    def refuse(address: int, size: int) -> None:
        attempts.append(size)
        raise OSError(code, "refused")

    monkeypatch.setattr(pinning, "_mlock", refuse)
    with PinnedBufferPool(max_bytes=64 * MiB) as pool:
        sources = [np.arange(n, dtype=np.float64) for n in (10, 1000, 100_000)]
        with pytest.warns(PinMemoryWarning, match="could not lock host memory") as record:
            out = pin_batch(sources, pool)
            again = pin_batch(sources, pool)
        assert len(record) == 1
        # It names the limit to raise, not a bound the loader's users cannot set.
        message = str(record[0].message)
        assert "RLIMIT_MEMLOCK" in message and "max_bytes" not in message
        assert issubclass(PinMemoryWarning, RuntimeWarning)
        assert len(attempts) == 1  # locking is not retried
        for pinned, source in zip(out + again, sources + sources, strict=True):
            assert_pinned_copy(pinned, source)
        stats = pool.stats()
        assert stats.locked_bytes == 0 and stats.pooled_bytes > 0 and not stats.locking

        del out, again
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            pool.pin_array(sources[0])  # reused, unlocked, no new warning
        assert pool.stats().reused >= 1


# -- close --------------------------------------------------------------------------------


def test_close_while_arrays_alive_leaves_them_valid() -> None:
    gc.collect()
    before = vmlck_kib()
    pool = PinnedBufferPool(max_bytes=64 * MiB)
    kept = pool.pin_array(np.arange(1000))
    view = kept[::2]
    idle = pool.pin_array(np.ones(100))
    del idle
    pool.close()
    pool.close()  # idempotent
    assert pool.closed
    stats = pool.stats()
    assert (stats.buffers_free, stats.buffers_in_use) == (0, 1)

    np.testing.assert_array_equal(kept, np.arange(1000))
    kept[:] = 7
    assert (view == 7).all()
    with pytest.raises(RuntimeError, match="closed"):
        pool.pin_array(np.ones(3))

    del kept, view
    stats = pool.stats()
    assert (stats.pooled_bytes, stats.locked_bytes, stats.buffers_in_use) == (0, 0, 0)
    if before is not None:
        assert vmlck_kib() == before


def test_pool_as_context_manager_closes() -> None:
    with PinnedBufferPool() as pool:
        assert pool.max_bytes == DEFAULT_MAX_BYTES == 1 << 30
    assert pool.closed
    assert "PinnedBufferPool(max_bytes=" in repr(pool)


# -- bad input ----------------------------------------------------------------------------


@pytest.mark.parametrize("max_bytes", ["1", 1.5, None, True])
def test_max_bytes_must_be_an_integer(max_bytes: Any) -> None:
    with pytest.raises(TypeError, match="max_bytes should be an integer"):
        PinnedBufferPool(max_bytes=max_bytes)


def test_max_bytes_must_be_non_negative() -> None:
    with pytest.raises(ValueError, match="max_bytes should be a non-negative integer value"):
        PinnedBufferPool(max_bytes=-1)


def test_pin_array_rejects_non_arrays(pool: PinnedBufferPool) -> None:
    with pytest.raises(TypeError, match=r"expects a numpy.ndarray, but got list"):
        pool.pin_array([1, 2])  # type: ignore[arg-type]


def test_pin_array_rejects_object_arrays(pool: PinnedBufferPool) -> None:
    with pytest.raises(TypeError, match="holds Python objects"):
        pool.pin_array(np.array([None, 1], dtype=object))


def test_empty_rejects_negative_dimensions(pool: PinnedBufferPool) -> None:
    with pytest.raises(ValueError, match="negative dimensions"):
        pool.empty((2, -1))


def test_pin_batch_rejects_bad_pool_and_device(pool: PinnedBufferPool) -> None:
    with pytest.raises(TypeError, match="pool should be a PinnedBufferPool, but got dict"):
        pin_batch([1], {})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="device should be a str, but got int"):
        pin_batch([1], pool, device=0)  # type: ignore[arg-type]
