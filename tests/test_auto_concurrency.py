"""concurrency="auto": the setting, the pool's adjustable limit, throttles, end to end."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from aioload import DataLoader, RetryPolicy
from aioload.read.eager import ItemPool
from aioload.settings import LoaderSettings
from aioload.settings.checks import AUTO_MOST_CONCURRENCY
from aioload.sources import ObjectDataset
from aioload.sources.stores.errors import is_transient, translate
from aioload.stats.throttles import throttles_noted
from aioload.testing import ObjectServer

pytestmark = pytest.mark.timeout(120)


class _Async:
    """An async dataset whose items are served from the ItemPool tests."""

    def __len__(self) -> int:
        return 64

    async def __getitem__(self, index: int) -> int:
        await asyncio.sleep(0)
        return index


def test_auto_is_a_concurrency_the_settings_take() -> None:
    settings = LoaderSettings(dataset=_Async(), batch_size=4, concurrency="auto")
    assert settings.concurrency == "auto"
    assert settings.most_concurrency == AUTO_MOST_CONCURRENCY
    setup = settings.worker_setup(track_stream_state=False)
    assert setup.auto_concurrency and setup.concurrency == AUTO_MOST_CONCURRENCY
    assert (
        not LoaderSettings(dataset=_Async()).worker_setup(track_stream_state=False).auto_concurrency
    )
    assert DataLoader(_Async(), concurrency="auto").concurrency == "auto"
    with pytest.raises(TypeError, match="an int or 'auto'"):
        LoaderSettings(dataset=_Async(), concurrency="Auto")  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_the_pools_limit_moves_while_items_run() -> None:
    gate = asyncio.Event()
    running = 0
    most = 0

    async def item(index: int) -> int:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await gate.wait()
        running -= 1
        return index

    pool = ItemPool(2)
    done: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
    pool.submit([item(i) for i in range(10)], lambda results, error: done.set_result(results))
    for _ in range(5):
        await asyncio.sleep(0)
    assert running == 2
    pool.set_limit(6)  # new slots are filled at once
    for _ in range(5):
        await asyncio.sleep(0)
    assert running == 6 and pool.limit == 6
    pool.set_limit(1)  # no item is interrupted; no new one starts until fewer run
    gate.set()
    assert await done == list(range(10))
    assert most == 6
    with pytest.raises(ValueError):
        pool.set_limit(0)
    await pool.aclose()


class _Tuning:
    """An observer that halves the limit after the first item, then leaves it."""

    def __init__(self) -> None:
        self.calls = 0

    @staticmethod
    def clock() -> float:
        return 0.0

    def item_done(self, started: float) -> int | None:
        self.calls += 1
        return 2 if self.calls == 1 else None


@pytest.mark.asyncio
async def test_an_observer_sets_the_pools_limit() -> None:
    observer = _Tuning()
    pool = ItemPool(8, observer=observer)
    done: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
    items = [_Async()[i] for i in range(10)]
    pool.submit(items, lambda results, error: done.set_result(results))
    assert await done == list(range(10))
    assert pool.limit == 2 and observer.calls == 10
    await pool.aclose()


def test_a_throttled_read_is_counted_and_says_so() -> None:
    import obstore.exceptions

    before = throttles_noted()
    error = translate(
        obstore.exceptions.GenericError("Generic HTTP error: status code: 503, slow down"),
        "http://127.0.0.1:1/a",
    )
    assert isinstance(error, ConnectionError) and is_transient(error)
    assert error.throttled and error.retry_after is None  # type: ignore[attr-defined]
    assert throttles_noted() == before + 1
    other = translate(
        obstore.exceptions.GenericError("Generic HTTP error: status code: 500"), "http://x/a"
    )
    assert not other.throttled  # type: ignore[attr-defined]
    assert throttles_noted() == before + 1


@pytest.fixture
def objects(tmp_path: Path) -> list[str]:
    keys = [f"{i:04d}.bin" for i in range(300)]
    for key in keys:
        (tmp_path / key).write_bytes(key.encode() * 8)
    return keys


def test_auto_reads_every_item_and_shows_its_concurrency(
    tmp_path: Path, objects: list[str]
) -> None:
    with ObjectServer(tmp_path, latency=0.005) as server:
        dataset = ObjectDataset(server.url + "/", objects)
        loader = DataLoader(dataset, batch_size=10, concurrency="auto", collate_fn=list)
        got = [item for batch in loader for item in batch]
    assert got == [key.encode() * 8 for key in objects]
    stats = loader.stats()
    assert stats.concurrency is not None and 1 <= stats.concurrency <= AUTO_MOST_CONCURRENCY
    assert "concurrency auto:" in str(stats)
    assert stats.as_dict()["concurrency"] == stats.concurrency


def test_a_throttling_store_fails_no_item_and_throttles_are_seen(
    tmp_path: Path, objects: list[str]
) -> None:
    # obstore's own retries off: every 503 reaches the loader's retry policy.
    with ObjectServer(tmp_path, rate_limit=300) as server:
        dataset = ObjectDataset(
            server.url + "/", objects, storage_options={"retry_config": {"max_retries": 0}}
        )
        loader = DataLoader(
            dataset,
            batch_size=10,
            concurrency="auto",
            collate_fn=list,
            retry=RetryPolicy(attempts=100, backoff=0.01, max_backoff=0.2, retry_on=is_transient),
        )
        got = [item for batch in loader for item in batch]
        served = server.stats()
    assert got == [key.encode() * 8 for key in objects]
    assert served["throttled"] > 0
    stats = loader.stats()
    assert stats.epoch.throttles == served["throttled"]
    assert stats.epoch.retries == served["throttled"]
    assert stats.concurrency is not None


def test_each_worker_tunes_its_own(tmp_path: Path, objects: list[str]) -> None:
    with ObjectServer(tmp_path) as server:
        dataset = ObjectDataset(server.url + "/", objects[:100])
        loader = DataLoader(
            dataset, batch_size=10, concurrency="auto", collate_fn=list, num_workers=2
        )
        assert sum(len(batch) for batch in loader) == 100
    concurrency = loader.stats().concurrency
    assert concurrency is not None and concurrency >= 2
