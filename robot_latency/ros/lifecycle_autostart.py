"""Configure, then activate, a managed node: what planner.launch.py's ``autostart`` does.

    python -m robot_latency.ros.lifecycle_autostart /planner_node [--timeout-s 300]

``robot-latency launch planner managed:=true`` runs it beside ``managed_planner_node`` where ROS
2's ``launch`` (whose event handlers do this in ``ros2 launch``) is not installed. It waits for
the node's ``change_state`` service, asks for ``configure`` (which loads the model) and, once that
succeeded, ``activate``; it exits 0 when the node is active, 1 when a transition failed or the
node did not answer in time.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence

import rclpy
from lifecycle_msgs.msg import Transition
from lifecycle_msgs.srv import ChangeState
from rclpy.node import Node

_LOG = logging.getLogger(__name__)


def _change(node: Node, client: object, transition: int, label: str, end: float) -> bool:
    request = ChangeState.Request()
    request.transition.id = transition
    future = client.call_async(request)  # type: ignore[attr-defined]
    while not future.done():
        if time.monotonic() > end:
            _LOG.error("%s: no answer in time", label)
            return False
        rclpy.spin_once(node, timeout_sec=0.1)
    ok = bool(future.result().success)
    if not ok:
        _LOG.error("%s refused (the node logs why)", label)
    return ok


def main(argv: Sequence[str] | None = None) -> int:
    """Configure and activate the managed node named on the command line."""
    parser = argparse.ArgumentParser(prog="python -m robot_latency.ros.lifecycle_autostart",
                                     allow_abbrev=False)
    parser.add_argument("node", help="the managed node's name, e.g. /planner_node")
    parser.add_argument("--timeout-s", type=float, default=300.0,
                        help="give up after this long (the configure loads the model)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[%(levelname)s] [%(name)s]: %(message)s")
    rclpy.init(args=[sys.argv[0]])
    node = Node("lifecycle_autostart")
    try:
        end = time.monotonic() + args.timeout_s
        client = node.create_client(ChangeState, f"{args.node}/change_state")
        while not client.wait_for_service(timeout_sec=0.5):
            if time.monotonic() > end:
                _LOG.error("%s/change_state: no such service in time", args.node)
                return 1
        for transition, label in ((Transition.TRANSITION_CONFIGURE, "configure"),
                                  (Transition.TRANSITION_ACTIVATE, "activate")):
            if not _change(node, client, transition, f"{args.node} {label}", end):
                return 1
        _LOG.info("%s: configured and active", args.node)
        return 0
    finally:
        node.destroy_node()
        rclpy.try_shutdown()


if __name__ == "__main__":
    raise SystemExit(main())
