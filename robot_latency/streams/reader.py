"""Open any supported command stream: pick the reader by what the path is."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from robot_latency.profiles.labels import (
    LabelSet,
    default_labels_path,
    read_labels,
    stream_labels,
)
from robot_latency.streams.command import CommandStream
from robot_latency.streams.errors import StreamError
from robot_latency.streams.jsonl import read_jsonl
from robot_latency.streams.rosbag import read_bag


class StreamReader(Protocol):
    """One stream format's reader."""

    def __call__(
        self, path: Path, *, topic: str | None = None, on_bad_line: str = "error",
        state_topic: str | None = None, camera_topic: str | None = None,
    ) -> CommandStream:
        """Read the stream at ``path``."""
        ...


#: Stream kind -> reader. A kind is what :func:`stream_kind` says a path is.
READERS: dict[str, StreamReader] = {
    "rosbag2": read_bag,  # a directory with metadata.yaml (sqlite3 or mcap storage)
    "mcap": read_bag,  # a bare .mcap file
    "jsonl": read_jsonl,
}

#: File suffix -> stream kind, for paths that are files.
FILE_KINDS: dict[str, str] = {".mcap": "mcap", ".jsonl": "jsonl"}


def stream_kind(path: Path | str) -> str:
    """Say which kind of stream ``path`` is (a key of :data:`READERS`).

    Raises:
        StreamError: The path does not exist or is no stream kind this package reads.
    """
    path = Path(path)
    if path.is_dir():
        if not (path / "metadata.yaml").is_file():
            raise StreamError(
                f"Could not read stream {path}: a directory but not a rosbag2 bag "
                "(no metadata.yaml)"
            )
        return "rosbag2"
    if not path.exists():
        raise StreamError(f"Could not read stream {path}: no such file or directory")
    kind = FILE_KINDS.get(path.suffix.lower())
    if kind is None:
        raise StreamError(
            f"Could not read stream {path}: unknown stream format {path.suffix or '(no suffix)'}; "
            f"expected a rosbag2 directory or a file ending in {', '.join(sorted(FILE_KINDS))}"
        )
    return kind


def read_stream(
    path: Path | str, *, topic: str | None = None, on_bad_line: str = "error",
    state_topic: str | None = None, camera_topic: str | None = None,
) -> CommandStream:
    """Read a command stream from a rosbag2 directory, a bare ``.mcap`` file or a ``.jsonl`` file.

    Args:
        path: The stream.
        topic: Bag topic to read (``--topic``); by default the bag's only
            ``std_msgs/msg/String`` topic. Ignored for JSONL.
        on_bad_line: JSONL only: ``"error"`` (default) stops at the first bad line, ``"skip"``
            warns, leaves it out and records its line number in ``skipped_lines``.
        state_topic: Bags only: a String topic of robot state; each command carries the latest
            state recorded at or before it (JSONL: each line's ``state`` field).
        camera_topic: Bags only: the Image or CompressedImage topic whose frames come with the
            commands (``frames``); default: the bag's only image topic, if it has exactly one;
            ``""``: none. A JSONL line's frame is its ``image`` file.

    Returns:
        The commands, ordered by arrival, times in ns relative to the first command.

    Raises:
        StreamError: The stream is missing, of an unknown kind, corrupt, has no usable String
            topic, or has a bad JSONL line (with ``on_bad_line="error"``).
    """
    path = Path(path)
    return READERS[stream_kind(path)](path, topic=topic, on_bad_line=on_bad_line,
                                      state_topic=state_topic, camera_topic=camera_topic)


def labels_of_stream(stream: str | Path, *, schema: Mapping[str, Any]) -> LabelSet | None:
    """Return a stream's labels (its commands' own ``expected`` and a bag directory's
    ``labels.jsonl``), keyed by its command ids, or None when it has none.

    Raises:
        LabelError: a label that does not fit ``schema`` (naming the file and line).
        StreamError: the stream cannot be read.
    """
    path = default_labels_path(stream)
    sidecar = read_labels(path, schema=schema) if path is not None else None
    labels = stream_labels(read_stream(stream).commands, schema=schema, source=str(stream),
                           sidecar=sidecar)
    return labels if len(labels) else None
