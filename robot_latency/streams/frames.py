"""Camera frames that travel with a command stream: read from a bag's image topic or named by a
JSONL line, written as ``sensor_msgs/msg/CompressedImage``.

A :class:`Frame` holds what describes the frame (its time, topic, header stamp, encoding,
size) and, for frames made in memory, its bytes. Frames read from a bag or named by a JSONL line
hold only a reference: :class:`FrameLoader` reads their bytes when asked, opening a bag once and
reading on in order, so a long recording of raw images never sits in memory whole.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rosbags.rosbag2 import Reader, Writer

from robot_latency.streams.errors import StreamError

log = logging.getLogger(__name__)

IMAGE_TYPE = "sensor_msgs/msg/Image"
COMPRESSED_TYPE = "sensor_msgs/msg/CompressedImage"
IMAGE_TYPES = (IMAGE_TYPE, COMPRESSED_TYPE)

#: Where written frames go unless another topic is given (image_transport's compressed name).
DEFAULT_CAMERA_TOPIC = "/camera/image/compressed"

#: File suffix -> CompressedImage ``format`` of an image file a JSONL line names.
IMAGE_FORMATS = {".png": "png", ".jpg": "jpeg", ".jpeg": "jpeg"}


@dataclass(frozen=True)
class Frame:
    """One camera frame of a stream.

    Attributes:
        t_ns: When it was logged, relative to the stream's first command (ns; negative for a
            frame recorded before it). A JSONL image line's frame has its command's time.
        topic: The camera topic it was recorded on (JSONL: ``""``).
        stamp_ns: Its header stamp as recorded (ns; a JSONL line's own ``t_ns``).
        msgtype: ``sensor_msgs/msg/Image`` or ``sensor_msgs/msg/CompressedImage``.
        encoding: Image ``encoding`` (``rgb8``...) or CompressedImage ``format`` (``png``...).
        width, height: Pixels, where known (a raw image's; a PNG's or JPEG's header).
        size_bytes: Size of the image data.
        frame_id: The header's frame id.
        step, is_bigendian: A raw image's row length and byte order (0 for compressed).
        data: The image data, for a frame made in memory; None: read it with
            :class:`FrameLoader` (``source`` and ``index`` say where).
        source: The bag or image file it is read from.
        index: Its position among the topic's messages in the bag's reading order.
    """

    t_ns: int
    topic: str
    stamp_ns: int
    msgtype: str
    encoding: str
    width: int | None = None
    height: int | None = None
    size_bytes: int = 0
    frame_id: str = ""
    step: int = 0
    is_bigendian: int = 0
    data: bytes | None = None
    source: str | None = None
    index: int = 0

    @property
    def compressed(self) -> bool:
        """Whether it is a CompressedImage (else a raw Image)."""
        return self.msgtype == COMPRESSED_TYPE


def image_size(data: bytes) -> tuple[int, int] | None:
    """Width and height from a PNG or JPEG header; None for anything else."""
    if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 24:
        width, height = struct.unpack(">II", data[16:24])
        return width, height
    if data[:2] == b"\xff\xd8":
        i = 2
        while i + 9 <= len(data):
            if data[i] != 0xFF:
                return None
            marker = data[i + 1]
            (length,) = struct.unpack(">H", data[i + 2:i + 4])
            if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):  # start of frame
                height, width = struct.unpack(">HH", data[i + 5:i + 9])
                return width, height
            i += 2 + length
    return None


def image_file_frame(path: Path, *, t_ns: int, stamp_ns: int, where: str) -> Frame:
    """The frame of an image file (PNG or JPEG) a JSONL line names; its bytes read on demand.

    Raises:
        StreamError: the file is missing, unreadable or not a PNG/JPEG (``where`` names the line).
    """
    fmt = IMAGE_FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise StreamError(f"{where}: image {path}: expected a .png, .jpg or .jpeg file")
    try:
        with path.open("rb") as f:
            head = f.read(65536)
        size = path.stat().st_size
    except OSError as err:
        raise StreamError(f"{where}: image {path}: {err.strerror or err}") from err
    wh = image_size(head)
    if wh is None and fmt == "png":
        raise StreamError(f"{where}: image {path}: not a PNG file")
    return Frame(t_ns=t_ns, topic="", stamp_ns=stamp_ns, msgtype=COMPRESSED_TYPE, encoding=fmt,
                 width=wh[0] if wh else None, height=wh[1] if wh else None, size_bytes=size,
                 source=str(path))


def image_topics(reader: Reader) -> list[str]:
    """The bag's image topics (Image or CompressedImage), sorted."""
    return sorted(name for name, info in reader.topics.items() if info.msgtype in IMAGE_TYPES)


def select_camera_topic(path: Path, reader: Reader, camera_topic: str | None) -> str | None:
    """The camera topic to read: the one asked for (``""``: none), else the bag's only image
    topic, else none (logged when there are several).

    Raises:
        StreamError: the topic asked for is missing or not an image topic.
    """
    if camera_topic == "":
        return None
    topics = image_topics(reader)
    if camera_topic is not None:
        if camera_topic not in topics:
            raise StreamError(f"Bag {path}: camera topic {camera_topic} is not an image topic "
                              f"of the bag; image topics: {', '.join(topics) or 'none'}")
        return camera_topic
    if len(topics) > 1:
        log.info("Bag %s: %d image topics (%s); none read without a camera topic", path,
                 len(topics), ", ".join(topics))
    return topics[0] if len(topics) == 1 else None


def read_frames(path: Path, reader: Reader, topic: str, *, start_ns: int,
                typestore: Any) -> tuple[Frame, ...]:
    """Describe every frame on ``topic`` (log time relative to ``start_ns``), ordered by log
    time; the bytes are left in the bag (:class:`FrameLoader` reads them)."""
    connections = [c for c in reader.connections if c.topic == topic]
    msgtype = connections[0].msgtype
    frames = []
    for index, (_, stamp, raw) in enumerate(reader.messages(connections=connections)):
        try:
            msg = typestore.deserialize_cdr(raw, msgtype)
        except Exception as err:
            raise StreamError(f"Bag {path}: message {index} on {topic} is not a valid "
                              f"{msgtype}: {err}") from err
        data = bytes(msg.data) if msgtype == COMPRESSED_TYPE else b""
        header_ns = msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec
        if msgtype == COMPRESSED_TYPE:
            wh = image_size(data[:65536])
            width, height = (wh if wh else (None, None))
            frame = Frame(t_ns=stamp - start_ns, topic=topic, stamp_ns=header_ns,
                          msgtype=msgtype, encoding=msg.format, width=width, height=height,
                          size_bytes=len(data), frame_id=msg.header.frame_id,
                          source=str(path), index=index)
        else:
            frame = Frame(t_ns=stamp - start_ns, topic=topic, stamp_ns=header_ns,
                          msgtype=msgtype, encoding=msg.encoding, width=int(msg.width),
                          height=int(msg.height), size_bytes=len(msg.data),
                          frame_id=msg.header.frame_id, step=int(msg.step),
                          is_bigendian=int(msg.is_bigendian), source=str(path), index=index)
        frames.append(frame)
    frames.sort(key=lambda f: f.t_ns)
    return tuple(frames)


class FrameLoader:
    """Reads frames' image data on demand: a bag opened once and read on in order (a frame
    asked for out of order reopens it), an image file read whole.

    Args:
        typestore: the typestore to deserialize bag messages with.
    """

    def __init__(self, typestore: Any) -> None:
        self.typestore = typestore
        self._key: tuple[str, str] | None = None
        self._reader: Reader | None = None
        self._messages: Iterator[tuple[Any, int, bytes]] | None = None
        self._next = 0

    def data(self, frame: Frame) -> bytes:
        """The frame's image data (compressed bytes, or a raw image's pixels).

        Raises:
            StreamError: the source cannot be read or holds no such frame.
        """
        if frame.data is not None:
            return frame.data
        if frame.source is None:
            raise StreamError(f"frame at {frame.t_ns} ns has neither data nor a source")
        if not frame.topic:
            try:
                return Path(frame.source).read_bytes()
            except OSError as err:
                raise StreamError(f"image {frame.source}: {err.strerror or err}") from err
        key = (frame.source, frame.topic)
        if self._key != key or frame.index < self._next or self._messages is None:
            self._open(key)
        assert self._messages is not None
        for _, _, raw in self._messages:
            self._next += 1
            if self._next - 1 == frame.index:
                msg = self.typestore.deserialize_cdr(raw, frame.msgtype)
                return bytes(msg.data)
        raise StreamError(f"Bag {frame.source}: no message {frame.index} on {frame.topic}")

    def _open(self, key: tuple[str, str]) -> None:
        self.close()
        try:
            self._reader = Reader(Path(key[0]))
            self._reader.open()
        except Exception as err:
            raise StreamError(f"Could not read bag {key[0]}: {err}") from err
        connections = [c for c in self._reader.connections if c.topic == key[1]]
        self._messages = self._reader.messages(connections=connections)
        self._key, self._next = key, 0

    def close(self) -> None:
        """Close the open bag, if any."""
        if self._reader is not None:
            self._reader.close()
        self._reader = self._messages = self._key = None


def write_frames(writer: Writer, frames: tuple[Frame, ...] | list[Frame], *, topic: str,
                 start_ns: int, typestore: Any) -> None:
    """Write frames as ``sensor_msgs/msg/CompressedImage`` on ``topic``, each logged and
    stamped at ``start_ns + t_ns`` (its header stamp: when it was taken)."""
    if not frames:
        return
    conn = writer.add_connection(topic, COMPRESSED_TYPE, typestore=typestore)
    types = typestore.types
    loader = FrameLoader(typestore)
    try:
        for frame in frames:
            if not frame.compressed:
                raise StreamError(f"frame at {frame.t_ns} ns is a raw {frame.msgtype}; only "
                                  "compressed frames (png, jpeg) are written")
            at = start_ns + frame.t_ns
            header = types["std_msgs/msg/Header"](
                stamp=types["builtin_interfaces/msg/Time"](sec=at // 1_000_000_000,
                                                           nanosec=at % 1_000_000_000),
                frame_id=frame.frame_id or "camera")
            msg = types[COMPRESSED_TYPE](
                header=header, format=frame.encoding,
                data=np.frombuffer(loader.data(frame), dtype=np.uint8))
            writer.write(conn, at, bytes(typestore.serialize_cdr(msg, COMPRESSED_TYPE)))
    finally:
        loader.close()
