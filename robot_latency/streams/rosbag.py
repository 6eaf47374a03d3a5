"""Read and write command streams as rosbag2 recordings, through `rosbags` (no ROS install).

A command is a ``std_msgs/msg/String`` message; its arrival time is the message's log time
(the bag's receive timestamp), made relative to the first command on the topic.

Shapes handled:

- a rosbag2 directory (``metadata.yaml`` plus ``.db3`` or ``.mcap`` storage), and
- a bare ``.mcap`` file (rosbags' :class:`~rosbags.rosbag2.Reader` opens a ``.mcap`` path
  directly, reading the topics from the MCAP schema and channel records).

rosbags writes only bag directories; :func:`write_mcap` writes one into a temporary directory
next to the target and moves its single ``.mcap`` file out.
"""

from __future__ import annotations

import bisect
import logging
import shutil
import struct
import tempfile
from collections.abc import Sequence
from pathlib import Path

from rosbags.interfaces import Connection
from rosbags.rosbag2 import Reader, StoragePlugin, Writer
from rosbags.serde import SerdeError
from rosbags.typesys import Stores, get_typestore
from rosbags.typesys.store import Typestore

from robot_latency.streams.command import Command, CommandStream
from robot_latency.streams.errors import StreamError
from robot_latency.streams.frames import (
    DEFAULT_CAMERA_TOPIC,
    Frame,
    read_frames,
    select_camera_topic,
    write_frames,
)

log = logging.getLogger(__name__)

STRING_TYPE = "std_msgs/msg/String"
DEFAULT_TOPIC = "/planner/command"

#: Humble is what JetPack 6 runs; std_msgs/msg/String is the same in every ROS 2 distro.
TYPESTORE_NAME = Stores.ROS2_HUMBLE

#: rosbag2 metadata version the writer emits (rosbags writes 8 or 9; 9 changed the QoS layout).
BAG_VERSION = 8

#: Log time of the first written message (ns since the epoch). Fixed, so that writing the same
#: commands twice gives the same bag.
DEFAULT_START_NS = 1_700_000_000_000_000_000

#: Storage name -> rosbags storage plugin (the ``storage`` argument of the writers).
STORAGE_PLUGINS: dict[str, StoragePlugin] = {
    "mcap": StoragePlugin.MCAP,
    "sqlite3": StoragePlugin.SQLITE3,
}

_typestore: Typestore | None = None


def typestore() -> Typestore:
    """Return the shared typestore (built on first use; building it parses every message type)."""
    global _typestore
    if _typestore is None:
        _typestore = get_typestore(TYPESTORE_NAME)
    return _typestore


def read_bag(path: Path, *, topic: str | None = None, on_bad_line: str = "error",
             state_topic: str | None = None, camera_topic: str | None = None) -> CommandStream:
    """Read the commands on one String topic of a rosbag2 directory or a bare ``.mcap`` file.

    Args:
        path: Bag directory or ``.mcap`` file.
        topic: Topic to read; by default the bag's single ``std_msgs/msg/String`` topic (other
            than ``state_topic``).
        on_bad_line: Unused for bags (JSONL only); accepted so all readers share one signature.
        state_topic: a String topic of robot state: each command carries the latest state
            message recorded at or before it (None before the first).
        camera_topic: an Image or CompressedImage topic whose frames come with the commands
            (their bytes left in the bag: :class:`~robot_latency.streams.frames.FrameLoader`);
            by default the bag's only image topic, if it has exactly one; ``""``: none.

    Returns:
        The stream, with times relative to the first message on the topic.

    Raises:
        StreamError: The bag cannot be read (missing, corrupt, truncated), or the topic is
            missing, not a String topic, or ambiguous.
    """
    del on_bad_line
    path = Path(path)
    name = path.stem if path.is_file() else path.name
    try:
        with Reader(path) as reader:
            state = _select_topic(path, reader, state_topic) if state_topic else None
            selected = _select_topic(path, reader, topic, exclude=state)
            connections = [c for c in reader.connections if c.topic == selected]
            raw = [(stamp, data) for _, stamp, data in reader.messages(connections=connections)]
            states = [] if state is None else [
                (stamp, data) for _, stamp, data in reader.messages(
                    connections=[c for c in reader.connections if c.topic == state])]
            camera = select_camera_topic(path, reader, camera_topic)
            first_ns = min((stamp for stamp, _ in raw), default=0)
            frames = () if camera is None else read_frames(path, reader, camera,
                                                           start_ns=first_ns,
                                                           typestore=typestore())
    except StreamError:
        raise
    except FileNotFoundError as err:
        raise StreamError(f"Could not read bag {path}: {err}") from err
    except Exception as err:
        # rosbags reports corruption with ReaderError, but a truncated or garbled file can also
        # surface as struct.error, OSError, TypeError, AssertionError or a sqlite (apsw) error,
        # depending on where the parser runs out of bytes. All of them mean "unreadable bag".
        raise StreamError(
            f"Could not read bag {path}: corrupt, truncated or not a rosbag2 recording "
            f"({_describe(err)})"
        ) from err

    # Storage files are read one after another; order by log time (stable, so ties keep order).
    raw.sort(key=lambda item: item[0])
    states.sort(key=lambda item: item[0])
    state_ns = [stamp for stamp, _ in states]
    start_ns = raw[0][0] if raw else 0

    def state_at(stamp: int) -> str | None:
        i = bisect.bisect_right(state_ns, stamp)
        if not i:
            return None
        return _decode_string(states[i - 1][1], path=path, topic=str(state), index=i - 1)

    commands = tuple(
        Command(
            t_ns=stamp - start_ns,
            text=_decode_string(data, path=path, topic=selected, index=index),
            command_id=f"{name}:{index}",
            state=state_at(stamp),
        )
        for index, (stamp, data) in enumerate(raw)
    )
    if not commands:
        log.warning("Bag %s: topic %s holds no messages", path, selected)
    return CommandStream(name=name, source=str(path), commands=commands, topic=selected,
                         frames=frames, camera_topic=camera)


def _describe(err: BaseException) -> str:
    """Describe a foreign exception for a message: its type, and its text when it has one."""
    text = str(err)
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def _topic_listing(topics: dict[str, str | None]) -> str:
    if not topics:
        return "the bag has no topics"
    return "topics: " + ", ".join(
        f"{name} ({msgtype or 'mixed types'})" for name, msgtype in sorted(topics.items())
    )


def _select_topic(path: Path, reader: Reader, topic: str | None, *,
                  exclude: str | None = None) -> str:
    """Pick the command topic: the one asked for, or the only String topic (``exclude`` left
    out: the state topic)."""
    topics = {name: info.msgtype for name, info in reader.topics.items()}
    if topic is not None:
        if topic not in topics:
            raise StreamError(f"Bag {path}: topic {topic} not found; {_topic_listing(topics)}")
        if topics[topic] != STRING_TYPE:
            raise StreamError(
                f"Bag {path}: topic {topic} has type {topics[topic] or 'mixed types'}, "
                f"not {STRING_TYPE}; {_topic_listing(topics)}"
            )
        return topic
    strings = sorted(name for name, msgtype in topics.items()
                     if msgtype == STRING_TYPE and name != exclude)
    if len(strings) == 1:
        return strings[0]
    if not strings:
        raise StreamError(
            f"Bag {path}: no {STRING_TYPE} topic to read commands from; {_topic_listing(topics)}"
        )
    raise StreamError(
        f"Bag {path}: {len(strings)} {STRING_TYPE} topics ({', '.join(strings)}); pick one "
        f"with --topic; {_topic_listing(topics)}"
    )


def _decode_string(data: bytes, *, path: Path, topic: str, index: int) -> str:
    """Deserialize one CDR ``std_msgs/msg/String``; invalid UTF-8 is replaced, with a warning."""
    try:
        return typestore().deserialize_cdr(data, STRING_TYPE).data
    except SerdeError as err:
        if not isinstance(err.__cause__, UnicodeDecodeError):
            raise StreamError(
                f"Bag {path}: message {index} on {topic} is not a valid {STRING_TYPE}: {err}"
            ) from err
    log.warning(
        "Bag %s: message %d on %s is not valid UTF-8; undecodable bytes replaced with U+FFFD",
        path,
        index,
        topic,
    )
    return _string_bytes(data, path=path, topic=topic, index=index).decode(
        "utf-8", errors="replace"
    )


def _string_bytes(data: bytes, *, path: Path, topic: str, index: int) -> bytes:
    """Return the raw bytes of a CDR String message: 4-byte header, uint32 size, bytes, NUL."""
    # Header byte 1 is the encapsulation kind: 0 = CDR big endian, 1 = CDR little endian.
    order = "<" if data[1:2] == b"\x01" else ">"
    try:
        (size,) = struct.unpack_from(f"{order}I", data, 4)
    except struct.error as err:
        raise StreamError(f"Bag {path}: message {index} on {topic} is truncated") from err
    if size < 1 or 8 + size > len(data):
        raise StreamError(f"Bag {path}: message {index} on {topic} has a bad string length {size}")
    return bytes(data[8 : 8 + size - 1])  # size counts the terminating NUL


def serialize_string(text: str) -> bytes:
    """Serialize ``text`` as a CDR ``std_msgs/msg/String`` message."""
    store = typestore()
    msg = store.types[STRING_TYPE](data=text)
    return bytes(store.serialize_cdr(msg, STRING_TYPE))


def write_bag(
    path: Path | str,
    commands: Sequence[Command],
    *,
    topic: str = DEFAULT_TOPIC,
    storage: str = "mcap",
    start_ns: int = DEFAULT_START_NS,
    state_topic: str | None = None,
    frames: Sequence[Frame] = (),
    camera_topic: str = DEFAULT_CAMERA_TOPIC,
) -> Path:
    """Write commands as ``std_msgs/msg/String`` messages into a new rosbag2 directory.

    Args:
        path: Bag directory to create; must not exist.
        commands: Commands to write; each is logged at ``start_ns + t_ns``.
        topic: Topic to publish them on.
        state_topic: also write each command's ``state`` (when it has one) on this String
            topic, logged at the command's time, before it.
        storage: ``"mcap"`` or ``"sqlite3"``.
        start_ns: Log time of ``t_ns == 0`` (ns since the epoch).
        frames: camera frames (compressed: png or jpeg) to write as
            ``sensor_msgs/msg/CompressedImage`` on ``camera_topic``, each logged and stamped at
            ``start_ns + t_ns``.

    Returns:
        The bag directory.

    Raises:
        StreamError: The path exists or the bag cannot be written.
        ValueError: Unknown storage.
    """
    path = Path(path)
    try:
        plugin = STORAGE_PLUGINS[storage]
    except KeyError:
        raise ValueError(
            f"Unknown bag storage {storage!r}; expected one of {sorted(STORAGE_PLUGINS)}"
        ) from None
    if path.exists():
        raise StreamError(f"Could not write bag {path}: it exists already, not overwriting")
    try:
        with Writer(path, version=BAG_VERSION, storage_plugin=plugin) as writer:
            conn: Connection = writer.add_connection(topic, STRING_TYPE, typestore=typestore())
            state_conn: Connection | None = None
            if state_topic is not None:
                state_conn = writer.add_connection(state_topic, STRING_TYPE,
                                                   typestore=typestore())
            for command in commands:
                if state_conn is not None and command.state is not None:
                    writer.write(state_conn, start_ns + command.t_ns,
                                 serialize_string(command.state))
                writer.write(conn, start_ns + command.t_ns, serialize_string(command.text))
            write_frames(writer, tuple(frames), topic=camera_topic, start_ns=start_ns,
                         typestore=typestore())
    except Exception as err:
        # Writer raises WriterError, but a full disk or a bad path surface as OSError/apsw errors.
        raise StreamError(f"Could not write bag {path}: {_describe(err)}") from err
    return path


def write_mcap(
    path: Path | str,
    commands: Sequence[Command],
    *,
    topic: str = DEFAULT_TOPIC,
    start_ns: int = DEFAULT_START_NS,
) -> Path:
    """Write commands into a new bare ``.mcap`` file (no bag directory, no metadata.yaml).

    rosbags only writes bag directories, so this writes one in a temporary directory beside
    ``path`` and moves its single ``.mcap`` storage file to ``path``. The MCAP file carries its
    own schemas, channels and the rosbag2 metadata, so it reads back on its own.

    Args:
        path: File to create; must end in ``.mcap`` and not exist.
        commands: Commands to write; each is logged at ``start_ns + t_ns``.
        topic: Topic to publish them on.
        start_ns: Log time of ``t_ns == 0`` (ns since the epoch).

    Returns:
        The ``.mcap`` file.

    Raises:
        StreamError: The path exists, does not end in ``.mcap``, or cannot be written.
    """
    path = Path(path)
    if path.suffix != ".mcap":
        raise StreamError(f"Could not write {path}: a bare MCAP file must end in .mcap")
    if path.exists():
        raise StreamError(f"Could not write {path}: it exists already, not overwriting")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Same directory as the target, so the final move is a rename on one filesystem.
        with tempfile.TemporaryDirectory(dir=path.parent, prefix=f".{path.stem}-") as tmp:
            bag = write_bag(
                Path(tmp) / "bag", commands, topic=topic, storage="mcap", start_ns=start_ns
            )
            (inner,) = bag.glob("*.mcap")
            shutil.move(str(inner), str(path))
    except StreamError:
        raise
    except (OSError, ValueError) as err:
        raise StreamError(f"Could not write {path}: {err}") from err
    return path
