"""The plan language's JSON Schema and GBNF grammar, generated from its vocabulary.

``robot_latency/data/plan.schema.json`` (:func:`plan_json_schema`), the instruct-json profile's
``profiles/robot_plan.schema.json`` (:func:`instruct_plan_schema`) and
``robot_latency/data/plan_actions.gbnf`` (:func:`actions_gbnf`) are rendered from
:mod:`robot_latency.profiles.vocabulary`; ``python -m robot_latency.profiles.actions`` writes them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from robot_latency.profiles.vocabulary import (
    ACTIONS,
    COLORS,
    LOCATION_ACTIONS,
    LOCATIONS,
    NO_SPEED_ACTIONS,
    OBJECT_ACTIONS,
    OBJECTS,
    REFUSE_ACTION,
    REFUSE_TOKEN,
    SPEED_VALUES,
    SPEEDS,
    action_token,
    color_token,
    location_token,
    object_token,
)

__all__ = [
    "INSTRUCT_MAX_STEPS",
    "actions_gbnf",
    "instruct_plan_schema",
    "plan_json_schema",
    "render_plan_files",
    "write_plan_files",
]


def plan_json_schema() -> dict[str, Any]:
    """Return the JSON Schema (draft 2020-12) of the expanded plan.

    Returns:
        The schema as a dict; ``robot_latency/data/plan.schema.json`` is this, serialised.
    """

    def variant(actions: list[str], target: Any, kind: Any, color: Any, speed: Any) -> dict:
        # Each variant is a whole object (type, required, no extra keys), so a grammar derived
        # from the schema (llama-cpp-python's json_schema_to_gbnf) enforces every key too.
        return {
            "type": "object",
            "additionalProperties": False,
            "required": ["action", "target", "target_kind", "color", "speed"],
            "properties": {
                "action": {"enum": actions},
                "target": target,
                "target_kind": kind,
                "color": color,
                "speed": speed,
            }
        }

    null = {"type": "null"}
    any_speed = {"enum": list(SPEED_VALUES)}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://robot-latency.invalid/plan.schema.json",
        "title": "robot_latency plan",
        "description": "A planner's plan, expanded from its action tokens.",
        "type": "object",
        "additionalProperties": False,
        "required": ["steps"],
        "properties": {
            # Either a chain of motions or a refusal: the one-step plan ``refuse``, alone.
            "steps": {
                "oneOf": [
                    {
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "type": "object",
                            "additionalProperties": False,
                            "required": ["action", "target", "target_kind", "color", "speed"],
                            "properties": {
                                "action": {"enum": list(ACTIONS)},
                                "target": {"type": ["string", "null"]},
                                "target_kind": {"enum": ["object", "location", None]},
                                "color": {"enum": [*COLORS, None]},
                                "speed": any_speed,
                            },
                            "oneOf": [
                                variant(
                                    sorted(OBJECT_ACTIONS),
                                    {"enum": list(OBJECTS)},
                                    {"const": "object"},
                                    {"enum": [*COLORS, None]},
                                    any_speed,
                                ),
                                variant(
                                    sorted(LOCATION_ACTIONS),
                                    {"enum": list(LOCATIONS)},
                                    {"const": "location"},
                                    null,
                                    any_speed,
                                ),
                                variant(["give"], null, null, null, any_speed),
                                variant(sorted(NO_SPEED_ACTIONS), null, null, null,
                                        {"const": "normal"}),
                            ],
                        },
                    },
                    {
                        "type": "array",
                        "minItems": 1,
                        "maxItems": 1,
                        "items": variant([REFUSE_ACTION], null, null, null, {"const": "normal"}),
                    },
                ]
            }
        },
    }


def actions_gbnf() -> str:
    """Return the GBNF grammar of the action-token text (without ``<end>``).

    ``<end>`` is the model's EOS token: llama.cpp's grammar sampler allows EOS once the grammar is
    complete, so the grammar itself stops after the last step.

    Returns:
        GBNF text that ``llama_cpp.LlamaGrammar.from_string`` accepts.
    """

    def alt(tokens: list[str]) -> str:
        return " | ".join(f'"{t}"' for t in tokens)

    lines = [
        "# Generated by robot_latency.profiles.actions.actions_gbnf(); do not edit by hand.",
        "root   ::= step+ | refuse",
        "step   ::= objact color? object speed? | locact location speed? | give speed? | halt",
        f"objact ::= {alt([action_token(a) for a in ACTIONS if a in OBJECT_ACTIONS])}",
        f"locact ::= {alt([action_token(a) for a in ACTIONS if a in LOCATION_ACTIONS])}",
        f'give   ::= "{action_token("give")}"',
        f"halt   ::= {alt([action_token(a) for a in ACTIONS if a in NO_SPEED_ACTIONS])}",
        f"color  ::= {alt([color_token(c) for c in COLORS])}",
        f"object ::= {alt([object_token(o) for o in OBJECTS])}",
        f"location ::= {alt([location_token(loc) for loc in LOCATIONS])}",
        f"speed  ::= {alt([action_token(s) for s in SPEEDS])}",
        f'refuse ::= "{REFUSE_TOKEN}"',
    ]
    return "\n".join(lines) + "\n"


#: Most steps the instruct-json profile's schema allows: a bound on the JSON a model may write.
INSTRUCT_MAX_STEPS = 3


def instruct_plan_schema() -> dict[str, Any]:
    """Return the schema of the ``instruct-json`` profile: the expanded plan, at most
    :data:`INSTRUCT_MAX_STEPS` steps (so constrained decoding ends within its token budget)."""
    schema = plan_json_schema()
    schema["$id"] = "https://robot-latency.invalid/robot_plan.schema.json"
    schema["title"] = "robot_latency plan (instruct-json profile)"
    schema["description"] = ("A plan in the robot's action vocabulary, written as JSON by an "
                             f"instruction-tuned model; at most {INSTRUCT_MAX_STEPS} steps.")
    schema["properties"]["steps"]["oneOf"][0]["maxItems"] = INSTRUCT_MAX_STEPS
    return schema


def render_plan_files() -> dict[str, str]:
    """Return the shipped plan files' contents, generated from the vocabulary lists.

    Returns:
        ``{"plan.schema.json": ..., "plan_actions.gbnf": ...,
        "profiles/robot_plan.schema.json": ...}``.
    """
    import json

    return {
        "plan.schema.json": json.dumps(plan_json_schema(), indent=2) + "\n",
        "plan_actions.gbnf": actions_gbnf(),
        "profiles/robot_plan.schema.json": json.dumps(instruct_plan_schema(), indent=2) + "\n",
    }


def write_plan_files(data_dir: str | Path) -> list[Path]:
    """Write ``plan.schema.json`` and ``plan_actions.gbnf`` into a directory.

    Args:
        data_dir: usually ``robot_latency/data``.

    Returns:
        The paths written.
    """
    out = []
    for name, text in render_plan_files().items():
        path = Path(data_dir) / name
        path.write_text(text)
        out.append(path)
    return out
