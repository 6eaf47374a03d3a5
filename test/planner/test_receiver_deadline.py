"""Where a cycle's deadline starts, under a scripted clock: a command stamped with its send
counts from the send in both modes (the receiver's deadline); an old stamp keeps its lateness.
And the learned publish margin: the loop's own lateness at its give-up time raises it."""

from __future__ import annotations

from typing import Any

from robot_latency.clock import ScriptedClock
from robot_latency.engines import GenerationRequest
from robot_latency.planner.config import RunSettings
from robot_latency.planner.engine import create_planner_engine
from robot_latency.planner.loop import InlineRunner, Interrupt, PlannerLoop, RunOutcome
from robot_latency.planner.mailbox import InboundCommand
from robot_latency.planner.margin import (
    LEGS,
    PUBLISH_FLOOR_MS,
    PUBLISH_START_MS,
    SLACK_NS,
    TAIL_HEADROOM,
)
from robot_latency.profiles.profile import load_planning
from robot_latency.records import CycleRecord

MS = 1_000_000
CUP = "pick up the red cup and put it on the tray"


class Harness:
    """A loop over the simulated engine (fast device) with a scripted clock."""

    def __init__(self, runner: Any = None, **cfg: Any) -> None:
        self.clock = ScriptedClock(start_ns=10**9)
        engine = create_planner_engine("sim", clock=self.clock, device="orin-agx-64gb")
        self.plans: list[dict[str, Any]] = []
        self.records: list[CycleRecord] = []
        self.loop = PlannerLoop(RunSettings(**{"period_ms": 100, "deadline_ms": 50, **cfg}),
                                runner or InlineRunner(engine, clock=self.clock),
                                publish=self.plans.append, sink=self.records.append,
                                clock=self.clock, planning=load_planning(None))


def test_periodic_a_stamped_command_counts_from_its_send_the_tick_only_decides_when() -> None:
    h = Harness()
    tick = h.clock.now()
    # sent 20 ms before the tick, arrived 5 ms before it
    h.loop.submit(InboundCommand("c", CUP, tick - 5 * MS, sent_ns=tick - 20 * MS))
    h.loop.run_periodic(3, start_ns=tick)
    first, again, third = h.records
    assert first.scheduled_ns == tick - 20 * MS == first.command_sent_ns
    assert first.deadline_ns == tick + 30 * MS  # 50 ms from the send, not from the tick
    assert first.phases_ns["queue"] >= 20 * MS  # the wait for the tick is spent, and shown
    assert first.plan_source == "model" and first.deadline_met
    assert first.published_ns is not None and first.published_ns <= first.deadline_ns
    # later ticks re-plan the same command: they are the control loop's, from the tick
    assert again.scheduled_ns == tick + 100 * MS and third.scheduled_ns == tick + 200 * MS
    assert again.command_sent_ns is None and again.deadline_met


def test_periodic_an_unstamped_command_counts_from_the_tick() -> None:
    h = Harness()
    tick = h.clock.now()
    h.loop.submit(InboundCommand("c", CUP, tick - 40 * MS))
    h.loop.run_periodic(1, start_ns=tick)
    (rec,) = h.records
    assert rec.scheduled_ns == tick and rec.deadline_ns == tick + 50 * MS
    assert rec.command_arrival_ns == tick - 40 * MS  # the reaction still counts the wait


def test_periodic_a_command_whose_budget_went_waiting_for_the_tick_is_late_and_answered_now(
) -> None:
    h = Harness()
    tick = h.clock.now()
    h.loop.submit(InboundCommand("c", CUP, tick - 60 * MS, sent_ns=tick - 60 * MS))
    h.loop.run_periodic(2, start_ns=tick)
    late, replan = h.records
    assert late.deadline_ns == tick - 10 * MS and not late.deadline_met
    assert (late.plan_source, late.fallback_reason) == ("fallback", "deadline")
    assert late.published_ns is not None and late.published_ns - tick < 1 * MS  # at once
    assert h.plans[0]["command_id"] == "c" and not h.plans[0]["deadline_met"]
    assert not late.token_ns  # the model was not asked: there was no time left
    assert replan.plan_source == "model" and replan.deadline_met


def test_event_a_stamp_older_than_the_deadline_keeps_its_lateness_and_gets_a_fallback() -> None:
    h = Harness(mode="event")
    t = h.clock.now()
    stale = InboundCommand("stale", CUP, t + 10 * MS, sent_ns=t + 10 * MS - 80 * MS)
    fresh = InboundCommand("fresh", CUP, t + 300 * MS, sent_ns=t + 299 * MS)
    h.loop.run_events([stale, fresh])
    a, b = h.records
    assert a.command_id == "stale" and not a.skipped and not a.deadline_met
    assert a.scheduled_ns == stale.sent_ns and a.deadline_ns == stale.sent_ns + 50 * MS
    assert (a.plan_source, a.fallback_reason) == ("fallback", "deadline")
    assert [p["command_id"] for p in h.plans] == ["stale", "fresh"]  # both answered
    assert b.plan_source == "model" and b.deadline_met and b.scheduled_ns == fresh.sent_ns


class LateWaker:
    """A runner that gives up at the give-up time like the real one, then wakes ``late_ns[i]``
    late in the i-th cycle (the loop's thread kept off its core)."""

    def __init__(self, clock: ScriptedClock, late_ns: list[int]) -> None:
        self.clock = clock
        self.late_ns = list(late_ns)
        self.give_ups: list[int] = []

    def run(self, request: GenerationRequest, *, give_up_ns: int,
            interrupt: Interrupt | None = None) -> RunOutcome:
        self.give_ups.append(give_up_ns)
        self.clock.sleep_for(max(0, give_up_ns - self.clock.now()))
        self.clock.advance(self.late_ns.pop(0))
        return RunOutcome(None, "timeout")

    def collect_aborted(self, until_ns: int) -> None:
        return None


def test_a_learned_publish_margin_covers_the_lateness_the_loop_saw() -> None:
    # cycles: 3 ms late (inside the start margin), 7 ms (beyond it: late), then 7 ms again
    # (now inside the learned margin), then punctual for a while
    h = Harness(publish_margin_ms=-1)
    waker = LateWaker(h.clock, [3 * MS, 7 * MS, 7 * MS] + [0] * 5)
    h.loop.runner = waker
    h.loop.submit(InboundCommand("c", CUP, h.clock.now()))
    h.loop.run_periodic(8)
    margins = [r.margin_ns for r in h.records]
    met = [r.deadline_met for r in h.records]
    assert margins[0] == PUBLISH_START_MS * MS  # nothing seen yet: the measured default
    assert met[:3] == [True, False, True]
    assert margins[2] > 7 * MS > margins[1] > 3 * MS
    assert all(r.plan_source == "fallback" and r.fallback_reason == "deadline"
               for r in h.records)
    # the largest of the window counts: punctual cycles do not lower it at once
    assert margins[-1] == margins[2] and all(met[2:])
    summary = h.loop.publish_margin.summary()
    assert summary["publish_margin"] == "learned" and summary["wake_late_max_ms"] >= 7.0
    assert summary["floor_ms"] == PUBLISH_FLOOR_MS


def test_a_fixed_publish_margin_does_not_move() -> None:
    h = Harness(publish_margin_ms=2)
    h.loop.runner = LateWaker(h.clock, [7 * MS, 7 * MS])
    h.loop.submit(InboundCommand("c", CUP, h.clock.now()))
    h.loop.run_periodic(2)
    assert [r.margin_ns for r in h.records] == [2 * MS, 2 * MS]
    assert [r.deadline_met for r in h.records] == [False, False]


def test_periodic_a_command_sent_after_a_tick_whose_cycle_started_late_counts_from_its_send(
) -> None:
    h = Harness()
    tick = h.clock.now()
    h.clock.advance(10 * MS)  # the loop wakes 10 ms after its tick; the command came before
    h.loop.submit(InboundCommand("c", CUP, tick + 4 * MS, sent_ns=tick + 3 * MS))
    h.loop.run_periodic(1, start_ns=tick)
    (rec,) = h.records
    assert rec.scheduled_ns == tick + 3 * MS == rec.command_sent_ns  # not the earlier tick
    assert rec.deadline_ns == tick + 53 * MS and rec.phases_ns["queue"] == 7 * MS


class SlowAfterModel:
    """The sim engine's runner, whose thread is kept off its core after the model answered:
    the plan is ready before the give-up time, published ``late_ns`` after it."""

    def __init__(self, inner: Any, clock: ScriptedClock, late_ns: list[int]) -> None:
        self.inner, self.clock, self.late_ns = inner, clock, list(late_ns)

    def run(self, request: GenerationRequest, *, give_up_ns: int,
            interrupt: Interrupt | None = None) -> RunOutcome:
        outcome = self.inner.run(request, give_up_ns=give_up_ns, interrupt=interrupt)
        late = self.late_ns.pop(0)
        if late:
            self.clock.sleep_for(max(0, give_up_ns + late - self.clock.now()))
        return outcome

    def collect_aborted(self, until_ns: int) -> None:
        return None


def test_a_model_plan_published_late_after_the_give_up_raises_the_transport_margin() -> None:
    """The loop's excess counts in every cycle that started before its give-up, not only those
    that waited for the model until it: a plan ready in time but published 5 ms past the
    give-up (2 ms of publish margin) ate 3 ms of the transport's share."""
    h = Harness(publish_margin_ms=2, transport_margin_ms=-1, transport_margin_cap_ms=12,
                deadline_ms=90)
    h.loop.runner = SlowAfterModel(h.loop.runner, h.clock, [5 * MS, 0])
    for _ in range(8):
        h.loop.transport.add(1 * MS)
    h.loop.submit(InboundCommand("c", CUP, h.clock.now()))
    h.loop.run_periodic(2)
    late, after = h.records
    assert late.plan_source == "model" and late.published_ns is not None
    assert late.published_ns == late.deadline_ns - late.margin_ns + 5 * MS
    assert late.margin_ns == 2 * MS + round(TAIL_HEADROOM * LEGS * 1 * MS) + SLACK_NS
    assert after.margin_ns == late.margin_ns + 3 * MS


def _submit_while_waiting(h: Harness, command: InboundCommand) -> None:
    """Deliver ``command`` at its arrival, from inside the loop's wait (a live source)."""
    sleep_until = h.loop.sleep_until

    def waiting(target_ns: int) -> None:
        if h.clock.now() < command.arrival_ns <= target_ns:
            sleep_until(command.arrival_ns)
            h.loop.submit(command)
        sleep_until(target_ns)
    h.loop.sleep_until = waiting


def test_periodic_a_stamped_command_whose_give_up_comes_before_the_tick_is_answered_then() -> None:
    """Periodic, deadline = period (300 ms): a command sent just after a tick would be planned
    at the next one, 295 ms into its budget, and its plan would cross the transport past the
    deadline (seen over DDS with both cores busy: three such fallbacks, published in time by
    the planner, arrived 1-3 ms late). It gets a cycle of its own at its give-up time instead,
    with the transport margin still ahead; the tick then re-plans it as usual."""
    h = Harness(period_ms=300, deadline_ms=300, publish_margin_ms=2, transport_margin_ms=50)
    tick = h.clock.now()
    sent = tick + 5 * MS
    _submit_while_waiting(h, InboundCommand("late", CUP, sent + 1 * MS, sent_ns=sent))
    h.loop.run_periodic(3, start_ns=tick)
    idle, own, again, third = h.records
    assert idle.fallback_reason == "no_command" and idle.scheduled_ns == tick
    assert own.command_id == "late" and own.scheduled_ns == sent == own.command_sent_ns
    assert own.plan_source == "fallback" and own.fallback_reason == "deadline"
    give_up = own.deadline_ns - own.margin_ns
    assert own.margin_ns == 52 * MS and give_up < tick + 300 * MS
    assert own.published_ns is not None and give_up <= own.published_ns
    # published with the transport's share of the margin still ahead of the deadline
    assert own.published_ns <= own.deadline_ns - 50 * MS and own.deadline_met
    assert again.command_id == "late" and again.scheduled_ns == tick + 300 * MS
    assert again.command_sent_ns is None and third.scheduled_ns == tick + 600 * MS
    assert [p["cycle"] for p in h.plans] == [0, 1, 2, 3]


def test_periodic_a_command_with_time_for_the_tick_or_no_stamp_waits_for_the_tick() -> None:
    for command in (InboundCommand("soon", CUP, 10**9 + 250 * MS, sent_ns=10**9 + 249 * MS),
                    InboundCommand("plain", CUP, 10**9 + 5 * MS)):
        h = Harness(period_ms=300, deadline_ms=300, publish_margin_ms=2, transport_margin_ms=50)
        _submit_while_waiting(h, command)
        h.loop.run_periodic(2, start_ns=h.clock.now())
        idle, planned = h.records
        assert idle.fallback_reason == "no_command"
        assert planned.command_id == command.command_id and planned.plan_source == "model"
        assert planned.started_ns == 10**9 + 300 * MS  # at the tick, not before
