"""Command streams: read rosbag2 (directory or bare MCAP) and JSONL streams, write them, and
generate synthetic ones from an arrival process. No ROS install needed (pure-Python `rosbags`).
"""

from robot_latency.streams.arrivals import (
    PROCESSES,
    arrival_times_ns,
    make_stream,
    make_stream_file,
)
from robot_latency.streams.command import Command, CommandStream
from robot_latency.streams.errors import StreamError
from robot_latency.streams.frames import DEFAULT_CAMERA_TOPIC, Frame, FrameLoader
from robot_latency.streams.jsonl import read_jsonl, write_jsonl
from robot_latency.streams.reader import READERS, read_stream, stream_kind
from robot_latency.streams.rosbag import (
    DEFAULT_TOPIC,
    STORAGE_PLUGINS,
    STRING_TYPE,
    read_bag,
    write_bag,
    write_mcap,
)
from robot_latency.streams.shipped import (
    SHIPPED_DIR,
    SHIPPED_STREAMS,
    StreamSpec,
    make_shipped_streams,
)

__all__ = [
    "DEFAULT_CAMERA_TOPIC",
    "DEFAULT_TOPIC",
    "PROCESSES",
    "READERS",
    "SHIPPED_DIR",
    "SHIPPED_STREAMS",
    "STORAGE_PLUGINS",
    "STRING_TYPE",
    "Command",
    "CommandStream",
    "Frame",
    "FrameLoader",
    "StreamError",
    "StreamSpec",
    "arrival_times_ns",
    "make_shipped_streams",
    "make_stream",
    "make_stream_file",
    "read_bag",
    "read_jsonl",
    "read_stream",
    "stream_kind",
    "write_bag",
    "write_jsonl",
    "write_mcap",
]
