"""The planner node's core, shared by the plain and the managed (lifecycle) node.

Everything a planner node is, once: its parameters (``params.PLANNER_PARAMS``, a runtime update
checked in the on-set callback), its topics (:mod:`robot_latency.ros.topics`), the transport probe
(the margin kept before the deadline), health on ``/diagnostics``, the start-up's record
(:mod:`robot_latency.ros.cold_start`) and the run (directory, loop thread). The two node classes map
their own life to its steps:

    step                  planner_node (plain)        managed_planner_node
    declare()             constructor                 constructor
    configure()           constructor                 on_configure (load_engine=True)
    open_run()            constructor                 on_activate (run n in log_dir-<n>)
    start_loop()          start()                     on_activate
    close_run()           close()                     on_deactivate, on_shutdown
    unconfigure()         (process exit)              on_cleanup, on_shutdown

A failed step raises :class:`NodeStepError` (message, exit status); the node reports it (log,
ERROR on ``/diagnostics``). Only rclpy API that Humble has is used.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rcl_interfaces.msg import SetParametersResult
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.qos import QoSProfile, ReliabilityPolicy
from std_msgs.msg import String

from robot_latency.planner.loop import Runner
from robot_latency.planner.margin import TransportMargin
from robot_latency.planner.runner_factory import RunError, close_runner, make_runner
from robot_latency.records import CycleRecord
from robot_latency.ros.camera import CameraInput, camera_input
from robot_latency.ros.client_edge import ReceivedCommand, monotonic_clock_id
from robot_latency.ros.cold_start import ColdStart
from robot_latency.ros.command_input import command_subscriptions
from robot_latency.ros.cycle_stats import ClockBridge, CycleOutputs
from robot_latency.ros.declare import declare_table, unknown_overrides
from robot_latency.ros.diagnostics import (
    CycleWindow,
    DiagnosticsTracker,
    DiagnosticThresholds,
    StatusReport,
    plan_topic_report,
)
from robot_latency.ros.driver import PlannerDriver
from robot_latency.ros.loopback import TransportProbe
from robot_latency.ros.params import (
    PLANNER_NAMES,
    PLANNER_PARAMS,
    ParamError,
    PlannerSettings,
    check_update,
    coerce,
    planner_settings,
)
from robot_latency.ros.plan_outputs import PlanOutputs, plan_qos  # noqa: F401  (re-exported)
from robot_latency.ros.readiness import core_readiness
from robot_latency.ros.standing_errors import StandingErrors
from robot_latency.ros.topics import (
    COMMAND_TOPIC,
    COMMAND_TYPED_TOPIC,
    CYCLE_STATS_TOPIC,
    DIAGNOSTICS_TOPIC,
    PLAN_ACTION,
    PLAN_TOPIC,
    STATE_TOPIC,
)
from robot_latency_interfaces.msg import Plan

log = logging.getLogger(__name__)

#: Both nodes' default name (params files and lifecycle managers address it by this name).
NODE_NAME = "planner_node"

EXIT_OK, EXIT_RUN_FAILED, EXIT_BAD_PARAMETER = 0, 1, 2

_BY_NAME = {s.name: s for s in PLANNER_PARAMS}


class NodeStepError(RuntimeError):
    """A step of the node's life that failed; the message says why.

    Attributes:
        status: the exit status it means for a node executable (1: run, 2: bad parameter).
    """

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def activation_log_dir(log_dir: Path, activation: int) -> Path:
    """The run directory of the ``activation``-th run (1: ``log_dir`` itself, then ``-2``...)."""
    return log_dir if activation == 1 else log_dir.with_name(f"{log_dir.name}-{activation}")


class PlannerCore:
    """The planner node's parameters, topics, state, diagnostics and run, on a host node.

    Args:
        node: the rclpy node it lives on (a plain ``Node`` or a ``LifecycleNode``).
        create_publisher: makes the plan and cycle publishers (a lifecycle node passes its
            ``create_lifecycle_publisher``); default ``node.create_publisher``.
        destroy_publisher: removes them again; default ``node.destroy_publisher``.
    """

    def __init__(self, node: Node, *, create_publisher: Callable[..., Any] | None = None,
                 destroy_publisher: Callable[[Any], Any] | None = None) -> None:
        self.node, self.cold = node, ColdStart()  # the start-up's events (ros/cold_start.py)
        self._create_pub = create_publisher or node.create_publisher
        self._destroy_pub = destroy_publisher or node.destroy_publisher
        self.declare_error: str | None = None
        self.settings: PlannerSettings | None = None
        self.runner: Runner | None = None
        self.driver: PlannerDriver | None = None
        self.probe: TransportProbe | None = None
        self.transport: TransportMargin | None = None
        self.window: CycleWindow | None = None
        self.tracker: DiagnosticsTracker | None = None
        self.camera: CameraInput | None = None  # the camera_topic subscription (ros/camera.py)
        self._clock_id, self.runs = monotonic_clock_id(), 0
        self.summaries: list[dict[str, Any]] = []
        self.values: dict[str, Any] | None = None  # typed, in effect (None: not configured)
        self.thresholds: DiagnosticThresholds | None = None
        self.state_text: str | None = None  # the newest robot state (kept while no run)
        self.outputs: PlanOutputs | None = None
        self._cycle_out: CycleOutputs | None = None
        self._subs: list[Any] = []
        self._diag_timer: Any = None
        #: ERROR statuses repeated until cleared (a failed start-up or transition)
        self.standing = StandingErrors(node, self._publish_reports,
                                       float(_BY_NAME["diagnostics_period_s"].default))
        # Plain publishers in every state: a failed start-up or transition, and planner/ready.
        self._diag_pub = node.create_publisher(DiagnosticArray, DIAGNOSTICS_TOPIC, 10)
        self.readiness = core_readiness(self)

    @property
    def logger(self) -> Any:
        """The host node's rclpy logger."""
        return self.node.get_logger()

    # --- parameters --------------------------------------------------------------------------
    def declare(self) -> None:
        """Declare the parameters (so ``ros2 param`` works in every state), warn about unknown
        overrides, and install the on-set callback.

        Raises:
            NodeStepError: rclpy refused an override (status 2); also kept in
                :attr:`declare_error` for a later :meth:`configure`.
        """
        try:
            declare_table(self.node, PLANNER_PARAMS)
        except ParamError as err:
            self.declare_error = f"bad parameter: {err}"
            raise NodeStepError(self.declare_error, EXIT_BAD_PARAMETER) from err
        finally:
            for name in unknown_overrides(self.node, PLANNER_PARAMS):
                self.logger.warning(f"parameter {name!r} is not a parameter of "
                                    f"{self.node.get_name()}; ignored (a typo?)")
        self.node.add_on_set_parameters_callback(self._on_set_parameters)

    def _on_set_parameters(self, params: list[Parameter[Any]]) -> SetParametersResult:
        changes = {p.name: p.value for p in params if p.name in PLANNER_NAMES}
        if not changes:
            return SetParametersResult(successful=True)
        try:
            if self.values is None:
                # Not configured: every parameter may change (configure reads them); the kind
                # and range are checked now rather than at configure.
                for name, value in changes.items():
                    coerce(_BY_NAME[name], value)
                return SetParametersResult(successful=True)
            update = check_update(self.values, changes)
        except ParamError as err:
            self.logger.warning(f"parameter update rejected: {err}")
            return SetParametersResult(successful=False, reason=str(err))
        old_period = self.values["diagnostics_period_s"]
        self.values, self.thresholds = update.values, update.diagnostics
        if self.window is not None:
            self.window.resize(update.diagnostics.diagnostics_window)
        if update.diagnostics_period_s != old_period and self._diag_timer is not None:
            self.stop_diagnostics()
            self.start_diagnostics()
        self.logger.info(f"parameters updated: {sorted(changes)}")
        return SetParametersResult(successful=True)

    # --- configure / unconfigure -------------------------------------------------------------
    def configure(self, *, load_engine: bool = False) -> PlannerSettings:
        """Read and validate the parameters; create the topics and the transport probe.

        Args:
            load_engine: also start the engine runner (the model loaded) now, to be shared by
                every run :meth:`open_run` opens; else each run starts and stops its own.

        Raises:
            NodeStepError: a bad parameter (status 2) or an engine that cannot load (status 1);
                nothing is left created.
        """
        if self.declare_error is not None:
            raise NodeStepError(self.declare_error, EXIT_BAD_PARAMETER)
        values = {s.name: self.node.get_parameter(s.name).value for s in PLANNER_PARAMS}
        try:
            settings = planner_settings(values)
        except ParamError as err:
            raise NodeStepError(f"bad parameter: {err}", EXIT_BAD_PARAMETER) from err
        if load_engine:
            try:
                with self.cold.model_load():
                    self.runner = make_runner(settings.run)
            except RunError as err:
                raise NodeStepError(str(err), EXIT_RUN_FAILED) from err
        for note in settings.notes:
            self.logger.info(note)
        cfg = settings.run
        self.settings, self.values = settings, dict(settings.values)
        self.thresholds = settings.diagnostics
        self.window = CycleWindow(settings.diagnostics.diagnostics_window)
        self.tracker = DiagnosticsTracker(deadline_ms=cfg.settings.deadline_ms)
        clocks = ClockBridge(lambda: self.node.get_clock().now().nanoseconds)
        self.outputs = PlanOutputs(self.node, self._create_pub, cfg.settings, clocks,
                                   plan_json=settings.plan_json, driver=lambda: self.driver,
                                   on_handoff=self._on_result_handoff)
        self._cycle_out = CycleOutputs(self._create_pub, clocks, cycle_json=settings.cycle_json)
        self._subs = command_subscriptions(  # planner/command and planner/command_typed
            self.node, self._on_command, depth=max(10, cfg.settings.mailbox_capacity),
            clock_id=self._clock_id, clocks=clocks,
            loop_clock=lambda: self.driver.run.clock if self.driver else None)
        self._subs.append(self.node.create_subscription(
            String, STATE_TOPIC, self._on_state,
            QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE)))
        self.camera = camera_input(self.node, settings.camera_topic, clocks, self._subs,
                                   with_image=bool(cfg.settings.mmproj))
        # The deadline is kept where the plan is received: the node measures its own transport
        # (loopback pings at start-up, then its own plans) into the loop's margin, which
        # outlives a run (the start-up loopback is measured once).
        self.transport = TransportMargin(cfg.settings.margin_settings())
        if self.transport.measured:
            transport = self.transport
            self.probe = TransportProbe(self.node, PLAN_TOPIC, lambda: transport,
                                        plan_type=Plan, cycle_of=lambda msg: msg.cycle)
        self.cold.mark("configured")
        return settings

    def unconfigure(self) -> None:
        """Stop the engine runner; remove the topics and the probe (back to declared only)."""
        if self.runner is not None:
            close_runner(self.runner)
            self.runner = None
        if self.outputs is not None:
            self.outputs.destroy(self._destroy_pub)
        if self._cycle_out is not None:
            self._cycle_out.destroy(self._destroy_pub)
        for sub in self._subs:
            self.node.destroy_subscription(sub)
        if self.probe is not None:
            self.probe.destroy()
        self.outputs = self._cycle_out = self.probe = self.transport = self.camera = None
        self._subs, self.settings, self.values, self.thresholds = [], None, None, None

    # --- the run -----------------------------------------------------------------------------
    def open_run(self) -> PlannerDriver:
        """Open the next run (its directory: see :func:`activation_log_dir`), not started yet.

        Raises:
            NodeStepError: the run cannot start (log directory, model, engine); status 1.
        """
        assert self.settings is not None, "configure() first"
        n = self.runs + 1
        cfg = self.settings.run
        if n > 1:
            # The same resolved run (its profile loaded once), in a directory of its own.
            cfg = dataclasses.replace(cfg, settings=dataclasses.replace(
                cfg.settings, log_dir=activation_log_dir(cfg.log_dir, n)))
        try:
            driver = PlannerDriver(cfg, publish_plan=self._publish_plan,
                                   on_record=self._on_record, frames=self.camera,
                                   max_cycles=self.settings.max_cycles, runner=self.runner)
        except RunError as err:
            raise NodeStepError(str(err), EXIT_RUN_FAILED) from err
        if self.transport is not None:
            driver.loop.transport = self.transport
        if self.outputs is not None:  # a goal's cancel withdraws its command from the loop
            driver.loop.withdrawals = self.outputs.actions
        if self.state_text is not None:
            driver.loop.set_state(self.state_text)
        self.driver, self.runs = driver, n
        return driver

    def start_loop(self) -> None:
        """Start the open run's loop thread (it returns once the engine is warm), the
        diagnostics timer and the readiness check (:mod:`robot_latency.ros.readiness`).

        The loop's CPU budget is applied in its thread: a real-time priority this user may not
        use is refused here, before any cycle runs; the run is then closed.

        Raises:
            NodeStepError: the loop cannot start (status 1).
        """
        assert self.driver is not None, "open_run() first"
        try:
            self.driver.start()
        except RunError as err:
            self.close_run()
            raise NodeStepError(f"planner loop could not start: {err}", EXIT_RUN_FAILED) from err
        self.start_diagnostics()
        self.readiness.arm()  # true once the loopback pings are back too

    def close_run(self) -> dict[str, Any] | None:
        """Stop the loop after its cycle, close the run (log flushed, summary.json written);
        return the run's summary (None when no run was open). ``planner/ready`` says false."""
        self.stop_diagnostics()
        self.readiness.clear()
        driver, self.driver = self.driver, None
        if driver is None:
            return None
        if self.outputs is not None:
            self.outputs.actions.abort_open()  # nothing plans them any more
        summary = driver.close()
        self.summaries.append(summary)
        cycles, misses = summary.get("cycles"), summary.get("deadline_misses")
        self.logger.info(f"run closed: {cycles} cycles, {misses} deadline misses, in "
                         f"{driver.run.log_dir}")
        return summary

    # --- topics ------------------------------------------------------------------------------
    def topics_line(self) -> str:
        """Return where the node listens and publishes, names resolved (for a log line)."""
        name = self.node.resolve_topic_name
        return (f"in {name(COMMAND_TOPIC)}, {name(COMMAND_TYPED_TOPIC)} (state "
                f"{name(STATE_TOPIC)}), out {name(PLAN_TOPIC)}, {name(CYCLE_STATS_TOPIC)}; "
                f"action {name(PLAN_ACTION)}")

    def _on_command(self, received: ReceivedCommand, state: str | None) -> None:
        # Either input (ros/command_input.py), read; bad text goes on: the loop refuses it.
        driver = self.driver
        if driver is None:  # a plan published now would go nowhere
            self.logger.warning("command received while not active: dropped")
            return
        # A send stamp on the loop's clock starts the command's deadline at its send.
        command = driver.submit(received.text, received.command_id, sent_ns=received.sent_ns,
                                state=state)
        self.logger.debug(f"command {command.command_id}: {len(received.text)} characters")

    def _on_state(self, msg: String) -> None:
        self.state_text = msg.data
        driver = self.driver
        if driver is not None:
            driver.loop.set_state(msg.data)

    def _publish_plan(self, envelope: dict[str, Any]) -> None:
        if self.probe is not None:
            self.probe.plan_published(envelope.get("cycle"), envelope.get("published_ns"))
        if self.outputs is not None:
            self.outputs.publish(envelope)

    def _on_result_handoff(self, round_trip_ns: int) -> None:
        # A goal's result leaves through the executor: its hand-off is part of the way out.
        if self.transport is not None and self.transport.measured:
            self.transport.add_round_trip(round_trip_ns)

    def _on_record(self, rec: CycleRecord) -> None:
        if self.window is not None:
            self.window.add(rec)
        if self.outputs is not None:
            self.outputs.actions.cycle_recorded(rec.command_id, rec.fallback_reason,
                                                rec.published_ns is not None)
        if self._cycle_out is not None:
            self._cycle_out.publish(rec, self.driver.run.clock if self.driver else None)
        self.cold.plan_recorded(rec, self.driver.run if self.driver else None)

    # --- diagnostics -------------------------------------------------------------------------
    def start_diagnostics(self) -> None:
        """Publish health on /diagnostics every ``diagnostics_period_s`` (current value)."""
        if self._diag_timer is None and self.values is not None:
            self._diag_timer = self.node.create_timer(self.values["diagnostics_period_s"],
                                                      self.publish_diagnostics)

    def stop_diagnostics(self) -> None:
        """Stop publishing health (no run open, or the period changes)."""
        if self._diag_timer is not None:
            self.node.destroy_timer(self._diag_timer)
            self._diag_timer = None

    def reports(self) -> list[StatusReport] | None:  # None while no run is open
        driver, window, tracker = self.driver, self.window, self.tracker
        if driver is None or window is None or tracker is None or self.thresholds is None:
            return None
        records, loop = window.snapshot(), driver.run.config.settings
        reports = tracker.evaluate(records, self.thresholds, engine=driver.engine_state(),
                                   mailbox=driver.loop.mailbox.counters())
        reports[0].values["cycles_total"] = str(window.total)
        return [*reports, plan_topic_report(records, self.thresholds, mode=loop.mode,
                                            topic=self.node.resolve_topic_name(PLAN_TOPIC),
                                            period_ms=loop.period_ms)]

    def publish_diagnostics(self) -> None:
        if (reports := self.reports()) is not None:
            self._diag_pub.publish(self._array(reports))

    def report_error(self, name: str, message: str) -> None:
        """Log ``message`` as an error and publish it as an ERROR status named ``name``, again
        every ``diagnostics_period_s`` until :meth:`clear_error` (ros/standing_errors.py)."""
        self.logger.error(message)
        self.standing.report(name, message)

    def clear_error(self, name: str) -> None:
        """Stop repeating the ERROR status ``name`` (the step it reported has since succeeded)."""
        self.standing.clear(name)

    def _publish_reports(self, reports: Sequence[StatusReport]) -> None:
        try:
            self._diag_pub.publish(self._array(reports))
        except Exception as err:  # best effort: the node may be about to exit anyway
            self.logger.warning(f"could not publish the ERROR diagnostic: {err!r}")

    def _array(self, reports: Sequence[StatusReport]) -> DiagnosticArray:
        array = DiagnosticArray()
        array.header.stamp = self.node.get_clock().now().to_msg()
        hardware_id = self.settings.run.target_device if self.settings is not None else ""
        for r in reports:
            name = r.name if r.name.startswith("/") else f"{self.node.get_name()}: {r.name}"
            status = DiagnosticStatus(level=bytes([r.level]), name=name,
                                      message=r.message, hardware_id=hardware_id)
            status.values = [KeyValue(key=k, value=v) for k, v in r.values.items()]
            array.status.append(status)
        return array


class CoreNode:
    """What both planner node classes expose of their core (a mixin before the rclpy base)."""

    core: PlannerCore

    @property
    def driver(self) -> PlannerDriver | None:
        """The open run's driver; None while no run is open."""
        return self.core.driver

    @property
    def settings(self) -> PlannerSettings | None:
        """The settings built from the parameters; None until configured."""
        return self.core.settings
