"""The ``planner_node`` executable: the deadline-enforced planner as a ROS 2 node.

Topics (relative names: in the root namespace they are the absolute names below; a namespace
(``-r __ns:=/robot1``) or a remap (``-r planner/command:=/operator/say``) moves them):

    in   planner/command   std_msgs/String    one operator command per message
    out  planner/plan      std_msgs/String    JSON plan envelope, one per cycle; QoS declares
                                              the deadline (periodic mode: one plan per period)
    out  planner/cycle     std_msgs/String    the cycle's CycleRecord as JSON
    out  /diagnostics      diagnostic_msgs/DiagnosticArray   health by thresholds

Threads: rclpy spins in the main thread (subscription, diagnostics timer, parameter services);
the planner loop runs in its own thread with the real clock; the engine runs in a worker process.
SIGINT / SIGTERM stop the loop after its current cycle, close the run (flush cycles.jsonl, write
summary.json) and exit 0. Bad parameters: the error is logged, an ERROR diagnostic published and
the process exits with status 2; a run that cannot start (engine, log directory) exits 1.

    planner_node --ros-args --params-file config/host.yaml -p engine:=sim
    ros2 run robot_latency planner_node --ros-args --params-file config/orin_nano_8gb.yaml
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Sequence
from typing import Any

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rcl_interfaces.msg import SetParametersResult
from rclpy.duration import Duration
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from std_msgs.msg import String

from robot_latency.planner.config import PlannerConfig
from robot_latency.planner.session import RunError
from robot_latency.records import CycleRecord
from robot_latency.ros.client_edge import monotonic_clock_id, read_command
from robot_latency.ros.declare import declare_table, unknown_overrides
from robot_latency.ros.diagnostics import CycleWindow, DiagnosticsTracker, StatusReport
from robot_latency.ros.driver import PlannerDriver
from robot_latency.ros.loopback import TransportProbe
from robot_latency.ros.main_util import ros_main, spin_until
from robot_latency.ros.params import (
    PLANNER_NAMES,
    PLANNER_PARAMS,
    ParamError,
    PlannerSettings,
    check_update,
    planner_settings,
)

log = logging.getLogger(__name__)

NODE_NAME = "planner_node"
COMMAND_TOPIC = "planner/command"
#: Robot state text for planner profiles whose prompt has ``{state}``: the latest message is
#: what the next cycles' prompts carry.
STATE_TOPIC = "planner/state"
PLAN_TOPIC = "planner/plan"
CYCLE_TOPIC = "planner/cycle"
DIAGNOSTICS_TOPIC = "/diagnostics"

EXIT_OK, EXIT_RUN_FAILED, EXIT_BAD_PARAMETER = 0, 1, 2


def plan_qos(planner: PlannerConfig) -> QoSProfile:
    """Return the plan publisher's QoS: reliable, and in periodic mode a deadline of one period.

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


class PlannerNode(Node):
    """The planner node: parameters in, planner run inside, plans and records out.

    Construction never raises for a bad parameter or a run that cannot start: it logs the
    error, publishes an ERROR diagnostic and leaves the reason in :attr:`startup_error`
    (and the exit status in :attr:`startup_status`).

    Args:
        node_name: the node's name (params files address it by this name).
        **node_kwargs: passed to :class:`rclpy.node.Node` (``parameter_overrides``,
            ``context``, ``namespace``...).
    """

    def __init__(self, node_name: str = NODE_NAME, **node_kwargs: Any) -> None:
        super().__init__(node_name, **node_kwargs)
        self.startup_error: str | None = None
        self.startup_status = EXIT_OK
        # a tagged command stamped on this boot's monotonic clock starts its deadline at its send
        self._clock_id = monotonic_clock_id()
        self.driver: PlannerDriver | None = None
        self.settings: PlannerSettings | None = None
        self._probe: TransportProbe | None = None
        self._hardware_id = ""
        self._diag_pub = self.create_publisher(DiagnosticArray, DIAGNOSTICS_TOPIC, 10)
        try:
            values = declare_table(self, PLANNER_PARAMS)
            for name in unknown_overrides(self, PLANNER_PARAMS):
                self.get_logger().warning(f"parameter {name!r} is not a parameter of "
                                          f"{node_name}; ignored (a typo?)")
            self.settings = planner_settings(values)
        except ParamError as err:
            self._fail(f"bad parameter: {err}", EXIT_BAD_PARAMETER)
            return
        settings = self.settings
        cfg = settings.run
        for note in settings.notes:
            self.get_logger().info(note)
        self._values = dict(settings.values)
        self._thresholds = settings.diagnostics
        self._hardware_id = cfg.target_device
        self.window = CycleWindow(settings.diagnostics.diagnostics_window)
        self.tracker = DiagnosticsTracker(deadline_ms=cfg.planner.deadline_ms)
        self._plan_pub = self.create_publisher(String, PLAN_TOPIC, plan_qos(cfg.planner))
        self._cycle_pub = self.create_publisher(
            String, CYCLE_TOPIC, QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE))
        try:
            self.driver = PlannerDriver(cfg, publish_plan=self._publish_plan,
                                        on_record=self._on_record,
                                        max_cycles=settings.max_cycles)
        except RunError as err:
            self._fail(f"planner run could not start: {err}", EXIT_RUN_FAILED)
            return
        # The deadline is kept where the plan is received: the node measures its own transport
        # (loopback pings at start-up, then its own plans) into the loop's margin.
        self._probe: TransportProbe | None = None
        if self.driver.loop.transport.measured:
            driver = self.driver
            self._probe = TransportProbe(self, PLAN_TOPIC, lambda: driver.loop.transport)
        self._sub = self.create_subscription(
            String, COMMAND_TOPIC, self._on_command,
            QoSProfile(depth=max(10, cfg.planner.mailbox_capacity),
                       reliability=ReliabilityPolicy.RELIABLE))
        self._state_sub = self.create_subscription(
            String, STATE_TOPIC, self._on_state,
            QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE))
        self._timer = self.create_timer(settings.diagnostics_period_s, self._publish_diagnostics)
        self.add_on_set_parameters_callback(self._on_set_parameters)
        p = cfg.planner
        self.get_logger().info(
            f"planner ready: engine {cfg.engine} ({cfg.label}), target {cfg.target_device}, "
            f"{p.mode} mode, period {p.period_ms:g} ms, deadline {p.deadline_ms:g} ms; "
            f"profile {self.driver.run.planning.profile.name}; "
            f"in {self.resolve_topic_name(COMMAND_TOPIC)} (state "
            f"{self.resolve_topic_name(STATE_TOPIC)}), out "
            f"{self.resolve_topic_name(PLAN_TOPIC)}, {self.resolve_topic_name(CYCLE_TOPIC)}; "
            f"log {cfg.log_dir}")

    # --- start-up failure ----------------------------------------------------------------------
    def _fail(self, message: str, status: int) -> None:
        self.startup_error, self.startup_status = message, status
        self.get_logger().error(message)
        report = StatusReport("startup", 2, message, {})
        try:
            self._diag_pub.publish(self._array([report]))
        except Exception as err:  # best effort: the process is about to exit anyway
            self.get_logger().warning(f"could not publish the ERROR diagnostic: {err!r}")

    # --- running ---------------------------------------------------------------------------------
    def start(self) -> bool:
        """Start the planner loop thread; False (ERROR on /diagnostics) when it cannot run.

        The loop's CPU budget is applied in its thread: a real-time priority this user may not
        use is refused here, before any cycle runs.
        """
        if self.driver is None:
            raise RuntimeError(f"planner_node did not start: {self.startup_error}")
        try:
            self.driver.start()
        except RunError as err:
            self._fail(f"planner loop could not start: {err}", EXIT_RUN_FAILED)
            return False
        return True

    def _on_command(self, msg: String) -> None:
        # Empty, oversized or undecodable text (rclpy decodes bad UTF-8 to U+FFFD) is passed on
        # as it is: the loop refuses it with a logged warning and answers with a fallback.
        # A tagged command ({"command_id", "text"} JSON, from a client-edge replayer) keeps the
        # sender's id, so the sender can match the plan to it.
        assert self.driver is not None
        received = read_command(msg.data, clock_id=self._clock_id)
        command_id, text = received.command_id, received.text
        command = self.driver.submit(text, command_id, sent_ns=received.sent_ns)
        self.get_logger().debug(f"command {command.command_id}: {len(text)} characters")

    def _on_state(self, msg: String) -> None:
        assert self.driver is not None
        self.driver.loop.set_state(msg.data)

    def _publish_plan(self, envelope: dict[str, Any]) -> None:
        if self._probe is not None:
            self._probe.plan_published(envelope.get("cycle"))
        self._plan_pub.publish(String(data=json.dumps(envelope, separators=(",", ":"))))

    def _on_record(self, rec: CycleRecord) -> None:
        self.window.add(rec)
        self._cycle_pub.publish(String(data=rec.to_json()))

    # --- diagnostics -----------------------------------------------------------------------------
    def _array(self, reports: Sequence[StatusReport]) -> DiagnosticArray:
        array = DiagnosticArray()
        array.header.stamp = self.get_clock().now().to_msg()
        for r in reports:
            status = DiagnosticStatus(level=bytes([r.level]), name=f"{self.get_name()}: {r.name}",
                                      message=r.message, hardware_id=self._hardware_id)
            status.values = [KeyValue(key=k, value=v) for k, v in r.values.items()]
            array.status.append(status)
        return array

    def diagnostics(self) -> list[StatusReport]:
        """Return the current health reports (what the next /diagnostics message will carry)."""
        assert self.driver is not None
        reports = self.tracker.evaluate(self.window.snapshot(), self._thresholds,
                                        engine=self.driver.engine_state(),
                                        mailbox=self.driver.loop.mailbox.counters())
        reports[0].values["cycles_total"] = str(self.window.total)
        return reports

    def _publish_diagnostics(self) -> None:
        self._diag_pub.publish(self._array(self.diagnostics()))

    # --- runtime parameter updates ---------------------------------------------------------------
    def _on_set_parameters(self, params: list[Parameter[Any]]) -> SetParametersResult:
        changes = {p.name: p.value for p in params if p.name in PLANNER_NAMES}
        if not changes:
            return SetParametersResult(successful=True)
        try:
            update = check_update(self._values, changes)
        except ParamError as err:
            self.get_logger().warning(f"parameter update rejected: {err}")
            return SetParametersResult(successful=False, reason=str(err))
        old_period = self._values["diagnostics_period_s"]
        self._values = update.values
        self._thresholds = update.diagnostics
        self.window.resize(update.diagnostics.diagnostics_window)
        if update.diagnostics_period_s != old_period:
            self.destroy_timer(self._timer)
            self._timer = self.create_timer(update.diagnostics_period_s,
                                            self._publish_diagnostics)
        self.get_logger().info(f"parameters updated: {sorted(changes)}")
        return SetParametersResult(successful=True)

    # --- shutdown --------------------------------------------------------------------------------
    def close(self) -> dict[str, Any] | None:
        """Stop the loop, close the run (log flushed, summary.json written); return the summary."""
        if self.driver is None:
            return None
        summary = self.driver.close()
        self.get_logger().info(
            f"run closed: {summary.get('cycles')} cycles, "
            f"{summary.get('deadline_misses')} deadline misses, in {self.driver.run.log_dir}")
        return summary


def main(argv: list[str] | None = None) -> int:
    """Run the planner node until SIGINT / SIGTERM (or ``max_cycles``); return the exit status."""
    # A signal only asks the spin loop to stop, so the run is closed in order (rclpy's default
    # handler would shut the context down under the loop thread's feet).
    with ros_main(argv, log) as stop:
        node: PlannerNode | None = None
        status = EXIT_OK
        try:
            node = PlannerNode()
            if node.startup_error is not None:
                return node.startup_status
            executor = SingleThreadedExecutor()
            executor.add_node(node)
            if not node.start():
                return node.startup_status
            assert node.driver is not None
            spin_until(executor, stop, done=node.driver.finished.is_set, period_s=0.1)
            if node.driver.error is not None:
                status = EXIT_RUN_FAILED
            node.close()
            executor.remove_node(node)
        finally:
            if node is not None:
                if node.driver is not None and not node.driver.run.closed:
                    node.close()
                node.destroy_node()
        return status


if __name__ == "__main__":
    sys.exit(main())
