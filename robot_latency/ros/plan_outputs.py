"""Where the planner node's plans go: the typed topic, the JSON topic, and the action's goals.

One place for the three ways out of a plan envelope the loop publishes:

    planner/plan           robot_latency_interfaces/msg/Plan, one per cycle (header stamped
                           with the command it answers; ``published``: the publish); QoS:
                           reliable, in periodic mode a deadline of one period
    planner/plan_json      std_msgs/String, the JSON envelope, as planner/plan carried before;
                           while the ``plan_json`` parameter is true (this release's default)
    planner/plan_command   the PlanCommand action: a goal's result is the first plan for it
                           (:mod:`robot_latency.ros.action_server`)

Both planner nodes build one in their configure step and remove it in their cleanup; a lifecycle
node passes its lifecycle publisher factory, so plans go out only while it is active.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from rclpy.duration import Duration
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from std_msgs.msg import String

from robot_latency.planner.config import RunSettings
from robot_latency.ros.action_server import PlanActionServer
from robot_latency.ros.action_warmup import ActionWarmUp
from robot_latency.ros.cycle_stats import ClockBridge, time_msg
from robot_latency.ros.driver import PlannerDriver
from robot_latency.ros.plan_msg import typed_plan
from robot_latency.ros.topics import PLAN_JSON_TOPIC, PLAN_TOPIC, plan_message
from robot_latency_interfaces.msg import Plan


def plan_qos(planner: RunSettings) -> QoSProfile:
    """Return the plan publishers' QoS: reliable, and in periodic mode a deadline of one period.

    The deadline is the node's promise that a plan follows the previous one within a period;
    a subscriber may request it (its requested deadline must be >= the period to match). Event
    mode publishes only when commands arrive, so it declares no deadline.
    """
    qos = QoSProfile(depth=10, history=HistoryPolicy.KEEP_LAST,
                     reliability=ReliabilityPolicy.RELIABLE,
                     durability=DurabilityPolicy.VOLATILE)
    if planner.mode == "periodic":
        qos.deadline = Duration(nanoseconds=planner.period_ns)
    return qos


class PlanOutputs:
    """The plan publishers and the PlanCommand action server of a configured planner node.

    Args:
        node: the planner node.
        create_publisher: its publisher factory (a lifecycle node's lifecycle one).
        planner: the run's settings (the plan QoS).
        clocks: moves the plans' stamps onto the ROS clock.
        plan_json: also publish the JSON envelope on ``planner/plan_json``.
        driver: returns the open run's driver (None: not running; goals are rejected).
        on_handoff: a goal result's handoff time (ns), for the transport margin.
    """

    def __init__(self, node: Node, create_publisher: Callable[..., Any], planner: RunSettings,
                 clocks: ClockBridge, *, plan_json: bool,
                 driver: Callable[[], PlannerDriver | None],
                 on_handoff: Callable[[int], None] | None = None) -> None:
        self.node = node
        self.clocks = clocks
        self._driver = driver
        qos = plan_qos(planner)
        self._plan_pub = create_publisher(Plan, PLAN_TOPIC, qos)
        self._json_pub = create_publisher(String, PLAN_JSON_TOPIC, qos) if plan_json else None
        self.actions = PlanActionServer(node, driver=driver, on_handoff=on_handoff)
        # the node's own first goal, before it says it is ready (robot_latency.ros.readiness)
        self.warm_up = ActionWarmUp(node, self.actions.register_warm_up)

    def publish(self, envelope: Mapping[str, Any]) -> None:
        """Publish one cycle's plan (the loop's thread) and hand it to its goal, if any."""
        driver = self._driver()
        kind = driver.run.planning.contract.kind if driver is not None else ""
        envelope = plan_message(dict(envelope))  # a refusal is its own outcome, never a motion
        # The header carries the data's stamp (the command's send or arrival, on the loop's
        # clock) moved onto the ROS clock; the publish time has a field of its own.
        loop_clock = driver.run.clock if driver is not None else None
        data_ns, published_ns = envelope.get("data_ns"), envelope.get("published_ns")
        stamp_ns = self.clocks.ros_ns(data_ns if isinstance(data_ns, int) else None, loop_clock)
        published_ns = self.clocks.ros_ns(
            published_ns if isinstance(published_ns, int) else None, loop_clock)
        msg = typed_plan(envelope, stamp=time_msg(stamp_ns), published=time_msg(published_ns),
                         contract_kind=kind)
        command_id = envelope.get("command_id")
        # the goal's result first: its executor hand-off runs while the topics are published
        tokens = envelope.get("tokens_out")
        self.actions.plan_published(command_id if isinstance(command_id, str) else None, msg,
                                    tokens=tokens if isinstance(tokens, int) else 0)
        self._plan_pub.publish(msg)
        if self._json_pub is not None:
            self._json_pub.publish(String(data=json.dumps(envelope, separators=(",", ":"))))

    def destroy(self, destroy_publisher: Callable[[Any], Any]) -> None:
        """Remove the publishers and the action server (open goals are aborted)."""
        self.warm_up.destroy()
        self.actions.destroy()
        for pub in (self._plan_pub, self._json_pub):
            if pub is not None:
                destroy_publisher(pub)
