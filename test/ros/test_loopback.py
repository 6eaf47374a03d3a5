"""The transport probe's publish times: noted from the loop's thread, matched from the executor's.

The loop notes each plan's publish time (and evicts the oldest beyond the limit) while the
executor thread pops the ones whose plan or acknowledgement came back. Both sides are hammered
from two threads at once on a real node, the executor's side matching the oldest cycle still
noted (the one the loop's side evicts next): no call may raise (a raise in the loop's publish
loses that cycle's plan; without the lock it raised ``RuntimeError: dictionary changed size
during iteration`` within a few thousand cycles here), and every noted time is accounted for
exactly once: matched, evicted, or still waiting.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator

import pytest
from rclpy.context import Context
from rclpy.node import Node
from std_msgs.msg import String

from robot_latency.planner.margin import MarginSettings, TransportMargin
from robot_latency.ros.loopback import _MAX_PENDING, TransportProbe

CYCLES = 200_000


@pytest.fixture()
def short_switch_interval() -> Iterator[None]:
    """Switch threads as often as the interpreter allows, so the two sides interleave."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def test_both_sides_from_two_threads_lose_nothing(ros_context: Context,
                                                  short_switch_interval: None) -> None:
    node = Node("loopback_hammer", context=ros_context)
    margin = TransportMargin(MarginSettings(fixed_ms=-1.0))
    probe = TransportProbe(node, "/loopback_hammer/plan", lambda: margin)
    errors: list[BaseException] = []
    latest = [-1]  # the newest cycle noted (one store per cycle: atomic)
    done = threading.Event()
    plans = [String(data=json.dumps({"cycle": c})) for c in range(CYCLES)]
    acks = [String(data=str(c)) for c in range(CYCLES)]

    def loop_side() -> None:
        try:
            for cycle in range(CYCLES):
                probe.plan_published(cycle)
                latest[0] = cycle
        except BaseException as err:  # the failure under test: kept for the assertion
            errors.append(err)
        finally:
            done.set()

    def executor_side() -> None:
        try:
            n = 0
            while not done.is_set():
                oldest = latest[0] - (_MAX_PENDING - 1)
                if oldest >= 0:  # the oldest still noted: the loop's side evicts it next
                    if n % 2:
                        probe._on_plan(plans[oldest])
                    else:
                        probe._on_ack(acks[oldest])
                    n += 1
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=loop_side), threading.Thread(target=executor_side)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert not any(t.is_alive() for t in threads), "a side hung"
        assert errors == []
        assert probe.plans_received + probe.evicted["plans"] + len(probe._sent) == CYCLES
        assert probe.acks_received + probe.evicted["acks"] + len(probe._sent_for_ack) == CYCLES
        assert probe.evicted["plans"] > 0 and probe.evicted["acks"] > 0
        assert margin.total_samples == probe.plans_received + probe.acks_received
    finally:
        probe.destroy()
        node.destroy_node()  # never spun
