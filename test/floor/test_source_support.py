"""An answer that rests on one source: its interval widened by the family's leave-one-source-out
error, the sources counted; one that rests on several: unchanged."""

from __future__ import annotations

from dataclasses import replace

import pytest

from robot_latency.floor.devices import DEVICES
from robot_latency.floor.modelinfo import facts_from_preset
from robot_latency.floor.published import family_interval, load_table, table_calibration
from robot_latency.floor.published_checks import leave_one_source_out
from robot_latency.floor.target import predict_target

SMOLHUB = "smolhub tiny-LLM benchmark (Orin Nano Super, llama.cpp, 4 power modes)"


def test_a_single_source_device_is_widened_by_exactly_the_stated_error() -> None:
    cal = table_calibration("llamacpp-cuda", "orin-nano-8gb-7w")
    assert cal.answer_sources == (SMOLHUB,)
    lo, hi = family_interval("llamacpp-cuda")
    error = leave_one_source_out()["by_family"]["llamacpp-cuda"]["median_abs_error"]
    assert error > 0.05
    assert cal.source_widening_rel == error
    assert cal.interval_rel == (lo - error, hi + error)
    assert any("rests on one source" in n and f"{100 * error:.1f}%" in n for n in cal.notes)
    described = cal.describe()
    assert described["source_count"] == 1 and described["source_widening_rel"] == error
    # the prediction's interval in ms: wider than the unwidened one by the error on each side
    model = facts_from_preset("qwen2.5-0.5b", quant="Q4_K_M")
    pred = predict_target(model, DEVICES["orin-nano-8gb-7w"], cal)
    plain = predict_target(model, DEVICES["orin-nano-8gb-7w"],
                           replace(cal, interval_rel=(lo, hi)))
    assert pred.itl_pred_ms == plain.itl_pred_ms
    assert pred.itl_pred_interval_ms[1] - plain.itl_pred_interval_ms[1] == pytest.approx(
        error * pred.itl_pred_ms)
    assert pred.itl_pred_interval_ms[0] < plain.itl_pred_interval_ms[0]


def test_a_multi_source_device_is_unchanged() -> None:
    cal = table_calibration("llamacpp-cuda", "orin-agx-64gb")
    assert len(cal.answer_sources) >= 2
    assert cal.source_widening_rel == 0.0
    assert cal.interval_rel == family_interval("llamacpp-cuda")
    assert not any("rests on one source" in n for n in cal.notes)


def test_a_second_source_on_the_device_removes_the_widening() -> None:
    table = load_table()
    # every smolhub row again under another source's name, 5% slower: as far from the other
    # sources as smolhub is, so not flagged, and a second source on the 7W mode
    twin = [replace(r, id=f"{r.id}-twin", source="a second source", url="https://example.org",
                    tok_s=r.tok_s * 0.95, published_itl_ms=None)
            for r in table if r.source == SMOLHUB]
    assert any(r.device == "orin-nano-8gb-7w" for r in twin)
    cal = table_calibration("llamacpp-cuda", "orin-nano-8gb-7w", rows=[*table, *twin])
    assert cal.answer_sources == ("a second source", SMOLHUB)
    assert cal.source_widening_rel == 0.0 and not cal.set_aside
    assert cal.interval_rel == family_interval("llamacpp-cuda", rows=[*table, *twin])
