"""Labels: partial plans, semantic JSON comparison, refusals, labels that do not fit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from robot_latency.profiles.actions import REFUSE_PLAN, Step, expand_to_plan, plan_json_schema
from robot_latency.profiles.labels import (
    Label,
    LabelError,
    check_label,
    plan_matches,
    read_labels,
    stream_labels,
)
from robot_latency.profiles.rules import rule_plan_json
from robot_latency.streams.jsonl import read_jsonl

SCHEMA = plan_json_schema()
PICK_PLACE = expand_to_plan([Step("pick", "apple", "red"), Step("place", "hallway")])


def test_a_partial_label_compares_only_what_it_gives() -> None:
    label = {"steps": [{"action": "pick", "target": "apple"}, {"action": "place"}]}
    check_label(label, schema=SCHEMA, where="t")
    assert plan_matches(label, PICK_PLACE)
    # a field it gives that differs, or a step more or fewer, is wrong
    assert not plan_matches({"steps": [{"action": "pick", "target": "cup"}, {}]}, PICK_PLACE)
    assert not plan_matches({"steps": [{"action": "pick"}]}, PICK_PLACE)
    assert not plan_matches({"steps": [{}, {}, {}]}, PICK_PLACE)
    assert plan_matches({"steps": [{}, {}]}, PICK_PLACE)


def test_the_issues_fallback_plan_is_judged_wrong() -> None:
    # The keyword fallback dropped the apple and the corridor: published on time, but wrong.
    command = "place the red apple in the corridor and after that bring a red towel to the table"
    label = expand_to_plan([Step("pick", "apple", "red"), Step("place", "hallway"),
                            Step("pick", "towel", "red"), Step("place", "table")])
    fallback = rule_plan_json(command)
    assert fallback is not None
    assert Label(label).judge(fallback) is False
    assert Label(label).judge(label) is True
    assert Label(label).judge(None) is None  # nothing published: not judged


def test_comparison_is_semantic_key_order_whitespace_and_schema_defaults() -> None:
    schema = {"type": "object", "properties": {
        "verb": {"enum": ["go", "halt"]}, "where": {"type": "string"},
        "speed": {"enum": ["slow", "normal"], "default": "normal"}}}
    label = json.loads('{"where": "dock",\n   "verb": "go"}')
    plan = json.loads('{"verb":"go","where":"dock","speed":"normal"}')
    assert plan_matches(label, plan, schema=schema)
    # a default filled on the plan's side too: a label saying "normal" matches a plan that
    # leaves the speed out, and not one that says "slow"
    assert plan_matches({"verb": "go", "speed": "normal"}, {"verb": "go"}, schema=schema)
    assert not plan_matches({"verb": "go", "speed": "normal"}, {"verb": "go", "speed": "slow"},
                            schema=schema)
    assert not plan_matches({"verb": "go", "speed": "normal"}, {"verb": "go"})  # no schema


def test_refusal_is_judged_like_any_plan() -> None:
    refuse = Label("refuse")
    assert refuse.kind == "refuse" and refuse.judge(REFUSE_PLAN) is True
    assert refuse.judge(PICK_PLACE) is False
    assert Label({"steps": [{"action": "goto"}]}).judge(REFUSE_PLAN) is False
    assert Label({"steps": [{}]}).judge(REFUSE_PLAN) is False  # a plan label is never a refusal
    assert Label({"steps": [{"action": "stop"}]}).kind == "stop"


@pytest.mark.parametrize(("label", "match"), [
    ({"steps": [{"action": "fly"}]}, r"steps/0"),
    ({"steps": [{"action": "pick", "target": "banana"}]}, r"steps/0"),
    ({"plan": []}, r"\(root\)"),
    ("maybe", r"a plan object or \"refuse\""),
])
def test_a_label_that_does_not_fit_is_one_line_naming_the_line(tmp_path: Path, label,
                                                               match: str) -> None:
    path = tmp_path / "labels.jsonl"
    path.write_text(json.dumps({"text": "go to the kitchen", "expected": {"steps": [
        {"action": "goto", "target": "kitchen"}]}}) + "\n"
        + json.dumps({"command_id": "s:1", "expected": label}) + "\n")
    with pytest.raises(LabelError, match=match) as err:
        read_labels(path, schema=SCHEMA)
    assert str(err.value).startswith(f"{path}:2: ") and "\n" not in str(err.value)


def test_stream_labels_own_then_sidecar_and_unlabelled(tmp_path: Path) -> None:
    stream = tmp_path / "s.jsonl"
    stream.write_text("\n".join(json.dumps(x) for x in [
        {"t_ns": 0, "text": "stop", "expected": {"steps": [{"action": "stop"}]}},
        {"t_ns": 1, "text": "Go to the Kitchen!"},
        {"t_ns": 2, "text": "what time is it"},
        {"t_ns": 3, "text": "wave"},
    ]) + "\n")
    side = tmp_path / "labels.jsonl"
    side.write_text(json.dumps({"text": "go to the kitchen", "expected": {"steps": [
        {"action": "goto", "target": "kitchen"}]}}) + "\n"
        + json.dumps({"command_id": "s:2", "expected": "refuse"}) + "\n")
    commands = read_jsonl(stream).commands
    labels = stream_labels(commands, schema=SCHEMA, source=str(stream),
                           sidecar=read_labels(side, schema=SCHEMA))
    assert labels.lookup("s:0").kind == "stop"
    assert labels.lookup("s:1").kind == "goto"  # by text, normalized
    assert labels.lookup("s:2@3").refuse  # a replayer's ID@PLAY
    assert labels.lookup("s:3") is None  # unlabelled
    assert labels.text_of("s:1@0") == "Go to the Kitchen!"


def test_a_streams_own_label_that_does_not_fit_names_its_line(tmp_path: Path) -> None:
    stream = tmp_path / "s.jsonl"
    stream.write_text(json.dumps({"t_ns": 0, "text": "stop"}) + "\n\n"
                      + json.dumps({"t_ns": 1, "text": "x", "expected": {"steps": 3}}) + "\n")
    with pytest.raises(LabelError, match=rf"^{stream}:3: the label does not fit"):
        stream_labels(read_jsonl(stream).commands, schema=SCHEMA, source=str(stream))
