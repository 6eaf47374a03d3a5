"""One builder for a run's settings: the CLI (``run``, ``sweep``, ``demo``) and the ROS node
(``planner_node``) call :func:`build_run_config`, so the same inputs give the same engine settings
whatever the front end.

Thread defaults (llama.cpp's ``n_threads`` for decode, ``n_threads_batch`` for prefill):

- decode: one thread per core the engine has to itself: the cores left after ``loop_cpus`` when
  the loop is pinned, else all cores but one. Decode threads meet at a barrier every token, so
  one thread that loses its core stalls the token: decode never shares the loop's core.
- prefill: every core the engine worker may run on. With the loop pinned on the normal scheduler
  the worker is kept off the loop's core, so that is the engine's own cores. Unpinned, or with the
  loop under SCHED_FIFO (which preempts the engine the moment it wakes), it is every core: the
  loop sleeps through most of a prefill, and a 2-core machine prefilled the demo's prompts in
  93 ms p50 with 2 threads against 164 ms with 1 (docs/BENCHMARKS.md, "Thread defaults").
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from robot_latency.planner.budget import CpuBudget, available_cpus
from robot_latency.planner.config import ConfigError, PlannerConfig
from robot_latency.planner.session import RunConfig

log = logging.getLogger(__name__)

#: Floor-model preset and quant the simulated engine runs when none is given.
SIM_DEFAULT_MODEL = "qwen2.5-0.5b"
SIM_DEFAULT_QUANT = "Q4_K_M"


class SettingsError(ConfigError):
    """Settings that cannot go together; the message starts with the setting's name."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"{name}: {message}")
        self.name = name


@dataclass(frozen=True)
class RunSpec:
    """What a front end was asked for; :func:`build_run_config` turns it into a RunConfig.

    Args:
        planner: the loop's configuration.
        log_dir: the run directory.
        engine: registered engine name.
        model: GGUF path, a shipped model name (``planner``, ``planner-draft``,
            ``planner-inflated-<preset>``) or, for the sim engine, a shape preset; None: the
            bundled planner (sim: :data:`SIM_DEFAULT_MODEL`).
        quant: quant level: of a GGUF, its ladder level (built on first use); of a preset, the
            quant simulated.
        profile: planner profile, shipped name or YAML path (None: ``bundled-actions``).
        draft_model: draft GGUF for speculative decoding (llamacpp only).
        draft_k: tokens drafted per round (0: the engine's default).
        target_device: the device the predictions are for (the sim engine simulates it).
        n_threads: decode threads (0: the default above).
        n_threads_batch: prefill threads (0: the default above).
        n_gpu_layers: layers on the GPU (-1: all).
        engine_options: further engine options (override everything above).
        engine_family: the engine family whose calibrated prediction the target gets (the
            sim engine simulates it); None: the sim engine's fixed efficiency, and predictions
            for the llamacpp-cuda family in the records.
        calibration: a calibration file for that family on the target (from ``calibrate``).
        cpu: the CPU budget.
        runner, label, hang_timeout_ms, fsync, extra: as in :class:`RunConfig`.
        server_url: the OpenAI-compatible server (engines ``openai`` and ``hybrid``).
        server_model: the model name to ask it for (empty: the first it lists).
        server_api: ``completions`` or ``chat``.
        hybrid_policy: ``first_valid`` or ``prefer_server`` (engine ``hybrid``).
    """

    planner: PlannerConfig
    log_dir: Path
    engine: str = "llamacpp"
    model: str | None = None
    quant: str | None = None
    profile: str | None = None
    draft_model: str | None = None
    draft_k: int = 0
    target_device: str = "orin-nano-8gb"
    n_threads: int = 0
    n_threads_batch: int = 0
    n_gpu_layers: int = 0
    engine_options: dict[str, Any] = field(default_factory=dict)
    engine_family: str | None = None
    calibration: str | None = None
    cpu: CpuBudget = field(default_factory=CpuBudget)
    runner: str = "process"
    label: str | None = None
    hang_timeout_ms: float = 1000.0
    fsync: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    server_url: str = ""
    server_model: str = ""
    server_api: str = "completions"
    hybrid_policy: str = "first_valid"


#: Engines that ask an OpenAI-compatible server.
SERVER_ENGINES = ("openai", "hybrid")


def server_options(spec: RunSpec) -> dict[str, Any]:
    """Return the ``openai`` engine's options for a spec.

    Raises:
        SettingsError: no server URL, or an unknown API.
    """
    from robot_latency.engines.openai_server import SERVER_APIS

    if not spec.server_url:
        raise SettingsError("server_url", f"the {spec.engine} engine needs a server URL "
                                          "(e.g. http://127.0.0.1:8000/v1)")
    if spec.server_api not in SERVER_APIS:
        raise SettingsError("server_api", f"{spec.server_api!r}: must be one of {SERVER_APIS}")
    return {"server_url": spec.server_url, "server_model": spec.server_model,
            "server_api": spec.server_api, "profile": spec.profile,
            "grammar": spec.planner.grammar}


def thread_defaults(cpu: CpuBudget, *, cores: frozenset[int] | None = None) -> tuple[int, int]:
    """Return the default (decode, prefill) thread counts for a CPU budget (module docstring)."""
    have = available_cpus() if cores is None else cores
    n = max(1, len(have))
    if cpu.engine_cpus:
        own = len(cpu.engine_cpus)
        return own, own
    if cpu.loop_cpus:
        own = max(1, len(have - set(cpu.loop_cpus)))
        return own, (n if cpu.loop_priority > 0 else own)
    return max(1, n - 1), n


def resolve_model_file(model: str | None, quant: str | None) -> str | None:
    """Return the GGUF to load for a model name or path and a quant level.

    A path is used as it is (with ``quant``: its ladder level, built on first use); ``planner``,
    ``planner-draft`` and ``planner-inflated-<preset>`` are the shipped models.
    """
    from robot_latency.models.ladder import INFLATED_PREFIX, ladder_model_path

    bundled_names = (None, "", "planner", "planner-draft")
    named = model in bundled_names or (model is not None and model.startswith(INFLATED_PREFIX))
    if quant is None and not named:
        return model
    if quant is None and model in bundled_names:
        from robot_latency.models.bundled import bundled_model_path

        return str(bundled_model_path(model or "planner"))
    return str(ladder_model_path(model, quant or "F16"))


def build_run_config(spec: RunSpec, *, cores: frozenset[int] | None = None
                     ) -> tuple[RunConfig, list[str]]:
    """Build the run's configuration; return it with notes on the defaults that were taken.

    Raises:
        SettingsError: settings that cannot go together (a draft for an engine that takes none,
            a profile an engine cannot follow); the message names the setting.
        ProfileError: the profile cannot be loaded.
    """
    from robot_latency.plan.profile import load_planning

    notes: list[str] = []
    planning = load_planning(spec.profile)
    profile = planning.profile
    engine = spec.engine
    if spec.draft_model and engine != "llamacpp":
        # A comparison labelled "with draft" that ran without one would mislead; refuse.
        raise SettingsError("draft_model", f"only the llamacpp engine takes a draft model, "
                                           f"not {engine!r}")
    if spec.draft_k and not spec.draft_model:
        raise SettingsError("draft_k", "needs a draft model")
    options: dict[str, Any] = {}
    if engine == "hybrid":
        from robot_latency.planner.hybrid import HYBRID_POLICIES

        if spec.hybrid_policy not in HYBRID_POLICIES:
            raise SettingsError("hybrid_policy", f"{spec.hybrid_policy!r}: must be one of "
                                                 f"{HYBRID_POLICIES}")
    if engine == "openai":
        options = server_options(spec)
        model, quant, host_device = None, None, "auto"
    elif engine == "sim":
        if profile.output.contract != "actions":
            raise SettingsError("profile", f"{profile.name!r}: the sim engine answers in the "
                                           "bundled action language only; use a profile with "
                                           "output.contract: actions")
        # The simulated engine predicts the target device: it runs "on" it.
        model = spec.model or SIM_DEFAULT_MODEL
        quant = spec.quant or SIM_DEFAULT_QUANT
        options = {"device": spec.target_device, "model": model, "quant": quant}
        if spec.engine_family:
            options.update(engine_family=spec.engine_family, calibration=spec.calibration or "")
        host_device = spec.target_device
        for name in ("n_threads", "n_threads_batch", "n_gpu_layers"):
            if getattr(spec, name):
                notes.append(f"{name} is ignored by the sim engine")
    else:
        if engine == "onnx" and profile.output.contract == "json" and profile.output.grammar:
            raise SettingsError("profile", f"{profile.name!r}: the onnx engine cannot constrain "
                                           "decoding to a JSON Schema (it implements the bundled "
                                           "action grammar only); use the llamacpp engine, or "
                                           "set output.grammar: false in the profile")
        model_path = resolve_model_file(spec.model, spec.quant) \
            if engine in ("llamacpp", "hybrid") else spec.model
        if model_path:
            options["model_path"] = model_path
        model, quant = model_path, None
        host_device = "auto"  # the detected Jetson's profile, else the probed host
        decode, prefill = thread_defaults(spec.cpu, cores=cores)
        if engine in ("llamacpp", "hybrid"):
            options["n_threads"] = spec.n_threads or decode
            options["n_threads_batch"] = spec.n_threads_batch or max(prefill,
                                                                     options["n_threads"])
            if spec.n_gpu_layers:
                options["n_gpu_layers"] = spec.n_gpu_layers
            if spec.draft_model:
                if not Path(spec.draft_model).is_file():
                    raise SettingsError("draft_model", f"{spec.draft_model}: no such file")
                options.update(draft="model",
                               draft_model_path=str(Path(spec.draft_model).resolve()))
                if spec.draft_k:
                    options["draft_k"] = spec.draft_k
            if planning.prefix:
                options["warm_prefix"] = planning.prefix
                options["max_suffix_tokens"] = planning.longest_suffix_chars(
                    spec.planner.max_command_chars)
                options["max_new_tokens"] = spec.planner.max_tokens or planning.max_tokens
        elif engine == "onnx":
            options["intra_op_threads"] = spec.n_threads or decode
    options.update(spec.engine_options)
    if engine == "hybrid":
        # The onboard engine (llama.cpp, in its worker process) and the server, raced.
        options = {"onboard_engine": "llamacpp", "onboard": options,
                   "server": server_options(spec), "hybrid_policy": spec.hybrid_policy}
    label = spec.label or " ".join(str(x) for x in (
        engine, Path(str(model)).name if model else None, quant,
        None if profile.name == "bundled-actions" else profile.name,
        spec.target_device, f"{spec.planner.deadline_ms:g}ms") if x)
    if engine in SERVER_ENGINES and not spec.label:
        from urllib.parse import urlsplit

        label += f" @{urlsplit(spec.server_url).netloc}"
        if engine == "hybrid":
            label += f" {spec.hybrid_policy}"
    if options.get("draft") == "model" and not spec.label:
        label += f" +draft {Path(options['draft_model_path']).name}"
    run = RunConfig(planner=spec.planner, log_dir=Path(spec.log_dir), engine=engine,
                    engine_options=options, runner=spec.runner, model=model, quant=quant,
                    host_device=host_device, target_device=spec.target_device, label=label,
                    cpu=spec.cpu, hang_timeout_ms=spec.hang_timeout_ms, fsync=spec.fsync,
                    profile=spec.profile or profile.name, engine_family=spec.engine_family,
                    calibration=spec.calibration, extra=dict(spec.extra))
    return run, notes


def with_log_dir(run: RunConfig, log_dir: Path, label: str | None = None) -> RunConfig:
    """Return ``run`` writing to another directory (a sweep's points)."""
    return replace(run, log_dir=log_dir, label=label or run.label)
