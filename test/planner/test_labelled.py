"""The untimed pass without weights (planner/labelled.py): each labelled plan rendered in the
profile's output format and tokenized by the model's own tokenizer, the prompt counted as the
llama.cpp engine counts it; and the answer it gives against the untimed pass of the real model."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from robot_latency.models.bundled import bundled_model_path
from robot_latency.planner.config import RunSettings
from robot_latency.planner.labelled import labelled_pass, render_plan
from robot_latency.planner.target_inputs import labelled_inputs, untimed_inputs
from robot_latency.planner.untimed import UntimedError
from robot_latency.profiles.actions import REFUSE_PLAN, plan_json_schema
from robot_latency.profiles.labels import LabelSet, check_label
from robot_latency.profiles.profile import load_planning
from robot_latency.profiles.vocab import VocabTokenizer, tokenizer_for_model
from robot_latency.report.target_answer import answers_from_inputs
from robot_latency.streams import SHIPPED_DIR, Command, CommandStream, read_stream

PICK = {"steps": [{"action": "pick", "target": "cup", "target_kind": "object", "color": "red",
                   "speed": "slow"}]}


def _labels(pairs: dict[str, object]) -> LabelSet:
    labels = LabelSet()
    for text, expected in pairs.items():
        labels.add(check_label(expected, schema=plan_json_schema(), where="test"), text=text)
    return labels


def test_plans_are_written_as_the_model_writes_them() -> None:
    actions, js = load_planning("bundled-actions"), load_planning("instruct-json")
    assert render_plan(actions, PICK)[0] == "<pick><col:red><obj:cup><slow><end>"
    assert render_plan(actions, "refuse")[0] == "<refuse><end>"
    # JSON in the schema's key order, spelled as the grammar allows (no spaces) ...
    text, plan = render_plan(js, {"steps": [{"speed": "slow", "action": "pick",
                                             "target": "cup", "color": "red"}]})
    assert text == ('{"steps":[{"action":"pick","target":"cup","target_kind":"object",'
                    '"color":"red","speed":"slow"}]}')
    assert json.loads(text) == plan == PICK  # a partial label is completed by the language
    # ... and as the examples spell it when decoding is not constrained
    assert render_plan(js, PICK, grammar=False)[0].startswith('{"steps": [{"action": "pick", ')
    assert json.loads(render_plan(js, "refuse")[0]) == REFUSE_PLAN


def test_counts_follow_the_engine(tmp_path: Path) -> None:
    """The fixed prefix is evaluated at load and kept; each command prefills only what it does
    not share with the previous prompt and output; a plan past max_tokens is cut there."""
    planning = load_planning("instruct-json")
    stream = CommandStream("s", str(tmp_path / "s.jsonl"), topic=None, commands=(
        Command(0, "pick up the red cup slowly", "a"),
        Command(10**9, "pick up the red cup slowly", "b"),
        Command(2 * 10**9, "what time is it?", "c"),
        Command(3 * 10**9, "", "d")))
    labels = _labels({"pick up the red cup slowly": PICK, "what time is it?": "refuse"})
    labels.add(check_label("refuse", schema=plan_json_schema(), where="t"), text="")
    with VocabTokenizer.for_family("qwen2") as tok:
        lp = labelled_pass(planning, stream, labels, tok, max_tokens=160,
                           max_command_chars=300)
        prefix = tok.count(planning.prefix, add_bos=True)
        a, b, c, d = lp.untimed.commands
        full = prefix + tok.count(planning.build("pick up the red cup slowly").suffix)
        assert a.prompt_tokens == b.prompt_tokens == full
        assert a.uncached_prompt_tokens < full - prefix + 1  # the prefix is cached at load
        assert b.uncached_prompt_tokens == 1  # the same prompt again: only its last token
        assert a.tokens_out == tok.count(render_plan(planning, PICK)[0])
        assert a.plan_valid and c.plan_valid and c.plan == REFUSE_PLAN
        assert not d.asked  # the loop refuses an empty command before asking the model
        cut = labelled_pass(planning, stream, labels, tok, max_tokens=5, max_command_chars=300)
    assert {u.stop_reason for u in cut.untimed.commands if u.asked} == {"max_tokens"}
    assert all(u.tokens_out == 5 and not u.plan_valid for u in cut.untimed.commands if u.asked)


def test_unlabelled_commands_are_left_out_and_counted(tmp_path: Path) -> None:
    stream = CommandStream("s", str(tmp_path / "s.jsonl"), topic=None, commands=(
        Command(0, "pick up the red cup slowly", "a"), Command(10**9, "sing a song", "b")))
    settings = RunSettings(log_dir=tmp_path, profile="instruct-json")
    (tmp_path / "labels.jsonl").write_text(json.dumps(
        {"text": "pick up the red cup slowly", "expected": PICK}) + "\n")
    inputs = labelled_inputs(settings, stream, model="qwen2.5-0.5b")
    assert [c.command_id for c in inputs.stream.commands] == ["a"]
    assert "1 of 2 commands have no label and are left out" in inputs.assumption
    assert "compact JSON" in inputs.assumption and "ggml-vocab-qwen2.gguf" in inputs.assumption
    (tmp_path / "labels.jsonl").unlink()
    with pytest.raises(UntimedError, match="no labels"):
        labelled_inputs(settings, stream, model="qwen2.5-0.5b")


def test_json_costs_more_tokens_than_the_action_format(tmp_path: Path) -> None:
    stream = read_stream(SHIPPED_DIR / "steady_operator")
    outs = {}
    for profile in ("instruct-json", "bundled-actions"):
        inputs = labelled_inputs(RunSettings(log_dir=tmp_path, profile=profile), stream,
                                 model="qwen2.5-0.5b", quant="Q4_K_M")
        outs[profile] = sorted(c.tokens_out for c in inputs.untimed.commands if c.asked)
    half = len(outs["bundled-actions"]) // 2
    assert outs["instruct-json"][half] > 2 * outs["bundled-actions"][half]


def test_without_weights_within_10_percent_of_the_untimed_pass(tmp_path: Path) -> None:
    """Done when: the answer from the labels alone is within 10% of the untimed pass's e2e p50
    on the target, for the bundled planner (whose vocabulary loads without its weights) on a
    shipped labelled stream, in its compact action format."""
    model = str(bundled_model_path())
    stream = read_stream(SHIPPED_DIR / "steady_operator")
    settings = RunSettings(log_dir=tmp_path / "run", model=model, target_device="orin-nano-8gb",
                           deadline_ms=150.0)
    ran = untimed_inputs(settings, stream, cache_dir=tmp_path / "cache")
    assumed = labelled_inputs(settings, stream, model=model)
    assert assumed.untimed.engine == "labels" and ran.untimed.engine == "llamacpp"
    # the same prompts, counted the same way: every command's prompt tokens agree exactly
    own = ran.untimed.by_id()
    for c in assumed.untimed.commands:
        assert c.prompt_tokens == own[c.command_id].prompt_tokens
        if own[c.command_id].plan == c.plan:  # the model wrote the labelled plan
            assert c.tokens_out == own[c.command_id].tokens_out
    a_ran, a_assumed = answers_from_inputs([("ran", ran, None), ("labels", assumed, None)],
                                           draws=50)
    assert a_assumed.e2e_p50_ms == pytest.approx(a_ran.e2e_p50_ms, rel=0.10)
    assert a_assumed.facts["engine"] == "labels" and a_ran.facts["engine"] == "llamacpp"
    assert a_assumed.facts["tokens_per_plan"] == a_ran.facts["tokens_per_plan"]


def test_a_tokenizer_for_every_model_or_a_clear_refusal() -> None:
    assert tokenizer_for_model("qwen2.5-1.5b").path.name == "ggml-vocab-qwen2.gguf"
    assert tokenizer_for_model(str(bundled_model_path())).path == bundled_model_path()
    from robot_latency.profiles.vocab import VocabError

    assert tokenizer_for_model("llama-3.2-1b").path.name == "ggml-vocab-llama-bpe.gguf"
    assert tokenizer_for_model("phi-3.5-mini").path.name == "ggml-vocab-phi-3.gguf"
    with pytest.raises(VocabError, match=r"smollm2-360m: no shipped tokenizer"):
        tokenizer_for_model("smollm2-360m")


def test_a_preset_is_prompted_in_its_own_chat_template(tmp_path: Path) -> None:
    """Llama-3.2-1B without weights: the instruct-json profile's prompt is rendered in Llama 3's
    template (not the profile's chatml) and counted by Llama 3's tokenizer; the answer says so."""
    stream = read_stream(SHIPPED_DIR / "steady_operator")
    settings = RunSettings(log_dir=tmp_path, profile="instruct-json")
    llama = labelled_inputs(settings, stream, model="llama-3.2-1b")
    qwen = labelled_inputs(settings, stream, model="qwen2.5-0.5b")
    assert "chat template llama3 (llama-3.2-1b's own; profile instruct-json names chatml)" \
        in llama.assumption and "ggml-vocab-llama-bpe.gguf" in llama.assumption
    assert "chat template chatml" in qwen.assumption
    planning = load_planning("instruct-json")
    first = next(c for c in stream.commands)
    own = llama.untimed.by_id()[first.command_id]
    with VocabTokenizer.for_family("llama-bpe") as tok:
        from robot_latency.profiles.chat import Message, render

        turns = [Message(r, t) for r, t in planning.messages(first.text, first.state)]
        text = render("llama3", turns, add_assistant=True)
        assert "<|start_header_id|>system<|end_header_id|>" in text
        # the engine's count: BOS, the fixed prefix and the turn (llama3 separates cleanly)
        assert own.prompt_tokens == tok.count(text, add_bos=True)
    # the same plans, other tokenizers: the counts differ, and the answer follows them
    assert [c.command_id for c in llama.untimed.commands] == \
        [c.command_id for c in qwen.untimed.commands]
    assert [c.prompt_tokens for c in llama.untimed.commands] != \
        [c.prompt_tokens for c in qwen.untimed.commands]


def test_a_label_no_format_can_write_is_left_out(tmp_path: Path) -> None:
    planning = load_planning("bundled-actions")
    stream = CommandStream("s", "s", topic=None, commands=(Command(0, "dance", "a"),
                                                           Command(1, "stop", "b")))
    labels = LabelSet()
    from robot_latency.profiles.labels import Label

    labels.add(Label({"steps": [{"action": "dance"}]}), text="dance")
    labels.add(Label({"steps": [{"action": "stop"}]}), text="stop")
    with tokenizer_for_model(str(bundled_model_path())) as tok:
        lp = labelled_pass(planning, stream, labels, tok, max_tokens=24, max_command_chars=300)
    assert lp.unwritable == ("a",)
    assert [c.command_id for c in lp.stream.commands] == ["b"]
    assert replace(lp.untimed.commands[0]).tokens_out >= 2  # <stop><end>
