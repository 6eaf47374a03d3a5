"""Every runner covers the whole Runner protocol, so no caller probes one with getattr."""

from __future__ import annotations

import ast
from pathlib import Path

from robot_latency.clock import ScriptedClock, WaitingClock, sleep_until_for
from robot_latency.planner.engine import create_planner_engine
from robot_latency.planner.hybrid import HybridRunner
from robot_latency.planner.runner import InlineRunner, Runner, RunnerHealth
from robot_latency.planner.worker import ProcessRunner

PACKAGE = Path(__file__).resolve().parents[2] / "robot_latency"


def _members(cls: type) -> set[str]:
    return {n for n in vars(cls) if not n.startswith("_")}


def test_the_protocol_covers_what_callers_use() -> None:
    assert {"run", "info", "close", "collect_aborted", "request_abort", "health", "pid",
            "restarts", "worker_cpus"} <= _members(Runner)


def test_each_runner_implements_all_of_it() -> None:
    inline = InlineRunner(create_planner_engine("sim", device="orin-agx-64gb"))
    process = ProcessRunner("sim", {"device": "orin-agx-64gb"})  # not started: no worker yet
    hybrid = HybridRunner(inline, server=None, contract=None, policy="first_valid")
    for runner in (inline, process, hybrid):
        missing = sorted(n for n in _members(Runner) if not hasattr(runner, n))
        assert not missing, f"{type(runner).__name__} lacks {missing}"
    assert (process.pid, process.restarts, process.health()) == (None, 0, RunnerHealth())
    assert (hybrid.pid, hybrid.restarts, hybrid.worker_cpus) == (None, 0, None)
    inline.close()


def test_an_inline_runner_answers_for_a_runner_without_a_worker() -> None:
    clock = ScriptedClock(start_ns=10**9)
    runner = InlineRunner(create_planner_engine("sim", clock=clock, device="orin-agx-64gb"),
                          clock=clock)
    assert (runner.pid, runner.restarts, runner.worker_cpus) == (None, 0, None)
    assert runner.collect_aborted(clock() + 1) is None
    assert runner.health() == RunnerHealth()
    runner.request_abort()  # nothing to stop
    runner.close()


def test_no_caller_probes_a_runner_with_getattr() -> None:
    probes = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and node.func.id in ("getattr", "hasattr") and node.args:
                target = ast.unparse(node.args[0]).lower()
                if "runner" in target or "onboard" in target:
                    probes.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert not probes


def test_a_scripted_clock_waits_by_moving() -> None:
    clock = ScriptedClock(start_ns=100)
    assert isinstance(clock, WaitingClock)
    wait = sleep_until_for(clock)
    wait(250)
    assert clock.now() == 250
    wait(200)  # never back
    assert clock.now() == 250
    assert not isinstance(lambda: 0, WaitingClock)


def test_waiting_for_a_while_takes_no_scripted_step() -> None:
    """The sim engine waits with ``sleep_for``: a clock scripted per call keeps its script."""
    clock = ScriptedClock(start_ns=0, steps_ns=[7, 11])
    clock.sleep_for(100)
    assert (clock.now(), clock.calls) == (100, 0)
    assert clock() == 100 and clock() == 107 and clock.now() == 118
