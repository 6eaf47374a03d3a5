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
