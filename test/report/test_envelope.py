"""The operating envelope: its rule for what to put on the robot, its energy per plan, and its
agreement with ``predict --stream`` (the same path, not a copy of it).

Checked on events and invariants: which cell the rule names, that J per plan is the mean of the
commands' plan energies, that every cell's miss rate and rate held equal ``predict --stream``'s
for that mode. No wall-clock figure is asserted.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from robot_latency.cli import main
from robot_latency.floor.energy import plan_energy, power_estimate
from robot_latency.planner.config import RunSettings
from robot_latency.planner.target_inputs import predictor_for
from robot_latency.planner.target_sim import SimCommand, target_answer
from robot_latency.report.envelope import EnvelopeCell, pick_for_robot, stream_energy
from robot_latency.report.target_answer import PreparedLevel
from robot_latency.streams import SHIPPED_DIR, read_stream, write_jsonl

STEPS = predictor_for("qwen2.5-0.5b", "orin-nano-8gb", "llamacpp-cuda", quant="Q4_0")
RULES = RunSettings(mode="event", deadline_ms=100.0, publish_margin_ms=0.0,
                    transport_margin_ms=0.0)


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROBOT_LATENCY_CACHE_DIR", str(tmp_path / "cache"))


def _cell(level: str, mode: str, miss: float, energy_j: float | None, size: int,
          rail: str = "VDD_IN") -> EnvelopeCell:
    # 20 commands, ``miss`` of them missing: service 200 ms against a 100 ms deadline
    n_miss = round(20 * miss)
    cmds = [SimCommand(f"c:{i}", 1000.0 * i, True, ttft_ms=200.0 if i < n_miss else 10.0,
                       itl_ms=1.0, itl_floor_ms=0.5, tokens_out=1, plan_valid=True)
            for i in range(20)]
    a = target_answer(level, cmds, STEPS, RULES, draws=1, curve=False)
    assert a.miss_rate == pytest.approx(miss)
    energy = {"energy_j": energy_j, "power": {"rail": rail if energy_j is not None else None}}
    return EnvelopeCell(level, f"dev-{mode}", mode, a, size, energy, None, None)


def test_the_pick_meets_the_target_then_least_energy_then_smaller_file() -> None:
    cells = [_cell("Q8_0", "MAXN", 0.0, 3.0, 500),
             _cell("Q4_0", "MAXN", 0.0, 2.0, 300),
             _cell("Q4_0", "7W", 0.10, 1.0, 300),  # least energy, but misses 10%
             _cell("Q4_K_M", "15W", 0.05, 2.0004, 350),  # ties Q4_0 MAXN to the mJ, bigger
             _cell("Q2_K", "25W", 0.0, None, 100)]  # smallest, but energy uncalibrated
    pick, why = pick_for_robot(cells, 0.05)
    assert pick is not None and (pick.level, pick.power_mode) == ("Q4_0", "MAXN")
    assert why.startswith("4 of 5 level x mode cells meet the target") and "NOTE" not in why
    # a tie to the mJ goes to the smaller file, whichever comes first
    pick, _ = pick_for_robot(list(reversed(cells)), 0.05)
    assert pick is not None and pick.level == "Q4_0"
    # only uncalibrated cells meet it: the smaller file
    pick, why = pick_for_robot([cells[2], cells[4], replace(cells[0], energy={
        "energy_j": None, "power": {"rail": None}})], 0.05)
    assert pick is not None and pick.level == "Q2_K" and "energy uncalibrated" in why


def test_no_cell_meets_the_target_and_rails_that_differ_are_named() -> None:
    cells = [_cell("Q8_0", "7W", 0.5, 3.0, 500), _cell("Q4_0", "7W", 0.2, 2.0, 300)]
    pick, why = pick_for_robot(cells, 0.05)
    assert pick is None and why.startswith("none: no level meets 5%")
    assert "the lowest is Q4_0 in 7W (20.0%)" in why
    mixed = [_cell("Q8_0", "MAXN", 0.0, 3.0, 500, "VDD_IN"),
             _cell("Q4_0", "15W", 0.0, 2.0, 300, "VDD_CPU_GPU_CV")]
    _, why = pick_for_robot(mixed, 0.05)
    assert "different rails (VDD_CPU_GPU_CV, VDD_IN)" in why


def test_j_per_plan_is_the_mean_of_the_commands_plan_energies() -> None:
    cmds = [SimCommand("a", 0.0, True, ttft_ms=50.0, itl_ms=10.0, itl_floor_ms=5.0,
                       tokens_out=20, plan_valid=True),
            SimCommand("b", 500.0, True, ttft_ms=70.0, itl_ms=12.0, itl_floor_ms=5.0,
                       tokens_out=40, plan_valid=True),
            SimCommand("c", 900.0, False)]  # refused: no plan, no energy
    p = PreparedLevel("Q4_0", None, RULES, "", STEPS, cmds)  # type: ignore[arg-type]
    got = stream_energy(p)
    power = power_estimate("orin-nano-8gb", "llamacpp-cuda")
    one = [plan_energy(power, ttft_ms=c.ttft_ms, itl_ms=c.itl_ms, output_tokens=c.tokens_out)
           for c in cmds[:2]]
    assert got["plans"] == 2
    assert got["energy_j"] == pytest.approx(sum(e.energy_j or 0 for e in one) / 2)
    lo, hi = got["energy_interval_j"]
    assert lo < got["energy_j"] < hi
    agx = stream_energy(replace(p, steps=predictor_for("qwen2.5-0.5b", "orin-agx-64gb",
                                                       "llamacpp-cuda", quant="Q4_0")))
    assert agx["energy_j"] is None and agx["status"].startswith("energy uncalibrated")


def _labelled(tmp_path: Path, n: int = 12) -> Path:
    full = read_stream(SHIPPED_DIR / "steady_operator")
    path = write_jsonl(tmp_path / "s.jsonl", list(full.commands[:n]))
    shutil.copy(SHIPPED_DIR / "steady_operator" / "labels.jsonl", tmp_path / "labels.jsonl")
    return path


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> Any:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_envelope_agrees_with_predict_stream_in_every_mode(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stream = _labelled(tmp_path)
    common = ["--stream", str(stream), "--model", "qwen2.5-0.5b", "--quants", "Q8_0,Q4_0",
              "--deadline-ms", "1500", "--mode", "event", "--draws", "50"]
    doc = _json(capsys, ["envelope", *common, "--device", "orin-nano-8gb",
                         "--power-modes", "all"])
    (module,) = doc["modules"]
    assert module["module"] == "orin-nano-8gb" and len(module["modes"]) == 4
    cells = module["cells"]
    assert len(cells) == 8 and {c["level"] for c in cells} == {"Q8_0", "Q4_0"}
    for device in {c["device_id"] for c in cells}:
        levels = _json(capsys, ["predict", *common, "--device", device, "--find-rate"])["levels"]
        for level in levels:
            (cell,) = [c for c in cells if c["device_id"] == device
                       and c["level"] == level["label"]]
            assert cell["miss_rate"] == level["miss_rate"]
            assert cell["min_deadline_ms"] == level["min_deadline_ms"]
            assert cell["capacity"] == level["capacity"]
    # the pick follows the rule over the cells the JSON holds
    pick = module["put_on_robot"]
    meeting = [c for c in cells if c["miss_rate"] <= 0.05]
    assert meeting and pick is not None
    best = min(meeting, key=lambda c: (c["energy"]["energy_j"] is None,
                                       round(c["energy"]["energy_j"] or 0.0, 3),
                                       c["weight_bytes"]))
    assert (pick["level"], pick["device_id"]) == (best["level"], best["device_id"])
    for c in cells:
        assert c["goodput_plans_s"] is not None and c["goodput_plans_s"] >= 0
    # the text: one table per module, the pick, one rests-on line per mode
    assert main(["envelope", *common, "--device", "orin-nano-8gb,orin-agx-64gb",
                 "--power-modes", "all"]) == 0
    out = capsys.readouterr().out
    assert "### orin-nano-8gb: 2 levels x 4 power modes" in out
    assert "### orin-agx-64gb: 2 levels x 4 power modes" in out
    assert out.count("Put on the robot: ") == 2 and "energy uncalibrated" in out
    assert out.count("source(s); J per plan: ") == 8


@pytest.mark.parametrize(("argv", "needle"), [
    (["--device", ""], "--device"),
    (["--miss-target", "2"], "--miss-target: must be in [0, 1)"),
    (["--power-modes", "all", "--calibration", "cal.json"], "--calibration"),
])
def test_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                               argv: list[str], needle: str) -> None:
    stream = _labelled(tmp_path, 3)
    assert main(["envelope", "--stream", str(stream), "--quants", "Q4_0", *argv]) != 0
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1
