"""Planner profiles: loading, strict checking, prompt building, contracts and fallback pieces."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from robot_latency.planner.fallback import FallbackChain, FallbackContext
from robot_latency.profiles import chat
from robot_latency.profiles.actions import (
    COLORS,
    LOCATIONS,
    OBJECTS,
    PlanParseError,
    expand_to_plan,
    instruct_plan_schema,
    is_refusal,
    parse_actions,
)
from robot_latency.profiles.normalize import normalize_command
from robot_latency.profiles.profile import (
    DEFAULT_PROFILE,
    Planning,
    ProfileError,
    load_planning,
    load_profile,
    shipped_profiles,
)


def write_profile(tmp_path: Path, data: dict, name: str = "p.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_shipped_profiles_load_and_the_default_is_the_bundled_planners() -> None:
    assert {"bundled-actions", "instruct-json"} <= set(shipped_profiles())
    assert DEFAULT_PROFILE == "bundled-actions"
    for name in shipped_profiles():
        planning = load_planning(name)
        assert planning.profile.name == name
        assert len(planning.profile.sha256) == 64
    assert load_profile(None).name == "bundled-actions"


def test_bundled_profile_gives_typed_and_plain_commands_the_same_prompt(
        typed_and_plain: list[tuple[str, str]]) -> None:
    planning = load_planning("bundled-actions")
    for typed, plain in typed_and_plain:
        assert normalize_command(typed) == plain
        assert planning.build(typed) == planning.build(plain)
        # Exactly the training format: normalize_command(command) + "<plan>", no prefix.
        assert planning.build(typed).text == plain + "<plan>"


def test_instruct_json_has_a_fixed_chat_prefix_and_a_per_cycle_user_turn() -> None:
    planning = load_planning("instruct-json")
    a, b = planning.build("STOP!"), planning.build("Go to the kitchen")
    assert a.prefix == b.prefix == planning.prefix
    assert a.prefix.startswith("<|im_start|>system\n")
    assert a.suffix == "<|im_start|>user\nSTOP!<|im_end|>\n<|im_start|>assistant\n"
    # The whole prompt is exactly llama.cpp's own chatml rendering of the conversation.
    p = planning.profile.prompt
    msgs = [chat.Message("system", p.system)]
    for ex in p.examples:
        msgs += [chat.Message("user", ex.command), chat.Message("assistant", ex.plan)]
    assert a.text == chat.render("chatml", [*msgs, chat.Message("user", "STOP!")],
                                 add_assistant=True)


def test_instruct_json_system_prompt_names_the_whole_vocabulary_and_examples_fit_the_schema(
) -> None:
    planning = load_planning("instruct-json")
    system = planning.profile.prompt.system
    for word in (*OBJECTS, *LOCATIONS, *COLORS):
        assert word in system, word
    shipped = json.loads(Path(planning.profile.output.schema or "").read_text())
    assert shipped == instruct_plan_schema()
    for ex in planning.profile.prompt.examples:
        planning.contract.parse(ex.plan)  # raises if an example breaks the schema


def test_json_contract_parses_valid_plans_and_refuses_the_rest() -> None:
    contract = load_planning("instruct-json").contract
    stop = ('{"steps":[{"action":"stop","target":null,"target_kind":null,"color":null,'
            '"speed":"normal"}]}')
    assert contract.parse(stop)["steps"][0]["action"] == "stop"
    with pytest.raises(PlanParseError, match="not JSON"):
        contract.parse('{"steps": [')
    with pytest.raises(PlanParseError, match="schema violation"):
        contract.parse('{"steps": [{"action": "fly"}]}')
    with pytest.raises(PlanParseError, match="schema violation"):
        contract.parse(json.dumps({"steps": [json.loads(stop)["steps"][0]] * 4}))  # > 3 steps
    assert contract.grammar is not None and 'space ::= ""' in contract.grammar


def test_a_grammar_from_the_schema_accepts_exactly_compact_schema_valid_text() -> None:
    import llama_cpp

    contract = load_planning("instruct-json").contract
    grammar = llama_cpp.LlamaGrammar.from_string(contract.grammar, verbose=False)
    assert grammar is not None
    schema = instruct_plan_schema()
    jsonschema.validate({"steps": [{"action": "give", "target": None, "target_kind": None,
                                    "color": None, "speed": "fast"}]}, schema)


def test_rule_fallback_of_a_json_profile_gives_only_schema_valid_plans() -> None:
    planning = load_planning("instruct-json")
    assert planning.rule is not None
    plan = planning.rule("Stop!")
    assert plan is not None and plan["steps"][0]["action"] == "stop"
    # Four steps break the schema's three: no answer, the chain goes on to hold and stop.
    assert planning.rule("pick the cup then go to the kitchen then put it on the table "
                         "then go to the garage") is None
    chain = FallbackChain(("rule", "hold", "stop"), rule=planning.rule, hold_max_age_ms=1000.0,
                          stop_plan=planning.stop_plan)
    # A command it reads no step in is refused, in the profile's schema, not guessed.
    policy, plan = chain.answer(FallbackContext(command="what is the weather", now_ns=0))
    assert policy == "rule" and is_refusal(plan)
    planning.contract.validate(plan)
    # Nothing to read at all: hold answers a new command with its stop-and-wait, no guess.
    policy, plan = chain.answer(FallbackContext(command="", now_ns=0))
    assert policy == "hold" and plan["steps"][0]["action"] == "wait"
    planning.contract.validate(plan)


# --- a user's own profile -----------------------------------------------------------------
def _own_schema(tmp_path: Path) -> Path:
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
              "additionalProperties": False, "required": ["verb"],
              "properties": {"verb": {"enum": ["halt", "dock", "patrol"]}}}
    path = tmp_path / "own.schema.json"
    path.write_text(json.dumps(schema))
    return path


def _own(tmp_path: Path, **fallback: object) -> dict:
    _own_schema(tmp_path)
    return {"name": "own", "normalize": "none", "chat_format": "llama3",
            "prompt": {"system": "Answer with a verb.",
                       "user": "State: {state}\nCommand: {command}", "state_default": "idle"},
            "output": {"contract": "json", "schema": "own.schema.json", "max_tokens": 16},
            "fallback": {"stop_plan": {"verb": "halt"}, **fallback}}


def test_keyword_fallback_and_state_in_a_users_profile(tmp_path: Path) -> None:
    data = _own(tmp_path, rule="keywords",
                keywords=[{"phrase": "go home", "plan": {"verb": "dock"}},
                          {"phrase": "STOP", "plan": {"verb": "halt"}}])
    planning = Planning(load_profile(write_profile(tmp_path, data)))
    assert planning.rule is not None
    assert planning.rule("Please go home now") == {"verb": "dock"}
    assert planning.rule("stop!") == {"verb": "halt"}  # phrases match normalized words
    assert planning.rule("go homeward") is None
    assert planning.stop_plan == {"verb": "halt"}
    assert "State: idle\nCommand: patrol" in planning.build("patrol").suffix
    assert "State: battery low\nCommand: patrol" in planning.build("patrol", "battery low").suffix
    assert planning.build("patrol").suffix.startswith("<|start_header_id|>user")


def test_without_a_rule_planner_the_chain_is_hold_then_stop(tmp_path: Path) -> None:
    planning = Planning(load_profile(write_profile(tmp_path, _own(tmp_path, rule="none"))))
    chain = FallbackChain(("rule", "hold", "stop"), rule=planning.rule, hold_max_age_ms=1000.0,
                          stop_plan=planning.stop_plan)
    assert chain.names == ("hold", "stop") and chain.dropped == ("rule",)
    # hold's stop-and-wait for a new command is, in a profile of its own, the stop plan
    assert chain.answer(FallbackContext(command="stop", now_ns=0)) == ("hold", {"verb": "halt"})
    assert chain.answer(FallbackContext(command=None, now_ns=0)) == ("stop", {"verb": "halt"})


def test_bundled_rule_is_refused_when_its_plans_break_the_users_schema(tmp_path: Path) -> None:
    path = write_profile(tmp_path, _own(tmp_path, rule="bundled"))
    with pytest.raises(ProfileError, match=r"fallback.rule .*breaks the output contract"):
        load_planning(str(path))


def test_a_stop_plan_that_breaks_the_schema_is_refused(tmp_path: Path) -> None:
    path = write_profile(tmp_path, _own(tmp_path, rule="none") | {
        "fallback": {"rule": "none", "stop_plan": {"verb": "explode"}}})
    with pytest.raises(ProfileError, match=r"fallback.stop_plan breaks the output contract"):
        load_planning(str(path))


# --- bad input: one line naming the file and the key ----------------------------------------
@pytest.mark.parametrize(("edit", "message"), [
    ({"colour": "red"}, r"unknown key colour; known: name, description"),
    ({"prompt": {"sytem": "x"}}, r"unknown key prompt.sytem; known: prompt.system"),
    ({"output": {"max_tokens": "many"}}, r"output.max_tokens must be an integer, got str"),
    ({"output": {"grammar": "yes"}}, r"output.grammar must be true or false, got str"),
    ({"prompt": "hello"}, r"prompt must be a mapping, got str"),
    ({"prompt": {"user": "{cmd}"}}, r"prompt.user: unknown placeholder \{cmd\}"),
    ({"prompt": {"user": "no placeholder"}}, r"prompt.user must contain \{command\}"),
    ({"normalize": "upper"}, r"normalize 'upper': must be one of bundled, none"),
    ({"output": {"contract": "xml"}}, r"output.contract 'xml': must be one of actions, json"),
    ({"output": {"contract": "json"}}, r"output.schema is required for the json contract"),
    ({"fallback": {"rule": "magic"}}, r"fallback.rule 'magic': must be one of"),
])
def test_bad_profiles_are_refused_naming_file_and_key(tmp_path: Path, edit: dict,
                                                      message: str) -> None:
    data = {"name": "bad", **edit}
    path = write_profile(tmp_path, data)
    with pytest.raises(ProfileError, match=message) as info:
        load_profile(str(path))
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_unknown_chat_format_lists_the_known_ones(tmp_path: Path) -> None:
    path = write_profile(tmp_path, {"name": "bad", "chat_format": "chatml2"})
    with pytest.raises(ProfileError, match="unknown chat format 'chatml2'; known: raw, ") as info:
        load_profile(str(path))
    for name in ("chatml", "llama3", "phi3", "gemma"):
        assert name in str(info.value)


def test_missing_or_invalid_schema_files_are_refused(tmp_path: Path) -> None:
    base = {"name": "s", "output": {"contract": "json", "schema": "nope.json"}}
    with pytest.raises(ProfileError, match=r"nope.json: no such file"):
        load_planning(str(write_profile(tmp_path, base)))
    (tmp_path / "broken.json").write_text("{not json")
    base["output"]["schema"] = "broken.json"
    with pytest.raises(ProfileError, match=r"broken.json: not JSON"):
        load_planning(str(write_profile(tmp_path, base)))
    (tmp_path / "invalid.json").write_text(json.dumps({"type": "no-such-type"}))
    base["output"]["schema"] = "invalid.json"
    with pytest.raises(ProfileError, match=r"invalid.json: not a valid JSON Schema"):
        load_planning(str(write_profile(tmp_path, base)))


def test_unknown_profile_name_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match=r"'nosuch': no such file, and not a shipped profile "
                                           r"\(bundled-actions, bundled-json, instruct-json"):
        load_profile("nosuch")
    path = tmp_path / "bad.yaml"
    path.write_text("name: [unclosed\n")
    with pytest.raises(ProfileError, match=r"bad.yaml: not valid YAML"):
        load_profile(str(path))


def test_a_copied_shipped_profile_finds_the_shipped_schema_by_name(tmp_path: Path) -> None:
    from robot_latency.profiles.profile import shipped_profiles

    copy = tmp_path / "my_robot.yaml"
    copy.write_text(shipped_profiles()["instruct-json"].read_text())  # the YAML alone
    planning = load_planning(str(copy))
    assert Path(planning.profile.output.schema).parent == shipped_profiles()[
        "instruct-json"].parent
    # a schema next to the copy wins over the shipped one of the same name
    (tmp_path / "robot_plan.schema.json").write_text(json.dumps(
        {"type": "object", "required": ["verb"], "properties": {"verb": {"enum": ["halt"]}}}))
    own = load_profile(str(copy))
    assert own.output.schema == str(tmp_path / "robot_plan.schema.json")


# --- is the output already a complete, valid plan? ----------------------------------------------
def test_complete_plan_is_asked_of_partial_outputs(tmp_path: Path) -> None:
    from robot_latency.profiles.contract import complete_plan, output_complete

    planning = Planning(load_profile(write_profile(tmp_path, _own(tmp_path, rule="none"))))
    contract = planning.contract
    text = '{"verb":"halt"}'
    assert [complete_plan(contract, text[:i]) for i in range(len(text))] == [None] * len(text)
    assert complete_plan(contract, text) == {"verb": "halt"}
    assert complete_plan(contract, text + "\n") == {"verb": "halt"}
    assert complete_plan(contract, '{"verb":"fly"}') is None  # complete, but not valid
    assert output_complete("json", '{"verb":"fly"}') and not output_complete("json", '{"v":1')
    assert not output_complete("json", "12")  # a number may go on
    assert not output_complete("json", '{"a":"}"')  # a brace inside a string
    actions = load_planning("bundled-actions").contract
    assert complete_plan(actions, "<stop>") is None
    assert complete_plan(actions, "<stop><end>") == expand_to_plan(parse_actions("<stop>"))
