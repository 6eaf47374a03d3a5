"""Bring your own model: its quantization ladder, then a sweep over the levels on a stream."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from robot_latency.cli import main
from robot_latency.models.bundled import bundled_model_path
from robot_latency.streams import Command, write_jsonl


def test_ladder_of_a_users_gguf_then_a_sweep_against_its_highest_level(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("ROBOT_LATENCY_CACHE_DIR", str(tmp_path / "cache"))
    own = tmp_path / "my-planner.gguf"  # an F32 GGUF of the user's (the planner, copied)
    shutil.copy(bundled_model_path(), own)
    assert main(["models", "ladder", str(own), "--quants", "Q8_0,Q4_0"]) == 0
    out = capsys.readouterr().out
    assert "my-planner: built Q8_0, Q4_0" in out
    manifest = json.loads((tmp_path / "cache" / "models" / "my-planner.ladder.json").read_text())
    assert set(manifest["levels"]) == {"Q8_0", "Q4_0"}
    assert main(["models", "ladder", str(own), "--quants", "Q8_0,Q4_0"]) == 0
    assert "built nothing (all current)" in capsys.readouterr().out

    stream = write_jsonl(tmp_path / "s.jsonl", [
        Command(i * 100_000_000, t, f"c{i}") for i, t in
        enumerate(["Stop!", "Pick up the red cup.", "go to the kitchen slowly"])])
    assert main(["sweep", "--stream", str(stream), "--model", str(own), "--quants", "Q4_0,Q8_0",
                 "--mode", "event", "--asap", "--deadline-ms", "5000", "--period-ms", "5000",
                 "--out", str(tmp_path / "sweep")]) == 0
    rows = {r["label"]: r for r in json.loads((tmp_path / "sweep" / "comparison.json")
                                              .read_text())["rows"]}
    assert set(rows) == {"Q4_0", "Q8_0"}
    # Plans are compared against the highest-precision level, whatever order was asked for.
    assert rows["Q4_0"]["reference"] == "Q8_0" and rows["Q8_0"]["agreement"] is None
    assert rows["Q4_0"]["agreement_n"] == 3 and rows["Q4_0"]["agreement"] is not None


def test_ladder_refuses_a_quantized_source_and_a_missing_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("ROBOT_LATENCY_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["models", "ladder", str(tmp_path / "nope.gguf")]) == 2
    assert "nope.gguf: no such file" in capsys.readouterr().err
    own = tmp_path / "p.gguf"
    shutil.copy(bundled_model_path(), own)
    assert main(["models", "ladder", str(own), "--quants", "Q4_0"]) == 0
    q4 = tmp_path / "cache" / "models" / "p.Q4_0.gguf"
    capsys.readouterr()
    assert main(["models", "ladder", str(q4), "--quants", "Q8_0"]) == 2
    err = capsys.readouterr().err
    assert "is Q4_0; build the levels from an F32, F16 or BF16 GGUF" in err
    assert len(err.strip().splitlines()) == 1
