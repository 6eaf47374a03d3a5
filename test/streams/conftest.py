"""Fixtures for the stream tests: small real bags written with rosbags' own Writer."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from rosbags.rosbag2 import StoragePlugin, Writer
from rosbags.typesys import Stores, get_typestore

from robot_latency.streams import Command

#: Commands mixing short and long texts (the planner, not the reader, judges their content).
TEXTS = (
    "stop",
    "go to the kitchen, pick up the red cup from the counter and bring it to the table",
    "turn left",
    "follow the person in the yellow jacket but keep two metres away and stop if they stop",
    "héllo robot, wave ✋",
    "",
    "   ",
    "x" * 100_000,
)

START_NS = 1_750_000_000_000_000_000

#: A message on a topic: (topic, msgtype, log time ns, message object or raw CDR bytes).
Message = tuple[str, str, int, object]


@pytest.fixture(scope="session")
def typestore():
    return get_typestore(Stores.ROS2_HUMBLE)


@pytest.fixture
def commands() -> list[Command]:
    times = [
        0,
        10_000_000,
        10_000_000,
        500_000_000,
        1_250_000_000,
        2_000_000_000,
        2_000_000_001,
        9_999_999_999,
    ]
    return [
        Command(t_ns=t, text=text, command_id=f"fixture:{i}")
        for i, (t, text) in enumerate(zip(times, TEXTS, strict=True))
    ]


@pytest.fixture
def make_bag(typestore) -> Callable[..., Path]:
    """Return a function writing a bag with arbitrary topics through rosbags' real Writer."""

    def make(
        path: Path, messages: Sequence[Message], *, storage: str = "mcap", topics=None
    ) -> Path:
        plugin = {"mcap": StoragePlugin.MCAP, "sqlite3": StoragePlugin.SQLITE3}[storage]
        with Writer(path, version=9, storage_plugin=plugin) as writer:
            conns = {}
            wanted = list(topics or []) + [(t, m) for t, m, _, _ in messages]
            for topic, msgtype in wanted:
                if topic not in conns:
                    conns[topic] = writer.add_connection(topic, msgtype, typestore=typestore)
            for topic, msgtype, stamp, msg in messages:
                data = msg if isinstance(msg, bytes) else typestore.serialize_cdr(msg, msgtype)
                writer.write(conns[topic], stamp, data)
        return path

    return make


@pytest.fixture
def string(typestore):
    return typestore.types["std_msgs/msg/String"]


@pytest.fixture
def int32(typestore):
    return typestore.types["std_msgs/msg/Int32"]
