"""concurrency="auto"'s controller, driven by a fake clock and a simulated store (no sleeps)."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

import pytest

from aioload.read.tuning import LEAST_HOLD_INTERVAL, THROTTLE_COOLDOWN, ConcurrencyTuner


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


def test_a_limit_grown_past_the_reads_really_in_flight_goes_back_to_the_best() -> None:
    # 300 reads at most are in flight (a stall through one client, or a consumer that
    # binds): a growth step to 512 is followed by the best limit measured below it (and
    # probes up to the 300), not held because "it holds nothing back".
    store = Store(latency=0.02, capacity=1e9)
    tuner = ConcurrencyTuner(most=4096, start=16)
    run = simulate(tuner, store, 10.0, demand=300)
    assert 512 in run.limits
    assert max(run.limits[len(run.limits) // 4 :]) < 400


def test_the_lowest_limit_near_the_best_is_held_after_growing() -> None:
    # Flat past the knee (400 in flight), with a throughput that still rises a little
    # (0.1 % from 512 to 1,024): growth stops at 1,024 and holds 512, not the highest
    # limit on a lead inside the noise (before the probes: 1.5 s).
    class Flat(Store):
        def read_latency(self, in_flight: int) -> float:
            return max(self.latency, in_flight / (20_000 * (1 + in_flight / 400_000)))

    tuner = ConcurrencyTuner(most=4096, start=16)
    simulate(tuner, Flat(latency=0.02), 1.5)
    assert tuner.limit == 512


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
    assert tuner.throttled(0.01) and tuner.limit == 850
    assert not tuner.throttled(0.02)  # within one latency of the cut
    assert tuner.limit == 850 and tuner.throttles == 2
    assert tuner.throttled(0.2) and tuner.limit == 722


def finish(tuner: ConcurrencyTuner, now: float, count: int, latency: float) -> float:
    """``count`` reads of ``latency`` ending one after the other from ``now``; the time after."""
    for _ in range(count):
        now += latency / tuner.limit
        tuner.finished(now, latency)
    return now


def test_after_a_throttle_and_its_cooldown_the_limit_goes_back_near_the_throttled_one() -> None:
    # A throttle at 1,000: cut to 850, and after the cooldown back at 95 % of 1,000 at
    # once, not growing 5 % an interval from 850.
    tuner = ConcurrencyTuner(most=4096, start=1000)
    now = finish(tuner, 0.0, 1, 0.05)
    tuner.throttled(now)
    assert tuner.limit == 850
    cut, changes = now, tuner.changes
    while tuner.changes == changes:
        now = finish(tuner, now, 1, 0.05)
    assert tuner.limit == 950
    assert now - cut >= THROTTLE_COOLDOWN * LEAST_HOLD_INTERVAL


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


def test_a_settled_limit_is_probed_less_and_less() -> None:
    # At a knee found, every probe costs throughput (the one below the knee loses in
    # proportion) and finds nothing: after probes that failed, they come rarer, so most of
    # the time is spent at the limit held, and the throughput with it.
    store = Store(latency=0.02, capacity=4000)  # the knee: 80 in flight
    tuner = ConcurrencyTuner(most=4096, start=16)
    run = simulate(tuner, store, 60.0)
    late = [limit for (t, _), limit in zip(run.throughput, run.limits, strict=True) if t >= 30.0]
    held = max(set(late), key=late.count)
    assert late.count(held) >= 0.85 * len(late)
    changes = sum(1 for a, b in itertools.pairwise(late) if a != b)
    # A probe cycle (up, down, back: three changes) at most every 16 intervals of >= 0.3 s.
    assert changes <= 3 * (30.0 / (16 * 0.3)) + 3
    assert sum(settled(run, 30.0)) / len(late) >= 0.9 * 4000


def test_probes_come_often_again_when_the_store_changes() -> None:
    # Rare probes must not leave the limit behind a store that got faster: a latency step
    # down (the same limit now reads more) starts growth again, and probes with it.
    store = Store(latency=0.08, capacity=4000)
    tuner = ConcurrencyTuner(most=4096, start=16)
    run = simulate(tuner, store, 60.0, steps=((30.0, 0.02),))
    assert sum(settled(run, 40.0)) / len(settled(run, 40.0)) >= 0.85 * 4000


class ClientBound(Store):
    """A store whose reads also queue in the client (its CPU): latency is the store's plus
    the client's queue, which grows with the reads in flight, faster as they crowd it."""

    def read_latency(self, in_flight: int) -> float:
        assert self.crowding is not None
        capacity = self.capacity / (1.0 + in_flight / self.crowding)
        return self.latency + in_flight / capacity


def test_a_latency_step_that_moves_a_client_bound_limit_by_a_third_is_followed() -> None:
    # Held where the client's CPU bounds it, a 20 -> 80 ms step lowers throughput by about
    # a third only (less than the half that moves a held limit at once); two intervals
    # running that far off start the growth again.
    store = ClientBound(latency=0.02, capacity=6000, crowding=2000)
    best_at_80 = max(
        n / ClientBound(latency=0.08, capacity=6000, crowding=2000).read_latency(n)
        for n in (16, 64, 256, 1024, 4096)
    )
    tuner = ConcurrencyTuner(most=4096, start=16)
    run = simulate(tuner, store, 20.0, steps=((10.0, 0.08),))
    before = [x for t, x in run.throughput if 9.0 <= t < 10.0]
    after = [x for t, x in run.throughput if 10.0 <= t < 10.2]
    assert sum(after) / len(after) < 0.75 * sum(before) / len(before)  # what the step does
    back = next((t for t, x in run.throughput if t >= 10.0 and x >= 0.9 * best_at_80), None)
    assert back is not None and back - 10.0 < 3.0
    late = settled(run, 14.0)
    assert sum(late) / len(late) >= 0.9 * best_at_80


@pytest.mark.parametrize("latency", [0.02, 0.08])
def test_a_capped_store_is_read_near_its_cap_with_few_throttles(latency: float) -> None:
    # After a throttle the limit saws just under the cap (cut to 85 %, then 5 % more an
    # interval until the next throttle), not far under it.
    store = Store(latency=latency, capacity=1e9, rate_limit=2000)
    tuner = ConcurrencyTuner(most=4096, start=16)
    run = simulate(tuner, store, 30.0)
    late = settled(run, 10.0)
    assert sum(late) / len(late) >= 0.9 * 2000
    assert run.throttled / run.sent < 0.05


def test_a_ceiling_that_is_gone_lets_the_limit_grow_again() -> None:
    # One burst of throttles (another job on the bucket, say), then none: the limit is
    # not kept under a ceiling that no longer is.
    store = Store(latency=0.02, capacity=20_000)  # the knee: 400 in flight
    tuner = ConcurrencyTuner(most=4096, start=16)
    simulate(tuner, store, 5.0)
    for step in range(8):
        tuner.throttled(5.0 + 0.1 * step)
    run = simulate(tuner, store, 25.0, now=6.0)
    late = settled(run, 20.0)
    assert sum(late) / len(late) >= 0.85 * best(store)
