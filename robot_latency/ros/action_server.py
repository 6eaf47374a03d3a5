"""The planner node's action: ``planner/plan_command`` (PlanCommand, robot_latency_interfaces).

What a behaviour tree, a Nav2 plugin or a mission executive calls: one goal per command, feedback
while it is planned, the plan (the model's or the fallback's) as the result by the goal's
deadline, and a cancel. A goal is a command like one on ``planner/command``: it goes into the
same mailbox, follows ``on_new_command`` like any other, and its plan is published on
``planner/plan`` too, with the goal id (32 hex digits) as its ``command_id``:

    accepted     the goal's command is handed to the loop (the node must be running: the managed
                 node accepts goals only while active); feedback ``queue``
    its cycle    feedback ``prefill`` when its cycle starts, ``decode`` once tokens come out
                 (then at most every :data:`FEEDBACK_PERIOD_S`), ``fallback`` before a
                 fallback's plan
    its plan     the result (SUCCEEDED), the first plan the loop publishes for it
    a cancel     accepted while no plan was handed over: the loop aborts the goal's generation
                 (or never starts it), publishes nothing for it, and records its cycle as
                 ``cancelled``; the result is CANCELED with no plan (``source: none``)
    superseded   a newer command was planned first (the mailbox's newest wins), or its cycle
                 was skipped: ABORTED at once, no plan, ``fallback_reason`` says which, as the
                 topic's sender gets no plan for such a command either
    run closed   goals still waiting are ABORTED (``not_running``: the node stopped planning)

Deadline: the goal's ``deadline_ms`` when shorter than the node's (0: the node's), counted from
the goal's ``sent`` stamp when the caller is on this host (its ROS clock against the node's; a
stamp after the arrival or older than the deadline is not believed), else from the arrival:
where the caller counts it. The loop keeps the same margins before it as for the topic.

Threads: every goal-handle transition and feedback is made in the node's executor thread. The
loop's thread only records a plan or a dropped goal and wakes the executor through a guard
condition; the feedback poll is a timer that runs while goals are open. Nothing here blocks the
executor (no waiting execute callback), so a single-threaded executor serves the topics and the
action alike.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rclpy.action import ActionServer, CancelResponse, GoalResponse
from rclpy.node import Node

from robot_latency.ros.action_warmup import WARM_UP_REASON
from robot_latency.ros.driver import PlannerDriver
from robot_latency.ros.plan_msg import goal_command_id, no_plan
from robot_latency.ros.topics import PLAN_ACTION
from robot_latency_interfaces.action import PlanCommand
from robot_latency_interfaces.msg import Plan

log = logging.getLogger(__name__)

#: Feedback while decoding is sent at most this often (s).
FEEDBACK_PERIOD_S = 0.05
#: How often open goals are looked at for a phase change (s).
POLL_PERIOD_S = 0.01


@dataclass
class _Goal:
    """One open goal (fields written under the server's lock)."""

    handle: Any
    command_id: str
    accepted_ns: int
    phase: str = ""
    tokens: int = -1
    feedback_ns: int = 0
    arrival_ns: int = 0  # the command's arrival stamp (the loop's clock)
    way_in_ns: int = 0  # its send stamp to its arrival (0: not stamped on this host)
    withdrawn: bool = False
    handed_over: bool = False  # its plan (or why it has none) is on the way to the executor
    result: Plan | None = None
    reason: str = ""  # why it has no plan: cancelled, superseded, skipped, not_running
    final_tokens: int = 0  # what the model generated in the goal's cycle
    published_ns: int = 0
    warm_up: bool = False  # the node's own warm-up goal (robot_latency.ros.action_warmup)


class PlanActionServer:
    """Serve ``planner/plan_command`` on a planner node (see the module docstring).

    Also the loop's :class:`~robot_latency.planner.loop.Withdrawals`: the driver's loop asks it
    whether a goal's command was cancelled.

    Args:
        node: the planner node; its executor runs every callback.
        driver: returns the open run's driver (None: not running; goals are rejected).
        on_handoff: called in the executor thread with each result's way out as the node sees
            it (ns): the goal's way in (its send stamp to its arrival, when stamped on this
            host) plus the loop's publish call to the result handed to rclpy; the node takes it
            into the transport margin as a round trip.
        clock: the loop's clock (ns, CLOCK_MONOTONIC).
    """

    def __init__(self, node: Node, *, driver: Callable[[], PlannerDriver | None],
                 on_handoff: Callable[[int], None] | None = None,
                 clock: Callable[[], int] = time.perf_counter_ns) -> None:
        self.node = node
        self._driver = driver
        self._on_handoff = on_handoff
        self.clock = clock
        # one lock for the goals' state and their feedback (sent from both threads, in order)
        self._lock = threading.RLock()
        self._goals: dict[str, _Goal] = {}
        self._done: list[_Goal] = []
        # One feedback poll timer for the server's life, cancelled while no goal is open: rclpy
        # keeps a reference in the callback group for every timer ever created (a destroyed one
        # included), so a timer made per goal grew the node by ~190 bytes a goal.
        self._poll: Any = node.create_timer(POLL_PERIOD_S, self._poll_goals)
        self._poll.cancel()
        self.goals_accepted = 0
        self.goals_rejected = 0
        self._warm_up_ids: set[str] = set()
        self._wake = node.create_guard_condition(self._finish_ready)
        self._server = ActionServer(node, PlanCommand, PLAN_ACTION,
                                    execute_callback=self._execute,
                                    goal_callback=self._on_goal,
                                    handle_accepted_callback=self._on_accepted,
                                    cancel_callback=self._on_cancel)

    # --- the loop's side (Withdrawals) --------------------------------------------------------
    def tracks(self, command_id: str) -> bool:
        with self._lock:
            return command_id in self._goals

    def is_withdrawn(self, command_id: str) -> bool:
        with self._lock:
            goal = self._goals.get(command_id)
            return goal is not None and goal.withdrawn

    def dropped(self, command_id: str) -> None:
        self._hand_over(command_id, None, "cancelled")

    def plan_published(self, command_id: str | None, msg: Plan, *, tokens: int = 0) -> None:
        """Note the plan just published for ``command_id`` (the loop's thread): a goal's result;
        ``tokens``: what the model generated in its cycle.

        Goals that arrived before the command planned now were superseded (the mailbox hands
        the loop its newest command): they end at once, without a plan.
        """
        driver = self._driver()
        running = driver.loop.running if driver is not None else None
        if running is not None:
            with self._lock:
                older = [g.command_id for g in self._goals.values()
                         if not g.handed_over and g.command_id != running.command_id
                         and g.arrival_ns and g.arrival_ns < running.arrival_ns]
            for cid in older:
                self._hand_over(cid, None, "superseded")
        if command_id is not None:
            self._hand_over(command_id, msg, tokens=tokens)

    def cycle_recorded(self, command_id: str | None, fallback_reason: str | None,
                       published: bool) -> None:
        """Note a cycle record (the loop's thread): a goal whose cycle published nothing
        (skipped, superseded) ends at once, without a plan."""
        if command_id is not None and not published and fallback_reason:
            self._hand_over(command_id, None, fallback_reason)

    def _hand_over(self, command_id: str, msg: Plan | None, reason: str = "", *,
                   tokens: int = 0) -> None:
        now = self.clock()
        with self._lock:
            goal = self._goals.get(command_id)
            if goal is None or goal.handed_over:
                return  # not a goal, or a later plan of a periodic re-plan
            goal.handed_over, goal.result, goal.published_ns = True, msg, now
            goal.reason, goal.final_tokens = reason, tokens
            self._done.append(goal)
            if msg is not None:
                # from this thread, before the result: feedback is a topic, the result a
                # service answer, and a client drops feedback that comes after the result
                self._last_phases(goal, msg.source)
        self._wake.trigger()

    # --- goals (executor thread) -------------------------------------------------------------
    def register_warm_up(self, command_id: str) -> None:
        """The goal with this id (32 hex digits) is the node's own warm-up: served at once, never
        planned (robot_latency.ros.action_warmup)."""
        self._warm_up_ids.add(command_id)

    def _serve_warm_up(self, goal: _Goal) -> None:
        """Answer the warm-up goal through every path a planned goal takes: its feedback phases
        and a SUCCEEDED result (a plan of source ``none``), with no cycle behind it."""
        goal.warm_up = True
        with self._lock:
            for phase in ("queue", "prefill", "decode"):
                self._feedback(goal, phase, 0)
            stamp = self.node.get_clock().now().to_msg()
            goal.result = no_plan(goal.command_id, WARM_UP_REASON, stamp=stamp)
            goal.handed_over, goal.published_ns = True, self.clock()
            self._done.append(goal)
        self._wake.trigger()

    def _on_goal(self, goal: PlanCommand.Goal) -> GoalResponse:
        if self._driver() is None:
            self.goals_rejected += 1
            self.node.get_logger().warning("PlanCommand goal rejected: the planner is not "
                                           "running (a managed node plans only while active)")
            return GoalResponse.REJECT
        return GoalResponse.ACCEPT

    def _on_accepted(self, handle: Any) -> None:
        driver = self._driver()
        request: PlanCommand.Goal = handle.request
        command_id = goal_command_id(handle.goal_id.uuid)
        goal = _Goal(handle, command_id, self.clock())
        if command_id in self._warm_up_ids:
            self._warm_up_ids.discard(command_id)
            self._serve_warm_up(goal)
            return
        if driver is None:  # the run closed between the goal's acceptance and now
            self._finish(goal, aborted=True)
            return
        with self._lock:
            self._goals[command_id] = goal
        sent_ns = self._sent_on_loop_clock(request.sent)
        deadline_ns = round(request.deadline_ms * 1e6) if request.deadline_ms > 0 else None
        with self._lock:  # stamped before the loop can take it (superseding looks at it)
            goal.arrival_ns = self.clock()
            goal.way_in_ns = max(0, goal.arrival_ns - sent_ns) if sent_ns is not None else 0
        driver.submit(request.command, command_id, sent_ns=sent_ns,
                      state=request.state or None, deadline_ns=deadline_ns)
        self.goals_accepted += 1
        self._feedback(goal, "queue", 0)
        if self._poll.is_canceled():
            self._poll.reset()

    def _sent_on_loop_clock(self, sent: Any) -> int | None:
        """The caller's send stamp (its ROS clock) on the loop's clock; None when unset."""
        sent_ros_ns = sent.sec * 1_000_000_000 + sent.nanosec
        if sent_ros_ns <= 0:
            return None
        now_ros_ns = self.node.get_clock().now().nanoseconds
        return self.clock() - (now_ros_ns - sent_ros_ns)

    def _on_cancel(self, handle: Any) -> CancelResponse:
        command_id = goal_command_id(handle.goal_id.uuid)
        driver = self._driver()
        with self._lock:
            goal = self._goals.get(command_id)
            if goal is None or goal.handed_over:
                return CancelResponse.REJECT  # its plan is already on the way
            goal.withdrawn = True
        # Withdrawn first, then look at the loop: either the loop sees the withdrawal when its
        # cycle starts, or this sees the cycle running and lets the loop abort and drop it.
        running = driver.loop.running if driver is not None else None
        if running is None or running.command_id != command_id:
            self.dropped(command_id)  # not being planned: nothing to abort
        return CancelResponse.ACCEPT

    def _finish_ready(self) -> None:
        with self._lock:
            done, self._done = self._done, []
            for goal in done:
                self._goals.pop(goal.command_id, None)
        for goal in done:
            self._finish(goal)
        self._stop_poll_when_idle()

    def _finish(self, goal: _Goal, *, aborted: bool = False) -> None:
        """Move the goal to its terminal state: its execute callback runs as an executor task."""
        goal.handed_over = True
        if aborted:
            goal.result, goal.reason = None, "not_running"

        def execute(handle: Any) -> PlanCommand.Result:
            result = goal.result
            if result is not None:
                handle.succeed()  # from CANCELING too: the plan came before the cancel
                if self._on_handoff is not None and not goal.warm_up:
                    self._on_handoff(goal.way_in_ns + self.clock() - goal.published_ns)
                return PlanCommand.Result(plan=result)
            if goal.reason == "cancelled" and handle.is_cancel_requested:
                handle.canceled()
            else:
                handle.abort()
            stamp = self.node.get_clock().now().to_msg()
            return PlanCommand.Result(plan=no_plan(goal.command_id, goal.reason, stamp=stamp))

        goal.handle.execute(execute)

    def _execute(self, handle: Any) -> PlanCommand.Result:
        # Never called: each goal is executed with its own callback once its plan is there.
        handle.abort()
        return PlanCommand.Result()

    # --- feedback ----------------------------------------------------------------------------
    def _feedback(self, goal: _Goal, phase: str, tokens: int) -> None:
        with self._lock:
            now = self.clock()
            goal.phase, goal.tokens, goal.feedback_ns = phase, tokens, now
            goal.handle.publish_feedback(PlanCommand.Feedback(
                phase=phase, tokens=tokens, elapsed_ms=(now - goal.accepted_ns) / 1e6))

    def _last_phases(self, goal: _Goal, source: str) -> None:
        """Feedback for the phases the goal's cycle went through since the last poll saw it (a
        cycle can be shorter than :data:`POLL_PERIOD_S`), before its result (under the lock)."""
        tokens = max(goal.final_tokens, goal.tokens, 0)
        if goal.phase == "queue":
            self._feedback(goal, "prefill", 0)
        if tokens > 0 and goal.phase != "decode":
            self._feedback(goal, "decode", tokens)
        if source == "fallback":
            self._feedback(goal, "fallback", tokens)

    def _poll_goals(self) -> None:
        driver = self._driver()
        running = driver.loop.running if driver is not None else None
        if running is None:
            return
        tokens = driver.run.runner.generated_tokens()
        with self._lock:  # decided and sent under the lock: never after the last phases
            goal = self._goals.get(running.command_id)
            if goal is None or goal.handed_over or goal.withdrawn:
                return
            if tokens is None:
                # not with the engine (waiting for it, or done and answering): keep the phase
                if goal.phase == "queue":
                    self._feedback(goal, "prefill", 0)
                return
            phase = "decode" if tokens > 0 else "prefill"
            if phase == "decode" and goal.phase == "queue":
                self._feedback(goal, "prefill", 0)  # it went by between two polls
            if phase != goal.phase and not (phase == "prefill" and goal.phase == "decode"):
                self._feedback(goal, phase, tokens)
            elif (phase == "decode" and tokens > goal.tokens
                  and self.clock() - goal.feedback_ns >= FEEDBACK_PERIOD_S * 1e9):
                self._feedback(goal, phase, tokens)

    def _stop_poll_when_idle(self) -> None:
        with self._lock:
            idle = not self._goals
        if idle and not self._poll.is_canceled():
            self._poll.cancel()

    # --- the run's end -----------------------------------------------------------------------
    def abort_open(self) -> int:
        """Abort the goals still open (the run closed: nothing will plan them); return how many."""
        with self._lock:
            goals = [g for g in self._goals.values() if not g.handed_over]
            self._goals.clear()
            self._done.clear()
        for goal in goals:
            self._finish(goal, aborted=True)
        self._stop_poll_when_idle()
        return len(goals)

    def destroy(self) -> None:
        """Abort open goals and remove the action server, its timer and guard condition."""
        self.abort_open()
        self.node.destroy_timer(self._poll)
        self._server.destroy()
        self.node.destroy_guard_condition(self._wake)
