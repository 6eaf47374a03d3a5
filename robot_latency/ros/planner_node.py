"""The ``planner_node`` executable: the deadline-enforced planner as a ROS 2 node.

Topics (relative names: in the root namespace they are the absolute names below; a namespace
(``-r __ns:=/robot1``) or a remap (``-r planner/command:=/operator/say``) moves them):

    in   planner/command   std_msgs/String    one operator command per message
    in   planner/state     std_msgs/String    robot state text for the profile's ``{state}``
    out  planner/plan      robot_latency_interfaces/msg/Plan   one per cycle, header stamped
                                              at publish; QoS declares the deadline (periodic
                                              mode: one plan per period)
    out  planner/plan_json std_msgs/String    the same as the JSON envelope (``plan_json``
                                              parameter, default true: kept for one release)
    action planner/plan_command  robot_latency_interfaces/action/PlanCommand   one plan per
                                              goal by its deadline, feedback, cancel
                                              (:mod:`robot_latency.ros.action_server`)
    out  planner/cycle     std_msgs/String    the cycle's CycleRecord as JSON
    out  /diagnostics      diagnostic_msgs/DiagnosticArray   health by thresholds
    both planner/latency_probe  std_msgs/String  loopback pings at start-up, while the
                                              transport margin is measured
    out  planner/ready     std_msgs/Bool      transient local: true once the node serves plans
                                              on time (model loaded and warm, loop running,
                                              pings back), false after the run closes
                                              (:mod:`robot_latency.ros.readiness`)

The names are :mod:`robot_latency.ros.topics`'; everything the node does is
:class:`~robot_latency.ros.node_core.PlannerCore`'s, shared with ``managed_planner_node``.

Threads: rclpy spins in the main thread (subscription, diagnostics timer, parameter services);
the planner loop runs in its own thread with the real clock; the engine runs in a worker process.
SIGINT / SIGTERM stop the loop after its current cycle, close the run (flush cycles.jsonl, write
summary.json) and exit 0. Bad parameters: the error is logged, an ERROR diagnostic published and
the process exits with status 2; a run that cannot start (engine, log directory) exits 1.

    planner_node --ros-args --params-file config/host.yaml -p engine:=sim
    ros2 run robot_latency planner_node --ros-args --params-file config/orin_nano_8gb.yaml
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node

from robot_latency.ros.diagnostics import StatusReport
from robot_latency.ros.loopback import TransportProbe
from robot_latency.ros.main_util import ros_main, spin_until
from robot_latency.ros.node_core import (
    EXIT_OK,
    EXIT_RUN_FAILED,
    NODE_NAME,
    CoreNode,
    NodeStepError,
    PlannerCore,
)

log = logging.getLogger(__name__)


class PlannerNode(CoreNode, Node):
    """The planner node: parameters in, planner run inside, plans and records out.

    A thin node around :class:`~robot_latency.ros.node_core.PlannerCore`: construction declares
    the parameters, configures the topics and opens the run; :meth:`start` starts its loop;
    :meth:`close` closes it. Construction never raises for a bad parameter or a run that cannot
    start: it logs the error, publishes an ERROR diagnostic and leaves the reason in
    :attr:`startup_error` (and the exit status in :attr:`startup_status`).

    Args:
        node_name: the node's name (params files address it by this name).
        **node_kwargs: passed to :class:`rclpy.node.Node` (``parameter_overrides``,
            ``context``, ``namespace``...).
    """

    def __init__(self, node_name: str = NODE_NAME, **node_kwargs: Any) -> None:
        super().__init__(node_name, **node_kwargs)
        self.startup_error: str | None = None
        self.startup_status = EXIT_OK
        self.core = PlannerCore(self)
        try:
            self.core.declare()
            settings = self.core.configure()
        except NodeStepError as err:
            self._fail(str(err), err.status)
            return
        try:
            driver = self.core.open_run()
        except NodeStepError as err:
            self._fail(f"planner run could not start: {err}", err.status)
            return
        cfg, p = settings.run, settings.run.settings
        self.get_logger().info(
            f"planner loaded: engine {cfg.engine} ({cfg.label}), target {cfg.target_device}, "
            f"{p.mode} mode, period {p.period_ms:g} ms, deadline {p.deadline_ms:g} ms; "
            f"profile {driver.run.planning.profile.name}; {self.core.topics_line()}; "
            f"log {cfg.log_dir}")

    @property
    def _probe(self) -> TransportProbe | None:
        return self.core.probe

    def _fail(self, message: str, status: int) -> None:
        self.startup_error, self.startup_status = message, status
        self.core.report_error("startup", message)

    def start(self) -> bool:
        """Start the planner loop thread; False (ERROR on /diagnostics) when it cannot run.

        The loop's CPU budget is applied in its thread: a real-time priority this user may not
        use is refused here, before any cycle runs.
        """
        if self.core.driver is None:
            raise RuntimeError(f"planner_node did not start: {self.startup_error}")
        try:
            self.core.start_loop()
        except NodeStepError as err:
            self._fail(str(err), err.status)
            return False
        return True

    def diagnostics(self) -> list[StatusReport]:
        """Return the current health reports (what the next /diagnostics message will carry)."""
        return self.core.reports() or []

    def close(self) -> dict[str, Any] | None:
        """Stop the loop, close the run (log flushed, summary.json written); return the summary."""
        return self.core.close_run()

    def destroy_node(self) -> None:
        """Close the run, then remove what the node made, the action server first, then the node.

        rclpy's ``destroy_node`` leaves an action server (a waitable) alone, and the server keeps
        the node's handle alive: both would be finalized at interpreter exit, after rclpy's
        shutdown, in no set order.
        """
        self.core.close_run()
        self.core.unconfigure()
        super().destroy_node()


def main(argv: list[str] | None = None) -> int:
    """Run the planner node until SIGINT / SIGTERM (or ``max_cycles``); return the exit status."""
    # A signal only asks the spin loop to stop, so the run is closed in order (rclpy's default
    # handler would shut the context down under the loop thread's feet).
    with ros_main(argv, log) as stop:
        node: PlannerNode | None = None
        executor: SingleThreadedExecutor | None = None
        status = EXIT_OK
        try:
            node = PlannerNode()
            if node.startup_error is not None:
                return node.startup_status
            executor = SingleThreadedExecutor()
            executor.add_node(node)
            if not node.start():
                return node.startup_status
            driver = node.driver
            assert driver is not None
            spin_until(executor, stop, done=driver.finished.is_set, period_s=0.1)
            if driver.error is not None:
                status = EXIT_RUN_FAILED
            node.close()
        finally:
            # In order, before rclpy shuts down: the run, the node's entities, the node, the
            # executor (nothing of rclpy is left to be finalized at interpreter exit).
            if executor is not None and node is not None:
                executor.remove_node(node)
            if node is not None:
                node.destroy_node()
            if executor is not None:
                executor.shutdown()
        return status


if __name__ == "__main__":
    sys.exit(main())
