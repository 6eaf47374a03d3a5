"""``python -m robot_latency.cli``: the ``robot-latency`` command."""

import sys

from robot_latency.cli import main

sys.exit(main())
