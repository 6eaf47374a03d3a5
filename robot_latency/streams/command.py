"""The command record and the stream of them that the planner replays."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from robot_latency.streams.frames import Frame


@dataclass(frozen=True)
class Command:
    """One operator command as it arrived.

    Attributes:
        t_ns: Arrival time relative to the stream start (ns); >= 0 and non-decreasing in a stream.
        text: The command text, kept as recorded (empty or huge strings are the planner's business).
        command_id: Stable id, ``f"{stream_name}:{index}"`` unless the source gave one.
        state: The robot state text recorded with the command (JSONL ``state``), or None.
        expected: The command's label as recorded (JSONL ``expected``: a plan, possibly partial,
            or ``"refuse"``), unchecked here: the planner profile's schema checks it
            (:mod:`robot_latency.profiles.labels`); None when unlabelled.
        line: The 1-based line it was read from (JSONL), or None.
    """

    t_ns: int
    text: str
    command_id: str
    state: str | None = None
    expected: Any = None
    line: int | None = field(default=None, compare=False)  # where it was read, not what it is

    def __post_init__(self) -> None:
        if isinstance(self.t_ns, bool) or not isinstance(self.t_ns, int):
            raise TypeError(f"Command t_ns must be an int (ns), got {type(self.t_ns).__name__}")
        if self.t_ns < 0:
            raise ValueError(f"Command t_ns must be >= 0, got {self.t_ns}")
        if not isinstance(self.text, str):
            raise TypeError(f"Command text must be a str, got {type(self.text).__name__}")


@dataclass(frozen=True)
class CommandStream:
    """A whole command stream read from one source.

    Attributes:
        name: Short name of the stream (the file or bag directory stem).
        source: Path the stream was read from.
        commands: The commands, ordered by arrival time.
        topic: The bag topic the commands came from; ``None`` for JSONL.
        skipped_lines: 1-based line numbers of JSONL lines skipped as bad (``on_bad_line="skip"``).
        frames: The camera frames recorded with the commands (a bag's camera topic, a JSONL
            line's ``image``), ordered by time; empty for a text-only stream.
        camera_topic: The bag topic the frames came from; None without one.
    """

    name: str
    source: str
    commands: tuple[Command, ...]
    topic: str | None
    skipped_lines: tuple[int, ...] = ()
    frames: tuple[Frame, ...] = ()
    camera_topic: str | None = None

    def __post_init__(self) -> None:
        for prev, cur in zip(self.commands, self.commands[1:], strict=False):
            if cur.t_ns < prev.t_ns:
                raise ValueError(
                    f"Stream {self.source}: command {cur.command_id} at t_ns={cur.t_ns} arrives "
                    f"before {prev.command_id} at t_ns={prev.t_ns}"
                )

    @property
    def duration_ns(self) -> int:
        """Time from the first command to the last (ns); 0 for an empty or one-command stream."""
        if not self.commands:
            return 0
        return self.commands[-1].t_ns - self.commands[0].t_ns

    def __len__(self) -> int:
        return len(self.commands)
