"""The bag replayer's camera: a stream's frames published at their recorded pace.

Each frame goes out as it was recorded, a ``sensor_msgs/CompressedImage`` or a
``sensor_msgs/Image`` (its bytes read from the bag as it is sent:
:class:`~robot_latency.streams.frames.FrameLoader`), on ``camera_topic``; by default
``camera/image/compressed`` or ``camera/image`` (image_transport's names, which the planner
node's ``camera_topic`` reads the type from). Its ``header.stamp`` is the send time on the
node's ROS clock, so a frame's age counts from when the robot "took" it; the client edge
registers that stamp with the send time on its own clock (:meth:`ClientTracker.frame_sent`),
and a plan stamped with it came from that frame.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rclpy.node import Node
from rclpy.qos import QoSProfile, ReliabilityPolicy

from robot_latency.ros.client_edge import ClientTracker
from robot_latency.ros.pacing import Send
from robot_latency.streams import Frame, FrameLoader, StreamError
from robot_latency.streams.rosbag import typestore

#: The camera topic by the recorded type (relative names, as the command topic's).
DEFAULT_TOPICS = {True: "camera/image/compressed", False: "camera/image"}


def camera_topic_for(frames: Sequence[Frame], topic: str | None) -> str:
    """The topic to publish ``frames`` on: ``topic``, else the default for their type.

    Raises:
        StreamError: a named topic whose image_transport name says the other type.
    """
    compressed = frames[0].compressed
    if not topic:
        return DEFAULT_TOPICS[compressed]
    says_compressed = topic.rstrip("/").split("/")[-1] == "compressed"
    if says_compressed != compressed:
        raise StreamError(f"camera_topic {topic}: the frames are {frames[0].msgtype}, but a "
                          "planner node reads a topic ending in /compressed as CompressedImage "
                          "and any other as Image; name it accordingly")
    return topic


class FramePublisher:
    """Publishes a stream's frames for the pacer (its ``send_frame``).

    Args:
        node: the replayer node.
        frames: the stream's frames (all of one type: one recorded topic).
        topic: where to publish (see :func:`camera_topic_for`).
        tracker: the client edge, told of each frame's stamp and send time; None: not measured.
    """

    def __init__(self, node: Node, frames: Sequence[Frame], topic: str | None,
                 tracker: ClientTracker | None) -> None:
        self.node = node
        self.compressed = frames[0].compressed
        self.topic = camera_topic_for(frames, topic)
        self.tracker = tracker
        self.loader = FrameLoader(typestore())
        from sensor_msgs.msg import CompressedImage, Image  # only a stream with frames needs it

        self._types = (CompressedImage, Image)
        self.publisher = node.create_publisher(
            CompressedImage if self.compressed else Image, self.topic,
            QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE))

    def message(self, frame: Frame) -> Any:
        """The message for ``frame`` (its bytes read now), header not yet stamped."""
        data = self.loader.data(frame)
        CompressedImage, Image = self._types
        if self.compressed:
            msg = CompressedImage(format=frame.encoding)
        else:
            msg = Image(height=frame.height or 0, width=frame.width or 0,
                        encoding=frame.encoding, is_bigendian=frame.is_bigendian,
                        step=frame.step)
        msg.data = data
        msg.header.frame_id = frame.frame_id or "camera"
        return msg

    def send(self, item: Send) -> None:
        """Publish one scheduled frame, stamped now."""
        assert item.frame is not None
        msg = self.message(item.frame)
        now = self.node.get_clock().now()
        msg.header.stamp = now.to_msg()
        if self.tracker is not None:
            self.tracker.frame_sent(now.nanoseconds, self.tracker.clock())
        self.publisher.publish(msg)

    def close(self) -> None:
        """Close the bag the frames are read from."""
        self.loader.close()
