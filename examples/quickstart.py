"""Quick start: a classic script, an async service, and worker processes for CPU-bound decoding.

Run: ``python examples/quickstart.py``
"""

from __future__ import annotations

import asyncio
import time

import numpy as np

from aioload import ArrayDataset, DataLoader


class RemoteImages:
    """A stand-in for images in an object store: every read waits 20 ms."""

    def __init__(self, n: int) -> None:
        self.n = n

    async def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        await asyncio.sleep(0.02)  # network latency
        rng = np.random.default_rng(i)
        return rng.random((3, 32, 32), dtype=np.float32), i % 10

    def __len__(self) -> int:
        return self.n


class EncodedImages:
    """Images that cost CPU to decode (a stand-in for JPEG decoding): about 2 ms each."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        image = np.random.default_rng(i).random((64, 64))
        for _ in range(12):  # the "decoding"
            image = np.fft.irfft2(np.fft.rfft2(image), s=image.shape)
        return image.astype(np.float32), i % 10

    def __len__(self) -> int:
        return self.n


def classic_script() -> None:
    features = np.random.default_rng(0).random((1000, 16), dtype=np.float32)
    labels = np.arange(1000) % 10
    loader = DataLoader(ArrayDataset(features, labels), batch_size=64, shuffle=True, generator=0)
    for epoch in range(2):
        total, correct = 0, 0
        for x, y in loader:
            guess = (x.sum(axis=1) * 10).astype(np.int64) % 10  # a stand-in for a model
            correct += int((guess == y).sum())
            total += len(y)
        print(f"epoch {epoch}: {total} samples, {correct} guessed right")


async def async_service() -> None:
    loader = DataLoader(RemoteImages(2048), batch_size=64, concurrency=512)
    start = time.perf_counter()
    seen = 0
    async for images, _labels in loader:
        seen += len(images)
    elapsed = time.perf_counter() - start
    serial = 2048 * 0.02
    print(
        f"async for: {seen} remote reads of 20 ms in {elapsed:.2f} s "
        f"({seen / elapsed:,.0f} items/s; a serial reader would need {serial:.0f} s)"
    )


def worker_processes() -> None:
    rates = []
    for workers in (0, 2):
        # persistent_workers: the second epoch reuses the workers (the first one starts them).
        with DataLoader(
            EncodedImages(512), batch_size=32, num_workers=workers, persistent_workers=workers > 0
        ) as loader:
            for _epoch in range(2):
                start = time.perf_counter()
                seen = sum(len(images) for images, _labels in loader)
                rate = seen / (time.perf_counter() - start)
        rates.append(rate)
        print(f"num_workers={workers}: {seen} images decoded per epoch, {rate:,.0f} images/s")
    print(f"worker processes: {rates[1] / rates[0]:.1f}x (each worker runs its own event loop)")


if __name__ == "__main__":
    classic_script()
    asyncio.run(async_service())
    worker_processes()
