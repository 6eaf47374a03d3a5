"""The ``bag_replayer`` executable: publish a recorded command stream at its recorded pace.

Reads a rosbag2 directory, a bare ``.mcap`` or a ``.jsonl`` stream (robot_latency.streams) and
publishes each command as std_msgs/String on ``planner/command`` (relative: ``/planner/command``
in the root namespace; remap with ``-r planner/command:=/other``). Send times are fixed against
one absolute start time (see :mod:`robot_latency.ros.pacing`), so a late publish never delays
the rest: the planner sees the arrival process that was recorded. With ``planner_node`` this is
the whole pipeline, DDS included.

With ``client_log_dir`` set it is also the client edge: it sends each command tagged with its id
(see :mod:`robot_latency.ros.client_edge`), subscribes to ``planner/plan``, matches each plan
to the command it answers by ``command_id``, and writes ``client.jsonl`` (sent and received
times, plan source; superseded and unanswered commands as such) and ``client_summary.json``
(``reaction_client_ms`` percentiles, the receiver-side miss rate with its Wilson interval,
plans matching no sent command) there. Without it, commands go out as plain text. Plans are
read as the typed Plan on ``planner/plan`` (``plan_json``: the JSON envelope on
``planner/plan_json``).

With ``send_via:=action`` each command is a goal of the planner's ``planner/plan_command`` action
instead (:mod:`robot_latency.ros.action_client`): the goal's result is the plan received, timed
the same way, and the client summary's ``via`` says ``action``. With ``send_via:=typed`` each
command is a typed ``robot_latency_interfaces/msg/Command`` on ``planner/command_typed`` (its id,
its text, its header stamped with the send on this node's ROS clock), matched as a tagged one.

    bag_replayer --ros-args -p bag:=streams/steady -p speed:=1.0 -p client_log_dir:=runs/r1
    ros2 run robot_latency bag_replayer --ros-args -p bag:=/data/session.mcap -p loop_count:=3

Exit status: 0 when every command was sent, 1 when the stream cannot be read or a send failed,
2 for a bad parameter.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.qos import QoSProfile, ReliabilityPolicy
from std_msgs.msg import Bool, String

from robot_latency.report.client import write_client_log
from robot_latency.ros.action_client import GoalSender
from robot_latency.ros.camera import stamp_ns
from robot_latency.ros.client_edge import ClientTracker, make_sender
from robot_latency.ros.declare import declare_table, unknown_overrides
from robot_latency.ros.frame_publisher import FramePublisher
from robot_latency.ros.main_util import ros_main, spin_until
from robot_latency.ros.pacing import Pacer, Send, schedule
from robot_latency.ros.param_spec import ParamError
from robot_latency.ros.plan_msg import plan_envelope
from robot_latency.ros.readiness import ready_qos
from robot_latency.ros.replayer_params import REPLAYER_PARAMS, replayer_settings
from robot_latency.ros.topics import (
    ACK_TOPIC,
    COMMAND_TOPIC,
    COMMAND_TYPED_TOPIC,
    PLAN_JSON_TOPIC,
    PLAN_TOPIC,
    READY_TOPIC,
)
from robot_latency.streams import CommandStream, StreamError, read_stream
from robot_latency_interfaces.msg import Command, Plan

log = logging.getLogger(__name__)

NODE_NAME = "bag_replayer"

EXIT_OK, EXIT_FAILED, EXIT_BAD_PARAMETER = 0, 1, 2


class BagReplayerNode(Node):
    """Declares the replayer's parameters, reads the stream and owns the command publisher.

    Construction never raises for a bad parameter or an unreadable stream: the reason is in
    :attr:`startup_error` and the exit status in :attr:`startup_status`.
    """

    def __init__(self, node_name: str = NODE_NAME, **node_kwargs: Any) -> None:
        super().__init__(node_name, **node_kwargs)
        self.startup_error: str | None = None
        self.startup_status = EXIT_OK
        self.stream: CommandStream | None = None
        try:
            values = declare_table(self, REPLAYER_PARAMS)
            self.settings = replayer_settings(values)
        except ParamError as err:
            self._fail(f"bad parameter: {err}", EXIT_BAD_PARAMETER)
            return
        for name in unknown_overrides(self, REPLAYER_PARAMS):
            self.get_logger().warning(f"parameter {name!r} is not a parameter of {node_name}; "
                                      "ignored (a typo?)")
        s = self.settings
        self.frames: FramePublisher | None = None
        try:
            self.stream = read_stream(s.bag, topic=s.topic, camera_topic=(
                s.bag_camera_topic if s.send_frames else ""))
        except StreamError as err:
            self._fail(str(err), EXIT_FAILED)
            return
        # Reliable with a deep queue: a burst in the recording must reach the planner's mailbox
        # (which decides what to drop), not be lost on the wire.
        s = self.settings
        self.typed = s.send_via == "typed"
        self.publisher = self.create_publisher(
            *((Command, COMMAND_TYPED_TOPIC) if self.typed else (String, COMMAND_TOPIC)),
            QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE))
        # The client edge: the receive time is read in the callback, so it includes this
        # executor's delay, as a robot's controller would feel it.
        self.tracker = ClientTracker(deadline_ms=s.deadline_ms, via=s.send_via,
                                     max_frame_age_ms=s.max_frame_age_ms)
        self._tagged_send = self._send_typed if self.typed else make_sender(self.tracker,
                                                                              self.send)
        self.client_edge = s.client_log_dir is not None or s.send_via in ("action", "typed")
        self.goals: GoalSender | None = None
        if self.client_edge:
            # Each plan is acknowledged from the plan callback (its cycle echoed): the planner
            # measures the round trip, this executor's delay included, for its transport margin.
            self.ack_pub = self.create_publisher(
                String, ACK_TOPIC, QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE))
        if s.send_via == "action":
            self.goals = GoalSender(self, self.tracker, deadline_ms=s.deadline_ms or 0.0,
                                    on_plan=lambda plan: self._ack(plan.cycle))
        elif self.client_edge:
            plan_type, plan_topic = (String, PLAN_JSON_TOPIC) if s.plan_json else (Plan,
                                                                                   PLAN_TOPIC)
            self.plan_sub = self.create_subscription(
                plan_type, plan_topic, self._on_plan,
                QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE))
        # The planner's readiness (transient local: a late joiner reads the latest state).
        self.planner_ready = not s.wait_for_ready
        if s.wait_for_ready:
            self.ready_sub = self.create_subscription(Bool, READY_TOPIC, self._on_ready,
                                                      ready_qos())
        if self.stream.frames and s.send_frames:
            try:  # the client edge measures the frames' age even when it writes no log
                self.frames = FramePublisher(self, self.stream.frames, s.camera_topic,
                                             self.tracker)
            except StreamError as err:
                self._fail(f"bad parameter: {err}", EXIT_BAD_PARAMETER)
                return
        self.get_logger().info(
            f"stream {self.stream.source}: {len(self.stream.commands)} commands over "
            f"{self.stream.duration_ns / 1e9:.2f} s (topic {self.stream.topic}); publishing to "
            f"{self.resolve_topic_name(COMMAND_TOPIC)} at speed x{s.speed:g}, "
            f"{s.loop_count} play(s)" + ("" if self.frames is None else
                                         f"; {len(self.stream.frames)} camera frames to "
                                         f"{self.resolve_topic_name(self.frames.topic)}"))

    def _fail(self, message: str, status: int) -> None:
        self.startup_error, self.startup_status = message, status
        self.get_logger().error(message)

    def send(self, text: str) -> None:
        """Publish one command."""
        self.publisher.publish(Command(text=text) if self.typed else String(data=text))

    def _send_typed(self, command_id: str, text: str, *, stream_command_id: str | None = None,
                    play: int = 0) -> None:
        """Register and publish one typed command, its header stamped with the send (the ROS
        clock, read with the tracker's send time)."""
        sent_ns = self.tracker.clock()
        msg = Command(id=command_id, text=text)
        msg.header.stamp = self.get_clock().now().to_msg()
        self.tracker.sent(command_id, sent_ns, stream_command_id=stream_command_id, play=play)
        try:
            self.publisher.publish(msg)
        except Exception:
            self.tracker.not_sent(command_id)
            raise

    def send_item(self, item: Send) -> None:
        """Publish one scheduled command, tagged with a unique id (``<stream id>@<play>``), or
        send it as a goal (``send_via: action``; its id is the goal id)."""
        if self.goals is not None:
            self.goals.send(f"{item.command_id}@{item.play}", item.text,
                            stream_command_id=item.command_id, play=item.play)
            return
        self._tagged_send(f"{item.command_id}@{item.play}", item.text,
                          stream_command_id=item.command_id, play=item.play)

    def _on_ready(self, msg: Bool) -> None:
        self.planner_ready = bool(msg.data)

    def ready(self) -> bool:
        """Whether the planner is there: its action server, or enough command subscribers,
        and (``wait_for_ready``) its planner/ready true."""
        if not self.planner_ready:
            return False
        if self.goals is not None:
            return self.goals.server_ready()
        return self.publisher.get_subscription_count() >= self.settings.min_subscribers

    def _ack(self, cycle: Any) -> None:
        if isinstance(cycle, int) and cycle >= 0:
            self.ack_pub.publish(String(data=str(cycle)))

    def _on_plan(self, msg: Plan | String) -> None:
        received_ns = self.tracker.clock()
        if isinstance(msg, String):
            try:
                cycle = json.loads(msg.data).get("cycle")
            except (ValueError, AttributeError):
                cycle = None
            self._ack(cycle)
            self.tracker.received(msg.data, received_ns)
            return
        self._ack(msg.cycle)
        self.tracker.received(plan_envelope(msg), received_ns, stamp_ns=stamp_ns(msg))

    def write_client_log(self) -> dict[str, Any]:
        """Log the client-edge summary; write client.jsonl and client_summary.json."""
        summary = self.tracker.summary()
        c = summary["reaction_client_ms"]

        def fmt(x: float | None) -> str:
            return "n/a" if x is None else f"{x:.1f}"

        self.get_logger().info(
            f"client edge: {summary['commands']} commands, {summary['answered']} answered "
            f"({summary['answered_late']} late), {summary['superseded']} superseded, "
            f"{summary['unanswered']} unanswered, {summary['plans_unmatched']} unmatched plans; "
            f"reaction p50 {fmt(c['p50'])} ms, p99 {fmt(c['p99'])} ms (n={c['n']})"
            + ("" if not (a := summary["frame_age_ms"])["n"] else
               f"; frame age p50 {fmt(a['p50'])} ms, p99 {fmt(a['p99'])} ms (n={a['n']}), "
               f"{summary['answered_stale']} stale"))
        out = self.settings.client_log_dir
        if out is not None:
            try:
                path = write_client_log(self.tracker.records(), summary, out)
                self.get_logger().info(f"client log written: {path}")
            except OSError as err:
                self.get_logger().error(f"cannot write the client log in {out}: {err}")
        return summary


def main(argv: list[str] | None = None) -> int:
    """Replay the stream; return the exit status (see the module docstring)."""
    with ros_main(argv, log) as stop:
        node: BagReplayerNode | None = None
        pacer: Pacer | None = None
        try:
            node = BagReplayerNode()
            if node.startup_error is not None or node.stream is None:
                return node.startup_status
            s = node.settings
            executor = SingleThreadedExecutor()
            executor.add_node(node)
            # Wait (spinning, so discovery runs) for the listeners, then the start delay.
            publisher = node.publisher
            matched = spin_until(executor, stop, done=node.ready,
                                 deadline_s=time.monotonic() + s.wait_for_subscriber_s)
            if not matched and not stop.is_set():
                node.get_logger().warning(
                    f"{publisher.get_subscription_count()} of {s.min_subscribers} "
                    f"subscriber(s) on {publisher.topic_name}"
                    + (", no PlanCommand action server" if node.goals is not None else "")
                    + ("" if node.planner_ready else ", planner/ready not true")
                    + f" after {s.wait_for_subscriber_s:g} s; replaying anyway")
            spin_until(executor, stop, deadline_s=time.monotonic() + s.start_delay_s)
            start_ns = time.perf_counter_ns()
            sends = schedule(node.stream.commands, start_ns=start_ns, speed=s.speed,
                             loop_count=s.loop_count, loop_gap_ns=round(s.loop_gap_s * 1e9),
                             frames=node.stream.frames if node.frames is not None else ())
            pacer = Pacer(sends, node.send,
                          send_item=node.send_item if node.client_edge else None,
                          send_frame=node.frames.send if node.frames is not None else None)
            pacer.start()
            spin_until(executor, stop, done=pacer.done.is_set)
            pacer.stop()
            node.get_logger().info(f"replay {'stopped' if stop.is_set() else 'done'}: "
                                   f"{pacer.report.summary()}")
            # Let the last commands be delivered (reliable QoS) and answered before leaving:
            # measuring at the client edge, until the last command's plan is in (tail_s is
            # then a bound, so a slow host's last plan is not counted unanswered); else tail_s.
            spin_until(executor, stop, done=node.tracker.last_answered if node.client_edge
                       else None, deadline_s=time.monotonic() + s.tail_s)
            if s.stay_alive:
                spin_until(executor, stop)
            if node.client_edge:
                node.write_client_log()
            executor.remove_node(node)
            failed = pacer.report.failed or pacer.report.sent < sum(
                1 for item in sends if item.frame is None)
            return EXIT_FAILED if failed and not stop.is_set() else EXIT_OK
        finally:
            if pacer is not None:
                pacer.stop()
            if node is not None and node.frames is not None:
                node.frames.close()
            if node is not None:
                node.destroy_node()


if __name__ == "__main__":
    sys.exit(main())
