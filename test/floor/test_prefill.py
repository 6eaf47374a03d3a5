"""The published prefill table, the prefill floor, the fitted prefill terms and their validation."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from robot_latency.floor.devices import DEVICES
from robot_latency.floor.errors import TableError
from robot_latency.floor.modelinfo import facts_from_preset
from robot_latency.floor.predict import ttft_floor
from robot_latency.floor.published import table_calibration
from robot_latency.floor.published_checks import validate_prefill
from robot_latency.floor.published_prefill import (
    default_prefill_path,
    load_prefill_table,
    prefill_fit,
    prefill_not_predicted_reason,
    prefill_point,
    prefill_row_floor,
)
from robot_latency.floor.target import predict_target


def test_shipped_table_sources_and_floor() -> None:
    rows = load_prefill_table()
    assert len(rows) >= 12
    assert len({r.source for r in rows}) >= 3 and len({r.device for r in rows}) >= 3
    for r in rows:
        assert r.url.startswith("https://") and r.prompt_tokens > 0 and r.engine
        # a floor is a bound: it never exceeds a measurement
        assert prefill_row_floor(r).floor_ms <= r.measured_ms, r.id
    assert any(prefill_not_predicted_reason(r) for r in rows)  # Thor: no FLOP/s figure


def test_ttft_floor_is_the_longer_of_weights_and_compute() -> None:
    model = facts_from_preset("llama-3.2-1b", quant="Q4_K_M")
    dev = DEVICES["orin-nano-8gb"]
    short, long_ = ttft_floor(model, dev, 1), ttft_floor(model, dev, 4096)
    assert short.compute_ms is not None and short.compute_ms < short.weights_ms
    assert short.floor_ms == short.weights_ms  # one token: reading the weights bounds it
    assert long_.compute_ms is not None and long_.floor_ms == long_.compute_ms > long_.weights_ms
    assert ttft_floor(model, dev, 0).floor_ms == 0.0


def test_prediction_never_below_the_prefill_floor() -> None:
    dev = DEVICES["orin-nano-8gb"]
    model = facts_from_preset("qwen2.5-0.5b", quant="Q4_K_M")
    cal = table_calibration("llamacpp-cuda", dev.id)
    # terms that would put the prefill far below what reading the weights once takes
    fast = replace(cal, compute_efficiency=1e6, prefill_overhead_ms=0.0)
    for tokens in (1, 16, 512):
        pred = predict_target(model, dev, fast, prompt_tokens=tokens)
        assert pred.ttft_floor_ms == ttft_floor(model, dev, tokens).floor_ms
        assert pred.ttft_pred_ms == pred.ttft_floor_ms
        assert pred.ttft_pred_interval_ms is not None
        assert pred.ttft_pred_interval_ms[0] >= pred.ttft_floor_ms
    real = predict_target(model, dev, cal, prompt_tokens=512)
    lo, hi = real.ttft_pred_interval_ms
    assert real.ttft_floor_ms <= lo <= real.ttft_pred_ms <= hi


def test_prefill_calibrated_from_the_table_or_said_uncalibrated() -> None:
    dev = DEVICES["orin-nano-8gb"]
    model = facts_from_preset("llama-3.2-1b", quant="Q4_K_M")
    cal = table_calibration("llamacpp-cuda", dev.id)
    assert cal.prefill_calibrated and cal.prefill_basis and cal.prefill_interval_rel
    pred = predict_target(model, dev, cal, prompt_tokens=2048)
    assert pred.prefill_calibrated and pred.prefill_status.startswith("prefill calibrated")
    # smolhub's 15W Llama-3.2-1B at 2048 tokens is in the fit: the answer is near it
    assert 1431.49 * 0.7 < pred.ttft_pred_ms < 1431.49 * 1.3
    mlc = table_calibration("mlc", dev.id)  # no MLC prefill row in the table
    pred = predict_target(model, dev, mlc, prompt_tokens=512)
    assert not pred.prefill_calibrated and pred.ttft_pred_interval_ms is None
    assert "prefill uncalibrated" in pred.prefill_status
    assert "prefill uncalibrated" in pred.to_dict()["calibration"]["prefill"]
    # the decode overhead is not passed off as the prefill's
    assert mlc.prefill_overhead_ms == 0.0 and mlc.overhead_ms > 0


def test_prefill_fit_recovers_exact_terms() -> None:
    rows = [r for r in load_prefill_table() if r.setup_id == "smolhub-25w"]
    exact = [replace(r, metric="prefill_ms",
                     value=prefill_point(r).compute_floor_ms / 0.4 + 50.0) for r in rows]
    prefill_point.cache_clear()
    fit = prefill_fit("llamacpp-cuda", "orin-nano-8gb-super-25w", rows=exact)
    assert fit is not None and fit.scope == "setup"
    assert fit.compute_efficiency == pytest.approx(0.4) and fit.overhead_ms == pytest.approx(50)
    assert prefill_fit("mlc", "orin-nano-8gb", rows=exact) is None


def test_validation_meets_its_targets() -> None:
    out = validate_prefill()
    f = out["by_family"]["llamacpp-cuda"]
    assert f["predicted"] >= 12
    assert f["median_abs_error"] <= 0.20 and f["coverage_80"] >= 0.75
    assert f["inside_80"] == sum(1 for r in out["rows"] if r.get("inside_interval"))
    thor = [r for r in out["rows"] if r["device"] == "thor-t5000"]
    assert thor and all(r["predicted_ms"] is None and "FLOP/s" in r["reason"] for r in thor)


def _write(tmp_path: Path, edit: object) -> Path:
    doc = yaml.safe_load(default_prefill_path().read_text(encoding="utf-8"))
    edit(doc)  # type: ignore[operator]
    path = tmp_path / "prefill.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


@pytest.mark.parametrize(("edit", "match"), [
    (lambda d: d["setups"][0]["rows"][0].pop("prompt_tokens"), r"row 1: missing .*prompt_tokens"),
    (lambda d: d["setups"][0].update(device="orin-mega"), "unknown device 'orin-mega'"),
    (lambda d: d["setups"][0].update(metric="tok_per_joule"), "unknown metric"),
    (lambda d: d["setups"][0]["rows"][0].update(value=-3), "value must be > 0"),
    (lambda d: d["setups"][0]["rows"][0].update(model="gpt-9"), "unknown model preset"),
    (lambda d: d["setups"][0].update(url="http://x"), "https"),
])
def test_bad_table_names_file_setup_and_field(tmp_path: Path, edit: object, match: str) -> None:
    path = _write(tmp_path, edit)
    with pytest.raises(TableError, match=match) as err:
        load_prefill_table(path)
    assert str(path) in str(err.value) and "setup 'smolhub-7w'" in str(err.value)
