"""ShardDataset under the fault policy: corrupt samples and unreadable shards skipped, store
errors retried, against the ObjectServer (HTTP) and the real SeaweedFS (S3).

Every shard holds 10 samples; sample ``i`` is ``{"cls": i, "npy": [i, i]}``. The ``bad``
copies hold the same samples, but those in ``CORRUPT`` carry an ``npy`` member that is not
a numpy file, so decoding them fails. A reference run — the same dataset arguments over
shards that simply lack what is lost — gives the order the skipping run must keep.

Worker processes start on the fork server here: obstore's runtime, once used in this
process, does not survive a plain ``fork``.
"""

from __future__ import annotations

import asyncio
import json
import os
import tarfile
from collections.abc import AsyncGenerator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import obstore
import pytest

from aioload import DataLoader, RetryPolicy, StreamGuard, TooManySkippedError, get_worker_info
from aioload.faults.policy import FaultPolicy
from aioload.sources import MixDataset, ShardDataset, ShardWriter, default_decode, open_store
from aioload.sources.streams.faults import guarded_runs
from aioload.sources.streams.state import Ref, Run
from aioload.testing import ObjectServer

SHARDS = 6
PER_SHARD = 10
CORRUPT = frozenset({7, 23, 41})
FAST = RetryPolicy(attempts=3, backoff=0.0)
CUT_SHARD = 3  # cut/c-0003.tar is truncated inside sample 36
FORKSERVER: dict[str, Any] = {"multiprocessing_context": "forkserver"}


def key(i: int) -> str:
    return f"{i:06d}"


def sample(i: int, corrupt: bool = False) -> dict[str, Any]:
    return {"__key__": key(i), "cls": i, "npy": b"not an npy file" if corrupt else np.full(2, i)}


def label(raw: dict[str, Any]) -> int:
    """Decodes a sample to its label (module level: it runs in the workers)."""
    decoded = default_decode(raw)
    assert decoded["npy"].tolist() == [decoded["cls"]] * 2
    return int(decoded["cls"])


def label_and_worker(raw: dict[str, Any]) -> tuple[int, int]:
    """The label, and the worker that read it (-1: the loader's loop)."""
    info = get_worker_info()
    return label(raw), -1 if info is None else info.id


def by_worker(loader: DataLoader) -> dict[int, list[int]]:
    """Each worker's labels, in the order it read them (decode: label_and_worker)."""
    seen: dict[int, list[int]] = {}
    for numbers, workers in loader:  # collated as torch does: a tuple of arrays
        for i, worker in zip(numbers.tolist(), workers.tolist(), strict=True):
            seen.setdefault(worker, []).append(i)
    return seen


def write(folder: Path, name: str, numbers: list[list[int]], corrupt: frozenset[int]) -> None:
    """Shards ``folder/name-0000.tar``, ... holding the samples ``numbers[k]`` each."""
    folder.mkdir(parents=True, exist_ok=True)
    for number, members in enumerate(numbers):
        with ShardWriter(str(folder / f"{name}-{number:04d}-%d.tar"), maxcount=10**6) as writer:
            for i in members:
                writer.write(sample(i, i in corrupt))
        os.rename(writer.shards[0], folder / f"{name}-{number:04d}.tar")


def offsets(shard: Path) -> dict[str, int]:
    """Where each sample of a shard starts: its first member's header."""
    found: dict[str, int] = {}
    with tarfile.open(shard) as tar:
        for member in tar.getmembers():
            found.setdefault(member.name.split(".", 1)[0], member.offset)
    return found


@pytest.fixture(scope="module")
def shard_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """good/ and bad/ (CORRUPT samples), cut/ (shard 3 truncated), and the references."""
    root = tmp_path_factory.mktemp("faulty-shards")
    every = [list(range(s * PER_SHARD, (s + 1) * PER_SHARD)) for s in range(SHARDS)]
    write(root / "good", "g", every, frozenset())
    write(root / "bad", "b", every, CORRUPT)
    write(root / "cut", "c", every, frozenset())
    whole = root / "cut" / f"c-{CUT_SHARD:04d}.tar"
    # Inside the second member (npy) of sample 36: its header, 512 bytes of cls, a header.
    cut_at = offsets(whole)[key(CUT_SHARD * PER_SHARD + 6)] + 3 * 512 + 50
    whole.write_bytes(whole.read_bytes()[:cut_at])
    # What survives: samples 30..35 (35 is complete once 36's first member is read); the
    # rest of the shard, from sample 36 on, is lost.
    kept = [*every]
    kept[CUT_SHARD] = list(range(CUT_SHARD * PER_SHARD, CUT_SHARD * PER_SHARD + 6))
    write(root / "kept", "k", kept, frozenset())
    (root / "empty").mkdir()
    tarfile.open(root / "empty" / "e-0000.tar", "w").close()  # where a missing shard stood
    return root


@pytest.fixture(scope="module")
def server(shard_folder: Path) -> Iterator[ObjectServer]:
    with ObjectServer(shard_folder, latency=0.001) as running:
        yield running


def urls(base: str, name: str, short: str) -> list[str]:
    return [f"{base}/{name}/{short}-{s:04d}.tar" for s in range(SHARDS)]


def labels(loader: DataLoader) -> list[int]:
    return [int(x) for batch in loader for x in np.asarray(batch).reshape(-1)]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_sample_that_fails_to_decode_is_skipped_in_its_place(
    server: ObjectServer, shard_folder: Path, workers: int
) -> None:
    def loader(name: str, short: str, **policy: Any) -> DataLoader:
        dataset = ShardDataset(
            urls(server.url, name, short),
            decode=label_and_worker,
            shuffle_shards=True,
            shuffle_buffer=8,
            seed=3,
        )
        extra = FORKSERVER if workers else {}
        return DataLoader(dataset, batch_size=4, num_workers=workers, **extra, **policy)

    clean = by_worker(loader("good", "g"))
    skipping = loader("bad", "b", on_error="skip", retry=FAST)
    got = by_worker(skipping)
    # The shuffle is the same: the corrupt samples leave holes, the others keep their order
    # (in each worker's stream: with workers, which worker's batch comes next is the loader's
    # round-robin, and a batch with a hole takes one more sample).
    assert got == {w: [i for i in stream if i not in CORRUPT] for w, stream in clean.items()}
    assert all(stream != sorted(stream) for stream in clean.values())
    report = sorted(skipping.skipped, key=lambda item: item.key)
    assert [item.key for item in report] == [key(i) for i in sorted(CORRUPT)]
    for item, i in zip(report, sorted(CORRUPT), strict=True):
        shard = i // PER_SHARD
        url = f"{server.url}/bad/b-{shard:04d}.tar"
        byte = offsets(shard_folder / "bad" / f"b-{shard:04d}.tar")[key(i)]
        assert item.where == f"{url}, byte {byte}"
        assert item.error_type == "aioload.errors.DecodeError" and item.attempts == 1
        assert f"key '{key(i)}' ({url}, byte {byte}): aioload.errors.DecodeError" in str(item)
    assert {item.worker for item in report} == ({None} if workers == 0 else {0, 1})
    assert skipping.stats().epoch.skipped == len(CORRUPT)


@pytest.mark.parametrize(("workers", "in_flight"), [(0, 1), (0, 3), (2, 1)])
def test_an_unreadable_shard_is_skipped_and_the_next_one_follows(
    server: ObjectServer, shard_folder: Path, workers: int, in_flight: int
) -> None:
    base = server.url
    faulty = urls(base, "cut", "c")
    faulty.insert(1, f"{base}/good/missing.tar")
    reference = urls(base, "kept", "k")
    reference.insert(1, f"{base}/empty/e-0000.tar")
    extra = FORKSERVER if workers else {}

    def loader(shards: list[str], **policy: Any) -> DataLoader:
        dataset = ShardDataset(shards, decode=label, shards_in_flight=in_flight)
        return DataLoader(dataset, batch_size=4, num_workers=workers, **extra, **policy)

    skipping = loader(faulty, retry=FAST, on_error="skip")
    got = labels(skipping)
    expected = labels(loader(reference))
    if in_flight == 1:
        assert got == expected  # what was lost leaves a hole; the rest keep their order
    else:
        assert sorted(got) == sorted(expected)  # the rotation moves on at the failure
        assert labels(loader(faulty, retry=FAST, on_error="skip")) == got  # not timing
    records = {item.error_type: item for item in skipping.skipped}
    assert len(records) == len(skipping.skipped) == 2
    missing = records["builtins.FileNotFoundError"]
    cut = records["aioload.errors.TarFormatError"]
    assert missing.key == f"{base}/good/missing.tar"
    assert missing.error_type == "builtins.FileNotFoundError"
    assert missing.attempts == 3  # a missing object is an OSError: retried, by default
    assert missing.where == f"{base}/good/missing.tar: the rest of the shard, from byte 0"
    first_lost = offsets(shard_folder / "good" / "g-0003.tar")[key(36)]
    assert cut.key == f"{base}/cut/c-{CUT_SHARD:04d}.tar"
    assert cut.error_type == "aioload.errors.TarFormatError" and cut.attempts == 1
    assert cut.where == f"{cut.key}: the rest of the shard, from byte {first_lost}"
    assert "archive ends inside member '000036.npy'" in cut.error


def test_without_a_policy_the_first_bad_shard_fails_the_epoch(server: ObjectServer) -> None:
    dataset = ShardDataset(urls(server.url, "cut", "c"), decode=label)
    with pytest.raises(Exception, match=r"c-0003\.tar: the archive ends inside member"):
        labels(DataLoader(dataset, batch_size=4))


def test_raise_names_the_sample_its_shard_and_offset(
    server: ObjectServer, shard_folder: Path
) -> None:
    dataset = ShardDataset(urls(server.url, "bad", "b"), decode=label)
    loader = DataLoader(dataset, batch_size=4, retry=FAST)
    with pytest.raises(ValueError) as info:
        labels(loader)
    byte = offsets(shard_folder / "bad" / "b-0000.tar")[key(7)]
    notes = "\n".join(info.value.__notes__)
    assert f"raised while reading key '{key(7)}' ({server.url}/bad/b-0000.tar, byte {byte})" in (
        notes
    )


def test_max_skipped_counts_shard_skips(server: ObjectServer) -> None:
    dataset = ShardDataset(urls(server.url, "bad", "b"), decode=label)
    loader = DataLoader(dataset, batch_size=4, on_error="skip", max_skipped=2)
    with pytest.raises(TooManySkippedError, match="max_skipped=2") as info:
        labels(loader)
    assert [item.key for item in info.value.skipped] == [key(i) for i in sorted(CORRUPT)]


@pytest.fixture(scope="module")
def flaky(shard_folder: Path) -> Iterator[ObjectServer]:
    """The shards again, a third of the answers a 503."""
    with ObjectServer(shard_folder, error_rate=0.3, seed=4) as running:
        yield running


@pytest.mark.parametrize("workers", [0, 2])
def test_transient_store_errors_are_retried_with_the_policy(
    flaky: ObjectServer, workers: int
) -> None:
    # obstore's own retries off: every 503 reaches the loader's policy.
    options = {"retry_config": {"max_retries": 0}}
    extra = FORKSERVER if workers else {}
    dataset = ShardDataset(urls(flaky.url, "good", "g"), decode=label, storage_options=options)
    patient = RetryPolicy(attempts=12, backoff=0.001, max_backoff=0.01)
    loader = DataLoader(dataset, batch_size=5, num_workers=workers, retry=patient, **extra)
    assert sorted(labels(loader)) == list(range(SHARDS * PER_SHARD))
    assert loader.stats().epoch.retries > 0 and not loader.skipped
    impatient = DataLoader(dataset, batch_size=5, retry=RetryPolicy(attempts=1))
    with pytest.raises(ConnectionError, match="server error"):
        for _ in range(5):  # an epoch without any 503 is unlikely; five are impossible
            labels(impatient)


def test_a_run_that_fails_mid_stream_is_read_again_from_its_first_sample_not_delivered() -> None:
    opened: list[Run] = []

    async def samples(run: Run) -> AsyncGenerator[tuple[Any, Ref, bool], None]:
        opened.append(run)
        for i in range(run.start, 5):
            yield {"__key__": key(i)}, (0, i, i * 1024, (i + 1) * 1024, key(i)), i == 4
            if len(opened) < 3:  # the first two reads fail after their first sample
                raise ConnectionResetError("reset by peer")

    async def read(policy: FaultPolicy) -> tuple[list[Any], int]:
        guard = StreamGuard(policy)
        open_run = guarded_runs(samples, ["memory:///s.tar"], guard)
        return [item async for item in open_run(Run(0, 0, 0, -1))], guard.take_retries()

    got, retries = asyncio.run(read(FaultPolicy(retry=FAST)))
    assert [s["__key__"] for s, _, _ in got] == [key(i) for i in range(5)]  # each once
    assert [ref[2] for _, ref, _ in got] == [0, 1024, 2048, 3072, 4096]
    assert retries == 2
    # Read again from the first sample not delivered, at its byte offset.
    assert opened == [Run(0, 0, 0, -1), Run(0, 1, 1024, -1), Run(0, 2, 2048, -1)]
    # Without retries the run ends at the failure, with one skip marker.
    opened.clear()
    got, _ = asyncio.run(read(FaultPolicy(on_error="skip")))
    *kept, (marker, ref, last) = got
    assert len(kept) == 1 and ref is None and last
    assert marker.record.where == "memory:///s.tar: the rest of the shard, from byte 1024"


@pytest.fixture(scope="module")
def s3_shards(shard_folder: Path, seaweedfs: Any, s3_storage_options: dict[str, Any]) -> str:
    """bad/ and cut/ in SeaweedFS; the URL of the folder."""
    store, _ = open_store(seaweedfs.url, storage_options=s3_storage_options)
    files = [*sorted((shard_folder / "bad").iterdir()), *sorted((shard_folder / "cut").iterdir())]

    async def upload() -> None:
        await asyncio.gather(
            *(
                obstore.put_async(
                    store, f"faults/{path.parent.name}/{path.name}", path.read_bytes()
                )
                for path in files
            )
        )

    asyncio.run(upload())
    return f"{seaweedfs.url}/faults"


@pytest.mark.parametrize("workers", [0, 2])
def test_skips_against_seaweedfs(
    s3_shards: str, s3_storage_options: dict[str, Any], workers: int
) -> None:
    shards = [*urls(s3_shards, "bad", "b")[:3], f"{s3_shards}/bad/missing.tar"]
    shards += urls(s3_shards, "cut", "c")[CUT_SHARD:]
    dataset = ShardDataset(shards, decode=label, storage_options=s3_storage_options)
    extra = FORKSERVER if workers else {}
    loader = DataLoader(
        dataset, batch_size=4, num_workers=workers, retry=FAST, on_error="skip", **extra
    )
    got = labels(loader)
    lost = {i for i in CORRUPT if i < 30} | set(range(36, 40))  # cut/ holds no corrupt sample
    survivors = set(range(30)) | set(range(CUT_SHARD * PER_SHARD, SHARDS * PER_SHARD))
    assert sorted(got) == sorted(survivors - lost)
    if workers == 0:
        assert got == sorted(got)
    report = {item.key: item for item in loader.skipped}
    assert set(report) == {
        *(key(i) for i in CORRUPT if i < 30),
        f"{s3_shards}/bad/missing.tar",
        f"{s3_shards}/cut/c-{CUT_SHARD:04d}.tar",
    }
    assert report[f"{s3_shards}/bad/missing.tar"].error_type == "builtins.FileNotFoundError"
    assert report[key(7)].where is not None and report[key(7)].where.startswith(
        f"{s3_shards}/bad/b-0000.tar, byte "
    )


@pytest.mark.parametrize("workers", [0, 2])
def test_a_mix_of_shard_streams_leaves_holes_where_samples_fail(
    server: ObjectServer, workers: int
) -> None:
    def loader(name: str, short: str, **policy: Any) -> DataLoader:
        every = urls(server.url, name, short)
        parts = [ShardDataset(every[k::3], decode=label_and_worker) for k in range(3)]
        mix = MixDataset(parts, [0.5, 0.3, 0.2], seed=8, stop="longest")
        extra = FORKSERVER if workers else {}
        return DataLoader(mix, batch_size=4, num_workers=workers, **extra, **policy)

    clean = by_worker(loader("good", "g"))
    skipping = loader("bad", "b", on_error="skip")
    assert by_worker(skipping) == {
        w: [i for i in stream if i not in CORRUPT] for w, stream in clean.items()
    }
    assert sorted(item.key for item in skipping.skipped) == [key(i) for i in sorted(CORRUPT)]


def test_a_mix_over_seaweedfs_yields_what_the_same_mix_over_http_yields(
    server: ObjectServer, s3_shards: str, s3_storage_options: dict[str, Any]
) -> None:
    # The mix's sequence is a function of its seed alone: the same shards behind another
    # store (the real S3 server) give the same samples in the same order, the same skips.
    def mixed(root: str, **options: Any) -> tuple[list[int], list[str]]:
        every = urls(root, "bad", "b")
        parts = [ShardDataset(every[k::3], decode=label, **options) for k in range(3)]
        mix = MixDataset(parts, [0.5, 0.3, 0.2], seed=3, stop="longest")
        loader = DataLoader(mix, batch_size=4, on_error="skip")
        got = labels(loader)
        return got, sorted(item.key.rpartition("/")[2] for item in loader.skipped)

    over_http = mixed(server.url)
    over_s3 = mixed(s3_shards, storage_options=s3_storage_options)
    assert over_s3 == over_http
    assert sorted(over_s3[0]) == sorted(set(range(len(over_s3[0]) + len(CORRUPT))) - CORRUPT)


def test_the_shard_folder_is_what_the_tests_think(shard_folder: Path) -> None:
    # The truncated shard ends inside sample 36, and a plain read says so.
    whole = shard_folder / "good" / "g-0003.tar"
    cut = shard_folder / "cut" / "c-0003.tar"
    assert cut.stat().st_size < whole.stat().st_size
    assert offsets(whole)[key(36)] < cut.stat().st_size < offsets(whole)[key(37)]


@pytest.mark.parametrize(
    ("name", "short", "workers"), [("bad", "b", 0), ("bad", "b", 2), ("cut", "c", 0)]
)
def test_a_guarded_stream_checkpoints_and_resumes_exactly(
    server: ObjectServer, name: str, short: str, workers: int
) -> None:
    def loader() -> DataLoader:
        dataset = ShardDataset(
            urls(server.url, name, short),
            decode=label,
            shuffle_shards=True,
            shuffle_buffer=7,
            shards_in_flight=2,
            seed=5,
        )
        return DataLoader(dataset, batch_size=4, num_workers=workers, retry=FAST, on_error="skip")

    full = labels(loader())
    lost = (
        CORRUPT
        if name == "bad"
        else set(range(CUT_SHARD * PER_SHARD + 6, (CUT_SHARD + 1) * PER_SHARD))
    )
    assert sorted(full) == sorted(set(range(SHARDS * PER_SHARD)) - set(lost))
    for stop in (1, 4, 9):
        first = loader()
        it = iter(first)
        taken = [int(x) for _ in range(stop) for x in np.asarray(next(it)).reshape(-1)]
        state = json.loads(json.dumps(first.state_dict()))
        it.close()
        resumed = loader()
        resumed.load_state_dict(state)
        assert taken + labels(resumed) == full, stop
