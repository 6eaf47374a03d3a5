"""The planner's topic names, written once: both planner nodes, the transport probe and the bag
replayer (the client edge) import them from here.

Relative names (the root namespace makes them ``/planner/...``); a namespace
(``-r __ns:=/robot1``) or a remap (``-r planner/command:=/operator/say``) moves them. Only
``/diagnostics`` is absolute, as diagnostic aggregators expect. Pure Python (no rclpy).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from robot_latency.profiles.actions import is_refusal

#: in: one operator command per message (std_msgs/String; tagged JSON from a client edge).
COMMAND_TOPIC = "planner/command"
#: in: one operator command per message, typed (robot_latency_interfaces/msg/Command: header
#: stamped with its send, id, text, state); read as the tagged string is. A name of its own: Fast
#: DDS refuses a second type on one topic name in a participant (robot_latency.ros.command_input).
COMMAND_TYPED_TOPIC = "planner/command_typed"
#: in: robot state text for planner profiles whose prompt has ``{state}``; the latest message
#: is what the next cycles' prompts carry.
STATE_TOPIC = "planner/state"
#: out: the plan, one per cycle (robot_latency_interfaces/msg/Plan; its ``outcome`` says a
#: refusal, which is never a motion: :func:`plan_message`).
PLAN_TOPIC = "planner/plan"
#: out: the same plan as the JSON envelope (std_msgs/String), what ``planner/plan`` carried
#: before the typed Plan; kept for one release behind the ``plan_json`` parameter.
PLAN_JSON_TOPIC = "planner/plan_json"
#: the action a caller asks for one plan through: a goal per command, feedback while it is
#: planned, its plan as the result, a cancel (robot_latency_interfaces/action/PlanCommand).
PLAN_ACTION = "planner/plan_command"
#: out: the cycle's CycleRecord as JSON (while the ``cycle_json`` parameter is true, this
#: release's default).
CYCLE_TOPIC = "planner/cycle"
#: out: the cycle's figures as typed numbers (robot_latency_interfaces/msg/CycleStats), one per
#: cycle, stamped with the command the cycle answered.
CYCLE_STATS_TOPIC = "planner/cycle_stats"
#: out and in: the node's loopback pings at start-up (only while the transport margin is
#: measured, ``transport_margin_ms < 0``).
PROBE_TOPIC = "planner/latency_probe"
#: in: a receiver acknowledges each plan by publishing its ``cycle`` (as text) here; the node
#: takes the round trip into its transport margin (the client edge, ``bag_replayer``, does).
ACK_TOPIC = "planner/plan_ack"
#: out: whether the node serves plans now (std_msgs/Bool, transient local: a late subscriber
#: gets the latest): true once the engine is loaded and warm, the loop runs, the action is
#: served and the loopback pings are back; false while no run is open
#: (:mod:`robot_latency.ros.readiness`).
READY_TOPIC = "planner/ready"
#: out: health by thresholds (diagnostic_msgs/DiagnosticArray).
DIAGNOSTICS_TOPIC = "/diagnostics"


@dataclass(frozen=True)
class Endpoint:
    """One topic a planner node publishes or subscribes to, with its ROS message type."""

    topic: str
    type: str
    direction: str  # "pub" or "sub"


_STRING, _DIAG = "std_msgs/msg/String", "diagnostic_msgs/msg/DiagnosticArray"
PLAN_TYPE = "robot_latency_interfaces/msg/Plan"
CYCLE_STATS_TYPE = "robot_latency_interfaces/msg/CycleStats"
COMMAND_TYPE = "robot_latency_interfaces/msg/Command"
PLAN_ACTION_TYPE = "robot_latency_interfaces/action/PlanCommand"

#: What a running planner node (plain or managed, active) publishes and subscribes to, besides
#: rclpy's own (/rosout, /parameter_events) and the lifecycle node's transition events.
PLANNER_ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint(COMMAND_TOPIC, _STRING, "sub"),
    Endpoint(COMMAND_TYPED_TOPIC, COMMAND_TYPE, "sub"),
    Endpoint(STATE_TOPIC, _STRING, "sub"),
    Endpoint(PLAN_TOPIC, PLAN_TYPE, "pub"),
    Endpoint(CYCLE_STATS_TOPIC, CYCLE_STATS_TYPE, "pub"),
    Endpoint(DIAGNOSTICS_TOPIC, _DIAG, "pub"),
    Endpoint(READY_TOPIC, "std_msgs/msg/Bool", "pub"),
)

#: Added while ``cycle_json`` is true (the default for this release): the JSON cycle record.
CYCLE_JSON_ENDPOINTS: tuple[Endpoint, ...] = (Endpoint(CYCLE_TOPIC, _STRING, "pub"),)

#: Added while ``plan_json`` is true (the default for this release): the JSON envelope.
PLAN_JSON_ENDPOINTS: tuple[Endpoint, ...] = (Endpoint(PLAN_JSON_TOPIC, _STRING, "pub"),)

#: Added while the transport margin is measured: the loopback pings, and the node's own plans
#: received back (the plan topic subscribed to).
PROBE_ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint(PROBE_TOPIC, _STRING, "pub"),
    Endpoint(PROBE_TOPIC, _STRING, "sub"),
    Endpoint(PLAN_TOPIC, PLAN_TYPE, "sub"),
    Endpoint(ACK_TOPIC, _STRING, "sub"),
)


def plan_message(envelope: dict[str, Any]) -> dict[str, Any]:
    """Return the envelope as the plan topic carries it: ``outcome`` is ``"plan"`` (a motion
    plan in ``plan``) or ``"refused"`` (the planner cannot plan this command: ``plan`` is null,
    never a motion; ``refusal`` holds what refused it)."""
    if is_refusal(envelope.get("plan")):
        return {**envelope, "outcome": "refused", "plan": None, "refusal": envelope["plan"]}
    return {**envelope, "outcome": "plan"}
