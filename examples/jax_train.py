"""JAX: numpy batches from an aioload loader into ``jax.device_put``, sharded over devices.

aioload's batches are numpy arrays, which is what ``jax.device_put`` takes: no torch, no
conversion. The loop below

- shards every batch over the devices along its first axis (a ``NamedSharding`` over a
  one-axis mesh: data parallelism), so a jitted step runs on all of them;
- keeps the next batches already on their way to the devices (``device_put`` is
  asynchronous: the copy overlaps the step in progress), while aioload's own loop fetches
  further ahead;
- checkpoints the parameters (numpy arrays) together with ``loader.state_dict()`` in the
  middle of an epoch, and a resumed run finishes the epoch on exactly the batches not yet
  trained on.

``drop_last=True`` keeps every batch's size a multiple of the device count (and every step
the same shape, so that ``jit`` compiles once). The check at the end: the resumed run's
parameters are an uninterrupted run's, bit for bit.

Run: ``python examples/jax_train.py [--workers N]`` (``pip install 'jax[cpu]'``). On a CPU,
``XLA_FLAGS=--xla_force_host_platform_device_count=2`` makes two devices to shard over.
"""

from __future__ import annotations

import argparse
import collections
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from aioload import ArrayDataset, DataLoader

SAMPLES = 1_000
BATCH = 64  # 15 steps an epoch (drop_last)
EPOCHS = 2
PREEMPTED_AT = 20  # the step after which the first run stops (in its second epoch)

Params = dict[str, jax.Array]


def make_loader(workers: int) -> DataLoader[Any]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(SAMPLES, 8)).astype(np.float32)
    y = (x @ rng.normal(size=8) + 0.5).astype(np.float32)
    return DataLoader(
        ArrayDataset(x, y),
        batch_size=BATCH,
        shuffle=True,
        generator=0,
        drop_last=True,
        num_workers=workers,
        # JAX runs threads from its first call on, and a process forked from it may hang:
        # workers start from a fork server instead (the script needs its __main__ guard)
        multiprocessing_context="forkserver" if workers else None,
    )


def on_devices(
    loader: DataLoader[Any], sharding: NamedSharding, ahead: int = 2
) -> Iterator[tuple[Any, dict[str, Any]]]:
    """Each batch put on the devices ``ahead`` steps before the step that uses it, with the
    loader's state as of that batch.

    The loader has yielded ``ahead`` batches more than the loop has trained on, so its state
    at a checkpoint is the one taken when the batch being trained on was received (a few
    microseconds for a map-style loader; a stream dataset's holds its shuffle buffer).
    """
    queue: collections.deque[tuple[Any, dict[str, Any]]] = collections.deque()
    for batch in loader:
        # device_put returns at once; the copy to the devices runs on
        queue.append((jax.device_put(batch, sharding), loader.state_dict()))
        if len(queue) > ahead:
            yield queue.popleft()
    while queue:
        yield queue.popleft()


@jax.jit
def step(params: Params, x: jax.Array, y: jax.Array) -> tuple[Params, jax.Array]:
    def loss(p: Params) -> jax.Array:
        return jnp.mean((x @ p["w"] + p["b"] - y) ** 2)

    value, grads = jax.value_and_grad(loss)(params)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), value


def train(
    workers: int,
    sharding: NamedSharding,
    *,
    checkpoint: Path | None = None,
    resume: bool = False,
    stop_after: int | None = None,
) -> tuple[Params, int]:
    """Trains from scratch, or from ``checkpoint``; returns the parameters and the steps."""
    replicated = NamedSharding(sharding.mesh, PartitionSpec())
    params: Params = {"w": jnp.zeros(8), "b": jnp.zeros(())}
    loader = make_loader(workers)
    done = start_epoch = 0
    if resume and checkpoint is not None:
        saved = json.loads(checkpoint.read_text())
        params = {name: jnp.asarray(value) for name, value in saved["params"].items()}
        done, start_epoch = saved["steps"], saved["epoch"]
        loader.load_state_dict(saved["loader"])  # the next iteration: the rest of the epoch
    params = jax.device_put(params, replicated)
    for epoch in range(start_epoch, EPOCHS):
        for (x, y), loader_state in on_devices(loader, sharding):
            params, _ = step(params, x, y)
            done += 1
            if done == stop_after and checkpoint is not None:
                state = {
                    "params": {name: np.asarray(value).tolist() for name, value in params.items()},
                    "steps": done,
                    "epoch": epoch,
                    "loader": loader_state,  # as of this batch, not of the ones put ahead
                }
                checkpoint.write_text(json.dumps(state))
                return params, done
    return params, done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=0, help="num_workers (default 0)")
    args = parser.parse_args()

    devices = jax.devices()
    if BATCH % len(devices):
        raise SystemExit(f"the batch ({BATCH}) does not split over {len(devices)} devices")
    sharding = NamedSharding(Mesh(np.array(devices), ("data",)), PartitionSpec("data"))
    print(f"{len(devices)} {devices[0].platform} device(s); each batch split along 'data'")

    with tempfile.TemporaryDirectory() as folder:
        checkpoint = Path(folder) / "checkpoint.json"
        _, steps = train(args.workers, sharding, checkpoint=checkpoint, stop_after=PREEMPTED_AT)
        print(f"first run: stopped after step {steps}, mid-epoch; checkpoint written")
        resumed, total = train(args.workers, sharding, checkpoint=checkpoint, resume=True)
    reference, expected = train(args.workers, sharding)
    print(f"resumed run: {total - steps} more steps, {total} in all")

    x, _labels = next(iter(make_loader(0)))
    sharded = jax.device_put(x, sharding)
    print(f"a batch on the devices: {sharded.shape}, {len(sharded.addressable_shards)} shard(s)")
    if total != expected:
        raise SystemExit(f"FAILED: the resumed run took {total} steps in all, not {expected}")
    if any(not np.array_equal(resumed[name], reference[name]) for name in reference):
        raise SystemExit("FAILED: the resumed run's parameters differ from an uninterrupted run's")
    print("ok: the resumed run's parameters are the uninterrupted run's, bit for bit")


if __name__ == "__main__":
    main()
