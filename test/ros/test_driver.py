"""The live driver (what the planner node runs): on_new_command with commands pushed in.

The engine runs in its worker process; each of its sleeps takes a permit from a queue, so the
order is scripted by events, never by time.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
from pathlib import Path

import pytest

from robot_latency.planner.config import RunSettings
from robot_latency.planner.resolve import resolve_run
from robot_latency.records import CycleRecord
from robot_latency.ros.driver import PlannerDriver

CUP = "pick up the red cup and put it on the tray"
HANG_S = 120.0  # a hang guard, not a timing


def _wait(predicate: object, what: str) -> None:
    end = time.monotonic() + HANG_S
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.01)


@pytest.mark.parametrize("policy", ["queue", "preempt"])
def test_a_newer_command_while_the_model_works(tmp_path: Path, policy: str) -> None:
    """Command a's generation blocks (its third engine step waits for a permit) until b has
    arrived; then the engine is let go (preempt: once a's record is written, so the loop must
    have given a up on its own; queue: right after b arrives)."""
    permits = mp.get_context("spawn").Queue()
    for _ in range(3):
        permits.put(1)
    run, _ = resolve_run(RunSettings(
        mode="event", period_ms=60_000, deadline_ms=50_000, on_new_command=policy,
        log_dir=tmp_path / "run", engine="sim", target_device="orin-agx-64gb",
        engine_options={"jitter_sigma": 0.0, "sleep_ns": permits.get},
        hang_timeout_ms=600_000))
    plans: list[dict] = []
    records: list[CycleRecord] = []
    lock = threading.Lock()

    def release() -> None:
        for _ in range(200):
            permits.put(1)

    def on_record(rec: CycleRecord) -> None:
        with lock:
            records.append(rec)
        if rec.command_id == "a" and policy == "preempt":
            release()

    # no warm-up generation: this test scripts the engine's steps (the permits) itself
    with PlannerDriver(run, publish_plan=plans.append, on_record=on_record,
                       max_cycles=0, warm=False) as driver:
        driver.start()
        driver.submit(CUP, "a")
        _wait(permits.empty, "the engine to block in command a's generation")
        driver.submit("go to the kitchen", "b")
        if policy == "queue":
            release()
        _wait(lambda: any(r.command_id == "b" for r in records), "command b's record")
    by_id = {r.command_id: r for r in records}
    a, b = by_id["a"], by_id["b"]
    assert b.plan_source == "model" and b.deadline_ns == b.scheduled_ns + 50_000 * 1_000_000
    assert plans[-1]["command_id"] == "b"
    if policy == "queue":
        # a finished (the model's plan), b waited for it
        assert a.plan_source == "model" and [p["command_id"] for p in plans] == ["a", "b"]
        assert b.started_ns >= a.published_ns
    else:
        # a was given up the moment b arrived: recorded as superseded, no plan of its own
        assert a.fallback_reason == "superseded" and a.plan_source == "none"
        assert a.published_ns is None and [p["command_id"] for p in plans] == ["b"]
        assert "queue" in a.phases_ns and not a.deadline_met
        assert b.cycle == a.cycle + 1


@pytest.mark.parametrize("mode", ["event", "periodic"])
def test_a_stamp_older_than_the_deadline_is_kept_and_answered_late(tmp_path: Path,
                                                                   mode: str) -> None:
    """A command sent longer ago than the deadline is already late at its receiver: the driver
    keeps its send stamp (no fresh budget), the loop answers it at once with the fallback and
    records the cycle as missed. A stamp after the arrival (another clock) is not believed."""
    run, _ = resolve_run(RunSettings(
        mode=mode, period_ms=200, deadline_ms=150, log_dir=tmp_path / "run", engine="sim",
        target_device="orin-agx-64gb", engine_options={"jitter_sigma": 0.0}))
    plans: list[dict] = []
    records: list[CycleRecord] = []
    lock = threading.Lock()

    def on_record(rec: CycleRecord) -> None:
        with lock:
            records.append(rec)

    with PlannerDriver(run, publish_plan=plans.append, on_record=on_record) as driver:
        now = driver.run.clock()
        future = driver.submit(CUP, "future", sent_ns=now + 10**12)
        assert future.sent_ns is None
        driver.loop.mailbox.take()  # not planned: only the stamp's handling was under test
        old = driver.submit(CUP, "old", sent_ns=now - 10 * 150 * 1_000_000)
        assert old.sent_ns == now - 10 * 150 * 1_000_000
        driver.start()
        _wait(lambda: any(r.command_id == "old" for r in list(records)), "the old command")
    rec = next(r for r in records if r.command_id == "old")
    assert rec.scheduled_ns == old.sent_ns and rec.command_sent_ns == old.sent_ns
    assert not rec.deadline_met and not rec.skipped
    assert (rec.plan_source, rec.fallback_reason) == ("fallback", "deadline")
    assert any(p["command_id"] == "old" and not p["deadline_met"] for p in plans)
