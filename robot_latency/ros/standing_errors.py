"""ERROR statuses that stand on ``/diagnostics`` until the step they report succeeds.

``/diagnostics`` is volatile: a status published once is lost to a monitor that starts later,
or whose subscription matched a moment after the failure. As diagnostic_updater repeats every
status, a failed start-up or lifecycle transition is published again every
``diagnostics_period_s`` until it is cleared (a later configure or activate that succeeds).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rclpy.exceptions import ParameterNotDeclaredException
from rclpy.node import Node

from robot_latency.ros.diagnostics import ERROR, StatusReport

#: The node parameter that sets the repeat period.
PERIOD_PARAM = "diagnostics_period_s"


class StandingErrors:
    """The ERROR statuses of one node, by name, and the timer that repeats them.

    Args:
        node: the node whose timer repeats them.
        publish: publishes a list of statuses on /diagnostics (best effort).
        default_period_s: the period where the node's ``diagnostics_period_s`` is not declared
            or not usable (the failure being reported may be that very parameter).
    """

    def __init__(self, node: Node, publish: Callable[[Sequence[StatusReport]], None],
                 default_period_s: float) -> None:
        self._node = node
        self._publish = publish
        self._default_period_s = default_period_s
        self._reports: dict[str, StatusReport] = {}
        self._timer: Any = None

    @property
    def names(self) -> tuple[str, ...]:
        """The names of the statuses being repeated."""
        return tuple(self._reports)

    def report(self, name: str, message: str) -> None:
        """Publish ``message`` as the ERROR status ``name`` now and every period until cleared."""
        self._reports[name] = StatusReport(name, ERROR, message, {})
        self._repeat()
        if self._timer is None:
            self._timer = self._node.create_timer(self._period_s(), self._repeat)

    def clear(self, name: str) -> None:
        """Stop repeating ``name``; the timer goes with the last one."""
        self._reports.pop(name, None)
        if not self._reports and self._timer is not None:
            self._node.destroy_timer(self._timer)
            self._timer = None

    def _repeat(self) -> None:
        if self._reports:
            self._publish(list(self._reports.values()))

    def _period_s(self) -> float:
        try:
            value = self._node.get_parameter(PERIOD_PARAM).value
        except ParameterNotDeclaredException:
            return self._default_period_s
        usable = isinstance(value, (int, float)) and value > 0
        return float(value) if usable else self._default_period_s
