"""What the in-process ROS tests share: a context on a private domain and a safe spinner.

rclpy (Humble to rolling) builds an executor's wait set from the nodes' entities in the
spinning thread. A node, publisher or subscription destroyed from another thread while that
happens makes the spinning thread die with ``InvalidHandle: cannot use Destroyable because
destruction was requested`` (ros2/rclpy#1142, #1355: a QoS event handler that could not be
entered is still added to the wait set). Nothing is spun after that: a node added later
receives no message, and its test times out waiting for a plan.

:class:`Spinner` spins one ``SingleThreadedExecutor`` in a background thread, as the nodes'
own ``main()`` spins one in the foreground, and destroys the nodes it spins only after that
thread has stopped. A transition that destroys entities from inside a callback (a lifecycle
cleanup) then runs in the spinning thread itself, where the race cannot happen. If the thread
dies anyway, the next wait fails at once with its exception instead of timing out.

Handed out as fixtures (the test tree is not a package; see ``test/conftest.py``):
``ros_context`` (one per module, on a random domain) and ``spinner_for`` (a factory).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
import rclpy
from rclpy.context import Context
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node

N = TypeVar("N", bound=Node)
POLL_S = 0.02
SPIN_SLICE_S = 0.05


class Spinner:
    """Spin nodes in a background thread; stop it before destroying them.

    Args:
        context: the rclpy context the nodes belong to.
    """

    def __init__(self, context: Context) -> None:
        self.executor = SingleThreadedExecutor(context=context)
        self.nodes: list[Node] = []
        self.error: BaseException | None = None
        self._context = context
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._spin, name="test-spinner", daemon=True)
        self._thread.start()

    def _spin(self) -> None:
        try:
            while not self._stop.is_set() and self._context.ok():
                self.executor.spin_once(timeout_sec=SPIN_SLICE_S)
        except BaseException as err:  # kept; the test fails with it in its own thread
            self.error = err

    def add(self, node: N) -> N:
        """Spin ``node`` from now on; it is destroyed at :meth:`close`. Returns ``node``."""
        self.nodes.append(node)
        self.executor.add_node(node)
        return node

    def check(self) -> None:
        """Fail the test if the spinning thread died."""
        if self.error is not None:
            pytest.fail(f"the executor's thread died: {self.error!r}")

    def wait_for(self, predicate: Callable[[], Any], timeout_s: float, what: str) -> Any:
        """Poll until ``predicate()`` is truthy and return its value; fail after ``timeout_s``
        or as soon as the spinning thread has died (no callback would run any more)."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            value = predicate()
            if value:
                return value
            self.check()
            time.sleep(POLL_S)
        self.check()
        pytest.fail(f"timed out after {timeout_s} s waiting for {what}")

    def stop(self) -> None:
        """Stop spinning: the thread is joined, the executor shut down. Idempotent.

        Call it before anything that destroys entities from the test's thread (a lifecycle
        node's ``on_shutdown`` called directly, as its ``main()`` does after spinning).
        """
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join()
        self.executor.shutdown()

    def close(self) -> None:
        """Stop spinning, then destroy the nodes (last added first); fail if the thread died."""
        self.stop()
        while self.nodes:
            self.nodes.pop().destroy_node()
        self.check()

    def __enter__(self) -> Spinner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@pytest.fixture(scope="session")
def spinner_for() -> Callable[[Context], Spinner]:
    """Return the :class:`Spinner` factory (one spinner per context or per test)."""
    return Spinner


#: How long a new context listens for other participants on its domain (s), and how many
#: domains it tries before it takes one anyway.
DOMAIN_QUIET_S = 0.5
DOMAIN_TRIES = 5


def _others_on(context: Context) -> list[str]:
    """The nodes of other processes already on ``context``'s domain (discovery on this host
    answers a new participant within milliseconds)."""
    probe = Node("domain_probe", context=context)
    try:
        time.sleep(DOMAIN_QUIET_S)
        return [n for n in probe.get_node_names() if n != "domain_probe"]
    finally:
        probe.destroy_node()


@pytest.fixture(scope="module")
def ros_context() -> Iterator[Context]:
    """An initialised rclpy context on a random domain (101-200), discovery on this host only.

    Both variables: Humble's rcl reads ROS_LOCALHOST_ONLY, Iron and later the discovery range.
    A domain where another process's nodes already are (another test run on this host drew the
    same number: its planner took this module's commands) is left for another one.
    """
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
        mp.setenv("ROS_LOCALHOST_ONLY", "1")
        for attempt in range(DOMAIN_TRIES):
            context = Context()
            rclpy.init(context=context, domain_id=random.randint(101, 200))
            if attempt == DOMAIN_TRIES - 1 or not _others_on(context):
                break
            context.try_shutdown()
        try:
            yield context
        finally:
            context.try_shutdown()
