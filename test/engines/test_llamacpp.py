"""The llama.cpp engine on real llama.cpp: timing invariants, prefix reuse, abort, grammar,
speculative decoding (lossless), and clear errors for bad model files.

The model is a small random-weight llama with the planner's real tokenizer, written in the test
with the project's GGUF exporter: what is checked here is the engine, not the model's quality
(the shipped planner's accuracy is tested in test/models).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import llama_cpp
import pytest

from robot_latency.engines import EngineError, GenerationRequest, StopReason, create_engine
from robot_latency.llama_load import load_policy, open_llama
from robot_latency.models.bundled import bundled_model_path
from robot_latency.models.tokenizer import format_prompt
from robot_latency.planner.config import RunSettings
from robot_latency.planner.loop import InlineRunner, PlannerLoop
from robot_latency.planner.mailbox import InboundCommand
from robot_latency.profiles.actions import actions_gbnf, parse_actions
from robot_latency.profiles.profile import load_planning

COMMANDS = ["pick up the red cup and put it on the tray", "stop", "go to the kitchen slowly",
            "bring me the blue bottle", "find the green ball then go to the garage"]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory,
          random_llama_gguf: Callable[..., Path]) -> Path:
    # 128 wide, 2 layers, 4 query / 2 KV heads, FFN 256, context 1024; unit norm gains.
    return random_llama_gguf(tmp_path_factory.mktemp("m") / "rand.gguf", seed=0,
                             norm_jitter=None)


@pytest.fixture(scope="module")
def engine(model: Path):
    e = create_engine("llamacpp", model_path=str(model), n_ctx=1024, chunk_tokens=32)
    yield e
    e.close()


def _req(cmd: str, **kw: object) -> GenerationRequest:
    return GenerationRequest(prompt=format_prompt(cmd), **{"max_tokens": 12, **kw})


def test_trace_timing_invariants_through_the_loop(engine) -> None:
    plans: list[dict] = []
    records = []
    loop = PlannerLoop(RunSettings(period_ms=200, deadline_ms=150), InlineRunner(engine),
                       publish=plans.append, sink=records.append, planning=load_planning(None))
    for i, cmd in enumerate(COMMANDS):
        loop.submit(InboundCommand(f"c{i}", cmd, loop.clock()))
        loop.run_periodic(1)
    assert len(plans) == len(records) == len(COMMANDS)
    for r in records:
        assert r.token_ns, "the engine produced tokens"
        assert r.e2e_ns == r.ttft_ns + sum(r.itl_ns)
        assert r.tokens_in and r.tokens_in >= 2
        assert r.phases_ns["prefill"] > 0 and "grammar" in r.phases_ns


def test_prefix_reuse_counts(engine) -> None:
    cmd = COMMANDS[0]
    first = engine.generate(_req(cmd))
    again = engine.generate(_req(cmd))
    other = engine.generate(_req("stop"))
    # the same prompt reuses all but its last token (re-evaluated for its logits); another
    # command shares only the BOS token
    assert again.prefix_cache_tokens == again.prompt_tokens - 1
    assert other.prefix_cache_tokens == 1
    assert first.tokens == again.tokens  # reuse does not change the output


def test_prefix_cache_off(model: Path) -> None:
    e = create_engine("llamacpp", model_path=str(model), prefix_cache=False)
    try:
        e.generate(_req(COMMANDS[0]))
        assert e.generate(_req(COMMANDS[0])).prefix_cache_tokens == 0
    finally:
        e.close()


def test_grammar_output_parses(engine) -> None:
    grammar = actions_gbnf()
    for cmd in COMMANDS:
        trace = engine.generate(_req(cmd, max_tokens=40, grammar=grammar))
        if trace.stop_reason is StopReason.DONE:
            parse_actions(trace.text)
        else:  # cut off: still a prefix of the grammar's language, made of its tokens
            assert trace.text.startswith("<")


def test_deadline_in_the_past_stops_before_any_work(engine) -> None:
    trace = engine.generate(_req(COMMANDS[0], deadline_ns=time.perf_counter_ns() - 1))
    assert trace.stop_reason is StopReason.DEADLINE and trace.token_ns == []


class AbortAskedByLlamaCpp:
    """An abort signal that turns on the first time llama.cpp's abort callback asks it, i.e.
    inside ``llama_decode``, in the middle of a pass, whatever the machine's speed. The engine's
    own checks between chunks see it off until then."""

    def __init__(self) -> None:
        self.asked_outside = 0
        self.fired_in_callback = False

    def is_set(self) -> bool:
        if not self.fired_in_callback:
            if sys._getframe(1).f_code.co_name != "_should_abort":
                self.asked_outside += 1
                return False
            self.fired_in_callback = True
        return True


def test_abort_inside_a_prefill_pass(model: Path) -> None:
    # The whole prompt in one chunk: there is no chunk boundary to stop at, only the callback.
    e = create_engine("llamacpp", model_path=str(model), n_ctx=1024, chunk_tokens=1024)
    try:
        prompt = format_prompt(" ".join(["pick up the red cup"] * 40))
        abort = AbortAskedByLlamaCpp()
        trace = e.generate(GenerationRequest(prompt=prompt, max_tokens=4), abort=abort)
        assert abort.fired_in_callback and abort.asked_outside >= 1
        assert trace.stop_reason is StopReason.ABORTED
        assert trace.prompt_tokens > 100
        assert trace.prefill_chunk_ns == [] and trace.token_ns == []
        # the engine is usable afterwards, and the aborted pass left no KV behind
        ok = e.generate(_req("stop"))
        assert ok.stop_reason in (StopReason.DONE, StopReason.MAX_TOKENS)
        assert ok.prefix_cache_tokens <= 1
    finally:
        e.close()


@pytest.mark.parametrize("draft", ["model", "prompt_lookup"])
def test_speculative_output_identical_to_target(engine, model: Path, tmp_path: Path, draft: str,
                                                random_llama_gguf: Callable[..., Path]) -> None:
    draft_path = random_llama_gguf(tmp_path / "draft.gguf", dim=64, n_layers=1, ffn_dim=128,
                                   seed=7, norm_jitter=None)
    spec = create_engine("llamacpp", model_path=str(model), n_ctx=1024, draft=draft,
                         draft_model_path=str(draft_path), draft_k=3, draft_adaptive=True)
    try:
        for grammar in (actions_gbnf(), None):
            for cmd in COMMANDS:
                want = engine.generate(_req(cmd, max_tokens=16, grammar=grammar))
                got = spec.generate(_req(cmd, max_tokens=16, grammar=grammar))
                assert got.tokens == want.tokens and got.text == want.text
                stats = got.draft
                assert stats is not None and stats["rounds"] >= 1
                assert 0 <= stats["accepted"] <= stats["drafted"]
                assert len(got.token_ns) == len(got.tokens)
    finally:
        spec.close()


@pytest.mark.parametrize("grammar", [None, actions_gbnf()], ids=["no_grammar", "grammar"])
def test_prompt_lookup_verifies_more_tokens_than_a_prefill_chunk(grammar: str | None) -> None:
    """A verify round (the pending token and its drafts) longer than ``chunk_tokens`` is one
    llama.cpp batch: it used to be written past the Llama's batch of ``chunk_tokens`` tokens and
    fail with "NULL pointer access"; now the output is plain greedy's, token for token."""
    planner = bundled_model_path("planner")
    # The plan repeats the command's first half: the n-gram lookup finds drafts in the output.
    req = _req("pick up the red cup then pick up the red cup", max_tokens=24, grammar=grammar)
    with create_engine("llamacpp", model_path=str(planner), chunk_tokens=1) as plain, \
            create_engine("llamacpp", model_path=str(planner), chunk_tokens=1,
                          draft="prompt_lookup", draft_k=4) as spec:
        want = plain.generate(req)
        got = spec.generate(req)
    assert got.error is None, got.error
    assert got.stop_reason is StopReason.DONE and want.stop_reason is StopReason.DONE
    assert got.tokens == want.tokens and got.text == want.text
    assert got.draft is not None
    # a round of the pending token and 1+ drafts: longer than a chunk of 1 token
    assert max(drafted for drafted, _ in got.draft["per_round"]) >= 1


def test_draft_identical_to_target_accepts_everything(model: Path) -> None:
    spec = create_engine("llamacpp", model_path=str(model), draft="model",
                         draft_model_path=str(model), draft_k=4)
    try:
        trace = spec.generate(_req(COMMANDS[0], max_tokens=16))
        assert trace.draft["alpha"] == 1.0
        assert trace.draft["predicted_speedup"] is not None
    finally:
        spec.close()


def test_engine_is_a_context_manager_and_the_inline_runner_closes_it(model: Path) -> None:
    with create_engine("llamacpp", model_path=str(model), n_ctx=256) as e:
        assert e.generate(_req("stop")).stop_reason is not StopReason.ERROR
        assert not e.closed
    assert e.closed
    runner = InlineRunner(create_engine("llamacpp", model_path=str(model), n_ctx=256))
    runner.close()
    assert runner.engine.closed


def test_context_overflow_is_an_error_trace(engine) -> None:
    trace = engine.generate(_req("stop", max_tokens=5000))
    assert trace.stop_reason is StopReason.ERROR
    assert "exceeds the context of" in (trace.error or "")
    # The engine starts clean after a failure: the next generation works.
    assert engine.generate(_req("stop")).stop_reason is not StopReason.ERROR


@pytest.mark.parametrize(("content", "needle"), [
    (b"", "empty"), (b"PK\x03\x04 not a model at all" * 3, "not a GGUF"),
])
def test_bad_model_file_named(tmp_path: Path, content: bytes, needle: str) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(content)
    with pytest.raises(EngineError, match=needle) as err:
        create_engine("llamacpp", model_path=str(bad))
    assert str(bad) in str(err.value)


def test_wrong_architecture_named(tmp_path: Path,
                                  tiny_llama_gguf: Callable[..., Path]) -> None:
    """A well-formed GGUF of an architecture llama.cpp cannot build: an error naming the file."""
    path = tiny_llama_gguf(tmp_path / "alien.gguf", arch="notanarch")
    with pytest.raises(EngineError) as err:
        create_engine("llamacpp", model_path=str(path))
    assert str(path) in str(err.value)


def test_missing_model_and_bad_options_named(tmp_path: Path) -> None:
    with pytest.raises(EngineError, match=r"nope\.gguf"):
        create_engine("llamacpp", model_path=str(tmp_path / "nope.gguf"))
    with pytest.raises(EngineError, match="n_threads"):
        create_engine("llamacpp", model_path=str(tmp_path / "x.gguf"), n_threads=0)
    with pytest.raises(EngineError, match=r"draft_model_path"):
        create_engine("llamacpp", model_path=str(tmp_path / "x.gguf"), draft="model")


def test_greedy_grammar_fast_path_equals_the_full_grammar_chain(engine, model: Path) -> None:
    """Checking the grammar on the argmax first must give exactly llama.cpp's chain output."""

    ref = open_llama(load_policy(), model_path=str(model), n_ctx=1024, n_batch=32,
                     verbose=False)
    grammar = llama_cpp.LlamaGrammar.from_string(actions_gbnf(), verbose=False)
    try:
        for cmd in COMMANDS:
            prompt = ref.tokenize(format_prompt(cmd).encode(), add_bos=True, special=True)
            ref.reset()
            want = []
            for tok in ref.generate(prompt, temp=0.0, repeat_penalty=1.0, grammar=grammar):
                want.append(int(tok))
                if llama_cpp.llama_vocab_is_eog(ref._model.vocab, tok) or len(want) == 16:
                    break
            got = engine.generate(_req(cmd, max_tokens=16, grammar=actions_gbnf()))
            assert got.tokens == want
    finally:
        ref.close()


# Tokens after the grammar's end. Once a grammar's root is complete, llama.cpp's grammar sampler
# allows every end-of-generation token of the vocabulary, not just the EOS: this vocabulary has
# two, ``<end>`` (EOS) and ``</s>`` (marked EOG by llama.cpp from its text). This seed's model
# picks ``</s>`` for "stop"; an engine that ended only on the EOS went on emitting it (no text,
# still allowed by the grammar) until max_tokens or the deadline.
_CLOSED = 'root ::= "{}"'


def _eog_ids(engine) -> set[int]:
    vocab = engine.llm._model.vocab
    return {i for i in range(engine.llm.n_vocab()) if llama_cpp.llama_vocab_is_eog(vocab, i)}


def test_every_end_of_generation_token_ends_a_generation(engine) -> None:
    eog = _eog_ids(engine)
    other = {int(t) for t in engine.llm.tokenize(b"</s>", add_bos=False, special=True)}
    assert engine.llm.token_eos() in eog and other <= eog and len(eog) >= 2
    last = []
    for cmd in ["stop", "go to the kitchen", "bring me the cup", "find the ball"]:
        trace = engine.generate(_req(cmd, max_tokens=20, grammar=_CLOSED))
        assert trace.stop_reason is StopReason.DONE, (cmd, trace.tokens)
        assert trace.text == "{}" and trace.tokens[-1] in eog
        assert all(t not in eog for t in trace.tokens[:-1]), trace.tokens
        last.append(trace.tokens[-1])
    # The case that ran to the limit before was an end token other than the EOS: the planner
    # before its refusal fine-tune chose </s> for "stop"; the current one chooses <end> in all
    # four, so here every end token, whichever it is, must have ended the generation (above).
    assert all(t in eog for t in last), last


def test_a_complete_output_ends_the_generation_without_an_end_token(engine) -> None:
    trace = engine.generate(_req("stop", max_tokens=20, grammar=_CLOSED, complete="json"))
    assert trace.stop_reason is StopReason.COMPLETE and trace.text == "{}"
    assert not set(trace.tokens) & _eog_ids(engine)
    # without a grammar the same check ends a complete JSON value as soon as it closes
    speculative_free = engine.generate(_req("stop", max_tokens=20, grammar='root ::= "[1]"',
                                            complete="json"))
    assert speculative_free.text == "[1]" and speculative_free.stop_reason is StopReason.COMPLETE
