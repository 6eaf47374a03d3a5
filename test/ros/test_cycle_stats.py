"""Typed per-cycle stats and the data's stamps, over real rclpy and Fast DDS (no mocks).

An outside node sends tagged commands stamped with their send (and typed Commands on
``planner/command_typed``, their header stamped with the send), and reads ``planner/cycle_stats``
(robot_latency_interfaces/msg/CycleStats), ``planner/plan`` (Plan) and the JSON records on
``planner/cycle``. It checks one CycleStats per cycle with the record's figures, and that a
plan's and a cycle's ``header.stamp`` is the command's send on the ROS clock: now minus the
stamp, at the receiver, is the client edge's reaction time.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from rclpy.context import Context
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.qos import QoSProfile, ReliabilityPolicy
from std_msgs.msg import String

from robot_latency.ros.client_edge import monotonic_clock_id, tag_command
from robot_latency.ros.cycle_stats import clock_offset_ns
from robot_latency.ros.planner_node import PlannerNode
from robot_latency_interfaces.msg import Command, CycleStats, Plan

Spinner = Any
#: How far two readings of the same instant on the two clocks may disagree (ns): each side
#: reads the pair as tightly as the host allows (:func:`clock_offset_ns`); a preempted read is
#: retried, so this bounds a clock read, not a latency.
CLOCK_READ_NS = 5_000_000


def _ns(stamp: Any) -> int:
    return stamp.sec * 1_000_000_000 + stamp.nanosec


class Client:
    """The outside node: stamped commands out; stats, plans and records in, with receipt times."""

    def __init__(self, spin: Spinner) -> None:
        self.node = spin.add(Node("stats_client", context=spin.executor.context))
        self.wait_for = spin.wait_for
        self.lock = threading.Lock()
        self.stats: list[tuple[CycleStats, int]] = []   # (message, ROS time at receipt)
        self.plans: list[tuple[Plan, int, int]] = []    # (message, ROS and loop time at receipt)
        self.records: list[dict[str, Any]] = []
        self.log_dir: Path | None = None  # the node's run directory
        qos = QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE)
        self.pub = self.node.create_publisher(String, "/planner/command", qos)
        self.typed_pub = self.node.create_publisher(Command, "/planner/command_typed", qos)
        self.node.create_subscription(CycleStats, "/planner/cycle_stats", self._on_stats, qos)
        self.node.create_subscription(Plan, "/planner/plan", self._on_plan, qos)
        self.node.create_subscription(
            String, "/planner/cycle", lambda m: self._keep(self.records, json.loads(m.data)), qos)
        self.clock_id = monotonic_clock_id()
        self.sent: dict[str, int] = {}  # command id -> send on the monotonic clock
        self.typed: dict[str, Command] = {}  # command id -> the typed command sent

    def ros_ns(self) -> int:
        return self.node.get_clock().now().nanoseconds

    def _keep(self, target: list, item: Any) -> None:
        with self.lock:
            target.append(item)

    def _on_stats(self, msg: CycleStats) -> None:
        self._keep(self.stats, (msg, self.ros_ns()))

    def _on_plan(self, msg: Plan) -> None:
        self._keep(self.plans, (msg, self.ros_ns(), time.perf_counter_ns()))

    def snapshot(self, name: str) -> list:
        with self.lock:
            return list(getattr(self, name))

    def send(self, command_id: str, text: str) -> None:
        sent_ns = time.perf_counter_ns()
        self.sent[command_id] = sent_ns
        self.pub.publish(String(data=tag_command(command_id, text, sent_ns=sent_ns,
                                                 clock_id=self.clock_id)))

    def send_typed(self, command_id: str, text: str, *, stamped: bool = True) -> Command:
        msg = Command(id=command_id, text=text)
        self.sent[command_id] = time.perf_counter_ns()
        if stamped:
            msg.header.stamp = self.node.get_clock().now().to_msg()
        self.typed[command_id] = msg
        self.typed_pub.publish(msg)
        return msg


@pytest.fixture(scope="module")
def ros(ros_context: Context, spinner_for: Callable[[Context], Spinner]) -> Iterator[Spinner]:
    """The shared module context (test/ros/conftest.py), spun in the background."""
    spin = spinner_for(ros_context)
    try:
        yield spin
    finally:
        spin.close()


@pytest.fixture(scope="module")
def client(ros: Spinner, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Client]:
    overrides = [Parameter("engine", value="sim"),
                 Parameter("target_device", value="orin-agx-64gb"),
                 Parameter("mode", value="event"), Parameter("deadline_ms", value=400),
                 Parameter("log_dir", value=str(log_dir := tmp_path_factory.mktemp("stats-run")))]
    node = ros.add(PlannerNode(context=ros.executor.context, parameter_overrides=overrides))
    assert node.startup_error is None, node.startup_error
    node.start()
    c = Client(ros)
    c.log_dir = log_dir
    try:
        c.wait_for(lambda: c.pub.get_subscription_count() >= 1
                   and c.typed_pub.get_subscription_count() >= 1
                   and c.node.count_publishers("/planner/cycle_stats") >= 1, 30,
                   "the planner to be discovered")
        yield c
    finally:
        assert node.close() is not None


def test_one_typed_stats_per_cycle_with_the_records_figures(client: Client) -> None:
    ids = [f"stats-{i}" for i in range(4)]
    for i, command_id in enumerate(ids):
        client.send(command_id, "pick up the red cup" if i % 2 else "what time is it")
        client.wait_for(lambda c=command_id: any(m.command_id == c
                                                 for m, _ in client.snapshot("stats")),
                        60, f"the stats of {command_id}")
    client.wait_for(lambda: {r["command_id"] for r in client.snapshot("records")} >= set(ids),
                    30, "the JSON records")
    stats = {m.cycle: m for m, _ in client.snapshot("stats")}
    records = {r["cycle"]: r for r in client.snapshot("records")}
    assert len(stats) == len(client.snapshot("stats"))  # one per cycle
    assert set(stats) == set(records)
    for cycle, rec in records.items():
        msg = stats[cycle]
        assert msg.command_id == (rec["command_id"] or "")
        assert msg.source == rec["plan_source"] and msg.deadline_met == rec["deadline_met"]
        assert msg.fallback_reason == (rec["fallback_reason"] or "")
        assert msg.deadline_ms == rec["deadline_ms"] == 400.0 and msg.mode == "event"
        assert msg.tokens_out == rec["tokens_out"]
        if rec["ttft_ms"] is None:
            assert math.isnan(msg.ttft_ms)
        else:
            assert msg.ttft_ms == pytest.approx(rec["ttft_ms"])
        assert msg.itl_max_ms == pytest.approx(max(rec["itl_ms"])) if len(rec["itl_ms"]) \
            else math.isnan(msg.itl_max_ms)
        assert math.isnan(msg.frame_age_ms)  # no camera
    outcomes = {stats[c].command_id: stats[c].outcome for c in stats}
    assert outcomes["stats-0"] == "refused" and outcomes["stats-1"] == "plan"


def test_stamps_are_the_commands_send_on_the_ros_clock(client: Client) -> None:
    command_id = "stamped-0"
    client.send(command_id, "go to the kitchen")
    plan, ros_at, loop_at = client.wait_for(
        lambda: next((p for p in client.snapshot("plans") if p[0].command_id == command_id),
                     None), 60, "the plan")
    stats = client.wait_for(lambda: next((m for m, _ in client.snapshot("stats")
                                          if m.command_id == command_id), None), 30, "its stats")
    offset_ns = clock_offset_ns(time.perf_counter_ns, client.ros_ns)  # this side's own reading
    sent_ros_ns = client.sent[command_id] + offset_ns
    # The stamp is the send (not the publish): the same instant on the ROS clock.
    assert abs(_ns(plan.header.stamp) - sent_ros_ns) <= 2 * CLOCK_READ_NS
    assert _ns(stats.header.stamp) == _ns(plan.header.stamp)
    # The publish has its own field, after the send and before the receipt.
    assert _ns(plan.header.stamp) <= _ns(plan.published) <= ros_at + 2 * CLOCK_READ_NS
    # A monitor's "now - header.stamp" at the receiver is the client edge's reaction time.
    reaction_ns = loop_at - client.sent[command_id]
    assert abs((ros_at - _ns(plan.header.stamp)) - reaction_ns) <= 2 * CLOCK_READ_NS


def _answer(client: Client, command_id: str) -> tuple[Plan, int, int, CycleStats, dict]:
    """The plan (with its ROS and loop receipt times), the stats and the JSON record of one
    command."""
    plan, ros_at, loop_at = client.wait_for(
        lambda: next((p for p in client.snapshot("plans") if p[0].command_id == command_id),
                     None), 60, f"the plan of {command_id}")
    stats = client.wait_for(lambda: next((m for m, _ in client.snapshot("stats")
                                          if m.command_id == command_id), None), 30, "its stats")
    rec = client.wait_for(lambda: next((r for r in client.snapshot("records")
                                        if r["command_id"] == command_id), None), 30,
                          "its record")
    return plan, ros_at, loop_at, stats, rec


def test_typed_commands_are_planned_with_their_id_and_send_stamp(client: Client) -> None:
    for i, text in enumerate(["go to the kitchen", "pick up the red cup", "stop"]):
        command_id = f"typed-{i}"
        sent = client.send_typed(command_id, text)
        plan, ros_at, loop_at, stats, rec = _answer(client, command_id)
        # The command's send is the cycle's data: the plan's and the stats' stamp are the
        # command's header.stamp exactly (moved onto the loop's clock and back by one offset).
        assert _ns(stats.header.stamp) == _ns(plan.header.stamp) == _ns(sent.header.stamp)
        # The record keeps the send (on the loop's clock) as the cycle's data and its start.
        assert rec["command_sent_ns"] is not None
        assert rec["data_ns"] == rec["command_sent_ns"] == rec["scheduled_ns"]
        assert rec["command_sent_ns"] <= rec["command_arrival_ns"]
        # A monitor's "now - header.stamp" at the receiver is the client edge's reaction time
        # (the two differ by this side's reading of its two clocks only).
        reaction_ns = loop_at - client.sent[command_id]
        assert abs((ros_at - _ns(plan.header.stamp)) - reaction_ns) <= 2 * CLOCK_READ_NS


def test_an_unstamped_typed_command_counts_from_its_arrival(client: Client) -> None:
    client.send_typed("typed-unstamped", "go to the kitchen", stamped=False)
    plan, _, _, stats, rec = _answer(client, "typed-unstamped")
    assert rec["command_sent_ns"] is None
    assert rec["data_ns"] == rec["command_arrival_ns"]
    assert _ns(stats.header.stamp) == _ns(plan.header.stamp) > 0


def test_the_plan_topic_has_greenwaves_keys(client: Client, ros: Spinner) -> None:
    from diagnostic_msgs.msg import DiagnosticArray

    got: list[DiagnosticArray] = []
    client.node.create_subscription(DiagnosticArray, "/diagnostics", got.append, 100)
    for i in range(3):
        client.send(f"gw-{i}", "go to the kitchen")
        client.wait_for(lambda c=f"gw-{i}": any(m.command_id == c
                                                for m, _ in client.snapshot("stats")),
                        60, f"the plan of gw-{i}")

    def plan_status() -> Any:
        for array in list(got):
            for status in array.status:
                if status.name == "/planner/plan" and \
                        dict((kv.key, kv.value) for kv in status.values)["frame_rate_node"] \
                        != "n/a":
                    return status
        return None
    status = client.wait_for(plan_status, 30, "the plan topic's status")
    values = {kv.key: kv.value for kv in status.values}
    assert {"frame_rate_node", "frame_rate_msg", "current_delay_from_realtime_ms",
            "expected_frequency", "tolerance", "total_dropped_frames"} <= set(values)
    assert float(values["frame_rate_node"]) > 0 and float(values["frame_rate_msg"]) > 0
    assert float(values["current_delay_from_realtime_ms"]) >= 0
    assert float(values["expected_frequency"]) == 0.0  # event mode: no expected rate


def test_the_nodes_run_mcap_holds_its_commands_and_cycles_as_they_happen(client: Client) -> None:
    """The node's run directory gets run.mcap too, flushed per cycle: read while the node runs,
    it holds every command the node took and a record per cycle of cycles.jsonl."""
    from robot_latency.records import read_records
    from robot_latency.report.runmcap import read_run_mcap

    client.send("mcap-0", "go to the kitchen")
    client.wait_for(lambda: any(m.command_id == "mcap-0" for m, _ in client.snapshot("stats")),
                    60, "the plan of mcap-0")
    assert client.log_dir is not None
    # the file is open (no index yet): read as a stream, up to what is flushed
    written = read_records(client.log_dir / "cycles.jsonl")
    records, _ = read_run_mcap(client.log_dir / "run.mcap")
    assert [r.to_dict() for r in records] == [r.to_dict() for r in written[: len(records)]]
    assert "mcap-0" in {r.command_id for r in records}
