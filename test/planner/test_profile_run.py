"""Planner profiles end to end through ``robot-latency run`` on real llama.cpp.

- The bundled planner gets normalized text: typed commands ("STOP!") get the same model plan as
  their plain forms ("stop").
- ``instruct-json`` on a random-weight Qwen2.5-0.5B-shape model: every cycle the model finishes
  yields a schema-valid plan (the grammar guarantees the form; the content is noise), and each
  cycle prefills only its own part (the fixed prefix stays cached).
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from robot_latency.cli import main
from robot_latency.profiles.actions import instruct_plan_schema
from robot_latency.records import read_records
from robot_latency.streams import Command, write_jsonl


def run(tmp_path: Path, texts: list[str], *extra: str, deadline_ms: int = 5000) -> Path:
    stream = write_jsonl(tmp_path / "s.jsonl",
                         [Command(i * 1_000_000_000, t, f"c{i}") for i, t in enumerate(texts)])
    out = tmp_path / "run"
    rc = main(["run", "--stream", str(stream), "--mode", "event", "--asap",
               "--deadline-ms", str(deadline_ms), "--period-ms", str(deadline_ms),
               "--out", str(out), *extra])
    assert rc == 0
    return out


def test_typed_and_plain_commands_get_the_same_model_plan(
        tmp_path: Path, typed_and_plain: list[tuple[str, str]]) -> None:
    texts = [t for pair in typed_and_plain for t in pair]
    out = run(tmp_path, texts)
    recs = {r.command_id: r for r in read_records(out / "cycles.jsonl")}
    assert len(recs) == len(texts)
    for i, (typed, plain) in enumerate(typed_and_plain):
        a, b = recs[f"c{2 * i}"], recs[f"c{2 * i + 1}"]
        assert (a.plan_source, b.plan_source) == ("model", "model"), (typed, a.fallback_reason)
        assert a.prompt == b.prompt == f"{plain}<plan>"
        assert a.plan == b.plan, (typed, a.plan, b.plan)
    actions = {recs[f"c{2 * i}"].plan["steps"][0]["action"] for i in range(3)}  # type: ignore
    assert actions == {"stop"}  # "STOP", "Stop!", "  stop  ": a stop plan, never a pick
    assert recs["c6"].plan["steps"][0]["action"] == "wait"  # type: ignore[index]
    assert recs["c8"].plan["steps"][0]["target"] == "charging_dock"  # type: ignore[index]
    red = recs["c10"].plan["steps"][0]  # type: ignore[index]
    assert (red["action"], red["color"], red["target"]) == ("pick", "red", "cup")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["profile"]["name"] == "bundled-actions"
    assert len(manifest["profile"]["sha256"]) == 64 and "normalize: bundled" in \
        manifest["profile"]["content"]


@pytest.fixture(scope="module")
def qwen05_synth(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from robot_latency.models.synth import synth

    return synth("qwen2.5-0.5b", "Q4_K_M",
                 tmp_path_factory.mktemp("synth") / "qwen2.5-0.5b.Q4_K_M.gguf", seed=0)


def test_instruct_json_on_a_random_weight_model_gives_schema_valid_plans(
        tmp_path: Path, qwen05_synth: Path) -> None:
    # The planner vocabulary spells JSON punctuation byte by byte: the longest 3-step plan is
    # ~290 tokens here (an instruction-tuned model's tokenizer needs about a third of that).
    # What is asserted is the plans' form, not their time: the deadline only has to outlast
    # 2 x 320 tokens of a 0.5B shape on a loaded core (60 s did not, at a load average of 8).
    out = run(tmp_path, ["Pick up the RED cup, and place it on the tray!", "STOP!"],
              "--model", str(qwen05_synth), "--profile", "instruct-json", "--max-tokens", "320",
              deadline_ms=600_000)
    recs = read_records(out / "cycles.jsonl")
    assert len(recs) == 2
    schema = instruct_plan_schema()
    manifest = json.loads((out / "manifest.json").read_text())
    prefix_tokens = manifest["engine_info"]["warm_prefix_tokens"]
    assert prefix_tokens >= 200
    # a plan ends at its closing brace (stop_reason complete) or on an end token (done)
    finished = [r for r in recs if r.stop_reason in ("done", "complete")]
    assert finished, [(r.stop_reason, r.fallback_reason) for r in recs]
    for r in recs:
        if r.stop_reason in ("done", "complete"):
            assert r.plan_source == "model", (r.fallback_reason, r.engine_error, r.raw_output)
            jsonschema.validate(r.plan, schema)
            assert json.loads(r.raw_output or "") == r.plan
        # The prefix was evaluated at load: every cycle reuses it and prefills only its part.
        assert r.prefix_cache_tokens is not None and r.prefix_cache_tokens >= prefix_tokens
        assert r.prompt is not None and r.prompt.startswith("<|im_start|>user\n")


def test_jsonl_state_reaches_the_prompt(tmp_path: Path) -> None:
    import yaml

    profile = tmp_path / "stateful.yaml"
    profile.write_text(yaml.safe_dump({
        "name": "stateful", "prompt": {"user": "{state} {command}<plan>",
                                       "state_default": "idle"}}))
    stream = write_jsonl(tmp_path / "s.jsonl", [Command(0, "Stop!", "a"),
                                                Command(1, "stop", "b", state="docked")])
    assert main(["run", "--stream", str(stream), "--mode", "event", "--asap", "--profile",
                 str(profile), "--out", str(tmp_path / "run")]) == 0
    prompts = {r.command_id: r.prompt for r in read_records(tmp_path / "run" / "cycles.jsonl")}
    assert prompts == {"a": "idle stop<plan>", "b": "docked stop<plan>"}
