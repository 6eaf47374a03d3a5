"""A recorded JSONL command stream turned into a rosbag2 bag, for ``ros2 bag play`` and the
``bag_replayer`` (``robot-latency streams make --from FILE.jsonl --out BAG``)."""

from __future__ import annotations

import json
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
    labels: Path | None = None  # the bag's labels.jsonl, when a line carried a label


def jsonl_to_bag(src: Path | str, out: Path | str, *, topic: str = DEFAULT_TOPIC,
                 storage: str = "mcap", state_topic: str | None = None,
                 on_bad_line: str = "error") -> Converted:
    """Write a JSONL command stream as a new rosbag2 bag directory.

    Each line's command becomes a ``std_msgs/msg/String`` on ``topic`` at its recorded time
    (relative to the first line, as :func:`~robot_latency.streams.jsonl.read_jsonl` reads it);
    a line's ``state``, when any line has one, goes on ``state_topic`` (default
    :data:`DEFAULT_STATE_TOPIC`) just before its command, so nothing the file recorded is lost
    (a JSONL ``id`` is not kept: a bag's commands are numbered in order, as a bag reader names
    them). The lines' labels (``expected``) go to ``labels.jsonl`` in the bag directory, one
    ``{"text", "expected"}`` per distinct text, as the shipped streams keep theirs (a bag has no
    field for them, and its commands are named by their order, not the file's ids).

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
    # a line's image goes on the camera topic, as a CompressedImage at its command's time
    bag = write_bag(out, stream.commands, topic=topic, storage=storage, state_topic=states,
                    frames=stream.frames)
    return Converted(bag=bag, stream=stream, topic=topic, state_topic=states,
                     labels=_write_labels(stream, Path(out), src))


def _write_labels(stream: CommandStream, out: Path, src: Path | str) -> Path | None:
    """Write the stream's labels as ``out/labels.jsonl`` (by text); None when it has none.

    Raises:
        StreamError: one text labelled two ways (a bag names its commands by text only).
    """
    by_text: dict[str, object] = {}
    for c in stream.commands:
        if c.expected is None:
            continue
        if c.text in by_text and by_text[c.text] != c.expected:
            raise StreamError(f"{src}:{c.line}: command {c.text!r} is labelled two ways; a bag's "
                              "labels.jsonl names commands by text, so one label per text")
        by_text.setdefault(c.text, c.expected)
    if not by_text:
        return None
    path = out / "labels.jsonl"
    path.write_text("".join(json.dumps({"text": t, "expected": e}) + "\n"
                            for t, e in by_text.items()), encoding="utf-8")
    return path
