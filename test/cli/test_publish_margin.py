"""``robot-latency run`` learns its publish margin from the loop's own lateness by default and
records it in the manifest; a number fixes it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from robot_latency.cli import main
from robot_latency.planner.margin import PUBLISH_FLOOR_MS, PUBLISH_START_MS
from robot_latency.records import read_records
from robot_latency.streams import Command, write_jsonl

MS = 1_000_000


def _run(tmp_path: Path, *extra: str) -> tuple[dict, list]:
    stream = write_jsonl(tmp_path / "stream.jsonl",
                         [Command(t_ns=t * MS, text="pick up the red cup", command_id=f"s:{t}")
                          for t in (0, 500)])
    out = tmp_path / "run"
    # an engine that never finishes in 20 ms: every cycle waits for it until its give-up time
    assert main(["run", "--stream", str(stream), "--engine", "sim", "--device", "orin-nano-4gb",
                 "--engine-opt", "efficiency=0.01", "--deadline-ms", "20", "--period-ms", "30",
                 "--out", str(out), "--json", *extra]) == 0
    return json.loads((out / "manifest.json").read_text()), read_records(out / "cycles.jsonl")


def test_the_default_learns_from_the_loops_lateness(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    manifest, records = _run(tmp_path)  # 18 ticks
    capsys.readouterr()
    margin = manifest["publish_margin"]
    assert margin["publish_margin"] == "learned" and manifest["config"]["publish_margin_ms"] < 0
    ran = [r for r in records if not r.skipped]
    # the cycles that waited for the model until their give-up time (not one that started
    # after it, on a loaded machine: that is queueing) are the samples
    waited = [r for r in ran if r.started_ns is not None
              and r.started_ns < r.deadline_ns - r.margin_ns]
    assert 0 < margin["wake_samples"] == len(waited)
    assert ran[0].margin_ns == PUBLISH_START_MS * MS  # before the loop has seen itself
    # every later cycle keeps at least the largest lateness seen before it (or the cap)
    seen = 0
    for rec in ran:
        if rec is not ran[0]:
            assert rec.margin_ns >= min(seen, margin["cap_ms"] * MS)
            assert rec.margin_ns >= PUBLISH_FLOOR_MS * MS
        assert rec.published_ns is not None
        if rec in waited:
            seen = max(seen, rec.published_ns - (rec.deadline_ns - rec.margin_ns))
    assert margin["wake_late_max_ms"] * MS == pytest.approx(seen, abs=1)


def test_a_number_fixes_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    manifest, records = _run(tmp_path, "--publish-margin-ms", "3")
    capsys.readouterr()
    assert manifest["publish_margin"]["publish_margin"] == "fixed"
    assert {r.margin_ns for r in records if not r.skipped} == {3 * MS}
