"""A run's per-cycle predictions: the floor on the host and the target, and the target's
calibrated answer (would this cycle have met its deadline there)."""

from __future__ import annotations

from typing import Any

from robot_latency.floor.calibration import Calibration
from robot_latency.floor.devices import DeviceSheet
from robot_latency.floor.modelinfo import ModelFacts
from robot_latency.floor.predict import predict_floor
from robot_latency.floor.steps import StepPredictor
from robot_latency.records import CycleRecord


class FloorPredictor:
    """Per-cycle floor and target predictions for the host and the target (a few µs each).

    The target's entry carries, beside its floor, the calibrated prediction of the engine
    family (``itl_pred_ms``, ``ttft_pred_ms``, ``engine_family``, ``calibration``); None where
    no calibration could be had (the reason is in the manifest). ``steps``: the step predictor
    (:mod:`robot_latency.floor.steps`, with ``predict``'s corrections) the record's target answer
    is computed with; by default one without corrections.
    """

    def __init__(self, model: ModelFacts, host: DeviceSheet,
                 target: DeviceSheet, *, calibration: Calibration | None = None,
                 calibration_error: str | None = None,
                 steps: StepPredictor | None = None) -> None:
        self.model, self.host, self.target = model, host, target
        self.calibration, self.calibration_error = calibration, calibration_error
        self.steps = steps if steps is not None or calibration is None else \
            StepPredictor(model, target, calibration)
        self._cal_label = None if calibration is None else (
            f"{calibration.source}, {calibration.scope} scope, {len(calibration.basis)} points")

    def predict(self, tokens_in: int | None) -> dict[str, Any]:
        """Return {"host": {...}, "target": {...}} at this cycle's prompt length."""
        out: dict[str, Any] = {}
        for key, device in (("host", self.host), ("target", self.target)):
            ctx = tokens_in or 0
            p = predict_floor(self.model, device, context_tokens=ctx,
                              prompt_tokens=ctx if device.peak_flops and ctx else None)
            out[key] = {"device_id": device.id, "itl_floor_ms": p.itl_floor_ms,
                        "prefill_floor_ms": p.prefill_floor_ms}
        target = out["target"]
        target.update(itl_pred_ms=None, ttft_pred_ms=None, engine_family=None, calibration=None)
        if self.steps is not None:
            t = self.steps.target_prediction(context_tokens=tokens_in or 0,
                                             prompt_tokens=tokens_in or None)
            target.update(itl_pred_ms=t.itl_pred_ms, ttft_pred_ms=t.ttft_pred_ms,
                          engine_family=t.engine_family, calibration=self._cal_label)
        return out

    def target_answer(self, rec: CycleRecord, *, max_tokens: int | None = None) -> None:
        """Set the record's predicted end-to-end time on the target and whether it meets the
        deadline (the ``target_*`` fields of :class:`CycleRecord`); nothing without a
        calibration, a model token or a TTFT prediction."""
        if self.steps is None or not rec.token_ns or rec.tokens_in is None:
            return
        if not self.target.peak_flops:
            return  # no TTFT prediction on a device without a FLOP/s figure
        t = self.steps.predict(max(0, rec.tokens_in - (rec.prefix_cache_tokens or 0)),
                               context_tokens=rec.tokens_in)
        n = rec.tokens_out
        lo, hi = (t.itl_ms * (1 + t.itl_interval_rel[0]), t.itl_ms * (1 + t.itl_interval_rel[1]))
        e2e = t.e2e_ms(n)
        complete = rec.stop_reason in ("done", "complete")
        deadline_ms = rec.deadline_budget_ns / 1e6
        # the TTFT's own interval where the prefill is calibrated, else its point
        t_lo, t_hi = ((t.ttft_ms * (1 + t.ttft_interval_rel[0]),
                       t.ttft_ms * (1 + t.ttft_interval_rel[1]))
                      if t.ttft_interval_rel is not None else (t.ttft_ms, t.ttft_ms))
        rec.target_e2e_pred_ms = e2e
        rec.target_e2e_pred_interval_ms = [t_lo + (n - 1) * lo, t_hi + (n - 1) * hi]
        rec.target_deadline_met_pred = (e2e <= deadline_ms if complete
                                        else (False if e2e > deadline_ms else None))
        rec.target_pred = {"ttft_ms": t.ttft_ms, "itl_ms": t.itl_ms,
                           "itl_interval_ms": [lo, hi], "ttft_interval_ms": [t_lo, t_hi],
                           "ttft_floor_ms": t.ttft_floor_ms, "prefill": t.prefill_status,
                           "tokens_out": n,
                           "basis": "complete" if complete else "partial",
                           "max_tokens": max_tokens, "device_id": self.target.id,
                           "engine_family": self.steps.calibration.engine_family}

    def manifest(self) -> dict[str, Any]:
        """Return the weights-only floors and the target's calibrated prediction."""
        out: dict[str, Any] = {key: predict_floor(self.model, d).to_dict()
                               for key, d in (("host", self.host), ("target", self.target))}
        if self.steps is not None:  # with predict's corrections (robot_latency.floor.steps)
            out["target_prediction"] = self.steps.target_prediction().to_dict()
        else:
            out["target_prediction"] = {"error": self.calibration_error}
        return out
