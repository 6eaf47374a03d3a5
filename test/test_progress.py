"""Progress bars: cycles done and misses so far; off when the output is not a terminal."""

from __future__ import annotations

import io
from dataclasses import replace
from pathlib import Path

import pytest

from robot_latency.planner.config import RunSettings
from robot_latency.planner.replay import planned_cycles, run_replay
from robot_latency.planner.resolve import resolve_run
from robot_latency.progress import CycleLogFollower, CycleProgress
from robot_latency.records import CycleRecord, JsonlSink, read_records
from robot_latency.streams import Command, CommandStream

MS = 1_000_000


def _record(cycle: int, *, met: bool) -> CycleRecord:
    return CycleRecord(run_id="r", cycle=cycle, scheduled_ns=cycle * 100 * MS,
                       deadline_ns=cycle * 100 * MS + 60 * MS, started_ns=cycle * 100 * MS,
                       published_ns=cycle * 100 * MS + (10 if met else 70) * MS,
                       plan_source="model" if met else "fallback",
                       fallback_reason=None if met else "deadline")


def test_bar_shows_cycles_and_misses_when_drawn() -> None:
    out = io.StringIO()
    with CycleProgress(3, desc="Q8_0", force=True, file=out) as bar:
        assert bar.drawing
        for i, met in enumerate((True, False, True)):
            bar.record(_record(i, met=met))
    assert (bar.cycles, bar.misses) == (3, 1)
    text = out.getvalue()
    assert "Q8_0" in text and "3/3" in text and "misses=1" in text
    assert "misses=2" not in text


def test_bar_is_off_when_the_output_is_not_a_terminal() -> None:
    out = io.StringIO()  # not a tty
    with CycleProgress(2, file=out) as bar:
        bar.record(_record(0, met=False))
        bar.add(1, 0)
        assert not bar.drawing
    assert out.getvalue() == ""
    assert (bar.cycles, bar.misses) == (2, 1)  # counted all the same


def test_follower_counts_complete_lines_of_a_growing_cycle_log(tmp_path: Path) -> None:
    path = tmp_path / "cycles.jsonl"
    follower = CycleLogFollower(path)
    assert follower.poll() == (0, 0)  # not written yet
    sink = JsonlSink(path)
    sink.write(_record(0, met=True))
    sink.write(_record(1, met=False))
    assert follower.poll() == (2, 1)
    assert follower.poll() == (0, 0)  # nothing new
    with path.open("a") as fh:  # a line still being written
        fh.write(_record(2, met=False).to_json()[:20])
    assert follower.poll() == (0, 0)
    with path.open("a") as fh:
        fh.write(_record(2, met=False).to_json()[20:] + "\n")
    assert follower.poll() == (1, 1)
    sink.close()


def test_planned_cycles_is_what_a_replay_runs(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    stream = CommandStream(name="test", source="test", topic=None, commands=[
        Command(t_ns=t * MS, text="stop", command_id=f"c{i}") for i, t in enumerate((0, 150))])
    planner = RunSettings(period_ms=100, deadline_ms=60)
    assert planned_cycles(planner, stream, asap=True) == 2
    assert planned_cycles(RunSettings(period_ms=100, deadline_ms=60, mode="event"),
                          stream) == 2
    assert planned_cycles(planner, stream) == 3  # ticks at 0 and 100 ms, one after
    assert planned_cycles(planner, stream, speed=0.5) == 5  # 150 ms plays as 300 ms
    cfg, _ = resolve_run(replace(planner, log_dir=tmp_path / "run", engine="sim",
                                 runner="inline", engine_options={"device": "orin-agx-64gb"}))
    summary = run_replay(cfg, stream, progress=True)
    assert summary["cycles"] == len(read_records(tmp_path / "run" / "cycles.jsonl")) == 3
    assert "misses=" not in capsys.readouterr().err  # stderr is not a terminal here
