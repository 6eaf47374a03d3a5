"""The client edge through the action: each command sent as a PlanCommand goal.

What :func:`robot_latency.ros.client_edge.make_sender` does for tagged commands on the topic,
for goals: the tracker registers the command (its id: the goal id as 32 hex digits, chosen here
so it is registered before it is sent) with its send time, the goal carries the send stamp and
the deadline, and the result, read in its callback, is the plan received. Receiver latency is
the same ``received - sent`` on this host's monotonic clock, so a run sent through the action
compares with one sent on the topic (the summary's ``via`` says which way was used).

Goals are sent from the node's executor thread (a guard condition wakes it): Humble's and
Jazzy's rclpy register a goal's pending response only after the request is out, so a response
taken by the executor in between is dropped as unexpected and the goal never completes (Kilted
takes a lock around it). The send stamp is read there, just before the request goes out.
"""

from __future__ import annotations

import collections
import logging
import threading
import uuid
from collections.abc import Callable
from typing import Any

from rclpy.action import ActionClient
from rclpy.node import Node
from unique_identifier_msgs.msg import UUID

from robot_latency.ros.camera import stamp_ns
from robot_latency.ros.client_edge import ClientTracker
from robot_latency.ros.plan_msg import plan_envelope
from robot_latency.ros.topics import PLAN_ACTION
from robot_latency_interfaces.action import PlanCommand
from robot_latency_interfaces.msg import Plan

log = logging.getLogger(__name__)


class GoalSender:
    """Send commands as PlanCommand goals and hand their results to a :class:`ClientTracker`.

    Args:
        node: the client node (its executor runs the goal and result callbacks).
        tracker: matches results to sent commands.
        deadline_ms: each goal's ``deadline_ms`` (0: the planner's own).
        on_plan: called with each result's Plan in the result callback (the replayer
            acknowledges its cycle from there).
    """

    def __init__(self, node: Node, tracker: ClientTracker, *, deadline_ms: float = 0.0,
                 on_plan: Callable[[Plan], None] | None = None) -> None:
        self.node = node
        self.tracker = tracker
        self.deadline_ms = deadline_ms
        self.on_plan = on_plan
        self.client = ActionClient(node, PlanCommand, PLAN_ACTION)
        self._lock = threading.Lock()
        self.rejected = 0
        self.failed = 0
        self.feedbacks = 0
        self.pending = 0
        self._queue: collections.deque[tuple[uuid.UUID, str, str | None, int]] = \
            collections.deque()
        self._wake = node.create_guard_condition(self._send_queued)

    def server_ready(self) -> bool:
        """Whether the planner's action server is discovered."""
        return self.client.server_is_ready()

    def send(self, command_id: str, text: str, *, stream_command_id: str | None = None,
             play: int = 0) -> str:
        """Send ``text`` as a goal (from any thread: it goes out from the executor's); return
        its command id (the goal id).

        ``command_id`` (the stream's id for this send) is kept as the stream command id when
        none is given.
        """
        goal_uuid = uuid.uuid4()
        with self._lock:
            self.pending += 1
            self._queue.append((goal_uuid, text, stream_command_id or command_id, play))
        self._wake.trigger()
        return goal_uuid.hex

    def _send_queued(self) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    return
                goal_uuid, text, stream_id, play = self._queue.popleft()
            cid = goal_uuid.hex
            goal = PlanCommand.Goal(command=text, deadline_ms=float(self.deadline_ms))
            sent_ns = self.tracker.clock()
            goal.sent = self.node.get_clock().now().to_msg()
            self.tracker.sent(cid, sent_ns, stream_command_id=stream_id, play=play)
            try:
                future = self.client.send_goal_async(
                    goal, feedback_callback=self._on_feedback,
                    goal_uuid=UUID(uuid=list(goal_uuid.bytes)))
            except Exception as err:  # counted; the replay goes on
                log.error("goal %s not sent: %r", cid, err)
                self.tracker.not_sent(cid)
                with self._lock:
                    self.pending -= 1
                    self.failed += 1
                continue
            future.add_done_callback(lambda f, cid=cid: self._on_goal_response(cid, f))

    def _on_feedback(self, _msg: Any) -> None:
        with self._lock:
            self.feedbacks += 1

    def _on_goal_response(self, cid: str, future: Any) -> None:
        handle = future.result()
        if handle is None or not handle.accepted:
            log.warning("goal %s rejected by the planner", cid)
            with self._lock:
                self.rejected += 1
                self.pending -= 1
            return
        handle.get_result_async().add_done_callback(
            lambda f, cid=cid: self._on_result(cid, f))

    def _on_result(self, cid: str, future: Any) -> None:
        received_ns = self.tracker.clock()
        with self._lock:
            self.pending -= 1
        response = future.result()
        if response is None:
            with self._lock:
                self.failed += 1
            return
        plan: Plan = response.result.plan
        if plan.source not in ("model", "fallback"):
            with self._lock:  # aborted (the planner's run closed) or cancelled: no plan
                self.failed += 1
            return
        if self.on_plan is not None:
            self.on_plan(plan)
        self.tracker.received(plan_envelope(plan), received_ns, stamp_ns=stamp_ns(plan))

    def destroy(self) -> None:
        """Remove the action client and its guard condition from the node."""
        self.client.destroy()
        self.node.destroy_guard_condition(self._wake)
