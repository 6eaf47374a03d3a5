"""The floor formulas against hand-worked cases.

docs/REFERENCE.md, "The latency model" and "Speculative decoding".
"""

from __future__ import annotations

import math

import pytest

from robot_latency.floor.devices import DEVICES
from robot_latency.floor.errors import FloorError
from robot_latency.floor.modelinfo import facts_from_preset, facts_manual
from robot_latency.floor.predict import (
    decode_step_floor_s,
    expected_tokens_per_round,
    memory_needed_bytes,
    predict_floor,
    prefill_floor_s,
    specdec_estimate,
    specdec_speedup,
)


def test_decode_floor_weights_only() -> None:
    # 1 GB of weights over 100 GB/s: 10 ms per token.
    assert decode_step_floor_s(10**9, 0, batch=1, bandwidth_gbps=100.0) == pytest.approx(0.010)


def test_decode_floor_counts_kv_per_sequence() -> None:
    # (1e9 + 2 * 0.5e9) bytes / 100e9 B/s = 20 ms.
    t = decode_step_floor_s(10**9, 5 * 10**8, batch=2, bandwidth_gbps=100.0)
    assert t == pytest.approx(0.020)


def test_prefill_floor_hand_worked() -> None:
    # 2 * 1e9 params * 100 tokens / (0.5 * 1e14 FLOP/s) = 4 ms.
    t = prefill_floor_s(10**9, 100, peak_flops=1e14, efficiency=0.5)
    assert t == pytest.approx(0.004)


@pytest.mark.parametrize("eff", [0.0, -0.1, 1.5])
def test_prefill_rejects_bad_efficiency(eff: float) -> None:
    with pytest.raises(FloorError, match="efficiency"):
        prefill_floor_s(10**9, 10, peak_flops=1e12, efficiency=eff)


def test_decode_rejects_zero_bandwidth() -> None:
    with pytest.raises(FloorError, match="bandwidth_gbps"):
        decode_step_floor_s(10**9, 0, batch=1, bandwidth_gbps=0.0)


def test_memory_needed_adds_draft_and_batch() -> None:
    assert memory_needed_bytes(100, 10, batch=3, draft_weight_bytes=7,
                               draft_kv_bytes_per_seq=2) == 100 + 30 + 7 + 6


def test_predict_floor_manual_model_on_orin_nano() -> None:
    # 1e9 params at 4 bits = 0.5 GB read per step; Orin Nano 8GB: 68 GB/s.
    model = facts_manual(params=10**9, weight_bits=4.0, kv_bytes_per_token=1000)
    pred = predict_floor(model, DEVICES["orin-nano-8gb"], context_tokens=1000)
    assert pred.weight_bytes_per_step == 5 * 10**8
    assert pred.kv_bytes_per_seq == 10**6
    assert pred.itl_floor_ms == pytest.approx((5e8 + 1e6) / 68e9 * 1e3)
    assert pred.throughput_floor_tok_s == pytest.approx(68e9 / (5e8 + 1e6))
    assert pred.memory_needed_bytes == 5 * 10**8 + 10**6
    assert pred.fits_in_memory is True
    assert pred.prefill_floor_ms is None


def test_predict_floor_memory_does_not_fit() -> None:
    # 8e9 params at 16 bits = 16 GB: no room on an 8 GB module.
    model = facts_manual(params=8 * 10**9, weight_bits=16.0, kv_bytes_per_token=0)
    pred = predict_floor(model, DEVICES["orin-nano-8gb"])
    assert pred.fits_in_memory is False
    assert pred.memory_needed_bytes == 16 * 10**9


def test_draft_counts_in_memory_fit() -> None:
    target = facts_manual(params=10**9, weight_bits=8.0, kv_bytes_per_token=100)
    draft = facts_manual(params=10**8, weight_bits=8.0, kv_bytes_per_token=10)
    alone = predict_floor(target, DEVICES["orin-agx-64gb"], context_tokens=50)
    paired = predict_floor(target, DEVICES["orin-agx-64gb"], context_tokens=50, draft=draft)
    assert paired.memory_needed_bytes - alone.memory_needed_bytes == 10**8 + 10 * 50
    # The draft does not change the target's own decode floor.
    assert paired.itl_floor_ms == alone.itl_floor_ms


def test_prefill_on_a_device_uses_its_flops() -> None:
    model = facts_manual(params=10**9, weight_bits=4.0, kv_bytes_per_token=0)
    h100 = DEVICES["h100-sxm"]
    pred = predict_floor(model, h100, prompt_tokens=1000, compute_efficiency=0.5)
    assert pred.prefill_floor_ms == pytest.approx(2e9 * 1000 / (0.5 * 989e12) * 1e3)


def test_preset_qwen_floor_on_agx_orin() -> None:
    # Qwen2.5-0.5B is tied: per-step bytes include the embedding (read as the output head), so
    # they are nearly all the weights; the floor must sit between the weights-only bounds.
    model = facts_from_preset("qwen2.5-0.5b", quant="F16")
    pred = predict_floor(model, DEVICES["orin-agx-64gb"])
    assert model.tied_embeddings is True
    assert pred.weight_bytes_per_step > 0.9 * model.weight_bytes_total
    # ~0.49e9 params * 2 bytes / 204.8 GB/s ~ 4.8 ms
    assert 4.0 < pred.itl_floor_ms < 5.5


def test_expected_tokens_hand_worked() -> None:
    # (1 - 0.8^5) / 0.2 = 3.3616
    assert expected_tokens_per_round(0.8, 4) == pytest.approx(3.3616)
    assert expected_tokens_per_round(1.0, 4) == 5.0
    assert expected_tokens_per_round(0.0, 4) == 1.0


def test_speedup_hand_worked() -> None:
    # E = 3.3616, cost = 4 * 0.1 + 1 = 1.4
    assert specdec_speedup(0.8, 4, 0.1) == pytest.approx(3.3616 / 1.4)
    # verify cost per drafted token enters the cost: 4 * 0.1 + 1 + 4 * 0.05 = 1.6
    assert specdec_speedup(0.8, 4, 0.1, 0.05) == pytest.approx(3.3616 / 1.6)


def test_best_k_interior_optimum() -> None:
    # alpha 0.6, c 0.2: k=1 -> 1.6/1.2 = 1.333, k=2 -> 1.96/1.4 = 1.4, k=3 -> 2.176/1.6 = 1.36.
    est = specdec_estimate(0.6, 1, 0.2)
    assert est.best_k == 2
    assert est.best_speedup == pytest.approx(1.4)
    assert est.speedup == pytest.approx(1.6 / 1.2)


def test_best_k_free_draft_is_largest() -> None:
    est = specdec_estimate(0.5, 3, 0.0)
    assert est.best_k == 16
    assert est.best_speedup == pytest.approx((1 - 0.5**17) / 0.5)


def test_no_acceptance_means_k_1_and_a_slowdown() -> None:
    est = specdec_estimate(0.0, 4, 0.1)
    assert est.speedup == pytest.approx(1 / 1.4)
    assert est.best_k == 1
    assert est.best_speedup < 1.0


@pytest.mark.parametrize(("alpha", "k", "c", "name"), [
    (1.2, 4, 0.1, "alpha"), (-0.1, 4, 0.1, "alpha"), (math.nan, 4, 0.1, "alpha"),
    (0.5, 0, 0.1, "k"), (0.5, 4, -1.0, "c"),
])
def test_specdec_rejects_bad_values(alpha: float, k: int, c: float, name: str) -> None:
    with pytest.raises(FloorError, match=name):
        specdec_estimate(alpha, k, c)
