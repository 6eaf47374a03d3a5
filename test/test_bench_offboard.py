"""Smoke runs of bench/offboard.py at its smallest settings: each benchmark starts a real
llama-cpp-python server, runs, and writes its JSON (the figures come from the quiet-machine runs
in docs/BENCHMARKS.md, not from here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from robot_latency.lifetime import follow_parent

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench" / "offboard.py"


def _bench(tmp_path: Path, *argv: str) -> dict:
    out = tmp_path / "result.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(BENCH), *argv, "--out", str(out)], env=env,
                          capture_output=True, text=True, timeout=600, cwd=tmp_path,
                          preexec_fn=follow_parent())
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["command"].startswith("python ")
    return doc


def test_http_cost_smoke(tmp_path: Path) -> None:
    doc = _bench(tmp_path, "http_cost", "--repeats", "2", "--commands", "2")
    for pair in ("without_grammar", "with_grammar"):
        assert len(doc[pair]["repeats"]) == 2
        for rep in doc[pair]["repeats"]:
            assert rep["server"]["ttft_n"] == rep["inprocess"]["ttft_n"] == 2
        assert doc[pair]["itl_p50_ratio_median"] > 0
        assert "ttft_p50_diff_ms_median" in doc[pair]
    assert doc["targets"]["measured_on"] == "without_grammar"


def test_fleet_smoke(tmp_path: Path) -> None:
    doc = _bench(tmp_path, "fleet", "--robots", "1,2", "--max-commands", "2")
    assert [s["robots"] for s in doc["sizes"]] == [1, 2]
    assert all(s["cycles"] > 0 and s["miss_rate_ci95"] for s in doc["sizes"])
    for s in doc["sizes"]:
        # the model's plans and the fallbacks per N, beside the misses: every cycle is one
        none = s["cycles"] - s["model_plans"] - s["fallback_plans"]
        assert 0 <= none <= sum(s["fallbacks"].values())
        assert s["model_plan_rate"] == s["model_plans"] / s["cycles"]
        assert s["fallback_rate"] == s["fallback_plans"] / s["cycles"]
        assert doc["by_robots"][str(s["robots"])]["model_plan_rate"] == s["model_plan_rate"]


def test_hedge_smoke(tmp_path: Path) -> None:
    doc = _bench(tmp_path, "hedge", "--load", "1", "--repeats", "1", "--max-commands", "2",
                 "--onboard-model", "planner-draft")
    hybrids = {"hybrid_first_valid", "hybrid_prefer_server"}
    assert set(doc["model_plan_in_time_rate_median"]) == {"onboard", "offboard"} | hybrids
    assert set(doc["targets"]) == set(doc["hybrid_late_cycles"]) == hybrids
    assert doc["onboard_model"].endswith("planner-draft.gguf") != doc["model"].endswith(
        "planner-draft.gguf")
    # The load ran through every measured run: its one robot was answered before the first run
    # started (FleetLoad waits for that), so the server was busy all along.
    load = doc["load"]
    assert load["requests"] >= 1 and load["mean_request_ms"] > 0 and load["wall_s"] > 0
    assert len(doc["repeats"]) == 1
    if len(os.sched_getaffinity(0)) >= 2:  # the server stands for another machine
        assert doc["server_cpus"] and doc["robot_cpus"]
        assert not set(doc["server_cpus"]) & set(doc["robot_cpus"])


@pytest.mark.parametrize("cycles", [9])
def test_leak_smoke(tmp_path: Path, cycles: int) -> None:
    doc = _bench(tmp_path, "leak", "--cycles", str(cycles))
    assert doc["every_cycle_planned"]
    assert doc["reasons"].get("server_unreachable", 0) >= 1  # the server was down a while
    assert sum(doc["reasons"].values()) == cycles


def test_kill_smoke(tmp_path: Path) -> None:
    """The server SIGKILLed under a real ``robot-latency run`` and restarted: every kill is
    accounted for, every cycle has a plan, and a kill that cut a request in flight is a server
    fault in the record of the cycle it hit."""
    from robot_latency.records import read_records

    runs = tmp_path / "runs"
    doc = _bench(tmp_path, "kill", "--kills", "3", "--repeats", "1", "--max-commands", "8",
                 "--served-between", "3", "--runs-dir", str(runs))
    (rep,) = doc["repeats"]
    records = read_records(runs / "rep0" / "cycles.jsonl")
    assert rep["cycles"] == len(records) == rep["run_summary"]["cycles"] > 0
    # Late is what the records say, and the run's own summary agrees.
    assert rep["late"] == sum(not r.deadline_met for r in records)
    assert rep["late"] == rep["run_summary"]["deadline_misses"]
    # Every cycle the loop ran has a plan; a skipped tick (a loaded host) is a miss, counted late.
    assert rep["planned"] == rep["cycles"] - rep["skipped"]
    assert rep["skipped"] <= rep["late"]
    assert all(r.plan is not None for r in records if not r.skipped)
    # The kills happened (the run outlasts three, with the served requests between them), and
    # the server served again after each: model plans after the last kill.
    kills = rep["kill_list"]
    assert rep["kills"] == len(kills) == 3
    assert [k["moment"] for k in kills] == ["request_start", "halfway", "between_requests"]
    last_kill_ms = kills[-1]["kill_ms"]
    t0 = records[0].scheduled_ns
    assert any(r.plan_source == "model" and (r.scheduled_ns - t0) / 1e6 > last_kill_ms
               for r in records)
    # The server was down a while: cycles fell back as unreachable.
    assert rep["fallbacks"].get("server_unreachable", 0) >= 1
    # Two of the three kills are aimed at a request in flight. A cycle such a kill hit falls
    # back with a server fault, or has the model's plan when the server had sent the answer
    # before it died (its timing line not yet written). Where the server had not taken the
    # request yet (on its way: its log without it), the broken connection can surface after the
    # loop's give-up: then the cycle falls back at its deadline. Never the deadline while the
    # server held the request, never another reason.
    assert rep["kills_mid_request"] >= 1
    by_cycle = {r.cycle: r for r in records}
    cut = given_up = 0
    for kill in kills:
        if not (kill["mid_request"] and kill["cycle"] is not None):
            continue
        rec = by_cycle[kill["cycle"]]
        assert kill["deadline_met"] == rec.deadline_met
        if rec.plan_source == "model":
            continue
        assert rec.plan_source == "fallback", kill
        if rec.fallback_reason == "deadline" and not kill["server_in_flight"]:
            given_up += 1
            continue
        assert rec.fallback_reason in ("server_error", "server_unreachable"), kill
        assert rec.engine_error, kill  # the fault is in the record
        cut += 1
    assert cut == rep["mid_request_cut"] >= 1 and given_up == rep["mid_request_given_up"]
    assert rep["mid_request_other"] == 0
    assert sum(rep["mid_request_outcomes"].values()) == rep["mid_request_cycles"]
    # Every fallback's lateness is in the document, late or not, by its reason.
    fallbacks = [r for r in records if r.plan_source == "fallback"]
    lateness = rep["fallback_lateness_ms"]
    assert sum(v["n"] for v in lateness.values()) == len(fallbacks)
    assert sum(v["late"] for v in lateness.values()) == sum(
        not r.deadline_met for r in fallbacks)
    assert doc["late"] == rep["late"] and doc["meets_target"] == (
        rep["late"] == 0 and rep["mid_request_late"] == 0 and rep["mid_request_other"] == 0)
