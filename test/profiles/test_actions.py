"""The action language: parsing, expansion, the shipped schema and GBNF grammar."""

from __future__ import annotations

import json

import pytest

from robot_latency.models import bundled
from robot_latency.profiles.actions import (
    ACTION_TOKENS,
    PlanParseError,
    Step,
    actions_gbnf,
    expand_to_plan,
    parse_actions,
    render_plan_files,
    steps_to_tokens,
    validate_plan,
)


def test_parse_round_trip() -> None:
    text = "<pick><col:red><obj:cup><place><loc:tray><slow><stop><end>"
    steps = parse_actions(text)
    assert steps == [
        Step("pick", "cup", "red"),
        Step("place", "tray", speed="slow"),
        Step("stop"),
    ]
    assert "".join(steps_to_tokens(steps)) == text
    assert parse_actions("<goto> <loc:kitchen> <fast>") == [Step("goto", "kitchen", speed="fast")]


def test_one_step_plan_is_short() -> None:
    longest = steps_to_tokens([Step("pick", "cup", "red", "fast")])
    assert len(longest) <= 8


@pytest.mark.parametrize(
    "text",
    [
        "",
        "<end>",
        "<pick><loc:tray>",
        "<place><obj:cup>",
        "<stop><slow>",
        "<give><loc:tray>",
        "<goto><loc:moon>",
        "<pick><obj:cup>hello",
        "<pick><obj:cup><end><stop>",
        "<col:red><obj:cup>",
    ],
)
def test_parse_rejects(text: str) -> None:
    with pytest.raises(PlanParseError):
        parse_actions(text)


def test_expand_and_validate() -> None:
    steps = parse_actions("<find><obj:ball><goto><loc:operator><give><fast>")
    plan = expand_to_plan(steps)
    assert plan["steps"][0] == {
        "action": "find",
        "target": "ball",
        "target_kind": "object",
        "color": None,
        "speed": "normal",
    }
    assert validate_plan(json.loads(json.dumps(plan))) == steps
    plan["steps"][1]["target_kind"] = "object"
    with pytest.raises(PlanParseError):
        validate_plan(plan)
    with pytest.raises(PlanParseError):
        validate_plan({"steps": []})


def test_shipped_plan_files_are_generated() -> None:
    for name, text in render_plan_files().items():
        assert (bundled.DATA_DIR / name).read_text() == text, (
            f"{name} is stale: run python -m robot_latency.profiles.actions"
        )
    schema = json.loads(bundled.schema_path().read_text())
    assert schema["required"] == ["steps"]


def test_grammar_covers_every_token() -> None:
    gbnf = actions_gbnf()
    for tok in ACTION_TOKENS:
        assert f'"{tok}"' in gbnf


def test_grammar_compiles_in_llama_cpp() -> None:
    import llama_cpp
    grammar = llama_cpp.LlamaGrammar.from_string(bundled.load_grammar_text(), verbose=False)
    assert grammar is not None
