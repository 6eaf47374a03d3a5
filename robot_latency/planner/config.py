"""What the user sets for a run: one frozen dataclass, every default written once, every field
validated in one place.

The front ends (the CLI's ``run``, ``sweep`` and ``fleet``, both ROS nodes, the demo through the
node) fill a :class:`RunSettings` from their flags or parameters; the builder
(:func:`robot_latency.planner.resolve.resolve_run`) turns it into the resolved run. A bad value
raises :class:`SettingsError`, whose ``name`` is the field: each front end maps it to its flag
or parameter without reading the message.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from robot_latency.engines.llamacpp_config import VISION_ENCODERS
from robot_latency.engines.openai_config import SERVER_APIS
from robot_latency.errors import SettingsError
from robot_latency.planner.budget import CpuBudget
from robot_latency.planner.fallback import FALLBACK_NAMES
from robot_latency.planner.margin import (
    TRANSPORT_START_MS,
    MarginSettings,
    publish_margin_settings,
)

MODES = ("periodic", "event")
ON_NEW_COMMAND = ("queue", "preempt")
#: What a cycle does with its camera frame, with a vision tower (planner/frame_policy.py).
FRAME_POLICIES = ("reuse", "every", "fit")
RUNNERS = ("process", "inline")
#: How an ``hybrid`` run picks between the onboard plan and the server's.
HYBRID_POLICIES = ("first_valid", "prefer_server")
#: The device predicted for (and simulated) when none is given or detected.
DEFAULT_TARGET_DEVICE = "orin-nano-8gb"
#: Engine of a run when none is given.
DEFAULT_ENGINE = "llamacpp"
#: A generation still running this long past its give-up time is hung (ms).
DEFAULT_HANG_TIMEOUT_MS = 1000.0


@dataclass(frozen=True)
class RunSettings:
    """What one run is asked for: the loop's settings, then the run's.

    The loop's (read by :class:`~robot_latency.planner.loop.PlannerLoop`; :data:`LOOP_FIELDS`):

    Args:
        period_ms: planner period (periodic mode: one cycle per tick; unused in event mode).
        deadline_ms: deadline per cycle, counted from the cycle's scheduled start; <= period_ms
            in periodic mode, any length in event mode.
        mode: ``periodic`` (tick-driven, plans for the newest command) or ``event`` (each
            arriving command starts a cycle; the deadline counts from its arrival).
        publish_margin_ms: time kept before the deadline for the fallback and the publish; the
            model's plan must be ready by ``deadline - margin``; < 0: learned from the loop's
            own lateness at its give-up time (the CLI's ``run`` default;
            :class:`~robot_latency.planner.margin.PublishMargin`).
        max_tokens: most tokens the model may generate per cycle; 0: the planner profile's.
        max_command_chars: longer commands are refused (fallback ``bad_command``), never fed to
            the model: the prompt's length bounds the prefill time.
        fallback: the fallback chain, in order (``rule``, ``hold``, ``stop``).
        hold_max_age_ms: ``hold`` repeats the last valid plan only while younger than this.
        mailbox_capacity: commands waiting at most; the oldest is dropped beyond it.
        grammar: constrain decoding with the output contract's grammar (the profile's).
        transport_margin_ms: time kept before the deadline, on top of ``publish_margin_ms``,
            for the plan to cross the middleware to its receiver; < 0: measured by the ROS node
            (loopback at start-up, then its own plans), between the floor and the cap below
            (:mod:`robot_latency.planner.margin`); 0: none (the CLI's ``run``, no middleware).
        transport_margin_floor_ms: the measured transport margin never goes below this.
        transport_margin_cap_ms: nor above this, nor above a quarter of what the deadline leaves
            after ``publish_margin_ms``; until enough samples arrived the margin is this or
            :data:`~robot_latency.planner.margin.TRANSPORT_START_MS`, the less.
        on_new_command: what a command arriving while the model works on an older one does:
            ``queue`` (it waits for the older cycle to end) or ``preempt`` (the older generation
            is aborted at once and its command recorded as superseded; the newer one is planned
            with its full budget). Event mode only: a periodic tick already plans the newest.

    The run's (read by the builder and the run):

    Args:
        log_dir: the run directory (None: not set; the builder refuses it).
        engine: registered engine name.
        model: GGUF path, a shipped model name (``planner``, ``planner-draft``,
            ``planner-inflated-<preset>``) or, for the sim engine, a shape preset; None: the
            bundled planner (sim: the builder's default preset).
        quant: quant level: of a GGUF, its ladder level (built on first use); of a preset, the
            quant simulated.
        profile: planner profile, shipped name or YAML path (None: ``bundled-actions``).
        draft_model: draft GGUF for speculative decoding (llamacpp only).
        draft_k: tokens drafted per round (0: the engine's default).
        mmproj: a vision tower (mmproj GGUF) beside the model (llamacpp only): each cycle's
            camera frame is encoded and kept in the KV cache (engines/llama_image.py).
        image_policy: with a vision tower, what a cycle does with its frame
            (:mod:`robot_latency.planner.frame_policy`): ``reuse`` (an unchanged frame stays in
            the KV cache), ``every`` (encoded every cycle) or ``fit`` (reuse, and a new frame
            downscaled, else left out, to fit what is left of the budget).
        frame_scale: ``reuse`` and ``every`` downscale each frame by this first, in (0, 1]
            (1: as taken): the image resolution a sweep compares.
        vision_encoder: with a vision tower, what encodes the frame (:data:`VISION_ENCODERS`):
            ``clip`` (llama.cpp's, through libmtmd) or ``onnx`` (the tower's ONNX export on ONNX
            Runtime; :mod:`robot_latency.engines.vision_onnx`).
        target_device: the device the predictions are for (the sim engine simulates it).
        n_threads: decode threads (0: the builder's default).
        n_threads_batch: prefill threads (0: the builder's default).
        n_gpu_layers: layers on the GPU (-1: all).
        engine_options: further engine options (override everything above).
        engine_family: the engine family whose calibrated prediction the target gets (the
            sim engine simulates it); None: the sim engine's fixed efficiency, and predictions
            for the llamacpp-cuda family in the records.
        calibration: a calibration file for that family on the target (from ``calibrate``).
        cpu: cores and priorities of the loop and the engine worker (see
            :mod:`robot_latency.planner.budget`).
        runner: ``process`` (engine in a worker process: the loop cannot be held by it) or
            ``inline`` (same thread; for the simulated engine under a scripted clock).
        label: a short name for comparisons (None: derived by the builder).
        hang_timeout_ms: watchdog for a generation still running past its give-up time.
        fsync: fsync the cycle log after every record (survives power loss; costs time).
        extra: anything else to record in the manifest (e.g. the stream replayed).
        server_url: the OpenAI-compatible server (engines ``openai`` and ``hybrid``).
        server_model: the model name to ask it for (empty: the first it lists).
        server_api: ``completions`` or ``chat``.
        hybrid_policy: one of :data:`HYBRID_POLICIES` (engine ``hybrid``).
    """

    period_ms: float = 200.0
    deadline_ms: float = 150.0
    mode: str = "periodic"
    publish_margin_ms: float = 2.0
    max_tokens: int = 0
    max_command_chars: int = 512
    fallback: tuple[str, ...] = field(default=("rule", "hold", "stop"))
    hold_max_age_ms: float = 1000.0
    mailbox_capacity: int = 16
    grammar: bool = True
    transport_margin_ms: float = 0.0
    transport_margin_floor_ms: float = 1.0
    transport_margin_cap_ms: float = 100.0
    on_new_command: str = "queue"
    log_dir: Path | None = None
    engine: str = DEFAULT_ENGINE
    model: str | None = None
    quant: str | None = None
    profile: str | None = None
    draft_model: str | None = None
    draft_k: int = 0
    mmproj: str | None = None
    image_policy: str = "reuse"
    frame_scale: float = 1.0
    vision_encoder: str = "clip"
    target_device: str = DEFAULT_TARGET_DEVICE
    n_threads: int = 0
    n_threads_batch: int = 0
    n_gpu_layers: int = 0
    engine_options: dict[str, Any] = field(default_factory=dict)
    engine_family: str | None = None
    calibration: str | None = None
    cpu: CpuBudget = field(default_factory=CpuBudget)
    runner: str = "process"
    label: str | None = None
    hang_timeout_ms: float = DEFAULT_HANG_TIMEOUT_MS
    fsync: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    server_url: str = ""
    server_model: str = ""
    server_api: str = "completions"
    hybrid_policy: str = "first_valid"

    def __post_init__(self) -> None:
        object.__setattr__(self, "fallback", tuple(self.fallback))
        if self.log_dir is not None and not isinstance(self.log_dir, Path):
            object.__setattr__(self, "log_dir", Path(self.log_dir))
        for name, why in _problems(self):
            raise SettingsError(name, f"{getattr(self, name)!r}: {why}")

    @property
    def period_ns(self) -> int:
        """The period in ns."""
        return round(self.period_ms * 1e6)

    @property
    def deadline_ns(self) -> int:
        """The deadline in ns from the scheduled start."""
        return round(self.deadline_ms * 1e6)

    def publish_margin_settings(self) -> MarginSettings:
        """The publish margin's settings, fixed or learned (:mod:`robot_latency.planner.margin`)."""
        return publish_margin_settings(self.publish_margin_ms, self.deadline_ms)

    def margin_settings(self) -> MarginSettings:
        """The transport margin's settings (see :mod:`robot_latency.planner.margin`)."""
        cap_ms = min(self.transport_margin_cap_ms,
                     (self.deadline_ms - max(0.0, self.publish_margin_ms)) / 4)
        return MarginSettings(fixed_ms=self.transport_margin_ms,
                              floor_ms=self.transport_margin_floor_ms, cap_ms=cap_ms,
                              start_ms=min(TRANSPORT_START_MS, cap_ms))

    def loop_config(self) -> dict[str, Any]:
        """Return the loop's settings (the manifest's ``config``)."""
        return {name: _plain(getattr(self, name)) for name in LOOP_FIELDS}


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _problems(s: RunSettings) -> list[tuple[str, str]]:
    """Return (field, why) for every value that cannot be used, in field order."""
    out: list[tuple[str, str]] = []

    def need(ok: bool, name: str, why: str) -> None:
        if not ok:
            out.append((name, why))

    need(s.period_ms > 0, "period_ms", "must be > 0")
    need(s.deadline_ms > 0, "deadline_ms", "must be > 0")
    # In event mode each command starts its own cycle: there is no period to fit into.
    need(not (s.mode == "periodic" and s.deadline_ms > s.period_ms), "deadline_ms",
         f"must not exceed period_ms={s.period_ms!r}")
    need(s.mode in MODES, "mode", f"must be one of {MODES}")
    need(s.publish_margin_ms < s.deadline_ms, "publish_margin_ms",
         "must be below deadline_ms (< 0: learned)")
    need(s.max_tokens >= 0, "max_tokens", "must be >= 1, or 0 for the planner profile's")
    need(s.max_command_chars >= 1, "max_command_chars", "must be >= 1")
    need(bool(s.fallback) and all(p in FALLBACK_NAMES for p in s.fallback), "fallback",
         f"must be a non-empty sequence of {FALLBACK_NAMES}")
    need(s.hold_max_age_ms >= 0, "hold_max_age_ms", "must be >= 0")
    need(s.mailbox_capacity >= 1, "mailbox_capacity", "must be >= 1")
    need(0 <= s.transport_margin_floor_ms <= s.transport_margin_cap_ms,
         "transport_margin_floor_ms",
         f"must be >= 0 and <= transport_margin_cap_ms={s.transport_margin_cap_ms!r}")
    need(max(0.0, s.publish_margin_ms) + max(0.0, s.transport_margin_ms) < s.deadline_ms,
         "transport_margin_ms",
         f"plus publish_margin_ms must stay below deadline_ms={s.deadline_ms!r}")
    need(s.on_new_command in ON_NEW_COMMAND, "on_new_command",
         f"must be one of {ON_NEW_COMMAND}")
    need(bool(s.engine.strip()), "engine", "must not be empty")
    need(s.image_policy in FRAME_POLICIES, "image_policy", f"must be one of {FRAME_POLICIES}")
    need(0 < s.frame_scale <= 1, "frame_scale", "must be in (0, 1]")
    need(s.vision_encoder in VISION_ENCODERS, "vision_encoder",
         f"must be one of {VISION_ENCODERS}")
    need(s.vision_encoder == VISION_ENCODERS[0] or bool(s.mmproj), "vision_encoder",
         "only with mmproj (a vision tower) set")
    need(s.draft_k >= 0, "draft_k", "must be >= 0 (0: the engine's default)")
    need(s.n_threads >= 0, "n_threads", "must be >= 0 (0: the default)")
    need(s.n_threads_batch >= 0, "n_threads_batch", "must be >= 0 (0: the default)")
    need(s.n_gpu_layers >= -1, "n_gpu_layers", "must be >= -1 (-1: all)")
    need(s.runner in RUNNERS, "runner", f"must be one of {RUNNERS}")
    need(s.hang_timeout_ms > 0, "hang_timeout_ms", "must be > 0")
    need(s.server_api in SERVER_APIS, "server_api", f"must be one of {SERVER_APIS}")
    need(s.hybrid_policy in HYBRID_POLICIES, "hybrid_policy",
         f"must be one of {HYBRID_POLICIES}")
    return out


_NAMES = [f.name for f in fields(RunSettings)]
#: The fields the loop reads (the manifest's ``config``), in order: the first ones, up to
#: ``on_new_command``.
LOOP_FIELDS: tuple[str, ...] = tuple(_NAMES[: _NAMES.index("on_new_command") + 1])
