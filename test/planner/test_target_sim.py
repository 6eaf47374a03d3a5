"""The loop simulated on the target: its rules, its intervals, and its independence of the host.

The untimed pass runs the real engines (the simulated engine here, llama.cpp on the shipped
model in test_untimed.py); the simulation is checked on events (who misses, who waits, who is
superseded), never on wall-clock gaps.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path

import pytest

from robot_latency.clock import ScriptedClock
from robot_latency.planner.config import RunSettings
from robot_latency.planner.lifecycle import PlannerRun
from robot_latency.planner.replay import replay
from robot_latency.planner.resolve import resolve_run
from robot_latency.planner.target_inputs import (
    predictor_for,
    read_target_inputs,
    untimed_inputs,
    write_target_inputs,
)
from robot_latency.planner.target_sim import (
    SimCommand,
    TargetAnswer,
    min_deadline_ms,
    sim_commands,
    target_answer,
)
from robot_latency.records import read_records
from robot_latency.report.rundir import load_run
from robot_latency.report.target import simulated_answers, target_level
from robot_latency.streams import SHIPPED_DIR, Command, CommandStream, read_stream

STEPS = predictor_for("qwen2.5-0.5b", "orin-nano-8gb", "llamacpp-cuda", quant="Q4_0")


def _cmd(i: int, arrival_ms: float, service_ms: float, *, valid: bool = True,
         asked: bool = True) -> SimCommand:
    # one token: the service time is the TTFT alone
    return SimCommand(f"c:{i}", arrival_ms, asked, ttft_ms=service_ms, itl_ms=1.0,
                      itl_floor_ms=0.5, tokens_out=1 if asked else 0, plan_valid=valid)


def _point(cmds: list[SimCommand], rules: RunSettings) -> TargetAnswer:
    return target_answer("t", cmds, STEPS, rules, draws=1, curve=False)


def test_margins_count_against_the_model() -> None:
    # 95 ms of service fits a 100 ms deadline, but not the deadline less 2 + 4 ms of margins
    rules = RunSettings(mode="event", deadline_ms=100.0, publish_margin_ms=2.0,
                      transport_margin_ms=4.0)
    a = _point([_cmd(0, 0.0, 95.0), _cmd(1, 1000.0, 93.0)], rules)
    assert a.commands == 2 and a.miss_rate == 0.5


def test_event_queue_waits_and_preempt_supersedes() -> None:
    # two commands 10 ms apart, 60 ms each, deadline 100: queued, the second waits 50 ms and
    # ends at 120 ms from its arrival 10 ms -> 110 > 98: a miss; preempted, the first is
    # superseded and the second starts at once
    cmds = [_cmd(0, 0.0, 60.0), _cmd(1, 10.0, 60.0)]
    queue = _point(cmds, RunSettings(mode="event", deadline_ms=100.0, on_new_command="queue"))
    assert queue.miss_rate == 0.5
    assert queue.e2e_ms == (60.0, 110.0)  # the wait is in the second's e2e
    pre = _point(cmds, RunSettings(mode="event", deadline_ms=100.0, on_new_command="preempt"))
    assert pre.miss_rate == 0.5 and pre.e2e_ms[1] == 60.0


def test_the_loop_gives_up_so_the_next_command_waits_at_most_to_the_give_up() -> None:
    # the first (500 ms of service) is given up at 48 ms; the second, arrived at 1 ms, starts
    # then and gives up at 49 ms: a miss, its 47 ms wait inside its e2e
    rules = RunSettings(mode="event", deadline_ms=50.0)
    a = _point([_cmd(0, 0.0, 500.0), _cmd(1, 1.0, 10.0)], rules)
    assert a.miss_rate == 1.0
    assert a.e2e_ms == (500.0, 57.0)
    # with a later arrival the second has its whole budget
    b = _point([_cmd(0, 0.0, 500.0), _cmd(1, 48.0, 10.0)], rules)
    assert b.miss_rate == 0.5 and b.e2e_ms[1] == 10.0


def test_periodic_counts_commands_not_ticks() -> None:
    # ticks every 100 ms; c:1 is replaced by c:2 before the 300 ms tick: never planned (a miss).
    # c:0 is re-planned on ticks 0, 100, 200: one command, one sample.
    cmds = [_cmd(0, 0.0, 30.0), _cmd(1, 250.0, 30.0), _cmd(2, 260.0, 30.0)]
    a = _point(cmds, RunSettings(mode="periodic", period_ms=100.0, deadline_ms=80.0))
    assert a.commands == 3
    assert a.miss_rate == pytest.approx(1 / 3)
    assert a.model_in_time_rate == pytest.approx(2 / 3)


def test_invalid_plans_and_refused_commands() -> None:
    cmds = [_cmd(0, 0.0, 10.0, valid=False), _cmd(1, 500.0, 10.0),
            _cmd(2, 900.0, 0.0, asked=False)]
    a = _point(cmds, RunSettings(mode="event", deadline_ms=100.0))
    assert a.refused == 1 and a.commands == 2
    assert a.miss_rate == 0.0  # both in time
    assert a.model_in_time_rate == 0.5  # the invalid one gets a fallback on any host


def test_min_deadline_is_where_the_point_rate_drops_to_the_target() -> None:
    cmds = [_cmd(i, 1000.0 * i, 40.0 + i) for i in range(20)]
    rules = RunSettings(mode="event", deadline_ms=100.0, publish_margin_ms=2.0)
    d = min_deadline_ms(cmds, rules, 0.05)
    # 19 of 20 (95%) must be ready by d - 2: the 19th slowest needs 58 ms
    assert d == 60.0
    at = _point(cmds, replace(rules, deadline_ms=d))
    below = _point(cmds, replace(rules, deadline_ms=d - 1))
    assert at.miss_rate <= 0.05 < below.miss_rate


def test_interval_holds_the_point_and_the_curve_falls() -> None:
    shipped = read_stream(SHIPPED_DIR / "steady_operator")
    # The shipped commands 1 s apart: no command waits for another, so the curve only falls.
    stream = replace(shipped, commands=tuple(replace(c, t_ns=i * 3 * 10**9)
                                             for i, c in enumerate(shipped.commands)))
    inputs = untimed_inputs(RunSettings(log_dir=Path("x"), engine="sim", model="qwen2.5-0.5b",
                                        quant="Q4_0", mode="event", deadline_ms=80.0),
                            stream, speed=3.0, use_cache=False)
    steps = inputs.predictor()
    cmds = sim_commands(stream, inputs.untimed, steps, speed=3.0)
    a = target_answer("Q4_0", cmds, steps, inputs.settings, draws=300)
    lo, hi = a.miss_interval
    assert lo <= a.miss_rate <= hi and hi - lo > 0.0
    glo, ghi = a.model_in_time_interval
    assert glo <= a.model_in_time_rate <= ghi
    # every deadline of the curve: the draws' ends never leave out the point itself (at a
    # point of 0 or 1 they did, e.g. 0.0% [0.9, 33.6])
    for _dl, point, plo, phi in a.curve:
        assert plo <= point <= phi
    rates = [r for _, r, _, _ in a.curve]
    assert rates[0] == 1.0 and rates[-1] == 0.0
    assert all(x >= y for x, y in itertools.pairwise(rates))  # no queueing here


def _timed_run(tmp_path: Path, name: str, host: str, stream: CommandStream) -> Path:
    """A real timed replay with the sim engine simulating ``host`` (its speed), scripted clock."""
    settings = RunSettings(log_dir=tmp_path / name, engine="sim", runner="inline",
                           engine_options={"device": host, "seed": 1}, model="qwen2.5-0.5b",
                           quant="Q8_0", target_device="orin-nano-8gb", mode="event",
                           deadline_ms=150.0, label=name)
    cfg, _ = resolve_run(settings)
    with PlannerRun(cfg, publish=lambda e: None, clock=ScriptedClock(start_ns=10**9)) as run:
        replay(run.loop, stream, speed=3.0)
        run.close()
    write_target_inputs(untimed_inputs(settings, stream, speed=3.0, cache_dir=tmp_path / "c"),
                        tmp_path / name)
    return tmp_path / name


def test_the_answer_does_not_depend_on_the_hosts_speed(tmp_path: Path) -> None:
    full = read_stream(SHIPPED_DIR / "steady_operator")
    stream = replace(full, commands=full.commands[:24])
    fast = _timed_run(tmp_path, "fast", "orin-agx-64gb", stream)
    slow = _timed_run(tmp_path, "slow", "orin-nano-4gb", stream)
    # this host's speed shows in the timed records: the slow host cut cycles off
    cut = {d.name: sum(1 for r in read_records(d / "cycles.jsonl")
                       if r.stop_reason not in ("done", "complete")) for d in (fast, slow)}
    assert cut["slow"] > cut["fast"]
    runs = [load_run(fast), load_run(slow)]
    old = [target_level(r, None) for r in runs]
    assert old[0].rate() != old[1].rate()  # the per-record answer moved with the host
    a_fast, a_slow = simulated_answers(runs, [fast, slow])
    assert abs(a_fast.miss_rate - a_slow.miss_rate) <= 0.03
    assert abs(a_fast.e2e_p50_ms / a_slow.e2e_p50_ms - 1) <= 0.05
    assert read_target_inputs(fast).untimed.key == read_target_inputs(slow).untimed.key


def test_p50_follows_bytes_per_token() -> None:
    stream = read_stream(SHIPPED_DIR / "steady_operator")
    p50 = {}
    for q in ("Q8_0", "Q4_K_M", "Q4_0"):
        inputs = untimed_inputs(RunSettings(log_dir=Path("x"), engine="sim",
                                            model="qwen2.5-0.5b", quant=q), stream,
                                use_cache=False)
        steps = inputs.predictor()
        a = target_answer(q, sim_commands(stream, inputs.untimed, steps), steps,
                          inputs.settings, draws=1, curve=False)
        p50[q] = (a.e2e_p50_ms, steps.model.weight_bytes_per_step)
    order = sorted(p50, key=lambda q: p50[q][1])
    assert sorted(p50, key=lambda q: p50[q][0]) == order
    assert order[-1] == "Q8_0"


def test_a_stream_command_missing_from_the_pass_is_named() -> None:
    stream = read_stream(SHIPPED_DIR / "steady_operator")
    inputs = untimed_inputs(RunSettings(log_dir=Path("x"), engine="sim"), stream,
                            use_cache=False)
    other = replace(stream, commands=(*stream.commands,
                                      Command(stream.commands[-1].t_ns, "go", "extra:1")))
    from robot_latency.planner.untimed import UntimedError

    with pytest.raises(UntimedError, match="extra:1"):
        sim_commands(other, inputs.untimed, inputs.predictor())



def test_the_draws_spread_both_ways_around_the_point() -> None:
    """A draw at the 10% quantile is the interval's low end (faster), at the 90% its high end;
    half the draws are faster than the point (the low side once came out slower too)."""
    import numpy as np

    from robot_latency.planner.target_sim import _factors

    z80 = 1.2815515655446004
    f = _factors((-0.25, 0.5), np.array([-z80, 0.0, z80]))
    assert f == pytest.approx([0.75, 1.0, 1.5])
    draws = _factors((-0.25, 0.5), np.random.default_rng(0).standard_normal(2000))
    assert 0.45 < float(np.mean(draws < 1.0)) < 0.55
