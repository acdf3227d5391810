"""``aioload demo``: a synthetic image dataset streamed from a local object store into training.

The demo writes a small image-classification dataset (10 classes of noisy
32×32 RGB patterns) as WebDataset tar shards in a temporary folder, serves
the folder from an :class:`~aioload.sources.ObjectServer` on 127.0.0.1 that
waits ``--latency-ms`` before answering each request (a remote bucket's
first-byte latency), and trains a softmax classifier on it three ways, each
for one epoch over the same shards with the same training step:

- **aioload**: ``async for batch in DataLoader(ShardDataset(urls), ...)``,
  with worker processes that each stream several shards at once, keeping
  them in a local cache (``cache_dir``) as they arrive; then a second epoch
  (**aioload, epoch 2**) from that cache, without a request to the store;
- **serial**: one shard after another with a blocking HTTP client, in the
  training loop itself: what a plain script does;
- **torch** (when torch is installed): torch's ``DataLoader`` over an
  ``IterableDataset`` that reads its worker's shards with the same blocking
  client, with the same number of workers.

It prints a live progress line per reader and a table of what each reached
in this run. The temporary folder, the server and every worker are gone when
it exits, also after Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import tarfile
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from aioload.cli import CommandError, add_traceback_option, plain_text, run_async
from aioload.cli.meter import Meter, Result, format_table

__all__ = ["Classifier", "add_parser", "decode_sample", "run", "write_dataset"]

IMAGE_SHAPE = (32, 32, 3)
CLASSES = 10


def add_parser(commands: Any) -> None:
    """Adds the ``demo`` command to the ``aioload`` command line."""
    parser = commands.add_parser(
        "demo",
        help="stream a synthetic image dataset from a local object store into training",
        description=plain_text(__doc__ or ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--latency-ms",
        type=float,
        default=20.0,
        help="milliseconds the object server waits before each answer (default: 20)",
    )
    parser.add_argument(
        "--samples", type=int, default=8192, help="images in the dataset (default: 8192)"
    )
    parser.add_argument(
        "--samples-per-shard", type=int, default=32, help="images per tar shard (default: 32)"
    )
    parser.add_argument("--batch-size", type=int, default=64, help="default: 64")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default: 2)")
    parser.add_argument(
        "--shards-in-flight",
        type=int,
        default=8,
        help="shards each aioload worker streams at once (default: 8)",
    )
    parser.add_argument(
        "--no-torch", action="store_true", help="skip torch's DataLoader even if installed"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    add_traceback_option(parser)
    parser.set_defaults(run=run)


def run(arguments: argparse.Namespace) -> int:
    """Runs the demo (see the module docstring); returns the exit code."""
    _check_arguments(arguments)
    try:
        from aioload.sources import ObjectServer
    except ImportError as error:
        cause = error.__cause__ or error  # aioload.sources' own message has a hint of its own
        raise CommandError(
            f"the demo needs obstore and aiohttp: pip install 'aioload-data[demo]' ({cause})", 2
        ) from None
    show = not arguments.quiet
    with scratch_folder("aioload-demo-") as folder:
        started = time.perf_counter()
        names, nbytes = write_dataset(folder, arguments.samples, arguments.samples_per_shard)
        print(
            f"wrote {arguments.samples} images ({nbytes / 1e6:.1f} MB) as {len(names)} tar "
            f"shards in {time.perf_counter() - started:.1f} s; serving them on 127.0.0.1 with "
            f"{arguments.latency_ms:g} ms of latency per request"
        )
        sample_bytes = nbytes / arguments.samples
        with ObjectServer(folder, latency=arguments.latency_ms / 1000) as server:
            urls = [f"{server.url}/{name}" for name in names]
            results = [
                *_aioload(urls, arguments, sample_bytes, show),
                _serial(urls, arguments, sample_bytes, show),
            ]
            torch_result = (
                None if arguments.no_torch else _torch(urls, arguments, sample_bytes, show)
            )
            if torch_result is not None:
                results.append(torch_result)
    print()
    print(format_table(results, baseline="serial"))
    print()
    for result in results:
        print(
            f"{result.name:>16}: final loss {result.extra['loss']:.3f}, "
            f"accuracy {100 * result.extra['accuracy']:.0f}% on its last batches"
        )
    if torch_result is None and not arguments.no_torch:
        print("(install torch to compare with torch's DataLoader: pip install torch)")
    return 0


def _check_arguments(arguments: argparse.Namespace) -> None:
    for name in ("samples", "samples_per_shard", "batch_size", "shards_in_flight"):
        value = getattr(arguments, name)
        if value < 1:
            raise CommandError(f"--{name.replace('_', '-')} should be >= 1; got {value}", 2)
    if arguments.workers < 0:
        raise CommandError(f"--workers should be >= 0; got {arguments.workers}", 2)
    if arguments.latency_ms < 0:
        raise CommandError(f"--latency-ms should be >= 0; got {arguments.latency_ms}", 2)


# -- the data ----------------------------------------------------------------------------


def write_dataset(folder: str, samples: int, per_shard: int) -> tuple[list[str], int]:
    """Writes the synthetic dataset as tar shards; returns their names and total size."""
    from aioload.sources import ShardWriter

    rng = np.random.default_rng(0)
    # Each class is a blocky colour pattern; an image is its class's pattern plus noise.
    patterns = np.kron(rng.integers(0, 256, (CLASSES, 8, 8, 3)), np.ones((1, 4, 4, 1)))
    with ShardWriter(os.path.join(folder, "train-%05d.tar"), maxcount=per_shard) as writer:
        for first in range(0, samples, per_shard):
            count = min(per_shard, samples - first)
            labels = rng.integers(CLASSES, size=count)
            noise = rng.integers(-160, 160, (count, *IMAGE_SHAPE), dtype=np.int16)
            images = np.clip(patterns[labels] + noise, 0, 255).astype(np.uint8)
            for offset in range(count):
                writer.write(
                    {
                        "__key__": f"{first + offset:07d}",
                        "rgb": images[offset].tobytes(),
                        "cls": str(int(labels[offset])),
                    }
                )
        shards = list(writer.shards)
    names = [os.path.relpath(path, folder) for path in shards]
    return names, sum(os.path.getsize(path) for path in shards)


def decode_sample(sample: dict[str, Any]) -> tuple[np.ndarray, int]:
    """The training pair of one sample: a normalised CHW float32 image and its label.

    Runs where the shard is read: in aioload's worker processes.
    """
    image = np.frombuffer(sample["rgb"], np.uint8).reshape(IMAGE_SHAPE)
    chw = np.ascontiguousarray(image.transpose(2, 0, 1), dtype=np.float32)
    return (chw - 127.5) / 127.5, int(sample["cls"])


class Classifier:
    """A softmax classifier trained with SGD: the demo's stand-in for a model."""

    def __init__(self, features: int, classes: int = CLASSES, rate: float = 0.5) -> None:
        self.weights = np.zeros((features, classes), np.float32)
        self.rate = rate
        self.loss = float("nan")
        self.accuracy = 0.0

    def step(self, images: np.ndarray, labels: np.ndarray) -> None:
        """One SGD step on a batch; keeps a running loss and accuracy."""
        x = _pooled(images)
        logits = x @ self.weights
        logits -= logits.max(axis=1, keepdims=True)
        probabilities = np.exp(logits)
        probabilities /= probabilities.sum(axis=1, keepdims=True)
        rows = np.arange(len(labels))
        loss = float(-np.log(probabilities[rows, labels] + 1e-9).mean())
        accuracy = float((probabilities.argmax(axis=1) == labels).mean())
        self.loss = loss if np.isnan(self.loss) else 0.9 * self.loss + 0.1 * loss
        self.accuracy = 0.9 * self.accuracy + 0.1 * accuracy
        probabilities[rows, labels] -= 1
        gradient = x.T @ probabilities
        self.weights -= self.rate * gradient / len(labels) * np.sqrt(x.shape[1])


# -- the readers -------------------------------------------------------------------------


def _pooled(images: np.ndarray) -> np.ndarray:
    """4×4 average pooling, flattened and scaled: the classifier's features.

    Small on purpose: larger products would run on BLAS threads, which fight
    the loader's workers for this machine's cores and slow every reader down.
    """
    b, c, h, w = images.shape
    pooled = images.reshape(b, c, h // 4, 4, w // 4, 4).mean(axis=(3, 5)).reshape(b, -1)
    scaled: np.ndarray = pooled / np.float32(np.sqrt(pooled.shape[1]))
    return scaled


def _features() -> int:
    height, width, channels = IMAGE_SHAPE
    return channels * (height // 4) * (width // 4)


@contextlib.contextmanager
def scratch_folder(prefix: str) -> Iterator[str]:
    """A new temporary folder, removed at the end even when Ctrl-C lands during its removal.

    ``tempfile.TemporaryDirectory`` stops removing at a ``KeyboardInterrupt`` raised inside its
    own cleanup (a Ctrl-C just as a run ends) and leaves the folder behind; here the removal
    is finished first and the interrupt raised after.

    Args:
        prefix: how the folder's name begins (it is made in ``tempfile.gettempdir()``).

    Example::

        >>> with scratch_folder("aioload-demo-") as folder:
        ...     os.path.isdir(folder)
        True
        >>> os.path.exists(folder)
        False
    """
    path = tempfile.mkdtemp(prefix=prefix)
    try:
        yield path
    finally:
        try:
            shutil.rmtree(path, ignore_errors=True)
        except KeyboardInterrupt:
            shutil.rmtree(path, ignore_errors=True)
            raise


def _aioload(
    urls: list[str], arguments: argparse.Namespace, sample_bytes: float, show: bool
) -> list[Result]:
    """Epoch 1 from the store (kept in a local cache as it arrives), then epoch 2 from it."""
    from aioload import DataLoader
    from aioload.sources import ShardDataset

    with scratch_folder("aioload-demo-cache-") as cache:
        dataset = ShardDataset(
            urls,
            decode=decode_sample,
            shuffle_buffer=256,
            shards_in_flight=arguments.shards_in_flight,
            cache_dir=cache,
        )
        loader: DataLoader[Any] = DataLoader(
            dataset, batch_size=arguments.batch_size, num_workers=arguments.workers
        )
        model = Classifier(_features())
        try:
            results = []
            for epoch, name in enumerate(("aioload", "aioload, epoch 2")):
                dataset.set_epoch(epoch)
                results.append(_aioload_epoch(loader, model, name, arguments, sample_bytes, show))
        finally:
            loader.close()
    return results


def _aioload_epoch(
    loader: Any,
    model: Classifier,
    name: str,
    arguments: argparse.Namespace,
    sample_bytes: float,
    show: bool,
) -> Result:
    meter = Meter(name, arguments.samples, show=show)

    async def train() -> None:
        waited_since = time.perf_counter()
        async for images, labels in loader:
            meter.waited += time.perf_counter() - waited_since
            model.step(images, labels)
            meter.add(len(labels), round(len(labels) * sample_bytes))
            waited_since = time.perf_counter()

    try:
        run_async(train)
    except BaseException:
        meter.close()
        raise
    return meter.finish(loss=model.loss, accuracy=model.accuracy)


def _serial(
    urls: list[str], arguments: argparse.Namespace, sample_bytes: float, show: bool
) -> Result:
    batches = _batches(_read_shards(urls), arguments.batch_size)
    return _train("serial", batches, arguments.samples, sample_bytes, show)


def _torch(
    urls: list[str], arguments: argparse.Namespace, sample_bytes: float, show: bool
) -> Result | None:
    try:
        import torch.utils.data
    except ImportError:
        return None
    loader = torch.utils.data.DataLoader(
        _as_torch_dataset(TorchShards)(urls),
        batch_size=arguments.batch_size,
        num_workers=arguments.workers,
    )
    batches = ((images.numpy(), labels.numpy()) for images, labels in loader)
    return _train("torch", batches, arguments.samples, sample_bytes, show)


def _train(
    name: str,
    batches: Iterator[tuple[np.ndarray, np.ndarray]],
    samples: int,
    sample_bytes: float,
    show: bool,
) -> Result:
    """Trains a fresh classifier on ``batches``, timing the waits for each."""
    model = Classifier(_features())
    meter = Meter(name, samples, show=show)
    try:
        waited_since = time.perf_counter()
        for images, labels in batches:
            meter.waited += time.perf_counter() - waited_since
            model.step(images, labels)
            meter.add(len(labels), round(len(labels) * sample_bytes))
            waited_since = time.perf_counter()
    except BaseException:
        meter.close()
        raise
    return meter.finish(loss=model.loss, accuracy=model.accuracy)


def _read_shards(urls: list[str]) -> Iterator[tuple[np.ndarray, int]]:
    """The decoded samples of the shards, read one after another with a blocking client."""
    from aioload.sources.tar.reader import split_name
    from aioload.testing.object_server import LOOPBACK_OPENER

    for url in urls:
        with LOOPBACK_OPENER.open(url) as response:
            data = response.read()
        sample: dict[str, Any] = {}
        with tarfile.open(fileobj=io.BytesIO(data)) as archive:
            for member in archive:
                key, field = split_name(member.name)
                if sample and sample["__key__"] != key:
                    yield decode_sample(sample)
                    sample = {}
                extracted = archive.extractfile(member)
                if extracted is not None:
                    sample["__key__"] = key
                    sample[field] = extracted.read()
        if sample:
            yield decode_sample(sample)


def _batches(
    samples: Iterator[tuple[np.ndarray, int]], size: int
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    batch: list[tuple[np.ndarray, int]] = []
    for sample in samples:
        batch.append(sample)
        if len(batch) == size:
            yield np.stack([s[0] for s in batch]), np.array([s[1] for s in batch])
            batch = []
    if batch:
        yield np.stack([s[0] for s in batch]), np.array([s[1] for s in batch])


class TorchShards:
    """torch's side of the comparison: each worker reads its share of the shards serially."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls

    def __iter__(self) -> Iterator[tuple[np.ndarray, int]]:
        import torch.utils.data

        info = torch.utils.data.get_worker_info()
        mine = self.urls if info is None else self.urls[info.id :: info.num_workers]
        return _read_shards(mine)


def _as_torch_dataset(cls: type) -> Any:
    """``cls`` as a subclass of torch's IterableDataset (torch's loader asks for one).

    Made only when torch is present; its workers fork, so the class need not be importable.
    """
    import torch.utils.data

    return type(cls.__name__, (cls, torch.utils.data.IterableDataset), {})
