"""A recorded JSONL command stream turned into a rosbag2 bag, for ``ros2 bag play`` and the
``bag_replayer`` (``robot-latency streams make --from FILE.jsonl --out BAG``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from robot_latency.streams.command import CommandStream
from robot_latency.streams.errors import StreamError
from robot_latency.streams.jsonl import read_jsonl
from robot_latency.streams.rosbag import DEFAULT_TOPIC, write_bag

log = logging.getLogger(__name__)

#: Where a JSONL line's ``state`` goes in the bag unless another topic is given.
DEFAULT_STATE_TOPIC = "/planner/state"


@dataclass(frozen=True)
class Converted:
    """What a conversion wrote: the bag, the stream it holds and the topics used."""

    bag: Path
    stream: CommandStream
    topic: str
    state_topic: str | None


def jsonl_to_bag(src: Path | str, out: Path | str, *, topic: str = DEFAULT_TOPIC,
                 storage: str = "mcap", state_topic: str | None = None,
                 on_bad_line: str = "error") -> Converted:
    """Write a JSONL command stream as a new rosbag2 bag directory.

    Each line's command becomes a ``std_msgs/msg/String`` on ``topic`` at its recorded time
    (relative to the first line, as :func:`~robot_latency.streams.jsonl.read_jsonl` reads it);
    a line's ``state``, when any line has one, goes on ``state_topic`` (default
    :data:`DEFAULT_STATE_TOPIC`) just before its command, so nothing the file recorded is lost
    (a JSONL ``id`` is not kept: a bag's commands are numbered in order, as a bag reader names
    them).

    Args:
        src: The ``.jsonl`` file.
        out: Bag directory to create; must not exist.
        topic: Command topic.
        storage: ``"mcap"`` or ``"sqlite3"``.
        state_topic: Topic of the robot state (used only when a line has a state).
        on_bad_line: ``"error"`` (stop at the first bad line, naming it) or ``"skip"``.

    Raises:
        StreamError: ``src`` cannot be read (names the file and line) or ``out`` exists or
            cannot be written.
    """
    if Path(out).exists():  # before reading: the cheap refusal first
        raise StreamError(f"Could not write bag {out}: it exists already, not overwriting")
    stream = read_jsonl(Path(src), on_bad_line=on_bad_line)
    has_state = any(c.state is not None for c in stream.commands)
    states = (state_topic or DEFAULT_STATE_TOPIC) if has_state else None
    if state_topic and not has_state:
        log.warning("%s: no line has a state; %s not written", src, state_topic)
    bag = write_bag(out, stream.commands, topic=topic, storage=storage, state_topic=states)
    return Converted(bag=bag, stream=stream, topic=topic, state_topic=states)
