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

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench" / "offboard.py"


def _bench(tmp_path: Path, *argv: str) -> dict:
    out = tmp_path / "result.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(BENCH), *argv, "--out", str(out)], env=env,
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
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
