"""Drive a planner run from a live command source: the loop in its own thread, commands pushed in.

Pure Python (no rclpy): the planner node hands it command texts from its subscription and gets
plan envelopes and cycle records back through callbacks; everything else (engine worker, cycle
log, manifest, summary) is :class:`~robot_latency.planner.lifecycle.PlannerRun`'s.

Threads: the loop runs in one thread with the real clock (its waits are ``time.sleep`` against
absolute scheduled times), pinned and prioritised by the run's CPU budget; the caller's thread
(rclpy's executor) only calls :meth:`submit`, which stamps the arrival and puts the command
in the bounded mailbox.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from robot_latency.planner.lifecycle import PlannerRun, RunError
from robot_latency.planner.loop import Runner
from robot_latency.planner.mailbox import InboundCommand
from robot_latency.planner.resolve import ResolvedRun
from robot_latency.records import CycleRecord

log = logging.getLogger(__name__)

class FrameSource(Protocol):
    """Where a run's cycles get the newest camera frame (the node's camera)."""

    def source_for(self, loop_clock: Callable[[], int]) -> Callable[[], tuple[int, int] | None]:
        """The loop's frame source for a run on ``loop_clock``."""
        ...


#: How often an idle event-mode loop checks whether it should stop (s).
_IDLE_POLL_S = 0.05


class PlannerDriver:
    """A planner run fed by a live source (a context manager).

    Args:
        config: the run's configuration (the loop's mode decides periodic or event timing).
        publish_plan: called with each cycle's plan envelope (from the loop thread).
        on_record: called with each cycle's record after it is in the cycle log.
        max_cycles: stop after this many cycles (event mode: commands); 0: until :meth:`stop`.
        id_prefix: command ids are ``f"{id_prefix}{n}"``, n counting from 0.
        runner: an engine runner already loaded (kept running when the run closes); None:
            the run starts its own and stops it at close.
        warm: run the warm-up generation in the loop's thread before the first cycle.
        frames: the node's camera (:class:`robot_latency.ros.camera.CameraInput`); None: text
            only.

    Raises:
        RunError: the run cannot start (log directory, model, engine).
    """

    def __init__(self, config: ResolvedRun, *, publish_plan: Callable[[dict[str, Any]], None],
                 on_record: Callable[[CycleRecord], None] | None = None, max_cycles: int = 0,
                 id_prefix: str = "cmd-", runner: Runner | None = None,
                 warm: bool = True, frames: FrameSource | None = None) -> None:
        self.max_cycles = max_cycles
        self.warm = warm
        self.id_prefix = id_prefix
        self.run = PlannerRun(config, publish=publish_plan, on_record=on_record, runner=runner)
        self.loop = self.run.loop
        if frames is not None:  # each cycle plans with the camera's newest frame at its start
            self.loop.frame_source = frames.source_for(self.run.clock)
        self._ids = itertools.count()
        self._ids_lock = threading.Lock()
        self._stop = threading.Event()
        self._arrived = threading.Event()
        self.finished = threading.Event()  # the loop thread has ended (stopped, done or failed)
        self._budget_applied = threading.Event()
        self.error: BaseException | None = None
        self._thread: threading.Thread | None = None

    # --- input ---------------------------------------------------------------------------------
    def submit(self, text: str, command_id: str | None = None, *,
               sent_ns: int | None = None, state: str | None = None,
               deadline_ns: int | None = None) -> InboundCommand:
        """Stamp a command's arrival now (the loop's clock) and hand it to the loop.

        ``command_id``: the sender's id for it (a tagged command); None: the next own id.
        ``sent_ns``: when the sender sent it, on the loop's clock (a stamped tagged command);
        a stamp after the arrival is not believed (dropped). A stamp older than the deadline is
        kept: the command is already late at its receiver, and its cycle says so (answered at
        once by the fallback, recorded as missed) instead of granting it a fresh budget.
        ``state``: robot state text sent with it (None: the loop's latest). ``deadline_ns``:
        the deadline its sender asked for (None: the loop's; never longer than the loop's).
        """
        arrival = self.run.clock()
        if command_id is None:
            with self._ids_lock:
                command_id = f"{self.id_prefix}{next(self._ids)}"
        if sent_ns is not None and sent_ns > arrival:
            sent_ns = None
        command = InboundCommand(command_id, text, arrival, sent_ns=sent_ns, state=state,
                                 deadline_ns=deadline_ns)
        self.loop.submit(command)
        self._arrived.set()
        return command

    # --- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        """Start the loop thread; return once its CPU budget (cores, priority) is in effect and
        the engine is warm (:attr:`warm`: one generation thrown away,
        :mod:`robot_latency.planner.warmup`), before its first cycle.

        Raises:
            RunError: the budget cannot be applied (the thread has ended; nothing ran).
        """
        if self._thread is not None:
            raise RuntimeError("the planner loop is already started")
        self._thread = threading.Thread(target=self._main, name="planner-loop", daemon=True)
        self._thread.start()
        self._budget_applied.wait()
        if isinstance(self.error, RunError):
            raise self.error

    def _main(self) -> None:
        try:
            self.run.enter_loop_thread()
        except RunError as err:
            self.error = err
            self.finished.set()
            self._budget_applied.set()
            return
        try:
            if self.warm:
                self.run.run_warm_up()
        except Exception:  # the engine's errors are each cycle's; this is a bug: say so, go on
            log.exception("warm-up generation failed")
        finally:
            self._budget_applied.set()
        try:
            if self.loop.config.mode == "event":
                if self.loop.config.on_new_command == "preempt":
                    self.loop.newer_command_waiting = lambda: len(self.loop.mailbox) > 0
                self.loop.run_events(self._events())
            else:
                n = self.max_cycles or 2**62
                self.loop.run_periodic(n, should_stop=self._stop.is_set)
        except BaseException as err:  # reported by the node, which then exits non-zero
            self.error = err
            log.exception("planner loop failed")
        finally:
            self.finished.set()

    def _events(self) -> Iterator[InboundCommand]:
        """Yield commands as they arrive (newest wins while the loop is busy) until stopped."""
        n = 0
        while not self._stop.is_set() and not (self.max_cycles and n >= self.max_cycles):
            self._arrived.wait(_IDLE_POLL_S)
            self._arrived.clear()
            waiting = self.loop.mailbox.take_all()
            if not waiting:
                continue
            # Newest wins; the others were superseded while the loop was busy: record them.
            for old in waiting[:-1]:
                self.loop.record_superseded(old)
            n += 1
            yield waiting[-1]

    def stop(self, timeout_s: float = 10.0) -> bool:
        """Ask the loop to stop after its current cycle; return whether it has stopped."""
        self._stop.set()
        self._arrived.set()
        if self._thread is None:
            return True
        self._thread.join(timeout_s)
        stopped = not self._thread.is_alive()
        if not stopped:
            log.error("planner loop did not stop within %.1f s", timeout_s)
        return stopped

    def close(self) -> dict[str, Any]:
        """Stop the loop, stop the engine, flush the log and write summary.json; return it."""
        self.stop()
        return self.run.close()

    def engine_state(self) -> dict[str, Any]:
        """Return what diagnostics report about the engine (name, restarts, load error)."""
        runner = self.run.runner
        health = runner.health()
        return {"engine": self.run.config.engine, "restarts": runner.restarts,
                "load_error": health.load_error or "", "worker_pid": runner.pid or "",
                "server_check_error": health.server_check_error or ""}

    def __enter__(self) -> PlannerDriver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
