"""The planner node's ROS parameters: declared once, validated in one place, turned into the run.

Pure Python (no rclpy): each node declares the parameters of its table (:data:`PLANNER_PARAMS`
here, :data:`~robot_latency.ros.replayer_params.REPLAYER_PARAMS`) with the default, description
and range given there, reads them once, and builds its configuration with
:func:`planner_settings` / :func:`~robot_latency.ros.replayer_params.replayer_settings`. Those
raise :class:`~robot_latency.ros.param_spec.ParamError`, whose ``name`` is the parameter, for any
bad value (a setting's error is mapped to its parameter by name: :data:`PARAM_OF`). Runtime
updates go through :func:`check_update`: only the diagnostics settings may change while the node
runs; everything else builds the engine and the loop at start-up. What a parameter is and how a
value is type-checked: :mod:`robot_latency.ros.param_spec`.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from robot_latency.engines.openai_config import SERVER_APIS
from robot_latency.errors import RobotLatencyError
from robot_latency.planner.budget import CpuBudget
from robot_latency.planner.config import (
    DEFAULT_TARGET_DEVICE,
    HYBRID_POLICIES,
    MODES,
    ON_NEW_COMMAND,
    VISION_ENCODERS,
    RunSettings,
    SettingsError,
)
from robot_latency.planner.fallback import FALLBACK_NAMES
from robot_latency.planner.resolve import ResolvedRun, resolve_run
from robot_latency.ros.diagnostics import DiagnosticThresholds
from robot_latency.ros.param_spec import ParamError, ParamSpec, coerce, coerce_or_none, typed_values

#: Settings (fields of RunSettings) whose ROS parameter has another name.
PARAM_OF = {"profile": "planner_profile"}


def _spec(name: str, default: Any, kind: str, description: str, **kw: Any) -> ParamSpec:
    return ParamSpec(name, default, kind, description, **kw)


_PC = RunSettings()  # the run's own defaults, so the two cannot drift apart
_DT = DiagnosticThresholds()

#: The planner node's parameters, in declaration order.
PLANNER_PARAMS: tuple[ParamSpec, ...] = (
    _spec("engine", _PC.engine, "string", "registered engine name (llamacpp, sim, ...)"),
    _spec("planner_profile", "", "string",
          "planner profile: a shipped name (bundled-actions, instruct-json; robot-latency "
          "profiles lists them) or a YAML path; empty: bundled-actions"),
    _spec("model", "", "string",
          "GGUF path (sim engine: a shape preset); empty: the bundled planner model, or the "
          "engine's default when none is bundled"),
    _spec("quant", "", "string",
          "quant type of a preset model (e.g. Q4_K_M); also the run's label"),
    _spec("draft_model", "", "string",
          "draft GGUF for speculative decoding (llamacpp engine only; refused for others "
          "rather than silently ignored); empty: none"),
    _spec("target_device", "auto", "string",
          "target device the floor predictions are for (the sim engine simulates it); auto: "
          f"the detected Jetson, or {DEFAULT_TARGET_DEVICE} elsewhere"),
    _spec("engine_family", "", "string",
          "engine family whose calibrated ITL/TTFT prediction each record carries for the "
          "target (mlc, llamacpp-cuda, tensorrt, ...; the sim engine simulates it); empty: "
          "llamacpp-cuda's, and the sim engine's fixed efficiency"),
    _spec("calibration", "", "string",
          "calibration file for engine_family on the target (robot-latency calibrate); "
          "empty: the published table's"),
    _spec("deadline_ms", _PC.deadline_ms, "double",
          "deadline per cycle from its scheduled start (ms); <= period_ms in periodic mode",
          low=0.0, high=60_000.0),
    _spec("period_ms", _PC.period_ms, "double", "planner period (ms)", low=0.0, high=60_000.0),
    _spec("mode", _PC.mode, "string",
          "periodic: one cycle per tick for the newest command; event: each command starts a "
          "cycle", choices=MODES),
    _spec("publish_margin_ms", _PC.publish_margin_ms, "double",
          "time kept before the deadline for the fallback and the publish (ms)",
          low=0.0, high=60_000.0),
    _spec("max_tokens", _PC.max_tokens, "integer",
          "most tokens generated per cycle; 0: the planner profile's", low=0, high=4096),
    _spec("max_command_chars", _PC.max_command_chars, "integer",
          "longer commands are refused (fallback bad_command), never fed to the model",
          low=1, high=1_000_000),
    _spec("fallback", list(_PC.fallback), "string_array",
          "fallback chain in order (a list, or one comma-separated string)",
          choices=FALLBACK_NAMES),
    _spec("hold_max_age_ms", _PC.hold_max_age_ms, "double",
          "hold repeats the last valid plan only while younger than this (ms)",
          low=0.0, high=3_600_000.0),
    _spec("mailbox_capacity", _PC.mailbox_capacity, "integer",
          "commands waiting at most; the oldest is dropped beyond it", low=1, high=100_000),
    _spec("grammar", _PC.grammar, "bool", "constrain decoding with the plan grammar"),
    _spec("log_dir", "", "string",
          "run directory (cycles.jsonl, manifest.json, summary.json); empty: "
          "$ROS_HOME/robot_latency/<timestamp>-<pid> ($ROS_HOME defaults to ~/.ros)"),
    _spec("label", "", "string", "name of this configuration in comparisons; empty: derived"),
    _spec("n_threads", _PC.n_threads, "integer",
          "engine decode threads; 0: one per core the engine has to itself (all but one when "
          "the loop is not pinned)", low=0, high=1024),
    _spec("n_threads_batch", _PC.n_threads_batch, "integer",
          "engine prefill threads; 0: every core the engine may run on (all of them unless "
          "the loop is pinned on the normal scheduler)", low=0, high=1024),
    _spec("n_gpu_layers", _PC.n_gpu_layers, "integer",
          "layers offloaded to the GPU (a Jetson's CUDA build; -1: all; 0: CPU only)",
          low=-1, high=100_000),
    _spec("loop_cpus", "", "cpu_list",
          "CPUs the planner loop's thread runs on (a list, or a string such as '0' or "
          "'0,2-3'); empty: not pinned"),
    _spec("engine_cpus", "", "cpu_list",
          "CPUs the engine worker runs on; empty: all but loop_cpus when those are set and "
          "loop_priority is 0, else not pinned"),
    _spec("engine_nice", _PC.cpu.engine_nice, "integer",
          "niceness added to the engine worker, so the loop wins a shared core", low=0,
          high=19),
    _spec("loop_priority", _PC.cpu.loop_priority, "integer",
          "SCHED_FIFO priority of the loop's thread (1-99; needs an rtprio limit or "
          "CAP_SYS_NICE); 0: normal scheduler", low=0, high=99),
    _spec("hang_timeout_ms", _PC.hang_timeout_ms, "double",
          "a generation still running this long past its give-up time is hung: the engine "
          "worker is restarted (ms)", low=1.0, high=600_000.0),
    _spec("fsync", _PC.fsync, "bool", "fsync the cycle log after every record"),
    _spec("max_cycles", 0, "integer",
          "stop cleanly after this many cycles (periodic) or commands (event); 0: run until "
          "stopped", low=0, high=2**31 - 1),
    _spec("miss_rate_warn", _DT.miss_rate_warn, "double",
          "deadline-miss rate over the window that makes diagnostics WARN", low=0.0, high=1.0,
          runtime=True),
    _spec("miss_rate_error", _DT.miss_rate_error, "double",
          "deadline-miss rate over the window that makes diagnostics ERROR", low=0.0, high=1.0,
          runtime=True),
    _spec("ttft_p99_warn_ms", _DT.ttft_p99_warn_ms, "double",
          "TTFT p99 (ms) that makes diagnostics WARN; 0: 80% of deadline_ms",
          low=0.0, high=60_000.0, runtime=True),
    _spec("ttft_p99_error_ms", _DT.ttft_p99_error_ms, "double",
          "TTFT p99 (ms) that makes diagnostics ERROR; 0: deadline_ms",
          low=0.0, high=60_000.0, runtime=True),
    _spec("itl_p99_warn_ms", _DT.itl_p99_warn_ms, "double",
          "inter-token gap p99 (ms) that makes diagnostics WARN; 0: off",
          low=0.0, high=60_000.0, runtime=True),
    _spec("itl_p99_error_ms", _DT.itl_p99_error_ms, "double",
          "inter-token gap p99 (ms) that makes diagnostics ERROR; 0: off",
          low=0.0, high=60_000.0, runtime=True),
    _spec("diagnostics_window", _DT.diagnostics_window, "integer",
          "newest cycles the diagnostics figures are computed over", low=1, high=1_000_000,
          runtime=True),
    _spec("plan_expected_hz", _DT.plan_expected_hz, "double",
          "the plan topic's expected rate for topic monitors (greenwave's expected_frequency, "
          "Hz); 0: one plan per period_ms in periodic mode, none in event mode",
          low=0.0, high=10_000.0, runtime=True),
    _spec("plan_rate_tolerance_percent", _DT.plan_rate_tolerance_percent, "double",
          "how far the plan rate may stray from plan_expected_hz before the plan topic's "
          "status is WARN (%)", low=0.0, high=1000.0, runtime=True),
    _spec("diagnostics_period_s", 1.0, "double", "how often /diagnostics is published (s)",
          low=0.05, high=3600.0, runtime=True),
    _spec("on_new_command", _PC.on_new_command, "string",
          "event mode: a command arriving while the model works on an older one waits "
          "(queue) or aborts it, the older recorded as superseded (preempt)",
          choices=ON_NEW_COMMAND),
    _spec("transport_margin_ms", -1.0, "double",
          "time kept before the deadline, on top of publish_margin_ms, for the plan to reach "
          "its subscriber (ms); -1: measured (loopback over DDS at start-up, then the node's "
          "own plans), between the floor and the cap", low=-1.0, high=60_000.0),
    _spec("transport_margin_floor_ms", _PC.transport_margin_floor_ms, "double",
          "the measured transport margin never goes below this (ms)", low=0.0, high=60_000.0),
    _spec("transport_margin_cap_ms", _PC.transport_margin_cap_ms, "double",
          "nor above this, nor above a quarter of the deadline (ms); until enough samples "
          "arrived the margin is 50 ms or this, the less", low=0.0, high=60_000.0),
    _spec("server_url", "", "string",
          "OpenAI-compatible server for engines openai and hybrid (http://HOST:PORT/v1); the "
          "node starts even when it does not answer, reports ERROR and falls back until it does"),
    _spec("server_model", "", "string",
          "model name to ask the server for; empty: the first one it lists"),
    _spec("server_api", _PC.server_api, "string",
          "completions (the profile's rendered prompt) or chat (its messages)",
          choices=SERVER_APIS),
    _spec("hybrid_policy", _PC.hybrid_policy, "string",
          "engine hybrid: first_valid (the first schema-valid plan) or prefer_server (the "
          "server's when valid by the give-up time)", choices=HYBRID_POLICIES),
    _spec("plan_json", True, "bool",
          "also publish each plan as the JSON envelope (std_msgs/String) on planner/plan_json, "
          "what planner/plan carried before the typed Plan; kept for one release"),
    _spec("cycle_json", True, "bool",
          "also publish each cycle record as JSON (std_msgs/String) on planner/cycle, beside the "
          "typed planner/cycle_stats; kept for one release"),
    _spec("camera_topic", "", "string",
          "camera topic to plan with (sensor_msgs/CompressedImage when it ends in /compressed, "
          "else sensor_msgs/Image): each cycle takes the newest frame at its start, its stamp "
          "in the plan's header and its age in the record; empty: text only"),
    _spec("mmproj", "", "string",
          "vision tower (mmproj GGUF) beside the model, llamacpp engine only: each cycle's "
          "camera frame is encoded and prefilled (phases image_encode, image_prefill) or, "
          "unchanged, reused from the KV cache; empty: the frame's stamp only"),
    _spec("image_policy", _PC.image_policy, "string",
          "with mmproj: reuse (an unchanged frame stays in the KV cache), every (encoded each "
          "cycle) or fit (reuse, and a new frame downscaled, else left out, to fit what is "
          "left of the budget; the record says so)"),
    _spec("frame_scale", _PC.frame_scale, "double",
          "with mmproj, reuse or every: downscale each frame by this first, in (0, 1]"),
    _spec("vision_encoder", _PC.vision_encoder, "string",
          "with mmproj: what encodes the frame: clip (llama.cpp's, libmtmd) or onnx (the "
          "tower's ONNX export on ONNX Runtime, cached in the model cache)",
          choices=VISION_ENCODERS),
    # The old spelling of target_device, kept for one release: params files and launch lines
    # written for the last release keep working (with a note naming the new name).
    _spec("device_profile", "", "string",
          "old name of target_device, kept for one release; when set it is used instead"),
)

PLANNER_NAMES = frozenset(s.name for s in PLANNER_PARAMS)
_BY_NAME = {s.name: s for s in PLANNER_PARAMS}


# --- planner ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class PlannerSettings:
    """Everything the planner node needs, built from its parameters.

    Args:
        run: the resolved run (the settings, the loop's among them, inside).
        diagnostics: diagnostics thresholds (may change at run time).
        diagnostics_period_s: how often /diagnostics is published.
        max_cycles: stop after this many cycles; 0: until stopped.
        plan_json: also publish the JSON plan envelope on planner/plan_json.
        cycle_json: also publish each cycle record as JSON on planner/cycle.
        camera_topic: the camera topic subscribed to; empty: text only.
        values: the typed parameter values the settings were built from.
        notes: things worth a log line (ignored options, defaults chosen).
    """

    run: ResolvedRun
    diagnostics: DiagnosticThresholds
    diagnostics_period_s: float
    max_cycles: int
    values: dict[str, Any]
    notes: tuple[str, ...] = ()
    plan_json: bool = True
    cycle_json: bool = True
    camera_topic: str = ""


def resolve_device(device: str, *, sysfs_root: Path = Path("/"),
                   param: str = "target_device") -> str:
    """Return the device datasheet id: ``auto`` becomes the detected Jetson's or the default.

    Raises:
        ParamError: an unknown device id (the message lists the valid ones).
    """
    from robot_latency.floor.devices import AUTO_ID, DEVICES, HOST_ID
    from robot_latency.floor.jetson import detect_jetson

    key = device.strip().lower()
    if key == AUTO_ID:
        info = detect_jetson(sysfs_root)
        if info is not None and info.device_id is not None:
            return info.device_id
        return DEFAULT_TARGET_DEVICE
    if key != HOST_ID and key not in DEVICES:
        raise ParamError(param, f"unknown device {device!r}; valid: "
                                f"{', '.join([AUTO_ID, HOST_ID, *DEVICES])}")
    return key


def default_log_dir(*, now: float | None = None) -> Path:
    """Return ``$ROS_HOME/robot_latency/<YYYYmmdd-HHMMSS>-<pid>`` (ROS_HOME: ~/.ros)."""
    home = Path(os.environ.get("ROS_HOME") or Path.home() / ".ros").expanduser()
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return home / "robot_latency" / f"{stamp}-{os.getpid()}"


def planner_settings(values: Mapping[str, Any], *, sysfs_root: Path = Path("/"),
                     cpu_count: int | None = None) -> PlannerSettings:
    """Build the planner node's settings from parameter values (missing ones: defaults).

    Raises:
        ParamError: any bad value; the message names the parameter.
    """
    v = typed_values(PLANNER_PARAMS, values)
    device_param = "device_profile" if v["device_profile"].strip() else "target_device"
    target = resolve_device(v[device_param], sysfs_root=sysfs_root, param=device_param)
    try:
        diagnostics = DiagnosticThresholds(**{f.name: v[f.name] for f in
                                              dataclasses.fields(DiagnosticThresholds)})
        log_dir = Path(v["log_dir"]).expanduser() if v["log_dir"].strip() else default_log_dir()
        cpu = CpuBudget(loop_cpus=v["loop_cpus"], engine_cpus=v["engine_cpus"],
                        engine_nice=v["engine_nice"], loop_priority=v["loop_priority"])
        settings = RunSettings(
            period_ms=v["period_ms"], deadline_ms=v["deadline_ms"], mode=v["mode"],
            publish_margin_ms=v["publish_margin_ms"], max_tokens=v["max_tokens"],
            max_command_chars=v["max_command_chars"], fallback=tuple(v["fallback"]),
            hold_max_age_ms=v["hold_max_age_ms"], mailbox_capacity=v["mailbox_capacity"],
            grammar=v["grammar"], transport_margin_ms=v["transport_margin_ms"],
            transport_margin_floor_ms=v["transport_margin_floor_ms"],
            transport_margin_cap_ms=v["transport_margin_cap_ms"],
            on_new_command=v["on_new_command"], log_dir=log_dir, engine=v["engine"].strip(),
            model=v["model"].strip() or None, quant=v["quant"].strip() or None,
            profile=v["planner_profile"].strip() or None,
            draft_model=v["draft_model"].strip() or None, target_device=target,
            mmproj=v["mmproj"].strip() or None, image_policy=v["image_policy"].strip(),
            frame_scale=v["frame_scale"], vision_encoder=v["vision_encoder"].strip(),
            n_threads=v["n_threads"], n_threads_batch=v["n_threads_batch"],
            n_gpu_layers=v["n_gpu_layers"], engine_family=v["engine_family"].strip() or None,
            calibration=v["calibration"].strip() or None, cpu=cpu,
            label=v["label"].strip() or None, hang_timeout_ms=v["hang_timeout_ms"],
            fsync=v["fsync"],
            extra={"front_end": "ros2 planner_node", "max_cycles": v["max_cycles"]},
            server_url=v["server_url"].strip(), server_model=v["server_model"].strip(),
            server_api=v["server_api"].strip(), hybrid_policy=v["hybrid_policy"].strip())
        run, notes = resolve_run(
            settings, cores=frozenset(range(cpu_count)) if cpu_count else None)
    except SettingsError as err:
        raise named(err) from err
    except RobotLatencyError as err:  # a ladder level that cannot be built, a missing model
        raise ParamError("model", str(err)) from err
    return PlannerSettings(run=run, diagnostics=diagnostics,
                           diagnostics_period_s=v["diagnostics_period_s"],
                           max_cycles=v["max_cycles"], values=v, plan_json=v["plan_json"],
                           cycle_json=v["cycle_json"], camera_topic=v["camera_topic"].strip(),
                           notes=tuple(notes) + _old_spellings(device_param))


def _old_spellings(device_param: str) -> tuple[str, ...]:
    if device_param == "device_profile":
        return ("parameter 'device_profile' is the old name of 'target_device' (kept for one "
                "release): rename it in your params file or launch line",)
    return ()


def named(err: SettingsError) -> ParamError:
    """Return a setting's error as a ParamError naming the parameter that sets it."""
    return ParamError(PARAM_OF.get(err.name, err.name), err.message)


@dataclass(frozen=True)
class RuntimeUpdate:
    """An accepted runtime change: the new thresholds and publish period."""

    diagnostics: DiagnosticThresholds
    diagnostics_period_s: float
    values: dict[str, Any]


def check_update(current: Mapping[str, Any], changes: Mapping[str, Any]) -> RuntimeUpdate:
    """Validate a runtime parameter change against the current values.

    Raises:
        ParamError: an unknown parameter, one fixed at start-up (the message says so), or a bad
            value (including thresholds that contradict each other).
    """
    for name, value in changes.items():
        spec = _BY_NAME.get(name)
        if spec is None:
            raise ParamError(name, "is not a parameter of this node")
        if not spec.runtime and coerce_or_none(spec, value) != current.get(name):
            raise ParamError(name, "cannot change at run time: the engine and the planner "
                                   "loop are built from it at start-up; restart the node with "
                                   "the new value")
    merged = {**current, **{n: coerce(_BY_NAME[n], v) for n, v in changes.items()}}
    try:
        diagnostics = DiagnosticThresholds(**{f.name: merged[f.name] for f in
                                              dataclasses.fields(DiagnosticThresholds)})
    except SettingsError as err:
        raise named(err) from err
    return RuntimeUpdate(diagnostics, merged["diagnostics_period_s"], merged)
