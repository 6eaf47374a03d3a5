"""Withdrawn commands (a ROS action goal's cancel) and per-command deadlines in the planner loop,
under a scripted clock and the simulated engine."""

from __future__ import annotations

from typing import Any

from robot_latency.clock import ScriptedClock
from robot_latency.planner.config import RunSettings
from robot_latency.planner.engine import create_planner_engine
from robot_latency.planner.loop import InlineRunner, PlannerLoop
from robot_latency.planner.mailbox import InboundCommand
from robot_latency.profiles.profile import load_planning
from robot_latency.records import CycleRecord

MS = 1_000_000
CUP = "pick up the red cup and put it on the tray"


class Withdrawals:
    """Ids withdrawn from a given clock time on (the sender's cancel landing then)."""

    def __init__(self, clock: ScriptedClock, at_ns: dict[str, int]) -> None:
        self.clock, self.at_ns = clock, at_ns
        self.dropped_ids: list[str] = []

    def tracks(self, command_id: str) -> bool:
        return command_id in self.at_ns

    def is_withdrawn(self, command_id: str) -> bool:
        at = self.at_ns.get(command_id)
        return at is not None and self.clock.now() >= at

    def dropped(self, command_id: str) -> None:
        self.dropped_ids.append(command_id)


def _loop(clock: ScriptedClock, **cfg: Any) -> tuple[PlannerLoop, list[dict], list[CycleRecord]]:
    # a slow simulated device: a plan takes longer than the gaps the tests leave
    engine = create_planner_engine("sim", clock=clock, device="orin-nano-8gb", jitter_sigma=0.0)
    plans: list[dict] = []
    records: list[CycleRecord] = []
    loop = PlannerLoop(RunSettings(**{"period_ms": 1000, "deadline_ms": 900, **cfg}),
                       InlineRunner(engine, clock=clock), publish=plans.append,
                       sink=records.append, clock=clock, planning=load_planning(None))
    return loop, plans, records


def test_a_command_withdrawn_mid_generation_is_aborted_recorded_and_never_published() -> None:
    clock = ScriptedClock(start_ns=10**9)
    loop, plans, records = _loop(clock, mode="event")
    t = clock.now()
    loop.withdrawals = w = Withdrawals(clock, {"g1": t + 40 * MS})
    loop.run_events([InboundCommand("g1", CUP, t + 10 * MS),
                     InboundCommand("c2", "go to the kitchen", t + 500 * MS)])
    g1, c2 = records
    assert g1.command_id == "g1" and g1.fallback_reason == "cancelled"
    assert g1.plan_source == "none" and g1.published_ns is None
    assert g1.stop_reason == "aborted" and g1.tokens_out >= 1  # it was decoding when withdrawn
    assert g1.token_ns[-1] < t + 40 * MS + 30 * MS  # stopped at the next check after it
    assert [p["command_id"] for p in plans] == ["c2"]  # nothing for g1, c2 planned as usual
    assert c2.plan_source == "model"
    assert w.dropped_ids == ["g1"]


def test_a_command_withdrawn_before_its_cycle_never_reaches_the_engine() -> None:
    clock = ScriptedClock(start_ns=10**9)
    loop, plans, records = _loop(clock, mode="event")
    t = clock.now()
    loop.withdrawals = w = Withdrawals(clock, {"g1": t})
    loop.run_events([InboundCommand("g1", CUP, t + 10 * MS)])
    (g1,) = records
    assert g1.fallback_reason == "cancelled" and g1.tokens_in is None and not g1.token_ns
    assert plans == [] and w.dropped_ids == ["g1"]


def test_untracked_commands_are_never_asked_about_during_a_generation() -> None:
    clock = ScriptedClock(start_ns=10**9)
    loop, plans, records = _loop(clock, mode="event")
    t = clock.now()
    loop.withdrawals = Withdrawals(clock, {})
    loop.run_events([InboundCommand("c1", CUP, t + 10 * MS)])
    assert records[0].plan_source == "model" and len(plans) == 1


def test_periodic_ticks_stop_re_planning_a_withdrawn_standing_command() -> None:
    clock = ScriptedClock(start_ns=10**9)
    loop, plans, records = _loop(clock, period_ms=1000, deadline_ms=900)
    t = clock.now()
    loop.withdrawals = Withdrawals(clock, {"g1": t + 1010 * MS})
    loop.submit(InboundCommand("g1", CUP, t))
    loop.run_periodic(3, start_ns=t)
    # tick 0 plans it; tick 1 is withdrawn mid-generation: nothing published for it; tick 2
    # has no command left
    assert [r.command_id for r in records] == ["g1", "g1", None]
    assert [r.fallback_reason for r in records][1:] == ["cancelled", "no_command"]
    assert [p["command_id"] for p in plans] == ["g1", None]


def test_a_command_may_ask_for_a_shorter_deadline_never_a_longer_one() -> None:
    clock = ScriptedClock(start_ns=10**9)
    loop, plans, records = _loop(clock, mode="event", deadline_ms=300)
    t = clock.now()
    loop.run_events([InboundCommand("short", CUP, t + 10 * MS, deadline_ns=20 * MS),
                     InboundCommand("long", CUP, t + 1000 * MS, deadline_ns=5000 * MS)])
    short, long_ = records
    assert short.deadline_ns == short.scheduled_ns + 20 * MS
    assert short.plan_source == "fallback" and short.fallback_reason == "deadline"
    assert plans[0]["deadline_ms"] == 20.0 and plans[0]["deadline_met"]
    assert long_.deadline_ns == long_.scheduled_ns + 300 * MS
    assert plans[1]["deadline_ms"] == 300.0
