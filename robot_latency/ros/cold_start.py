"""A planner node's cold start: from its process's start to its first plan in time, as events.

Each start-up step is an event stamped on the loop's clock (``time.perf_counter_ns``:
CLOCK_MONOTONIC on Linux, one clock for every process on the host, so a client can place its own
send and receive times among them):

    process_start        the process started (/proc/self/stat; one clock tick's resolution)
    node_created         the node exists (the interpreter started, rclpy and the package loaded)
    model_load_started   the engine starts loading (the managed node: at configure; the plain
    model_loaded         node: as its run opens); the fixed prefix evaluated
    configured           the parameters read, the topics, the action server and the probe made
    run_open_started     the run opens (robot_latency.planner.lifecycle.PlannerRun): its
    prediction_ready     directory, the target prediction (its calibration), the engine unless
    run_opened           one was handed in, the cycle log, the manifest
    calibration_started  the managed node readies the target calibration at the end of its
    calibration_ready    configure step (its run, opening at activate, finds it in memory)
    warm_up_started      the warm-up generation (robot_latency.planner.warmup), in the loop's
    warm_up_ended        thread, its CPU budget in effect
    action_warm_up_started  the node's own PlanCommand goal (robot_latency.ros.action_warmup)
    action_warm_up_ended    its result back: the action's paths warm
    margin_measured      the loopback pings back (the transport margin measured); absent when
                         the margin is fixed
    ready                ``planner/ready`` true (robot_latency.ros.readiness)
    first_plan           the first plan published (its record's ``published_ns``)
    first_plan_in_time   the first plan the model made by its deadline

The target calibration comes from the calibration cache where it holds one for the same inputs
(robot_latency.floor.calstore): the record's ``calibration_cache`` says how this process had it
(``outcome``: ``hit``, ``miss``, ``stale`` or ``corrupt``; ``written``: the entry was written).

The plain node is configured before its run opens and its model loads there; the managed node loads
its model in its configure step, so ``model_loaded`` comes before ``configured`` there.
:data:`AFTER` holds the order both keep. The record covers the process's first run only (a managed
node's later activations start warm): ``cold_start.json`` in its run directory, rewritten as events
arrive, and ``cold_start`` in the run's manifest and summary. Two log lines say it in words, at
ready and at the first plan in time.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from robot_latency.records import CycleRecord

log = logging.getLogger(__name__)

#: The record's file in the run directory.
COLD_START_NAME = "cold_start.json"

#: Each event comes after these, on both nodes (where both are recorded).
AFTER: dict[str, tuple[str, ...]] = {
    "node_created": ("process_start",),
    "model_load_started": ("node_created",),
    "model_loaded": ("model_load_started",),
    "configured": ("node_created",),
    "run_open_started": ("configured", "calibration_ready"),
    "prediction_ready": ("run_open_started",),
    "calibration_started": ("model_loaded", "configured"),
    "calibration_ready": ("calibration_started",),
    "run_opened": ("prediction_ready", "model_loaded"),
    "warm_up_started": ("model_loaded", "configured", "run_opened"),
    "warm_up_ended": ("warm_up_started",),
    "margin_measured": ("configured",),
    "action_warm_up_started": ("configured", "warm_up_ended"),
    "action_warm_up_ended": ("action_warm_up_started",),
    "ready": ("warm_up_ended", "margin_measured", "configured", "action_warm_up_ended"),
    "first_plan_in_time": ("model_loaded", "warm_up_ended"),
}


def out_of_order(events_ns: dict[str, int]) -> list[str]:
    """Return each ``later < earlier`` pair of :data:`AFTER` the events break (empty: ordered)."""
    return [f"{later} < {earlier}" for later, earliers in AFTER.items() if later in events_ns
            for earlier in earliers
            if earlier in events_ns and events_ns[later] < events_ns[earlier]]


def clock_tick_ms() -> float:
    """The resolution of ``process_start`` (ms): one kernel clock tick."""
    return 1000.0 / os.sysconf("SC_CLK_TCK")


def process_start_ns(clock: Callable[[], int] = time.perf_counter_ns) -> int | None:
    """When this process started, on ``clock`` (CLOCK_MONOTONIC), from /proc/self/stat's
    ``starttime`` (clock ticks since boot, CLOCK_BOOTTIME); None where there is no /proc."""
    try:
        stat = Path("/proc/self/stat").read_text()
        ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22; fields 1-2 before ")"
        boot_now_ns = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
        now_ns = clock()
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return now_ns - (boot_now_ns - ticks * 1_000_000_000 // os.sysconf("SC_CLK_TCK"))


def _plan(rec: CycleRecord) -> dict[str, Any]:
    return {"cycle": rec.cycle, "command_id": rec.command_id, "source": rec.plan_source,
            "deadline_met": rec.deadline_met, "deadline_ms": rec.deadline_budget_ns / 1e6,
            # scheduled: the command's send where it was stamped, else its arrival
            "sent_stamped": rec.command_sent_ns is not None,
            "latency_ms": None if rec.cycle_ns is None else rec.cycle_ns / 1e6}


class ColdStart:
    """A planner node's start-up events (see the module docstring), made with the node.

    Args:
        clock: the loop's clock (ns).
    """

    def __init__(self, clock: Callable[[], int] = time.perf_counter_ns) -> None:
        self.clock = clock
        self.events_ns: dict[str, int] = {}
        start = process_start_ns(clock)
        if start is not None:
            self.events_ns["process_start"] = start
        self.mark("node_created")
        self.first_plan: dict[str, Any] | None = None
        self.first_plan_in_time: dict[str, Any] | None = None
        self.run: Any = None  # the PlannerRun the record belongs to (the node's first)
        self.finished = False  # the first plan in time is in
        #: how the target calibration was had (robot_latency.floor.calstore's to_dict)
        self.calibration_cache: dict[str, Any] | None = None
        #: the action's warm-up goal: status, feedback phases, elapsed_ms
        self.action_warm_up: dict[str, Any] | None = None

    @contextmanager
    def calibration(self) -> Iterator[None]:
        """Stamp ``calibration_started`` and ``calibration_ready`` around the managed node's
        target calibration at configure."""
        self.mark("calibration_started")
        yield
        self.mark("calibration_ready")

    def mark(self, event: str) -> None:
        """Stamp ``event`` now, the first time only (a later configure or run keeps it)."""
        self.events_ns.setdefault(event, self.clock())

    @contextmanager
    def model_load(self) -> Iterator[None]:
        """Stamp ``model_load_started`` and ``model_loaded`` around the managed node's engine
        load at configure (the plain node's run loads its own: its opening's events)."""
        self.mark("model_load_started")
        yield
        self.mark("model_loaded")

    def _mine(self, run: Any) -> bool:
        if self.run is None:
            self.run = run
        return run is self.run and not self.finished

    def ready(self, run: Any, *, pings_ended_ns: int | None,
              action_warm_up: dict[str, Any] | None = None) -> None:
        """The node said it is ready with ``run`` (a PlannerRun) open; ``action_warm_up``: the
        action's warm-up goal (robot_latency.ros.action_warmup's ``result``)."""
        if not self._mine(run) or "ready" in self.events_ns:
            return
        for event, at_ns in getattr(run, "open_events_ns", {}).items():
            self.events_ns.setdefault(event, at_ns)  # a model loaded at configure stays
        warm = run.warm_up or {}
        for event, key in (("warm_up_started", "started_ns"), ("warm_up_ended", "ended_ns")):
            if isinstance(warm.get(key), int):
                self.events_ns[event] = warm[key]
        if pings_ended_ns is not None:
            self.events_ns["margin_measured"] = pings_ended_ns
        for event, key in (("action_warm_up_started", "started_ns"),
                           ("action_warm_up_ended", "ended_ns")):
            if isinstance((action_warm_up or {}).get(key), int):
                self.events_ns[event] = (action_warm_up or {})[key]
        self.action_warm_up = action_warm_up and {
            k: v for k, v in action_warm_up.items() if k in ("status", "feedback", "elapsed_ms")}
        self.calibration_cache = getattr(run, "calibration_cache", None) or self.calibration_cache
        self.mark("ready")
        self._write()
        phases = self.phases_ms()
        words = [f"{label} {phases[key]:.0f} ms" for key, label in (
            ("process_start_to_node_ms", "to the node"), ("model_load_ms", "model load"),
            ("calibration_ms", "target calibration"),
            ("run_open_ms", "run open"), ("prediction_ms", "of it the target prediction"),
            ("warm_up_ms", "warm-up"), ("action_warm_up_ms", "of it the action's warm-up goal"),
            ("warm_up_ended_to_ready_ms", "then to ready"))
            if phases.get(key) is not None]
        cache = (self.calibration_cache or {}).get("outcome", "none")
        log.info("cold start: ready %s after the process started (%s; calibration cache: %s)",
                 _ms(phases.get("process_start_to_ready_ms")), ", ".join(words), cache)

    def plan_recorded(self, rec: CycleRecord, run: Any) -> None:
        """A cycle of ``run`` was recorded: note the first plan and the first plan in time."""
        if rec.published_ns is None or not self._mine(run):
            return
        if self.first_plan is None:
            self.first_plan = _plan(rec)
            self.events_ns["first_plan"] = rec.published_ns
        if rec.deadline_met and rec.plan_source == "model":
            self.first_plan_in_time = _plan(rec)
            self.events_ns["first_plan_in_time"] = rec.published_ns
            self.finished = True
            phases = self.phases_ms()
            log.info("cold start: first plan in time %s after the process started, %s after "
                     "ready (cycle %d, %.1f ms of its %.0f ms deadline)",
                     _ms(phases.get("process_start_to_first_plan_in_time_ms")),
                     _ms(phases.get("ready_to_first_plan_in_time_ms")), rec.cycle,
                     self.first_plan_in_time["latency_ms"], self.first_plan_in_time["deadline_ms"])
        self._write()

    def _between(self, first: str, then: str) -> float | None:
        a, b = self.events_ns.get(first), self.events_ns.get(then)
        return None if a is None or b is None else (b - a) / 1e6

    def phases_ms(self) -> dict[str, float | None]:
        """The start-up's phases (ms), each between two events (None: one is missing)."""
        return {"process_start_to_node_ms": self._between("process_start", "node_created"),
                "model_load_ms": self._between("model_load_started", "model_loaded"),
                "calibration_ms": self._between("calibration_started", "calibration_ready"),
                "prediction_ms": self._between("run_open_started", "prediction_ready"),
                "run_open_ms": self._between("run_open_started", "run_opened"),
                "warm_up_ms": self._between("warm_up_started", "warm_up_ended"),
                "action_warm_up_ms": self._between("action_warm_up_started",
                                                   "action_warm_up_ended"),
                # the loopback pings run while the executor spins: after configure (the
                # managed node) or after the warm-up (the plain node); ready waits for the rest
                "warm_up_ended_to_ready_ms": self._between("warm_up_ended", "ready"),
                "process_start_to_ready_ms": self._between("process_start", "ready"),
                "ready_to_first_plan_in_time_ms": self._between("ready", "first_plan_in_time"),
                "process_start_to_first_plan_in_time_ms": self._between(
                    "process_start", "first_plan_in_time")}

    def to_dict(self) -> dict[str, Any]:
        """The record: events in time order (ns, the loop's clock), phases, the first plans."""
        start = self.events_ns.get("process_start")
        events = dict(sorted(self.events_ns.items(), key=lambda kv: kv[1]))
        return {"clock": "CLOCK_MONOTONIC ns (the loop's)", "events_ns": events,
                "since_process_start_ms": None if start is None else
                {k: (v - start) / 1e6 for k, v in events.items()},
                "process_start_resolution_ms": clock_tick_ms(),
                "phases_ms": self.phases_ms(), "calibration_cache": self.calibration_cache,
                "action_warm_up": self.action_warm_up,
                "first_plan": self.first_plan,
                "first_plan_in_time": self.first_plan_in_time}

    def _write(self) -> None:
        run = self.run
        run.cold_start = record = self.to_dict()
        path = Path(run.log_dir) / COLD_START_NAME
        tmp = path.with_name(path.name + ".tmp")
        try:
            tmp.write_text(json.dumps(record, indent=2) + "\n")
            os.replace(tmp, path)
        except OSError as err:  # the record never stops the node
            log.warning("could not write %s: %s", path, err)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} ms"
