"""The simulated engine: floor-derived timing, determinism under a seed, deadline and abort."""

from __future__ import annotations

import threading

import pytest

from robot_latency.clock import ScriptedClock
from robot_latency.engines import ENGINES, EngineError, GenerationRequest, StopReason, create_engine
from robot_latency.engines.base import UnknownEngineError
from robot_latency.planner.engine import rule_responder

PROMPT = "pick up the red cup and put it on the tray<plan>"


def _trace(seed: int = 0, **opts: object):
    clock = ScriptedClock(start_ns=10**9)
    engine = create_engine("sim", clock=clock, seed=seed, responder=rule_responder, **opts)
    return engine, engine.generate(GenerationRequest(prompt=PROMPT))


def test_registered_and_unknown_engine_named() -> None:
    assert "sim" in ENGINES
    with pytest.raises(UnknownEngineError, match=r"'nope'.*sim"):
        create_engine("nope")


def test_plans_come_from_the_injected_responder() -> None:
    with pytest.raises(EngineError, match="no responder"):
        create_engine("sim")
    engine = create_engine("sim", clock=ScriptedClock(), jitter_sigma=0.0,
                           responder=lambda prompt: ["<stop>", "<end>"])
    trace = engine.generate(GenerationRequest(prompt=PROMPT))
    assert trace.text == "<stop>" and trace.stop_reason is StopReason.DONE


def test_engine_is_a_context_manager() -> None:
    with create_engine("sim", clock=ScriptedClock(), responder=rule_responder) as engine:
        assert engine.generate(GenerationRequest(prompt=PROMPT)).stop_reason is StopReason.DONE


def test_output_is_the_rule_plan_and_timing_is_consistent() -> None:
    engine, trace = _trace(jitter_sigma=0.0)
    assert trace.stop_reason is StopReason.DONE
    assert trace.text == "<pick><col:red><obj:cup><place><loc:tray>"
    assert len(trace.token_ns) == 6  # five plan tokens and <end>
    assert trace.token_ns == sorted(trace.token_ns)
    phases = trace.phases_ns()
    assert phases["decode"] == trace.token_ns[-1] - trace.token_ns[0]
    # no jitter: each step is the floor over the efficiency (plus KV growth), never below it
    gaps = [b - a for a, b in zip(trace.token_ns, trace.token_ns[1:], strict=False)]
    assert min(gaps) >= engine.step_floor_ns / engine.config.efficiency


def test_deterministic_under_seed() -> None:
    assert _trace(seed=3)[1].token_ns == _trace(seed=3)[1].token_ns
    assert _trace(seed=3)[1].token_ns != _trace(seed=4)[1].token_ns


def test_slower_device_is_slower_by_the_bandwidth_ratio() -> None:
    _, fast = _trace(device="orin-nano-8gb-super", jitter_sigma=0.0)
    _, slow = _trace(device="orin-nano-8gb", jitter_sigma=0.0)
    fast_decode = fast.token_ns[-1] - fast.token_ns[0]
    slow_decode = slow.token_ns[-1] - slow.token_ns[0]
    assert slow_decode / fast_decode == pytest.approx(102 / 68, rel=1e-3)


def test_stops_at_the_deadline() -> None:
    clock = ScriptedClock(start_ns=0)
    engine = create_engine("sim", clock=clock, device="orin-nano-4gb", efficiency=0.1,
                           responder=rule_responder)
    trace = engine.generate(GenerationRequest(prompt=PROMPT, deadline_ns=60_000_000))
    assert trace.stop_reason is StopReason.DEADLINE
    assert trace.finished_ns == 60_000_000
    assert all(t <= 60_000_000 for t in trace.token_ns)


def test_abort_signal_and_max_tokens() -> None:
    clock = ScriptedClock()
    engine = create_engine("sim", clock=clock, responder=rule_responder)
    ev = threading.Event()
    ev.set()
    assert engine.generate(GenerationRequest(prompt=PROMPT), abort=ev).stop_reason \
        is StopReason.ABORTED
    cut = engine.generate(GenerationRequest(prompt=PROMPT, max_tokens=2))
    assert cut.stop_reason is StopReason.MAX_TOKENS and len(cut.token_ns) == 2


@pytest.mark.parametrize(("opts", "needle"), [
    ({"efficiency": 0.0}, "efficiency"), ({"device": "orin-xyz"}, "orin-xyz"),
    ({"bogus": 1}, "bogus"), ({"stall_probability": 2.0}, "stall_probability"),
])
def test_bad_options_named(opts: dict, needle: str) -> None:
    with pytest.raises(EngineError, match=needle):
        create_engine("sim", **opts, responder=rule_responder)


def test_jitter_resampled_from_a_recorded_run(tmp_path) -> None:
    from robot_latency.records import CycleRecord, JsonlSink

    # a recorded run whose gaps are 10 ms, with one in ten at 30 ms (a 3x tail)
    log = tmp_path / "cycles.jsonl"
    with JsonlSink(log) as sink:
        for c in range(10):
            t = c * 10**9
            tokens = [t]
            for i in range(10):
                tokens.append(tokens[-1] + (30 if i == 0 else 10) * 1_000_000)
            sink.write(CycleRecord(run_id="r", cycle=c, scheduled_ns=t, deadline_ns=t + 10**9,
                                   token_ns=tokens, published_ns=tokens[-1]))
    engine, trace = _trace(jitter_from=str(log), device="orin-agx-64gb")
    base = engine.step_floor_ns / engine.config.efficiency
    ratios = {round((b - a) / base, 1) for a, b in zip(trace.token_ns[1:], trace.token_ns[2:],
                                                        strict=False)}
    assert ratios <= {1.0, 3.0}  # only the recorded shapes (KV growth is tiny here)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(EngineError, match="need at least 10"):
        create_engine("sim", jitter_from=str(empty), responder=rule_responder)
