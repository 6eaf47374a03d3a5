"""The planner loop under a scripted clock: deadlines, fallback chain, mailbox, skips, faults."""

from __future__ import annotations

from typing import Any

import pytest

from robot_latency.clock import ScriptedClock
from robot_latency.engines import GenerationRequest, GenerationTrace
from robot_latency.engines.sim import SimConfig, SimEngine
from robot_latency.planner.config import RunSettings, SettingsError
from robot_latency.planner.engine import create_planner_engine, rule_responder
from robot_latency.planner.loop import InlineRunner, PlannerLoop
from robot_latency.planner.mailbox import InboundCommand, Mailbox
from robot_latency.profiles.profile import load_planning
from robot_latency.records import CycleRecord, RecordError

MS = 1_000_000
CUP = "pick up the red cup and put it on the tray"


class Harness:
    """A loop over the simulated engine with a scripted clock; collects plans and records."""

    def __init__(self, engine: Any = None, clock: ScriptedClock | None = None,
                 **cfg: Any) -> None:
        self.clock = clock or ScriptedClock(start_ns=10**9)
        self.engine = engine or create_planner_engine("sim", clock=self.clock,
                                                      device="orin-agx-64gb")
        self.plans: list[dict] = []
        self.records: list[CycleRecord] = []
        self.loop = PlannerLoop(RunSettings(**{"period_ms": 100, "deadline_ms": 50, **cfg}),
                                InlineRunner(self.engine, clock=self.clock),
                                publish=self.plans.append, sink=self.records.append,
                                clock=self.clock, planning=load_planning(None))

    def say(self, text: str, cid: str = "c") -> None:
        self.loop.submit(InboundCommand(cid, text, self.clock.now()))


def _check_invariants(h: Harness) -> None:
    published = [r for r in h.records if not r.skipped]
    assert len(h.plans) == len(published)  # exactly one plan per cycle that ran
    assert [r.cycle for r in h.records] == list(range(len(h.records)))  # none lost or doubled
    for r, p in zip(published, h.plans, strict=True):
        assert p["cycle"] == r.cycle and p["source"] == r.plan_source
        assert set(p) >= {"cycle", "command_id", "source", "fallback_reason", "plan",
                          "deadline_met", "cycle_ms"}
        if r.token_ns:
            assert r.e2e_ns == r.ttft_ns + sum(r.itl_ns)


def test_model_plan_published_in_time() -> None:
    h = Harness()
    h.say(CUP)
    h.loop.run_periodic(5)
    _check_invariants(h)
    assert all(r.plan_source == "model" and r.deadline_met for r in h.records)
    assert h.plans[0]["plan"]["steps"][0] == {"action": "pick", "target": "cup",
                                              "target_kind": "object", "color": "red",
                                              "speed": "normal"}
    # periodic: scheduled exactly one period apart
    assert [r.scheduled_ns - h.records[0].scheduled_ns for r in h.records] == \
        [i * 100 * MS for i in range(5)]


def test_slow_model_falls_back_by_the_deadline() -> None:
    clock = ScriptedClock(start_ns=0)
    slow = create_planner_engine("sim", clock=clock, device="orin-nano-4gb", efficiency=0.1)
    h = Harness(engine=slow, clock=clock)
    h.say(CUP)
    h.loop.run_periodic(3)
    _check_invariants(h)
    for r in h.records:
        assert r.plan_source == "fallback" and r.fallback_reason == "deadline"
        assert r.fallback_policy == "rule" and r.deadline_met and r.overshoot_ns == 0
        assert r.stop_reason == "deadline"
    assert h.plans[0]["plan"]["steps"][1]["target"] == "tray"


def test_no_command_yet_publishes_stop() -> None:
    h = Harness()
    h.loop.run_periodic(2)
    assert [r.fallback_reason for r in h.records] == ["no_command", "no_command"]
    assert h.plans[0]["plan"] == {"steps": [{"action": "stop", "target": None,
                                             "target_kind": None, "color": None,
                                             "speed": "normal"}]}


@pytest.mark.parametrize("text", ["", "   \n\t", "x" * 1_000_000, "go to\x00 the kitchen",
                                  "pick \ufffd cup"])
def test_bad_commands_fall_back_without_crash(text: str) -> None:
    h = Harness()
    h.say(text)
    h.loop.run_periodic(1)
    (r,) = h.records
    assert r.plan_source == "fallback" and r.fallback_reason == "bad_command"
    assert r.engine_error and r.plan == {"steps": [{"action": "stop", "target": None,
                                                    "target_kind": None, "color": None,
                                                    "speed": "normal"}]}


def test_invalid_model_output_is_kept_for_diagnosis() -> None:
    clock = ScriptedClock()
    engine = SimEngine(clock=clock, responder=lambda p: ["<pick>", "<loc:tray>", "<end>"])
    h = Harness(engine=engine, clock=clock)
    h.say(CUP)
    h.loop.run_periodic(1)
    (r,) = h.records
    assert r.fallback_reason == "invalid_output" and r.raw_output == "<pick><loc:tray>"
    assert "invalid plan" in r.engine_error and r.fallback_policy == "rule"


def test_over_long_model_output_is_cut_and_refused() -> None:
    clock = ScriptedClock()
    engine = SimEngine(SimConfig(device="h100-sxm"), clock=clock,
                       responder=lambda p: ["<stop>"] * 40 + ["<end>"])
    h = Harness(engine=engine, clock=clock, max_tokens=24)
    h.say(CUP)
    h.loop.run_periodic(1)
    (r,) = h.records
    assert r.stop_reason == "max_tokens" and r.tokens_out == 24
    assert r.fallback_reason == "invalid_output" and r.raw_output.count("<stop>") == 24


def test_fallback_chain_hold_then_stop() -> None:
    clock = ScriptedClock(start_ns=0)
    answers = iter([["<goto>", "<loc:kitchen>", "<end>"]])
    # The model answers once, then only "<end>" (an empty plan: invalid output).
    engine = SimEngine(clock=clock, responder=lambda p: next(answers, ["<end>"]))
    h = Harness(engine=engine, clock=clock, fallback=("hold", "stop"), hold_max_age_ms=250)
    h.say("go to the kitchen")
    h.loop.run_periodic(5)
    _check_invariants(h)
    sources = [(r.plan_source, r.fallback_policy) for r in h.records]
    assert sources[0] == ("model", None)
    # the plan published at ~20 ms is held at 100 and 200 ms (younger than 250 ms), then stop
    assert sources[1:] == [("fallback", "hold"), ("fallback", "hold"), ("fallback", "stop"),
                           ("fallback", "stop")]
    assert h.plans[1]["plan"] == h.plans[0]["plan"]
    assert {r.fallback_reason for r in h.records[1:]} == {"invalid_output"}


class FaultyEngine:
    """Wraps the sim engine and injects faults on chosen calls (a fault, not a mock)."""

    name = "faulty"

    def __init__(self, inner: SimEngine, clock: ScriptedClock, *, raise_on: set[int],
                 hang_ms_on: dict[int, int]) -> None:
        self.inner, self.clock, self.calls = inner, clock, 0
        self.raise_on, self.hang_ms_on = raise_on, hang_ms_on

    def generate(self, request: GenerationRequest, *, abort: Any = None) -> GenerationTrace:
        n, self.calls = self.calls, self.calls + 1
        if n in self.raise_on:
            raise RuntimeError("llama_decode returned -1")
        if n in self.hang_ms_on:
            self.clock.advance(self.hang_ms_on[n] * MS)  # ignores its deadline
        return self.inner.generate(request, abort=abort)

    def info(self) -> dict[str, Any]:
        return {"engine": self.name}

    def close(self) -> None:
        pass


def test_engine_error_and_overrun_recorded_and_loop_goes_on() -> None:
    clock = ScriptedClock(start_ns=0)
    engine = FaultyEngine(SimEngine(SimConfig(device="orin-agx-64gb"), clock=clock,
                                    responder=rule_responder), clock,
                          raise_on={1}, hang_ms_on={3: 260})
    h = Harness(engine=engine, clock=clock)
    h.say(CUP)
    h.loop.run_periodic(8)
    _check_invariants(h)
    reasons = [(r.cycle, r.plan_source, r.fallback_reason, r.skipped) for r in h.records]
    assert reasons[1] == (1, "fallback", "engine_error", False)
    assert "llama_decode" in h.records[1].engine_error
    # cycle 3 hung 260 ms: published late, and ticks 4 and 5 (deadlines at 450, 550 ms) passed
    assert reasons[3][2] == "deadline" and not h.records[3].deadline_met
    assert h.records[3].overshoot_ns > 0
    assert [r[3] for r in reasons[4:6]] == [True, True]
    assert reasons[0][1] == reasons[2][1] == reasons[6][1] == reasons[7][1] == "model"
    assert len(h.records) == 8


def test_mailbox_newest_wins_and_counts() -> None:
    box = Mailbox(capacity=3)
    for i in range(5):
        box.put(InboundCommand(f"c{i}", "stop", i))
    assert box.dropped == 2
    assert box.take().command_id == "c4"
    assert box.superseded == 2 and box.take() is None
    assert box.counters() == {"received": 5, "dropped": 2, "superseded": 2}


def test_flood_keeps_memory_bounded_and_every_cycle_answered() -> None:
    h = Harness(mailbox_capacity=8)

    def flood(now_ns: int) -> None:  # 100 commands per 100 ms cycle
        for i in range(100):
            h.loop.submit(InboundCommand(f"f{now_ns}-{i}", CUP, now_ns))
        assert len(h.loop.mailbox) <= 8

    h.loop.run_periodic(20, feed=flood)
    _check_invariants(h)
    assert len(h.records) == 20
    counters = h.loop.mailbox.counters()
    assert counters["received"] == 2000 and counters["dropped"] == 20 * 92


def test_event_mode_deadline_from_arrival_and_skips() -> None:
    h = Harness(mode="event")
    t = h.clock.now()
    cmds = [InboundCommand("a", CUP, t + 10 * MS), InboundCommand("b", "stop", t + 500 * MS),
            InboundCommand("c", "go to the kitchen", t + 501 * MS)]
    h.loop.run_events(cmds)
    assert [r.scheduled_ns for r in h.records] == [c.arrival_ns for c in cmds]
    assert all(r.deadline_ns == r.scheduled_ns + 50 * MS for r in h.records)
    assert h.records[2].queue_wait_ns > 0  # waited for b's cycle
    assert h.records[0].reaction_ns == h.records[0].cycle_ns


def test_sink_failure_is_reported_not_fatal() -> None:
    h = Harness()
    calls = {"n": 0}

    def failing_sink(rec: CycleRecord) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise RecordError("disk full")
        h.records.append(rec)

    h.loop.sink = failing_sink
    h.say(CUP)
    h.loop.run_periodic(3)
    assert h.loop.sink_errors == 1 and len(h.plans) == 3 and len(h.records) == 2


@pytest.mark.parametrize(("cfg", "needle"), [
    ({"deadline_ms": -1}, "deadline_ms: -1"),
    ({"deadline_ms": 300, "period_ms": 200}, "deadline_ms: 300"),
    ({"mode": "sometimes"}, "mode: 'sometimes'"),
    ({"fallback": ("rule", "pray")}, "fallback"),
    ({"period_ms": 0}, "period_ms: 0"),
    ({"publish_margin_ms": 60, "deadline_ms": 50}, "publish_margin_ms: 60"),
    ({"runner": "thread"}, "runner: 'thread'"),
    ({"hang_timeout_ms": 0}, "hang_timeout_ms: 0"),
    ({"hybrid_policy": "fastest"}, "hybrid_policy: 'fastest'"),
])
def test_config_rejects_bad_values_by_name(cfg: dict, needle: str) -> None:
    with pytest.raises(SettingsError, match=needle.replace("(", r"\(")) as info:
        RunSettings(**cfg)
    assert info.value.name == needle.split(":")[0]


def test_event_mode_needs_no_period() -> None:
    # each command starts its own cycle: a deadline longer than the (unused) period is fine
    assert RunSettings(mode="event", deadline_ms=400).deadline_ms == 400


def test_superseded_commands_are_recorded_as_skipped_misses() -> None:
    h = Harness(mode="event")
    for i in range(3):
        h.say(f"go to the kitchen {i}", cid=f"c{i}")
    waiting = h.loop.mailbox.take_all()
    assert [c.command_id for c in waiting] == ["c0", "c1", "c2"]
    assert h.loop.mailbox.superseded == 2 and h.loop.mailbox.take_all() == []
    for old in waiting[:-1]:
        h.loop.record_superseded(old)
    h.loop.run_events([waiting[-1]])
    assert [(r.command_id, r.skipped, r.fallback_reason) for r in h.records] == [
        ("c0", True, "superseded"), ("c1", True, "superseded"), ("c2", False, None)]
    assert [r.cycle for r in h.records] == [0, 1, 2]
    assert not h.records[0].deadline_met and h.records[2].deadline_met
    assert len(h.plans) == 1


def _two_close_commands(policy: str) -> Harness:
    """Command b arrives 20 ms after a, while the model still works on a (a plan takes this
    simulated device longer than that)."""
    clock = ScriptedClock(start_ns=10**9)
    engine = create_planner_engine("sim", clock=clock, device="orin-nano-8gb",
                                   jitter_sigma=0.0)
    h = Harness(engine=engine, clock=clock, mode="event", period_ms=1000, deadline_ms=900,
                on_new_command=policy)
    t = clock.now()
    h.loop.run_events([InboundCommand("a", CUP, t + 10 * MS),
                       InboundCommand("b", "go to the kitchen", t + 30 * MS)])
    return h


def test_on_new_command_queue_lets_the_older_finish_and_the_newer_wait() -> None:
    h = _two_close_commands("queue")
    a, b = h.records
    assert a.token_ns[-1] > b.scheduled_ns  # a was still generating when b arrived
    assert [r.command_id for r in h.records] == ["a", "b"]
    assert [p["command_id"] for p in h.plans] == ["a", "b"]
    assert a.plan_source == "model" and b.plan_source == "model"
    assert b.started_ns >= a.published_ns  # b waited for a's cycle


def test_on_new_command_preempt_supersedes_the_older_and_plans_the_newer_at_once() -> None:
    h = _two_close_commands("preempt")
    a, b = h.records
    # a: aborted at the first check after b arrived; recorded, with what it ran, never
    # silently dropped; it gets no plan of its own
    assert a.command_id == "a" and a.fallback_reason == "superseded"
    assert a.plan_source == "none" and a.published_ns is None and not a.deadline_met
    assert a.stop_reason == "aborted" and a.tokens_out >= 1 and "prefill" in a.phases_ns
    assert a.e2e_ns == a.ttft_ns + sum(a.itl_ns)
    # b: planned by the model with its full budget from its own arrival
    assert [p["command_id"] for p in h.plans] == ["b"]
    assert b.plan_source == "model" and b.deadline_ns == b.scheduled_ns + 900 * MS
    assert b.started_ns < a.token_ns[-1] + 2 * (a.token_ns[-1] - a.token_ns[-2])
    assert [r.cycle for r in h.records] == [0, 1]


def test_on_new_command_is_checked() -> None:
    with pytest.raises(SettingsError, match="on_new_command"):
        RunSettings(on_new_command="drop")
