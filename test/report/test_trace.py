"""The trace export and the phase layout it shares with the timeline plot, on real runs."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from robot_latency.cli import main
from robot_latency.records import CycleRecord, read_records
from robot_latency.report.phases import cycle_spans, top_level_phases
from robot_latency.report.plots import plot_phase_timeline
from robot_latency.report.trace import (
    ENGINE_TID,
    LOOP_TID,
    TraceError,
    build_trace,
    write_trace,
)
from robot_latency.streams import Command, write_jsonl

MS = 1_000_000
TEXTS = ["pick up the red cup and put it on the tray", "go to the kitchen slowly",
         "bring me the blue bottle", "open the door", "", "turn left and go to the door"]


@pytest.fixture(scope="module")
def llama_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real run: the shipped planner on llama.cpp with its grammar, one command a fallback.

    The deadline is tight enough that some cycles miss and fall back (a mix of both kinds).
    """
    tmp = tmp_path_factory.mktemp("trace")
    stream = tmp / "stream.jsonl"
    write_jsonl(stream, [Command(t_ns=i * 10**8, text=t, command_id=f"c{i}")
                         for i, t in enumerate(TEXTS * 2)])
    out = tmp / "run"
    assert main(["run", "--stream", str(stream), "--asap", "--mode", "event",
                 "--deadline-ms", "5000", "--period-ms", "5000", "--engine-opt", "n_threads=1",
                 "--runner", "inline", "--label", "tiny", "--out", str(out)]) == 0
    return out


def _x(trace: dict[str, Any], tid: int) -> list[dict[str, Any]]:
    return [e for e in trace["traceEvents"] if e["ph"] == "X" and e.get("tid") == tid]


def _inside(child: dict[str, Any], parent: dict[str, Any], tol_us: float = 1e-3) -> bool:
    return (parent["ts"] - tol_us <= child["ts"]
            and child["ts"] + child["dur"] <= parent["ts"] + parent["dur"] + tol_us)


def test_trace_nests_phases_in_cycles_and_counts_match_the_records(llama_run: Path,
                                                                   tmp_path: Path) -> None:
    records = read_records(llama_run / "cycles.jsonl")
    path = write_trace([llama_run], tmp_path / "t.json")
    trace = json.loads(path.read_text())  # parses back as plain JSON
    events = trace["traceEvents"]
    names = {(e["name"], e.get("tid")): e["args"]["name"] for e in events if e["ph"] == "M"
             and e["name"] in ("process_name", "thread_name")}
    assert names[("process_name", None)] == "tiny"
    assert names[("thread_name", LOOP_TID)] == "planner loop"
    assert names[("thread_name", ENGINE_TID)] == "engine worker"
    loop = _x(trace, LOOP_TID)
    cycles = [e for e in loop if e["cat"] == "cycle"]
    assert [e["args"]["cycle"] for e in cycles] == [r.cycle for r in records]
    by_cycle = {e["args"]["cycle"]: e for e in cycles}
    phases = [e for e in loop if e["cat"] == "phase"]
    assert len(phases) == sum(len(r.phases_ns) for r in records)
    # the grammar really ran: sampling and grammar totals exist, nested in decode
    assert any("grammar" in r.phases_ns and "sample" in r.phases_ns for r in records)
    for rec in records:
        mine = [e for e in phases if e["args"]["cycle"] == rec.cycle]
        spans = {e["name"]: e for e in mine}
        for e in mine:
            assert _inside(e, by_cycle[rec.cycle]), (rec.cycle, e["name"])
            assert e["dur"] == pytest.approx(rec.phases_ns[e["name"]] / 1e3) or \
                e["name"] in ("sample", "grammar")  # a child is cut at its parent's end
        if "sample" in spans:
            assert _inside(spans["sample"], spans["decode"])
        if "grammar" in spans:
            assert _inside(spans["grammar"], spans.get("sample", spans.get("decode")))
        top = sorted((e for e in mine if e["name"] in top_level_phases(rec.phases_ns)),
                     key=lambda e: e["ts"])
        for a, b in itertools.pairwise(top):  # siblings never overlap
            assert a["ts"] + a["dur"] <= b["ts"] + 1e-3, (rec.cycle, a["name"], b["name"])
    instants = Counter(e["name"] for e in events if e["ph"] == "i")
    assert instants["deadline"] == len(records)
    assert instants["miss"] == sum(1 for r in records if not r.deadline_met)
    assert instants["fallback"] == sum(1 for r in records if r.plan_source == "fallback") >= 1
    assert instants["command"] == len({r.command_id for r in records if r.command_id})
    engine = [e for e in _x(trace, ENGINE_TID) if e["name"] == "generate"]
    assert len(engine) == sum(1 for r in records if "decode" in r.phases_ns
                              or "prefill" in r.phases_ns)
    counters = Counter(e["name"] for e in events if e["ph"] == "C")
    assert counters["rss_mb"] == sum(1 for r in records if r.rss_bytes is not None) > 0
    assert counters["host_steal_ms"] == sum(1 for r in records if r.host_steal_ns is not None)


def test_two_runs_are_two_processes(llama_run: Path) -> None:
    trace = build_trace([llama_run, llama_run])
    assert {e["pid"] for e in trace["traceEvents"]} == {1, 2}


def test_trace_of_a_run_without_records_is_a_one_line_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], llama_run: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(TraceError, match="no records"):
        write_trace([empty], tmp_path / "t.json")
    (empty / "cycles.jsonl").write_text("")
    with pytest.raises(TraceError, match="is empty"):
        write_trace([empty], tmp_path / "t.json")
    rc = main(["report", str(llama_run), str(empty), "--out", str(tmp_path / "rep"),
               "--trace", str(tmp_path / "t.json")])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "empty" in err


def test_report_trace_option_writes_the_file(llama_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    assert main(["report", str(llama_run), "--out", str(tmp_path / "rep"),
                 "--trace", str(out)]) == 0
    assert json.loads(out.read_text())["traceEvents"]


def _nested_record() -> CycleRecord:
    """A cycle whose sampling (grammar-dominated) ran inside its decode: sample == grammar."""
    sched, started = 0, 2 * MS
    tokens = [started + 40 * MS + k * 10 * MS for k in range(5)]
    return CycleRecord(run_id="r", cycle=0, scheduled_ns=sched, deadline_ns=200 * MS,
                       started_ns=started, published_ns=tokens[-1] + MS, token_ns=tokens,
                       command_id="c0", phases_ns={
                           "queue": 2 * MS, "tokenize": MS, "prefill": 39 * MS,
                           "decode": 40 * MS, "sample": 8 * MS, "grammar": 8 * MS,
                           "publish": MS // 10}, plan_source="model")


def test_nested_phases_lie_inside_their_parent_not_after_it() -> None:
    rec = _nested_record()
    spans = {s.name: s for s in cycle_spans(rec)}
    assert spans["decode"].end_ns == rec.token_ns[-1]
    assert spans["sample"].parent == "decode" and spans["grammar"].parent == "sample"
    assert spans["decode"].start_ns <= spans["sample"].start_ns
    assert spans["sample"].end_ns <= spans["decode"].end_ns
    assert spans["sample"].start_ns <= spans["grammar"].start_ns
    assert spans["grammar"].end_ns <= spans["sample"].end_ns
    # end to end, the top-level phases reach the publish; the nested ones add nothing
    assert max(s.end_ns for s in spans.values()) == rec.published_ns + MS // 10
    assert set(top_level_phases(rec.phases_ns)) == {"queue", "tokenize", "prefill", "decode",
                                                    "publish"}


def test_phase_timeline_draws_nested_phases_inside_decode(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rec = _nested_record()
    path = plot_phase_timeline([("nested", [rec], {"config": {"deadline_ms": 200}})],
                               tmp_path / "timeline.png")
    assert path is not None and path.read_bytes()[:4] == b"\x89PNG"
    # the bars as drawn: read them back from the figure the plot builds
    from matplotlib.figure import Figure

    drawn: list[Any] = []
    orig = Figure.savefig

    def capture(self: Figure, *args: Any, **kwargs: Any) -> None:
        drawn.extend(p for ax in self.axes for p in ax.patches)
        orig(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", capture)
    plot_phase_timeline([("nested", [rec], None)], tmp_path / "t2.png")
    right_ms = max(p.get_x() + p.get_width() for p in drawn)
    # laid end to end, sample and grammar would push the bars 16 ms past the publish
    assert right_ms == pytest.approx((rec.published_ns + MS // 10) / MS)


def test_a_cycle_that_gave_up_on_the_engine_shows_the_wait_on_the_engine_track() -> None:
    from robot_latency.report.trace import run_events

    rec = CycleRecord(run_id="r", cycle=3, scheduled_ns=0, deadline_ns=400 * MS,
                      started_ns=MS, published_ns=398 * MS, command_id="c3",
                      command_arrival_ns=0, phases_ns={"queue": MS, "fallback": MS // 10,
                                                       "publish": MS // 10},
                      plan_source="fallback", fallback_reason="deadline",
                      fallback_policy="rule")
    events = run_events([rec], pid=1, label="x", origin_ns=0)
    wait = [e for e in events if e["ph"] == "X" and e["name"] == "generate (no trace)"]
    assert len(wait) == 1 and wait[0]["tid"] == ENGINE_TID
    fallback = next(e for e in events if e["ph"] == "X" and e["name"] == "fallback")
    assert wait[0]["ts"] == 1000.0 and wait[0]["ts"] + wait[0]["dur"] == fallback["ts"]
    marks = [e["name"] for e in events if e["ph"] == "i"]
    assert marks.count("fallback") == 1 and marks.count("miss") == 0  # published in time


def test_a_cycle_given_up_with_its_partial_trace_shows_its_engine_phases() -> None:
    """A cycle given up at its deadline whose worker handed its partial trace over: the engine
    track shows what ran (prefill, decode so far), not a "no trace" wait."""
    from robot_latency.report.trace import run_events

    rec = CycleRecord(run_id="r", cycle=4, scheduled_ns=0, deadline_ns=400 * MS,
                      started_ns=MS, published_ns=398 * MS, command_id="c4",
                      command_arrival_ns=0, token_ns=[300 * MS, 340 * MS, 380 * MS],
                      phases_ns={"queue": MS, "tokenize": MS, "prefill": 297 * MS,
                                 "decode": 80 * MS, "fallback": MS // 10,
                                 "publish": MS // 10},
                      plan_source="fallback", fallback_reason="deadline",
                      fallback_policy="rule", stop_reason="aborted")
    events = run_events([rec], pid=1, label="x", origin_ns=0)
    names = [e["name"] for e in events if e["ph"] == "X" and e["tid"] == ENGINE_TID]
    assert "generate (no trace)" not in names
    assert {"generate", "prefill", "decode"} <= set(names)
    gen = next(e for e in events if e["ph"] == "X" and e["name"] == "generate")
    assert gen["args"]["fallback_reason"] == "deadline" and gen["args"]["tokens_out"] == 3
