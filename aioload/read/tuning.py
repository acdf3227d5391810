"""``concurrency="auto"``: the item reads in flight, tuned while the loader runs.

:class:`ConcurrencyTuner` is the controller, a pure class: it is given the time and
what happened (an item finished after so many seconds, the store throttled), and says
what the limit is. Nothing in it sleeps or reads a clock, so it is tested with a fake
clock and a simulated store. :class:`AutoConcurrency` is the glue an
:class:`~aioload.read.eager.ItemPool` calls: the real clock, and the process's count of
throttled reads (:mod:`aioload.stats.throttles`).

How the limit moves, one *interval* at a time (at least 16 items, and while it grows
:data:`LEAST_INTERVAL` seconds and two mean latencies, while it holds
:data:`LEAST_HOLD_INTERVAL` seconds and three; the first latency after a change is not
measured, so that the new limit has filled):

- **start**: the first interval measures throughput ``X`` and mean latency ``L`` at
  the starting limit. By Little's law ``X * L`` items were really in flight: when that is
  well below the limit, the limit is not what holds the reads back (the consumer, the
  window or the dataset is), and it is held. Otherwise the limit grows while each step
  gains at least 15 % throughput: it doubles, and quadruples while a step gained nearly in
  proportion (the store is far from its knee: at 80 ms from 16, four doublings become
  two). A quadrupling that gains nothing is followed by the doubling it skipped, and the
  lowest limit that measured within 5 % of the best throughput is held. A step that gave
  less than the smaller limit before it is measured once more first: one stalled
  interval (new connections opening, the collector) must not decide where growth stops;
- **hold**: every :data:`PROBE_EVERY` intervals it probes 25 % more; a probe that gains
  3 % is kept (and the next probe follows at once). One that does not is followed by a
  probe 20 % below the held limit, kept when it loses under 2 %: the latency that rose
  without throughput gain is given back. The thresholds lean upward because the costs do:
  a limit above the knee only queues reads, one below it loses throughput in proportion.
  When the probe upward and the one below both fail, the next waits twice as long (up
  to :data:`MOST_PROBE_EVERY` intervals): at a knee found, each probe costs throughput
  (the one below it loses in proportion) and finds nothing; a probe kept, a throttle or
  a new growth brings the wait back to :data:`PROBE_EVERY`.
  A throughput or a mean latency that moves by half or more while the limit is held (the
  store's latency stepped up or down), or by a quarter in two intervals running, starts
  the growth again from the held limit (a 20 -> 80 ms step at a limit where the client's
  CPU is the bound moves each by about 30 % only; one interval that far off is noise);
- **throttles**: a read the store throttled (503, 429) cuts the limit to 85 % at once
  (once a latency: the answers to reads sent before a cut do not cut again), and the
  limit is then near a ceiling: after :data:`THROTTLE_COOLDOWN` intervals it grows by
  5 % an interval, without waiting for probes, until the next throttle cuts it again
  (additive increase, multiplicative decrease: the limit saws between 85 % and 100 % of
  the store's cap: 0.92-0.95x of it on the tests' simulated stores, where a 70 % cut
  and probes every few intervals kept 0.81-0.85x). :data:`CEILING_INTERVALS` intervals
  of growth with no throttle, and the ceiling is gone: the limit is held and probed again.

The limit stays between ``least`` and ``most``; the loader's ``most`` is what the
window's memory budget admits (:data:`~aioload.settings.checks.AUTO_MOST_CONCURRENCY`
at most).

Example::

    >>> tuner = ConcurrencyTuner(most=1024, start=16)
    >>> now = 0.0
    >>> for _ in range(200):            # a store that answers in 20 ms, whatever the load
    ...     now += 0.02 / tuner.limit
    ...     moved = tuner.finished(now, 0.02)  # whether the limit changed
    >>> tuner.limit > 16
    True
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from aioload.stats.throttles import throttles_noted

__all__ = [
    "LEAST_HOLD_INTERVAL",
    "LEAST_INTERVAL",
    "CEILING_INTERVALS",
    "MOST_PROBE_EVERY",
    "PROBE_EVERY",
    "THROTTLE_COOLDOWN",
    "AutoConcurrency",
    "ConcurrencyTuner",
]

LEAST_INTERVAL = 0.15
"""The shortest measuring interval while the limit grows, in seconds."""

LEAST_HOLD_INTERVAL = 0.3
"""The shortest measuring interval at a held limit and its probes, in seconds: they compare
throughputs a few percent apart, which a shorter interval's noise (batches, the collector,
other processes on the cores) would decide."""

PROBE_EVERY = 4
"""Intervals at a held limit between two probes, at first."""

MOST_PROBE_EVERY = 16
"""The most intervals between two probes, after probes that found nothing (at least 4.8 s)."""

THROTTLE_COOLDOWN = 2
"""Intervals after a throttle during which the limit does not grow."""

CEILING_INTERVALS = 16
"""Intervals of growth after a throttle, with no throttle again, that end its ceiling."""

_LEAST_ITEMS = 16
_GROWTH = 1.15  # a step must gain this much throughput to be followed by another
_PROPORTIONAL = 0.8  # a step that gained this share of its factor: the knee is far, quadruple
_PROBE_UP, _PROBE_DOWN = 1.25, 0.8
_KEEP_UP, _KEEP_DOWN = 1.03, 0.98
_THROTTLE_CUT = 85  # percent of the limit kept at a throttle
_REGAIN = 95  # percent of the throttled limit gone back to after the cooldown
_CEILING_STEP = 20  # near a ceiling the limit grows by 1/20 (5 %) an interval
_NEAR_BEST = 0.95  # after growing: the lowest limit with this share of the best throughput
_NOT_BINDING = 0.6  # Little's law's in-flight items below this share of the limit
_MOVED = 0.5  # a held limit's throughput or latency off by this share: the store changed
_DRIFTED = 0.25  # off by this share in two intervals running: the store changed too


class ConcurrencyTuner:
    """The limit on items in flight that maximises throughput (see the module docstring).

    Args:
        most: the highest limit (the window's budget).
        least: the lowest.
        start: the first limit (held to ``least..most``).

    Attributes:
        limit: the current limit.
        throttles: the throttles it was told of, in all.
        changes: how many times the limit changed.

    Example::

        tuner = ConcurrencyTuner(most=4096)
        tuner.finished(clock(), seconds)   # each item read
        tuner.throttled(clock())           # a 503 from the store
        pool.set_limit(tuner.limit)
    """

    def __init__(self, *, most: int, least: int = 1, start: int = 16) -> None:
        if least < 1 or most < least:
            raise ValueError(f"the limits should be 1 <= least <= most; got {least}, {most}")
        self.least = least
        self.most = most
        self.limit = min(most, max(least, start))
        self.throttles = 0
        self.changes = 0
        self._phase = "start"
        self._begun: float | None = None  # the interval's start (None: at the next item)
        self._items = 0
        self._latency = 0.0  # summed over the interval's items
        self._mean_latency = 0.0
        self._previous: tuple[int, float, float] | None = None  # the last step's (limit, X, L)
        self._skipped: int | None = None  # the doubling a quadrupling skipped, to try
        self._measured: dict[int, float] = {}  # limit -> X, while growing
        self._held: tuple[int, float] | None = None  # the held (limit, X) a probe left
        self._reference = 0.0  # throughput at the held limit
        self._reference_latency = 0.0  # and its mean latency
        self._held_for = 0
        self._probe_every = PROBE_EVERY  # intervals held before the next probe
        self._drifted = False  # the last held interval was off by _DRIFTED
        self._again = False  # this growth step is being measured a second time
        self._up_failed = False  # the probe upward of this round gained nothing
        self._cooldown = 0
        self._throttled_at = 0  # the limit the last cut was from (0: gone back near it)
        self._ceiling = 0  # intervals of growth left before a throttle's ceiling is gone

    def finished(self, now: float, latency: float) -> bool:
        """An item was read in ``latency`` seconds, ending at ``now``; whether the limit changed."""
        if self._begun is None:
            self._begun = now
        if not self._mean_latency:
            self._mean_latency = latency
        if now < self._begun:
            return False  # the limit just changed: the reads in flight are not its
        self._items += 1
        self._latency += latency
        elapsed = now - self._begun
        mean = self._latency / self._items
        if self._phase == "start":
            least = max(LEAST_INTERVAL, 2 * mean)
        else:
            least = max(LEAST_HOLD_INTERVAL, 3 * mean)
        if self._items < _LEAST_ITEMS or elapsed < least:
            return False
        return self._decide(now, self._items / elapsed, mean)

    def throttled(self, now: float, count: int = 1) -> bool:
        """The store throttled ``count`` reads at ``now``; whether the limit changed.

        The cut comes at once, not at the interval's end: a throttling store wants
        fewer requests now.
        """
        self.throttles += count
        if self._begun is not None and now < self._begun:
            return False  # answers to reads sent before the last cut: cut already
        self._cooldown = THROTTLE_COOLDOWN
        self._ceiling = CEILING_INTERVALS
        self._throttled_at = self.limit
        self._phase = "hold"
        self._held = None
        self._held_for = 0
        self._reference = self._reference_latency = 0.0
        self._forget_growth()
        return self._set(now, min(self.limit - 1, self.limit * _THROTTLE_CUT // 100))

    # -- the decisions --------------------------------------------------------------

    def _decide(self, now: float, throughput: float, latency: float) -> bool:
        self._mean_latency = latency
        if self._cooldown:
            self._cooldown -= 1
        phase = self._phase
        if phase == "start":
            return self._start(now, throughput, latency)
        if phase == "up":
            return self._probed_up(now, throughput)
        if phase == "down":
            return self._probed_down(now, throughput)
        return self._hold(now, throughput)

    def _start(self, now: float, throughput: float, latency: float) -> bool:
        if throughput * latency < _NOT_BINDING * self.limit:
            if self._measured:
                # Grown into a limit whose reads are not all in flight: a stall (thousands
                # of reads through one client) or a consumer that binds. Neither is helped
                # by more; holding it kept a loader at 2,048 through a 10-second stall.
                return self._hold_best(now)
            self._forget_growth()
            return self._set(now, self.limit)  # not what holds reads back: measure again
        self._measured[self.limit] = throughput
        previous, skipped = self._previous, self._skipped
        if previous is not None and throughput < previous[1] and not self._again:
            # Less than the smaller limit gave: more likely a stall (the new reads' first
            # connections, the collector, another process) than the store; once more.
            self._again = True
            return self._set(now, self.limit)
        if skipped is not None:  # the doubling a quadrupling skipped, now measured
            return self._hold_best(now)
        if previous is None or self._grew(previous, throughput, latency):
            factor = 2
            if previous is not None:
                step = self.limit / previous[0]
                if throughput >= previous[1] * (1.0 + _PROPORTIONAL * (step - 1.0)):
                    factor = 4
            self._previous = (self.limit, throughput, latency)
            if self.limit < self.most:
                return self._set(now, self.limit * factor)
            return self._hold_best(now)
        if previous is not None and self.limit > 2 * previous[0]:
            self._skipped = 2 * previous[0]
            return self._set(now, self._skipped)
        return self._hold_best(now)

    def _forget_growth(self) -> None:
        """Drops what growing measured: the next growth starts from the limit it finds
        (and the limit held after it is probed soon)."""
        self._previous, self._skipped = None, None
        self._measured.clear()
        self._probe_every = PROBE_EVERY

    def _grew(self, previous: tuple[int, float, float], throughput: float, latency: float) -> bool:
        """Whether the last step paid: throughput gained :data:`_GROWTH`, and latency did
        not rise with the reads added (Little's law: at the knee, latency grows as the
        limit and throughput stays). The two are measured over the same items but fail
        apart: a stall that bunches completions into the interval inflates the count, not
        the latencies."""
        step = self.limit / previous[0]
        return throughput >= previous[1] * _GROWTH and latency * _GROWTH <= previous[2] * step

    def _hold_best(self, now: float) -> bool:
        """Holds the lowest limit that measured within :data:`_NEAR_BEST` of the best
        throughput while growing. Past the knee, throughputs measured over short intervals
        differ by noise alone, and a limit far above it only queues reads (thousands of
        them in flight through one client stall it: benchmark runs at 80 ms held 2,048 on
        a 2 % lead over 1,024, or on a higher limit within 5 % of the best, and got
        0.68-0.8x of what 1,024 gives); a limit a little below the knee is found by the
        probes upward."""
        best = max(self._measured.values())
        best_limit = min(limit for limit, x in self._measured.items() if x >= _NEAR_BEST * best)
        self._phase = "hold"
        self._reference, self._held_for = self._measured[best_limit], 0
        self._reference_latency = 0.0
        self._forget_growth()
        return self._set(now, best_limit)

    def _hold(self, now: float, throughput: float) -> bool:
        if self._ceiling:
            return self._near_ceiling(now)
        reference, reference_latency = self._reference, self._reference_latency
        if reference == 0.0 or reference_latency == 0.0:
            self._reference = throughput if reference == 0.0 else reference
            self._reference_latency = self._mean_latency
            return self._set(now, self.limit)
        latency = self._mean_latency
        moved = max(
            abs(throughput - reference) / reference,
            abs(latency - reference_latency) / reference_latency,
        )
        drifted, self._drifted = self._drifted, moved > _DRIFTED
        if moved > _MOVED or (drifted and self._drifted):
            # Growth starts again from a fresh measure at this limit: this interval's
            # straddles the change, and a step from it would be measured against a mix.
            self._phase, self._drifted = "start", False
            self._forget_growth()
            return self._set(now, self.limit)
        if self._drifted:  # once: noise, or the first of a change (not folded in yet)
            return self._set(now, self.limit)
        self._reference = 0.75 * reference + 0.25 * throughput
        self._reference_latency = 0.75 * reference_latency + 0.25 * latency
        self._held_for += 1
        if self._held_for < self._probe_every:
            return self._set(now, self.limit)
        self._held = (self.limit, self._reference)
        self._held_for = 0
        self._up_failed = False
        if self.limit >= self.most:
            return self._probe_down(now)
        self._phase = "up"
        return self._set(now, math.ceil(self.limit * _PROBE_UP))

    def _near_ceiling(self, now: float) -> bool:
        """After a throttle: once the cooldown is over, the limit goes back to 95 % of the
        one the store throttled, and grows by 5 % an interval from there until the next
        throttle (or until the ceiling is gone: probes again). The cut drains what the
        store queued or refused; the limit it was cut from was throttled, but most of the
        way up to it was not: growing back 5 % an interval from 85 % spent most of each
        throttle's cycle below the cap."""
        if self._cooldown:
            return self._set(now, self.limit)
        regain, self._throttled_at = self._throttled_at * _REGAIN // 100, 0
        if regain > self.limit:
            return self._set(now, regain)
        self._ceiling -= 1
        if not self._ceiling:  # no throttle for a while: hold, measured afresh, and probe
            self._reference = self._reference_latency = 0.0
            self._held_for = 0
            return self._set(now, self.limit)
        return self._set(now, self.limit + max(1, self.limit // _CEILING_STEP))

    def _probed_up(self, now: float, throughput: float) -> bool:
        assert self._held is not None
        if throughput >= self._held[1] * _KEEP_UP:
            self._phase, self._reference = "hold", throughput
            self._reference_latency = 0.0  # measured again at the new limit
            self._probe_every = PROBE_EVERY
            self._held_for = PROBE_EVERY - 1  # and probe further at once
            return self._set(now, self.limit)
        self._up_failed = True
        return self._probe_down(now)

    def _probe_down(self, now: float) -> bool:
        assert self._held is not None
        lower = math.floor(self._held[0] * _PROBE_DOWN)
        if lower < self.least or lower == self._held[0]:
            self._phase = "hold"
            self._probe_less()
            return self._set(now, self._held[0])
        self._phase = "down"
        return self._set(now, lower)

    def _probed_down(self, now: float, throughput: float) -> bool:
        assert self._held is not None
        self._phase = "hold"
        self._reference_latency = 0.0  # measured again at the limit kept
        if throughput >= self._held[1] * _KEEP_DOWN:
            # The held throughput stays the reference: lower limits kept one after the
            # other, each "under 2 %" off the last, must not add up to a large loss.
            self._reference = self._held[1]
            self._probe_every = PROBE_EVERY
            return self._set(now, self.limit)
        self._reference = self._held[1]
        self._probe_less()
        return self._set(now, self._held[0])

    def _probe_less(self) -> None:
        """Probes found nothing: after a probe upward that failed, the next waits twice as
        long (see the module docstring). A round with no probe upward (the limit at its
        most) does not count: it did not look for a knee."""
        if self._up_failed:
            self._probe_every = min(MOST_PROBE_EVERY, 2 * self._probe_every)
        self._up_failed = False

    def _set(self, now: float, limit: int) -> bool:
        """Starts a new interval at ``limit``; whether that is a change."""
        limit = min(self.most, max(self.least, limit))
        changed = limit != self.limit
        self.limit = limit
        if changed:
            self._drifted = False  # a drift is a change at one limit
            self._again = False
        # Reads started under the old limit finish within about one latency: not measured.
        self._begun = now + (self._mean_latency if changed else 0.0)
        self._items, self._latency = 0, 0.0
        if changed:
            self.changes += 1
        return changed


class AutoConcurrency:
    """A :class:`ConcurrencyTuner` on the real clock, as an :class:`~aioload.read.eager.ItemPool`
    observer: the pool times each item that suspends and calls :meth:`item_done`.

    Throttles are the process's count (:func:`~aioload.stats.throttles.throttles_noted`):
    in a worker process that is the worker's own reads; on the loader's loop, every
    loader's of the process.

    Args:
        most: the highest limit.
        start: the first limit.
        clock: the clock (seconds).

    Example::

        auto = AutoConcurrency(most=4096)
        pool = ItemPool(auto.limit, observer=auto)
        ...
        auto.limit, auto.take_throttles()
    """

    def __init__(
        self, *, most: int, start: int = 16, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.tuner = ConcurrencyTuner(most=most, start=start)
        self.clock = clock
        self._seen = throttles_noted()
        self._reported = 0

    @property
    def limit(self) -> int:
        """The current limit."""
        return self.tuner.limit

    def item_done(self, started: float) -> int:
        """An item started at ``started`` (this clock) finished now: the limit, as it stands."""
        now = self.clock()
        self._poll(now)
        self.tuner.finished(now, now - started)
        return self.tuner.limit

    def _poll(self, now: float) -> None:
        noted = throttles_noted()
        if noted != self._seen:
            self.tuner.throttled(now, noted - self._seen)
            self._seen = noted

    def take_throttles(self) -> int:
        """The throttles seen since the previous call (for the loader's stats)."""
        self._poll(self.clock())
        total = self.tuner.throttles
        count, self._reported = total - self._reported, total
        return count
