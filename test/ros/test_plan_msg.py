"""The plan envelope as a typed Plan and back (robot_latency_interfaces built into the venv)."""

from __future__ import annotations

import json

from builtin_interfaces.msg import Time
from rclpy.serialization import deserialize_message, serialize_message

from robot_latency.profiles.actions import REFUSE_PLAN
from robot_latency.profiles.profile import load_planning
from robot_latency.ros.plan_msg import goal_command_id, no_plan, plan_envelope, typed_plan
from robot_latency.ros.topics import plan_message
from robot_latency_interfaces.msg import Plan

STAMP = Time(sec=1_700_000_000, nanosec=5)


def _envelope(plan: object, **kw: object) -> dict:
    return {"cycle": 7, "command_id": "c7", "source": "model", "fallback_reason": None,
            "plan": plan, "deadline_met": True, "cycle_ms": 41.5, "deadline_ms": 80.0,
            "margin_ms": 3.5, "tokens_out": 6, **kw}


def test_an_action_language_plan_has_typed_steps_and_its_json() -> None:
    planning = load_planning(None)  # the bundled action language
    plan = planning.contract.parse("<pick><col:red><obj:cup><place><loc:tray><slow><end>")
    msg = typed_plan(plan_message(_envelope(plan)), stamp=STAMP,
                     contract_kind=planning.contract.kind)
    assert msg.outcome == "plan" and msg.refusal_json == ""
    assert [(s.action, s.target, s.target_kind, s.color, s.speed) for s in msg.steps] == [
        ("pick", "cup", "object", "red", "normal"), ("place", "tray", "location", "", "slow")]
    assert json.loads(msg.plan_json) == plan and msg.header.stamp == STAMP
    # over the wire (CDR) and back into the envelope's form: nothing lost
    back = plan_envelope(deserialize_message(serialize_message(msg), Plan))
    want = {k: v for k, v in plan_message(_envelope(plan)).items() if k != "tokens_out"}
    assert back == want


def test_a_refusal_is_its_own_outcome_never_steps() -> None:
    msg = typed_plan(plan_message(_envelope(REFUSE_PLAN)), stamp=STAMP, contract_kind="actions")
    assert msg.outcome == "refused" and list(msg.steps) == [] and msg.plan_json == "null"
    assert json.loads(msg.refusal_json) == REFUSE_PLAN
    back = plan_envelope(msg)
    assert back["outcome"] == "refused" and back["plan"] is None
    assert back["refusal"] == REFUSE_PLAN


def test_a_json_profile_plan_has_no_steps_but_its_json() -> None:
    plan = {"steps": [{"action": "goto", "target": "door"}], "note": "free-form"}
    msg = typed_plan(_envelope(plan), stamp=STAMP, contract_kind="json")
    assert list(msg.steps) == [] and json.loads(msg.plan_json) == plan


def test_no_command_and_no_plan_read_back_as_none() -> None:
    msg = typed_plan(_envelope(None, command_id=None, source="fallback",
                                 fallback_reason="no_command", cycle=None),
                       stamp=STAMP, contract_kind="actions")
    assert msg.command_id == "" and msg.cycle == -1 and msg.plan_json == "null"
    back = plan_envelope(msg)
    assert back["command_id"] is None and back["cycle"] is None and back["plan"] is None
    empty = no_plan("ab" * 16, "cancelled", stamp=STAMP)
    assert (empty.source, empty.fallback_reason, plan_envelope(empty)["plan"]) == \
        ("none", "cancelled", None)


def test_a_goal_id_is_its_command_id() -> None:
    assert goal_command_id(bytes(range(16))) == bytes(range(16)).hex()
