"""The loop's CPU budget (cores, priority, engine niceness) and the lock-free abort flag."""

from __future__ import annotations

import gc
import json
import multiprocessing as mp
import os
import runpy
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from robot_latency.lifetime import start_process
from robot_latency.planner.budget import (
    OWN_CORE_SPIN_MS,
    SHARED_CORE_NAP_MS,
    SHARED_CORE_SPIN_MS,
    BudgetError,
    CpuBudget,
    apply_to_loop_thread,
    available_cpus,
    parse_cpu_list,
)
from robot_latency.planner.config import RunSettings, SettingsError
from robot_latency.planner.lifecycle import PlannerRun, RunError
from robot_latency.planner.replay import replay
from robot_latency.planner.resolve import resolve_run
from robot_latency.planner.worker import AbortFlag
from robot_latency.records import read_records
from robot_latency.ros.params import ParamError, planner_settings
from robot_latency.streams import Command, CommandStream


def test_cpu_lists_parse_ranges_lists_and_single_numbers() -> None:
    assert parse_cpu_list("0,2-3") == (0, 2, 3)
    assert parse_cpu_list(" 1 ") == (1,)
    assert parse_cpu_list("") == ()
    assert parse_cpu_list([0, 1]) == (0, 1)
    assert parse_cpu_list(3) == (3,)
    for bad in ("a", "3-1", "-1", [0, -2], [True], 1.5):
        with pytest.raises(ValueError):
            parse_cpu_list(bad)


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"loop_cpus": (0, 0)}, "loop_cpus"),
    ({"engine_cpus": (-1,)}, "engine_cpus"),
    ({"engine_nice": 20}, "engine_nice"),
    ({"loop_priority": 100}, "loop_priority"),
    ({"loop_priority": -1}, "loop_priority"),
])
def test_bad_budgets_name_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(SettingsError, match=f"^{field}: ") as info:
        CpuBudget(**kwargs)
    assert info.value.name == field


def test_engine_gets_the_cores_the_loop_does_not_own() -> None:
    four = frozenset({0, 1, 2, 3})
    assert CpuBudget().resolved_engine_cpus(four) is None
    assert CpuBudget(loop_cpus=(0,)).resolved_engine_cpus(four) == (1, 2, 3)
    assert CpuBudget(loop_cpus=(0,), engine_cpus=(2,)).resolved_engine_cpus(four) == (2,)
    assert CpuBudget(loop_cpus=(0,)).resolved_engine_cpus(frozenset({0})) is None  # share it
    # Under SCHED_FIFO the loop preempts the engine anywhere: the engine may use every core.
    assert CpuBudget(loop_cpus=(0,), loop_priority=50).resolved_engine_cpus(four) is None
    with pytest.raises(BudgetError, match=r"engine_cpus=\[7\]: CPU \[7\] not available"):
        CpuBudget(engine_cpus=(7,)).check(four)


def _in_thread(fn: Any) -> Any:
    out: dict[str, Any] = {}

    def target() -> None:
        try:
            out["value"] = fn()
        except BaseException as err:  # handed to the test's thread
            out["error"] = err

    t = threading.Thread(target=target)
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


def test_pinning_applies_to_the_loop_thread_only() -> None:
    before = os.sched_getaffinity(0)
    cpu = min(before)
    state = _in_thread(lambda: (apply_to_loop_thread(CpuBudget(loop_cpus=(cpu,))),
                                os.sched_getaffinity(0)))
    assert state[0]["loop_cpus_in_effect"] == [cpu]
    assert state[1] == {cpu}
    assert os.sched_getaffinity(0) == before  # the calling thread is untouched


def _fifo_permitted() -> bool:
    def probe() -> bool:
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        except PermissionError:
            return False
        return True

    return bool(_in_thread(probe))


def test_realtime_priority_is_applied_or_refused_with_how_to_grant_it() -> None:
    budget = CpuBudget(loop_priority=10)
    if _fifo_permitted():
        state = _in_thread(lambda: apply_to_loop_thread(budget))
        assert state["loop_policy"] == "SCHED_FIFO" and state["loop_priority_in_effect"] == 10
        assert os.sched_getscheduler(0) == os.SCHED_OTHER  # the test's thread is untouched
    else:
        with pytest.raises(BudgetError, match=r"loop_priority=10: .*rtprio"):
            _in_thread(lambda: apply_to_loop_thread(budget))


WAIT_FOR_FLAG = """
import time
waiting.value = 2 if flag.is_set() else 1  # started, and saw the flag clear
deadline = time.monotonic() + 60  # a safety net only: the parent sets the flag once told
while not flag.is_set() and time.monotonic() < deadline:
    pass
seen.value = 1 if flag.is_set() else 2
"""


def test_abort_flag_crosses_processes_without_a_lock(tmp_path: Path) -> None:
    """The child reports that it is waiting with the flag clear; only then does the parent set
    it, and the child must see the store (events, not a sleep that hopes the child started)."""
    script = tmp_path / "wait_for_flag.py"
    script.write_text(WAIT_FOR_FLAG)
    ctx = mp.get_context("spawn")
    flag = AbortFlag(ctx)
    waiting, seen = ctx.RawValue("i", 0), ctx.RawValue("i", 0)
    child = start_process(ctx, runpy.run_path, args=(str(script),), kwargs={
        "init_globals": {"flag": flag, "waiting": waiting, "seen": seen}})
    try:
        end = time.monotonic() + 120
        while waiting.value == 0:
            assert child.is_alive() or waiting.value, f"child exited {child.exitcode}"
            assert time.monotonic() < end, "the child never started waiting"
            time.sleep(0.01)
        assert waiting.value == 1 and seen.value == 0 and not flag.is_set()
        flag.set()
        child.join(120)
        assert child.exitcode == 0 and seen.value == 1
    finally:
        if child.is_alive():
            child.kill()
    flag.clear()
    assert not flag.is_set()


def _stream(n: int) -> CommandStream:
    cmds = [Command(t_ns=i * 20_000_000, text="pick up the red cup", command_id=f"c{i}")
            for i in range(n)]
    return CommandStream(name="t", source="test", commands=cmds, topic="/planner/command")


def test_overlapping_runs_in_one_process_share_the_interpreter_settings(tmp_path: Path) -> None:
    """Two runs in one process (as a fleet's robots): the first to end leaves the heap frozen
    and the switch interval short for the other; the last gives both back."""
    def settings(name: str) -> Any:
        return resolve_run(RunSettings(period_ms=40, deadline_ms=30, mode="event",
                                       log_dir=tmp_path / name, engine="sim",
                                       engine_options={"device": "orin-agx-64gb", "seed": 1}))[0]
    before_switch_s = sys.getswitchinterval()
    seen: dict[str, Any] = {}

    def body() -> None:
        with PlannerRun(settings("a"), publish=lambda env: None) as a, \
                PlannerRun(settings("b"), publish=lambda env: None) as b:
            seen["a"], seen["b"] = a.enter_loop_thread(), b.enter_loop_thread()
            a.close()
            seen["after_a"] = (gc.get_freeze_count(), sys.getswitchinterval())
            b.close()
            seen["after_b"] = (gc.get_freeze_count(), sys.getswitchinterval())

    _in_thread(body)
    assert (seen["a"]["loops_in_process"], seen["b"]["loops_in_process"]) == (1, 2)
    frozen, switch_s = seen["after_a"]
    assert frozen > 1000 and switch_s == seen["b"]["switch_interval_s"] < 0.005
    assert seen["after_b"] == (0, before_switch_s)


def test_a_run_pins_its_engine_worker_and_records_the_budget(tmp_path: Path) -> None:
    cpus = sorted(available_cpus())
    budget = CpuBudget(loop_cpus=(cpus[0],), engine_nice=7)
    cfg, _ = resolve_run(RunSettings(period_ms=40, deadline_ms=30, mode="event",
                                     log_dir=tmp_path / "run", engine="sim", cpu=budget,
                                     engine_options={"device": "orin-agx-64gb", "seed": 1}))
    done: dict[str, Any] = {}
    before_switch_s = sys.getswitchinterval()

    def body() -> None:
        with PlannerRun(cfg, publish=lambda env: None) as run:
            worker = psutil.Process(run.runner.pid)
            done["worker_cpus"] = worker.cpu_affinity()
            done["worker_nice"] = worker.nice()
            run.enter_loop_thread()
            done["loop_cpus"] = sorted(os.sched_getaffinity(0))
            done["switch_interval_s"] = sys.getswitchinterval()
            replay(run.loop, _stream(5))
            run.close()

    _in_thread(body)
    expected_engine = cpus[1:] or cpus  # a one-core machine: the engine shares it
    assert done["worker_cpus"] == expected_engine
    # niceness is added to the run's own (a suite run under `nice` starts above 0)
    assert done["worker_nice"] == min(19, psutil.Process().nice() + 7)
    assert done["loop_cpus"] == [cpus[0]]
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["cpu_budget"]["loop_cpus"] == [cpus[0]]
    assert manifest["cpu_budget"]["loop_cpus_in_effect"] == [cpus[0]]
    assert manifest["cpu_budget"]["engine_nice"] == 7
    # the start-up heap was frozen for the loop, and is collectable again after the run
    assert manifest["cpu_budget"]["gc_frozen_objects"] > 1000
    assert gc.get_freeze_count() == 0
    # the loop ran with a short switch interval (it never waits 5 ms for the GIL), given back
    assert done["switch_interval_s"] == manifest["cpu_budget"]["switch_interval_s"] < 0.005
    assert sys.getswitchinterval() == before_switch_s
    records = read_records(tmp_path / "run" / "cycles.jsonl")
    assert len(records) == 5
    # Linux reports the hypervisor's steal counter: every record carries a value
    assert all(r.host_steal_ns is not None and r.host_steal_ns >= 0 for r in records)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["host_steal_ms"]["n"] == 5


def test_a_budget_naming_a_missing_cpu_stops_the_run_before_it_starts(tmp_path: Path) -> None:
    missing = max(available_cpus()) + 1
    cfg, _ = resolve_run(RunSettings(log_dir=tmp_path / "run", engine="sim",
                                     cpu=CpuBudget(engine_cpus=(missing,))))
    with pytest.raises(RunError, match=rf"engine_cpus=\[{missing}\]"):
        PlannerRun(cfg, publish=lambda env: None)


def test_ros_parameters_build_the_budget(tmp_path: Path) -> None:
    cpus = sorted(available_cpus())
    s = planner_settings({"engine": "llamacpp", "log_dir": str(tmp_path),
                          "loop_cpus": str(cpus[0]), "loop_priority": 20, "engine_nice": 3})
    assert s.run.cpu == CpuBudget(loop_cpus=(cpus[0],), loop_priority=20, engine_nice=3)
    # n_threads defaults to one per core the engine owns
    assert s.run.engine_options["n_threads"] == max(1, len(cpus) - 1)
    s = planner_settings({"engine": "sim", "log_dir": str(tmp_path), "engine_cpus": [0]})
    assert s.run.cpu.engine_cpus == (0,)
    with pytest.raises(ParamError, match="'loop_cpus'"):
        planner_settings({"log_dir": str(tmp_path), "loop_cpus": "zero"})
    with pytest.raises(ParamError, match="'loop_priority'"):
        planner_settings({"log_dir": str(tmp_path), "loop_priority": 120})


def test_a_run_gives_its_thread_back_unpinned(tmp_path: Path) -> None:
    """Two runs in one thread (a sweep): the second starts with every core, not the first's."""

    before = available_cpus()
    if len(before) < 2:
        pytest.skip("needs two cores to pin one")
    loop_core = min(before)
    for i in range(2):
        config, _ = resolve_run(RunSettings(log_dir=tmp_path / str(i), engine="sim",
                                            runner="inline",
                                            cpu=CpuBudget(loop_cpus=(loop_core,))))
        with PlannerRun(config, publish=lambda envelope: None) as run:
            state = run.enter_loop_thread()
            assert state["loop_cpus_in_effect"] == [loop_core]
            run.close()
        assert available_cpus() == before


def test_a_loop_sharing_its_cores_wakes_early_and_naps_while_it_polls() -> None:
    shared = CpuBudget()
    assert (shared.spin_ms, shared.nap_ms) == (SHARED_CORE_SPIN_MS, SHARED_CORE_NAP_MS)
    assert 0 < shared.nap_ms < shared.spin_ms
    for own in (CpuBudget(loop_cpus=(0,)), CpuBudget(loop_priority=50)):
        assert (own.spin_ms, own.nap_ms) == (OWN_CORE_SPIN_MS, 0.0)  # alone: it spins
