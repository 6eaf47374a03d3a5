"""Energy per plan, measured: the input rail integrated over a cycle's phases, against traces.

The traces (test/fixtures/jetson-rail-trace/traces.json) replay a Jetson's power files over one
cycle into a copy of a fixture tree (Orin Nano's VDD_IN, AGX Orin's four rails, Thor's INA238)
under a scripted clock; the meter's integral must equal a recount of the same readings.
"""

from __future__ import annotations

import json
import shutil
from itertools import pairwise
from pathlib import Path

import pytest

from robot_latency.records import CycleRecord
from robot_latency.stats import summarize
from robot_latency.telemetry.energy import (
    NOT_MEASURED,
    EnergyMeter,
    PowerSample,
    cycle_energy,
    find_power_input,
    integrate_mj,
)

FIXTURES = Path(__file__).resolve().parent / "fixtures"
TRACES = json.loads((FIXTURES / "jetson-rail-trace" / "traces.json").read_text())
MS = 1_000_000


class ScriptedClock:
    """The injected clock: returns what the test set."""

    def __init__(self) -> None:
        self.now_ns = 0

    def __call__(self) -> int:
        return self.now_ns


def _replay(name: str, tmp_path: Path) -> tuple[EnergyMeter, list[tuple[int, float]]]:
    """Replay a trace into a copy of its tree; return the meter and a recount's readings."""
    trace = TRACES[name]
    root = tmp_path / name
    shutil.copytree(FIXTURES / trace["tree"], root, symlinks=True)
    inp = find_power_input(root)
    assert inp is not None
    clock = ScriptedClock()
    meter = EnergyMeter(inp, clock=clock)
    recount = []
    for step in trace["samples"]:
        for rel, value in step["files"].items():
            (root / rel).write_text(value + "\n")
        clock.now_ns = step["t_ms"] * MS
        assert meter.sample() is not None
        recount.append((clock.now_ns, _power_by_hand(root, inp)))
    return meter, recount


def _power_by_hand(root: Path, inp: object) -> float:
    """mW from the files, read again here: mV x mA / 1000 per rail, or uW / 1000."""
    total = 0.0
    for mv, ma in inp.rails:  # type: ignore[attr-defined]
        total += int(Path(mv).read_text()) * int(Path(ma).read_text()) / 1000
    for uw in inp.microwatts:  # type: ignore[attr-defined]
        total += int(Path(uw).read_text()) / 1000
    return total


def _trapezoids_mj(points: list[tuple[int, float]], a_ns: int, b_ns: int) -> float:
    inside = [(t, p) for t, p in points if a_ns <= t <= b_ns]
    return sum((t1 - t0) * (p0 + p1) / 2
               for (t0, p0), (t1, p1) in pairwise(inside)) / 1e9


def _record(**kw: object) -> CycleRecord:
    return CycleRecord(run_id="r", cycle=0, scheduled_ns=10 * MS, deadline_ns=200 * MS, **kw)


@pytest.mark.parametrize("name", ["orin-nano-super", "agx-orin-maxn", "thor-t5000"])
def test_cycle_energy_equals_a_recount_of_the_trace(name: str, tmp_path: Path) -> None:
    meter, points = _replay(name, tmp_path)
    # the previous plan went out at 0 ms; started 10, first token 30, last 70, published 80
    rec = _record(started_ns=10 * MS, token_ns=[30 * MS, 50 * MS, 70 * MS], published_ns=80 * MS)
    out = cycle_energy(meter, rec, prev_end_ns=0)
    assert out["energy_source"] == meter.label
    assert out["energy_mj"] == pytest.approx(_trapezoids_mj(points, 0, 80 * MS))
    parts = out["energy_phases_mj"]
    assert parts["wait"] == pytest.approx(_trapezoids_mj(points, 0, 10 * MS))
    assert parts["prefill"] == pytest.approx(_trapezoids_mj(points, 10 * MS, 30 * MS))
    assert parts["decode"] == pytest.approx(_trapezoids_mj(points, 30 * MS, 70 * MS))
    assert parts["rest"] == pytest.approx(_trapezoids_mj(points, 70 * MS, 80 * MS))
    assert sum(parts.values()) == pytest.approx(out["energy_mj"])
    # the readings changed: the prefill drew more power than the wait
    assert parts["prefill"] / 20 > parts["wait"] / 10


def test_rail_choice_follows_the_board(tmp_path: Path) -> None:
    nano = find_power_input(FIXTURES / "jetson-rail-trace" / "orin-nano-super")
    assert nano is not None and nano.label == "VDD_IN" and len(nano.rails) == 1
    agx = find_power_input(FIXTURES / "jetson-telemetry" / "agx-orin-maxn")
    assert agx is not None and agx.label.startswith("sum of ") and len(agx.rails) == 4
    assert "VDD_GPU_SOC" in agx.label and "NC" not in agx.label
    thor = find_power_input(FIXTURES / "jetson-rail-trace" / "thor-t5000")
    assert thor is not None and thor.label == "VIN (INA238)" and thor.microwatts
    assert find_power_input(FIXTURES / "jetson-telemetry" / "orin-nano-minimal") is None
    assert find_power_input(tmp_path) is None


def test_interpolates_at_window_edges() -> None:
    samples = [PowerSample(0, 1000.0), PowerSample(10 * MS, 3000.0)]
    # 5 ms at a power rising 2000 -> 3000 mW: 12.5 mJ
    assert integrate_mj(samples, 5 * MS, 10 * MS) == pytest.approx(12.5)
    assert integrate_mj(samples, 0, 11 * MS) is None  # past the last reading: not measured
    assert integrate_mj([], 0, 1) is None


def test_no_rail_says_not_measured_never_zero() -> None:
    rec = _record(started_ns=10 * MS, token_ns=[30 * MS], published_ns=40 * MS)
    out = cycle_energy(None, rec, prev_end_ns=None)
    assert out["energy_mj"] is None and out["energy_source"].startswith(NOT_MEASURED)
    rec.energy_source = out["energy_source"]
    summary = summarize([rec])
    assert summary["energy_per_plan_j"] == {"source": out["energy_source"]}


def test_summary_adds_j_per_plan(tmp_path: Path) -> None:
    meter, _ = _replay("orin-nano-super", tmp_path)
    recs, prev = [], 0
    for i, (start, end) in enumerate(((10, 40), (40, 80))):
        rec = CycleRecord(run_id="r", cycle=i, scheduled_ns=start * MS, deadline_ns=90 * MS,
                          started_ns=start * MS, token_ns=[(start + 10) * MS],
                          published_ns=end * MS)
        for key, value in cycle_energy(meter, rec, prev).items():
            setattr(rec, key, value)
        prev = end * MS
        recs.append(rec)
    s = summarize(recs)["energy_per_plan_j"]
    assert s["n"] == 2 and s["source"] == "VDD_IN"
    assert s["total_j"] == pytest.approx(meter.energy_mj(0, 80 * MS) / 1e3)
    # and the record's JSON form carries it
    back = CycleRecord.from_dict(json.loads(recs[0].to_json()))
    assert back.energy_mj == pytest.approx(recs[0].energy_mj)


def test_meter_thread_starts_and_ends(tmp_path: Path) -> None:
    root = tmp_path / "nano"
    shutil.copytree(FIXTURES / "jetson-rail-trace" / "orin-nano-super", root)
    inp = find_power_input(root)
    assert inp is not None
    ticks = iter(range(10**9))
    with EnergyMeter(inp, clock=lambda: next(ticks), period_ns=1_000_000) as meter:
        assert meter.samples()  # the first reading is taken at start
    assert not meter._thread.is_alive()  # type: ignore[union-attr]
    with pytest.raises(RuntimeError):
        meter.start()


def test_report_says_energy_not_measured_on_this_host() -> None:
    from robot_latency.report.markdown import _energy_lines
    from robot_latency.report.rundir import RunData

    rec = _record(started_ns=10 * MS, token_ns=[30 * MS], published_ns=40 * MS)
    rec.energy_source = cycle_energy(None, rec, None)["energy_source"]
    text = "\n".join(_energy_lines([RunData("host", [rec], {})]))
    assert "host: not measured: no power rail readable" in text and " 0.000 J" not in text


def test_a_run_on_this_host_records_not_measured(tmp_path: Path) -> None:
    """Where no rail is readable (this host), every record and the summary say so."""
    from robot_latency.clock import ScriptedClock as RunClock
    from robot_latency.planner.config import RunSettings
    from robot_latency.planner.lifecycle import PlannerRun
    from robot_latency.planner.replay import replay
    from robot_latency.planner.resolve import resolve_run
    from robot_latency.records import read_records
    from robot_latency.streams import Command, read_stream, write_jsonl

    if find_power_input(Path("/")) is not None:
        pytest.skip("this machine has a readable power rail")
    cfg, _ = resolve_run(RunSettings(
        period_ms=100, deadline_ms=60, log_dir=tmp_path / "run", engine="sim", runner="inline",
        engine_options={"device": "orin-agx-64gb", "seed": 1}, model="qwen2.5-0.5b",
        quant="Q4_K_M", target_device="orin-nano-8gb",
        extra={"replay": {"mode": "recorded", "speed": 1.0}}))
    with PlannerRun(cfg, publish=lambda _plan: None, clock=RunClock(start_ns=5 * 10**9)) as run:
        stream = write_jsonl(tmp_path / "s.jsonl", [Command(t_ns=0, text="stop", command_id="c")])
        replay(run.loop, read_stream(stream))
        summary = run.close()
    records = read_records(tmp_path / "run" / "cycles.jsonl")
    assert records and all(r.energy_mj is None for r in records)
    assert all(r.energy_source == "not measured: no power rail readable" for r in records)
    assert summary["energy_per_plan_j"] == {"source": "not measured: no power rail readable"}
