"""The planner node's readiness signal: ``planner/ready`` (std_msgs/Bool, transient local).

A client that calls the node right after it starts must know when a call is served on time.
The action server is discovered as soon as it exists, long before that: while the model still
loads, a goal waits in the middleware and is answered late (by the fallback, its deadline gone).
The node says it is ready only once all of these hold:

- the engine is loaded and its fixed prefix evaluated (at run open, before the loop starts);
- the loop thread runs and the engine is warm: one generation thrown away
  (:mod:`robot_latency.planner.warmup`);
- the PlanCommand action server and the topics exist (created at configure), and the node's
  own warm-up goal went through the action's goal, feedback and result paths
  (:mod:`robot_latency.ros.action_warmup`; started when the check is armed);
- the loopback pings that measure the transport margin are back (when it is measured).

Then it publishes ``true`` on ``planner/ready`` and logs ``planner ready: ...``; when the run
closes (deactivate, shutdown, the end of the process) it publishes ``false``. The topic is
transient local with depth 1, so a client that subscribes later still gets the latest value.
A client waits for ``ActionClient.wait_for_server()`` and for ``true`` here before its first
goal (docs/ROS.md, *Readiness*). The check runs on a timer in the node's executor.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from std_msgs.msg import Bool

from robot_latency.ros.topics import READY_TOPIC

log = logging.getLogger(__name__)

#: How often the conditions are looked at while the node is not ready yet (s).
CHECK_PERIOD_S = 0.01


def ready_qos() -> QoSProfile:
    """The readiness topic's QoS: reliable, transient local, the latest value only. A client's
    subscription must be transient local too to get a value published before it matched."""
    return QoSProfile(depth=1, history=HistoryPolicy.KEEP_LAST,
                      reliability=ReliabilityPolicy.RELIABLE,
                      durability=DurabilityPolicy.TRANSIENT_LOCAL)


class Readiness:
    """Publish ``planner/ready``: false now, true once ``ready()`` holds after :meth:`arm`.

    Args:
        node: the planner node (a plain publisher: it says false in every state).
        ready: the conditions besides the loop's (called in the executor thread).
        on_ready: called once each time the node becomes ready (after ``true`` is published).
        on_arm: called each time the check is armed (the loop runs), before the first check.
    """

    def __init__(self, node: Node, ready: Callable[[], bool],
                 on_ready: Callable[[], None] | None = None,
                 on_arm: Callable[[], None] | None = None) -> None:
        self.node = node
        self._ready = ready
        self._on_ready = on_ready
        self._on_arm = on_arm
        self.is_ready = False
        self._timer: Any = None
        self._pub = node.create_publisher(Bool, READY_TOPIC, ready_qos())
        self._pub.publish(Bool(data=False))

    def arm(self) -> None:
        """Start checking (the loop runs): say true as soon as the conditions hold."""
        if self._timer is None and not self.is_ready:
            if self._on_arm is not None:
                self._on_arm()
            self._timer = self.node.create_timer(CHECK_PERIOD_S, self._check)

    def _check(self) -> None:
        if self.is_ready or not self._ready():
            return
        self._stop_timer()
        self.is_ready = True
        self._pub.publish(Bool(data=True))
        if self._on_ready is not None:
            self._on_ready()

    def clear(self) -> None:
        """The node serves no more plans (its run closed): say false."""
        self._stop_timer()
        if self.is_ready:
            self.is_ready = False
            try:
                self._pub.publish(Bool(data=False))
            except Exception as err:  # best effort: the context may be going down
                log.warning("could not publish planner/ready false: %r", err)

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self.node.destroy_timer(self._timer)
            self._timer = None


# ``core`` below is a robot_latency.ros.node_core.PlannerCore (not imported: node_core imports
# this module).
def core_ready(core: Any) -> bool:
    """Whether a planner node's core serves plans on time now: a run open, its loop running
    (started only once the engine is warm), the action and topics there, the action's warm-up
    goal back, the pings back."""
    driver, probe = core.driver, core.probe
    return (driver is not None and not driver.finished.is_set() and core.outputs is not None
            and core.outputs.warm_up.done and (probe is None or not probe.pinging))


def ready_line(core: Any) -> str:
    """The log line a planner node writes when it becomes ready."""
    driver, probe = core.driver, core.probe
    warm = driver.run.warm_up if driver is not None else None
    parts = []
    if warm is not None:
        parts.append(f"warm-up generation {warm['status']} in {warm['elapsed_ms']:.0f} ms")
    action = core.outputs.warm_up.line() if core.outputs is not None else None
    if action is not None:
        parts.append(action)
    if probe is not None:
        parts.append(f"transport loopback {probe.pings_received} of {probe.pings_sent} pings")
    parts.append(f"{core.node.resolve_topic_name(READY_TOPIC)} true")
    return "planner ready: " + ", ".join(parts)


def _became_ready(core: Any) -> None:
    core.logger.info(ready_line(core))
    # the start-up's record (robot_latency.ros.cold_start): ready, the warm-up, the pings' end
    if core.driver is not None:
        account = core.outputs.warm_up.result if core.outputs is not None else None
        core.cold.ready(core.driver.run, pings_ended_ns=None if core.probe is None
                        else core.probe.pings_ended_ns,
                        action_warm_up=None if account is None else account.as_dict())


def core_readiness(core: Any) -> Readiness:
    """The readiness signal of a planner node's core (its log line on the node's logger; the
    node's cold-start record notes it)."""
    return Readiness(core.node, lambda: core_ready(core), lambda: _became_ready(core),
                     on_arm=lambda: _warm_up_action(core))


def _warm_up_action(core: Any) -> None:
    if core.outputs is not None:
        core.outputs.warm_up.start()
