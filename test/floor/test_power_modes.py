"""Power modes: the mode table, the decode compute term and predicting a mode nobody measured."""

from __future__ import annotations

import pytest

from robot_latency.floor.devices import DEVICES, power_modes_of
from robot_latency.floor.modelinfo import facts_from_preset
from robot_latency.floor.power_modes import MODES, bandwidth_gbps, fp16_tflops, tpcs_on
from robot_latency.floor.predict import decode_compute_ms, predict_floor
from robot_latency.floor.published import table_calibration
from robot_latency.floor.published_modes import (
    RATIO_GRID,
    compute_ratio,
    fit_compute_ratio,
    validate_modes,
)
from robot_latency.floor.published_table import load_table
from robot_latency.floor.target import predict_target


def test_tpc_mask_counts_the_tpcs_left_on() -> None:
    by_id = {m.device_id: m for m in MODES}
    assert tpcs_on(by_id["orin-agx-64gb"]) == 8  # mask 0
    assert tpcs_on(by_id["orin-agx-64gb-15w"]) == 3  # mask 248 = 0b11111000
    assert tpcs_on(by_id["orin-agx-32gb"]) == 7  # mask 128: one TPC fused off
    assert tpcs_on(by_id["orin-nano-8gb-7w"]) == 2  # mask 252 = 0b11111100
    # an EMC cap of 2133 MHz on a 128-bit bus: 16 bytes x 4266 MT/s
    assert bandwidth_gbps(by_id["orin-nx-8gb-10w"]) == pytest.approx(68.256)
    assert fp16_tflops(by_id["orin-agx-64gb"]) == pytest.approx(42.6, abs=0.01)


def test_every_mode_sheet_is_a_device_and_sources_each_cap() -> None:
    for mode in MODES:
        sheet = DEVICES[mode.device_id]
        assert sheet.power_mode == mode.name
        assert mode.conf_file in sheet.source
        assert sheet.gpu_max_mhz and sheet.emc_max_mhz and sheet.gpu_tpcs


def test_decode_floor_is_the_slower_of_bytes_and_flops() -> None:
    model = facts_from_preset("qwen2.5-0.5b", quant="Q4_K_M")
    maxn, capped = DEVICES["orin-agx-64gb"], DEVICES["orin-agx-64gb-15w"]
    for device in (maxn, capped):
        f = predict_floor(model, device)
        compute = decode_compute_ms(model, device)
        assert compute is not None and f.itl_compute_floor_ms == pytest.approx(compute)
        bytes_ms = model.weight_bytes_per_step / (device.bandwidth_gbps * 1e9) * 1e3
        assert f.itl_floor_ms == pytest.approx(max(bytes_ms, compute))
    # the 15W mode gates 5 of 8 TPCs at a third of the clock: its FLOPs take 8.5x longer
    ratio = decode_compute_ms(model, capped) / decode_compute_ms(model, maxn)
    assert ratio == pytest.approx(42.5 / 5.0)
    assert decode_compute_ms(model, DEVICES["thor-t5000"]) is None  # no FP16 peak figure


def test_the_7w_mode_is_compute_bound_where_15w_is_not_slower_by_bandwidth() -> None:
    # same EMC cap (68 GB/s) in both modes: only the compute term can tell them apart
    fifteen = table_calibration("llamacpp-cuda", "orin-nano-8gb")
    assert DEVICES["orin-nano-8gb"].bandwidth_gbps == DEVICES["orin-nano-8gb-7w"].bandwidth_gbps
    ratio = compute_ratio("llamacpp-cuda", "orin-nano")
    assert ratio in RATIO_GRID and ratio > 0
    model = facts_from_preset("qwen2.5-0.5b", quant="Q4_K_M")
    seven = predict_floor(model, DEVICES["orin-nano-8gb-7w"])
    assert ratio * (seven.itl_compute_floor_ms or 0) > seven.itl_floor_ms
    assert fifteen.scope == "setup" and fifteen.compute_ratio == 0  # its own rows calibrate it


def test_a_mode_without_rows_is_predicted_from_the_modules_other_modes() -> None:
    model = facts_from_preset("qwen2.5-0.5b", quant="Q4_K_M")
    preds = {}
    for sheet in power_modes_of("orin-agx-64gb"):
        cal = table_calibration("llamacpp-cuda", sheet.id)
        preds[sheet.power_mode] = predict_target(model, sheet, cal)
    assert {"MAXN", "15W", "30W", "50W"} <= set(preds)
    for mode in ("15W", "30W", "50W"):
        cal = preds[mode].calibration
        assert cal["scope"] == "module" and cal["decode_compute_ratio"] > 0
    # fewer TPCs at lower clocks: the capped modes are slower, 15W slowest
    assert preds["15W"].itl_pred_ms > preds["30W"].itl_pred_ms > preds["50W"].itl_pred_ms
    assert preds["30W"].decode_bound == "compute"


def test_leave_one_mode_out_beats_the_bandwidth_alone() -> None:
    result = validate_modes()
    assert result["predicted"] >= 24
    assert result["median_abs_error"] < result["bandwidth_only_median_abs_error"]
    assert result["max_abs_error"] < result["bandwidth_only_max_abs_error"]
    # each held-out mode's ratio is fitted without that mode
    seven = [r for r in result["rows"] if r["device"] == "orin-nano-8gb-7w"]
    assert seven and all(r["ratio"] > 0 for r in seven)


def test_ratio_needs_a_source_with_three_modes() -> None:
    rows = [r for r in load_table() if "smolhub" not in r.source]
    assert fit_compute_ratio(rows, "llamacpp-cuda", "orin-nano") is None
    # the MLC source measured two modes only
    assert fit_compute_ratio(load_table(), "mlc", "orin-nano") is None
