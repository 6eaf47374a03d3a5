
"""Smoke run of bench/predict_validate.py: the documented command, on the shipped tables."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from robot_latency.lifetime import follow_parent

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"


def test_predict_validate(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), str(BENCH), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(BENCH / "predict_validate.py"), "--out", str(out)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
                          check=False, preexec_fn=follow_parent())
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["command"].startswith("python ") and "predict_validate.py" in doc["command"]
    assert set(doc["targets"]) >= {"prefill_coverage_ge_75pct", "llamacpp_loso_median_le_20pct",
                                   "no_device_moves_past_2x", "loso_coverage_ge_80pct"}
    summary = doc["summary"]
    assert summary["prefill"]["rows"] == doc["prefill"]["total_rows"]
    assert summary["llamacpp_cuda"]["flagged_sources"]
    assert doc["leave_one_source_out"]["rows"] and doc["device_stability"]["devices"]
    # leave-one-source-out coverage: the share of held-out rows inside the stated interval
    loso = doc["leave_one_source_out"]
    done = [r for r in loso["rows"] if r["error_rel"] is not None]
    inside = sum(1 for r in done if r["inside_interval"])
    assert summary["leave_one_source_out"]["coverage_80"] == inside / len(done)
    assert all(r["interval_ms"][0] <= r["predicted_ms"] <= r["interval_ms"][1] for r in done)
