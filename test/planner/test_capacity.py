"""The capacity search: the highest replay speed at which the target holds a miss target.

Checked on scripted commands (service times set by hand, so the answer is known) and on
synthetic miss curves, never on wall-clock time: the rate found holds the target when the loop
is simulated at it on its own, and 10% more does not.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from robot_latency.planner.capacity import (
    CapacityError,
    find_rate,
    search_speed,
    stream_rate_cmd_s,
)
from robot_latency.planner.config import RunSettings
from robot_latency.planner.target_inputs import predictor_for
from robot_latency.planner.target_sim import SimCommand, target_answer

STEPS = predictor_for("qwen2.5-0.5b", "orin-nano-8gb", "llamacpp-cuda", quant="Q4_0")
#: no margins: the deadline is the model's whole budget
EVENT = RunSettings(mode="event", deadline_ms=100.0, publish_margin_ms=0.0,
                    transport_margin_ms=0.0, on_new_command="queue")


def _cmds(n: int, gap_ms: float, service_ms: float) -> list[SimCommand]:
    # one token each: the service time is the TTFT alone
    return [SimCommand(f"c:{i}", i * gap_ms, True, ttft_ms=service_ms, itl_ms=1.0,
                       itl_floor_ms=0.5, tokens_out=1, plan_valid=True) for i in range(n)]


def _miss_at(cmds: list[SimCommand], rules: RunSettings, speed: float) -> float:
    """The loop simulated at ``speed`` through the answer's own path (no search involved)."""
    fast = [replace(c, arrival_ms=c.arrival_ms / speed) for c in cmds]
    return target_answer("t", fast, STEPS, rules, draws=1, curve=False).miss_rate


@pytest.mark.parametrize(("rules", "service_ms"), [
    (EVENT, 40.0),
    (replace(EVENT, on_new_command="preempt"), 40.0),
    (RunSettings(mode="periodic", period_ms=50.0, deadline_ms=50.0, publish_margin_ms=0.0,
                 transport_margin_ms=0.0), 30.0),
])
def test_the_rate_found_holds_and_ten_percent_more_does_not(rules: RunSettings,
                                                            service_ms: float) -> None:
    cmds = _cmds(50, 100.0, service_ms)
    got = find_rate(cmds, STEPS, rules, miss_target=0.05)
    assert got.speed_held is not None and got.speed_failed is not None
    assert got.speed_held < got.speed_failed <= 1.01 * got.speed_held
    assert _miss_at(cmds, rules, got.speed_held) <= 0.05
    assert _miss_at(cmds, rules, 1.1 * got.speed_held) > 0.05
    assert _miss_at(cmds, rules, got.speed_failed) > 0.05
    assert got.miss_held is not None and got.miss_held <= 0.05
    # 50 commands 100 ms apart: 10 commands/s at x1, the rates scale with the speed
    assert got.base_rate_cmd_s == pytest.approx(10.0)
    assert got.rate_held_cmd_s == pytest.approx(10.0 * got.speed_held)


def test_event_queue_capacity_is_where_the_wait_eats_the_budget() -> None:
    # 40 ms of service a command: without margins nothing queues up to 2.5 commands per 100 ms
    # (x2.5); past it each command waits 40 - 100/s ms longer than the one before. The answer
    # lies between those two and above x2.5.
    got = find_rate(_cmds(50, 100.0, 40.0), STEPS, EVENT, miss_target=0.0)
    assert got.speed_held is not None and 2.5 <= got.speed_held < 2.6


def test_a_slower_target_holds_a_lower_rate_and_the_interval_brackets_the_point() -> None:
    cmds = _cmds(40, 100.0, 40.0)
    slow = [replace(c, ttft_ms=60.0) for c in cmds]
    fast_rate = find_rate(cmds, STEPS, EVENT, miss_target=0.05)
    slow_rate = find_rate(slow, STEPS, EVENT, miss_target=0.05)
    assert slow_rate.speed_held is not None and fast_rate.speed_held is not None
    assert slow_rate.speed_held < fast_rate.speed_held
    lo, hi = fast_rate.speed_held_interval
    assert lo is not None and hi is not None and lo <= fast_rate.speed_held <= hi


def test_search_on_a_known_curve() -> None:
    # miss rate 0 up to x3.7, then rising 10 points per unit of speed: 5% holds up to x4.2
    got = search_speed(lambda s: np.clip((s - 3.7) / 10, 0, 1), 0.05)
    assert got.held is not None and got.failed is not None
    assert got.held <= 4.2 < got.failed and 1.1 * got.held > 4.2


def test_a_failure_below_a_hold_is_never_skipped() -> None:
    # a band of misses about x2 (which the first round's grid tries), then holds to x6: the
    # answer stays below the band, the first failure seen
    def miss(s: np.ndarray) -> np.ndarray:
        return np.where(((s > 1.9) & (s < 2.1)) | (s > 6.0), 1.0, 0.0)

    got = search_speed(miss, 0.05)
    assert got.held is not None and got.failed is not None
    assert got.held <= 1.9 < got.failed <= 2.0


def test_no_speed_holds_and_every_speed_holds() -> None:
    never = search_speed(lambda s: np.ones_like(s), 0.05)
    assert never.held is None and never.failed is not None and never.miss_failed == 1.0
    always = search_speed(lambda s: np.zeros_like(s), 0.05)
    assert always.failed is None and always.held == pytest.approx(2.0 ** 10)


def test_commands_the_target_cannot_meet_hold_no_rate() -> None:
    got = find_rate(_cmds(10, 100.0, 150.0), STEPS, EVENT, miss_target=0.05)
    assert got.speed_held is None and got.rate_held_cmd_s is None
    assert got.miss_failed == 1.0


@pytest.mark.parametrize(("cmds", "target", "needle"), [
    (_cmds(1, 100.0, 10.0), 0.05, "two commands"),
    (_cmds(3, 0.0, 10.0), 0.05, "two commands at different times"),
    (_cmds(5, 100.0, 10.0), 1.0, "miss target"),
])
def test_bad_asks_are_refused(cmds: list[SimCommand], target: float, needle: str) -> None:
    with pytest.raises(CapacityError, match=needle):
        find_rate(cmds, STEPS, EVENT, miss_target=target)
    if len(cmds) < 2:
        with pytest.raises(CapacityError):
            stream_rate_cmd_s(cmds)
