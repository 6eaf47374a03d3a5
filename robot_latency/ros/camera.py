"""The planner node's camera: the newest frame on ``camera_topic``, and its stamp for each cycle.

With the ``camera_topic`` parameter set, the node (plain or managed) subscribes to it: a
``sensor_msgs/CompressedImage`` where the name ends in ``/compressed`` (image_transport's
convention), else a ``sensor_msgs/Image``. It keeps only the newest frame. Each cycle, at its
start, the loop asks for that frame's header stamp (:meth:`CameraInput.newest`): the cycle plans
with the frame that was newest then, its record holds the frame's stamp and age
(:meth:`robot_latency.records.CycleRecord.take_frame`), and its plan's ``header.stamp`` is the
frame's stamp, exactly (the ROS stamp moved onto the loop's clock and back by the same offset,
:class:`~robot_latency.ros.cycle_stats.ClockBridge`). Empty: text only, nothing subscribed.

With a vision tower (the ``mmproj`` parameter) the cycle also gets the frame's image
(:func:`frame_image`, keyed by its header stamp): a CompressedImage's bytes as they are, an
Image's pixels as RGB (``rgb8``, ``bgr8``, ``mono8``; another encoding plans text-only, with a
warning once).

The subscription is best effort with a short queue (sensor data QoS): it matches a reliable
camera too, and a frame the node is too busy to take is replaced by the next one anyway.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from rclpy.node import Node
from rclpy.qos import qos_profile_sensor_data

from robot_latency.engines.base import FrameImage
from robot_latency.engines.llama_image import RGB_ENCODINGS, raw_frame
from robot_latency.ros.cycle_stats import ClockBridge

log = logging.getLogger(__name__)


def camera_type(topic: str) -> type[Any]:
    """The message type of a camera topic: CompressedImage for ``.../compressed``, else Image.

    sensor_msgs is imported here, not with the module: a text-only node runs without it."""
    from sensor_msgs.msg import CompressedImage, Image

    return CompressedImage if topic.rstrip("/").endswith("/compressed") or \
        topic.rstrip("/") == "compressed" else Image


def stamp_ns(msg: Any) -> int:
    """A message's header stamp in ns."""
    return int(msg.header.stamp.sec) * 1_000_000_000 + int(msg.header.stamp.nanosec)


def frame_image(msg: Any, key: str) -> FrameImage | None:
    """A camera message as the image a vision tower reads: a CompressedImage's file bytes, an
    Image's pixels as packed RGB; None for an Image encoding other than :data:`RGB_ENCODINGS`."""
    if not hasattr(msg, "encoding"):  # sensor_msgs/CompressedImage: PNG or JPEG bytes
        return FrameImage(key=key, data=bytes(msg.data))
    return raw_frame(key, msg.encoding, int(msg.width), int(msg.height), int(msg.step),
                     bytes(msg.data))


class CameraInput:
    """The camera subscription and the newest frame received (thread-safe: the executor writes,
    the loop's thread reads).

    Args:
        node: the planner node.
        topic: the camera topic.
        clocks: the node's clock bridge (the plan stamps' own).
    """

    def __init__(self, node: Node, topic: str, clocks: ClockBridge, *,
                 with_image: bool = False) -> None:
        self.clocks = clocks
        self.with_image = with_image
        self._warned = False
        self._image: FrameImage | None = None  # the last frame converted (the loop's thread)
        self.msg_type = camera_type(topic)
        self._lock = threading.Lock()
        #: the newest frame (the message as received) and its header stamp (ns)
        self.frame: Any = None
        self.frame_stamp_ns: int | None = None
        self.frames_received = 0
        self.subscription = node.create_subscription(self.msg_type, topic, self._on_frame,
                                                     qos_profile_sensor_data)

    def _on_frame(self, msg: Any) -> None:
        with self._lock:
            self.frame, self.frame_stamp_ns = msg, stamp_ns(msg)
            self.frames_received += 1

    def newest(self, loop_clock: Callable[[], int]
               ) -> tuple[int, int, FrameImage | None] | None:
        """The newest frame's header stamp, that stamp on ``loop_clock`` and (with
        :attr:`with_image`) its image; None before the first frame."""
        with self._lock:
            stamp, msg = self.frame_stamp_ns, self.frame
        if stamp is None:
            return None
        key = f"{self.msg_type.__name__}@{stamp}"
        if not self.with_image:
            image = None
        elif self._image is not None and self._image.key == key:
            image = self._image  # the same frame as the last cycle's: not converted again
        else:
            image = self._image = frame_image(msg, key)
        if self.with_image and image is None and not self._warned:
            self._warned = True
            log.warning("camera: Image encoding %r is not one of %s: the cycles plan "
                        "text-only", msg.encoding, ", ".join(RGB_ENCODINGS))
        return stamp, self.clocks.loop_ns(stamp, loop_clock), image

    def source_for(self, loop_clock: Callable[[], int]
                   ) -> Callable[[], tuple[int, int, FrameImage | None] | None]:
        """The loop's frame source (:attr:`robot_latency.planner.loop.PlannerLoop.frame_source`)
        for a run whose clock is ``loop_clock``."""
        return lambda: self.newest(loop_clock)


def camera_input(node: Node, topic: str, clocks: ClockBridge,
                 subscriptions: list[Any], *, with_image: bool = False) -> CameraInput | None:
    """The node's camera on ``topic``, its subscription added to the node's ``subscriptions``
    (removed with them); None for a text-only node (``topic`` empty). ``with_image``: each
    cycle also gets the frame's image (a vision tower reads it)."""
    if not topic:
        return None
    camera = CameraInput(node, topic, clocks, with_image=with_image)
    subscriptions.append(camera.subscription)
    return camera
