"""``predict_with_interval``: point, 80% interval and the published rows behind a prediction."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from robot_latency.floor.errors import CalibrationError, UnsupportedArchitectureError
from robot_latency.floor.published import family_interval, table_calibration
from robot_latency.floor.target import predict_with_interval


def test_small_model_on_an_orin_nano() -> None:
    p = predict_with_interval("orin-nano-8gb", "llamacpp-cuda", "qwen3-0.6b", "Q8_0",
                              context_tokens=512)
    lo, hi = p.itl_interval_ms
    assert p.itl_floor_ms <= lo < p.itl_pred_ms < hi
    # the source measured this model in its other power modes: they move it, and the interval is
    # that of predictions made the same way
    assert set(p.model_basis) == {"smolhub-7w-qwen3-0.6b", "smolhub-25w-qwen3-0.6b",
                                  "smolhub-maxn-qwen3-0.6b"}
    assert p.model_factor != 1.0 and any(n.startswith("model: x") for n in p.notes)
    rel_lo, rel_hi = family_interval("llamacpp-cuda", model_seen=True)
    # every row of the 15W mode is smolhub's: one source, the interval widened by the family's
    # leave-one-source-out error on each side
    wide = table_calibration("llamacpp-cuda", "orin-nano-8gb").source_widening_rel
    assert wide > 0
    assert hi == pytest.approx(p.itl_pred_ms * (1 + rel_hi + wide))
    assert lo == pytest.approx(max(p.itl_floor_ms, p.itl_pred_ms * (1 + rel_lo - wide)))
    assert p.scope == "setup" and all(b.startswith("smolhub-15w-") for b in p.basis)
    assert p.nearest_rows[0].model == "qwen3-0.6b" and p.nearest_rows[0].device == "orin-nano-8gb"
    out = p.to_dict()
    assert json.loads(json.dumps(out))["nearest_rows"][0]["id"] == p.nearest_rows[0].id


def test_a_model_the_table_never_measured_gets_the_new_model_interval() -> None:
    p = predict_with_interval("orin-nano-8gb", "llamacpp-cuda", "qwen3-1.7b")
    assert p.model_factor == 1.0 and p.model_basis == ()
    rel_lo, rel_hi = family_interval("llamacpp-cuda")
    wide = table_calibration("llamacpp-cuda", "orin-nano-8gb").source_widening_rel
    assert p.itl_interval_ms[1] == pytest.approx(p.itl_pred_ms * (1 + rel_hi + wide))
    # a model never measured is less certain than one measured in other power modes
    seen_lo, seen_hi = family_interval("llamacpp-cuda", model_seen=True)
    assert rel_hi - rel_lo > seen_hi - seen_lo


def test_more_context_and_a_bigger_model_take_longer() -> None:
    short = predict_with_interval("orin-nano-8gb-super", "llamacpp-cuda", "qwen3-1.7b")
    long = predict_with_interval("orin-nano-8gb-super", "llamacpp-cuda", "qwen3-1.7b",
                                 context_tokens=4096)
    big = predict_with_interval("orin-nano-8gb-super", "llamacpp-cuda", "qwen3-4b")
    assert short.itl_pred_ms < long.itl_pred_ms and short.itl_pred_ms < big.itl_pred_ms


def test_config_json_and_refusals(tmp_path: Path) -> None:
    cfg = {"model_type": "llama", "hidden_size": 2048, "num_attention_heads": 32,
           "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 8192,
           "num_hidden_layers": 16, "vocab_size": 128256, "tie_word_embeddings": True}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    from_file = predict_with_interval("orin-nano-8gb-super", "llamacpp-cuda", str(path))
    assert from_file.itl_pred_ms > from_file.itl_floor_ms > 0
    with pytest.raises(UnsupportedArchitectureError, match="hybrid"):
        predict_with_interval("orin-nano-8gb", "llamacpp-cuda", "lfm2.5-1.2b")
    with pytest.raises(CalibrationError, match="too few vllm rows"):
        predict_with_interval("orin-nano-8gb", "vllm", "qwen3-0.6b")
