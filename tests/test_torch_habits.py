"""A torch user's habits: tensors from one switch, torch's generators and seeds, warnings.

Every test here needs torch (skipped without it), but for the one that checks numpy's global
state in a process where torch is not imported.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import warnings
from typing import Any

import numpy as np
import pytest

import aioload
from aioload import DataLoader, RandomSampler, SubsetRandomSampler, WeightedRandomSampler

pytestmark = pytest.mark.slow

_WORKER_TIMEOUT = 60


@pytest.fixture
def torch() -> Any:
    return pytest.importorskip("torch")


class TensorImages(aioload.Dataset):
    """Sample ``i``: a float32 tensor image of shape (1, 4, 4) and the int label ``i % 3``."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int) -> tuple[Any, int]:
        import torch

        gen = torch.Generator().manual_seed(i)
        return torch.rand((1, 4, 4), generator=gen) + (i % 3), i % 3


class NumpyImages(aioload.Dataset):
    """The same samples as numpy arrays."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int) -> tuple[Any, int]:
        rng = np.random.default_rng(i)
        return rng.random((1, 4, 4), dtype=np.float32) + (i % 3), i % 3


class LargeTensorImages(aioload.Dataset):
    """Sample ``i``: a float32 tensor (32 KiB) filled with ``i``, and the label ``i``."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> tuple[Any, int]:
        import torch

        return torch.full((8, 32, 32), float(i)), i


class LargeNumpyImages(aioload.Dataset):
    """Sample ``i``: a float32 array (32 KiB) filled with ``i``, and the label ``i``."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> tuple[Any, int]:
        return np.full((8, 32, 32), i, np.float32), i


class WorkerSeeds(aioload.Dataset):
    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int) -> int:
        info = aioload.get_worker_info()
        assert info is not None
        return info.seed


# -- 1. tensors -------------------------------------------------------------------------


def test_a_batch_holding_tensors_has_tensor_numbers_and_arrays_as_torch_collates(
    torch: Any,
) -> None:
    from torch.utils.data import default_collate as torch_default_collate

    samples = [(torch.zeros(2), i, 0.5 * i, np.full(3, i, np.float32), "s") for i in range(3)]
    ours = aioload.default_collate(samples)
    theirs = torch_default_collate(samples)
    for mine, reference in zip(ours[:4], theirs[:4], strict=True):
        assert isinstance(mine, torch.Tensor)
        assert mine.dtype == reference.dtype and torch.equal(mine, reference)
    assert ours[4] == theirs[4] == ("s", "s", "s")
    # Nested: the first sample's leaves are looked at through dicts and lists.
    nested = aioload.default_collate(
        [{"x": [torch.ones(1)], "y": 1}, {"x": [torch.ones(1)], "y": 2}]
    )
    assert isinstance(nested["y"], torch.Tensor) and nested["y"].dtype == torch.int64
    # Without a tensor nothing changes: numpy leaves.
    assert isinstance(aioload.default_collate([(np.zeros(2), 1)] * 2)[1], np.ndarray)


def _train(torch: Any, loader: Any) -> list[float]:
    """A torch training loop as written for torch's DataLoader (the model code is untouched)."""
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    for _ in range(15):
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses


@pytest.mark.parametrize("dataset", [TensorImages(), NumpyImages()], ids=["tensors", "numpy"])
def test_a_torch_training_script_trains_with_aioload_torch(torch: Any, dataset: Any) -> None:
    from aioload.torch import DataLoader as TorchDataLoader

    loader = TorchDataLoader(dataset, batch_size=8, shuffle=True)
    losses = _train(torch, loader)
    # The same shuffles as torch's own loader after torch.manual_seed: the same training.
    reference = _train(torch, torch.utils.data.DataLoader(dataset, batch_size=8, shuffle=True))
    assert np.isfinite(losses).all() and np.allclose(losses, reference)


def test_tensor_samples_train_with_the_plain_loader_too(torch: Any) -> None:
    # Tensor images and int labels: y comes back a tensor, so cross_entropy takes it.
    losses = _train(torch, DataLoader(TensorImages(), batch_size=8, shuffle=True))
    assert losses[-1] < losses[0] / 2


def test_aioload_torch_offers_torchs_vocabulary(torch: Any) -> None:
    import aioload.torch as at

    batch = at.default_collate([{"x": np.zeros(2), "n": 1}] * 2)
    assert isinstance(batch["x"], torch.Tensor) and isinstance(batch["n"], torch.Tensor)
    assert isinstance(at.default_convert(np.zeros(2)), torch.Tensor)
    first = next(iter(at.DataLoader(NumpyImages(), batch_size=None)))
    assert isinstance(first[0], torch.Tensor)
    own = at.DataLoader(NumpyImages(), batch_size=4, collate_fn=aioload.default_collate)
    assert isinstance(next(iter(own))[0], np.ndarray)  # a collate_fn of one's own is kept
    assert {"DataLoader", "Dataset", "random_split", "RandomSampler"} <= set(at.__all__)


def _memfd_ranges() -> list[tuple[int, int]]:
    ranges = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) >= 6 and "memfd:aioload" in fields[5]:
                start, end = (int(x, 16) for x in fields[0].split("-"))
                ranges.append((start, end))
    return ranges


def _in_shared_memory(tensor: Any) -> bool:
    start, end = tensor.data_ptr(), tensor.data_ptr() + tensor.nbytes
    return any(low <= start and end <= high for low, high in _memfd_ranges())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
@pytest.mark.timeout(_WORKER_TIMEOUT)
@pytest.mark.parametrize("dataset", [LargeTensorImages(), LargeNumpyImages()], ids=["t", "np"])
def test_tensors_from_workers_are_views_of_the_shared_memory(torch: Any, dataset: Any) -> None:
    from aioload.torch import DataLoader as TorchDataLoader

    expected = list(TorchDataLoader(dataset, batch_size=4))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # more workers than this machine's CPUs
        loader = TorchDataLoader(dataset, batch_size=4, num_workers=2)
        batches = list(loader)
    assert len(batches) == len(expected) == 4
    for (x, y), (ex, ey) in zip(batches, expected, strict=True):
        assert isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)
        assert torch.equal(x, ex) and torch.equal(y, ey) and y.dtype == torch.int64
        # The images (stacked in the worker's arena) and the labels (copied into the
        # segment once) both lie in a mapped aioload segment: no pickled copy.
        assert _in_shared_memory(x) and _in_shared_memory(y)
        assert x.is_contiguous() and x.numpy().flags.writeable


@pytest.mark.parametrize("dataset", [LargeTensorImages(), LargeNumpyImages()], ids=["t", "np"])
def test_a_worker_collates_tensors_into_its_arena_and_sends_them_uncopied(
    torch: Any, dataset: Any
) -> None:
    from aioload.collate.core import collate_into
    from aioload.interop import torch_collate
    from aioload.memory.segments import SegmentReader, SegmentWriter

    writer, reader = SegmentWriter(), SegmentReader(keep_free=2)
    samples = [dataset[i] for i in range(8)]
    arena = writer.arena()
    with collate_into(arena.allocate):
        x, y = torch_collate(samples)
    assert arena.segment is not None and arena.used >= x.nbytes  # stacked into the arena
    written = writer.write([x, y], arena)
    assert written.segment == arena.segment.id
    assert writer.expected_size < 1.5 * x.nbytes  # the images were not copied again
    out_x, out_y = reader.read(written.segment, written.size, written.layout_at, written.fd)
    assert torch.equal(out_x, x) and torch.equal(out_y, y)
    del out_x, out_y
    reader.close()


def test_tensors_numpy_cannot_view_still_travel(torch: Any) -> None:
    from aioload.memory.segments import SegmentReader, SegmentWriter

    writer, reader = SegmentWriter(), SegmentReader(keep_free=2)
    batch = {
        "grad": torch.ones(3, requires_grad=True),
        "half": torch.ones(2, dtype=torch.bfloat16),
        "param": torch.nn.Parameter(torch.zeros(2)),
        "view": torch.arange(10)[::3],
    }
    written = writer.write(batch)
    out = reader.read(written.segment, written.size, written.layout_at, written.fd)
    assert out["grad"].requires_grad and out["half"].dtype == torch.bfloat16
    assert isinstance(out["param"], torch.nn.Parameter)
    assert out["view"].tolist() == [0, 3, 6, 9]
    reader.close()


# -- 2. seeds ---------------------------------------------------------------------------


def _epochs(keys: Any, count: int = 2) -> list[list[int]]:
    """``count`` epochs of a loader (its batches flattened) or of a sampler."""
    return [np.ravel(list(keys)).tolist() for _ in range(count)]


def test_a_torch_generator_is_accepted_everywhere(torch: Any) -> None:
    def build(seed: int) -> list[Any]:
        gen = torch.Generator().manual_seed(seed)
        return [
            DataLoader(range(20), batch_size=5, shuffle=True, generator=gen),
            RandomSampler(range(20), generator=gen),
            RandomSampler(range(20), replacement=True, num_samples=30, generator=gen),
            SubsetRandomSampler(list(range(0, 40, 2)), generator=gen),
            WeightedRandomSampler(np.arange(1.0, 21.0), 15, generator=gen),
            WeightedRandomSampler(np.arange(1.0, 21.0), 15, replacement=False, generator=gen),
        ]

    def run(seed: int) -> list[Any]:
        gen = torch.Generator().manual_seed(seed)
        split = [list(s.indices) for s in aioload.random_split(range(20), [0.5, 0.5], gen)]
        return [split] + [_epochs(thing) for thing in build(seed)]

    first, again, other = run(0), run(0), run(1)
    assert first == again and first != other
    for epochs in first[1:]:
        assert epochs[0] != epochs[1]  # the generator advanced: the epochs differ


def test_a_torch_generator_advances_as_under_torch(torch: Any) -> None:
    gen = torch.Generator().manual_seed(0)
    reference = torch.Generator().manual_seed(0)
    loader = DataLoader(range(20), batch_size=5, shuffle=True, generator=gen)
    theirs = torch.utils.data.DataLoader(range(20), batch_size=5, shuffle=True, generator=reference)
    it, torch_it = iter(loader), iter(theirs)
    # The base seed is torch's draw at iter(), then the sampler's randperm at the first batch.
    assert next(it).tolist() == next(torch_it).tolist()
    assert loader.state_dict()["base_seed"] == torch_it._base_seed
    # Mid-epoch the loader has drawn ahead of its consumer; after the epoch it is where torch is.
    assert [b.tolist() for b in it] == [b.tolist() for b in torch_it]
    assert [b.tolist() for b in loader] == [b.tolist() for b in theirs]
    assert torch.equal(gen.get_state(), reference.get_state())
    # random_split draws torch's randperm from it too.
    ours = aioload.random_split(range(10), [5, 5], generator=gen)
    split = torch.utils.data.random_split(range(10), [5, 5], generator=reference)
    assert [s.indices for s in ours] == [s.indices for s in split]
    assert torch.equal(gen.get_state(), reference.get_state())


def test_torch_manual_seed_reproduces_a_run_without_a_generator(torch: Any) -> None:
    def run() -> list[Any]:
        torch.manual_seed(0)
        loader = DataLoader(range(20), batch_size=5, shuffle=True)
        it = iter(loader)
        first = next(it)
        state = loader.state_dict()
        return [
            first.tolist(),
            state["base_seed"],
            [int(k) for b in it for k in b],
            _epochs(loader),
            list(RandomSampler(range(10))),
            list(SubsetRandomSampler([3, 5, 7, 9])),
            list(WeightedRandomSampler([1.0, 2.0, 3.0], 5)),
            [list(s.indices) for s in aioload.random_split(range(10), [3, 7])],
        ]

    first, again = run(), run()
    assert first == again
    assert first[3][0] != first[3][1]


@pytest.mark.timeout(_WORKER_TIMEOUT)
def test_torch_manual_seed_reproduces_the_workers_seeds(torch: Any) -> None:
    def seeds() -> list[int]:
        torch.manual_seed(0)
        loader = DataLoader(WorkerSeeds(), batch_size=1, num_workers=1)
        return [int(k) for b in loader for k in b]

    first = seeds()
    assert first == seeds() and first[0] == first[1]


def test_numpy_global_seed_reproduces_a_run_without_torch() -> None:
    code = textwrap.dedent(
        """
        import sys
        import numpy as np
        import aioload

        def run():
            np.random.seed(0)
            loader = aioload.DataLoader(range(20), batch_size=5, shuffle=True)
            it = iter(loader)
            first = next(it).tolist()
            seed = loader.state_dict()["base_seed"]
            rest = [int(k) for b in it for k in b]
            epoch = [int(k) for b in loader for k in b]
            split = [list(s.indices) for s in aioload.random_split(range(10), [3, 7])]
            batch = aioload.default_collate([(np.zeros(2), 1)] * 2)
            assert isinstance(batch[1], np.ndarray)
            return [first, seed, rest, epoch, list(aioload.RandomSampler(range(10))), split]

        first, again = run(), run()
        assert first == again, (first, again)
        assert first[0] + first[2] != first[3]
        assert "torch" not in sys.modules
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_checkpoint_and_resume_with_a_torch_generator(torch: Any) -> None:
    def loader(gen: Any) -> DataLoader[Any]:
        return DataLoader(range(20), batch_size=4, shuffle=True, generator=gen)

    original = loader(torch.Generator().manual_seed(0))
    it = iter(original)
    taken = [next(it).tolist() for _ in range(2)]
    saved = json.dumps(original.state_dict())  # plain JSON
    rest = [b.tolist() for b in it]
    after = _epochs(original)

    resumed = loader(torch.Generator())  # its state comes from the checkpoint
    resumed.load_state_dict(json.loads(saved))
    assert [b.tolist() for b in resumed] == rest
    assert _epochs(resumed) == after
    assert taken + rest != [b for b in after[0]]

    between = json.dumps(original.state_dict())
    later = loader(torch.Generator())
    later.load_state_dict(json.loads(between))
    assert _epochs(later) == _epochs(original)


def test_a_sampler_with_a_torch_generator_resumes_mid_iteration(torch: Any) -> None:
    sampler = RandomSampler(range(12), generator=torch.Generator().manual_seed(3))
    keys = iter(sampler)
    head = [next(keys) for _ in range(5)]
    state = json.loads(json.dumps(sampler.state_dict()))
    assert state["torch_generator"]["bit_generator"] == "torch.Generator"
    tail = list(keys)
    following = list(sampler)

    resumed = RandomSampler(range(12), generator=torch.Generator())
    resumed.load_state_dict(state)
    assert list(resumed) == tail and list(resumed) == following
    assert sorted(head + tail) == list(range(12))


def test_torch_generator_states_that_do_not_fit_are_refused(torch: Any) -> None:
    with_torch = DataLoader(range(8), shuffle=True, generator=torch.Generator().manual_seed(0))
    with_numpy = DataLoader(range(8), shuffle=True, generator=0)
    with pytest.raises(ValueError, match=r"torch\.Generator state, but this loader's generator"):
        with_numpy.load_state_dict(with_torch.state_dict())
    with pytest.raises(ValueError, match="numpy generator state, but this loader's generator"):
        with_torch.load_state_dict(with_numpy.state_dict())
    broken = with_torch.state_dict()
    broken["generator"]["state"] = broken["generator"]["state"][:10]
    with pytest.raises(ValueError, match=r"not a valid torch\.Generator state"):
        DataLoader(range(8), shuffle=True, generator=torch.Generator()).load_state_dict(broken)
    sampler_state = RandomSampler(range(4), generator=torch.Generator()).state_dict()
    with pytest.raises(ValueError, match=r"holds a torch\.Generator state"):
        RandomSampler(range(4), generator=0).load_state_dict(sampler_state)
    with pytest.raises(ValueError, match="has no 'torch_generator'"):
        RandomSampler(range(4), generator=torch.Generator()).load_state_dict(
            RandomSampler(range(4)).state_dict()
        )


def test_other_generators_are_still_refused(torch: Any) -> None:
    with pytest.raises(TypeError, match=r"a torch\.Generator or an int seed, but got RandomState"):
        RandomSampler(range(4), generator=np.random.RandomState(0))


# -- torch ops in workers ----------------------------------------------------------------

# A dataset that convolves in its __init__ (in the parent: torch's intra-op thread pool
# starts) and in __getitem__ (in forked workers), as in pytorch#53565: a worker forked from
# the thread that ran the pool (the loader's default start forks from the main thread)
# inherits a pool whose threads are gone, and its first convolution waits for them forever,
# unless it runs torch on one thread. In a fresh interpreter, so that the parent's pool is in
# a known state: four threads, whatever the machine's cores.
_CONVOLVED = """
import torch
from aioload.torch import DataLoader, Dataset

torch.set_num_threads(4)

class Convolved(Dataset):
    def __init__(self):
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 8, 3)
        self.images = torch.randn(8, 3, 32, 32)
        with torch.no_grad():
            self.expected = self.conv(self.images).sum(dim=(1, 2, 3))

    def __len__(self):
        return 8

    def __getitem__(self, i):
        with torch.no_grad():
            return self.conv(self.images[i : i + 1]).sum(), torch.get_num_threads()

dataset = Convolved()
loader = DataLoader(dataset, batch_size=2, num_workers=2)
batches = list(loader)
sums = torch.cat([s for s, _ in batches])
threads = torch.cat([t for _, t in batches]).tolist()
assert torch.allclose(sums, dataset.expected, rtol=1e-4), (sums, dataset.expected)
assert threads == [1] * 8, threads
assert torch.get_num_threads() == 4
print("ok")
"""


@pytest.mark.timeout(_WORKER_TIMEOUT)
def test_torch_ops_in_the_parent_and_in_forked_workers_run_one_thread_each(torch: Any) -> None:
    try:
        done = subprocess.run(
            [sys.executable, "-c", _CONVOLVED], capture_output=True, text=True, timeout=30
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the loader hung: a convolution in a forked worker never returned")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "ok\n"


# -- 3. warnings ------------------------------------------------------------------------


def test_pin_memory_without_an_accelerator_warns_at_the_users_line(torch: Any) -> None:
    if torch.cuda.is_available():  # pragma: no cover - no GPU in CI
        pytest.skip("an accelerator is present: tensors are pinned")
    loader = DataLoader(TensorImages(), batch_size=8, pin_memory=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _batch in loader:
            pass
    found = [w for w in caught if "accelerator" in str(w.message)]
    assert len(found) == 1 and found[0].filename == __file__, [
        (w.filename, str(w.message)) for w in caught
    ]


@pytest.mark.asyncio
async def test_pin_memory_warning_points_at_async_for_too(torch: Any) -> None:
    if torch.cuda.is_available():  # pragma: no cover - no GPU in CI
        pytest.skip("an accelerator is present: tensors are pinned")
    loader = DataLoader(TensorImages(), batch_size=8, pin_memory=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        async for _batch in loader:
            pass
    found = [w for w in caught if "accelerator" in str(w.message)]
    assert len(found) == 1 and found[0].filename == __file__
