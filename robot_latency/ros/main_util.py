"""What the node executables' ``main()`` share: rclpy start and shutdown, signals, spinning.

A signal only asks the executable to stop (it sets an event that the spin loops watch), so the
executable leaves in order: it finishes its work (closes the run, flushes its log), destroys its
node, and only then is rclpy shut down. rclpy's own handler would shut the context down at once,
under any thread still using it.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator

import rclpy
from rclpy.executors import Executor
from rclpy.signals import SignalHandlerOptions

#: The console format of the node executables' Python logging.
LOG_FORMAT = "[%(levelname)s] [%(name)s]: %(message)s"

#: The signals that stop a node executable.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def ros_main(argv: list[str] | None, log: logging.Logger) -> Iterator[threading.Event]:
    """Run the body of a node executable's ``main()`` between rclpy start-up and shutdown.

    On entry: Python logging to the console at INFO, ``rclpy.init`` with ``argv`` (``sys.argv``
    when None) and rclpy's signal handlers off, and handlers of our own for SIGINT and SIGTERM
    that log the signal on ``log`` and set the yielded event. On exit, however the body ends
    (return, exception): ``rclpy.try_shutdown()`` and the previous signal handlers back. The
    body destroys its own nodes (in a ``finally``) before it leaves.

    Args:
        argv: the command line (with ``--ros-args``); None: ``sys.argv``.
        log: the executable's logger, for the line a signal writes.

    Yields:
        The stop event: set once SIGINT or SIGTERM has arrived.

    Example::

        with ros_main(argv, log) as stop:
            ...
            spin_until(executor, stop, done=work_finished)
    """
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    rclpy.init(args=sys.argv if argv is None else argv,
               signal_handler_options=SignalHandlerOptions.NO)
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("signal %s: stopping", signal.Signals(signum).name)
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in STOP_SIGNALS}
    try:
        yield stop
    finally:
        rclpy.try_shutdown()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def spin_until(executor: Executor, stop: threading.Event, *,
               done: Callable[[], bool] | None = None, deadline_s: float | None = None,
               period_s: float = 0.05) -> bool:
    """Spin ``executor`` until ``done()`` is true, ``stop`` is set or ``deadline_s`` passes.

    Args:
        executor: the executor to spin (one ``spin_once`` at a time, in the calling thread).
        stop: the stop event (see :func:`ros_main`).
        done: the condition waited for; None: none (spin until stopped or the deadline).
        deadline_s: give up at this ``time.monotonic()`` time; None: never.
        period_s: the longest one ``spin_once`` waits for work, so how soon a set ``stop`` or a
            true ``done()`` is seen.

    Returns:
        Whether ``done()`` became true (False: stopped or out of time).
    """
    while not stop.is_set():
        if done is not None and done():
            return True
        if deadline_s is not None and time.monotonic() >= deadline_s:
            return False
        executor.spin_once(timeout_sec=period_s)
    return False
