"""Energy per plan, predicted: the published energy table, the power model and its validation."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from robot_latency.floor.energy import (
    default_energy_path,
    load_energy_table,
    plan_energy,
    power_estimate,
    validate_energy,
)
from robot_latency.floor.errors import TableError


def test_table_rows_give_watts_and_name_their_rail() -> None:
    rows = load_energy_table()
    assert len({r.source for r in rows}) >= 2 and len({r.device for r in rows}) >= 2
    row = next(r for r in rows if r.id == "jetsonllm-1.5b-q4-llamacpp-orin")
    assert row.watts == pytest.approx(0.647 * 38.7)  # J per token x tok/s
    smol = next(r for r in rows if r.id == "smolhub-15w-smollm2-135m")
    assert smol.watts == pytest.approx(114.7 / 27.58) and smol.rail == "VDD_CPU_GPU_CV"
    for r in rows:
        assert r.url.startswith("https://") and r.rail


def test_validation_meets_the_targets() -> None:
    v = validate_energy()
    assert len(v["sources"]) >= 2 and len(v["devices"]) >= 2
    assert v["median_abs_error"] <= 0.25
    assert v["coverage_80"] >= 0.75


def test_a_device_without_rows_says_energy_uncalibrated() -> None:
    power = power_estimate("orin-agx-64gb-30w", "llamacpp-cuda")
    assert not power.calibrated and power.status.startswith("energy uncalibrated")
    plan = plan_energy(power, ttft_ms=100.0, itl_ms=20.0, output_tokens=10, wait_ms=50.0)
    assert plan.energy_j is None and plan.decode_j is None and plan.j_per_output_token is None
    assert plan.status.startswith("energy uncalibrated")


def test_plan_energy_adds_its_phases_and_says_what_is_uncalibrated() -> None:
    power = power_estimate("orin-nano-8gb-super", "llamacpp-cuda")
    assert power.calibrated and power.idle_watts is None and power.prefill_watts is None
    w = power.decode_watts
    plan = plan_energy(power, ttft_ms=100.0, itl_ms=10.0, output_tokens=40, wait_ms=200.0,
                       ttft_interval_ms=(80.0, 150.0), itl_interval_ms=(9.0, 12.0))
    assert plan.decode_j == pytest.approx(w * 0.4)
    assert plan.prefill_j == pytest.approx(w * 0.1)  # at the decode watts, noted
    assert plan.wait_j is None and plan.energy_j == pytest.approx(w * 0.5)
    lo, hi = plan.energy_interval_j
    assert lo < plan.energy_j < hi
    assert any("idle uncalibrated" in n for n in plan.notes)
    assert any("prefill watts uncalibrated" in n for n in plan.notes)


def test_rails_are_not_mixed_and_a_bad_row_is_named(tmp_path: Path) -> None:
    doc = yaml.safe_load(default_energy_path().read_text())
    row = dict(doc["rows"][0], id="x", tok_per_j=-1)
    path = tmp_path / "energy.yaml"
    path.write_text(yaml.safe_dump({"rows": [row]}))
    with pytest.raises(TableError, match=r"energy\.yaml: row x"):
        load_energy_table(path)
    # one setup per rail: a second rail on the same device is its own setup
    rows = load_energy_table()
    other = [r for r in rows if r.device == "orin-agx-32gb"]
    assert len({r.setup for r in other}) == 2  # llama.cpp and vLLM
