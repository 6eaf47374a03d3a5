"""The `bag_replayer` executable (ROS 2). Not implemented yet."""

from __future__ import annotations

import logging
import sys

log = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> int:
    """Exit with a clear message until the node exists."""
    logging.basicConfig(level=logging.INFO)
    log.error("bag_replayer is not implemented yet in robot_latency %s; "
              "use the robot-latency CLI (robot-latency --help)", _version())
    return 1


def _version() -> str:
    from robot_latency import __version__

    return __version__


if __name__ == "__main__":
    sys.exit(main())
