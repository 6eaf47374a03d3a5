"""The ``managed_planner_node`` executable: the planner as a managed (lifecycle) node.

The same topics, PlanCommand action (served from configure to cleanup, goals accepted only while
active, as a Nav2 lifecycle node's action server), parameters (with the same runtime updates),
robot state subscription, transport probe, diagnostics and run directory as ``planner_node``:
both are thin nodes around
:class:`~robot_latency.ros.node_core.PlannerCore`, this one brought up in order by a lifecycle
manager (Nav2's, ``ros2 lifecycle set``) through the standard services
``<node>/change_state`` and ``<node>/get_state`` (lifecycle_msgs):

    unconfigured --configure--> inactive     parameters validated, the engine loaded (the model
                                             in its worker process), the target calibration
                                             readied (robot_latency.floor.calstore, for the
                                             run's prediction); on a bad parameter or an
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
the node is not active are dropped with a log line (a plan published then would go nowhere); the
newest robot state is kept for the next run. Parameters may change freely while unconfigured
(kind and range checked at once, the rest at configure); once configured only the runtime ones
(diagnostics) may, as on the plain node.

Cleanup and shutdown destroy the node's publishers and subscriptions. Spin it in a
``SingleThreadedExecutor``, as :func:`main` does: a multi-threaded executor runs the transition
in a worker thread while its own thread may be building a wait set from those entities, and
rclpy (Humble to rolling) then stops spinning with ``InvalidHandle`` (ros2/rclpy#1142, #1355).

    managed_planner_node --ros-args -p engine:=sim
    ros2 lifecycle set /planner_node configure && ros2 lifecycle set /planner_node activate
    ros2 launch robot_latency planner.launch.py managed:=true
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from rclpy.executors import SingleThreadedExecutor
from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn

from robot_latency.planner.lifecycle import prepare_target_calibration
from robot_latency.ros.main_util import ros_main, spin_until
from robot_latency.ros.node_core import NODE_NAME, CoreNode, NodeStepError, PlannerCore

log = logging.getLogger(__name__)

SUCCESS, FAILURE = TransitionCallbackReturn.SUCCESS, TransitionCallbackReturn.FAILURE


class ManagedPlannerNode(CoreNode, LifecycleNode):
    """The planner node as a lifecycle node (see the module docstring).

    Attributes:
        last_error: why the last transition failed (None after a successful configure).
    """

    def __init__(self, node_name: str = NODE_NAME, **node_kwargs: Any) -> None:
        super().__init__(node_name, **node_kwargs)
        self.last_error: str | None = None
        # Plan and cycle records go out on lifecycle publishers: silent unless active.
        self.core = PlannerCore(self, create_publisher=self.create_lifecycle_publisher,
                                destroy_publisher=self.destroy_lifecycle_publisher)
        try:
            self.core.declare()  # ros2 param works in every state; read at configure
        except NodeStepError as err:
            self.last_error = str(err)
            self.get_logger().error(self.last_error)

    @property
    def activations(self) -> int:
        """How many runs this node has opened."""
        return self.core.runs

    @property
    def summaries(self) -> list[dict[str, Any]]:
        """The summaries of the runs closed so far, oldest first."""
        return self.core.summaries

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
        self.core.report_error("lifecycle", message)
        return FAILURE

    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Validate the parameters and load the model; FAILURE (unconfigured) with the reason."""
        try:
            settings = self.core.configure(load_engine=True)
        except NodeStepError as err:
            return self._refuse(f"configure failed: {err}")
        cfg = settings.run
        # the target calibration now, not as the run opens at activate (it finds it in memory)
        with self.core.cold.calibration():
            self.core.cold.calibration_cache = prepare_target_calibration(cfg)
        self.last_error = None
        self.core.clear_error("lifecycle")
        self.get_logger().info(f"configured: engine {cfg.engine} ({cfg.label}) loaded, "
                               f"deadline {cfg.settings.deadline_ms:g} ms; "
                               f"{self.core.topics_line()}")
        return super().on_configure(state)

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Start a run: its directory, the loop thread, the publishers."""
        # Publishers first: the loop's first plan must not be dropped as "inactive".
        ret = super().on_activate(state)
        if ret != SUCCESS:
            return ret
        try:
            driver = self.core.open_run()
            self.core.start_loop()
        except NodeStepError as err:
            super().on_deactivate(state)
            return self._refuse(f"activate failed: {err}")
        self.core.clear_error("lifecycle")
        self.get_logger().info(f"active: run {self.core.runs} in {driver.run.log_dir}")
        return SUCCESS

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Stop after the current cycle and close the run (records flushed, summary written)."""
        self.core.close_run()
        return super().on_deactivate(state)

    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Unload the model and drop the publishers and the subscriptions."""
        self.core.unconfigure()
        return super().on_cleanup(state)

    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Close whatever runs, from any state."""
        self.core.close_run()
        self.core.unconfigure()
        return SUCCESS

    def on_error(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Recover to unconfigured: close the run, unload the model."""
        self.get_logger().error(f"error while leaving {state.label}: closing everything")
        self.core.close_run()
        self.core.unconfigure()
        return SUCCESS


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
            executor.shutdown()
        finally:
            if node is not None:
                node.on_shutdown(LifecycleState(0, "signal"))  # the action server destroyed too
                node.destroy_node()
        return 0


if __name__ == "__main__":
    sys.exit(main())
