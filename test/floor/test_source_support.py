"""An answer that rests on one source: its interval widened by the family's leave-one-source-out
error, the sources counted; one that rests on several: unchanged. Decode and TTFT alike."""

from __future__ import annotations

import statistics
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


def test_a_single_prefill_source_widens_the_ttft_interval_by_exactly_the_stated_error() -> None:
    # every prefill row of the 7W mode is smolhub's: the TTFT answer rests on one source
    from robot_latency.floor.published_checks import validate_prefill
    from robot_latency.floor.published_prefill import prefill_interval

    cal = table_calibration("llamacpp-cuda", "orin-nano-8gb-7w")
    assert cal.prefill_calibrated and cal.prefill_sources == (SMOLHUB,)
    lo, hi = prefill_interval("llamacpp-cuda")
    error = validate_prefill()["by_family"]["llamacpp-cuda"]["new_source_median_abs_error"]
    assert error > 0.05
    assert cal.prefill_source_widening_rel == error
    assert cal.prefill_interval_rel == (max(-0.99, lo - error), hi + error)
    assert any("prefill rests on one source" in n and f"{100 * error:.1f}%" in n
               for n in cal.prefill_notes)
    described = cal.describe()
    assert described["prefill_source_count"] == 1
    assert described["prefill_source_widening_rel"] == error
    # the TTFT interval in ms: wider than the unwidened one by the error on each side
    model = facts_from_preset("qwen2.5-0.5b", quant="Q4_K_M")
    device = DEVICES["orin-nano-8gb-7w"]
    pred = predict_target(model, device, cal, prompt_tokens=300)
    plain = predict_target(model, device, replace(cal, prefill_interval_rel=(lo, hi)),
                           prompt_tokens=300)
    assert pred.ttft_pred_ms == plain.ttft_pred_ms and pred.ttft_pred_interval_ms is not None
    assert plain.ttft_pred_interval_ms is not None
    assert pred.ttft_pred_interval_ms[1] - plain.ttft_pred_interval_ms[1] == pytest.approx(
        error * pred.ttft_pred_ms)
    assert pred.ttft_pred_interval_ms[0] <= plain.ttft_pred_interval_ms[0]


def test_a_second_prefill_source_on_the_device_removes_the_ttft_widening() -> None:
    from robot_latency.floor.published_prefill import load_prefill_table, prefill_interval

    prefill = load_prefill_table()
    # every smolhub prefill row on the 7W mode again under another source's name: a second
    # source behind the device's TTFT answer
    twin = [replace(r, id=f"{r.id}-twin", source="a second source", url="https://example.org")
            for r in prefill if r.source == SMOLHUB and r.device == "orin-nano-8gb-7w"]
    assert twin
    rows = [*prefill, *twin]
    cal = table_calibration("llamacpp-cuda", "orin-nano-8gb-7w", prefill_rows=rows)
    assert cal.prefill_sources == ("a second source", SMOLHUB)
    assert cal.prefill_source_widening_rel == 0.0
    assert cal.prefill_interval_rel == prefill_interval("llamacpp-cuda", rows=rows)
    assert not any("prefill rests on one source" in n for n in cal.prefill_notes)
    # the decode answer is the decode table's: still one source, still widened
    assert cal.source_widening_rel > 0



def test_a_family_of_one_prefill_source_takes_the_pooled_error() -> None:
    from robot_latency.floor.published_checks import validate_prefill
    from robot_latency.floor.published_prefill import load_prefill_table
    from robot_latency.floor.published_support import prefill_loso_error

    prefill = load_prefill_table()
    # the 7W mode's rows again as another family's, all from smolhub: no row of that family can
    # be predicted without its source, so every family's pooled error stands in (and says so)
    mlc = [replace(r, id=f"{r.id}-mlc", engine_family="mlc")
           for r in prefill if r.source == SMOLHUB and r.device == "orin-nano-8gb-7w"]
    rows = [*prefill, *mlc]
    checked = validate_prefill(rows)
    assert checked["by_family"]["mlc"]["new_source_median_abs_error"] is None
    pooled = statistics.median(abs(r["new_source_error_rel"]) for r in checked["rows"]
                               if r.get("new_source_error_rel") is not None)
    error, what = prefill_loso_error("mlc", rows)
    assert error == pytest.approx(pooled)
    assert "pooled over every family" in what and "mlc has none of its own" in what


def test_an_uncalibrated_prefill_counts_no_source_and_widens_nothing() -> None:
    from robot_latency.floor.published_prefill import load_prefill_table

    no_mlc = [r for r in load_prefill_table() if r.engine_family != "mlc"]
    cal = table_calibration("mlc", "orin-nano-8gb", prefill_rows=no_mlc)
    assert not cal.prefill_calibrated and cal.prefill_interval_rel is None
    assert cal.prefill_sources == () and cal.prefill_source_widening_rel == 0.0


def test_the_stream_answer_says_the_ttft_rests_on_one_source() -> None:
    from types import SimpleNamespace

    from robot_latency.floor.steps import step_predictor
    from robot_latency.report.target_answer import rests_on

    model = facts_from_preset("qwen2.5-0.5b", quant="Q4_K_M")
    one = table_calibration("llamacpp-cuda", "orin-nano-8gb-7w")
    two = table_calibration("llamacpp-cuda", "orin-nano-8gb-super")
    assert len(two.prefill_sources) == 2 and two.prefill_source_widening_rel == 0.0
    for cal, device in ((one, "orin-nano-8gb-7w"), (two, "orin-nano-8gb-super")):
        described = step_predictor(model, DEVICES[device], cal).describe()
        assert described["prefill_source_count"] == len(cal.prefill_sources)
        assert described["prefill_source_widening_rel"] == cal.prefill_source_widening_rel
        line = rests_on(SimpleNamespace(rests_on=described, label="Q4_K_M", draws=10,
                                        facts={}))  # type: ignore[arg-type]
        widened = f"the TTFT interval widened by {100 * cal.prefill_source_widening_rel:.1f}%"
        assert (widened in line) == (cal is one)
