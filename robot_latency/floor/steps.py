"""The one path from a model, a device and an engine family to the target's per-step times.

``predict``, the records and the report all predict a command's time on the target through
:class:`StepPredictor` (built by :func:`step_predictor`), so the same inputs give the same
milliseconds everywhere. It applies the corrections ``predict`` has always applied:

- a preset's weight bytes scaled to the GGUF size a published row states
  (:func:`~robot_latency.floor.target.with_published_size`);
- the per-model correction from the model's own published rows in the source's other setups
  (:func:`~robot_latency.floor.target.adjust_for_model`), for the preset the model is (a file
  built from a preset, e.g. the demo's inflated ladder, names it in ``model_id``).

:meth:`StepPredictor.predict` is the single inner call: TTFT of a prompt's uncached tokens and
ITL at a context length, each with the relative interval the Monte Carlo draws the family's
error from. Where the prefill prediction gains its own calibration and interval, only that
method changes: it carries the prefill's own interval and floor where the engine family's
prefill is calibrated (robot_latency.floor.prefill).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from robot_latency.floor.calibration import Calibration
from robot_latency.floor.devices import DeviceSheet
from robot_latency.floor.errors import FloorError
from robot_latency.floor.modelinfo import ModelFacts
from robot_latency.floor.published import INTERVAL_COVERAGE, ModelAdjustment
from robot_latency.floor.target import (
    TargetPrediction,
    adjust_for_model,
    predict_target,
    with_published_size,
)

__all__ = ["StepPrediction", "StepPredictor", "step_predictor"]


@dataclass(frozen=True)
class StepPrediction:
    """One command's predicted steps on the target (ms).

    ``itl_interval_rel`` and ``ttft_interval_rel`` are (lo, hi) relative bounds of the
    prediction's interval at ``coverage`` (``ttft_interval_rel`` None: the prefill is not
    calibrated for the engine family, so it has no interval of its own). ``itl_floor_ms`` and
    ``ttft_floor_ms`` are the floors (bandwidth; max of weights read once and prompt compute):
    no draw goes below them. ``prefill_status`` says how the prefill was predicted.
    """

    ttft_ms: float
    itl_ms: float
    itl_floor_ms: float
    itl_interval_rel: tuple[float, float]
    ttft_interval_rel: tuple[float, float] | None
    coverage: float
    ttft_floor_ms: float = 0.0
    prefill_status: str = ""

    def e2e_ms(self, tokens_out: int) -> float:
        """TTFT + (tokens_out - 1) x ITL: the time to the last of ``tokens_out`` tokens."""
        return self.ttft_ms + max(0, tokens_out - 1) * self.itl_ms


@dataclass(frozen=True)
class StepPredictor:
    """Per-step predictions for one model on one device under one calibration.

    Attributes:
        model: the model's facts, corrected (published GGUF size for a preset).
        device: the target's datasheet.
        calibration: the engine family's calibration on it.
        model_id: the preset the per-model correction looks up (None: none).
        notes: what the corrections did (one line each).
        adjustment: the per-model correction, found once (it is the same for every step).
    """

    model: ModelFacts
    device: DeviceSheet
    calibration: Calibration
    model_id: str | None = None
    notes: tuple[str, ...] = ()
    adjustment: ModelAdjustment | None = None

    @property
    def from_table(self) -> bool:
        return self.calibration.source == "published table"

    @property
    def prefill_calibrated(self) -> bool:
        return self.calibration.prefill_calibrated

    def predict(self, uncached_prompt_tokens: int, *, context_tokens: int = 0) -> StepPrediction:
        """Predict the TTFT of ``uncached_prompt_tokens`` and the ITL at ``context_tokens``.

        Raises:
            FloorError: a device without a FLOP/s figure (no TTFT), or a value out of range.
        """
        pred = self.target_prediction(context_tokens=context_tokens,
                                      prompt_tokens=max(1, uncached_prompt_tokens))
        if pred.ttft_pred_ms is None:
            raise FloorError(f"device {self.device.id!r} has no FLOP/s figure: no TTFT "
                             "prediction on it")
        lo, hi = pred.itl_pred_interval_ms
        itl, ttft = pred.itl_pred_ms, pred.ttft_pred_ms
        ttft_rel = None
        if pred.ttft_pred_interval_ms is not None and ttft > 0:
            t_lo, t_hi = pred.ttft_pred_interval_ms
            ttft_rel = (t_lo / ttft - 1.0, t_hi / ttft - 1.0)
        return StepPrediction(
            ttft_ms=ttft, itl_ms=itl, itl_floor_ms=pred.itl_floor_ms,
            itl_interval_rel=(lo / itl - 1.0, hi / itl - 1.0), ttft_interval_rel=ttft_rel,
            coverage=INTERVAL_COVERAGE if self.from_table else 0.8,
            ttft_floor_ms=pred.ttft_floor_ms or 0.0, prefill_status=pred.prefill_status)

    def target_prediction(self, *, context_tokens: int = 0,
                          prompt_tokens: int | None = None) -> TargetPrediction:
        """The corrected :class:`~robot_latency.floor.target.TargetPrediction` (a manifest's
        ``target_prediction``; ``prompt_tokens`` uncached, None: no TTFT)."""
        pred = predict_target(self.model, self.device, self.calibration,
                              context_tokens=context_tokens, prompt_tokens=prompt_tokens)
        if self.from_table:
            pred, _ = adjust_for_model(pred, self.calibration, self.model_id,
                                       adjustment=self.adjustment)
        return pred

    def describe(self) -> dict[str, Any]:
        """Return what the answer rests on: calibration, its sources and those set aside, the
        family's leave-one-source-out error (published table only), prefill state,
        corrections."""
        cal = self.calibration
        loso = family_loso_error(cal.engine_family) if self.from_table else None
        return {"device_id": self.device.id, "engine_family": cal.engine_family,
                "model_name": self.model.name, "model_id": self.model_id,
                "source": cal.source, "scope": cal.scope, "basis": list(cal.basis),
                "sources": list(cal.sources), "set_aside": list(cal.set_aside),
                "leave_one_source_out": loso,
                "source_count": len(cal.answer_sources) if self.from_table else None,
                "source_widening_rel": cal.source_widening_rel,
                "prefill_calibrated": cal.prefill_calibrated,
                "prefill_source_count": (len(cal.prefill_sources)
                                         if self.from_table and cal.prefill_calibrated
                                         else None),
                "prefill_source_widening_rel": cal.prefill_source_widening_rel,
                "prefill": cal.describe()["prefill"], "notes": [*self.notes, *cal.notes]}


@functools.cache
def family_loso_error(engine_family: str) -> float | None:
    """The shipped table's leave-one-source-out median absolute error for ``engine_family``
    (None: none of its rows could be predicted without its own source)."""
    from robot_latency.floor.published_checks import leave_one_source_out

    got = leave_one_source_out()["by_family"].get(engine_family) or {}
    return got.get("median_abs_error")


def step_predictor(model: ModelFacts, device: DeviceSheet, cal: Calibration, *,
                   spec: str | None = None, model_id: str | None = None) -> StepPredictor:
    """Build the step predictor with ``predict``'s corrections.

    Args:
        model: the model's facts (as resolved from ``spec``).
        device: the target's datasheet.
        cal: the engine family's calibration there.
        spec: what the user named (a preset id or a path): a preset's size is corrected.
        model_id: the preset for the per-model correction (default: ``spec``).
    """
    notes: tuple[str, ...] = ()
    adj = None
    if cal.source == "published table" and spec is not None:
        model, notes = with_published_size(spec, model, device_id=device.id)
    model_id = model_id if model_id is not None else spec
    if cal.source == "published table" and model_id is not None:
        probe = predict_target(model, device, cal)
        _, adj = adjust_for_model(probe, cal, model_id)
        if adj is not None and adj.note() is not None:
            notes = (*notes, str(adj.note()))
    return StepPredictor(model, device, cal, model_id=model_id, notes=notes, adjustment=adj)
