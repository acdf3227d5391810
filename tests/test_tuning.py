"""concurrency="auto"'s controller, driven by a fake clock and a simulated store (no sleeps)."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from aioload.read.tuning import ConcurrencyTuner


@dataclass
class Store:
    """A simulated object store: ``latency`` per read while it keeps up, at most
    ``capacity`` reads/s (beyond: reads queue, their latency grows), and a request-rate
    cap ``rate_limit`` beyond which reads are throttled (answered at once, not read)."""

    latency: float = 0.02
    capacity: float = 20_000.0
    rate_limit: float | None = None
    crowding: float | None = None  # in flight at which the client's own cost halves capacity

    def read_latency(self, in_flight: int) -> float:
        capacity = self.capacity
        if self.crowding is not None:
            capacity /= 1.0 + in_flight / self.crowding
        return max(self.latency, in_flight / capacity)


@dataclass
class Run:
    throughput: list[tuple[float, float]]  # (time, items/s) at each simulated step
    limits: list[int]
    throttled: int
    sent: int


def simulate(
    tuner: ConcurrencyTuner,
    store: Store,
    seconds: float,
    *,
    demand: int | None = None,
    steps: tuple[tuple[float, float], ...] = (),
    now: float = 0.0,
) -> Run:
    """Runs the tuner against ``store`` for ``seconds``: each step keeps ``tuner.limit``
    reads (at most ``demand``) in flight for one read's latency, and tells the tuner of
    each read's end, spread evenly over the step."""
    end = now + seconds
    pending = list(steps)
    run = Run([], [], 0, 0)
    while now < end:
        while pending and pending[0][0] <= now:
            store.latency = pending.pop(0)[1]
        in_flight = tuner.limit if demand is None else min(demand, tuner.limit)
        latency = store.read_latency(in_flight)
        wanted = in_flight / latency  # requests/s
        allowed = wanted if store.rate_limit is None else min(wanted, store.rate_limit)
        served = max(1, round(in_flight * allowed / wanted))
        throttled = in_flight - served
        run.sent += in_flight
        run.throttled += throttled
        run.throughput.append((now, served / latency))
        run.limits.append(tuner.limit)
        gap = latency / in_flight
        for index in range(in_flight):
            now += gap
            if index < throttled:
                tuner.throttled(now)
            else:
                tuner.finished(now, latency)
    return run


def best(store: Store, most: int = 4096) -> float:
    """The store's best throughput at any limit up to ``most``."""
    latency = store.read_latency(most)
    served = most / latency
    return served if store.rate_limit is None else min(served, store.rate_limit)


def reached(run: Run, share: float, target: float) -> float | None:
    """When the throughput first reached ``share`` of ``target`` (None: never)."""
    return next((t for t, x in run.throughput if x >= share * target), None)


def settled(run: Run, after: float) -> list[float]:
    return [x for t, x in run.throughput if t >= after]


def test_it_grows_to_the_stores_capacity_and_keeps_it() -> None:
    store = Store(latency=0.02, capacity=20_000)  # 400 in flight are enough
    tuner = ConcurrencyTuner(most=4096, start=16)
    run = simulate(tuner, store, 10.0)
    target = best(store)
    first = reached(run, 0.9, target)
    assert first is not None and first < 3.0
    late = settled(run, 5.0)
    assert sum(late) / len(late) >= 0.85 * target
    # Not far beyond the knee: more reads in flight would only queue.
    assert max(run.limits[len(run.limits) // 2 :]) <= 4 * 400


def best_fixed(store: Store) -> float:
    """The best throughput of a sweep of fixed limits, 16 to 4096 (a benchmark's best)."""
    return max(n / store.read_latency(n) for n in (16, 32, 64, 128, 256, 512, 1024, 2048, 4096))


# A client whose CPU caps it near 6,000 reads/s and whose reads in flight cost it more as
# they grow (4,096 in flight: about half): the shape measured against the ObjectServer.
CPU_BOUND = {"capacity": 6_000.0, "crowding": 4_096.0}


@pytest.mark.parametrize("latency", [0.02, 0.08])
def test_it_reaches_the_best_fixed_limit_within_3_seconds(latency: float) -> None:
    store = Store(latency=latency, **CPU_BOUND)
    tuner = ConcurrencyTuner(most=4096, start=16)
    run = simulate(tuner, store, 12.0)
    target = best_fixed(store)
    first = reached(run, 0.9, target)
    assert first is not None and first <= 3.0, first
    late = settled(run, 3.0)
    assert sum(late) / len(late) >= 0.9 * target


def test_after_a_latency_step_it_is_back_near_the_best_within_3_seconds() -> None:
    store = Store(latency=0.02, **CPU_BOUND)
    tuner = ConcurrencyTuner(most=4096, start=16)
    simulate(tuner, store, 6.0)
    run = simulate(tuner, store, 12.0, steps=((6.0, 0.08),), now=6.0)
    target = best_fixed(Store(latency=0.08, **CPU_BOUND))
    first = reached(run, 0.9, target)
    assert first is not None and first - 6.0 <= 3.0, first
    late = settled(run, 9.0)
    assert sum(late) / len(late) >= 0.9 * target


def test_it_follows_a_latency_step() -> None:
    store = Store(latency=0.02, capacity=20_000)
    tuner = ConcurrencyTuner(most=4096, start=16)
    simulate(tuner, store, 5.0)
    before = tuner.limit
    run = simulate(tuner, store, 15.0, steps=((5.0, 0.08),), now=5.0)
    after = Store(latency=0.08, capacity=20_000)
    assert tuner.limit > before  # 1600 in flight are needed now
    late = settled(run, 14.0)
    assert sum(late) / len(late) >= 0.8 * best(after)


def test_a_throttling_store_gets_fewer_requests() -> None:
    store = Store(latency=0.02, capacity=1e9, rate_limit=2000)  # 40 in flight fit the cap
    tuner = ConcurrencyTuner(most=4096, start=16)
    run = simulate(tuner, store, 20.0)
    assert tuner.throttles > 0
    late = [limit for limit in run.limits[len(run.limits) // 2 :]]
    assert max(late) <= 200
    assert run.throttled / run.sent < 0.25
    throughput = settled(run, 10.0)
    assert sum(throughput) / len(throughput) >= 0.6 * 2000


def test_a_limit_that_holds_nothing_back_is_not_raised() -> None:
    # Only 8 reads are ever wanted at once (the consumer is slow): 16 is not binding.
    store = Store(latency=0.02)
    tuner = ConcurrencyTuner(most=4096, start=16)
    run = simulate(tuner, store, 5.0, demand=8)
    assert set(run.limits) == {16}
    assert tuner.changes == 0


def test_the_limit_stays_within_its_bounds() -> None:
    store = Store(latency=0.01, capacity=1e9)  # more in flight always pays
    tuner = ConcurrencyTuner(most=64, least=4, start=1)
    assert tuner.limit == 4
    run = simulate(tuner, store, 5.0)
    assert max(run.limits) == 64
    cut = ConcurrencyTuner(most=64, least=4, start=4)
    for step in range(10):
        cut.throttled(float(step))
    assert cut.limit == 4


def test_throttles_answered_for_reads_sent_before_a_cut_cut_once() -> None:
    tuner = ConcurrencyTuner(most=4096, start=1000)
    tuner.finished(0.0, 0.05)
    assert tuner.throttled(0.01) and tuner.limit == 700
    assert not tuner.throttled(0.02)  # within one latency of the cut
    assert tuner.limit == 700 and tuner.throttles == 2
    assert tuner.throttled(0.2) and tuner.limit == 490


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError):
        ConcurrencyTuner(most=0)
    with pytest.raises(ValueError):
        ConcurrencyTuner(most=4, least=8)


def test_noise_does_not_walk_the_limit_down() -> None:
    # A store the client saturates at 4,000 reads/s (its CPU, say): more in flight only
    # queue, and each measurement is a few percent off. Probes downward that lose "under
    # 5 %" must not add up to a limit far below the knee.
    draws = random.Random(0)
    store = Store(latency=0.02, capacity=4000)
    tuner = ConcurrencyTuner(most=4096, start=16)
    real = store.read_latency

    def noisy(in_flight: int) -> float:
        return real(in_flight) * (1.0 + 0.08 * (draws.random() - 0.5))

    store.read_latency = noisy  # type: ignore[method-assign]
    run = simulate(tuner, store, 60.0)
    late = settled(run, 30.0)
    assert sum(late) / len(late) >= 0.85 * 4000
    assert min(run.limits[len(run.limits) // 2 :]) >= 0.5 * 80
