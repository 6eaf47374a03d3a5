"""The transport margin: time kept before the deadline so the plan *arrives* by it.

The deadline that counts is the one where the plan is received. A plan published at
``deadline - publish_margin`` still crosses the middleware and the receiver's executor (on one
machine over Fast DDS: about 2 ms at the median, 4-8 ms at p99, docs/REFERENCE.md "Transport
margin"), so the loop gives up on the model ``publish_margin + transport_margin`` before the
deadline.

``transport_margin_ms`` (a :class:`~robot_latency.planner.config.RunSettings` field):

- ``>= 0``: that many ms, fixed (the CLI's ``run`` publishes to no middleware: 0).
- ``< 0`` (the ROS node's default, ``-1``): measured. The node feeds this estimator what it can
  observe of its own transport: a burst of loopback pings over the same middleware at start-up
  (the node subscribes to a probe topic it publishes), then every plan it publishes, received by
  its own subscription to the plan topic (one-way samples). The receiver's deadline counts from
  when it *sent* the command, so two legs count: the command's way in and the plan's way out.
  The loop adds what it observes of itself: how far past ``deadline - transport margin`` a
  fallback was published when the loop had waited for the model until its give-up time (its
  wake-up and fallback beyond ``publish_margin_ms``; a cycle that started late is queueing, not
  this). A receiver that acknowledges each plan (the client edge does: it echoes the plan's
  cycle on the ack topic from its plan callback) gives round trips, both legs at once and on the
  node's own clock (publish call to the ack's arrival): they include what a loopback cannot see,
  the receiver's own executor and scheduling delay at the moment a fallback goes out (measured
  here: 5-10 ms while the aborted engine still held the cores, against a loopback p99 of 3 ms).
  The margin is ``TAIL_HEADROOM * max(LEGS * max(one-way), max(round trip)) + max(loop excess)
  + slack`` over the newest ``window`` samples, clamped to ``[floor, cap]``; until
  ``min_samples`` samples of either kind have arrived *from the run* (its own plans, one way,
  or their round trips) it is ``start_ms`` (:data:`TRANSPORT_START_MS` for the node, or the
  cap where less; a new node does not yet know its transport, so it keeps much). The start-up
  pings (:meth:`TransportMargin.add_probe`) stay in the window but do not make the
  transport known: they cross an idle node, before any engine holds the cores, and a receiver's
  executor they never see. Seen in the demo: the first cycle, its margin 3.5 ms from the pings
  alone, published its fallback 1 ms past the give-up and it reached the receiver 5.7 ms later,
  2003.2 ms after the send against a 2,000 ms deadline; from the round trips of the next plans
  on the margin was 13.8 ms and no plan arrived late. The loop excess is sampled from every
  cycle that started before its give-up time, not only those that waited for the model until
  it: a model plan ready just before the give-up and published late (its parse, the publish
  call, a preempted thread) eats the transport's share as much. The largest, not a p99: a p99
  leaves one plan in a hundred to arrive late by construction, and the receiver's miss is what
  counts (seen on two busy cores: a plan published in time arrived 1.8 ms after its 400 ms
  deadline, past a p99 margin). And beyond the largest: the next sample exceeds the largest of
  the newest ``n`` about once in ``n + 1``, so the transport's share is kept with
  :data:`TAIL_HEADROOM` over it.

The estimator is thread-safe: samples come from the middleware's executor thread, the margin is
read by the loop's thread once per cycle.

The publish margin (the loop's own share: its wake-up at the give-up time, the fallback and the
publish call) is learned by the same estimator where ``publish_margin_ms < 0`` (the CLI's
``run`` default): :class:`PublishMargin` takes, every cycle the loop waited for the model until
its give-up time, how late after it the plan was published, and keeps the largest of the newest
``window`` plus the slack, between :data:`PUBLISH_FLOOR_MS` and half the deadline. A p99 would
leave one cycle in a hundred late by construction; the largest is what "no late plan" needs,
and the floor what a window of 1,024 cycles cannot see of rarer wake-ups. Until a sample is in
it is :data:`PUBLISH_START_MS` (docs/BENCHMARKS.md, "Planner loop: overshoot").
"""

from __future__ import annotations

import collections
import math
import threading
from dataclasses import dataclass
from typing import Any

#: Legs a command's reaction crosses: the command to the node, the plan back.
LEGS = 2
#: Added to the estimate (ns): what the samples' resolution and the receiver's own callback miss.
SLACK_NS = 500_000
#: The transport's largest observed legs are kept with this headroom (the tail beyond the
#: window's largest, see the module docstring). Its price at the demo's quiet 2,000 ms deadline:
#: a 13.6 ms margin becomes 17 ms.
TAIL_HEADROOM = 1.25
#: A learned publish margin starts here (ms), before the loop has seen its own lateness ...
PUBLISH_START_MS = 5.0
#: ... and never goes below this (ms). The largest lateness of the newest 1,024 cycles says
#: little of the next 10,000: unpinned beside a busy engine, quiet, a wake-up 2.6-16 ms late
#: came a few times in 10,000 cycles after the window's largest had fallen to about 1.4 ms, and
#: a floor of 2 ms left 3-13 of 10,000 late; at 5 ms only cycles the hypervisor stole from were
#: (docs/BENCHMARKS.md, "Planner loop: overshoot"). At the CLI's 400 ms deadline 5 ms is 1.25%.
PUBLISH_FLOOR_MS = 5.0
#: Newest wake-up samples a learned publish margin keeps the largest of.
PUBLISH_WINDOW = 1024
#: A measured transport margin starts here (ms), before the run's own samples, where the cap
#: (100 ms by default, or a quarter of the budget) is not less. The cap is higher: under load a
#: measured tail beyond 50 ms is real (busy, one core: plans arrived 44-48 ms after their
#: publish, the estimate 99-145 ms), and a cap below it publishes plans the loop knows may
#: arrive late.
TRANSPORT_START_MS = 50.0


@dataclass(frozen=True)
class MarginSettings:
    """How the transport margin is chosen (see the module docstring).

    Args:
        fixed_ms: the margin when >= 0; < 0: measured.
        floor_ms: the measured margin never goes below this.
        cap_ms: nor above this (and it is the margin before enough samples arrived).
        window: newest samples the estimate is computed over.
        min_samples: samples needed before the estimate replaces the cap.
        start_ms: the margin before ``min_samples`` arrived (None: the cap).
    """

    fixed_ms: float = 0.0
    floor_ms: float = 1.0
    cap_ms: float = 50.0
    window: int = 256
    min_samples: int = 8
    start_ms: float | None = None


def publish_margin_settings(publish_margin_ms: float, deadline_ms: float) -> MarginSettings:
    """The publish margin's settings: fixed when ``publish_margin_ms >= 0``, else learned
    (:class:`PublishMargin`): from :data:`PUBLISH_START_MS`, within :data:`PUBLISH_FLOOR_MS`
    and half the deadline."""
    cap_ms = deadline_ms / 2
    return MarginSettings(fixed_ms=publish_margin_ms, floor_ms=min(PUBLISH_FLOOR_MS, cap_ms),
                          cap_ms=cap_ms, window=PUBLISH_WINDOW, min_samples=1,
                          start_ms=min(PUBLISH_START_MS, cap_ms))


class TransportMargin:
    """A running estimate of the middleware's tail latency, as a margin in ns."""

    def __init__(self, settings: MarginSettings) -> None:
        self.settings = settings
        self._samples: collections.deque[int] = collections.deque(maxlen=settings.window)
        self._excess: collections.deque[int] = collections.deque(maxlen=settings.window)
        self._round_trips: collections.deque[int] = collections.deque(maxlen=settings.window)
        self._lock = threading.Lock()
        self.total_samples = 0
        #: samples from the run (its plans, one way, and their round trips), pings not counted
        self._run_one_way = 0
        self._run_round_trips = 0

    @property
    def measured(self) -> bool:
        """The margin comes from samples (not a fixed value)."""
        return self.settings.fixed_ms < 0

    def add(self, sample_ns: int) -> None:
        """Take one observed one-way latency of a plan (publish call to the subscriber's
        callback)."""
        self._add_one_way(sample_ns, run=True)

    def add_probe(self, sample_ns: int) -> None:
        """Take one start-up loopback ping: kept in the window, but the transport is not known
        from pings alone (the margin stays the cap until the run's own samples arrive)."""
        self._add_one_way(sample_ns, run=False)

    def _add_one_way(self, sample_ns: int, *, run: bool) -> None:
        if sample_ns < 0:
            return  # clocks of two processes on one host never go backwards; ignore noise
        with self._lock:
            self._samples.append(int(sample_ns))
            self.total_samples += 1
            self._run_one_way += run

    def add_round_trip(self, sample_ns: int) -> None:
        """Take one round trip: a plan's publish call to the receiver's acknowledgement of it
        arriving back (both legs, on this node's clock)."""
        if sample_ns < 0:
            return
        with self._lock:
            self._round_trips.append(int(sample_ns))
            self.total_samples += 1
            self._run_round_trips += 1

    def round_trip_p99_ns(self) -> int | None:
        """The p99 of the round trips (nearest rank), None without any."""
        with self._lock:
            return self._p99(self._round_trips)

    def add_loop_excess(self, excess_ns: int) -> None:
        """Take how far past ``deadline - transport margin`` the loop published a fallback it
        gave up on at the deadline (<= 0: on time)."""
        with self._lock:
            self._excess.append(max(0, int(excess_ns)))

    @staticmethod
    def _p99(values: collections.deque[int]) -> int | None:
        data = sorted(values)
        if not data:
            return None
        return data[min(len(data) - 1, math.ceil(0.99 * len(data)) - 1)]

    def p99_ns(self) -> int | None:
        """The p99 of the one-way samples (nearest rank), None without samples."""
        with self._lock:
            return self._p99(self._samples)

    def loop_excess_p99_ns(self) -> int:
        """The p99 of the loop's own excess (0 without samples)."""
        with self._lock:
            return self._p99(self._excess) or 0

    def tail_ns(self) -> tuple[int | None, int | None, int]:
        """The largest one-way sample, round trip and loop excess in the window (None, None,
        0 without samples)."""
        with self._lock:
            return (max(self._samples, default=None), max(self._round_trips, default=None),
                    max(self._excess, default=0))

    def margin_ns(self) -> int:
        """The transport margin for the next cycle (ns)."""
        s = self.settings
        if s.fixed_ms >= 0:
            return round(s.fixed_ms * 1e6)
        floor_ns, cap_ns = round(s.floor_ms * 1e6), round(s.cap_ms * 1e6)
        with self._lock:
            enough = max(self._run_one_way, self._run_round_trips) >= s.min_samples
        one_way, round_trip, excess = self.tail_ns()
        if not enough or (one_way is None and round_trip is None):
            return cap_ns if s.start_ms is None else round(s.start_ms * 1e6)
        legs = max(LEGS * (one_way or 0), round_trip or 0)
        estimate = round(TAIL_HEADROOM * legs) + excess + SLACK_NS
        return max(floor_ns, min(cap_ns, estimate))

    def summary(self) -> dict[str, Any]:
        """What the run's summary says about the margin."""
        p99, round_trip = self.p99_ns(), self.round_trip_p99_ns()
        one_way_max, round_trip_max, excess_max = self.tail_ns()
        with self._lock:
            n_round_trips = len(self._round_trips)

        def ms(ns: int | None) -> float | None:
            return None if ns is None else ns / 1e6
        return {"transport_margin": "measured" if self.measured else "fixed",
                "transport_margin_ms": self.margin_ns() / 1e6,
                "transport_p99_ms": ms(p99), "transport_max_ms": ms(one_way_max),
                "round_trip_p99_ms": ms(round_trip), "round_trip_max_ms": ms(round_trip_max),
                "round_trips_in_window": n_round_trips,
                "loop_excess_p99_ms": self.loop_excess_p99_ns() / 1e6,
                "loop_excess_max_ms": excess_max / 1e6,
                "transport_samples": self.total_samples,
                "floor_ms": self.settings.floor_ms, "cap_ms": self.settings.cap_ms}


class PublishMargin(TransportMargin):
    """The loop's own share of the margin (wake-up, fallback, publish call), fixed or learned.

    Learned (``settings.fixed_ms < 0``): fed by the loop with ``published - give_up`` of every
    cycle it waited for the model until its give-up time (:meth:`add`); the margin is the
    largest of the newest ``window`` such samples plus :data:`SLACK_NS`, clamped to
    ``[floor, cap]``, and ``start_ms`` until the first sample (see the module docstring).
    """

    def margin_ns(self) -> int:
        """The publish margin for the next cycle (ns)."""
        s = self.settings
        if s.fixed_ms >= 0:
            return round(s.fixed_ms * 1e6)
        with self._lock:
            worst = max(self._samples) if len(self._samples) >= s.min_samples else None
        if worst is None:
            return round((s.start_ms if s.start_ms is not None else s.cap_ms) * 1e6)
        return max(round(s.floor_ms * 1e6), min(round(s.cap_ms * 1e6), worst + SLACK_NS))

    def max_ns(self) -> int | None:
        """The largest wake-up sample in the window, None without any."""
        with self._lock:
            return max(self._samples) if self._samples else None

    def summary(self) -> dict[str, Any]:
        """What the manifest and the summary say about the publish margin."""
        worst, p99 = self.max_ns(), self.p99_ns()
        return {"publish_margin": "learned" if self.measured else "fixed",
                "publish_margin_ms": self.margin_ns() / 1e6,
                "wake_late_p99_ms": None if p99 is None else p99 / 1e6,
                "wake_late_max_ms": None if worst is None else worst / 1e6,
                "wake_samples": self.total_samples,
                "start_ms": self.settings.start_ms,
                "floor_ms": self.settings.floor_ms, "cap_ms": self.settings.cap_ms}
