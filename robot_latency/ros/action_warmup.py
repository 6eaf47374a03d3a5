"""The action's warm-up: one PlanCommand goal the node sends itself before it says it is ready.

A behaviour tree's first call after bring-up goes through paths no topic plan has used yet: the
action server's goal service, its feedback topic and its result service, each made and matched
lazily by the middleware, and rclpy's goal-handle and executor-task machinery. A first goal paid
for them; every later one found them warm. So the node's start ends with one goal of its own,
sent by an rclpy ActionClient on the node, over the middleware as an outside client's would be:

    sent        once the client sees the server (``server_is_ready``), with the run open
    accepted    by the server, which knows the goal's id as the warm-up's: the goal never
                reaches the loop (no cycle, no plan on ``planner/plan``, no record, no margin
                sample), its feedback goes through ``queue``, ``prefill`` and ``decode``
    result      SUCCEEDED, a plan of source ``none`` with ``fallback_reason`` ``warm_up``

``planner/ready`` waits for the result (robot_latency.ros.readiness), or for
:data:`WARM_UP_TIMEOUT_S` (then the node says so and is ready without it: the warm-up never keeps
a node from planning). What it took is in the ready log line and the cold-start record
(``action_warm_up_started``, ``action_warm_up_ended``: robot_latency.ros.cold_start).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from action_msgs.msg import GoalStatus
from rclpy.action import ActionClient
from rclpy.node import Node
from unique_identifier_msgs.msg import UUID

from robot_latency.ros.plan_msg import goal_command_id
from robot_latency.ros.topics import PLAN_ACTION
from robot_latency_interfaces.action import PlanCommand

log = logging.getLogger(__name__)

#: The warm-up goal's command text (never planned).
WARM_UP_COMMAND = "warm-up"
#: Its result's ``fallback_reason``.
WARM_UP_REASON = "warm_up"
#: Ready without the warm-up's result after this long (s).
WARM_UP_TIMEOUT_S = 10.0
#: How often the client looks for the server before it sends (s).
CHECK_PERIOD_S = 0.01


@dataclass
class WarmUpAccount:
    """One warm-up goal's account: what the ready line and the cold-start record say of it.

    Args:
        started_ns: when the warm-up began (the loop's clock).
        status: ``waiting`` (for the server), ``sent``, then how it ended: ``succeeded``,
            ``rejected``, ``timeout`` or ``status N`` (another terminal status).
        ended_ns: when it ended (None until then).
        feedback: the feedback phases received, in order.
        elapsed_ms: ``ended_ns - started_ns`` in ms (None until it ended).
    """

    started_ns: int
    status: str = "waiting"
    ended_ns: int | None = None
    feedback: list[str] = field(default_factory=list)
    elapsed_ms: float | None = None

    def as_dict(self) -> dict[str, Any]:
        """The account as plain values (robot_latency.ros.cold_start takes it so)."""
        return dataclasses.asdict(self)


class ActionWarmUp:
    """Send the node's own warm-up goal (see the module docstring); :attr:`done` once it ended.

    Args:
        node: the planner node (its executor runs the client's callbacks).
        register: tells the action server the goal id (32 hex digits) is the warm-up's.
        clock: the loop's clock (ns).
    """

    def __init__(self, node: Node, register: Callable[[str], None],
                 clock: Callable[[], int] = time.perf_counter_ns) -> None:
        self.node, self._register, self.clock = node, register, clock
        self._client = ActionClient(node, PlanCommand, PLAN_ACTION)
        self._timer: Any = None
        self.done = True  # nothing to wait for until started
        self.result: WarmUpAccount | None = None  # the newest warm-up's account

    def start(self) -> None:
        """Begin a warm-up (each activation of a managed node has its own)."""
        self._stop_timer()
        self.done = False
        self.result = WarmUpAccount(started_ns=self.clock())
        self._timer = self.node.create_timer(CHECK_PERIOD_S, self._check)

    def _check(self) -> None:
        result = self.result
        if self.done or result is None:
            self._stop_timer()
            return
        if (self.clock() - result.started_ns) / 1e9 > WARM_UP_TIMEOUT_S:
            self._end("timeout")
            log.warning("the action warm-up goal had no result in %.0f s: ready without it",
                        WARM_UP_TIMEOUT_S)
            return
        if result.status == "waiting" and self._client.server_is_ready():
            self._send()

    def _send(self) -> None:
        assert self.result is not None
        goal_id = os.urandom(16)
        self._register(goal_command_id(goal_id))
        self.result.status = "sent"
        started = self.result
        future = self._client.send_goal_async(
            PlanCommand.Goal(command=WARM_UP_COMMAND),
            feedback_callback=lambda fb: started.feedback.append(fb.feedback.phase),
            goal_uuid=UUID(uuid=list(goal_id)))
        future.add_done_callback(lambda f: self._on_response(f, started))

    def _on_response(self, future: Any, started: WarmUpAccount) -> None:
        if started is not self.result or self.done:
            return  # a warm-up that timed out, or one of an earlier activation
        handle = future.result()
        if not handle.accepted:
            self._end("rejected")
            return
        handle.get_result_async().add_done_callback(lambda f: self._on_result(f, started))

    def _on_result(self, future: Any, started: WarmUpAccount) -> None:
        if started is not self.result or self.done:
            return
        status = future.result().status
        self._end("succeeded" if status == GoalStatus.STATUS_SUCCEEDED else f"status {status}")

    def _end(self, status: str) -> None:
        assert self.result is not None
        now = self.clock()
        r = self.result
        r.status, r.ended_ns, r.elapsed_ms = status, now, (now - r.started_ns) / 1e6
        self.done = True
        self._stop_timer()

    def line(self) -> str | None:
        """The warm-up in words for the ready log line (None: none ran)."""
        r = self.result
        if r is None or r.elapsed_ms is None:
            return None
        return (f"action warm-up goal {r.status} in {r.elapsed_ms:.0f} ms "
                f"(feedback {', '.join(r.feedback) or 'none'})")

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self.node.destroy_timer(self._timer)
            self._timer = None

    def destroy(self) -> None:
        """Stop waiting and remove the client."""
        self._stop_timer()
        self.done = True
        self._client.destroy()
