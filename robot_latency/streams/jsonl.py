"""Read and write command streams as JSON Lines: one ``{"t_ns": int, "text": str}`` per line.

An optional ``"id"`` (str) names the command; without it the id is ``f"{stream}:{index}"``. An
optional ``"state"`` (str) is the robot state text that goes with the command into the prompt of
a planner profile whose template has ``{state}``. An optional ``"expected"`` is the command's
label (a plan in the record's ``plan`` form, possibly partial, or ``"refuse"``), checked against
the planner profile's schema when a run reads it. An optional ``"image"`` names an image file
(PNG or JPEG, relative to the JSONL file): a camera frame stamped at the line's time, just
before its command (the stream's ``frames``; its bytes read when replayed).
Blank lines are ignored. Times are made relative to the first command, like bag log times.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from robot_latency.streams.command import Command, CommandStream
from robot_latency.streams.errors import StreamError
from robot_latency.streams.frames import Frame, image_file_frame

log = logging.getLogger(__name__)

#: What :func:`read_jsonl` does with a bad line.
BAD_LINE_POLICIES = ("error", "skip")


class _BadLine(Exception):
    """One line that is not a valid command (internal; becomes a StreamError or a skip)."""


def read_jsonl(
    path: Path, *, topic: str | None = None, on_bad_line: str = "error",
    state_topic: str | None = None, camera_topic: str | None = None,
) -> CommandStream:
    """Read a JSONL command stream.

    Args:
        path: The ``.jsonl`` file.
        topic: Ignored (JSONL has no topics); accepted so all readers share one signature.
        state_topic: Ignored likewise: a line's robot state is its ``state`` field.
        camera_topic: Ignored likewise: a line's frame is its ``image`` file.
        on_bad_line: ``"error"`` raises on the first bad line; ``"skip"`` logs a warning per bad
            line, leaves it out and records its number in ``skipped_lines``.

    Returns:
        The stream, with times relative to the first good line.

    Raises:
        StreamError: The file cannot be read, or (``on_bad_line="error"``) a line is not JSON,
            lacks a field, has a wrong type, goes back in time or is not valid UTF-8. The message
            names the file and the 1-based line number.
        ValueError: Unknown ``on_bad_line``.
    """
    if on_bad_line not in BAD_LINE_POLICIES:
        raise ValueError(f"on_bad_line must be one of {BAD_LINE_POLICIES}, got {on_bad_line!r}")
    path = Path(path)
    if topic is not None:
        log.warning("JSONL stream %s has no topics; ignoring topic %s", path, topic)
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise StreamError(f"Could not read JSONL stream {path}: {err.strerror or err}") from err

    name = path.stem
    entries: list[tuple[int, str, str | None, str | None, Any, int]] = []
    # (t_ns absolute, text, id, state, expected, line)
    images: list[tuple[int, Frame]] = []  # (t_ns absolute, frame)
    skipped: list[int] = []
    seen_ids: set[str] = set()
    last_t_ns: int | None = None
    for lineno, line in enumerate(raw.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            t_ns, text, command_id, state, expected, image = _parse_line(line)
            if last_t_ns is not None and t_ns < last_t_ns:
                raise _BadLine(f"t_ns {t_ns} goes back in time (previous line: {last_t_ns})")
            if command_id is not None and command_id in seen_ids:
                raise _BadLine(f"duplicate id {command_id!r}")
            frame = None if image is None else _image_frame(path, image, t_ns, lineno)
        except _BadLine as err:
            if on_bad_line == "error":
                raise StreamError(f"{path}:{lineno}: bad command line: {err} (--skip-bad-lines "
                                  "replays the good lines and lists the bad)") from None
            log.warning("%s:%d: skipping bad command line: %s", path, lineno, err)
            skipped.append(lineno)
            continue
        last_t_ns = t_ns
        if command_id is not None:
            seen_ids.add(command_id)
        entries.append((t_ns, text, command_id, state, expected, lineno))
        if frame is not None:
            images.append((t_ns, frame))

    start_ns = entries[0][0] if entries else 0
    commands = tuple(
        Command(t_ns=t_ns - start_ns, text=text, command_id=cid or f"{name}:{index}",
                state=state, expected=expected, line=lineno)
        for index, (t_ns, text, cid, state, expected, lineno) in enumerate(entries)
    )
    frames = tuple(replace(frame, t_ns=t_ns - start_ns) for t_ns, frame in images)
    if not commands:
        log.warning("JSONL stream %s holds no commands", path)
    return CommandStream(
        name=name, source=str(path), commands=commands, topic=None, skipped_lines=tuple(skipped),
        frames=frames,
    )


def _image_frame(path: Path, image: str, t_ns: int, lineno: int) -> Frame:
    """The frame of a line's ``image`` (relative to the JSONL file); _BadLine when unusable."""
    try:
        return image_file_frame(path.parent / image, t_ns=t_ns, stamp_ns=t_ns,
                                where=f"{path}:{lineno}")
    except StreamError as err:
        raise _BadLine(str(err).split(": ", 1)[1]) from None


def _parse_line(line: bytes) -> tuple[int, str, str | None, str | None, Any, str | None]:
    """Parse one non-blank line into (t_ns, text, id or None, state or None, expected or None,
    image or None); raise _BadLine saying why not."""
    try:
        decoded = line.decode("utf-8")
    except UnicodeDecodeError as err:
        raise _BadLine(f"not valid UTF-8 ({err.reason} at byte {err.start})") from None
    try:
        obj = json.loads(decoded)
    except json.JSONDecodeError as err:
        raise _BadLine(f"not JSON ({err.msg} at column {err.colno})") from None
    if not isinstance(obj, dict):
        raise _BadLine(f"expected a JSON object, got {type(obj).__name__}")
    for key in ("t_ns", "text"):
        if key not in obj:
            raise _BadLine(f"missing field {key!r}")
    t_ns, text, command_id = obj["t_ns"], obj["text"], obj.get("id")
    if isinstance(t_ns, bool) or not isinstance(t_ns, int):
        raise _BadLine(f"t_ns must be an integer (ns), got {type(t_ns).__name__}")
    if t_ns < 0:
        raise _BadLine(f"t_ns must be >= 0, got {t_ns}")
    if not isinstance(text, str):
        raise _BadLine(f"text must be a string, got {type(text).__name__}")
    if command_id is not None and (not isinstance(command_id, str) or not command_id):
        raise _BadLine(f"id must be a non-empty string, got {command_id!r}")
    state = obj.get("state")
    if state is not None and not isinstance(state, str):
        raise _BadLine(f"state must be a string, got {type(state).__name__}")
    image = obj.get("image")
    if image is not None and (not isinstance(image, str) or not image):
        raise _BadLine(f"image must be a non-empty string (a file path), got {image!r}")
    return t_ns, text, command_id, state, obj.get("expected"), image


def write_jsonl(path: Path | str, commands: Sequence[Command]) -> Path:
    """Write commands as a new JSONL stream, one ``{"t_ns", "text", "id"}`` object per line.

    Args:
        path: File to create; must not exist.
        commands: Commands to write, in order.

    Returns:
        The file.

    Raises:
        StreamError: The path exists or cannot be written.
    """
    path = Path(path)
    lines = (
        json.dumps({"t_ns": c.t_ns, "text": c.text, "id": c.command_id,
                    **({"state": c.state} if c.state is not None else {}),
                    **({"expected": c.expected} if c.expected is not None else {})},
                   ensure_ascii=False)
        for c in commands
    )
    try:
        data = "".join(line + "\n" for line in lines).encode("utf-8")
    except UnicodeEncodeError as err:  # lone surrogates in a text
        raise StreamError(f"Could not write {path}: a command text is not UTF-8: {err}") from err
    try:
        with path.open("xb") as out:
            out.write(data)
    except FileExistsError:
        raise StreamError(f"Could not write {path}: it exists already, not overwriting") from None
    except OSError as err:
        raise StreamError(f"Could not write {path}: {err.strerror or err}") from err
    return path
