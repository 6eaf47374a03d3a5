"""Smoke runs of bench/target_sim.py at its smallest settings: the untimed pass quiet and under
load (real busy processes), the answers from each, and the simulation's timing run (the figures
come from docs/BENCHMARKS.md, not from here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from robot_latency.lifetime import follow_parent
from robot_latency.models.bundled import bundled_model_path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"


def _bench(tmp_path: Path, *argv: str) -> Any:
    out = tmp_path / "result.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(BENCH)]),
           "ROBOT_LATENCY_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, str(BENCH / "target_sim.py"), *argv, "--out",
                           str(out)], env=env, capture_output=True, text=True, timeout=600,
                          cwd=tmp_path, check=False, preexec_fn=follow_parent())
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["command"].startswith("python ") and "target_sim.py" in doc["command"]
    return doc


def test_target_sim_smoke_sim_engine_under_load(tmp_path: Path) -> None:
    doc = _bench(tmp_path, "--engine", "sim", "--model", "qwen2.5-0.5b",
                 "--quants", "Q8_0", "Q4_0", "--smoke", "--load", "1")
    for q in ("Q8_0", "Q4_0"):
        level = doc["levels"][q]
        assert level["commands"] == 3 and level["same_facts_quiet_and_loaded"]
        assert level["answer_quiet"] == level["answer_loaded"]
    assert doc["simulation"]["draws"] == 50 and doc["simulation"]["levels"] == 2


def test_target_sim_smoke_llamacpp(tmp_path: Path) -> None:
    doc = _bench(tmp_path, "--model", str(bundled_model_path("planner")), "--quants", "Q8_0",
                 "--smoke")
    level = doc["levels"]["Q8_0"]
    assert level["commands"] == 3 and level["tokens_out_total"] >= 3
    assert 0.0 <= level["answer_quiet"]["miss_rate"] <= 1.0


def test_predict_stream_time_smoke(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(BENCH)])}
    proc = subprocess.run([sys.executable, str(BENCH / "predict_stream_time.py"), "--repeats",
                           "1", "--commands", "2", "--vocab", "2000", "--cache-dir",
                           str(tmp_path / "cache"), "--out", str(out)], env=env,
                          capture_output=True, text=True, timeout=600, cwd=tmp_path, check=False,
                          preexec_fn=follow_parent())
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["command"].startswith("python ") and "predict_stream_time.py" in doc["command"]
    assert set(doc["models"]) == {"planner", "vocab2000", "vocab2000 --quants Q8_0 Q4_0"}
    for case in doc["models"].values():
        assert len(case["cached_runs_s"]) == 1 and case["first_run_s"] > 0
    assert len(list((tmp_path / "cache" / "untimed").glob("*.json"))) == 4
    assert (tmp_path / "cache" / "models" / "vocab2000.ladder.json").is_file()
