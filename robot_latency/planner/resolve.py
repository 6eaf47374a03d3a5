"""The builder between what the user sets and the run: :func:`resolve_run` turns a
:class:`~robot_latency.planner.config.RunSettings` into a :class:`ResolvedRun` (engine options,
model file, host device, label, and the planner profile loaded, once). The CLI (``run``,
``sweep``, ``fleet``), both ROS nodes (through :mod:`robot_latency.ros.params`) and the demo
(through the node) call it, so the same inputs give the same engine settings whatever the front
end. A sweep point is ``dataclasses.replace(settings, ...)`` then the builder.

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from robot_latency.planner.budget import CpuBudget, available_cpus
from robot_latency.planner.config import RunSettings, SettingsError
from robot_latency.profiles.profile import Planning, load_planning

log = logging.getLogger(__name__)

#: Floor-model preset and quant the simulated engine runs when none is given.
SIM_DEFAULT_MODEL = "qwen2.5-0.5b"
SIM_DEFAULT_QUANT = "Q4_K_M"


@dataclass(frozen=True)
class ResolvedRun:
    """A run, resolved: the settings as given, and what the builder made of them.

    Args:
        settings: what the user set.
        planning: the planner profile, loaded (nothing downstream loads it again).
        engine_options: keyword options for the engine (picklable: sent to the worker).
        model: GGUF path or shape preset the floor predictions are made for (None: none).
        quant: quant type when ``model`` is a preset.
        host_device: profile id of the machine running the engine (``auto``: the detected
            Jetson's, else the probed host).
        label: a short name for comparisons (e.g. ``Q4_K_M``).
    """

    settings: RunSettings
    planning: Planning
    engine_options: dict[str, Any] = field(default_factory=dict)
    model: str | None = None
    quant: str | None = None
    host_device: str = "host"
    label: str | None = None

    # --- the settings callers read most ------------------------------------------------------
    @property
    def engine(self) -> str:
        """The engine's registered name."""
        return self.settings.engine

    @property
    def log_dir(self) -> Path:
        """The run directory."""
        assert self.settings.log_dir is not None  # the builder refuses a run without one
        return self.settings.log_dir

    @property
    def runner(self) -> str:
        """``process`` or ``inline``."""
        return self.settings.runner

    @property
    def cpu(self) -> CpuBudget:
        """The CPU budget."""
        return self.settings.cpu

    @property
    def target_device(self) -> str:
        """The device predicted for."""
        return self.settings.target_device


#: Engines that ask an OpenAI-compatible server.
SERVER_ENGINES = ("openai", "hybrid")


def server_options(spec: RunSettings) -> dict[str, Any]:
    """Return the ``openai`` engine's options for the settings.

    Raises:
        SettingsError: no server URL.
    """
    if not spec.server_url:
        raise SettingsError("server_url", f"the {spec.engine} engine needs a server URL "
                                          "(e.g. http://127.0.0.1:8000/v1)")
    return {"server_url": spec.server_url, "server_model": spec.server_model,
            "server_api": spec.server_api, "profile": spec.profile, "grammar": spec.grammar}


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
    ``planner-draft``, ``planner-json``, ``planner-inflated-<preset>`` and
    ``planner-json-inflated-<preset>`` are the shipped models.
    """
    from robot_latency.models.ladder import inflated_preset, ladder_model_path

    bundled_names = (None, "", "planner", "planner-draft", "planner-json")
    named = model in bundled_names or (model is not None and inflated_preset(model) is not None)
    if quant is None and not named:
        return model
    if quant is None and model in bundled_names:
        from robot_latency.models.bundled import bundled_model_path

        return str(bundled_model_path(model or "planner"))
    return str(ladder_model_path(model, quant or "F16"))


def resolve_run(spec: RunSettings, *, cores: frozenset[int] | None = None
                ) -> tuple[ResolvedRun, list[str]]:
    """Resolve the run; return it with notes on the defaults that were taken.

    Raises:
        SettingsError: no log directory, a profile that cannot be loaded, settings that cannot
            go together (a draft for an engine that takes none, a profile an engine cannot
            follow); ``name`` is the setting.
        RobotLatencyError: a model level that cannot be built.
    """
    from robot_latency.profiles.profile import ProfileError

    notes: list[str] = []
    if spec.log_dir is None:
        raise SettingsError("log_dir", "must be set")
    try:
        planning = load_planning(spec.profile)
    except ProfileError as err:
        raise SettingsError("profile", str(err)) from err
    profile = planning.profile
    engine = spec.engine
    if spec.draft_model and engine != "llamacpp":
        # A comparison labelled "with draft" that ran without one would mislead; refuse.
        raise SettingsError("draft_model", f"only the llamacpp engine takes a draft model, "
                                           f"not {engine!r}")
    if spec.draft_k and not spec.draft_model:
        raise SettingsError("draft_k", "needs a draft model")
    if spec.mmproj and engine != "llamacpp":
        raise SettingsError("mmproj", f"only the llamacpp engine takes a vision tower, not "
                                      f"{engine!r}")
    options: dict[str, Any] = {}
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
            if spec.mmproj:
                if not Path(spec.mmproj).is_file():
                    raise SettingsError("mmproj", f"{spec.mmproj}: no such file")
                options["mmproj_path"] = str(Path(spec.mmproj).resolve())
                options["vision_encoder"] = spec.vision_encoder
            if planning.prefix:
                options["warm_prefix"] = planning.prefix
                options["max_suffix_tokens"] = planning.longest_suffix_chars(
                    spec.max_command_chars)
                options["max_new_tokens"] = spec.max_tokens or planning.max_tokens
        elif engine == "onnx":
            options["intra_op_threads"] = spec.n_threads or decode
    options.update(spec.engine_options)
    if engine == "sim":
        host_device = options["device"]  # the device it simulates, an option may change it
    if engine == "hybrid":
        # The onboard engine (llama.cpp, in its worker process) and the server, raced.
        options = {"onboard_engine": "llamacpp", "onboard": options,
                   "server": server_options(spec), "hybrid_policy": spec.hybrid_policy}
    label = spec.label or " ".join(str(x) for x in (
        engine, Path(str(model)).name if model else None, quant,
        None if profile.name == "bundled-actions" else profile.name,
        spec.target_device, f"{spec.deadline_ms:g}ms") if x)
    if engine in SERVER_ENGINES and not spec.label:
        from urllib.parse import urlsplit

        label += f" @{urlsplit(spec.server_url).netloc}"
        if engine == "hybrid":
            label += f" {spec.hybrid_policy}"
    if options.get("draft") == "model" and not spec.label:
        label += f" +draft {Path(options['draft_model_path']).name}"
    run = ResolvedRun(settings=spec, planning=planning, engine_options=options, model=model,
                      quant=quant, host_device=host_device, label=label)
    return run, notes
