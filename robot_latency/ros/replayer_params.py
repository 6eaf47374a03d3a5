"""The bag replayer node's parameters and settings: declared once, validated in one place.

Pure Python (no rclpy), like :mod:`robot_latency.ros.params`, whose :class:`ParamSpec` and checks
it uses.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from robot_latency.ros.param_spec import ParamError, ParamSpec, typed_values

#: How the replayer sends its commands.
SEND_VIA = ("topic", "action", "typed")

#: The bag replayer node's parameters, in declaration order.
REPLAYER_PARAMS: tuple[ParamSpec, ...] = (
    ParamSpec("bag", "", "string", "rosbag2 directory, bare .mcap or .jsonl command stream"),
    ParamSpec("topic", "", "string",
              "command topic in the bag; empty: the bag's only std_msgs/msg/String topic"),
    ParamSpec("speed", 1.0, "double", "time compression of the recording (2.0: twice as fast)",
              low=0.001, high=1000.0),
    ParamSpec("loop_count", 1, "integer", "times the stream is played", low=1, high=1_000_000),
    ParamSpec("loop_gap_s", 1.0, "double",
              "pause between the end of one play and the next (s)", low=0.0, high=3600.0),
    ParamSpec("start_delay_s", 1.0, "double",
              "pause after the subscribers are found (or wait_for_subscriber_s ran out) before "
              "the first command (s)", low=0.0, high=3600.0),
    ParamSpec("wait_for_subscriber_s", 10.0, "double",
              "wait at most this long for min_subscribers subscribers to the command topic "
              "before starting (s)", low=0.0, high=3600.0),
    ParamSpec("wait_for_ready", True, "bool",
              "also wait (within wait_for_subscriber_s) for the planner's planner/ready to say "
              "true: its engine loaded and warm, its loop running; a planner that does not "
              "publish it (another node) is waited for the whole wait_for_subscriber_s"),
    ParamSpec("min_subscribers", 1, "integer",
              "subscribers to wait for: the planner, plus any recorder or monitor listening "
              "too (a command sent before a subscriber is matched never reaches it)",
              low=1, high=1000),
    ParamSpec("tail_s", 1.0, "double",
              "keep running this long after the last command, so it is delivered and "
              "answered (s); measuring at the client edge, at most this long: it ends when "
              "the last command's plan arrives", low=0.0, high=3600.0),
    ParamSpec("stay_alive", False, "bool", "keep running after the replay instead of exiting"),
    ParamSpec("client_log_dir", "", "string",
              "measure at the client edge and write client.jsonl and client_summary.json here "
              "(usually the planner's run directory): each command is sent tagged with its id "
              "({\"command_id\", \"text\"} JSON) and plans are matched to it; empty: plain "
              "text commands, nothing measured"),
    ParamSpec("deadline_ms", 0.0, "double",
              "deadline for the receiver-side miss rate (ms); 0: the one the plans carry",
              low=0.0, high=3_600_000.0),
    ParamSpec("send_via", "topic", "string",
              "how commands go out: topic (planner/command; with client_log_dir tagged, plans "
              "read from planner/plan) or action (a planner/plan_command goal each, with "
              "deadline_ms as the goal's deadline; its result is the plan received) or typed "
              "(a robot_latency_interfaces/msg/Command each on planner/command_typed, its "
              "header stamped with the send; plans read from planner/plan)",
              choices=SEND_VIA),
    ParamSpec("bag_camera_topic", "", "string",
              "the bag's camera topic (sensor_msgs/Image or CompressedImage) whose frames are "
              "sent with the commands; empty: the bag's only image topic, if it has exactly one "
              "(a JSONL stream's frames are its lines' images)"),
    ParamSpec("send_frames", True, "bool", "send the stream's camera frames, if it has any"),
    ParamSpec("camera_topic", "", "string",
              "where the frames go, as recorded (CompressedImage or Image), each stamped with "
              "its send; empty: camera/image/compressed or camera/image by the recorded type"),
    ParamSpec("max_frame_age_ms", 0.0, "double",
              "client edge: a plan from a camera frame older than this when it is received is "
              "stale (ms); 0: no limit", low=0.0, high=3_600_000.0),
    ParamSpec("plan_json", False, "bool",
              "client edge on the topic: read the JSON envelope on planner/plan_json instead "
              "of the typed Plan on planner/plan (a planner that publishes only JSON)"),
)

REPLAYER_NAMES = frozenset(s.name for s in REPLAYER_PARAMS)


@dataclass(frozen=True)
class ReplayerSettings:
    """The bag replayer's settings (see :data:`REPLAYER_PARAMS`)."""

    bag: Path
    topic: str | None
    speed: float
    loop_count: int
    loop_gap_s: float
    start_delay_s: float
    wait_for_subscriber_s: float
    min_subscribers: int
    tail_s: float
    stay_alive: bool
    client_log_dir: Path | None = None
    deadline_ms: float | None = None
    send_via: str = "topic"
    plan_json: bool = False
    wait_for_ready: bool = True
    bag_camera_topic: str | None = None
    send_frames: bool = True
    camera_topic: str | None = None
    max_frame_age_ms: float | None = None


def replayer_settings(values: Mapping[str, Any]) -> ReplayerSettings:
    """Build the bag replayer's settings from parameter values.

    Raises:
        ParamError: any bad value, or no ``bag`` given.
    """
    v = typed_values(REPLAYER_PARAMS, values)
    if not v["bag"].strip():
        raise ParamError("bag", "required: the stream to replay (bag directory, .mcap or "
                                ".jsonl), e.g. --ros-args -p bag:=/path/to/bag")
    if not v["speed"] > 0:
        raise ParamError("speed", f"{v['speed']!r}: must be > 0")
    return ReplayerSettings(bag=Path(v["bag"]).expanduser(), topic=v["topic"].strip() or None,
                            speed=v["speed"], loop_count=v["loop_count"],
                            loop_gap_s=v["loop_gap_s"], start_delay_s=v["start_delay_s"],
                            wait_for_subscriber_s=v["wait_for_subscriber_s"],
                            min_subscribers=v["min_subscribers"], tail_s=v["tail_s"],
                            stay_alive=v["stay_alive"],
                            client_log_dir=(Path(v["client_log_dir"]).expanduser()
                                            if v["client_log_dir"].strip() else None),
                            deadline_ms=v["deadline_ms"] or None,
                            send_via=v["send_via"].strip(), plan_json=v["plan_json"],
                            wait_for_ready=v["wait_for_ready"],
                            bag_camera_topic=v["bag_camera_topic"].strip() or None,
                            send_frames=v["send_frames"],
                            camera_topic=v["camera_topic"].strip() or None,
                            max_frame_age_ms=v["max_frame_age_ms"] or None)
