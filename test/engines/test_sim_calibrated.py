"""The simulated engine under an engine family's calibration: it makes predict's prediction."""

from __future__ import annotations

import pytest

from robot_latency.clock import ScriptedClock
from robot_latency.engines import EngineError, GenerationRequest, create_engine
from robot_latency.floor.devices import DEVICES
from robot_latency.floor.modelinfo import facts_from_preset
from robot_latency.floor.target import predict_target, resolve_calibration
from robot_latency.planner.engine import rule_responder

PROMPT = "pick up the red cup and put it on the tray<plan>"


def test_sim_steps_are_the_calibrated_prediction() -> None:
    clock = ScriptedClock(start_ns=10**9)
    engine = create_engine("sim", clock=clock, device="orin-nano-8gb-super",
                           model="llama-3.2-3b", quant="Q4_0", engine_family="mlc",
                           jitter_sigma=0.0, responder=rule_responder)
    trace = engine.generate(GenerationRequest(prompt=PROMPT))
    gaps_ms = [(b - a) / 1e6 for a, b in zip(trace.token_ns, trace.token_ns[1:], strict=False)]
    device = DEVICES["orin-nano-8gb-super"]
    cal = resolve_calibration("mlc", device)
    model = facts_from_preset("llama-3.2-3b", quant="Q4_0")
    # the k-th gap decodes with the prompt plus k tokens in the cache
    for k, gap in enumerate(gaps_ms, start=1):
        pred = predict_target(model, device, cal, context_tokens=trace.prompt_tokens + k)
        assert gap == pytest.approx(pred.itl_pred_ms, abs=1e-5)
    assert engine.info()["calibration"]["engine_family"] == "mlc"
    assert engine.info()["efficiency_in_effect"] == pytest.approx(cal.efficiency)


def test_sim_unknown_or_uncalibrated_family_is_an_engine_error() -> None:
    with pytest.raises(EngineError, match="known families"):
        create_engine("sim", device="orin-nano-8gb", engine_family="warp",
                      responder=rule_responder)
    with pytest.raises(EngineError, match="vllm"):
        create_engine("sim", device="orin-nano-8gb", engine_family="vllm",
                      responder=rule_responder)
