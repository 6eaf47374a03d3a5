"""The engine in a worker process: the loop answers every cycle whatever the engine does.

Real processes and the real clock; assertions are on behaviour (what was published and recorded),
never on how fast.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
import time

import pytest

from robot_latency.engines.base import GenerationRequest, StopReason
from robot_latency.planner.config import RunSettings
from robot_latency.planner.loop import PlannerLoop, RunOutcome
from robot_latency.planner.mailbox import InboundCommand
from robot_latency.planner.worker import ProcessRunner
from robot_latency.profiles.actions import PLAN_TOKEN
from robot_latency.profiles.profile import load_planning
from robot_latency.records import CycleRecord

CUP = "pick up the red cup and put it on the tray"
MS = 1_000_000
FAST = {"device": "orin-agx-64gb", "jitter_sigma": 0.0}
INSTANT = {"device": "h100-sxm", "jitter_sigma": 0.0, "efficiency": 1.0}
# A prefill at a millionth of peak compute: minutes long and uninterruptible, like a stuck GPU
# kernel. The watchdog must kill it.
STUCK = {"device": "orin-nano-4gb", "compute_efficiency": 1e-6}


def _loop(runner: ProcessRunner, **cfg: object) -> tuple[PlannerLoop, list[dict],
                                                         list[CycleRecord]]:
    plans: list[dict] = []
    records: list[CycleRecord] = []
    loop = PlannerLoop(RunSettings(**{"period_ms": 150, "deadline_ms": 100,
                                        "publish_margin_ms": 5, **cfg}),
                       runner, publish=plans.append, sink=records.append,
                       planning=load_planning(None))
    loop.submit(InboundCommand("c0", CUP, loop.clock()))
    return loop, plans, records


def test_model_plans_through_the_worker() -> None:
    # A plan takes well under a millisecond of simulated time on this device; the deadline
    # leaves the worker (not niced here) ample room even on a loaded machine: every plan is
    # the model's.
    with ProcessRunner("sim", INSTANT, worker_nice=0) as runner:
        loop, plans, records = _loop(runner, period_ms=600, deadline_ms=500)
        loop.run_periodic(4)
    assert len(plans) == 4 and len(records) == 4
    assert [r.plan_source for r in records] == ["model"] * 4
    model = next(r for r in records if r.plan_source == "model")
    assert model.e2e_ns == model.ttft_ns + sum(model.itl_ns)
    assert model.plan["steps"][1]["target"] == "tray"


def test_stuck_engine_is_killed_and_restarted_loop_keeps_answering() -> None:
    with ProcessRunner("sim", STUCK, hang_timeout_ms=200) as runner:
        loop, plans, records = _loop(runner)
        loop.run_periodic(6)
        restarts = runner.restarts
    assert len(plans) == 6  # every tick answered
    assert all(r.plan_source == "fallback" for r in records)
    assert records[0].fallback_reason == "deadline"
    assert restarts >= 1
    assert any(r.fallback_reason == "engine_unavailable" for r in records)
    assert all(p["plan"]["steps"] for p in plans)


def test_killed_worker_is_restarted_and_the_model_answers_again() -> None:
    with ProcessRunner("sim", FAST) as runner:
        loop, plans, records = _loop(runner, period_ms=300, deadline_ms=250)
        loop.run_periodic(2)
        first_pid = runner.pid
        runner.kill_worker()
        loop.run_periodic(6)
        assert runner.restarts == 1 and runner.pid != first_pid
        assert runner.events and "died" in runner.events[0][1]
    assert len(plans) == 8
    assert [r.cycle for r in records] == list(range(8))
    assert any(r.plan_source == "model" for r in records[3:])


def test_engine_that_cannot_load_is_a_clear_error() -> None:
    runner = ProcessRunner("sim", {"device": "orin-xyz"})
    with pytest.raises(RuntimeError, match="orin-xyz"):
        runner.start()
    runner.close()


def test_cycle_after_a_slow_abort_waits_for_the_worker_and_gets_a_model_plan() -> None:
    """A cycle that finds the worker finishing an aborted request waits for it within its own
    budget instead of falling back at once. The engine's every sleep is ``release.wait``: it
    blocks until the test releases it, then all time is zero, so the order is scripted by
    events: request 1 times out and is aborted but cannot stop; request 2 starts, the runner
    says it is waiting; only then is the engine let go."""
    release = mp.get_context("spawn").Event()
    with ProcessRunner("sim", {**FAST, "sleep_ns": release.wait},
                       hang_timeout_ms=600_000) as runner:
        first = runner.run(GenerationRequest(prompt=CUP + PLAN_TOKEN),
                           give_up_ns=runner.clock() + 200 * MS)
        assert first.status == "timeout" and first.trace is None

        second: list[RunOutcome] = []
        thread = threading.Thread(target=lambda: second.append(runner.run(
            GenerationRequest(prompt=CUP + PLAN_TOKEN, max_tokens=32),
            give_up_ns=runner.clock() + 600 * 1000 * MS)))
        thread.start()
        deadline = time.monotonic() + 60
        while not any("waiting for aborted request 1" in what for _, what in runner.events):
            assert thread.is_alive(), second  # today's code: falls back without waiting
            assert time.monotonic() < deadline, "the runner never waited"
            time.sleep(0.01)
        release.set()
        thread.join(timeout=60)
        assert not thread.is_alive()
        events = [what for _, what in runner.events]
    (outcome,) = second
    assert outcome.status == "ok", outcome
    assert outcome.trace is not None and "<loc:tray>" in outcome.trace.text
    assert events == ["waiting for aborted request 1", "worker free after the aborted request"]
    assert runner.restarts == 0


def test_cycle_given_up_on_records_its_phases_and_tokens_so_far() -> None:
    """A cycle the loop gives up on still shows where its budget went: the worker hands its
    partial trace over at the abort. Scripted by events, not by time: each of the engine's sleeps
    takes a permit from a queue holding 3, so the prefill and two decode steps run at once and
    the third step blocks until the fallback has been published (the publish hands out more
    permits), long after the give-up."""
    permits = mp.get_context("spawn").Queue()
    for _ in range(3):
        permits.put(1)
    with ProcessRunner("sim", {**FAST, "sleep_ns": permits.get},
                       hang_timeout_ms=600_000) as runner:
        plans: list[dict] = []
        records: list[CycleRecord] = []

        def publish(envelope: dict) -> None:
            plans.append(envelope)
            for _ in range(8):
                permits.put(1)  # let the engine go on: it then sees the abort

        loop = PlannerLoop(RunSettings(period_ms=600, deadline_ms=500, publish_margin_ms=5),
                           runner, publish=publish, sink=records.append,
                           planning=load_planning(None))
        loop.partial_trace_wait_ns = 120 * 1000 * MS  # a hang guard, not a timing
        loop.submit(InboundCommand("c0", CUP, loop.clock()))
        loop.run_periodic(1)
    (rec,) = records
    assert len(plans) == 1 and plans[0]["source"] == "fallback"
    assert rec.fallback_reason == "deadline" and rec.plan_source == "fallback"
    # queue, prefill and decode so far, and the three tokens produced by the give-up
    assert {"queue", "tokenize", "prefill", "decode", "fallback"} <= set(rec.phases_ns)
    assert rec.tokens_out == 3 and rec.stop_reason == "aborted"
    assert all(t <= rec.deadline_ns - rec.margin_ns for t in rec.token_ns)
    assert rec.e2e_ns == rec.ttft_ns + sum(rec.itl_ns)


def test_an_abort_asked_before_the_request_is_sent_is_not_lost() -> None:
    """A hedged server's plan can arrive while the worker still finishes an earlier, aborted
    request, before this cycle's request is sent: the abort names this request, so it stops as
    it starts. Scripted as the slow-abort test above: request 1 is given up and blocks; request
    2 waits for it; the abort for request 2 is asked then; only then is the engine let go."""
    release = mp.get_context("spawn").Event()
    with ProcessRunner("sim", {**FAST, "sleep_ns": release.wait},
                       hang_timeout_ms=600_000) as runner:
        first = runner.run(GenerationRequest(prompt=CUP + PLAN_TOKEN),
                           give_up_ns=runner.clock() + 200 * MS)
        assert first.status == "timeout"
        request = GenerationRequest(prompt=CUP + PLAN_TOKEN, max_tokens=32)
        second: list[RunOutcome] = []
        thread = threading.Thread(target=lambda: second.append(runner.run(
            request, give_up_ns=runner.clock() + 600 * 1000 * MS)))
        thread.start()
        deadline = time.monotonic() + 60
        while not any("waiting for aborted request 1" in what for _, what in runner.events):
            assert thread.is_alive(), second
            assert time.monotonic() < deadline, "the runner never waited"
            time.sleep(0.01)
        runner.request_abort(request)  # before request 2 is sent
        release.set()
        thread.join(timeout=60)
        assert not thread.is_alive()
        # The abort was for request 2 only: the next request plans in full.
        third = runner.run(GenerationRequest(prompt=CUP + PLAN_TOKEN, max_tokens=32),
                           give_up_ns=runner.clock() + 600 * 1000 * MS)
    (outcome,) = second
    assert outcome.trace is not None and outcome.trace.stop_reason is StopReason.ABORTED
    assert outcome.status == "timeout" and "<loc:tray>" not in outcome.trace.text
    assert third.status == "ok" and third.trace is not None
    assert "<loc:tray>" in third.trace.text


def test_an_abort_for_a_request_that_ended_does_not_reach_the_next() -> None:
    with ProcessRunner("sim", INSTANT, worker_nice=0) as runner:
        done = GenerationRequest(prompt=CUP + PLAN_TOKEN, max_tokens=32)
        assert runner.run(done, give_up_ns=runner.clock() + 60_000 * MS).status == "ok"
        runner.request_abort(done)  # late: that generation is over
        nxt = runner.run(GenerationRequest(prompt=CUP + PLAN_TOKEN, max_tokens=32),
                         give_up_ns=runner.clock() + 60_000 * MS)
    assert nxt.status == "ok" and nxt.trace is not None
    assert nxt.trace.stop_reason is not StopReason.ABORTED
