"""Calibration files and target predictions: round trip, bad files, the floor never raised."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from robot_latency.floor.calibration import (
    DecodePoint,
    calibrate_points,
    read_calibration,
    write_calibration,
)
from robot_latency.floor.devices import DEVICES
from robot_latency.floor.errors import CalibrationError
from robot_latency.floor.modelinfo import facts_from_preset
from robot_latency.floor.target import predict_target, resolve_calibration

PREDICT_KEYS = {"itl_pred_ms", "itl_pred_interval_ms", "ttft_pred_ms", "itl_floor_ms",
                "efficiency", "overhead_ms", "calibration"}


def _points(device: str = "orin-agx-64gb") -> list[DecodePoint]:
    # generated from efficiency 0.8, overhead 5 ms
    return [DecodePoint(f"p{i}", device, "m", x, x / 0.8 + 5.0)
            for i, x in enumerate([2.0, 8.0, 30.0])]


def test_write_read_round_trip(tmp_path: Path) -> None:
    cal = calibrate_points(_points(), engine_family="llamacpp-cuda", device_id="orin-agx-64gb",
                           scope="device", source="runs")
    assert cal.efficiency == pytest.approx(0.8) and cal.overhead_ms == pytest.approx(5.0)
    path = tmp_path / "cal.json"
    write_calibration(cal, path)
    back = read_calibration(path, engine_family="llamacpp-cuda", device_id="orin-agx-64gb")
    assert back.efficiency == pytest.approx(cal.efficiency)
    assert back.overhead_ms == pytest.approx(cal.overhead_ms)
    assert back.basis == cal.basis and back.interval_rel == pytest.approx(cal.interval_rel)


def test_single_size_warns_when_overhead_is_held(caplog: pytest.LogCaptureFixture) -> None:
    pts = [DecodePoint("a", "orin-agx-64gb", "m", 10.0, 20.0)]
    with pytest.raises(CalibrationError, match="model size"):
        calibrate_points(pts, engine_family="mlc", device_id="orin-agx-64gb", scope="device",
                         source="runs")
    with caplog.at_level(logging.WARNING, logger="robot_latency.floor.calibration"):
        cal = calibrate_points(pts, engine_family="mlc", device_id="orin-agx-64gb",
                               scope="device", source="runs", fixed_overhead_ms=4.0)
    assert cal.overhead_fixed and "overhead held" in caplog.text and cal.notes


def _file(tmp_path: Path, doc: object) -> Path:
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(doc))
    return path


def _good_doc() -> dict:
    cal = calibrate_points(_points(), engine_family="mlc", device_id="orin-agx-64gb",
                           scope="device", source="runs")
    return cal.to_dict()


@pytest.mark.parametrize(("mutate", "match"), [
    (lambda d: d.update(format="something/2"), "not a calibration file"),
    (lambda d: d.pop("decode"), "'decode' must be an object"),
    (lambda d: d["decode"].update(efficiency="high"), "decode.efficiency"),
    (lambda d: d["decode"].update(efficiency=0), "decode.efficiency"),
    (lambda d: d["decode"].update(interval_rel=[0.1]), "interval_rel"),
    (lambda d: d["prefill"].update(overhead_ms=-1), "prefill.overhead_ms"),
    (lambda d: d.update(engine_family="warp-drive"), "known families"),
    (lambda d: d.update(device_id=7), "device_id"),
])
def test_wrong_shape_is_named(tmp_path: Path, mutate, match: str) -> None:
    doc = _good_doc()
    mutate(doc)
    with pytest.raises(CalibrationError, match=match):
        read_calibration(_file(tmp_path, doc))


def test_not_json_and_missing_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(CalibrationError, match=r"bad\.json"):
        read_calibration(bad)
    with pytest.raises(CalibrationError, match="cannot read"):
        read_calibration(tmp_path / "absent.json")


def test_calibration_for_another_device_or_family_is_refused(tmp_path: Path) -> None:
    path = _file(tmp_path, _good_doc())
    with pytest.raises(CalibrationError, match="fitted for device 'orin-agx-64gb', not "
                                               "'orin-nano-8gb'"):
        resolve_calibration("mlc", DEVICES["orin-nano-8gb"], calibration=path)
    with pytest.raises(CalibrationError, match="engine family 'mlc', not 'tensorrt'"):
        resolve_calibration("tensorrt", DEVICES["orin-agx-64gb"], calibration=path)


def test_prediction_keys_and_floor_below_prediction() -> None:
    device = DEVICES["orin-nano-8gb-super"]
    model = facts_from_preset("llama-3.2-3b", quant="Q4_0")
    cal = resolve_calibration("mlc", device)
    pred = predict_target(model, device, cal, context_tokens=128, prompt_tokens=64).to_dict()
    assert PREDICT_KEYS <= set(pred)
    assert pred["itl_floor_ms"] < pred["itl_pred_ms"]
    lo, hi = pred["itl_pred_interval_ms"]
    assert pred["itl_floor_ms"] <= lo <= pred["itl_pred_ms"] <= hi
    assert pred["ttft_pred_ms"] >= pred["prefill_floor_ms"] > 0
    assert pred["calibration"]["scope"] == "setup"  # the device's rows come from one setup
    # the published figure for this pair (43.07 tok/s, 23.2 ms) lies inside the interval
    assert lo <= 1e3 / 43.07 <= hi


def test_host_prefill_is_a_prediction_never_a_floor() -> None:
    from robot_latency.floor.predict import predict_floor
    from robot_latency.floor.probe import HostProbe

    host = HostProbe(bandwidth_gbps=20.0, bandwidth_single_gbps=10.0, matmul_gflops=66.0,
                     cpu_cores=2, memory_bytes=8 * 2**30, cpu_model="x", machine="x86_64",
                     hostname="h", probed_at="2026-01-01T00:00:00+00:00",
                     probe_version=2, load_avg_1m=0.0).to_sheet()
    assert host.flops_is_peak is False
    model = facts_from_preset("qwen2.5-0.5b", quant="Q4_0")
    # a measured float32 matmul rate is no bound: no prefill floor from it
    assert predict_floor(model, host, prompt_tokens=64).prefill_floor_ms is None
    assert predict_floor(model, DEVICES["orin-agx-64gb"], prompt_tokens=64).prefill_floor_ms


def test_prefill_from_runs_has_an_interval_and_round_trips(tmp_path: Path) -> None:
    from robot_latency.floor.calibration import PrefillPoint

    # prefill points from compute efficiency 0.25, overhead 40 ms, one off by +10%
    xs = [10.0, 40.0, 160.0, 320.0]
    prefill = [PrefillPoint(f"q{i}", x, (x / 0.25 + 40.0) * (1.1 if i == 2 else 1.0))
               for i, x in enumerate(xs)]
    cal = calibrate_points(_points(), engine_family="llamacpp-cuda", device_id="orin-agx-64gb",
                           scope="device", source="runs", prefill=prefill)
    assert cal.prefill_calibrated and cal.prefill_basis == ("q0", "q1", "q2", "q3")
    lo, hi = cal.prefill_interval_rel
    assert lo < 0 < hi  # the off point's leave-one-out error widens both sides
    path = tmp_path / "cal.json"
    write_calibration(cal, path)
    back = read_calibration(path)
    assert back.prefill_interval_rel == pytest.approx(cal.prefill_interval_rel)
    assert back.prefill_calibrated and back.compute_efficiency == pytest.approx(
        cal.compute_efficiency)
    # without prefill points: uncalibrated, no interval, no decode overhead borrowed
    plain = calibrate_points(_points(), engine_family="llamacpp-cuda",
                             device_id="orin-agx-64gb", scope="device", source="runs")
    assert not plain.prefill_calibrated and plain.prefill_interval_rel is None
    assert plain.prefill_overhead_ms == 0.0 and "prefill uncalibrated" in plain.prefill_status
