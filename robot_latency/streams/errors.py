"""Errors raised by the command-stream readers and writers."""

from robot_latency.errors import RobotLatencyError


class StreamError(RobotLatencyError):
    """A command stream that cannot be read or written; the message names the file and problem."""
