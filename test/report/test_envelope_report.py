"""The report's "Operating envelope" section: the runs' levels in every power mode of the target,
the same answer as ``envelope``, with its Pareto plot; skipped past its cell limit."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from robot_latency.clock import ScriptedClock
from robot_latency.floor.devices import power_modes_of
from robot_latency.planner.config import RunSettings
from robot_latency.planner.lifecycle import PlannerRun
from robot_latency.planner.replay import replay
from robot_latency.planner.resolve import resolve_run
from robot_latency.planner.target_inputs import (
    TARGET_FILE,
    read_target_inputs,
    untimed_inputs,
    write_target_inputs,
)
from robot_latency.planner.target_sim import DEFAULT_DRAWS, DEFAULT_MISS_TARGET
from robot_latency.report.envelope import envelope
from robot_latency.report.envelope_report import PARETO_PLOT, envelope_section, pareto_front
from robot_latency.report.markdown import write_report
from robot_latency.streams import SHIPPED_DIR, read_stream, write_jsonl

QUANTS = ("Q8_0", "Q4_0")


@pytest.fixture()
def run_dirs(tmp_path: Path) -> list[Path]:
    full = read_stream(SHIPPED_DIR / "steady_operator")
    spaced = [replace(c, t_ns=i * 2 * 10**9) for i, c in enumerate(full.commands[:10])]
    stream = read_stream(write_jsonl(tmp_path / "stream.jsonl", spaced))
    out = []
    for quant in QUANTS:
        settings = RunSettings(log_dir=tmp_path / quant, engine="sim", runner="inline",
                               engine_options={"device": "orin-agx-64gb", "jitter_sigma": 0.0},
                               model="qwen2.5-0.5b", quant=quant,
                               target_device="orin-nano-8gb", mode="event", deadline_ms=900.0,
                               label=quant)
        cfg, _ = resolve_run(settings)
        with PlannerRun(cfg, publish=lambda e: None,
                        clock=ScriptedClock(start_ns=10**9)) as run:
            replay(run.loop, stream)
            run.close()
        write_target_inputs(untimed_inputs(settings, stream, cache_dir=tmp_path / "cache"),
                            tmp_path / quant)
        out.append(tmp_path / quant)
    return out


def test_the_report_gets_the_envelope_of_the_target_and_its_pareto_plot(
        tmp_path: Path, run_dirs: list[Path]) -> None:
    text = write_report(run_dirs, tmp_path / "report").read_text()
    assert "## Operating envelope" in text
    section = text.split("## Operating envelope")[1].split("## Comparison")[0]
    modes = power_modes_of("orin-nano-8gb")
    assert len(modes) == 4
    # one table row per level x mode
    rows = [line for line in section.splitlines()
            if line.startswith("| Q") and "(orin-nano-8gb" in line]
    assert len(rows) == len(QUANTS) * len(modes)
    # the same answer as `envelope` on the same inputs: the pick is the one it makes
    levels = [(q, read_target_inputs(d)) for q, d in zip(QUANTS, run_dirs, strict=True)]
    module, = envelope(levels, ["orin-nano-8gb"], all_modes=True,
                       miss_target=DEFAULT_MISS_TARGET, draws=DEFAULT_DRAWS)
    assert module.pick is not None
    assert (f"Put on the robot: {module.pick.level} in {module.pick.power_mode} "
            f"({module.pick.device_id})") in section
    assert "rests on" in section and "source" in section
    assert (tmp_path / "report" / PARETO_PLOT).is_file()
    assert f"]({PARETO_PLOT})" in section
    # the front: no cell on it is beaten on both axes, every cell off it is
    front = pareto_front(module.cells)
    assert front

    def beats(o, c) -> bool:
        return (o.energy_j <= c.energy_j and o.answer.miss_rate <= c.answer.miss_rate
                and (o.energy_j < c.energy_j or o.answer.miss_rate < c.answer.miss_rate))

    have = [c for c in module.cells if c.energy_j is not None]
    assert all(not any(beats(o, c) for o in have) for c in front)
    assert all(any(beats(o, c) for o in have) for c in have if c not in front)


def test_too_many_cells_skip_the_section(tmp_path: Path, run_dirs: list[Path]) -> None:
    lines = envelope_section(list(QUANTS), run_dirs, tmp_path, max_cells=7)
    text = "\n".join(lines)
    assert "Skipped: 2 levels x 4 power modes = 8 cells, more than the report's 7" in text
    assert not (tmp_path / PARETO_PLOT).exists()


def test_no_target_inputs_no_section_and_a_calibration_file_says_why(
        tmp_path: Path, run_dirs: list[Path]) -> None:
    for d in run_dirs:
        (d / TARGET_FILE).unlink()
    assert envelope_section(list(QUANTS), run_dirs, tmp_path) == []
    assert "## Operating envelope" not in write_report(run_dirs, tmp_path / "r").read_text()


def test_a_calibration_file_is_one_device_only(tmp_path: Path, run_dirs: list[Path]) -> None:
    path = run_dirs[0] / TARGET_FILE
    doc = json.loads(path.read_text())
    doc["calibration"] = str(tmp_path / "cal.json")
    path.write_text(json.dumps(doc))
    text = "\n".join(envelope_section(list(QUANTS), run_dirs, tmp_path))
    assert "Not answered: Q8_0 predicts from a calibration file" in text
