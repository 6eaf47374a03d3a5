"""The planner's one way to build an engine: the registry's, with the planner's parts wired in.

The simulated engine plays whatever its builder injects; a planner run gives it the rule
planner's reading of each command (:func:`rule_responder`). Used in the loop's own process
(inline runner) and inside the engine worker process alike.
"""

from __future__ import annotations

from typing import Any

from robot_latency.engines.base import Engine, create_engine
from robot_latency.profiles.actions import END_TOKEN, PLAN_TOKEN, steps_to_tokens
from robot_latency.profiles.rules import rule_plan


def rule_responder(prompt: str) -> list[str]:
    """Return the rule planner's action tokens for the command in ``prompt`` (text before
    the ``<plan>`` marker, last line), or just ``<end>`` when it reads nothing."""
    command = prompt.split(PLAN_TOKEN)[0].strip().splitlines()[-1] if prompt.strip() else ""
    steps = rule_plan(command)
    return steps_to_tokens(steps) if steps else [END_TOKEN]


def create_planner_engine(name: str, **options: Any) -> Engine:
    """Create the registered engine ``name`` from ``options``, as a planner run uses it.

    Raises:
        EngineError: unknown engine or bad options (the message names which).
    """
    if name == "sim":
        options.setdefault("responder", rule_responder)
    return create_engine(name, **options)
