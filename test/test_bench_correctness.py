
"""The correctness bench runs at its smallest settings: one level, both fallbacks, one repeat."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from robot_latency.lifetime import follow_parent

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
HANG_S = 900  # a hang guard, not a timing


def _run(tmp_path: Path, script: str, *args: str) -> Any:
    out = tmp_path / "out.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), str(BENCH), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(BENCH / script), *args, "--out", str(out)],
                          cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=HANG_S, check=False, preexec_fn=follow_parent())
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["command"].startswith("python ") and script in doc["command"]
    return doc


def test_correctness_per_level_and_fallback(tmp_path: Path) -> None:
    doc = _run(tmp_path, "correctness.py", "--levels", "Q8_0", "--fallbacks", "rule,hold",
               "--repeats", "1", "--limit", "3", "--streams", "steady_operator")
    assert doc["conditions"]["commands"] == 3 and doc["conditions"]["interleaved"]
    assert set(doc["summary"]) == {"Q8_0 rule", "Q8_0 hold"}
    for key, cell in doc["summary"].items():
        assert cell["n_repeats"] == 1 and cell["correct_n"] == 3  # every shipped one labelled
        (row,) = doc["cells"][key]
        assert row["n_model"] + row["n_fallback"] <= row["correct_n"]
        assert 0.0 <= row["goodput_rate"] <= row["correct_rate"] <= 1.0
