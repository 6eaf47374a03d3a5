"""A cycle record as the typed ``robot_latency_interfaces/msg/CycleStats``, and the data stamps.

``planner/cycle_stats`` carries one CycleStats per cycle: the figures of the JSON record on
``planner/cycle`` as typed numbers, so PlotJuggler, Foxglove and ``ros2 topic echo --field``
read them without parsing JSON. A figure the cycle does not have is NaN, never a silent 0.

Stamps are the data's: a plan's and a cycle's ``header.stamp`` is the time of the command it
answers (its send where the sender stamped it, else its arrival; the cycle's tick without a
command: :attr:`robot_latency.records.CycleRecord.data_ns`), moved from the loop's monotonic clock
onto the node's ROS clock by their offset, read once (:class:`ClockBridge`).
"""

from __future__ import annotations

import collections
import math
import threading
from collections.abc import Callable
from typing import Any

from builtin_interfaces.msg import Time
from rclpy.qos import QoSProfile, ReliabilityPolicy
from std_msgs.msg import String

from robot_latency.planner.cycle_fields import cycle_stats_fields
from robot_latency.records import CycleRecord
from robot_latency.ros.topics import CYCLE_STATS_TOPIC, CYCLE_TOPIC
from robot_latency_interfaces.msg import CycleStats

NAN = math.nan


def clock_offset_ns(loop_clock: Callable[[], int], ros_clock_ns: Callable[[], int], *,
                    tries: int = 3) -> int:
    """Return ROS time minus loop time (ns), read as tightly as the host allows: each try reads
    the loop clock, the ROS clock, the loop clock again, and the try with the least time between
    its loop reads (a preemption widens it) gives the offset at its midpoint."""
    best: tuple[int, int] | None = None
    for _ in range(max(1, tries)):
        before = loop_clock()
        ros = ros_clock_ns()
        after = loop_clock()
        gap = after - before
        if best is None or gap < best[0]:
            best = (gap, ros - (before + gap // 2))
    assert best is not None
    return best[1]


def time_msg(ns: int) -> Time:
    """A builtin_interfaces/Time for integer nanoseconds (negative: clamped to 0)."""
    ns = max(0, int(ns))
    return Time(sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000)


def cycle_stats(rec: CycleRecord, *, stamp: Time, frame_age_ms: float | None = None) -> CycleStats:
    """Return the CycleStats for one cycle record, stamped ``stamp`` (the data's, on the ROS
    clock: :attr:`CycleRecord.data_ns` through a :class:`ClockBridge`); its fields are
    :func:`~robot_latency.planner.cycle_fields.cycle_stats_fields` (the same as run.mcap's),
    a figure the cycle does not have NaN."""
    msg = CycleStats()
    msg.header.stamp = stamp
    for name, value in cycle_stats_fields(rec, frame_age_ms=frame_age_ms).items():
        setattr(msg, name, NAN if value is None else value)
    return msg


class ClockBridge:
    """Moves loop-clock times onto the ROS clock by one offset per loop clock, read once
    (:func:`clock_offset_ns`) and kept, so a cycle's plan and its stats carry the same stamp.

    A time that came from the ROS clock (a typed command's ``header.stamp``, moved onto the loop's
    clock by :meth:`loop_ns`) goes back as it came: the newest :data:`KEEP_STAMPS` such times are
    remembered, so a plan's stamp is its command's exactly even where the loop clock it is
    stamped through is another object than the one the command was read with.

    Args:
        ros_clock_ns: the node's ROS clock (ns).
    """

    #: ROS-clock stamps remembered for their way back.
    KEEP_STAMPS = 1024

    def __init__(self, ros_clock_ns: Callable[[], int]) -> None:
        self.ros_clock_ns = ros_clock_ns
        self._offsets: dict[Callable[[], int], int] = {}
        self._from_ros: collections.OrderedDict[int, int] = collections.OrderedDict()
        self._lock = threading.Lock()

    def _offset(self, loop_clock: Callable[[], int]) -> int:
        with self._lock:
            if loop_clock not in self._offsets:
                self._offsets[loop_clock] = clock_offset_ns(loop_clock, self.ros_clock_ns)
            return self._offsets[loop_clock]

    def ros_ns(self, loop_ns: int | None, loop_clock: Callable[[], int] | None) -> int:
        """``loop_ns`` on the ROS clock; now where either is None."""
        if loop_ns is None or loop_clock is None:
            return self.ros_clock_ns()
        with self._lock:
            came_from = self._from_ros.get(loop_ns)
        return came_from if came_from is not None else loop_ns + self._offset(loop_clock)

    def loop_ns(self, ros_ns: int, loop_clock: Callable[[], int]) -> int:
        """``ros_ns`` (the ROS clock) on the loop's clock, by the offset read now: the ROS clock
        (system time, slewed by NTP) drifts from the loop's monotonic one, by tens of
        microseconds within seconds here, enough to put a send after its arrival through an
        offset read at start-up. :meth:`ros_ns` undoes it exactly (the stamp is remembered)."""
        loop = ros_ns - clock_offset_ns(loop_clock, self.ros_clock_ns)
        with self._lock:
            self._from_ros[loop] = ros_ns
            while len(self._from_ros) > self.KEEP_STAMPS:
                self._from_ros.popitem(last=False)
        return loop


class CycleOutputs:
    """The per-cycle publishers: typed CycleStats on ``planner/cycle_stats``, and (``cycle_json``)
    the JSON record on ``planner/cycle``.

    Args:
        create_publisher: the node's publisher factory (a lifecycle node's lifecycle one).
        clocks: moves the records' stamps onto the ROS clock.
        cycle_json: also publish the JSON record (kept for one release).
    """

    def __init__(self, create_publisher: Callable[..., Any], clocks: ClockBridge, *,
                 cycle_json: bool) -> None:
        qos = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE)
        self.clocks = clocks
        self._stats_pub = create_publisher(CycleStats, CYCLE_STATS_TOPIC, qos)
        self._json_pub = create_publisher(String, CYCLE_TOPIC, qos) if cycle_json else None

    def publish(self, rec: CycleRecord, loop_clock: Callable[[], int] | None) -> None:
        """Publish one cycle's record (the typed stats first), stamped with what it answered
        (its ``data_ns``, else its scheduled start) on the ROS clock."""
        loop_ns = rec.data_ns if rec.data_ns is not None else rec.scheduled_ns
        stamp = time_msg(self.clocks.ros_ns(loop_ns, loop_clock))
        self._stats_pub.publish(cycle_stats(rec, stamp=stamp))
        if self._json_pub is not None:
            self._json_pub.publish(String(data=rec.to_json()))

    def destroy(self, destroy_publisher: Callable[[Any], Any]) -> None:
        """Remove the publishers."""
        for pub in (self._stats_pub, self._json_pub):
            if pub is not None:
                destroy_publisher(pub)
