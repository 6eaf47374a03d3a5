"""The planner's action language: action tokens, their parser, and the expanded JSON plan.

The model emits a compact sequence of dedicated action tokens, ended by ``<end>``::

    <pick><col:red><obj:cup><place><loc:tray><slow><end>

Each step is ``ACTION [COLOR] [TARGET] [SPEED]`` with a fixed shape per action:

=========  ==========================  =====================================
action     target                      example command
=========  ==========================  =====================================
pick       ``[<col:C>] <obj:O>``        "pick up the red cup"
find       ``[<col:C>] <obj:O>``        "look for the blue bottle"
place      ``<loc:L>``                  "put it on the tray"
goto       ``<loc:L>``                  "go to the charging dock"
give       none                         "hand it to me"
stop       none (no speed)              "stop"
wait       none (no speed)              "wait here"
=========  ==========================  =====================================

A speed token (``<slow>`` or ``<fast>``) may follow any step but stop and wait; without one the
speed is ``normal``. A one-step plan is at most 4 tokens plus ``<end>``.

The planner expands a parsed sequence into the JSON plan whose schema ships as
``robot_latency/data/plan.schema.json``::

    {"steps": [{"action": "pick", "target": "cup", "target_kind": "object",
                "color": "red", "speed": "normal"}, ...]}

``target``/``target_kind``/``color`` are ``null`` where the action takes none. The GBNF grammar
over the token text (``robot_latency/data/plan_actions.gbnf``) is generated from the same lists
(:func:`actions_gbnf`), so the vocabulary, the parser and the grammar cannot drift apart.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from robot_latency.errors import RobotLatencyError

__all__ = [
    "ACTIONS",
    "ACTION_TOKENS",
    "COLORS",
    "END_TOKEN",
    "LOCATIONS",
    "LOCATION_ACTIONS",
    "NO_SPEED_ACTIONS",
    "OBJECTS",
    "OBJECT_ACTIONS",
    "PLAN_TOKEN",
    "SPEEDS",
    "STOP_STEP_PLAN",
    "PlanParseError",
    "Step",
    "actions_gbnf",
    "expand_to_plan",
    "parse_actions",
    "plan_json_schema",
    "render_plan_files",
    "steps_to_tokens",
    "validate_plan",
    "write_plan_files",
]

ACTIONS: tuple[str, ...] = ("pick", "find", "place", "goto", "give", "stop", "wait")
OBJECT_ACTIONS: frozenset[str] = frozenset({"pick", "find"})
LOCATION_ACTIONS: frozenset[str] = frozenset({"place", "goto"})
NO_SPEED_ACTIONS: frozenset[str] = frozenset({"stop", "wait"})

COLORS: tuple[str, ...] = ("red", "blue", "green", "yellow", "black", "white", "orange", "purple")
OBJECTS: tuple[str, ...] = (
    "cup", "bottle", "box", "ball", "book", "can", "mug", "plate", "bowl", "apple", "sponge",
    "towel", "phone", "remote",
)  # fmt: skip
LOCATIONS: tuple[str, ...] = (
    "kitchen", "table", "tray", "shelf", "charging_dock", "door", "bin", "sink", "counter",
    "desk", "workbench", "living_room", "garage", "hallway", "operator",
)  # fmt: skip
# Explicit speed tokens; "normal" is the absence of one.
SPEEDS: tuple[str, ...] = ("slow", "fast")
SPEED_VALUES: tuple[str, ...] = ("slow", "normal", "fast")

PLAN_TOKEN = "<plan>"  # separates the command from the plan in the prompt
END_TOKEN = "<end>"  # ends the plan; the GGUF's EOS token


def _action_token(name: str) -> str:
    return f"<{name}>"


def _color_token(name: str) -> str:
    return f"<col:{name}>"


def _object_token(name: str) -> str:
    return f"<obj:{name}>"


def _location_token(name: str) -> str:
    return f"<loc:{name}>"


ACTION_TOKENS: tuple[str, ...] = (
    tuple(_action_token(a) for a in ACTIONS)
    + tuple(_color_token(c) for c in COLORS)
    + tuple(_object_token(o) for o in OBJECTS)
    + tuple(_location_token(loc) for loc in LOCATIONS)
    + tuple(_action_token(s) for s in SPEEDS)
)
"""Every token the model may emit before ``<end>``, in vocabulary order."""

_TOKEN_RE = re.compile(r"<[^<>\s]+>")


class PlanParseError(RobotLatencyError, ValueError):
    """An action-token sequence or a JSON plan that does not follow the plan language."""


@dataclass(frozen=True)
class Step:
    """One plan step.

    Attributes:
        action: one of ``ACTIONS``.
        target: object name (pick, find), location name (place, goto) or None.
        color: object colour or None.
        speed: ``slow``, ``normal`` or ``fast`` (always ``normal`` for stop and wait).
    """

    action: str
    target: str | None = None
    color: str | None = None
    speed: str = "normal"

    @property
    def target_kind(self) -> str | None:
        """Return ``object``, ``location`` or None, from the action."""
        if self.action in OBJECT_ACTIONS:
            return "object"
        if self.action in LOCATION_ACTIONS:
            return "location"
        return None


def steps_to_tokens(steps: list[Step] | tuple[Step, ...], *, end: bool = True) -> list[str]:
    """Render steps as action tokens.

    Args:
        steps: the plan.
        end: append ``<end>``.

    Returns:
        The token strings, e.g. ``["<pick>", "<obj:cup>", "<end>"]``.

    Raises:
        PlanParseError: a step is not valid.
    """
    out: list[str] = []
    for step in steps:
        _check_step(step)
        out.append(_action_token(step.action))
        if step.color is not None:
            out.append(_color_token(step.color))
        if step.action in OBJECT_ACTIONS:
            out.append(_object_token(str(step.target)))
        elif step.action in LOCATION_ACTIONS:
            out.append(_location_token(str(step.target)))
        if step.speed != "normal":
            out.append(_action_token(step.speed))
    if end:
        out.append(END_TOKEN)
    return out


def _check_step(step: Step) -> None:
    if step.action not in ACTIONS:
        raise PlanParseError(f"unknown action {step.action!r}")
    if step.speed not in SPEED_VALUES:
        raise PlanParseError(f"unknown speed {step.speed!r}")
    if step.action in NO_SPEED_ACTIONS and step.speed != "normal":
        raise PlanParseError(f"{step.action} takes no speed")
    if step.action in OBJECT_ACTIONS:
        if step.target not in OBJECTS:
            raise PlanParseError(f"{step.action} needs an object, got {step.target!r}")
        if step.color is not None and step.color not in COLORS:
            raise PlanParseError(f"unknown colour {step.color!r}")
    else:
        if step.color is not None:
            raise PlanParseError(f"{step.action} takes no colour")
        if step.action in LOCATION_ACTIONS:
            if step.target not in LOCATIONS:
                raise PlanParseError(f"{step.action} needs a location, got {step.target!r}")
        elif step.target is not None:
            raise PlanParseError(f"{step.action} takes no target")


def parse_actions(text: str) -> list[Step]:
    """Parse action-token text (as the model emits it) into steps.

    Whitespace between tokens is ignored; a trailing ``<end>`` is optional, nothing may follow it.

    Args:
        text: e.g. ``"<pick><col:red><obj:cup><place><loc:tray><end>"``.

    Returns:
        The steps, at least one.

    Raises:
        PlanParseError: the text is empty, has stray characters or breaks the step grammar.
    """
    tokens = _TOKEN_RE.findall(text)
    if _TOKEN_RE.sub("", text).strip():
        raise PlanParseError(f"stray text outside tokens in {text!r}")
    if END_TOKEN in tokens:
        end = tokens.index(END_TOKEN)
        if end != len(tokens) - 1:
            raise PlanParseError(f"tokens after {END_TOKEN} in {text!r}")
        tokens = tokens[:end]
    if not tokens:
        raise PlanParseError(f"empty plan in {text!r}")
    steps: list[Step] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        m = re.fullmatch(r"<([a-z_]+)>", tok)
        if m is None or m.group(1) not in ACTIONS:
            raise PlanParseError(f"expected an action at token {i}, got {tok!r} in {text!r}")
        action = m.group(1)
        i += 1
        color: str | None = None
        target: str | None = None
        if action in OBJECT_ACTIONS:
            if i < len(tokens) and tokens[i].startswith("<col:"):
                color = tokens[i][5:-1]
                i += 1
            if i >= len(tokens) or not tokens[i].startswith("<obj:"):
                raise PlanParseError(f"{action} needs an object token in {text!r}")
            target = tokens[i][5:-1]
            i += 1
        elif action in LOCATION_ACTIONS:
            if i >= len(tokens) or not tokens[i].startswith("<loc:"):
                raise PlanParseError(f"{action} needs a location token in {text!r}")
            target = tokens[i][5:-1]
            i += 1
        speed = "normal"
        if action not in NO_SPEED_ACTIONS and i < len(tokens):
            sm = re.fullmatch(r"<([a-z_]+)>", tokens[i])
            if sm is not None and sm.group(1) in SPEEDS:
                speed = sm.group(1)
                i += 1
        step = Step(action=action, target=target, color=color, speed=speed)
        _check_step(step)
        steps.append(step)
    return steps


def expand_to_plan(steps: list[Step] | tuple[Step, ...]) -> dict[str, Any]:
    """Expand parsed steps into the JSON plan (``plan.schema.json``).

    Args:
        steps: the parsed plan.

    Returns:
        ``{"steps": [{"action", "target", "target_kind", "color", "speed"}, ...]}``.
    """
    out = []
    for step in steps:
        d = asdict(step)
        out.append(
            {
                "action": d["action"],
                "target": d["target"],
                "target_kind": step.target_kind,
                "color": d["color"],
                "speed": d["speed"],
            }
        )
    return {"steps": out}


#: The safe stop plan in the expanded form: what the ``stop`` fallback publishes.
STOP_STEP_PLAN: dict[str, Any] = {"steps": [{"action": "stop", "target": None,
                                             "target_kind": None, "color": None,
                                             "speed": "normal"}]}


def validate_plan(plan: Any) -> list[Step]:
    """Validate an expanded JSON plan against the plan schema's rules.

    Checks the same rules as ``plan.schema.json`` plus the per-action shape, without needing a
    JSON Schema library.

    Args:
        plan: a decoded JSON object.

    Returns:
        The plan's steps.

    Raises:
        PlanParseError: the plan breaks the schema.
    """
    if not isinstance(plan, dict) or set(plan) != {"steps"}:
        raise PlanParseError("a plan is an object with exactly one key, 'steps'")
    raw = plan["steps"]
    if not isinstance(raw, list) or not raw:
        raise PlanParseError("'steps' must be a non-empty list")
    keys = {"action", "target", "target_kind", "color", "speed"}
    steps = []
    for n, item in enumerate(raw):
        if not isinstance(item, dict) or set(item) != keys:
            raise PlanParseError(f"step {n} must have exactly the keys {sorted(keys)}")
        step = Step(
            action=item["action"], target=item["target"], color=item["color"], speed=item["speed"]
        )
        _check_step(step)
        if item["target_kind"] != step.target_kind:
            raise PlanParseError(f"step {n}: target_kind must be {step.target_kind!r}")
        steps.append(step)
    return steps


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
            "steps": {
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
                        variant(sorted(NO_SPEED_ACTIONS), null, null, null, {"const": "normal"}),
                    ],
                },
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
        "# Generated by robot_latency.plan.actions.actions_gbnf(); do not edit by hand.",
        "root   ::= step+",
        "step   ::= objact color? object speed? | locact location speed? | give speed? | halt",
        f"objact ::= {alt([_action_token(a) for a in ACTIONS if a in OBJECT_ACTIONS])}",
        f"locact ::= {alt([_action_token(a) for a in ACTIONS if a in LOCATION_ACTIONS])}",
        f'give   ::= "{_action_token("give")}"',
        f"halt   ::= {alt([_action_token(a) for a in ACTIONS if a in NO_SPEED_ACTIONS])}",
        f"color  ::= {alt([_color_token(c) for c in COLORS])}",
        f"object ::= {alt([_object_token(o) for o in OBJECTS])}",
        f"location ::= {alt([_location_token(loc) for loc in LOCATIONS])}",
        f"speed  ::= {alt([_action_token(s) for s in SPEEDS])}",
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
    schema["properties"]["steps"]["maxItems"] = INSTRUCT_MAX_STEPS
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


if __name__ == "__main__":
    # python -m robot_latency.plan.actions  -> regenerate the shipped grammar and schema
    write_plan_files(Path(__file__).resolve().parent.parent / "data")
