"""The plan envelope as the typed ``robot_latency_interfaces/msg/Plan``, and back.

The loop hands the node one plan envelope per cycle (a dict: ``cycle``, ``command_id``,
``source``, ``fallback_reason``, ``plan``, ``deadline_met``, ``cycle_ms``, ``deadline_ms``,
``margin_ms``; as the topic carries it, :func:`robot_latency.ros.topics.plan_message`: with
``outcome`` plan or refused). :func:`typed_plan` makes the Plan the node publishes on
``planner/plan`` and returns as a PlanCommand result; :func:`plan_envelope` reads a received
Plan back into the same dict, so a receiver (the client edge, the report) reads either form
with one code path.

``steps`` is filled when the planner profile's output is the action language (its plans are
``{"steps": [{"action", "target", "target_kind", "color", "speed"}, ...]}``); ``plan_json`` always
holds the plan as the profile's JSON (``null`` when there is none).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import Any

from builtin_interfaces.msg import Time

from robot_latency_interfaces.msg import Plan, PlanStep

#: The planner profile's output contract kind whose plans have typed steps.
ACTION_LANGUAGE = "actions"
_STEP_FIELDS = ("action", "target", "target_kind", "color", "speed")


def goal_command_id(goal_uuid: Any) -> str:
    """A PlanCommand goal's command id: its goal id as 32 hex digits (what the plan carries)."""
    return uuid.UUID(bytes=bytes(goal_uuid)).hex


def plan_steps(plan: Any) -> list[PlanStep]:
    """Return an action-language plan's steps (empty when the plan has none or another shape);
    a field the step does not have, or has as null, is the empty string."""
    steps = plan.get("steps") if isinstance(plan, Mapping) else None
    if not isinstance(steps, list):
        return []
    out = []
    for step in steps:
        if isinstance(step, Mapping):
            out.append(PlanStep(**{f: "" if step.get(f) is None else str(step[f])
                                   for f in _STEP_FIELDS}))
    return out


def typed_plan(envelope: Mapping[str, Any], *, stamp: Time, contract_kind: str,
               published: Time | None = None) -> Plan:
    """Return the Plan for a plan envelope as the topic carries it, stamped ``stamp`` (the
    data's: the command it answers). A refusal (``outcome: refused``) has no steps and
    ``plan_json`` null; what refused is in ``refusal_json``.

    Args:
        envelope: the loop's plan envelope.
        stamp: the header stamp: the command's send (or arrival) on the node's ROS clock.
        contract_kind: the planner profile's output contract kind; ``actions`` fills ``steps``.
        published: when the node publishes it, on its ROS clock (default: ``stamp``).
    """
    msg = Plan()
    msg.header.stamp = stamp
    msg.published = published if published is not None else stamp
    cycle = envelope.get("cycle")
    msg.cycle = cycle if isinstance(cycle, int) else -1
    msg.command_id = str(envelope.get("command_id") or "")
    msg.source = str(envelope.get("source") or "")
    msg.fallback_reason = str(envelope.get("fallback_reason") or "")
    msg.deadline_met = bool(envelope.get("deadline_met"))
    for name in ("cycle_ms", "deadline_ms", "margin_ms"):
        value = envelope.get(name)
        setattr(msg, name, float(value) if isinstance(value, int | float) else 0.0)
    plan = envelope.get("plan")
    msg.outcome = str(envelope.get("outcome") or "plan")
    if contract_kind == ACTION_LANGUAGE:
        msg.steps = plan_steps(plan)
    msg.plan_json = json.dumps(plan, separators=(",", ":"), ensure_ascii=False)
    if envelope.get("refusal") is not None:
        msg.refusal_json = json.dumps(envelope["refusal"], separators=(",", ":"),
                                      ensure_ascii=False)
    return msg


def no_plan(command_id: str, reason: str, *, stamp: Time) -> Plan:
    """The result of a goal that ended without a plan (source ``none``; ``reason``: cancelled,
    superseded, skipped, not_running)."""
    msg = Plan(command_id=command_id, source="none", fallback_reason=reason,
               plan_json="null", cycle=-1, outcome="none")
    msg.header.stamp = stamp
    msg.published = stamp
    return msg


def plan_envelope(msg: Plan) -> dict[str, Any]:
    """Read a received Plan back into the envelope's form (``plan`` from ``plan_json``; a
    ``plan_json`` that is not JSON is kept as the text under ``plan``)."""
    try:
        plan: Any = json.loads(msg.plan_json) if msg.plan_json else None
    except ValueError:
        plan = msg.plan_json
    out: dict[str, Any] = {"outcome": msg.outcome}
    if msg.refusal_json:
        try:
            out["refusal"] = json.loads(msg.refusal_json)
        except ValueError:
            out["refusal"] = msg.refusal_json
    return {**out, "cycle": msg.cycle if msg.cycle >= 0 else None,
            "command_id": msg.command_id or None, "source": msg.source,
            "fallback_reason": msg.fallback_reason or None, "plan": plan,
            "deadline_met": msg.deadline_met, "cycle_ms": msg.cycle_ms,
            "deadline_ms": msg.deadline_ms or None, "margin_ms": msg.margin_ms}
