"""Hedged reads: the delay (p95 of a sliding window, or fixed) and the token budget with a fake
clock; the race of two attempts (the first answer wins, the loser cancelled and awaited, a late
answer discarded, errors); and, against the ObjectServer with a heavy tail, the same bytes with
fewer slow reads, hedges within the budget, counted in loader.stats(), and no task left."""

from __future__ import annotations

import asyncio
import pickle
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from aioload import DataLoader
from aioload.sources import ObjectDataset
from aioload.sources.stores.hedge import BURST, MIN_READS, SHARE, WINDOW, Hedge, hedged
from aioload.stats.source_counts import SourceCounter
from aioload.testing import ObjectServer


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# -- the delay and the budget --------------------------------------------------------


def test_adaptive_delay_waits_for_enough_reads_then_is_the_p95() -> None:
    hedge = Hedge(True, clock=FakeClock())
    for i in range(MIN_READS - 1):
        hedge.record(0.010 + i / 1e6)
    assert hedge.delay() is None  # too few reads to know what is slow
    hedge.record(0.010)
    assert hedge.delay() is not None
    # 100 reads: 95 of them 10 ms, 5 slow ones: the p95 is the first slow one
    hedge = Hedge(True, clock=FakeClock())
    for seconds in [0.010] * 95 + [0.5, 0.6, 0.7, 0.8, 0.9]:
        hedge.record(seconds)
    assert hedge.delay() == 0.5


def test_adaptive_delay_follows_the_store_as_it_slows_down() -> None:
    hedge = Hedge(True, clock=FakeClock())
    for _ in range(WINDOW):
        hedge.record(0.010)
    assert hedge.delay() == 0.010
    for _ in range(WINDOW):  # the window forgets the fast reads
        hedge.record(0.200)
    assert hedge.delay() == 0.200


def test_a_fixed_delay_is_the_delay_from_the_first_read() -> None:
    assert Hedge(0.25).delay() == 0.25


def test_the_budget_allows_a_few_hedges_per_hundred_reads() -> None:
    hedge = Hedge(0.1)
    taken = sum(hedge.take_token() for _ in range(100))
    assert taken == BURST  # the first burst
    granted = 0
    for _ in range(1000):
        hedge.record(0.01)
        granted += hedge.take_token()
    assert granted == int(1000 * SHARE)  # then SHARE of a token per read


@pytest.mark.parametrize("setting", [0, -1.0, float("inf"), "yes", None])
def test_bad_settings_are_refused(setting: Any) -> None:
    with pytest.raises(ValueError, match="hedge should be"):
        Hedge(setting)
    with pytest.raises(ValueError, match="hedge should be"):
        ObjectDataset("memory:///x/", keys=["a"], hedge=setting)


def test_a_hedge_pickles_fresh_with_its_settings() -> None:
    hedge = Hedge(0.3)
    hedge.take_token()
    copy = pickle.loads(pickle.dumps(hedge))
    assert (copy.setting, copy.tokens) == (0.3, BURST)


# -- the race ------------------------------------------------------------------------


class Attempts:
    """Attempt n answers when ``release[n]`` is set (or at once when it has no event)."""

    def __init__(self, answers: list[Any], release: dict[int, asyncio.Event]) -> None:
        self.answers = answers
        self.release = release
        self.started = 0
        self.cancelled: list[int] = []

    def __call__(self) -> Awaitable[Any]:
        n = self.started
        self.started += 1
        return self.run(n)

    async def run(self, n: int) -> Any:
        try:
            if n in self.release:
                await self.release[n].wait()
        except asyncio.CancelledError:
            self.cancelled.append(n)
            raise
        answer = self.answers[n]
        if isinstance(answer, BaseException):
            raise answer
        return answer


def run(body: Callable[[], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        result = await asyncio.wait_for(body(), 10)
        assert asyncio.all_tasks() == {asyncio.current_task()}  # nothing left running
        return result

    return asyncio.run(main())


def test_a_slow_first_attempt_loses_to_the_hedge_and_is_cancelled() -> None:
    async def body() -> None:
        attempts = Attempts(["first", "second"], {0: asyncio.Event()})
        counts = SourceCounter()
        assert await hedged(Hedge(0.001), attempts, counts) == "second"
        assert attempts.cancelled == [0]
        taken = counts.take()
        assert taken is not None and (taken.requests, taken.hedges) == (2, 1)

    run(body)


def test_a_read_begun_before_the_delay_was_known_is_hedged_once_it_is() -> None:
    async def body() -> None:
        hedge = Hedge(True)
        attempts = Attempts(["first", "second"], {0: asyncio.Event()})

        async def others_finish() -> None:  # reads beside this one teach the hedge the p95
            await asyncio.sleep(0.01)
            for _ in range(MIN_READS):
                hedge.record(0.001)

        helper = asyncio.ensure_future(others_finish())
        assert await hedged(hedge, attempts, SourceCounter()) == "second"
        assert attempts.cancelled == [0]
        await helper

    run(body)


def test_a_fast_first_attempt_sends_no_hedge() -> None:
    async def body() -> None:
        attempts = Attempts(["first"], {})
        counts = SourceCounter()
        assert await hedged(Hedge(5.0), attempts, counts) == "first"
        assert attempts.started == 1
        taken = counts.take()
        assert taken is not None and (taken.requests, taken.hedges) == (1, 0)

    run(body)


def test_without_a_token_the_read_waits_for_its_first_attempt() -> None:
    async def body() -> None:
        hedge = Hedge(0.001, burst=0.0)
        release = asyncio.Event()
        attempts = Attempts(["first"], {0: release})
        asyncio.get_running_loop().call_later(0.05, release.set)
        assert await hedged(hedge, attempts, SourceCounter()) == "first"
        assert attempts.started == 1

    run(body)


def test_the_first_attempts_error_waits_for_the_hedge() -> None:
    async def body() -> None:
        first, second = asyncio.Event(), asyncio.Event()
        attempts = Attempts([ConnectionError("first failed"), "second"], {0: first, 1: second})

        async def fail_then_answer() -> None:
            while attempts.started < 2:
                await asyncio.sleep(0.001)
            first.set()
            await asyncio.sleep(0.01)
            second.set()

        helper = asyncio.ensure_future(fail_then_answer())
        assert await hedged(Hedge(0.001), attempts, SourceCounter()) == "second"
        await helper

    run(body)


def test_both_attempts_failing_raise_an_error() -> None:
    async def body() -> None:
        first = asyncio.Event()
        attempts = Attempts([ConnectionError("first"), ConnectionError("second")], {0: first})

        async def release() -> None:
            while attempts.started < 2:
                await asyncio.sleep(0.001)
            first.set()

        helper = asyncio.ensure_future(release())
        with pytest.raises(ConnectionError):
            await hedged(Hedge(0.001), attempts, SourceCounter())
        await helper

    run(body)


def test_a_cancelled_read_cancels_both_attempts() -> None:
    async def body() -> None:
        attempts = Attempts(["first", "second"], {0: asyncio.Event(), 1: asyncio.Event()})
        read = asyncio.ensure_future(hedged(Hedge(0.001), attempts, SourceCounter()))
        while attempts.started < 2:
            await asyncio.sleep(0.001)
        read.cancel()
        with pytest.raises(asyncio.CancelledError):
            await read
        assert sorted(attempts.cancelled) == [0, 1]

    run(body)


def test_a_late_answer_that_lost_is_discarded() -> None:
    async def body() -> None:
        discarded: list[Any] = []
        attempts = Attempts(["first", "second"], {0: asyncio.Event()})

        class Stubborn(Attempts):
            async def run(self, n: int) -> Any:  # the first attempt answers though cancelled
                if n == 0:
                    try:
                        await asyncio.Event().wait()
                    except asyncio.CancelledError:
                        return "late"
                return "second"

        attempts = Stubborn([], {})
        answer = await hedged(Hedge(0.001), attempts, SourceCounter(), discarded.append)
        assert (answer, discarded) == ("second", ["late"])

    run(body)


# -- the test bed --------------------------------------------------------------------


def test_the_servers_heavy_tail_is_the_same_for_a_seed(tmp_path: Path) -> None:
    from aioload.testing.arrivals import most_in_window, per_second

    (tmp_path / "x.bin").write_bytes(b"x" * 10)

    def slow_requests(seed: int) -> list[int]:
        import urllib.request

        from aioload.testing.object_server import LOOPBACK_OPENER

        slow = []
        with ObjectServer(tmp_path, tail=(0.2, 0.3), seed=seed) as server:
            for i in range(30):
                began = time.monotonic()
                with LOOPBACK_OPENER.open(urllib.request.Request(server.url + "/x.bin")) as a:
                    assert a.read() == b"x" * 10
                if time.monotonic() - began >= 0.3:
                    slow.append(i)
            arrivals = server.arrivals()
            assert len(arrivals) == 30 == sum(per_second(arrivals))
            assert 1 <= most_in_window(arrivals) <= 30
        return slow

    slow = slow_requests(1)
    assert 0 < len(slow) < 30 and slow == slow_requests(1)
    with pytest.raises(ValueError, match="tail"):
        ObjectServer(tmp_path, tail=(2.0, 1.0))


def test_most_in_window_counts_a_sliding_second() -> None:
    from aioload.testing.arrivals import most_in_window

    assert most_in_window([]) == 0
    assert most_in_window([0.5, 1.2, 1.4, 1.49, 2.6]) == 4
    assert most_in_window([0.0, 1.0, 2.0]) == 1  # half-open: [t, t + 1)


# -- end to end ----------------------------------------------------------------------

OBJECTS = 200


@pytest.fixture(scope="module")
def tail_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tail")
    (folder / "objects").mkdir()
    for i in range(OBJECTS):
        (folder / "objects" / f"{i:05d}.bin").write_bytes(i.to_bytes(4, "little") * 256)
    return folder


def read_all(url: str, hedge: bool | float) -> tuple[dict[str, bytes], int, Any, str]:
    """Every object, the reads that took 0.9 s or more, the loader's stats and its line."""
    keys = [f"{i:05d}.bin" for i in range(OBJECTS)]

    class Timed(ObjectDataset):
        slow = 0

        async def __getitem__(self, key: Any) -> Any:
            began = time.monotonic()
            data = await super().__getitem__(key)
            if time.monotonic() - began >= 0.9:
                Timed.slow += 1
            return data

    dataset = Timed(url + "/objects/", keys=keys, hedge=hedge)
    loader = DataLoader(dataset, batch_size=20, collate_fn=list, concurrency=20)
    data = {}
    for indices, batch in zip(loader.batch_sampler, loader, strict=True):
        data.update({keys[i]: item for i, item in zip(indices, batch, strict=True)})
    return data, Timed.slow, loader.stats().epoch, loader.stats().format()


@pytest.mark.timeout(120)
def test_hedged_reads_cut_the_tail_within_their_budget(tail_folder: Path) -> None:
    with ObjectServer(tail_folder, latency=0.002, tail=(0.05, 1.5), seed=3) as server:
        plain, plain_slow, plain_stats, _ = read_all(server.url, False)
        plain_requests = server.stats()["requests"]
        hedged_data, hedged_slow, stats, line = read_all(server.url, 0.2)
        hedged_requests = server.stats()["requests"] - plain_requests
    assert hedged_data == plain and len(plain) == OBJECTS
    assert plain_stats.hedges == 0 and plain_stats.store_requests == OBJECTS == plain_requests
    assert plain_slow >= 3  # the tail is there without hedges
    assert hedged_slow < plain_slow
    assert 1 <= stats.hedges <= BURST + SHARE * OBJECTS
    assert stats.store_requests == OBJECTS + stats.hedges == hedged_requests
    assert f"hedges {stats.hedges}" in line and "requests 2" in line


@pytest.mark.timeout(120)
def test_adaptive_hedges_stay_within_the_budget_and_leave_nothing(tail_folder: Path) -> None:
    async def main(url: str) -> tuple[list[bytes], int]:
        dataset = ObjectDataset(url + "/objects/", keys=[f"{i:05d}.bin" for i in range(OBJECTS)])
        hedging = ObjectDataset(
            url + "/objects/", keys=[f"{i:05d}.bin" for i in range(OBJECTS)], hedge=True
        )
        want = await asyncio.gather(*(dataset[i] for i in range(OBJECTS)))
        got = []
        for start in range(0, OBJECTS, 20):
            got += await asyncio.gather(*(hedging[i] for i in range(start, start + 20)))
        assert got == want
        assert asyncio.all_tasks() == {asyncio.current_task()}
        counts = hedging.take_source_counts()
        assert counts is not None
        return got, counts.hedges

    with ObjectServer(tail_folder, latency=0.002, tail=(0.05, 1.0), seed=5) as server:
        got, hedges = asyncio.run(main(server.url))
    assert len(got) == OBJECTS
    assert hedges <= BURST + SHARE * OBJECTS


@pytest.mark.timeout(120)
def test_stream_reads_are_hedged_through_open_read(tmp_path: Path) -> None:
    import json

    from aioload.sources import JsonLinesDataset

    files = 40
    for n in range(files):
        lines = "".join(json.dumps({"n": n, "i": i}) + "\n" for i in range(3))
        (tmp_path / f"part-{n:03d}.jsonl").write_text(lines)

    def rows(url: str, hedge: bool | float) -> tuple[list[Any], Any]:
        dataset = JsonLinesDataset(url + "/part-{000..039}.jsonl", hedge=hedge, files_in_flight=8)
        loader = DataLoader(dataset, batch_size=6, collate_fn=list)
        got = sorted((row["n"], row["i"]) for batch in loader for row in batch)
        return got, loader.stats().epoch

    with ObjectServer(tmp_path, latency=0.002, tail=(0.1, 1.5), seed=2) as server:
        plain, plain_stats = rows(server.url, False)
        hedged_rows, stats = rows(server.url, 0.3)
    assert hedged_rows == plain == [(n, i) for n in range(files) for i in range(3)]
    assert plain_stats.hedges == 0 and plain_stats.store_requests == files
    assert 1 <= stats.hedges <= BURST + SHARE * files
    assert stats.store_requests == files + stats.hedges


@pytest.mark.timeout(120)
def test_one_hedged_budgeted_dataset_serves_four_loops_at_once(tail_folder: Path) -> None:
    import threading

    keys = [f"{i:05d}.bin" for i in range(OBJECTS)]
    results: dict[int, list[bytes]] = {}
    errors: list[BaseException] = []

    with ObjectServer(tail_folder, latency=0.002, tail=(0.05, 0.5), seed=7) as server:
        dataset = ObjectDataset(
            server.url + "/objects/", keys=keys, hedge=True, max_requests_per_second=2000
        )

        def read(n: int) -> None:
            async def main() -> list[bytes]:
                part = range(n, OBJECTS, 4)
                got = list(await asyncio.gather(*(dataset[i] for i in part)))
                assert asyncio.all_tasks() == {asyncio.current_task()}
                return got

            try:
                results[n] = asyncio.run(main())
            except BaseException as error:  # reported below, in the test's thread
                errors.append(error)

        threads = [threading.Thread(target=read, args=(n,)) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert not errors
    for n in range(4):
        assert results[n] == [i.to_bytes(4, "little") * 256 for i in range(n, OBJECTS, 4)]
    counts = dataset.take_source_counts()
    assert counts is not None and counts.requests == OBJECTS + counts.hedges
