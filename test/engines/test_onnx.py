"""The ONNX Runtime engine on real onnxruntime and real llama.cpp: greedy output equal to the
llama.cpp engine's (with and without the action grammar), INT8 agreement (reported), provider
selection, trace invariants, prefix reuse, deadline/abort, and clear errors for bad files.

The model is a small random-weight llama with the planner's real tokenizer, written in the test
and exported to ONNX next to its GGUF (so the engine finds the tokenizer by stem).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

import llama_cpp  # noqa: F401  (a hard requirement: a missing one fails)
import onnx  # noqa: F401  (a hard requirement: a missing one fails)
import onnxruntime  # noqa: F401  (a hard requirement: a missing one fails)
import pytest

import robot_latency.engines.onnx  # noqa: F401  (registers "onnx")
from robot_latency.clock import ScriptedClock
from robot_latency.engines import (
    EngineError,
    GenerationRequest,
    StopReason,
    create_engine,
)
from robot_latency.engines.action_mask import GRAMMAR_MASK, ActionGrammarMask
from robot_latency.models.onnx_export import export_all
from robot_latency.models.tokenizer import format_prompt
from robot_latency.profiles.actions import actions_gbnf, parse_actions

COMMANDS = ["pick up the red cup and put it on the tray", "stop", "go to the kitchen slowly",
            "bring me the blue bottle", "find the green ball then go to the garage",
            "wait here", "hand the white towel to the operator quickly"]
CPU = ("CPUExecutionProvider",)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory,
           random_llama_gguf: Callable[..., Path]) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("onnx_engine")
    # 128 wide, 2 layers, 4 query / 2 KV heads, FFN 256, context 1024.
    gguf = random_llama_gguf(d / "rand.gguf", seed=1)
    export_all(gguf, d)
    return {"gguf": gguf, "fp32": d / "rand.onnx", "int8": d / "rand.int8.onnx"}


@pytest.fixture(scope="module")
def engine(models):
    e = create_engine("onnx", model_path=str(models["fp32"]), providers=CPU, n_ctx=256,
                      chunk_tokens=4)
    yield e
    e.close()


@pytest.fixture(scope="module")
def llama(models):
    # F32 KV cache so both engines compute the same numbers (an F16 cache can flip near-ties).
    e = create_engine("llamacpp", model_path=str(models["gguf"]), n_ctx=256, kv_type="f32")
    yield e
    e.close()


def _req(cmd: str, **kw: object) -> GenerationRequest:
    return GenerationRequest(prompt=format_prompt(cmd), **{"max_tokens": 12, **kw})


@pytest.mark.parametrize("grammar", [None, actions_gbnf()], ids=["free", "grammar"])
def test_greedy_equals_llamacpp(engine, llama, grammar: str | None) -> None:
    for cmd in COMMANDS:
        ref = llama.generate(_req(cmd, grammar=grammar))
        got = engine.generate(_req(cmd, grammar=grammar))
        assert got.error is None and ref.error is None
        assert got.tokens == ref.tokens, cmd
        assert got.text == ref.text and got.stop_reason == ref.stop_reason


def test_grammar_output_parses(engine) -> None:
    for cmd in COMMANDS:
        trace = engine.generate(_req(cmd, grammar=actions_gbnf(), max_tokens=40))
        assert "grammar" in trace.phases_ns()
        if trace.stop_reason is StopReason.DONE:
            assert parse_actions(trace.text)
    assert engine.info()["grammar"] == GRAMMAR_MASK


def test_int8_runs_and_agreement_is_reported(models, engine, record_property) -> None:
    with create_engine("onnx", model_path=str(models["int8"]), providers=CPU,
                       n_ctx=256) as int8:
        assert int8.info()["weights"] == "int8"
        assert int8.info()["tokenizer_gguf_resolved"] == str(models["gguf"])  # rand.int8 -> rand
        same = 0
        for cmd in COMMANDS:
            got = int8.generate(_req(cmd, grammar=actions_gbnf()))
            assert got.error is None and got.tokens
            same += got.tokens == engine.generate(_req(cmd, grammar=actions_gbnf())).tokens
    # Random weights give near-flat logits, the worst case for INT8; report, do not assert.
    record_property("int8_fp32_greedy_agreement", f"{same}/{len(COMMANDS)}")
    logging.getLogger(__name__).info("INT8 vs FP32 greedy: %d/%d identical", same, len(COMMANDS))


def test_provider_selection_skips_unavailable(models, caplog) -> None:
    with caplog.at_level(logging.INFO, logger="robot_latency.engines.onnx"):
        e = create_engine("onnx", model_path=str(models["fp32"]),
                          providers=("NoSuchExecutionProvider", "CPUExecutionProvider"))
    info = e.info()
    assert info["provider"] == "CPUExecutionProvider" == e.session.get_providers()[0]
    assert info["providers_skipped"] == ["NoSuchExecutionProvider"]
    assert "NoSuchExecutionProvider" in caplog.text and "skipped" in caplog.text
    e.close()
    with pytest.raises(EngineError, match="providers"):
        create_engine("onnx", model_path=str(models["fp32"]), providers=("NoSuchProvider",))


def test_default_providers_record_the_one_that_ran(models) -> None:
    with create_engine("onnx", model_path=str(models["fp32"])) as e:
        info = e.info()
        assert info["provider"] == e.session.get_providers()[0]
        assert info["providers"] == ["TensorrtExecutionProvider", "CUDAExecutionProvider",
                                     "CPUExecutionProvider"]
        assert e.generate(_req("stop")).error is None


def test_trace_invariants(engine) -> None:
    trace = engine.generate(_req(COMMANDS[0], max_tokens=10))
    assert trace.error is None and trace.tokens
    assert len(trace.token_ns) == len(trace.tokens)
    assert trace.started_ns <= trace.tokenized_ns <= trace.prefill_chunk_ns[0]
    times = [*trace.prefill_chunk_ns, *trace.token_ns, trace.finished_ns]
    assert times == sorted(times)
    # chunk_tokens=4: the uncached part of the prompt ran in ceil(n/4) chunks.
    assert len(trace.prefill_chunk_ns) == -(-(trace.prompt_tokens
                                             - trace.prefix_cache_tokens) // 4)


def test_prefix_reuse(models, engine) -> None:
    engine.generate(_req("stop"))  # something else in the cache first
    first = engine.generate(_req(COMMANDS[0]))
    again = engine.generate(_req(COMMANDS[0]))
    assert again.prefix_cache_tokens == again.prompt_tokens - 1
    assert again.tokens == first.tokens  # the reused KV gives the same output
    other = engine.generate(_req("stop"))
    assert 1 <= other.prefix_cache_tokens < other.prompt_tokens
    with create_engine("onnx", model_path=str(models["fp32"]), providers=CPU,
                       prefix_cache=False, io_binding=False) as plain:
        plain.generate(_req(COMMANDS[0]))
        cold = plain.generate(_req(COMMANDS[0]))
        assert cold.prefix_cache_tokens == 0 and cold.tokens == first.tokens


def test_io_binding_off_gives_the_same_tokens(models, engine) -> None:
    with create_engine("onnx", model_path=str(models["fp32"]), providers=CPU,
                       io_binding=False) as e:
        for cmd in COMMANDS[:3]:
            assert e.generate(_req(cmd)).tokens == engine.generate(_req(cmd)).tokens


def test_deadline_in_the_past_stops_before_work(engine) -> None:
    trace = engine.generate(_req(COMMANDS[0], deadline_ns=engine.clock() - 1))
    assert trace.stop_reason is StopReason.DEADLINE
    assert trace.tokens == [] and trace.prefill_chunk_ns == []


def test_abort_set_stops_before_work(engine) -> None:
    flag = threading.Event()
    flag.set()
    trace = engine.generate(_req(COMMANDS[1]), abort=flag)
    assert trace.stop_reason is StopReason.ABORTED and trace.tokens == []


def test_deadline_between_steps_with_scripted_clock(models) -> None:
    clock = ScriptedClock(steps_ns=[1_000_000] * 10_000)  # every reading moves 1 ms
    with create_engine("onnx", model_path=str(models["fp32"]), providers=CPU, clock=clock,
                       chunk_tokens=2) as e:
        trace = e.generate(_req(COMMANDS[0], max_tokens=30, deadline_ns=20_000_000))
    assert trace.stop_reason is StopReason.DEADLINE
    assert len(trace.tokens) < 30 and len(trace.token_ns) == len(trace.tokens)


def test_unknown_grammar_is_an_error_trace(engine) -> None:
    trace = engine.generate(_req("stop", grammar='root ::= "yes" | "no"'))
    assert trace.stop_reason is StopReason.ERROR and "grammar" in (trace.error or "")
    assert engine.generate(_req("stop")).error is None  # the engine still works


def test_context_overflow_is_an_error_trace(engine) -> None:
    trace = engine.generate(_req("stop", max_tokens=1000))
    assert trace.stop_reason is StopReason.ERROR and "n_ctx" in (trace.error or "")


def test_bad_files_name_the_file(models, tmp_path: Path) -> None:
    missing = tmp_path / "nope.onnx"
    with pytest.raises(EngineError, match=r"nope\.onnx"):
        create_engine("onnx", model_path=str(missing))
    corrupt = tmp_path / "corrupt.onnx"
    corrupt.write_bytes(b"\x00garbage" * 100)
    with pytest.raises(EngineError, match=r"corrupt\.onnx"):
        create_engine("onnx", model_path=str(corrupt), providers=CPU)
    with pytest.raises(EngineError, match=r"tok\.gguf"):
        create_engine("onnx", model_path=str(models["fp32"]), providers=CPU,
                      tokenizer_gguf=str(tmp_path / "tok.gguf"))


def test_config_validation() -> None:
    with pytest.raises(EngineError, match="intra_op_threads"):
        create_engine("onnx", model_path="x.onnx", intra_op_threads=0)
    with pytest.raises(EngineError, match="chunk_tokens"):
        create_engine("onnx", model_path="x.onnx", chunk_tokens=0)
    with pytest.raises(EngineError, match="onnx"):
        create_engine("onnx", model_path="x.onnx", no_such_option=1)


def test_action_mask_follows_bytes_like_llamacpp() -> None:
    """A byte token may spell an action token piece by piece; <end> only at a step boundary."""
    pieces = [b"<end>", b"<pick>", b"<", b"p", b"i", b"c", b"k", b">", b"<obj:cup>", b" x",
              b"<col:red>", b"<fast>", b"<stop>"]
    m = ActionGrammarMask(pieces, eog={0})
    s = m.start()
    assert set(m.allowed(s)) == {1, 2, 12}                  # <pick>, "<", <stop>; no <end>
    for piece in (b"<", b"p", b"i", b"c", b"k", b">"):
        s = m.advance(s, piece)
        assert s is not None
    assert set(m.allowed(s)) == {2, 8, 10}                  # "<", <obj:cup>, <col:red>
    s = m.advance(s, b"<obj:cup>")
    assert 0 in m.allowed(s) and 11 in m.allowed(s)         # <end> and a speed now allowed
    assert m.advance(s, b" x") is None
    s = m.advance(s, b"<stop>")
    assert 11 not in m.allowed(s) and 0 in m.allowed(s)     # stop takes no speed
