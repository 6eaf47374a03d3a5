"""The ROS parameters of the planner and bag-replayer nodes: declared once, validated in one place.

Pure Python (no rclpy): each node declares the parameters of its table (:data:`PLANNER_PARAMS`,
:data:`REPLAYER_PARAMS`) with the default, description and range given here, reads them once,
and builds its configuration with :func:`planner_settings` / :func:`replayer_settings`. Those
raise :class:`ParamError`, whose message starts with the parameter's name, for any bad value.
Runtime updates go through :func:`check_update`: only the diagnostics settings may change while
the node runs; everything else builds the engine and the loop at start-up.

Numbers are accepted as int, float or a numeric string (``--ros-args -p deadline_ms:=100`` gives
an int; a launch argument gives a string), so the nodes declare them with dynamic typing and
this module does the type check.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from robot_latency.errors import RobotLatencyError
from robot_latency.planner.budget import CpuBudget, parse_cpu_list
from robot_latency.planner.config import MODES, ConfigError, PlannerConfig
from robot_latency.planner.fallback import FALLBACK_NAMES
from robot_latency.planner.session import RunConfig
from robot_latency.ros.diagnostics import DiagnosticsError, DiagnosticThresholds

#: Kinds of parameter value, as ROS names the types.
KINDS = ("string", "integer", "double", "bool", "string_array", "cpu_list")

#: Device profile when ``device_profile`` is ``auto`` and no Jetson is detected.
DEFAULT_TARGET_DEVICE = "orin-nano-8gb"
#: Floor-model preset and quant the simulated engine runs when ``model``/``quant`` are empty.
SIM_DEFAULT_MODEL = "qwen2.5-0.5b"
SIM_DEFAULT_QUANT = "Q4_K_M"


class ParamError(RobotLatencyError, ValueError):
    """A parameter value that cannot be used; the message starts with the parameter's name.

    Attributes:
        name: the parameter.
    """

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"parameter {name!r}: {message}")
        self.name = name


@dataclass(frozen=True)
class ParamSpec:
    """One ROS parameter: name, default, kind, description, inclusive range or choices.

    ``runtime`` says whether it may change while the node runs.
    """

    name: str
    default: Any
    kind: str
    description: str
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()
    runtime: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"{self.name}: kind must be one of {KINDS}, got {self.kind!r}")

    def constraints(self) -> str:
        """Return the constraints in words (the descriptor's ``additional_constraints``)."""
        parts = []
        if self.low is not None or self.high is not None:
            parts.append(f"range [{self.low}, {self.high}]")
        if self.choices:
            parts.append("one of " + ", ".join(self.choices))
        parts.append("may change at run time" if self.runtime
                     else "fixed at start-up (restart the node to change it)")
        return "; ".join(parts)


def _spec(name: str, default: Any, kind: str, description: str, **kw: Any) -> ParamSpec:
    return ParamSpec(name, default, kind, description, **kw)


_PC = PlannerConfig()  # the loop's own defaults, so the two cannot drift apart
_DT = DiagnosticThresholds()

#: The planner node's parameters, in declaration order.
PLANNER_PARAMS: tuple[ParamSpec, ...] = (
    _spec("engine", "llamacpp", "string", "registered engine name (llamacpp, sim, ...)"),
    _spec("model", "", "string",
          "GGUF path (sim engine: a shape preset); empty: the bundled planner model, or the "
          "engine's default when none is bundled"),
    _spec("quant", "", "string",
          "quant type of a preset model (e.g. Q4_K_M); also the run's label"),
    _spec("draft_model", "", "string",
          "draft GGUF for speculative decoding (llamacpp engine only; refused for others "
          "rather than silently ignored); empty: none"),
    _spec("device_profile", "auto", "string",
          "target device the floor predictions are for (the sim engine simulates it); auto: "
          f"the detected Jetson, or {DEFAULT_TARGET_DEVICE} elsewhere"),
    _spec("deadline_ms", _PC.deadline_ms, "double",
          "deadline per cycle from its scheduled start (ms); <= period_ms",
          low=0.0, high=60_000.0),
    _spec("period_ms", _PC.period_ms, "double", "planner period (ms)", low=0.0, high=60_000.0),
    _spec("mode", _PC.mode, "string",
          "periodic: one cycle per tick for the newest command; event: each command starts a "
          "cycle", choices=MODES),
    _spec("publish_margin_ms", _PC.publish_margin_ms, "double",
          "time kept before the deadline for the fallback and the publish (ms)",
          low=0.0, high=60_000.0),
    _spec("max_tokens", _PC.max_tokens, "integer", "most tokens generated per cycle",
          low=1, high=4096),
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
    _spec("n_threads", 0, "integer",
          "engine threads; 0: all cores but one (one core stays free for the loop)",
          low=0, high=1024),
    _spec("n_gpu_layers", 0, "integer",
          "layers offloaded to the GPU (a Jetson's CUDA build; -1: all; 0: CPU only)",
          low=-1, high=100_000),
    _spec("loop_cpus", "", "cpu_list",
          "CPUs the planner loop's thread runs on (a list, or a string such as '0' or "
          "'0,2-3'); empty: not pinned"),
    _spec("engine_cpus", "", "cpu_list",
          "CPUs the engine worker runs on; empty: all but loop_cpus when those are set, "
          "else not pinned"),
    _spec("engine_nice", CpuBudget().engine_nice, "integer",
          "niceness added to the engine worker, so the loop wins a shared core", low=0,
          high=19),
    _spec("loop_priority", CpuBudget().loop_priority, "integer",
          "SCHED_FIFO priority of the loop's thread (1-99; needs an rtprio limit or "
          "CAP_SYS_NICE); 0: normal scheduler", low=0, high=99),
    _spec("hang_timeout_ms", 1000.0, "double",
          "a generation still running this long past its give-up time is hung: the engine "
          "worker is restarted (ms)", low=1.0, high=600_000.0),
    _spec("fsync", False, "bool", "fsync the cycle log after every record"),
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
    _spec("diagnostics_period_s", 1.0, "double", "how often /diagnostics is published (s)",
          low=0.05, high=3600.0, runtime=True),
)

#: The bag replayer node's parameters, in declaration order.
REPLAYER_PARAMS: tuple[ParamSpec, ...] = (
    _spec("bag", "", "string", "rosbag2 directory, bare .mcap or .jsonl command stream"),
    _spec("topic", "", "string",
          "command topic in the bag; empty: the bag's only std_msgs/msg/String topic"),
    _spec("speed", 1.0, "double", "time compression of the recording (2.0: twice as fast)",
          low=0.001, high=1000.0),
    _spec("loop_count", 1, "integer", "times the stream is played", low=1, high=1_000_000),
    _spec("loop_gap_s", 1.0, "double", "pause between the end of one play and the next (s)",
          low=0.0, high=3600.0),
    _spec("start_delay_s", 1.0, "double",
          "pause after a subscriber is found (or wait_for_subscriber_s ran out) before the "
          "first command (s)", low=0.0, high=3600.0),
    _spec("wait_for_subscriber_s", 10.0, "double",
          "wait at most this long for a subscriber to the command topic before starting (s)",
          low=0.0, high=3600.0),
    _spec("tail_s", 1.0, "double",
          "keep running this long after the last command, so it is delivered and answered (s)",
          low=0.0, high=3600.0),
    _spec("stay_alive", False, "bool", "keep running after the replay instead of exiting"),
)

PLANNER_NAMES = frozenset(s.name for s in PLANNER_PARAMS)
REPLAYER_NAMES = frozenset(s.name for s in REPLAYER_PARAMS)
_BY_NAME = {s.name: s for s in PLANNER_PARAMS}


# --- type and range checks --------------------------------------------------------------------
def coerce(spec: ParamSpec, value: Any) -> Any:
    """Return ``value`` as the spec's kind, checked against its range and choices.

    Raises:
        ParamError: wrong type, out of range, not one of the choices.
    """
    name, kind = spec.name, spec.kind
    if kind == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        raise ParamError(name, f"expects true or false, got {value!r}")
    if kind == "string":
        if not isinstance(value, str):
            raise ParamError(name, f"expects a string, got {value!r}")
        if spec.choices and value not in spec.choices:
            raise ParamError(name, f"{value!r} is not one of {', '.join(spec.choices)}")
        return value
    if kind == "string_array":
        if isinstance(value, str):
            items = [v.strip() for v in value.split(",") if v.strip()]
        elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            items = [v.strip() for v in value]
        else:
            raise ParamError(name, f"expects a list of strings or a comma-separated string, "
                                   f"got {value!r}")
        bad = [v for v in items if spec.choices and v not in spec.choices]
        if bad or not items:
            raise ParamError(name, f"{value!r}: must be a non-empty list of "
                                   f"{', '.join(spec.choices) or 'strings'}")
        return items
    if kind == "cpu_list":
        return _cpu_list(name, value)
    number = _number(name, value, integer=kind == "integer")
    if (spec.low is not None and number < spec.low) or (spec.high is not None
                                                         and number > spec.high):
        raise ParamError(name, f"{number!r} is out of range [{spec.low}, {spec.high}]")
    return number


def _cpu_list(name: str, value: Any) -> tuple[int, ...]:
    try:
        return parse_cpu_list(value)
    except ValueError as err:
        raise ParamError(name, str(err)) from None


def _number(name: str, value: Any, *, integer: bool) -> int | float:
    if isinstance(value, bool):
        raise ParamError(name, f"expects a number, got {value!r}")
    if isinstance(value, str):
        try:
            value = float(value) if not integer else int(value.strip())
        except ValueError:
            raise ParamError(name, f"expects {'an integer' if integer else 'a number'}, "
                                   f"got {value!r}") from None
    if integer:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int):
            raise ParamError(name, f"expects an integer, got {value!r}")
        return value
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ParamError(name, f"expects a finite number, got {value!r}")
    return float(value)


def _typed(table: Sequence[ParamSpec], values: Mapping[str, Any]) -> dict[str, Any]:
    known = {s.name for s in table}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ParamError(unknown[0], f"is not a parameter of this node; known: "
                                     f"{', '.join(sorted(known))}")
    return {s.name: coerce(s, values.get(s.name, s.default)) for s in table}


# --- planner ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class PlannerSettings:
    """Everything the planner node needs, built from its parameters.

    Args:
        run: the planner run's configuration (loop config inside).
        diagnostics: diagnostics thresholds (may change at run time).
        diagnostics_period_s: how often /diagnostics is published.
        max_cycles: stop after this many cycles; 0: until stopped.
        values: the typed parameter values the settings were built from.
        notes: things worth a log line (ignored options, defaults chosen).
    """

    run: RunConfig
    diagnostics: DiagnosticThresholds
    diagnostics_period_s: float
    max_cycles: int
    values: dict[str, Any]
    notes: tuple[str, ...] = ()


def resolve_device(device_profile: str, *, sysfs_root: Path = Path("/")) -> str:
    """Return the device profile id: ``auto`` becomes the detected Jetson's or the default.

    Raises:
        ParamError: an unknown device id (the message lists the valid ones).
    """
    from robot_latency.floor.devices import AUTO_ID, DEVICES, HOST_ID
    from robot_latency.floor.jetson import detect_jetson

    key = device_profile.strip().lower()
    if key == AUTO_ID:
        info = detect_jetson(sysfs_root)
        if info is not None and info.profile_id is not None:
            return info.profile_id
        return DEFAULT_TARGET_DEVICE
    if key != HOST_ID and key not in DEVICES:
        raise ParamError("device_profile", f"unknown device {device_profile!r}; valid: "
                                           f"{', '.join([AUTO_ID, HOST_ID, *DEVICES])}")
    return key


def default_log_dir(*, now: float | None = None) -> Path:
    """Return ``$ROS_HOME/robot_latency/<YYYYmmdd-HHMMSS>-<pid>`` (ROS_HOME: ~/.ros)."""
    home = Path(os.environ.get("ROS_HOME") or Path.home() / ".ros").expanduser()
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return home / "robot_latency" / f"{stamp}-{os.getpid()}"


def bundled_model() -> str | None:
    """Return the bundled planner GGUF's path, or None where none is built or shipped."""
    try:
        from robot_latency.models.bundled import bundled_model_path
    except ImportError:
        return None
    try:
        return str(bundled_model_path())
    except (OSError, ValueError):  # BundledModelError is a FileNotFoundError
        return None


def planner_settings(values: Mapping[str, Any], *, sysfs_root: Path = Path("/"),
                     cpu_count: int | None = None) -> PlannerSettings:
    """Build the planner node's settings from parameter values (missing ones: defaults).

    Raises:
        ParamError: any bad value; the message names the parameter.
    """
    v = _typed(PLANNER_PARAMS, values)
    notes: list[str] = []
    try:
        planner = PlannerConfig(
            period_ms=v["period_ms"], deadline_ms=v["deadline_ms"], mode=v["mode"],
            publish_margin_ms=v["publish_margin_ms"], max_tokens=v["max_tokens"],
            max_command_chars=v["max_command_chars"], fallback=tuple(v["fallback"]),
            hold_max_age_ms=v["hold_max_age_ms"], mailbox_capacity=v["mailbox_capacity"],
            grammar=v["grammar"])
        diagnostics = DiagnosticThresholds(**{f.name: v[f.name] for f in
                                              dataclasses.fields(DiagnosticThresholds)})
    except (ConfigError, DiagnosticsError) as err:
        raise _named(err) from err
    engine = v["engine"].strip()
    if not engine:
        raise ParamError("engine", "must not be empty")
    target = resolve_device(v["device_profile"], sysfs_root=sysfs_root)
    model: str | None = v["model"].strip() or None
    quant: str | None = v["quant"].strip() or None
    draft: str | None = v["draft_model"].strip() or None
    options: dict[str, Any] = {}
    if draft is not None and engine != "llamacpp":
        # A comparison labelled "with draft" that ran without one would be wrong; refuse.
        raise ParamError("draft_model", f"{draft!r}: only the llamacpp engine takes a draft "
                                        f"model, not {engine!r}; leave it empty")
    if engine == "sim":
        # The simulated engine predicts the target device: it runs "on" it.
        model, quant = model or SIM_DEFAULT_MODEL, quant or SIM_DEFAULT_QUANT
        options = {"device": target, "model": model, "quant": quant}
        host = target
        for name in ("n_threads", "n_gpu_layers"):
            if v[name]:
                notes.append(f"{name} is ignored by the sim engine")
    else:
        if model is None:
            model = bundled_model()
            notes.append(f"model: bundled planner {model}" if model
                         else "model: no bundled planner found; the engine's default model")
        if model is not None:
            options["model_path"] = model
        if draft is not None:
            options.update(draft="model", draft_model_path=draft)
        if v["n_gpu_layers"]:
            options["n_gpu_layers"] = v["n_gpu_layers"]
        cores = cpu_count or os.cpu_count() or 2
        options["n_threads"] = v["n_threads"] or max(1, cores - 1)
        host = "auto"  # the detected Jetson's profile, else the probed host
    log_dir = Path(v["log_dir"]).expanduser() if v["log_dir"].strip() else default_log_dir()
    label = v["label"].strip() or " ".join(
        p for p in (engine, Path(model).name if model else None, quant) if p)
    try:
        cpu = CpuBudget(loop_cpus=v["loop_cpus"], engine_cpus=v["engine_cpus"],
                        engine_nice=v["engine_nice"], loop_priority=v["loop_priority"])
        engine_cpus = cpu.resolved_engine_cpus()
        if engine != "sim" and not v["n_threads"] and engine_cpus:
            options["n_threads"] = len(engine_cpus)  # one thread per core the engine owns
        run = RunConfig(planner=planner, log_dir=log_dir, engine=engine, engine_options=options,
                        runner="process", model=model, quant=quant, host_device=host,
                        target_device=target, label=label, cpu=cpu,
                        hang_timeout_ms=v["hang_timeout_ms"], fsync=v["fsync"],
                        extra={"front_end": "ros2 planner_node", "max_cycles": v["max_cycles"]})
    except ConfigError as err:
        raise _named(err) from err
    return PlannerSettings(run=run, diagnostics=diagnostics,
                           diagnostics_period_s=v["diagnostics_period_s"],
                           max_cycles=v["max_cycles"], values=v, notes=tuple(notes))


def _named(err: Exception) -> ParamError:
    """Turn a ``name=value: why`` config error into a ParamError naming the parameter."""
    text = str(err)
    name = text.split("=", 1)[0].strip()
    if name not in PLANNER_NAMES:
        name = "?"
    return ParamError(name, text)


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
    except DiagnosticsError as err:
        raise _named(err) from err
    return RuntimeUpdate(diagnostics, merged["diagnostics_period_s"], merged)


def coerce_or_none(spec: ParamSpec, value: Any) -> Any:
    """Return the coerced value, or None where it does not coerce (for equality checks)."""
    try:
        return coerce(spec, value)
    except ParamError:
        return None


# --- bag replayer -----------------------------------------------------------------------------
@dataclass(frozen=True)
class ReplayerSettings:
    """The bag replayer's settings (see :data:`REPLAYER_PARAMS`)."""

    bag: Path
    topic: str | None
    speed: float
    loop_count: int
    loop_gap_s: float
    start_delay_s: float
    wait_for_subscriber_s: float
    tail_s: float
    stay_alive: bool


def replayer_settings(values: Mapping[str, Any]) -> ReplayerSettings:
    """Build the bag replayer's settings from parameter values.

    Raises:
        ParamError: any bad value, or no ``bag`` given.
    """
    v = _typed(REPLAYER_PARAMS, values)
    if not v["bag"].strip():
        raise ParamError("bag", "required: the stream to replay (bag directory, .mcap or "
                                ".jsonl), e.g. --ros-args -p bag:=/path/to/bag")
    if not v["speed"] > 0:
        raise ParamError("speed", f"{v['speed']!r}: must be > 0")
    return ReplayerSettings(bag=Path(v["bag"]).expanduser(), topic=v["topic"].strip() or None,
                            speed=v["speed"], loop_count=v["loop_count"],
                            loop_gap_s=v["loop_gap_s"], start_delay_s=v["start_delay_s"],
                            wait_for_subscriber_s=v["wait_for_subscriber_s"], tail_s=v["tail_s"],
                            stay_alive=v["stay_alive"])
