"""The report's first section and comparison.json from the loop simulated on the target, and one
code path: ``predict --stream``, the report and the records agree on the same inputs."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from robot_latency.cli import main
from robot_latency.clock import ScriptedClock
from robot_latency.planner.config import RunSettings
from robot_latency.planner.lifecycle import PlannerRun
from robot_latency.planner.margin import PUBLISH_START_MS
from robot_latency.planner.replay import replay
from robot_latency.planner.resolve import resolve_run
from robot_latency.planner.target_inputs import TARGET_FILE, untimed_inputs, write_target_inputs
from robot_latency.planner.target_sim import DEFAULT_TARGET_TRANSPORT_MARGIN_MS
from robot_latency.records import read_records
from robot_latency.report.markdown import write_report
from robot_latency.report.rundir import load_run
from robot_latency.report.target import simulated_answers
from robot_latency.streams import SHIPPED_DIR, read_stream, write_jsonl

DEADLINE_MS = 400.0


@pytest.fixture()
def stream_file(tmp_path: Path) -> Path:
    full = read_stream(SHIPPED_DIR / "steady_operator")
    # 2 s apart: no command waits for another on the target, so e2e is the service time
    spaced = [replace(c, t_ns=i * 2 * 10**9) for i, c in enumerate(full.commands[:12])]
    return write_jsonl(tmp_path / "stream.jsonl", spaced)


def _run(tmp_path: Path, stream_file: Path, quant: str) -> Path:
    """A timed replay, sim engine on a fast host (every plan completes), and its target.json."""
    stream = read_stream(stream_file)
    settings = RunSettings(log_dir=tmp_path / quant, engine="sim", runner="inline",
                           engine_options={"device": "orin-agx-64gb", "jitter_sigma": 0.0},
                           model="qwen2.5-0.5b", quant=quant, target_device="orin-nano-8gb",
                           mode="event", deadline_ms=DEADLINE_MS, label=quant)
    cfg, _ = resolve_run(settings)
    with PlannerRun(cfg, publish=lambda e: None, clock=ScriptedClock(start_ns=10**9)) as run:
        replay(run.loop, stream)
        run.close()
    write_target_inputs(untimed_inputs(settings, stream, cache_dir=tmp_path / "cache"),
                        tmp_path / quant)
    return tmp_path / quant


def test_predict_the_report_and_the_records_agree(tmp_path: Path, stream_file: Path,
                                                  capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROBOT_LATENCY_CACHE_DIR", str(tmp_path / "cli-cache"))
    run_dir = _run(tmp_path, stream_file, "Q4_0")
    report, = simulated_answers([load_run(run_dir)], [run_dir])
    assert main(["predict", "--stream", str(stream_file), "--engine", "sim", "--model",
                 "qwen2.5-0.5b", "--quants", "Q4_0", "--device", "orin-nano-8gb",
                 "--deadline-ms", f"{DEADLINE_MS:g}", "--mode", "event", "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)["levels"][0]
    assert cli["e2e_ms"] == pytest.approx(list(report.e2e_ms), abs=0.1)
    assert cli["miss_rate"] == report.miss_rate
    # the records: each complete cycle's own target prediction, same tokens, same corrections
    # (commands arrive far apart: no queueing on the target, e2e is the service time)
    recs = {r.command_id: r for r in read_records(run_dir / "cycles.jsonl")}
    own = [recs[c.command_id].target_e2e_pred_ms for c in read_stream(stream_file).commands]
    assert own == pytest.approx(list(report.e2e_ms), abs=0.1)


def test_report_opens_with_the_simulated_answer(tmp_path: Path, stream_file: Path) -> None:
    dirs = [_run(tmp_path, stream_file, q) for q in ("Q8_0", "Q4_0")]
    path = write_report(dirs, tmp_path / "report")
    text = path.read_text()
    first = text.split("## Comparison")[0]
    assert "## On orin-nano-8gb with llamacpp-cuda" in first
    assert "predicted receiver miss" in first and "model plans in time" in first
    assert "smallest deadline held at 5%" in first
    # llamacpp-cuda has published prefill rows and a leave-one-source-out validation
    assert "leave-one-source-out median error" in first
    assert "prefill calibrated" in first and "prefill uncalibrated" not in first
    assert "Deadline curve" in first
    assert (tmp_path / "report" / "target_deadline_curve.png").is_file()
    rows = json.loads((tmp_path / "report" / "comparison.json").read_text())["rows"]
    for row in rows:
        assert row["target_device"] == "orin-nano-8gb"
        lo, hi = row["target_pred_miss_interval"]
        assert lo <= row["target_pred_miss_rate"] <= hi
        assert 0 <= row["target_pred_model_in_time_rate"] <= 1
        assert row["target_pred_e2e_p50_ms"] > 0 and row["target_min_deadline_ms"] > 0
    by = {r["label"]: r for r in rows}
    assert by["Q8_0"]["target_pred_e2e_p50_ms"] > by["Q4_0"]["target_pred_e2e_p50_ms"]


def test_a_broken_target_file_leaves_the_report_whole(tmp_path: Path, stream_file: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    run_dir = _run(tmp_path, stream_file, "Q4_0")
    (run_dir / TARGET_FILE).write_text("{\"untimed\": 3}")
    text = write_report([run_dir], tmp_path / "report").read_text()
    assert f"{TARGET_FILE}: missing field 'stream'" in caplog.text
    assert "No untimed pass in these run directories" in text  # the per-record section
    rows = json.loads((tmp_path / "report" / "comparison.json").read_text())["rows"]
    assert rows[0]["target_pred_miss_rate"] is None


def test_the_margins_this_host_kept_never_enter(tmp_path: Path, stream_file: Path) -> None:
    """What the target keeps is the target's: the margin this host's run kept (its records'
    margin_ns, 52 ms on an overloaded host once) is not the target's; the stated default is,
    or one measured on the robot and passed in."""
    run_dir = _run(tmp_path, stream_file, "Q4_0")
    run = load_run(run_dir)
    wide = run._replace(records=[replace(r, margin_ns=52_000_000) for r in run.records])
    a, = simulated_answers([wide], [run_dir])
    assert a.margin_ms == pytest.approx(2.0 + DEFAULT_TARGET_TRANSPORT_MARGIN_MS)
    assert a.facts["transport_margin_source"].startswith("default: ")
    measured, = simulated_answers([wide], [run_dir], transport_margin_ms=3.0)
    assert measured.margin_ms == pytest.approx(5.0)
    assert measured.facts["transport_margin_source"] == "given (measured on the robot)"


def test_a_learned_publish_margin_counts_at_its_start(tmp_path: Path, stream_file: Path) -> None:
    """``run`` learns its publish margin (``publish_margin_ms`` -1): on the target it counts at
    the value a learned one starts from, not at what this host learned."""
    run_dir = _run(tmp_path, stream_file, "Q4_0")
    inputs = json.loads((run_dir / TARGET_FILE).read_text())
    inputs["loop"]["publish_margin_ms"] = -1.0
    (run_dir / TARGET_FILE).write_text(json.dumps(inputs))
    run = load_run(run_dir)
    kept = run._replace(records=[replace(r, margin_ns=51_900_000) for r in run.records])
    a, = simulated_answers([kept], [run_dir], transport_margin_ms=0.0)
    assert a.margin_ms == pytest.approx(PUBLISH_START_MS)


def test_the_report_and_predict_agree_on_the_smallest_deadline(
        tmp_path: Path, stream_file: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The same inputs (a ``run`` with its learned publish margin, its untimed pass): the
    report's smallest deadline held and ``predict``'s agree to 1 ms, at the default transport
    margin and at one passed in."""
    monkeypatch.setenv("ROBOT_LATENCY_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "run"
    common = ["--stream", str(stream_file), "--engine", "sim", "--model", "qwen2.5-0.5b",
              "--device", "orin-nano-8gb", "--deadline-ms", f"{DEADLINE_MS:g}",
              "--mode", "event"]
    assert main(["run", *common, "--quant", "Q8_0", "--runner", "inline", "--asap",
                 "--target-answer", "--out", str(out)]) == 0
    capsys.readouterr()
    for margin in ([], ["--target-transport-margin-ms", "20"]):
        report_dir = tmp_path / f"report{len(margin)}"
        assert main(["report", str(out), "--out", str(report_dir), *margin]) == 0
        capsys.readouterr()
        row, = json.loads((report_dir / "comparison.json").read_text())["rows"]
        assert main(["predict", *common, "--quants", "Q8_0", "--publish-margin-ms", "-1",
                     *margin, "--json"]) == 0
        cli, = json.loads(capsys.readouterr().out)["levels"]
        assert row["target_min_deadline_ms"] is not None
        assert abs(cli["min_deadline_ms"] - row["target_min_deadline_ms"]) <= 1.0
        assert cli["margin_ms"] == pytest.approx(
            PUBLISH_START_MS + (20.0 if margin else DEFAULT_TARGET_TRANSPORT_MARGIN_MS))


def test_run_with_target_answer_writes_and_prints_the_first_section(
        tmp_path: Path, stream_file: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROBOT_LATENCY_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "run"
    common = ["--stream", str(stream_file), "--engine", "sim", "--model", "qwen2.5-0.5b",
              "--device", "orin-nano-8gb", "--deadline-ms", f"{DEADLINE_MS:g}",
              "--mode", "event"]
    labels = str(SHIPPED_DIR / "steady_operator" / "labels.jsonl")
    assert main(["run", *common, "--quant", "Q4_0", "--runner", "inline", "--asap",
                 "--target-answer", "--labels", labels, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert (out / TARGET_FILE).is_file()
    assert "On orin-nano-8gb, the loop simulated" in printed
    # the recommendation rests on the target.json written before it
    assert "**Put on the robot:**" in printed and "no untimed pass was run" not in printed
    assert "each plan judged as the loop simulated on the target gives it" in printed
    assert "predicted receiver miss" in printed
    # the report's first section comes from the file the run wrote
    text = write_report([out], tmp_path / "report").read_text()
    assert "## On orin-nano-8gb with llamacpp-cuda" in text.split("## Comparison")[0]
    report, = simulated_answers([load_run(out)], [out])
    assert report.commands == len(read_stream(stream_file).commands)
    # a sweep writes one per point
    sweep = tmp_path / "sweep"
    assert main(["sweep", *common, "--quants", "Q8_0", "Q4_0", "--runner", "inline", "--asap",
                 "--target-answer", "--out", str(sweep)]) == 0
    printed = capsys.readouterr().out
    assert "On the target, the loop simulated" in printed
    assert "transport 8.5 ms (default: " in printed
    assert "| Q8_0 |" in printed.split("On the target, the loop simulated")[1]
    rows = json.loads((sweep / "comparison.json").read_text())["rows"]
    assert len(rows) == 2
    assert all(r["target_pred_miss_rate"] is not None for r in rows)
    # a margin measured on the robot, passed in, is the one the answer keeps
    again = tmp_path / "run2"
    assert main(["run", *common, "--quant", "Q4_0", "--runner", "inline", "--asap",
                 "--target-answer", "--target-transport-margin-ms", "3", "--out",
                 str(again)]) == 0
    assert "transport 3 ms (given (measured on the robot))" in capsys.readouterr().out


def test_the_report_opens_with_what_the_pass_did_not_find(tmp_path: Path,
                                                          stream_file: Path) -> None:
    """An untimed pass with outputs cut at max_tokens and no valid plan: the report's section
    says so in its first line, with the counts, then the token budget per level."""
    run_dir = _run(tmp_path, stream_file, "Q4_0")
    inputs = json.loads((run_dir / TARGET_FILE).read_text())
    for c in inputs["untimed"]["commands"][:3]:
        c.update(stop_reason="max_tokens", plan_valid=False, plan=None)
    (run_dir / TARGET_FILE).write_text(json.dumps(inputs))
    text = write_report([run_dir], tmp_path / "report").read_text()
    section = text.split("## On orin-nano-8gb with llamacpp-cuda")[1].split("## Comparison")[0]
    first = section.strip().splitlines()[0]
    max_tokens = inputs["untimed"]["max_tokens"]
    assert first == (f"> **WARNING: Q4_0: the untimed pass had no valid plan for 3 of 12 "
                     f"commands and 3 outputs cut at max_tokens ({max_tokens}) (a command with "
                     "no valid plan gets the fallback on any device; a cut output is timed at "
                     "max_tokens: raise --max-tokens or the profile's output.max_tokens).**")
    assert "Token budget on the target" in section and "output tokens fit after a p50" in section
    assert "It holds for the output format of profile bundled-actions" in section
