"""``make demo`` twice keeps both runs: the demo command moves a previous ``--out`` aside to
``OUT.<its time>`` instead of deleting it (the Makefile no longer runs ``rm -rf``)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from robot_latency.cli.common import UsageError
from robot_latency.cli.demo import move_aside

ROOT = Path(__file__).resolve().parents[2]


def _previous_run(out: Path, when: float) -> None:
    (out / "Q8_0").mkdir(parents=True)
    (out / "Q8_0" / "cycles.jsonl").write_text('{"cycle": 0}\n')
    (out / "report.md").write_text("# Latency report\n")
    os.utime(out, (when, when))


def test_a_previous_run_is_moved_aside_with_its_time(tmp_path: Path) -> None:
    out = tmp_path / "runs" / "demo"
    when = time.mktime((2026, 12, 1, 21, 33, 0, 0, 0, -1))  # local time, as the name is
    _previous_run(out, when)
    kept = move_aside(out)
    assert kept == tmp_path / "runs" / "demo.20261201T2133"
    assert not out.exists()
    assert (kept / "Q8_0" / "cycles.jsonl").read_text() == '{"cycle": 0}\n'
    assert (kept / "report.md").exists()
    # a second run of the same minute gets a name of its own; nothing is overwritten
    _previous_run(out, when)
    again = move_aside(out)
    assert again == tmp_path / "runs" / "demo.20261201T2133-1"
    assert kept.is_dir() and again.is_dir() and not out.exists()


def test_nothing_to_move(tmp_path: Path) -> None:
    assert move_aside(tmp_path / "absent") is None
    empty = tmp_path / "empty"
    empty.mkdir()
    assert move_aside(empty) is None and empty.is_dir()
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(UsageError, match="afile: exists and is not a directory"):
        move_aside(afile)
    assert afile.read_text() == "x"


def test_the_makefile_no_longer_deletes_the_previous_demo() -> None:
    text = (ROOT / "Makefile").read_text()
    recipe = text.split("\ndemo: ", 1)[1].split("\n\n", 1)[0]
    assert "rm " not in recipe and "robot-latency demo --out runs/demo" in recipe


def test_an_overloaded_demo_says_so_in_its_report(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from robot_latency.cli.demo import note_host_load
    from robot_latency.hostcheck.load import judge
    from robot_latency.records import CycleRecord, JsonlSink
    from robot_latency.stats import summarize, write_summary

    out = tmp_path / "demo"
    run = out / "Q8_0"
    run.mkdir(parents=True)
    ms = 1_000_000
    records = [CycleRecord(run_id="r", cycle=i, scheduled_ns=i * 500 * ms,
                           deadline_ns=i * 500 * ms + 400 * ms, started_ns=i * 500 * ms,
                           published_ns=i * 500 * ms + 399 * ms, plan_source="fallback",
                           fallback_reason="deadline") for i in range(4)]
    with JsonlSink(run / "cycles.jsonl") as sink:
        for r in records:
            sink.write(r)
    write_summary(summarize(records), run / "summary.json")
    (run / "manifest.json").write_text(json.dumps({"label": "Q8_0",
                                                   "config": {"deadline_ms": 400}}))
    (out / "demo.json").write_text(json.dumps({"runs": [str(run)]}))
    quiet = judge(wall_s=60, cores=2, load_avg_1m=1.0, steal_share=0.0, others_cpu_share=0.0,
                  own_cpu_share=0.9)
    note_host_load(quiet, out, out / "report" / "report.md")
    assert json.loads((out / "host_load.json").read_text())["overloaded"] is False
    assert not (out / "report").exists() and "WARNING" not in capsys.readouterr().out
    busy = judge(wall_s=60, cores=2, load_avg_1m=7.9, steal_share=0.0, others_cpu_share=0.6,
                 own_cpu_share=0.4)
    note_host_load(busy, out, out / "report" / "report.md")
    assert f"WARNING: {busy.warning}" in capsys.readouterr().out
    text = (out / "report" / "report.md").read_text()
    assert "> **Host overloaded** (Q8_0): host overloaded during the run: load average 7.9" \
        in text.split("## Comparison")[0]
