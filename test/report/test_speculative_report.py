"""Speculative decoding per run: the shipped planner with and without its draft, real llama.cpp."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from robot_latency.cli import main
from robot_latency.floor.predict import specdec_speedup
from robot_latency.models.bundled import bundled_model_path
from robot_latency.records import read_records
from robot_latency.report.compare import compare_runs
from robot_latency.streams import Command, write_jsonl

TEXTS = ["pick up the red cup and put it on the tray", "go to the kitchen slowly",
         "bring me the blue bottle", "open the door", "stop", "turn left and go to the door"]


def _run(tmp_path: Path, name: str, *extra: str) -> Path:
    stream = tmp_path / "stream.jsonl"
    if not stream.exists():
        write_jsonl(stream, [Command(t_ns=i * 10**8, text=t, command_id=f"c{i}")
                             for i, t in enumerate(TEXTS * 2)])
    out = tmp_path / name
    rc = main(["run", "--stream", str(stream), "--asap", "--mode", "event",
               "--deadline-ms", "5000", "--period-ms", "5000", "--engine-opt", "n_threads=1",
               "--runner", "inline", "--out", str(out), *extra])
    assert rc == 0
    return out


def test_a_draft_run_reports_alpha_c_and_its_speedup_against_the_plain_run(
        tmp_path: Path) -> None:
    draft = bundled_model_path().with_name("planner-draft.gguf")
    plain = _run(tmp_path, "plain")
    spec = _run(tmp_path, "spec", "--draft", str(draft), "--draft-k", "3")
    summary = json.loads((spec / "summary.json").read_text())["speculative"]
    assert json.loads((plain / "summary.json").read_text())["speculative"] is None
    # The trained draft is accepted; the counts add up.
    assert summary["k"] == 3 and summary["rounds"] > 0
    assert 0 < summary["accepted"] <= summary["drafted"] <= 3 * summary["rounds"]
    assert summary["alpha"] == pytest.approx(summary["accepted"] / summary["drafted"])
    assert summary["alpha"] > 0.2  # short plans: the last draft of a plan often misses
    assert summary["cost_ratio"] > 0
    # the formula from the run's own alpha and c (for a 3.3M target the draft is not cheap)
    assert summary["predicted_speedup"] == pytest.approx(
        specdec_speedup(summary["alpha"], 3, summary["cost_ratio"]))
    rows = compare_runs([plain, spec])
    ref, row = rows
    assert ref.spec_alpha is None and ref.tpot_speedup == pytest.approx(1.0)
    assert row.spec_alpha == pytest.approx(summary["alpha"])
    assert row.tpot_speedup == pytest.approx(ref.tpot_p50_ms / row.tpot_p50_ms)
    assert "+draft planner-draft.gguf" in row.label
    # Lossless: every command got the same plan with the draft as without it.
    assert row.agreement == 1.0 and row.agreement_n == len(read_records(plain / "cycles.jsonl"))


def test_draft_is_refused_for_an_engine_without_one(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    stream = write_jsonl(tmp_path / "s.jsonl", [Command(t_ns=0, text="stop", command_id="c0")])
    rc = main(["run", "--stream", str(stream), "--engine", "sim", "--draft",
               str(bundled_model_path()), "--out", str(tmp_path / "run")])
    assert rc != 0
    assert "--draft: only the llamacpp engine takes a draft model, not 'sim'" in \
        capsys.readouterr().err
    assert not (tmp_path / "run" / "cycles.jsonl").exists()
