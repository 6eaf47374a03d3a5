"""The node measures its own transport, so the deadline is kept where the plan is received.

What the node can observe of the path its plans take (publish call, middleware, a subscriber's
executor), fed into the loop's :class:`~robot_latency.planner.margin.TransportMargin`:

- at start-up, a burst of loopback pings: the node publishes its send time on
  ``planner/latency_probe`` and receives it on its own subscription (:data:`PINGS` samples, one
  every :data:`PING_PERIOD_S`, over the same middleware and QoS as the plans); they count in
  the estimate but do not by themselves make the transport known (the margin stays the cap
  until the run's own plans were measured);
- then every plan it publishes, received by its own subscription to the plan topic (the time of
  the publish call, kept per cycle, to the callback);
- and, where the receiver acknowledges plans (it publishes the plan's ``cycle`` on
  :data:`ACK_TOPIC` from its plan callback, as the client edge does), each plan's round trip:
  the publish call to the acknowledgement's arrival, both legs on this node's clock, with the
  receiver's own executor and scheduling delay in it.

Both run in the node's executor thread, as a receiver's callback would. The probe exists only
when the margin is measured (``transport_margin_ms < 0``). The publish times are noted from the
loop's thread and matched from the executor's: one lock guards them (an unguarded eviction
iterating the dict while the executor popped from it raised ``RuntimeError`` in the loop's
publish and lost that cycle's plan).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from std_msgs.msg import String

from robot_latency.planner.margin import TransportMargin
from robot_latency.ros.topics import ACK_TOPIC, PROBE_TOPIC

log = logging.getLogger(__name__)

#: Loopback samples taken at start-up.
PINGS = 40
#: One ping every so often at start-up (s).
PING_PERIOD_S = 0.005
#: Pings sent at most (the subscription may match only after a few were sent).
MAX_PINGS = 400
#: Plans whose publish time is kept for the loopback match at most.
_MAX_PENDING = 64


def _json_cycle(msg: String) -> Any:
    """The ``cycle`` of a JSON plan envelope (None when it is not one)."""
    try:
        return json.loads(msg.data).get("cycle")
    except (ValueError, AttributeError):
        return None


def _qos() -> QoSProfile:
    return QoSProfile(depth=10, history=HistoryPolicy.KEEP_LAST,
                      reliability=ReliabilityPolicy.RELIABLE,
                      durability=DurabilityPolicy.VOLATILE)


class TransportProbe:
    """Loopback pings at start-up and the node's own plans, as transport samples.

    Args:
        node: the planner node (its executor runs the callbacks).
        plan_topic: the topic the node publishes plans on.
        margin: returns the loop's transport margin estimator (None while there is no run).
        clock: the loop's clock (ns, CLOCK_MONOTONIC).
        plan_type: the plan topic's message type (the JSON envelope in a String by default).
        cycle_of: reads a plan message's ``cycle``.
    """

    def __init__(self, node: Node, plan_topic: str,
                 margin: Callable[[], TransportMargin | None], *,
                 clock: Callable[[], int] = time.perf_counter_ns, plan_type: Any = String,
                 cycle_of: Callable[[Any], Any] | None = None) -> None:
        self.node = node
        self.margin = margin
        self.clock = clock
        self._cycle_of = cycle_of or _json_cycle
        self.pings_sent = 0
        self.pings_received = 0
        #: when the start-up pings ended (the margin measured), on :attr:`clock`; None: going on
        self.pings_ended_ns: int | None = None
        self.plans_received = 0
        self.acks_received = 0
        #: publish times forgotten unmatched (more than _MAX_PENDING plans waiting): plans, acks
        self.evicted = {"plans": 0, "acks": 0}
        self._sent: dict[int, int] = {}
        self._sent_for_ack: dict[int, int] = {}
        self._pending_lock = threading.Lock()  # _sent and _sent_for_ack: two threads use them
        self._probe_pub = node.create_publisher(String, PROBE_TOPIC, _qos())
        self._probe_sub = node.create_subscription(String, PROBE_TOPIC, self._on_probe, _qos())
        self._plan_sub = node.create_subscription(plan_type, plan_topic, self._on_plan, _qos())
        self._ack_sub = node.create_subscription(String, ACK_TOPIC, self._on_ack, _qos())
        self._timer: Any = node.create_timer(PING_PERIOD_S, self._ping)

    @property
    def pinging(self) -> bool:
        """Whether the start-up loopback pings are still going on."""
        return self._timer is not None

    def plan_published(self, cycle: Any, published_ns: Any = None) -> None:
        """Note the time the plan of ``cycle`` is published (the loop's thread): the loop's
        ``published_ns`` where it gives one on this clock (not after now), so a thread preempted
        between the loop's stamp and this call is inside the samples; else now."""
        if isinstance(cycle, int):
            now = self.clock()
            if isinstance(published_ns, int) and 0 < published_ns <= now:
                now = published_ns
            with self._pending_lock:
                for kind, pending in (("plans", self._sent), ("acks", self._sent_for_ack)):
                    if len(pending) >= _MAX_PENDING:
                        pending.pop(next(iter(pending)))  # the oldest noted
                        self.evicted[kind] += 1
                    pending[cycle] = now

    def _take(self, pending: dict[int, int], cycle: int) -> int | None:
        with self._pending_lock:
            return pending.pop(cycle, None)

    def _add(self, sample_ns: int, *, probe: bool = False) -> None:
        margin = self.margin()
        if margin is not None:
            (margin.add_probe if probe else margin.add)(sample_ns)

    def _ping(self) -> None:
        if self.pings_received >= PINGS or self.pings_sent >= MAX_PINGS:
            self._stop_pings()
            return
        self.pings_sent += 1
        self._probe_pub.publish(String(data=str(self.clock())))

    def _stop_pings(self) -> None:
        if self._timer is not None:
            self.node.destroy_timer(self._timer)
            self._timer = None
            self.pings_ended_ns = self.clock()
            log.info("transport loopback: %d of %d pings back", self.pings_received,
                     self.pings_sent)

    def _on_probe(self, msg: String) -> None:
        now = self.clock()
        try:
            sent = int(msg.data)
        except ValueError:
            return  # not one of ours
        self.pings_received += 1
        self._add(now - sent, probe=True)

    def _on_plan(self, msg: Any) -> None:
        now = self.clock()
        cycle = self._cycle_of(msg)
        sent = self._take(self._sent, cycle) if isinstance(cycle, int) else None
        if sent is not None:
            self.plans_received += 1
            self._add(now - sent)

    def _on_ack(self, msg: String) -> None:
        now = self.clock()
        try:
            cycle = int(msg.data)
        except ValueError:
            return  # not an acknowledgement
        sent = self._take(self._sent_for_ack, cycle)
        margin = self.margin()
        if sent is not None and margin is not None:
            self.acks_received += 1
            margin.add_round_trip(now - sent)

    def destroy(self) -> None:
        """Remove the probe's publisher, subscriptions and timer from the node."""
        self._stop_pings()
        self.node.destroy_subscription(self._probe_sub)
        self.node.destroy_subscription(self._plan_sub)
        self.node.destroy_subscription(self._ack_sub)
        self.node.destroy_publisher(self._probe_pub)
