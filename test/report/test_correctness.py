"""Correctness and goodput per level: labelled runs end to end, the fallback judged, the rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from robot_latency.clock import ScriptedClock
from robot_latency.planner.config import RunSettings
from robot_latency.planner.lifecycle import PlannerRun
from robot_latency.planner.replay import replay
from robot_latency.planner.resolve import resolve_run
from robot_latency.profiles.actions import plan_json_schema
from robot_latency.profiles.labels import stream_labels
from robot_latency.records import CycleRecord, read_records
from robot_latency.report.correctness import (
    correctness_markdown,
    correctness_rows,
    level_correctness,
    recommend,
)
from robot_latency.report.rundir import RunData, load_run
from robot_latency.streams import read_stream

MS = 1_000_000
ISSUE = "place the red apple in the corridor and after that bring a red towel to the table"
LINES = [
    {"t_ns": 0, "text": "go to the kitchen",
     "expected": {"steps": [{"action": "goto", "target": "kitchen"}]}},
    {"t_ns": 300 * MS, "text": ISSUE, "expected": {"steps": [
        {"action": "pick", "target": "apple", "color": "red"},
        {"action": "place", "target": "hallway"},
        {"action": "pick", "target": "towel", "color": "red"},
        {"action": "place", "target": "table"}]}},
    {"t_ns": 600 * MS, "text": "what's your battery level", "expected": "refuse"},
    {"t_ns": 900 * MS, "text": "stop"},  # unlabelled
    {"t_ns": 1200 * MS, "text": "stop", "expected": {"steps": [{"action": "stop"}]}},
]


def _run(tmp_path: Path, name: str, deadline_ms: float) -> Path:
    path = tmp_path / "labelled.jsonl"
    if not path.exists():
        path.write_text("".join(json.dumps(x) + "\n" for x in LINES))
    stream = read_stream(path)
    cfg, _ = resolve_run(RunSettings(
        period_ms=300, deadline_ms=deadline_ms, log_dir=tmp_path / name, engine="sim",
        runner="inline", engine_options={"device": "orin-agx-64gb", "seed": 1},
        model="qwen2.5-0.5b", quant="Q4_K_M", target_device="orin-nano-8gb", label=name,
        extra={"replay": {"mode": "recorded", "speed": 1.0}}))
    labels = stream_labels(stream.commands, schema=plan_json_schema(), source=str(path))
    with PlannerRun(cfg, publish=lambda e: None, clock=ScriptedClock(start_ns=5 * 10**9),
                    labels=labels) as run:
        replay(run.loop, stream, tail_cycles=0)
        run.close()
    return tmp_path / name


def test_a_labelled_run_judges_every_plan_and_leaves_out_the_unlabelled(tmp_path: Path) -> None:
    run_dir = _run(tmp_path, "roomy", 200.0)
    records = read_records(run_dir / "cycles.jsonl")
    by_cmd = {r.command_id: r for r in reversed(records)}  # first cycle per command
    assert by_cmd["labelled:3"].plan_correct is None and by_cmd["labelled:3"].label_kind is None
    assert by_cmd["labelled:0"].plan_correct is True and by_cmd["labelled:0"].label_kind == "goto"
    assert by_cmd["labelled:2"].label_kind == "refuse"
    row = level_correctness(load_run(run_dir))
    assert row.correct_n == 4  # five commands, one unlabelled
    assert row.on_time_at == "publish"
    assert row.refuse_n == 1 and row.refuse_rate == 1.0  # the sim plays the refusing rule
    assert row.by_class["stop"]["n"] == 1 and row.by_class["stop"]["correct_rate"] == 1.0
    lo, hi = row.correct_ci95
    assert lo <= row.correct_rate <= hi and 0.0 <= row.goodput_rate <= row.correct_rate


def test_fallback_plans_are_judged_and_both_policies_are_scored(tmp_path: Path) -> None:
    # A deadline no model plan meets: every cycle is the fallback's, judged like the model's.
    run_dir = _run(tmp_path, "tight", 3.0)
    records = read_records(run_dir / "cycles.jsonl")
    firsts = {r.command_id: r for r in reversed(records)}
    issue = firsts["labelled:1"]
    assert issue.plan_source == "fallback" and issue.fallback_policy == "rule"
    assert issue.plan_correct is False  # the keyword planner dropped the apple and the corridor
    assert issue.fallback_correct == {"rule": False, "hold": False}
    refuse = firsts["labelled:2"]
    assert refuse.plan_source == "fallback" and refuse.plan_correct is True
    assert refuse.fallback_correct == {"rule": True, "hold": False}
    row = level_correctness(load_run(run_dir))
    assert row.n_fallback == row.correct_n == 4 and row.n_model == 0
    assert row.correct_rate_fallback == row.correct_rate
    assert row.fallback_goodput_rule is not None and row.fallback_goodput_hold is not None
    assert row.fallback_goodput_rule >= row.fallback_goodput_hold
    assert row.better_fallback == "rule"


def _rec(cycle: int, cid: str, *, correct: bool | None, kind: str | None,
         met_pred: bool | None = True, late: bool = False) -> CycleRecord:
    return CycleRecord(run_id="r", cycle=cycle, scheduled_ns=0, deadline_ns=10,
                       published_ns=20 if late else 5, command_id=cid, plan_source="model",
                       plan={"steps": []}, plan_correct=correct, label_kind=kind,
                       target_deadline_met_pred=met_pred)


def _level(label: str, nbytes: int, correct: list[bool], met: list[bool]) -> RunData:
    recs = [_rec(i, f"c{i}", correct=c, kind="goto", met_pred=m)
            for i, (c, m) in enumerate(zip(correct, met, strict=True))]
    return RunData(label, recs, {"model": {"quant": label, "weight_bytes_total": nbytes}})


def test_the_level_named_is_the_highest_predicted_target_goodput_ties_to_smaller() -> None:
    q8 = level_correctness(_level("Q8_0", 800, [True] * 4, [True, True, False, False]))
    q4 = level_correctness(_level("Q4_0", 400, [True, True, True, False], [True] * 4))
    q4k = level_correctness(_level("Q4_K_M", 500, [True, True, True, False], [True] * 4))
    assert q8.target_goodput_pred == pytest.approx(0.5)
    assert q4.target_goodput_pred == pytest.approx(0.75) == q4k.target_goodput_pred
    best, why = recommend([q8, q4k, q4])
    assert best is q4 and "Q4_0" in why and "smaller file" in why
    text = correctness_markdown([q8, q4k, q4])
    assert "**Put on the robot:** Q4_0" in text and "[" in text  # intervals printed


def test_late_correct_plans_are_not_goodput_and_no_labels_names_nothing() -> None:
    recs = [_rec(0, "a", correct=True, kind="pick", late=True),
            _rec(1, "b", correct=True, kind="pick")]
    row = level_correctness(RunData("x", recs, {}))
    assert row.correct_rate == 1.0 and row.goodput_rate == 0.5
    empty = level_correctness(RunData("y", [_rec(0, "a", correct=None, kind=None)], {}))
    assert empty.correct_n == 0 and empty.correct_rate is None
    assert recommend([empty])[0] is None


def test_rows_from_directories(tmp_path: Path) -> None:
    rows = correctness_rows([_run(tmp_path, "roomy", 200.0)])
    assert rows[0].label == "roomy" and rows[0].correct_n == 4
    # the size ties are broken by, read from the manifest the run wrote (it was always None)
    assert rows[0].model_bytes and rows[0].model_bytes > 100 * 2**20


def _timed_with_target(tmp_path: Path, name: str, host_device: str, efficiency: float) -> Path:
    """A replay of the labelled stream on a host of the given speed, with its target.json."""
    from robot_latency.planner.target_inputs import untimed_inputs, write_target_inputs

    path = tmp_path / "labelled.jsonl"
    if not path.exists():
        path.write_text("".join(json.dumps(x) + "\n" for x in LINES))
    stream = read_stream(path)
    settings = RunSettings(
        period_ms=300, deadline_ms=200.0, mode="event", log_dir=tmp_path / name,
        engine="sim", runner="inline",
        engine_options={"device": host_device, "seed": 1, "efficiency": efficiency},
        model="qwen2.5-0.5b", quant="Q4_K_M", target_device="orin-nano-8gb", label=name)
    cfg, _ = resolve_run(settings)
    labels = stream_labels(stream.commands, schema=plan_json_schema(), source=str(path))
    with PlannerRun(cfg, publish=lambda e: None, clock=ScriptedClock(start_ns=5 * 10**9),
                    labels=labels) as run:
        replay(run.loop, stream, tail_cycles=0)
        run.close()
    write_target_inputs(untimed_inputs(settings, stream, cache_dir=tmp_path / "cache"),
                        tmp_path / name)
    return tmp_path / name


def test_the_predicted_target_goodput_does_not_depend_on_this_hosts_speed(
        tmp_path: Path) -> None:
    fast = _timed_with_target(tmp_path, "fast", "orin-agx-64gb", 0.5)
    slow = _timed_with_target(tmp_path, "slow", "orin-nano-4gb", 0.001)
    rows = correctness_rows([fast, slow])
    by = {r.label: r for r in rows}
    # the hosts differ: the slow one's every plan is the fallback's
    assert by["slow"].n_model == 0 and by["fast"].n_model > 0
    # ... the target's answer does not: the same untimed pass, the same simulated loop
    for r in rows:
        assert r.target_basis == "simulated" and r.target_goodput_pred is not None
    assert by["fast"].target_goodput_pred == by["slow"].target_goodput_pred
    assert by["fast"].target_in_time_rate == by["slow"].target_in_time_rate
    best, why = recommend(rows)
    assert best is not None and "simulated on the target" in why
    # this host's plans do not enter it: wrong ones here change the measured, not the target's
    from dataclasses import replace

    from robot_latency.planner.target_inputs import read_target_inputs
    from robot_latency.report.target import simulated_answers

    run = load_run(slow)
    wrong = run._replace(records=[replace(r, plan_correct=False) if r.plan_correct else r
                                  for r in run.records])
    answer, = simulated_answers([wrong], [slow])
    target = (answer, read_target_inputs(slow))
    row = level_correctness(wrong, target=target)
    assert row.correct_rate < by["slow"].correct_rate
    assert row.target_goodput_pred == by["slow"].target_goodput_pred
    assert level_correctness(wrong).target_basis != "simulated"


def test_a_level_that_planned_with_frames_is_named_with_its_resolution() -> None:
    """sweep --frame-scales: the level put on the robot comes with the frames it saw."""
    def seeing(label: str, quant: str, scale: float, tokens: int, correct: list[bool]) -> RunData:
        recs = [_rec(i, f"c{i}", correct=c, kind="goto") for i, c in enumerate(correct)]
        for r in recs:
            r.image = {"tokens": tokens, "chunks": 1, "reused": False}
        return RunData(label, recs, {"model": {"quant": quant, "weight_bytes_total": 400},
                                     "config": {"frame_scale": scale}})
    full = level_correctness(seeing("Q4_0 x1", "Q4_0", 1.0, 128, [True, True, False]))
    half = level_correctness(seeing("Q4_0 x0.5", "Q4_0", 0.5, 64, [True, True, True]))
    assert (full.frames, half.frames) == ("frames at 1x, 128 image tokens a frame",
                                          "frames at 0.5x, 64 image tokens a frame")
    best, why = recommend([full, half])
    assert best is half
    assert why.startswith("Q4_0 x0.5 (level Q4_0, frames at 0.5x, 64 image tokens a frame)")
    text_only = level_correctness(_level("Q8_0", 800, [True], [True]))
    assert text_only.frames is None and recommend([text_only])[1].startswith("Q8_0: ")
