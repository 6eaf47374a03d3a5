"""Bandwidth-floor predictions: decode step, prefill, memory fit and speculative decoding.

The formulas are those of docs/REFERENCE.md, "The latency model" and "Speculative decoding".
Units: GB = 1e9 bytes, GB/s = 1e9 bytes/s, TFLOPS = 1e12 FLOP/s, as device datasheets use them.

    t_step    >= max((W + B * KV_seq) / BW, B * 2 * params / peak_FLOPs)
    t_prefill >= 2 * params * prompt_tokens / (efficiency * peak_FLOPs)
    E[tokens/round] = (1 - a^(k+1)) / (1 - a);  cost = k*c + 1 + k*v;  speedup = E / cost
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from robot_latency.floor.devices import DeviceSheet
from robot_latency.floor.errors import FloorError
from robot_latency.floor.modelinfo import ModelFacts

#: Largest draft length searched for the best k (issue: k = 1..16).
MAX_DRAFT_K = 16


@dataclass(frozen=True)
class FloorPrediction:
    """What the bandwidth floor allows one model on one device (all bytes, ms, tokens/s)."""

    device_id: str
    device_name: str
    model_name: str
    quant: str | None
    batch: int
    context_tokens: int
    bandwidth_gbps: float
    weight_bytes_per_step: int
    kv_bytes_per_token: int
    kv_bytes_per_seq: int
    bytes_per_step: int
    itl_floor_ms: float
    throughput_floor_tok_s: float
    weight_bytes_total: int
    draft_weight_bytes: int
    draft_kv_bytes_per_seq: int
    memory_needed_bytes: int
    memory_bytes: int
    fits_in_memory: bool
    prompt_tokens: int | None = None
    compute_efficiency: float | None = None
    peak_flops: float | None = None
    prefill_floor_ms: float | None = None
    #: The decode step's FLOPs at the device's peak (None: no peak figure); ``itl_floor_ms`` is
    #: the slower of this and the bytes at the bandwidth, ``decode_bound`` says which.
    itl_compute_floor_ms: float | None = None
    decode_bound: str = "bandwidth"

    def to_dict(self) -> dict[str, Any]:
        """Return the stable machine-readable form (None for what was not asked)."""
        return asdict(self)


def _check_positive(name: str, value: float, *, allow_zero: bool = False) -> None:
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise FloorError(f"{name} must be a finite number {bound}, got {value!r}")


def decode_step_floor_s(weight_bytes_per_step: int, kv_bytes_per_seq: int, *, batch: int,
                        bandwidth_gbps: float) -> float:
    """Return the lower bound on one decode step in seconds: (W + B * KV_seq) / BW.

    Args:
        weight_bytes_per_step: bytes of weights one step reads (W).
        kv_bytes_per_seq: KV-cache bytes of one sequence at its current length (KV_seq).
        batch: sequences decoded together (B; the robot runs 1).
        bandwidth_gbps: memory read bandwidth in GB/s (1e9 bytes/s).
    """
    _check_positive("weight_bytes_per_step", weight_bytes_per_step, allow_zero=True)
    _check_positive("kv_bytes_per_seq", kv_bytes_per_seq, allow_zero=True)
    _check_positive("batch", batch)
    _check_positive("bandwidth_gbps", bandwidth_gbps)
    return (weight_bytes_per_step + batch * kv_bytes_per_seq) / (bandwidth_gbps * 1e9)


def prefill_floor_s(params: int, prompt_tokens: int, *, peak_flops: float,
                    efficiency: float = 1.0) -> float:
    """Return the compute-bound lower bound on a prefill: 2 * params * tokens / (eff * FLOP/s)."""
    _check_positive("params", params)
    _check_positive("prompt_tokens", prompt_tokens, allow_zero=True)
    _check_positive("peak_flops", peak_flops)
    if not 0 < efficiency <= 1:
        raise FloorError(f"compute efficiency must be in (0, 1], got {efficiency!r}")
    return 2.0 * params * prompt_tokens / (efficiency * peak_flops)


def memory_needed_bytes(weight_bytes_total: int, kv_bytes_per_seq: int, *, batch: int = 1,
                        draft_weight_bytes: int = 0, draft_kv_bytes_per_seq: int = 0) -> int:
    """Return the bytes that must fit: weights + B * KV_seq, plus a draft's weights and KV."""
    return int(weight_bytes_total + batch * kv_bytes_per_seq
               + draft_weight_bytes + batch * draft_kv_bytes_per_seq)


def predict_floor(model: ModelFacts, device: DeviceSheet, *, batch: int = 1,
                  context_tokens: int = 0, prompt_tokens: int | None = None,
                  compute_efficiency: float = 1.0,
                  draft: ModelFacts | None = None) -> FloorPrediction:
    """Predict the decode, prefill and memory floors of ``model`` on ``device``.

    Args:
        model: the target model's facts.
        device: the device's datasheet (bandwidth, memory, FLOP/s).
        batch: sequences decoded together.
        context_tokens: tokens in each sequence's KV cache (0: the weights-only floor).
        prompt_tokens: if given, also predict the prefill floor for this many tokens.
        compute_efficiency: fraction of the device's peak FLOP/s a prefill reaches.
        draft: a draft model whose weights and KV count in the memory fit.

    Raises:
        FloorError: a value out of range, or a prefill asked of a device without a FLOP/s figure.
    """
    _check_positive("batch", batch)
    _check_positive("context_tokens", context_tokens, allow_zero=True)
    kv_seq = model.kv_bytes_per_token * context_tokens
    bytes_s = decode_step_floor_s(model.weight_bytes_per_step, kv_seq, batch=batch,
                                  bandwidth_gbps=device.bandwidth_gbps)
    compute_ms = decode_compute_ms(model, device, batch=batch)
    step_s = max(bytes_s, (compute_ms or 0.0) / 1e3)
    draft_weights = draft.weight_bytes_total if draft is not None else 0
    draft_kv = draft.kv_bytes_per_token * context_tokens if draft is not None else 0
    needed = memory_needed_bytes(model.weight_bytes_total, kv_seq, batch=batch,
                                 draft_weight_bytes=draft_weights,
                                 draft_kv_bytes_per_seq=draft_kv)
    prefill_ms: float | None = None
    peak = device.peak_flops
    if prompt_tokens is not None:
        if peak is None:
            raise FloorError(f"device {device.id!r} has no FLOP/s figure; "
                             "cannot predict a prefill floor on it")
        if device.flops_is_peak:
            prefill_ms = 1e3 * prefill_floor_s(prefill_params(model), prompt_tokens,
                                               peak_flops=peak, efficiency=compute_efficiency)
        # else: a measured sustained rate is no bound; the prefill is left to a calibrated
        # prediction (robot_latency.floor.target), never called a floor.
    return FloorPrediction(
        device_id=device.id,
        device_name=device.name,
        model_name=model.name,
        quant=model.quant,
        batch=batch,
        context_tokens=context_tokens,
        bandwidth_gbps=device.bandwidth_gbps,
        weight_bytes_per_step=model.weight_bytes_per_step,
        kv_bytes_per_token=model.kv_bytes_per_token,
        kv_bytes_per_seq=kv_seq,
        bytes_per_step=model.weight_bytes_per_step + batch * kv_seq,
        itl_floor_ms=step_s * 1e3,
        throughput_floor_tok_s=batch / step_s if step_s > 0 else math.inf,
        weight_bytes_total=model.weight_bytes_total,
        draft_weight_bytes=draft_weights,
        draft_kv_bytes_per_seq=draft_kv,
        memory_needed_bytes=needed,
        memory_bytes=device.memory_bytes,
        fits_in_memory=needed <= device.memory_bytes,
        prompt_tokens=prompt_tokens,
        compute_efficiency=compute_efficiency if prompt_tokens is not None else None,
        peak_flops=peak if prompt_tokens is not None else None,
        prefill_floor_ms=prefill_ms,
        itl_compute_floor_ms=compute_ms,
        decode_bound="compute" if step_s > bytes_s else "bandwidth",
    )


def decode_compute_ms(model: ModelFacts, device: DeviceSheet, *, batch: int = 1) -> float | None:
    """Return one decode step's FLOPs (``2 * params`` per sequence) at the device's peak, in ms.

    None where the device has no peak figure, or a measured sustained rate that is no bound.
    A power mode that gates TPCs and caps the GPU clock lowers the peak (its datasheet's
    ``fp16_tflops``), so in capped modes this term grows while the bytes term may not.
    """
    peak = device.peak_flops
    if peak is None or not device.flops_is_peak:
        return None
    return 2.0 * prefill_params(model) * batch / peak * 1e3


def prefill_params(model: ModelFacts) -> int:
    """Return the parameters that do arithmetic per prompt token.

    The token-embedding table is a row lookup, not a matmul, so an untied model's embedding does
    not count; a tied one is used as the output head and does. The per-step weight bytes already
    make that split, so scale the total parameter count by it.
    """
    if model.weight_bytes_total <= 0:
        return model.params
    share = model.weight_bytes_per_step / model.weight_bytes_total
    return max(1, round(model.params * share))


@dataclass(frozen=True)
class SpecDecEstimate:
    """The expected gain of speculative decoding at batch 1.

    docs/REFERENCE.md, "Speculative decoding".
    """

    alpha: float
    k: int
    c: float
    v: float
    expected_tokens_per_round: float
    cost_per_round: float
    speedup: float
    best_k: int
    best_speedup: float

    def to_dict(self) -> dict[str, Any]:
        """Return the stable machine-readable form."""
        return asdict(self)


def expected_tokens_per_round(alpha: float, k: int) -> float:
    """Return E = (1 - alpha^(k+1)) / (1 - alpha): tokens per round (k + 1 at alpha = 1)."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def specdec_speedup(alpha: float, k: int, c: float, v: float = 0.0) -> float:
    """Return E / (k*c + 1 + k*v): the speedup over the target alone, in target-pass units."""
    return expected_tokens_per_round(alpha, k) / (k * c + 1.0 + k * v)


def specdec_estimate(alpha: float, k: int, c: float, v: float = 0.0, *,
                     max_k: int = MAX_DRAFT_K) -> SpecDecEstimate:
    """Estimate speculative decoding at draft length ``k`` and find the best k in 1..max_k.

    Args:
        alpha: per-token acceptance probability, in [0, 1].
        k: tokens drafted per round, >= 1.
        c: draft cost per token over target cost per pass, >= 0.
        v: extra verify cost per drafted token over one target pass, >= 0.
        max_k: largest k searched for ``best_k``.

    Raises:
        FloorError: a value out of range (named in the message).
    """
    if not (math.isfinite(alpha) and 0.0 <= alpha <= 1.0):
        raise FloorError(f"alpha must be in [0, 1], got {alpha!r}")
    if k < 1:
        raise FloorError(f"k must be >= 1, got {k!r}")
    _check_positive("c", c, allow_zero=True)
    _check_positive("v", v, allow_zero=True)
    if max_k < 1:
        raise FloorError(f"max_k must be >= 1, got {max_k!r}")
    # Ties go to the smaller k: same speedup for less drafting work.
    best_k = max(range(1, max_k + 1), key=lambda kk: (specdec_speedup(alpha, kk, c, v), -kk))
    return SpecDecEstimate(
        alpha=alpha,
        k=k,
        c=c,
        v=v,
        expected_tokens_per_round=expected_tokens_per_round(alpha, k),
        cost_per_round=k * c + 1.0 + k * v,
        speedup=specdec_speedup(alpha, k, c, v),
        best_k=best_k,
        best_speedup=specdec_speedup(alpha, best_k, c, v),
    )


@dataclass(frozen=True)
class TTFTFloor:
    """The lower bound on a prefill of ``prompt_tokens``: it reads every weight matrix once and
    does ``2 * params`` FLOPs per prompt token, so it takes at least the longer of the two.

    ``compute_ms`` is None on a device without a peak FLOP/s figure (or with a measured sustained
    rate, which is no bound): the floor is then the weights alone.
    """

    prompt_tokens: int
    weights_ms: float
    compute_ms: float | None

    @property
    def floor_ms(self) -> float:
        """The floor: ``max(weights read once, prompt compute)``."""
        return max(self.weights_ms, self.compute_ms or 0.0)


def ttft_floor(model: ModelFacts, device: DeviceSheet, prompt_tokens: int) -> TTFTFloor:
    """Return the prefill floor of ``prompt_tokens`` uncached tokens of ``model`` on ``device``.

    Raises:
        FloorError: a negative prompt length.
    """
    _check_positive("prompt_tokens", prompt_tokens, allow_zero=True)
    weights_ms = model.weight_bytes_per_step / (device.bandwidth_gbps * 1e9) * 1e3
    compute_ms = None
    if device.peak_flops and device.flops_is_peak:
        compute_ms = 2.0 * prefill_params(model) * prompt_tokens / device.peak_flops * 1e3
    return TTFTFloor(prompt_tokens, weights_ms if prompt_tokens else 0.0, compute_ms)
