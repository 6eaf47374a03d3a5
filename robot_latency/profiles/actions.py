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

``<refuse>`` is the planner's "cannot plan" (a question, chit-chat, an unknown or misspelled place
or object): it is a whole plan by itself, ``<refuse><end>``, never a step among motions. It
expands to the one-step plan :data:`REFUSE_PLAN` (action ``refuse``), which a node publishes as a
refusal, never as a motion.

The planner expands a parsed sequence into the JSON plan whose schema ships as
``robot_latency/data/plan.schema.json``::

    {"steps": [{"action": "pick", "target": "cup", "target_kind": "object",
                "color": "red", "speed": "normal"}, ...]}

``target``/``target_kind``/``color`` are ``null`` where the action takes none. The GBNF grammar
over the token text (``robot_latency/data/plan_actions.gbnf``) is generated from the same lists
(:func:`actions_gbnf`), so the vocabulary, the parser and the grammar cannot drift apart.

The vocabulary lives in :mod:`robot_latency.profiles.vocabulary`, the schema and grammar in
:mod:`robot_latency.profiles.action_schema`; this module re-exports their names.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from robot_latency.errors import RobotLatencyError
from robot_latency.profiles.action_schema import (
    INSTRUCT_MAX_STEPS,
    actions_gbnf,
    instruct_plan_schema,
    plan_json_schema,
    render_plan_files,
    write_plan_files,
)
from robot_latency.profiles.vocabulary import (
    ACTION_TOKENS,
    ACTIONS,
    COLORS,
    END_TOKEN,
    LOCATION_ACTIONS,
    LOCATIONS,
    NO_SPEED_ACTIONS,
    OBJECT_ACTIONS,
    OBJECTS,
    PLAN_TOKEN,
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
    "ACTIONS",
    "ACTION_TOKENS",
    "COLORS",
    "END_TOKEN",
    "INSTRUCT_MAX_STEPS",
    "LOCATIONS",
    "LOCATION_ACTIONS",
    "NO_SPEED_ACTIONS",
    "OBJECTS",
    "OBJECT_ACTIONS",
    "PLAN_TOKEN",
    "REFUSE_ACTION",
    "REFUSE_PLAN",
    "REFUSE_TOKEN",
    "SPEEDS",
    "SPEED_VALUES",
    "STOP_STEP_PLAN",
    "PlanParseError",
    "Step",
    "actions_gbnf",
    "expand_to_plan",
    "instruct_plan_schema",
    "is_refusal",
    "parse_actions",
    "plan_json_schema",
    "render_plan_files",
    "steps_to_tokens",
    "validate_plan",
    "write_plan_files",
]

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
    _check_refusal_alone(steps)
    for step in steps:
        _check_step(step)
        out.append(action_token(step.action))
        if step.color is not None:
            out.append(color_token(step.color))
        if step.action in OBJECT_ACTIONS:
            out.append(object_token(str(step.target)))
        elif step.action in LOCATION_ACTIONS:
            out.append(location_token(str(step.target)))
        if step.speed != "normal":
            out.append(action_token(step.speed))
    if end:
        out.append(END_TOKEN)
    return out


def _check_refusal_alone(steps: list[Step] | tuple[Step, ...]) -> None:
    if len(steps) > 1 and any(s.action == REFUSE_ACTION for s in steps):
        raise PlanParseError(f"{REFUSE_ACTION} is a whole plan, never a step among others")


def _check_step(step: Step) -> None:
    if step.action == REFUSE_ACTION:
        if step.target is not None or step.color is not None or step.speed != "normal":
            raise PlanParseError(f"{REFUSE_ACTION} takes no target, colour or speed")
        return
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
    if REFUSE_TOKEN in tokens:
        if tokens != [REFUSE_TOKEN]:
            raise PlanParseError(f"{REFUSE_TOKEN} is a whole plan by itself in {text!r}")
        return [Step(REFUSE_ACTION)]
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


#: The refusal ("cannot plan") in the expanded form: what ``<refuse>`` expands to.
REFUSE_PLAN: dict[str, Any] = {"steps": [{"action": REFUSE_ACTION, "target": None,
                                          "target_kind": None, "color": None,
                                          "speed": "normal"}]}


def is_refusal(plan: Any) -> bool:
    """Return whether ``plan`` (a JSON plan in any profile's form) is a refusal.

    A refusal is a plan whose only step has the action ``refuse`` (:data:`REFUSE_PLAN` for the
    action language; a JSON profile's schema may allow the same step).
    """
    if not isinstance(plan, dict):
        return False
    steps = plan.get("steps")
    return (isinstance(steps, list) and len(steps) == 1 and isinstance(steps[0], dict)
            and steps[0].get("action") == REFUSE_ACTION)


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
    _check_refusal_alone(steps)
    return steps


if __name__ == "__main__":
    # python -m robot_latency.profiles.actions  -> regenerate the shipped grammar and schema
    write_plan_files(Path(__file__).resolve().parent.parent / "data")
