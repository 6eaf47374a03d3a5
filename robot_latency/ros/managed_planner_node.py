"""The ``managed_planner_node`` executable: the planner as a managed (lifecycle) node.

The same topics, parameters and run directory as ``planner_node``, brought up in order by a
lifecycle manager (Nav2's, ``ros2 lifecycle set``) through the standard services
``<node>/change_state`` and ``<node>/get_state`` (lifecycle_msgs):

    unconfigured --configure--> inactive     parameters validated, the engine loaded (the model
                                             in its worker process); on a bad parameter or an
                                             engine that cannot load it stays unconfigured and
                                             logs the reason (also in :attr:`last_error`)
    inactive --activate--> active            a run starts: run directory, loop thread, plans
                                             and cycle records published (lifecycle publishers),
                                             health on /diagnostics as the plain node's
    active --deactivate--> inactive          the loop stops after its current cycle; the run is
                                             closed (cycles.jsonl flushed, summary.json
                                             written); the model stays loaded
    inactive --cleanup--> unconfigured       the engine stopped, the model unloaded
    any --shutdown--> finalized              whatever runs is closed in that order

The first activation writes to ``log_dir``; each later one to ``<log_dir>-<n>`` (n = 2, 3...),
so every run directory holds one run. A transition asked for in the wrong state gets the
standard answer (``success: false``), and the node stays where it was. Commands arriving while
the node is not active are dropped with a log line (a plan published then would go nowhere).

    managed_planner_node --ros-args -p engine:=sim
    ros2 lifecycle set /planner_node configure && ros2 lifecycle set /planner_node activate
    ros2 launch robot_latency planner.launch.py managed:=true
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rclpy.executors import SingleThreadedExecutor
from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn
from rclpy.qos import QoSProfile, ReliabilityPolicy
from std_msgs.msg import String

from robot_latency.planner.loop import Runner
from robot_latency.planner.margin import TransportMargin
from robot_latency.planner.session import RunError, close_runner, make_runner
from robot_latency.records import CycleRecord
from robot_latency.ros.client_edge import monotonic_clock_id, read_command
from robot_latency.ros.declare import declare_table, unknown_overrides
from robot_latency.ros.diagnostics import CycleWindow, DiagnosticsTracker, StatusReport
from robot_latency.ros.driver import PlannerDriver
from robot_latency.ros.loopback import TransportProbe
from robot_latency.ros.main_util import ros_main, spin_until
from robot_latency.ros.params import PLANNER_PARAMS, ParamError, PlannerSettings, planner_settings
from robot_latency.ros.planner_node import (
    COMMAND_TOPIC,
    CYCLE_TOPIC,
    DIAGNOSTICS_TOPIC,
    NODE_NAME,
    PLAN_TOPIC,
    plan_qos,
)

log = logging.getLogger(__name__)

SUCCESS, FAILURE = TransitionCallbackReturn.SUCCESS, TransitionCallbackReturn.FAILURE


def activation_log_dir(log_dir: Any, activation: int) -> Any:
    """The run directory of the ``activation``-th activation (1: ``log_dir`` itself)."""
    return log_dir if activation == 1 else log_dir.with_name(f"{log_dir.name}-{activation}")


class ManagedPlannerNode(LifecycleNode):
    """The planner node as a lifecycle node (see the module docstring)."""

    def __init__(self, node_name: str = NODE_NAME, **node_kwargs: Any) -> None:
        super().__init__(node_name, **node_kwargs)
        self.last_error: str | None = None
        # a tagged command stamped on this boot's monotonic clock starts its deadline at its send
        self._clock_id = monotonic_clock_id()
        self.settings: PlannerSettings | None = None
        self.runner: Runner | None = None
        self.driver: PlannerDriver | None = None
        self.activations = 0
        self.summaries: list[dict[str, Any]] = []
        self._diag_pub = self.create_publisher(DiagnosticArray, DIAGNOSTICS_TOPIC, 10)
        self._plan_pub: Any = None
        self._probe: TransportProbe | None = None
        self._transport: TransportMargin | None = None
        self._cycle_pub: Any = None
        self._sub: Any = None
        self._diag_timer: Any = None
        self.window: CycleWindow | None = None
        self.tracker: DiagnosticsTracker | None = None
        # Declared now (ros2 param works in every state); read and validated at configure.
        try:
            declare_table(self, PLANNER_PARAMS)
        except ParamError as err:
            self.last_error = f"bad parameter: {err}"
            self.get_logger().error(self.last_error)
        for name in unknown_overrides(self, PLANNER_PARAMS):
            self.get_logger().warning(f"parameter {name!r} is not a parameter of {node_name}; "
                                      "ignored (a typo?)")

    # --- Humble compatibility ----------------------------------------------------------------
    def _LifecycleNodeMixin__change_state(self, transition_id: int) -> TransitionCallbackReturn:
        # Humble's rclpy lets an invalid transition's RCLError escape the change_state service
        # into the executor; later distros log it and answer success=false, state unchanged.
        # Give every distro the later behaviour.
        from rclpy.impl.implementation_singleton import rclpy_implementation as _rclpy

        try:
            return super()._LifecycleNodeMixin__change_state(transition_id)  # type: ignore[misc]
        except _rclpy.RCLError:
            self.get_logger().error(f"Unable to start transition {transition_id} from current "
                                    f"state {self._state_machine.current_state}")
            return TransitionCallbackReturn.ERROR

    # --- transitions ---------------------------------------------------------------------------
    def _refuse(self, message: str) -> TransitionCallbackReturn:
        self.last_error = message
        self.get_logger().error(message)
        self._diag_pub.publish(self._array([StatusReport("lifecycle", 2, message, {})]))
        return FAILURE

    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Validate the parameters and load the model; FAILURE (unconfigured) with the reason."""
        values = {s.name: self.get_parameter(s.name).value for s in PLANNER_PARAMS}
        try:
            settings = planner_settings(values)
        except ParamError as err:
            return self._refuse(f"configure failed: bad parameter: {err}")
        try:
            runner = make_runner(settings.run)
        except RunError as err:
            return self._refuse(f"configure failed: {err}")
        self.settings, self.runner, self.last_error = settings, runner, None
        cfg = settings.run
        self.window = CycleWindow(settings.diagnostics.diagnostics_window)
        self.tracker = DiagnosticsTracker(deadline_ms=cfg.planner.deadline_ms)
        for note in settings.notes:
            self.get_logger().info(note)
        self._plan_pub = self.create_lifecycle_publisher(String, PLAN_TOPIC,
                                                         plan_qos(cfg.planner))
        self._cycle_pub = self.create_lifecycle_publisher(
            String, CYCLE_TOPIC, QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE))
        self._sub = self.create_subscription(
            String, COMMAND_TOPIC, self._on_command,
            QoSProfile(depth=max(10, cfg.planner.mailbox_capacity),
                       reliability=ReliabilityPolicy.RELIABLE))
        # The transport margin outlives an activation: the start-up loopback is measured once.
        self._transport = TransportMargin(cfg.planner.margin_settings())
        if self._transport.measured:
            transport = self._transport
            self._probe = TransportProbe(self, PLAN_TOPIC, lambda: transport)
        self.get_logger().info(f"configured: engine {cfg.engine} ({cfg.label}) loaded, "
                               f"deadline {cfg.planner.deadline_ms:g} ms")
        return super().on_configure(state)

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Start a run: its directory, the loop thread, the publishers."""
        assert self.settings is not None and self.runner is not None
        cfg = self.settings.run
        n = self.activations + 1
        run_cfg = cfg if n == 1 else _with_log_dir(cfg, activation_log_dir(cfg.log_dir, n))
        # Publishers first: the loop's first plan must not be dropped as "inactive".
        ret = super().on_activate(state)
        if ret != SUCCESS:
            return ret
        try:
            driver = PlannerDriver(run_cfg, publish_plan=self._publish_plan,
                                   on_record=self._on_record,
                                   max_cycles=self.settings.max_cycles, runner=self.runner)
        except RunError as err:
            super().on_deactivate(state)
            return self._refuse(f"activate failed: {err}")
        if self._transport is not None:
            driver.loop.transport = self._transport
        try:
            driver.start()
        except RunError as err:
            driver.run.close()
            super().on_deactivate(state)
            return self._refuse(f"activate failed: planner loop could not start: {err}")
        self.driver, self.activations = driver, n
        self._diag_timer = self.create_timer(self.settings.diagnostics_period_s,
                                             self._publish_diagnostics)
        self.get_logger().info(f"active: run {n} in {run_cfg.log_dir}")
        return SUCCESS

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Stop after the current cycle and close the run (records flushed, summary written)."""
        self._close_run()
        return super().on_deactivate(state)

    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Unload the model and drop the publishers and the subscription."""
        self._unload()
        return super().on_cleanup(state)

    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Close whatever runs, from any state."""
        self._close_run()
        self._unload()
        return SUCCESS

    def on_error(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Recover to unconfigured: close the run, unload the model."""
        self.get_logger().error(f"error while leaving {state.label}: closing everything")
        self._close_run()
        self._unload()
        return SUCCESS

    # --- helpers -------------------------------------------------------------------------------
    def _close_run(self) -> None:
        if self._diag_timer is not None:
            self.destroy_timer(self._diag_timer)
            self._diag_timer = None
        if self.driver is not None:
            summary = self.driver.close()
            self.summaries.append(summary)
            self.get_logger().info(
                f"run closed: {summary.get('cycles')} cycles, "
                f"{summary.get('deadline_misses')} deadline misses, in "
                f"{self.driver.run.log_dir}")
            self.driver = None

    def _unload(self) -> None:
        if self.runner is not None:
            close_runner(self.runner)
            self.runner = None
        for pub in (self._plan_pub, self._cycle_pub):
            if pub is not None:
                self.destroy_lifecycle_publisher(pub)
        if self._sub is not None:
            self.destroy_subscription(self._sub)
        if self._probe is not None:
            self._probe.destroy()
        self._plan_pub = self._cycle_pub = self._sub = None
        self._probe, self._transport = None, None
        self.settings = None

    def _on_command(self, msg: String) -> None:
        driver = self.driver
        if driver is None:
            self.get_logger().warning("command received while not active: dropped")
            return
        received = read_command(msg.data, clock_id=self._clock_id)
        driver.submit(received.text, received.command_id, sent_ns=received.sent_ns)

    def _publish_plan(self, envelope: dict[str, Any]) -> None:
        if self._probe is not None:
            self._probe.plan_published(envelope.get("cycle"))
        self._plan_pub.publish(String(data=json.dumps(envelope, separators=(",", ":"))))

    def _on_record(self, rec: CycleRecord) -> None:
        if self.window is not None:
            self.window.add(rec)
        self._cycle_pub.publish(String(data=rec.to_json()))

    def _array(self, reports: list[StatusReport]) -> DiagnosticArray:
        array = DiagnosticArray()
        array.header.stamp = self.get_clock().now().to_msg()
        hardware_id = self.settings.run.target_device if self.settings is not None else ""
        for r in reports:
            status = DiagnosticStatus(level=bytes([r.level]), name=f"{self.get_name()}: {r.name}",
                                      message=r.message, hardware_id=hardware_id)
            status.values = [KeyValue(key=k, value=v) for k, v in r.values.items()]
            array.status.append(status)
        return array

    def _publish_diagnostics(self) -> None:
        """Publish the same health reports as the plain node (while a run is active)."""
        driver, window, tracker = self.driver, self.window, self.tracker
        if driver is None or window is None or tracker is None or self.settings is None:
            return
        reports = tracker.evaluate(window.snapshot(), self.settings.diagnostics,
                                   engine=driver.engine_state(),
                                   mailbox=driver.loop.mailbox.counters())
        reports[0].values["cycles_total"] = str(window.total)
        self._diag_pub.publish(self._array(reports))


def _with_log_dir(cfg: Any, log_dir: Any) -> Any:
    import dataclasses

    return dataclasses.replace(cfg, log_dir=log_dir)


def main(argv: list[str] | None = None) -> int:
    """Run the managed planner node until SIGINT / SIGTERM; return the exit status (0)."""
    with ros_main(argv, log) as stop:
        node: ManagedPlannerNode | None = None
        try:
            node = ManagedPlannerNode()
            executor = SingleThreadedExecutor()
            executor.add_node(node)
            spin_until(executor, stop, period_s=0.1)
            executor.remove_node(node)
        finally:
            if node is not None:
                node.on_shutdown(LifecycleState(0, "signal"))
                node.destroy_node()
        return 0


if __name__ == "__main__":
    sys.exit(main())
