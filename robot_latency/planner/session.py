"""One planner run, assembled: runner, loop, cycle log, floor predictions, manifest and summary.

Both front ends use it: the ``robot-latency run`` command (offline replay) and the ROS 2 node.
A run directory holds::

    cycles.jsonl    one CycleRecord per cycle, flushed as it is written
    manifest.json   versions, config, engine, model (sha256), devices, host facts
    summary.json    written at close from what cycles.jsonl holds (so the two always agree)
"""

from __future__ import annotations

import dataclasses
import gc
import json
import logging
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from robot_latency import __version__
from robot_latency.clock import DEFAULT_CLOCK, Clock
from robot_latency.digest import sha256_file
from robot_latency.engines.base import EngineError
from robot_latency.errors import RobotLatencyError
from robot_latency.floor.calibration import Calibration
from robot_latency.floor.devices import HardwareProfile, get_device
from robot_latency.floor.errors import FloorError
from robot_latency.floor.modelinfo import ModelProfile, resolve_model
from robot_latency.floor.predict import predict_floor
from robot_latency.floor.target import predict_target, resolve_calibration
from robot_latency.planner.budget import (
    BudgetError,
    ThreadSettings,
    apply_to_loop_thread,
    capture_thread,
    freeze_heap,
    loop_thread_state,
    restore_thread,
)
from robot_latency.planner.engine import create_planner_engine
from robot_latency.planner.loop import InlineRunner, PlannerLoop, Publisher, Runner
from robot_latency.planner.resolve import ResolvedRun
from robot_latency.planner.worker import ProcessRunner
from robot_latency.records import CycleRecord, JsonlSink, RecordError, read_records
from robot_latency.rosenv import ros_facts
from robot_latency.stats import summarize, write_summary

log = logging.getLogger(__name__)

class RunError(RobotLatencyError):
    """A run that cannot start (bad log directory, model, engine); the message names it."""


def _host_steal_s() -> float | None:
    """CPU time the hypervisor has taken from this machine, all CPUs (s); None: not known.

    Linux's ``steal`` counter (``/proc/stat``, 10 ms ticks); 0 on bare metal such as a Jetson.
    """
    try:
        return getattr(psutil.cpu_times(), "steal", None)
    except (OSError, psutil.Error):
        return None


def _package_versions() -> dict[str, str | None]:
    from importlib import metadata

    out: dict[str, str | None] = {"robot_latency": __version__}
    for name in ("llama-cpp-python", "onnxruntime-gpu", "onnxruntime", "numpy", "gguf",
                 "rosbags", "matplotlib", "onnx"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def host_facts() -> dict[str, Any]:
    """Return what the manifest records about the machine."""
    return {
        "hostname": platform.node(),
        "machine": platform.machine(),
        "system": platform.platform(),
        "python": sys.version.split()[0],
        "cpu_count": os.cpu_count(),
        "memory_bytes": psutil.virtual_memory().total,
    }


class FloorPredictor:
    """Per-cycle floor and target predictions for the host and the target (a few µs each).

    The target's entry carries, beside its floor, the calibrated prediction of the engine
    family (``itl_pred_ms``, ``ttft_pred_ms``, ``engine_family``, ``calibration``); None where
    no calibration could be had (the reason is in the manifest).
    """

    def __init__(self, model: ModelProfile, host: HardwareProfile,
                 target: HardwareProfile, *, calibration: Calibration | None = None,
                 calibration_error: str | None = None) -> None:
        self.model, self.host, self.target = model, host, target
        self.calibration, self.calibration_error = calibration, calibration_error
        self._cal_label = None if calibration is None else (
            f"{calibration.source}, {calibration.scope} scope, {len(calibration.basis)} points")

    def predict(self, tokens_in: int | None) -> dict[str, Any]:
        """Return {"host": {...}, "target": {...}} at this cycle's prompt length."""
        out: dict[str, Any] = {}
        for key, device in (("host", self.host), ("target", self.target)):
            ctx = tokens_in or 0
            p = predict_floor(self.model, device, context_tokens=ctx,
                              prompt_tokens=ctx if device.peak_flops and ctx else None)
            out[key] = {"device_id": device.id, "itl_floor_ms": p.itl_floor_ms,
                        "prefill_floor_ms": p.prefill_floor_ms}
        target = out["target"]
        target.update(itl_pred_ms=None, ttft_pred_ms=None, engine_family=None, calibration=None)
        if self.calibration is not None:
            t = predict_target(self.model, self.target, self.calibration,
                               context_tokens=tokens_in or 0, prompt_tokens=tokens_in or None)
            target.update(itl_pred_ms=t.itl_pred_ms, ttft_pred_ms=t.ttft_pred_ms,
                          engine_family=t.engine_family, calibration=self._cal_label)
        return out

    def target_answer(self, rec: CycleRecord, *, max_tokens: int | None = None) -> None:
        """Set the record's predicted end-to-end time on the target and whether it meets the
        deadline (the ``target_*`` fields of :class:`CycleRecord`); nothing without a
        calibration, a model token or a TTFT prediction."""
        if self.calibration is None or not rec.token_ns or rec.tokens_in is None:
            return
        t = predict_target(self.model, self.target, self.calibration,
                           context_tokens=rec.tokens_in, prompt_tokens=rec.tokens_in,
                           cached_prefix_tokens=rec.prefix_cache_tokens or 0)
        if t.ttft_pred_ms is None:
            return
        n = rec.tokens_out
        lo, hi = t.itl_pred_interval_ms
        e2e = t.ttft_pred_ms + (n - 1) * t.itl_pred_ms
        complete = rec.stop_reason in ("done", "complete")
        deadline_ms = rec.deadline_budget_ns / 1e6
        rec.target_e2e_pred_ms = e2e
        rec.target_e2e_pred_interval_ms = [t.ttft_pred_ms + (n - 1) * lo,
                                           t.ttft_pred_ms + (n - 1) * hi]
        rec.target_deadline_met_pred = (e2e <= deadline_ms if complete
                                        else (False if e2e > deadline_ms else None))
        rec.target_pred = {"ttft_ms": t.ttft_pred_ms, "itl_ms": t.itl_pred_ms,
                           "itl_interval_ms": [lo, hi], "tokens_out": n,
                           "basis": "complete" if complete else "partial",
                           "max_tokens": max_tokens, "device_id": self.target.id,
                           "engine_family": t.engine_family}

    def manifest(self) -> dict[str, Any]:
        """Return the weights-only floors and the target's calibrated prediction."""
        out: dict[str, Any] = {key: predict_floor(self.model, d).to_dict()
                               for key, d in (("host", self.host), ("target", self.target))}
        if self.calibration is not None:
            out["target_prediction"] = predict_target(
                self.model, self.target, self.calibration).to_dict()
        else:
            out["target_prediction"] = {"error": self.calibration_error}
        return out


def make_runner(cfg: ResolvedRun, clock: Clock = DEFAULT_CLOCK) -> Runner:
    """Start the run's engine runner (the model loaded; a worker process for ``process``).

    Raises:
        RunError: the CPU budget is invalid or the engine cannot load.
    """
    try:
        cfg.cpu.check()
    except BudgetError as err:
        raise RunError(f"cpu budget: {err}") from err
    if cfg.engine == "hybrid":
        return _make_hybrid_runner(cfg, clock)
    try:
        if cfg.runner == "inline":
            engine = create_planner_engine(cfg.engine, clock=clock, **cfg.engine_options)
            return InlineRunner(engine, clock=clock)
        runner = ProcessRunner(cfg.engine, cfg.engine_options,
                               hang_timeout_ms=cfg.settings.hang_timeout_ms, clock=clock,
                               worker_nice=cfg.cpu.engine_nice,
                               worker_cpus=cfg.cpu.resolved_engine_cpus(),
                               spin_ms=cfg.cpu.spin_ms)
        runner.start()
        return runner
    except (EngineError, RuntimeError) as err:
        raise RunError(f"engine {cfg.engine!r} could not start: {err}") from err


def _make_hybrid_runner(cfg: ResolvedRun, clock: Clock) -> Runner:
    """Start the onboard runner and the server client of a hybrid run."""
    from robot_latency.engines.openai_server import make_openai_engine
    from robot_latency.planner.hybrid import HybridRunner

    opts = cfg.engine_options
    onboard_cfg = dataclasses.replace(
        cfg, settings=dataclasses.replace(cfg.settings, engine=opts["onboard_engine"]),
        engine_options=dict(opts["onboard"]))
    onboard = make_runner(onboard_cfg, clock)
    try:
        server = make_openai_engine(clock=clock, **opts["server"])
        return HybridRunner(onboard, server, cfg.planning.contract,
                            policy=opts["hybrid_policy"], clock=clock)
    except (EngineError, RobotLatencyError, ValueError) as err:
        close_runner(onboard)
        raise RunError(f"engine 'hybrid' could not start: {err}") from err


def close_runner(runner: Runner) -> None:
    """Stop a runner's engine (its worker process), if it has one to stop."""
    close = getattr(runner, "close", None)
    if close is not None:
        close()


class PlannerRun:
    """A planner run writing to a run directory (a context manager).

    Raises:
        RunError: at start-up, for a log directory that cannot be written, a model or device
            that cannot be read, or an engine that cannot load.
    """

    def __init__(self, config: ResolvedRun, *, publish: Publisher, clock: Clock = DEFAULT_CLOCK,
                 sleep_until: Callable[[int], None] | None = None,
                 on_record: Callable[[CycleRecord], None] | None = None,
                 runner: Runner | None = None) -> None:
        self.config = config
        self.on_record = on_record
        self.clock = clock
        self.log_dir = Path(config.log_dir)
        self._check_log_dir()
        self.planning = config.planning
        self.floor = self._make_floor()
        # A runner handed in (a managed node's, loaded at configure) outlives this run.
        self.owns_runner = runner is None
        self.runner = make_runner(config, clock) if runner is None else runner
        self.sink = JsonlSink(self.log_dir / "cycles.jsonl", fsync=config.settings.fsync)
        self.loop_thread: dict[str, Any] = loop_thread_state()
        self._thread_before: ThreadSettings | None = None
        self._steal_s = _host_steal_s()
        self._proc = psutil.Process()
        self._proc.cpu_percent(None)  # prime: the first call has no interval to measure
        self.telemetry = self._make_telemetry()
        self.loop = PlannerLoop(config.settings, self.runner, publish=publish, sink=self._write,
                                clock=clock, sleep_until=sleep_until, planning=self.planning,
                                run_id=self.log_dir.name + "-" + str(os.getpid()))
        self.started_wall = time.time()
        self.closed = False
        self._write_manifest(status="running")

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
        family = (cfg.settings.engine_family or cfg.engine_options.get("engine_family")
                  or "llamacpp-cuda")
        try:
            cal = resolve_calibration(family, target, calibration=cfg.settings.calibration)
        except FloorError as err:
            if cfg.settings.calibration or cfg.settings.engine_family:
                raise RunError(f"target prediction: {err}") from err
            log.warning("no calibrated prediction for %s on %s: %s", family, target.id, err)
            return FloorPredictor(model, host, target, calibration_error=str(err))
        return FloorPredictor(model, host, target, calibration=cal)

    def enter_loop_thread(self) -> dict[str, Any]:
        """Apply the CPU budget to the calling thread, the one about to run the loop, and
        freeze the start-up heap (no full garbage collection scans it during the run).

        Returns what is in effect (also recorded in the manifest).

        Raises:
            RunError: the budget cannot be applied (the message says which field and why).
        """
        self._thread_before = capture_thread()
        try:
            self.loop_thread = apply_to_loop_thread(self.config.cpu)
        except BudgetError as err:
            raise RunError(f"cpu budget: {err}") from err
        self.loop_thread["gc_frozen_objects"] = freeze_heap()
        self._write_manifest(status="running")
        log.info("planner loop thread: %s", self.loop_thread)
        return self.loop_thread

    @staticmethod
    def _make_telemetry() -> Any:
        try:
            from robot_latency.telemetry import telemetry_reader
        except ImportError:
            return None
        return telemetry_reader()

    # --- per cycle ---------------------------------------------------------------------------
    def _write(self, rec: CycleRecord) -> None:
        """Enrich a record (floor, CPU, RSS, telemetry) after its plan is out, then log it."""
        if self.floor is not None:
            rec.floor = self.floor.predict(rec.tokens_in)
            try:
                self.floor.target_answer(rec, max_tokens=self.loop.max_tokens)
            except FloorError as err:  # a prediction never stops the run
                log.warning("cycle %d: no target prediction: %s", rec.cycle, err)
        rec.cpu_percent = self._proc.cpu_percent(None)
        rss = self._proc.memory_info().rss
        pid = getattr(self.runner, "pid", None)
        if pid is not None:
            try:
                rss += psutil.Process(pid).memory_info().rss
            except psutil.Error:
                pass  # the worker just died; the runner restarts it
        rec.rss_bytes = rss
        steal_s = _host_steal_s()
        if steal_s is not None and self._steal_s is not None:
            rec.host_steal_ns = max(0, round((steal_s - self._steal_s) * 1e9))
        self._steal_s = steal_s
        if self.telemetry is not None:
            t = self.telemetry.read()
            rec.telemetry = t.to_dict() if t is not None else None
        self.sink.write(rec)
        if self.on_record is not None:
            # After the record is on disk; a failing consumer never reaches the loop.
            try:
                self.on_record(rec)
            except Exception as err:
                log.error("cycle %d: record consumer failed: %r", rec.cycle, err)

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
            "profile": self.planning.describe(),
            "cpu_budget": {**cfg.cpu.to_dict(), **self.loop_thread,
                           "engine_cpus_in_effect": getattr(self.runner, "worker_cpus", None)},
            "versions": _package_versions(),
            "ros": ros_facts().to_dict(),
            "host": host_facts(),
            "started_unix": self.started_wall,
            **cfg.settings.extra,
        }

    def _write_manifest(self, status: str) -> None:
        path = self.log_dir / "manifest.json"
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.manifest(status), indent=2, default=str) + "\n")
        os.replace(tmp, path)

    def close(self) -> dict[str, Any]:
        """Stop the engine, flush the log, write summary.json from it; return the summary."""
        if self.closed:
            return json.loads((self.log_dir / "summary.json").read_text())
        self.closed = True
        if self.loop_thread.get("gc_frozen_objects"):
            gc.unfreeze()  # the start-up heap is collectable again once the loop is over
        if self._thread_before is not None:
            restore_thread(self._thread_before)  # a sweep's next run starts unpinned
        self.sink.close()
        if self.owns_runner:
            close_runner(self.runner)
        try:
            records = read_records(self.log_dir / "cycles.jsonl")
        except RecordError as err:
            log.error("summary: %s", err)
            records = []
        summary = summarize(records)
        summary["mailbox"] = self.loop.mailbox.counters()
        summary["engine_restarts"] = getattr(self.runner, "restarts", 0)
        summary["records_not_written"] = self.loop.sink_errors
        summary["transport_margin"] = self.loop.transport.summary()
        write_summary(summary, self.log_dir / "summary.json")
        self._write_manifest(status="finished")
        return summary

    def __enter__(self) -> PlannerRun:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
