"""The transport margin: fixed, or measured from samples between a floor and a cap."""

from __future__ import annotations

import pytest

from robot_latency.clock import ScriptedClock
from robot_latency.planner.config import RunSettings, SettingsError
from robot_latency.planner.engine import create_planner_engine
from robot_latency.planner.loop import InlineRunner, PlannerLoop
from robot_latency.planner.mailbox import InboundCommand
from robot_latency.planner.margin import (
    LEGS,
    PUBLISH_FLOOR_MS,
    PUBLISH_START_MS,
    SLACK_NS,
    TAIL_HEADROOM,
    MarginSettings,
    PublishMargin,
    TransportMargin,
    publish_margin_settings,
)
from robot_latency.profiles.profile import load_planning

MS = 1_000_000


def kept(legs_ns: int) -> int:
    """The transport's share of the margin for legs that took ``legs_ns`` at most."""
    return round(TAIL_HEADROOM * legs_ns)


def test_fixed_margin_ignores_samples() -> None:
    m = TransportMargin(MarginSettings(fixed_ms=3.0))
    m.add(40 * MS)
    assert m.margin_ns() == 3 * MS and not m.measured


def test_measured_margin_is_the_cap_until_enough_samples_then_covers_the_tail() -> None:
    m = TransportMargin(MarginSettings(fixed_ms=-1.0, floor_ms=1.0, cap_ms=50.0, min_samples=8))
    assert m.margin_ns() == 50 * MS  # nothing known yet: the most it may keep
    for _ in range(99):
        m.add(2 * MS)
    m.add(6 * MS)  # the tail: one sample in a hundred, past the p99
    p99 = m.p99_ns()
    assert p99 == 2 * MS
    # The largest, not the p99: both legs of it (the command in, the plan out).
    assert m.margin_ns() == kept(LEGS * 6 * MS) + SLACK_NS
    m.add_loop_excess(-5 * MS)  # on time: counts as 0
    for _ in range(150):
        m.add_loop_excess(1 * MS)
    m.add_loop_excess(3 * MS)  # once, the loop itself published 3 ms into the margin
    assert m.loop_excess_p99_ns() == 1 * MS
    assert m.margin_ns() == kept(LEGS * 6 * MS) + 3 * MS + SLACK_NS
    summary = m.summary()
    assert summary["transport_max_ms"] == 6.0 and summary["loop_excess_max_ms"] == 3.0
    for _ in range(m.settings.window):
        m.add(10)  # a very fast transport and a punctual loop: the floor holds
        m.add_loop_excess(0)
    assert m.margin_ns() == 1 * MS
    for _ in range(300):
        m.add(400 * MS)  # a stalled transport: the cap holds
    assert m.margin_ns() == 50 * MS
    assert m.summary()["transport_samples"] == 100 + m.settings.window + 300


def test_cap_is_at_most_a_quarter_of_the_budget() -> None:
    cfg = RunSettings(period_ms=100, deadline_ms=42, publish_margin_ms=2,
                        transport_margin_ms=-1, transport_margin_cap_ms=50)
    assert cfg.margin_settings().cap_ms == pytest.approx(10.0)
    with pytest.raises(SettingsError, match="transport_margin_floor_ms"):
        RunSettings(transport_margin_floor_ms=60, transport_margin_cap_ms=50)
    with pytest.raises(SettingsError, match="transport_margin_ms"):
        RunSettings(deadline_ms=100, transport_margin_ms=99)


def test_the_loop_gives_up_the_margin_before_the_deadline_and_records_it() -> None:
    clock = ScriptedClock(start_ns=10**9)
    engine = create_planner_engine("sim", clock=clock, device="orin-nano-8gb")
    plans: list[dict] = []
    records = []
    loop = PlannerLoop(RunSettings(period_ms=100, deadline_ms=60, publish_margin_ms=2,
                                     transport_margin_ms=-1, transport_margin_cap_ms=12),
                       InlineRunner(engine, clock=clock), publish=plans.append,
                       sink=records.append, clock=clock, planning=load_planning(None))
    loop.submit(InboundCommand("c", "pick up the red cup and put it on the tray", clock.now()))
    loop.run_periodic(1)
    for _ in range(20):
        loop.transport.add(3 * MS)
    loop.run_periodic(1)
    first, second = records
    assert first.margin_ns == 2 * MS + 12 * MS  # no samples yet: the cap
    assert second.margin_ns == 2 * MS + kept(LEGS * 3 * MS) + SLACK_NS
    for rec, plan in zip(records, plans, strict=True):
        assert all(t <= rec.deadline_ns - rec.margin_ns for t in rec.token_ns)
        assert plan["margin_ms"] == rec.margin_ns / 1e6


def test_round_trips_from_a_receiver_raise_the_margin_past_the_loopback_estimate() -> None:
    m = TransportMargin(MarginSettings(fixed_ms=-1.0, floor_ms=1.0, cap_ms=50.0, min_samples=8))
    for _ in range(7):
        m.add_round_trip(9 * MS)
    assert m.margin_ns() == 50 * MS  # 7 of 8 samples: still the cap
    m.add_round_trip(9 * MS)
    assert m.margin_ns() == kept(9 * MS) + SLACK_NS  # round trips alone leave the cap
    for _ in range(100):
        m.add(1 * MS)  # a fast loopback does not lower it: the receiver saw 9 ms
    assert m.margin_ns() == kept(9 * MS) + SLACK_NS
    m.add_round_trip(12 * MS)  # one round trip past all the others: the margin covers it
    assert m.margin_ns() == kept(12 * MS) + SLACK_NS
    for _ in range(100):
        m.add(7 * MS)  # a loopback slower than the round trips: both legs of it count
    assert m.margin_ns() == kept(LEGS * 7 * MS) + SLACK_NS
    summary = m.summary()
    assert summary["round_trip_p99_ms"] == 12.0 and summary["round_trip_max_ms"] == 12.0
    assert summary["round_trips_in_window"] == 9
    m.add_round_trip(-1)  # a clock that went backwards is ignored
    assert m.summary()["round_trips_in_window"] == 9


def test_a_learned_publish_margin_keeps_the_largest_lateness_between_floor_and_cap() -> None:
    m = PublishMargin(publish_margin_settings(-1.0, deadline_ms=40.0))
    assert m.measured and m.margin_ns() == PUBLISH_START_MS * MS  # nothing seen yet
    m.add(100_000)  # a punctual loop: the floor, not less
    assert m.margin_ns() == PUBLISH_FLOOR_MS * MS
    m.add(6 * MS)
    for _ in range(500):
        m.add(1 * MS)  # hundreds of punctual cycles do not hide the one 6 ms late
    assert m.margin_ns() == 6 * MS + SLACK_NS
    m.add(60 * MS)  # a stall beyond the deadline: half the deadline at most
    assert m.margin_ns() == 20 * MS
    for _ in range(m.settings.window):
        m.add(1 * MS)  # the stall leaves the window: the margin comes down again
    assert m.margin_ns() == PUBLISH_FLOOR_MS * MS
    fixed = PublishMargin(publish_margin_settings(3.0, deadline_ms=40.0))
    fixed.add(30 * MS)
    assert not fixed.measured and fixed.margin_ns() == 3 * MS


def test_start_up_pings_alone_leave_the_cap_until_the_runs_own_samples_arrive() -> None:
    """The pings cross an idle node before any engine holds the cores and no receiver's
    executor: they do not make the transport known. (The demo's first cycle, its margin from
    the pings alone, published a fallback that arrived 3.2 ms past its deadline.)"""
    m = TransportMargin(MarginSettings(fixed_ms=-1.0, floor_ms=1.0, cap_ms=50.0, min_samples=8))
    for _ in range(40):
        m.add_probe(500_000)
    assert m.margin_ns() == 50 * MS and m.summary()["transport_samples"] == 40
    for _ in range(7):
        m.add(1 * MS)  # the node's own plans, one way
    assert m.margin_ns() == 50 * MS  # 7 of 8 from the run: still the cap
    m.add(1 * MS)
    assert m.margin_ns() == kept(LEGS * 1 * MS) + SLACK_NS
    m.add_probe(3 * MS)  # once known, a ping in the window still counts
    assert m.margin_ns() == kept(LEGS * 3 * MS) + SLACK_NS


def test_the_margin_keeps_headroom_past_the_largest_transport_sample() -> None:
    """The next sample exceeds the window's largest about once in ``window + 1``: a plan that
    crosses the transport a fifth slower than anything seen still arrives inside the margin
    (a margin equal to the largest leaves about one plan in ``window + 1`` late)."""
    m = TransportMargin(MarginSettings(fixed_ms=-1.0, floor_ms=1.0, cap_ms=100.0, min_samples=8))
    for _ in range(255):
        m.add_round_trip(2 * MS)
    m.add_round_trip(52 * MS)
    rarer = round(52 * MS * 1.2)
    assert m.margin_ns() - SLACK_NS > rarer > m.tail_ns()[1]
