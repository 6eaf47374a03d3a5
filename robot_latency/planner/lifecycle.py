"""A planner run's lifecycle: open the run directory, start the runner and the loop, enrich and
write each cycle's record, keep the manifest, and close with the summary.

Both front ends use it: the ``robot-latency run`` command (offline replay) and the ROS 2 node.
A run directory holds::

    cycles.jsonl    one CycleRecord per cycle, flushed as it is written
    manifest.json   versions, config, engine, model (sha256), devices, host facts
    summary.json    written at close from what cycles.jsonl holds (so the two always agree)
    run.mcap        the commands, plans, per-cycle figures, misses, fallbacks and log lines for
                    Foxglove and PlotJuggler (robot_latency.planner.mcap_log), written after
                    cycles.jsonl: a failure there never stops the run
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from robot_latency.clock import DEFAULT_CLOCK, Clock
from robot_latency.digest import sha256_file
from robot_latency.floor.devices import get_device
from robot_latency.floor.errors import FloorError
from robot_latency.floor.modelinfo import resolve_model
from robot_latency.floor.run_predictor import FloorPredictor
from robot_latency.floor.steps import step_predictor
from robot_latency.floor.target import resolve_calibration_noted
from robot_latency.hostfacts import host_facts, host_steal_s, package_versions
from robot_latency.planner.budget import (
    LOOP_PROCESS,
    BudgetError,
    ThreadSettings,
    apply_to_loop_thread,
    capture_thread,
    loop_thread_state,
    restore_thread,
)
from robot_latency.planner.loop import PlannerLoop, Publisher, Runner
from robot_latency.planner.mcap_log import MCAP_NAME, RunMcap
from robot_latency.planner.resolve import ResolvedRun
from robot_latency.planner.runner_factory import RunError, close_runner, make_runner
from robot_latency.planner.warmup import WarmUp, warm_up
from robot_latency.profiles.labels import Label, LabelSet
from robot_latency.records import CycleRecord, JsonlSink, RecordError, read_records
from robot_latency.rosenv import ros_facts
from robot_latency.stats import summarize, write_summary

log = logging.getLogger(__name__)

__all__ = ["PlannerRun", "RunError", "prepare_target_calibration"]


#: The interpreter's thread switch interval while the loop runs (Python's default: 5 ms). A loop
#: thread that wakes while another thread of its process holds the GIL (a server client's event
#: loop, an rclpy executor, a pipe reader) waits up to this long before it runs: the default is
#: longer than the 2 ms publish margin. (It did not by itself end the late hybrid cycles on a
#: one-core robot: docs/BENCHMARKS.md, "Onboard, offboard or both".)
LOOP_SWITCH_INTERVAL_S = 0.0005


def _engine_family(cfg: ResolvedRun) -> str:
    return str(cfg.settings.engine_family or cfg.engine_options.get("engine_family")
               or "llamacpp-cuda")


def prepare_target_calibration(cfg: ResolvedRun) -> dict[str, Any] | None:
    """Have the target calibration a run of ``cfg`` opens with ready in this process (from the
    calibration cache, else computed and cached): a managed node does it at configure, so its
    activation finds it in memory. Returns how it was had (None: no model, a calibration file,
    or it cannot be had: the run says why as it opens)."""
    if cfg.model is None:
        return None
    try:
        _, cached = resolve_calibration_noted(_engine_family(cfg), get_device(cfg.target_device),
                                              calibration=cfg.settings.calibration)
    except FloorError:
        return None
    return None if cached is None else cached.to_dict()


class PlannerRun:
    """A planner run writing to a run directory (a context manager).

    Raises:
        RunError: at start-up, for a log directory that cannot be written, a model or device
            that cannot be read, or an engine that cannot load.
    """

    def __init__(self, config: ResolvedRun, *, publish: Publisher, clock: Clock = DEFAULT_CLOCK,
                 sleep_until: Callable[[int], None] | None = None,
                 on_record: Callable[[CycleRecord], None] | None = None,
                 runner: Runner | None = None, labels: LabelSet | None = None) -> None:
        opening_ns = DEFAULT_CLOCK()
        self.config = config
        self.on_record = on_record
        self.labels = labels  # the commands' labels: each record's plan is judged against them
        self.clock = clock
        self.log_dir = Path(config.log_dir)
        self._check_log_dir()
        self.planning = config.planning
        #: how the target calibration was had (robot_latency.floor.calstore); None: not from
        #: the published table
        self.calibration_cache: dict[str, Any] | None = None
        self.floor = self._make_floor()
        floor_ns = DEFAULT_CLOCK()
        # A runner handed in (a managed node's, loaded at configure) outlives this run.
        self.owns_runner = runner is None
        self.runner = make_runner(config, clock) if runner is None else runner
        #: the opening's steps (ns, on DEFAULT_CLOCK, whatever clock the loop has): a planner
        #: node's cold-start record shows them (the target prediction's calibration, the model)
        self.open_events_ns = {"run_open_started": opening_ns, "prediction_ready": floor_ns}
        if self.owns_runner:
            self.open_events_ns.update(model_load_started=floor_ns,
                                       model_loaded=DEFAULT_CLOCK())
        self.sink = JsonlSink(self.log_dir / "cycles.jsonl", fsync=config.settings.fsync)
        self.loop_thread: dict[str, Any] = loop_thread_state()
        self._thread_before: ThreadSettings | None = None
        self._holds_process = False
        self._steal_s = host_steal_s()
        self._proc = psutil.Process()
        self._proc.cpu_percent(None)  # prime: the first call has no interval to measure
        self.telemetry = self._make_telemetry()
        self.energy = self._make_energy_meter(clock)
        self._energy_end_ns: int | None = None
        self.loop = PlannerLoop(config.settings, self.runner, publish=publish, sink=self._write,
                                clock=clock, sleep_until=sleep_until, planning=self.planning,
                                run_id=self.log_dir.name + "-" + str(os.getpid()))
        self.mcap = RunMcap(self.log_dir / MCAP_NAME, clock=clock, run_id=self.loop.run_id)
        self.loop.mailbox.on_put = self.mcap.command
        self.started_wall = time.time()
        self.closed = False
        #: what the warm-up generation took (:meth:`run_warm_up`); None: none ran
        self.warm_up: dict[str, Any] | None = None
        #: a planner node's start-up, process start to its first plan in time (written by the
        #: node: robot_latency.ros.cold_start); None: not a node's first run
        self.cold_start: dict[str, Any] | None = None
        self._write_manifest(status="running")
        self.open_events_ns["run_opened"] = DEFAULT_CLOCK()
        self.mcap.log_line(f"run {self.loop.run_id} started: engine {config.engine}, "
                           f"log directory {self.log_dir}")

    # --- set-up ------------------------------------------------------------------------------
    def _check_log_dir(self) -> None:
        try:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            probe = self.log_dir / ".write-test"
            probe.write_text("")
            probe.unlink()
        except OSError as err:
            raise RunError(f"log directory {self.log_dir} is not writable: "
                           f"{err.strerror or err}") from err
        if (self.log_dir / "cycles.jsonl").exists():
            raise RunError(f"log directory {self.log_dir} already holds a run "
                           "(cycles.jsonl); choose a new directory")

    def _make_floor(self) -> FloorPredictor | None:
        cfg = self.config
        if cfg.model is None:
            return None
        try:
            model = resolve_model(cfg.model, quant=cfg.quant)
            target = get_device(cfg.target_device)
            host = get_device(cfg.host_device)
        except FloorError as err:
            raise RunError(f"floor model: {err}") from err
        family = _engine_family(cfg)
        try:
            cal, cached = resolve_calibration_noted(family, target,
                                                    calibration=cfg.settings.calibration)
            self.calibration_cache = None if cached is None else cached.to_dict()
        except FloorError as err:
            if cfg.settings.calibration or cfg.settings.engine_family:
                raise RunError(f"target prediction: {err}") from err
            log.warning("no calibrated prediction for %s on %s: %s", family, target.id, err)
            return FloorPredictor(model, host, target, calibration_error=str(err))
        from robot_latency.planner.target_inputs import model_preset

        # the records' target answer takes predict's corrections (robot_latency.floor.steps)
        steps = step_predictor(model, target, cal, spec=cfg.model,
                               model_id=model_preset(cfg.model))
        return FloorPredictor(model, host, target, calibration=cal, steps=steps)

    def enter_loop_thread(self) -> dict[str, Any]:
        """Apply the CPU budget to the calling thread, the one about to run the loop, freeze
        the start-up heap (no full garbage collection scans it during the run) and shorten the
        interpreter's switch interval (:data:`LOOP_SWITCH_INTERVAL_S`). Both belong to the
        process: they are held until its last running loop closes
        (:class:`~robot_latency.planner.budget.LoopProcessHold`).

        Returns what is in effect (also recorded in the manifest).

        Raises:
            RunError: the budget cannot be applied (the message says which field and why).
        """
        self._thread_before = capture_thread()
        try:
            self.loop_thread = apply_to_loop_thread(self.config.cpu)
        except BudgetError as err:
            raise RunError(f"cpu budget: {err}") from err
        self.loop_thread.update(LOOP_PROCESS.enter(LOOP_SWITCH_INTERVAL_S))
        self._holds_process = True
        self._write_manifest(status="running")
        log.info("planner loop thread: %s", self.loop_thread)
        return self.loop_thread

    def run_warm_up(self) -> WarmUp:
        """Run the warm-up generation (:mod:`robot_latency.planner.warmup`) in the calling
        thread, the loop's, before its first cycle; kept in the manifest and the summary."""
        result = warm_up(self.loop)
        self.warm_up = result.to_dict()
        self._write_manifest(status="running")
        return result

    @staticmethod
    def _make_telemetry() -> Any:
        try:
            from robot_latency.telemetry import telemetry_reader
        except ImportError:
            return None
        return telemetry_reader()

    def _make_energy_meter(self, clock: Clock) -> Any:
        """The input-power meter on a Jetson (robot_latency.telemetry.energy), else None."""
        if self.telemetry is None:
            return None
        from robot_latency.telemetry.energy import EnergyMeter, find_power_input

        inp = find_power_input(Path("/"))
        return None if inp is None else EnergyMeter(inp, clock=clock).start()

    def _measure_energy(self, rec: CycleRecord) -> None:
        from robot_latency.telemetry.energy import cycle_energy

        if self.energy is not None and rec.published_ns is not None:
            self.energy.sample()  # a reading past the publish closes the window
        fields = cycle_energy(self.energy, rec, self._energy_end_ns)
        rec.energy_mj = fields["energy_mj"]
        rec.energy_phases_mj = fields["energy_phases_mj"]
        rec.energy_source = fields["energy_source"]
        if rec.published_ns is not None:
            self._energy_end_ns = rec.published_ns

    # --- per cycle ---------------------------------------------------------------------------
    def _write(self, rec: CycleRecord) -> None:
        """Enrich a record (correctness, floor, CPU, RSS, telemetry) after its plan is out, then
        log it."""
        label = None if self.labels is None else self.labels.lookup(rec.command_id)
        if label is not None:
            rec.label_kind = label.kind
            rec.plan_correct = label.judge(rec.plan) if rec.plan_source != "none" else None
            if rec.plan_source == "fallback":
                rec.fallback_correct = self._fallbacks_judged(label, rec)
        if self.floor is not None:
            rec.floor = self.floor.predict(rec.tokens_in)
            try:
                self.floor.target_answer(rec, max_tokens=self.loop.max_tokens)
            except FloorError as err:  # a prediction never stops the run
                log.warning("cycle %d: no target prediction: %s", rec.cycle, err)
        rec.cpu_percent = self._proc.cpu_percent(None)
        rss = self._proc.memory_info().rss
        pid = self.runner.pid
        if pid is not None:
            try:
                rss += psutil.Process(pid).memory_info().rss
            except psutil.Error:
                pass  # the worker just died; the runner restarts it
        rec.rss_bytes = rss
        steal_s = host_steal_s()
        if steal_s is not None and self._steal_s is not None:
            rec.host_steal_ns = max(0, round((steal_s - self._steal_s) * 1e9))
        self._steal_s = steal_s
        if self.telemetry is not None:
            t = self.telemetry.read()
            rec.telemetry = t.to_dict() if t is not None else None
        self._measure_energy(rec)
        self.sink.write(rec)
        self.mcap.cycle(rec)  # after cycles.jsonl; never raises
        if self.on_record is not None:
            # After the record is on disk; a failing consumer never reaches the loop.
            try:
                self.on_record(rec)
            except Exception as err:
                log.error("cycle %d: record consumer failed: %r", rec.cycle, err)

    def _fallbacks_judged(self, label: Label, rec: CycleRecord) -> dict[str, bool]:
        """Judge what ``rule`` and ``hold`` would each have published for this command."""
        assert self.labels is not None
        text = self.labels.text_of(rec.command_id)
        chain = self.loop.fallback
        rule = self.planning.rule(text) if (self.planning.rule and text) else None
        return {"rule": bool(label.judge(rule or chain.stop_plan)),
                "hold": bool(label.judge(chain.wait_plan))}

    # --- manifest, summary, close ------------------------------------------------------------
    def manifest(self, status: str) -> dict[str, Any]:
        """Return the manifest: what ran, where, with what."""
        cfg = self.config
        model: dict[str, Any] | None = None
        if self.floor is not None:
            model = self.floor.model.to_dict()
            if model.get("path"):
                model["sha256"] = sha256_file(model["path"])
        return {
            "status": status,
            "label": cfg.label,
            "engine": cfg.engine,
            "engine_options": cfg.engine_options,
            "engine_info": self.runner.info(),
            "runner": cfg.runner,
            "model": model,
            "device": {"host": cfg.host_device, "target": cfg.target_device},
            "floor": self.floor.manifest() if self.floor is not None else None,
            "config": cfg.settings.loop_config(),
            # fixed, or learned from the loop's lateness (the value now: at the end, the last)
            "publish_margin": self.loop.publish_margin.summary(),
            "profile": self.planning.describe(),
            "cpu_budget": {**cfg.cpu.to_dict(), **self.loop_thread,
                           "engine_cpus_in_effect": self.runner.worker_cpus},
            "versions": package_versions(),
            "ros": ros_facts().to_dict(),
            "host": host_facts(),
            "started_unix": self.started_wall,
            "warm_up": self.warm_up,
            "cold_start": self.cold_start,
            "calibration_cache": self.calibration_cache,
            **cfg.settings.extra,
        }

    def _write_manifest(self, status: str) -> dict[str, Any]:
        path = self.log_dir / "manifest.json"
        tmp = path.with_name(path.name + ".tmp")
        manifest = self.manifest(status)
        tmp.write_text(json.dumps(manifest, indent=2, default=str) + "\n")
        os.replace(tmp, path)
        return manifest

    def close(self) -> dict[str, Any]:
        """Stop the engine, flush the log, write summary.json from it; return the summary."""
        if self.closed:
            return json.loads((self.log_dir / "summary.json").read_text())
        self.closed = True
        if self._holds_process:  # the last loop of the process to end unfreezes the heap
            LOOP_PROCESS.leave()
            self._holds_process = False
        if self._thread_before is not None:
            restore_thread(self._thread_before)  # a sweep's next run starts unpinned
        self.sink.close()
        if self.energy is not None:
            self.energy.close()
        if self.owns_runner:
            close_runner(self.runner)
        try:
            records = read_records(self.log_dir / "cycles.jsonl")
        except RecordError as err:
            log.error("summary: %s", err)
            records = []
        summary = summarize(records)
        summary["mailbox"] = self.loop.mailbox.counters()
        summary["engine_restarts"] = self.runner.restarts
        summary["records_not_written"] = self.loop.sink_errors
        summary["transport_margin"] = self.loop.transport.summary()
        summary["publish_margin"] = self.loop.publish_margin.summary()
        summary["warm_up"] = self.warm_up
        summary["cold_start"] = self.cold_start
        write_summary(summary, self.log_dir / "summary.json")
        manifest = self._write_manifest(status="finished")
        self.mcap.log_line(f"run {self.loop.run_id} finished: {summary['cycles']} cycles, "
                           f"{summary['deadline_misses']} deadline misses")
        self.mcap.close(manifest=manifest, summary=summary)
        return summary

    def __enter__(self) -> PlannerRun:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
