"""``predict --power-modes all``: one answer per nvpmodel mode of the device's module."""

from __future__ import annotations

import json

import pytest

from robot_latency.cli import main


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def test_every_mode_of_the_module_answers(capsys: pytest.CaptureFixture[str]) -> None:
    out = _json(capsys, "predict", "--device", "orin-agx-64gb", "--power-modes", "all",
                "--json")
    modes = {m["power_mode"]: m for m in out["modes"]}
    assert set(modes) == {"MAXN", "15W", "30W", "50W"}
    for m in modes.values():
        assert m["prediction"]["device_id"] == m["device_id"]
        assert "nvpmodel_p3701_0000.conf" in m["source"]
        assert m["prediction"]["itl_pred_ms"] >= m["prediction"]["itl_floor_ms"]
    assert modes["15W"]["bandwidth_gbps"] == pytest.approx(136.5)
    assert modes["30W"]["gpu_tpcs"] == 4 and modes["30W"]["gpu_max_mhz"] == 612
    assert modes["15W"]["prediction"]["itl_pred_ms"] > modes["MAXN"]["prediction"]["itl_pred_ms"]


def test_a_capped_mode_is_a_device_of_its_own(capsys: pytest.CaptureFixture[str]) -> None:
    out = _json(capsys, "predict", "--device", "orin-agx-64gb-30w", "--json")
    assert out["device_id"] == "orin-agx-64gb-30w"
    assert out["calibration"]["scope"] == "module"
    assert out["calibration"]["decode_compute_ratio"] > 0


def test_power_modes_table_prints(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["predict", "--device", "orin-nano-8gb-super", "--power-modes", "all"]) == 0
    text = capsys.readouterr().out
    for device in ("orin-nano-8gb-7w", "orin-nano-8gb-super-25w", "orin-nano-8gb"):
        assert device in text


def test_predict_answers_energy_per_plan(capsys: pytest.CaptureFixture[str]) -> None:
    out = _json(capsys, "predict", "--device", "orin-nano-8gb-super", "--prompt-tokens", "200",
                "--plan-tokens", "30", "--wait-ms", "100", "--json")
    e = out["energy"]
    assert e["power"]["decode_watts"] > 0 and e["plan_tokens"] == 30
    assert e["energy_j"] == pytest.approx(e["prefill_j"] + e["decode_j"])
    assert e["wait_j"] is None and any("idle uncalibrated" in n for n in e["notes"])
    out = _json(capsys, "predict", "--device", "orin-agx-64gb", "--json")
    assert out["energy"]["status"].startswith("energy uncalibrated")
    assert out["energy"]["j_per_output_token"] is None
