"""The image's cost on the target: the vision encoder's FLOPs, and its tokens through the prefill.

A vision-language planner pays for a camera frame twice before its first token: the vision
tower's pass over the frame (the encode), then the image tokens through the language model's
prefill. Both are compute-bound on a Jetson (docs/REFERENCE.md, "Vision-language planners").
This module predicts both for a device, an engine family's calibration and a tower at a
resolution::

    encode_ms        = encode FLOPs / (compute_efficiency * peak FLOP/s)   (+ vision fit, if any)
    image_prefill_ms = the calibrated prefill of the image tokens          (predict_target)

where the compute efficiency is the one the calibration fits for the language model's prefill
(``Calibration.compute_efficiency``; the host's figure is its probe's sustained matmul rate).
The tower's FLOPs are :mod:`robot_latency.floor.vision_tower`'s. Where the published vision table
(:mod:`robot_latency.floor.published_vision`) has rows of the engine family, the encode is
scaled by their fitted factor; where it has none, every answer says ``vision uncalibrated``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from robot_latency.floor.calibration import Calibration
from robot_latency.floor.devices import DeviceSheet
from robot_latency.floor.errors import FloorError
from robot_latency.floor.modelfacts import ModelFacts
from robot_latency.floor.published_vision import vision_fit
from robot_latency.floor.target import predict_target
from robot_latency.floor.vision_tower import DEFAULT_FRAME_PX, VisionTower

__all__ = ["VisionPrediction", "calibrated_rate_flops", "predict_vision"]


@dataclass(frozen=True)
class VisionPrediction:
    """A frame's image cost predicted on a device (ms), and what it rests on."""

    device_id: str
    engine_family: str
    tower: str
    projector: str
    image_size_px: int
    frame_px: tuple[int, int]
    image_chunks: int
    image_tokens: int
    encode_gflop: float
    compute_rate_gflops: float
    encode_ms: float
    image_prefill_ms: float
    vision_calibrated: bool
    vision_status: str
    prefill_status: str
    vision_factor: float = 1.0
    vision_basis: tuple[str, ...] = ()
    #: The text prompt's TTFT, and the TTFT with the frame (encode, then the prompt and the
    #: image tokens through one calibrated prefill); None without a prompt length.
    prompt_tokens: int | None = None
    text_ttft_ms: float | None = None
    ttft_with_image_ms: float | None = None

    @property
    def image_ms(self) -> float:
        """Encode plus image prefill: what the frame adds to the time to first token."""
        return self.encode_ms + self.image_prefill_ms

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["frame_px"] = list(self.frame_px)
        out["vision_basis"] = list(self.vision_basis)
        out["image_ms"] = self.image_ms
        return out


def calibrated_rate_flops(device: DeviceSheet, cal: Calibration) -> float:
    """The device's calibrated compute rate (FLOP/s): its compute figure times the prefill's
    fitted compute efficiency.

    Raises:
        FloorError: a device without a FLOP/s figure.
    """
    if not device.peak_flops:
        raise FloorError(f"device {device.id!r} has no FLOP/s figure: no vision prediction on it")
    return device.peak_flops * cal.compute_efficiency


def predict_vision(tower: VisionTower, model: ModelFacts, device: DeviceSheet,
                   cal: Calibration, *, frame_px: tuple[int, int] = DEFAULT_FRAME_PX,
                   prompt_tokens: int | None = None,
                   vision_rows: Any = None) -> VisionPrediction:
    """Predict a frame's encode and image prefill on ``device`` under ``cal``.

    Args:
        tower: the vision tower at its resolution.
        model: the language model the image tokens go through.
        device: the target's datasheet.
        cal: the engine family's calibration there (its prefill terms are used).
        frame_px: the camera frame (width, height): idefics3 tiles it.
        prompt_tokens: the text prompt's length: also predict its TTFT without and with the
            frame.
        vision_rows: the published vision rows to calibrate the encode on (None: the shipped
            table's).

    Raises:
        FloorError: a device without a FLOP/s figure, or a calibration for another device.
    """
    rate = calibrated_rate_flops(device, cal)
    flops = tower.encode_flops(frame_px)
    tokens = tower.image_tokens(frame_px)
    fit = vision_fit(cal.engine_family, device.id, rows=vision_rows)
    encode_ms = flops / rate * 1e3
    if fit is not None:
        encode_ms *= fit.factor
        status = (f"vision calibrated on {len(fit.basis)} rows of {cal.engine_family} "
                  f"({fit.scope} scope)")
    else:
        status = (f"vision uncalibrated: no published vision row of {cal.engine_family}; the "
                  "encode runs at the prefill's calibrated compute rate")
    pred = predict_target(model, device, cal, prompt_tokens=tokens)
    if pred.ttft_pred_ms is None:
        raise FloorError(f"device {device.id!r} has no FLOP/s figure: no image prefill on it")
    text_ms = with_ms = None
    if prompt_tokens is not None:
        text_ms = predict_target(model, device, cal, prompt_tokens=prompt_tokens).ttft_pred_ms
        both = predict_target(model, device, cal, prompt_tokens=prompt_tokens + tokens)
        with_ms = None if both.ttft_pred_ms is None else encode_ms + both.ttft_pred_ms
    return VisionPrediction(
        device_id=device.id, engine_family=cal.engine_family, tower=tower.name,
        projector=tower.projector, image_size_px=tower.image_size_px,
        frame_px=(int(frame_px[0]), int(frame_px[1])), image_chunks=tower.chunks(frame_px),
        image_tokens=tokens, encode_gflop=flops / 1e9, compute_rate_gflops=rate / 1e9,
        encode_ms=encode_ms, image_prefill_ms=pred.ttft_pred_ms,
        vision_calibrated=fit is not None, vision_status=status,
        prefill_status=pred.prefill_status,
        vision_factor=1.0 if fit is None else fit.factor,
        vision_basis=() if fit is None else fit.basis, prompt_tokens=prompt_tokens,
        text_ttft_ms=text_ms, ttft_with_image_ms=with_ms)
