"""The project's one error base.

Every error that reports bad input or a failed operation derives from :class:`RobotLatencyError`,
with one type per subpackage below it (``FloorError``, ``StreamError``, ``EngineError``, ...). The
CLI catches this base once and prints the message as one line with exit status 2; the ROS nodes
log it and exit 1. Types that also derive from a builtin (``ValueError``, ``KeyError``) keep that
base so callers that caught the builtin still work.
"""

from __future__ import annotations


class RobotLatencyError(Exception):
    """Base of every error the project raises on purpose; its message names what was wrong."""


class SettingsError(RobotLatencyError, ValueError):
    """A run setting that cannot be used (a flag's or a ROS parameter's value).

    Attributes:
        name: the setting at fault (a field of ``RunSettings`` or of ``CpuBudget``); each front
            end maps it to its flag or parameter without reading the message.
        message: what is wrong, without the name.
    """

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"{name}: {message}")
        self.name = name
        self.message = message
