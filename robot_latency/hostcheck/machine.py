"""The doctor's checks of the machine: the Jetson module and its clocks, the rtprio limit and the
CPUs the params file needs, free memory against the model, the user cache, and a finished run's
late fallbacks."""

from __future__ import annotations

import json
import os
import resource
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil

from robot_latency.floor.jetson import JetsonInfo, detect_jetson
from robot_latency.hostcheck.findings import FAIL, OK, WARN, Check, DoctorError, DoctorInput

__all__ = [
    "check_cache",
    "check_cpus",
    "check_jetson",
    "check_jetson_clocks",
    "check_memory",
    "check_rtprio",
    "check_run",
]

#: Devfreq node suffixes of Jetson GPUs (JetPack 5: ga10b, JetPack 6: gpu).
_GPU_DEVFREQ = ("ga10b", "gpu", "gv11b", "gp10b")
#: Beyond the model file: KV cache, the engine process, the loop, ROS (bytes).
_MEMORY_HEADROOM_BYTES = 512 * 2**20


# --- Jetson -----------------------------------------------------------------------------------
def check_jetson(root: Path) -> tuple[list[Check], JetsonInfo | None]:
    """The module, its floor datasheet and the nvpmodel power mode."""
    info = detect_jetson(root)
    if info is None:
        return [Check("jetson", OK, "not a Jetson; floor predictions for a target use "
                                    "--device / target_device")], None
    checks = []
    if info.device_id is None:
        checks.append(Check("jetson", WARN, f"unknown Jetson module {info.model_string!r} "
                                            f"(part {info.module})",
                            "set target_device (or --device) to the closest id from "
                            "`robot-latency devices`"))
    else:
        checks.append(Check("jetson", OK, f"{info.model_string} (part {info.module}): "
                                          f"datasheet {info.device_id}"))
    if info.power_mode is None:
        checks.append(Check("power mode", WARN,
                            "nvpmodel mode unreadable (/var/lib/nvpmodel/status, "
                            "/etc/nvpmodel.conf); records will not name it",
                            "sudo nvpmodel -q  (and check that nvpmodel.service runs)"))
    elif not info.power_mode.startswith("MAXN"):
        checks.append(Check("power mode", WARN,
                            f"nvpmodel mode {info.power_mode_id} ({info.power_mode}) caps the "
                            f"clocks; predictions use {info.device_id}",
                            "sudo nvpmodel -m 0  (MAXN) for the fastest planner, or keep the "
                            "mode and compare against its datasheet"))
    else:
        checks.append(Check("power mode", OK, f"nvpmodel mode {info.power_mode_id} "
                                              f"({info.power_mode})"))
    return checks, info


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def check_jetson_clocks(root: Path) -> Check:
    """jetson_clocks pins the GPU's devfreq minimum to its maximum; else clocks ramp per load."""
    devfreq = root / "sys" / "class" / "devfreq"
    nodes = sorted(p for p in devfreq.glob("*") if p.name.rsplit(".", 1)[-1] in _GPU_DEVFREQ)
    for node in nodes:
        low, high = _read_int(node / "min_freq"), _read_int(node / "max_freq")
        if low is None or high is None:
            continue
        if low >= high:
            return Check("jetson_clocks", OK, f"GPU clock pinned at {high / 1e6:.0f} MHz "
                                              f"({node.name})")
        return Check("jetson_clocks", WARN,
                     f"GPU clock scales {low / 1e6:.0f}-{high / 1e6:.0f} MHz with load "
                     f"({node.name}): the first tokens after idle run at a low clock",
                     "sudo jetson_clocks  (pins CPU, GPU and EMC clocks at the mode's maximum)")
    return Check("jetson_clocks", WARN, f"no GPU devfreq node under {devfreq}",
                 "run as a user who can read /sys/class/devfreq, or check the L4T install")


# --- the params file against this machine ------------------------------------------------------
def check_rtprio(params: dict[str, Any]) -> Check:
    """loop_priority needs an RLIMIT_RTPRIO at least that high (or root)."""
    wanted = int(params.get("loop_priority", 0) or 0)
    soft, _ = resource.getrlimit(resource.RLIMIT_RTPRIO)
    limit = "unlimited" if soft == resource.RLIM_INFINITY else str(soft)
    if wanted <= 0:
        return Check("rtprio", OK, f"loop_priority 0 (normal scheduler); rtprio limit {limit}")
    if os.geteuid() == 0 or soft == resource.RLIM_INFINITY or soft >= wanted:
        return Check("rtprio", OK, f"loop_priority {wanted} within the rtprio limit {limit}")
    user = os.environ.get("USER", "$USER")
    return Check("rtprio", FAIL, f"loop_priority {wanted} but this user's rtprio limit is {limit}",
                 f'echo "{user} - rtprio 60" | sudo tee /etc/security/limits.d/'
                 "robot_latency.conf  (then log in again), or set loop_priority: 0")


def check_cpus(params: dict[str, Any]) -> Check:
    """The params file's loop_cpus and engine_cpus exist here."""
    from robot_latency.planner.budget import available_cpus, parse_cpu_list

    have = available_cpus()
    try:
        loop = parse_cpu_list(params.get("loop_cpus", ""))
        engine = parse_cpu_list(params.get("engine_cpus", ""))
    except ValueError as err:
        raise DoctorError(f"params file: loop_cpus/engine_cpus: {err}") from err
    detail = f"{len(have)} CPUs usable here ({_cpu_text(have)}); loop_cpus " \
             f"{_cpu_text(loop) or 'not pinned'}, engine_cpus {_cpu_text(engine) or 'the rest'}"
    missing = sorted((set(loop) | set(engine)) - have)
    if missing:
        return Check("cpus", FAIL, detail + f": CPU {_cpu_text(missing)} not available",
                     f"set loop_cpus/engine_cpus within {_cpu_text(have)} (\"\": not pinned)")
    if loop and not engine and not (have - set(loop)):
        return Check("cpus", FAIL, detail + ": no CPU left for the engine",
                     "leave at least one CPU out of loop_cpus")
    if set(loop) & set(engine):
        return Check("cpus", WARN, detail + ": the loop shares a CPU with the engine",
                     "give the loop a CPU of its own")
    if not loop and len(have) > 1 and not int(params.get("loop_priority", 0) or 0):
        # The engine computes on every core: the loop's wake-up at the deadline waits for one,
        # and a fallback goes out late (measured: 0.1-3.5 ms on two busy cores).
        return Check("cpus", WARN, detail + ": the loop is not pinned and runs on the normal "
                     "scheduler, so the engine can delay its publish at the deadline",
                     "loop_cpus: 0 (--loop-cpus 0), and loop_priority: 50 where rtprio "
                     "allows; config/*.yaml pin CPU 0")
    return Check("cpus", OK, detail)


def check_run(run_dir: Path) -> Check:
    """A finished run's late plans (fallbacks published past the deadline), by its CPU budget."""
    from robot_latency.records import RecordError, read_records

    try:
        manifest = json.loads((run_dir / "manifest.json").read_text(encoding="utf-8"))
        records = read_records(run_dir / "cycles.jsonl")
    except (OSError, ValueError, RecordError) as err:
        raise DoctorError(f"--run {run_dir}: cannot read the run: {err}") from err
    budget = manifest.get("cpu_budget") or {}
    pinned = bool(budget.get("loop_cpus")) or int(budget.get("loop_priority") or 0) > 0
    late = [r.overshoot_ns / 1e6 for r in records
            if r.plan_source == "fallback" and r.overshoot_ns]
    n_fb = sum(1 for r in records if r.plan_source == "fallback")
    where = f"run {run_dir.name}: {len(late)} of {n_fb} fallbacks published late"
    if not late:
        return Check("late fallbacks", OK, where)
    detail = f"{where} (by {min(late):.2f}-{max(late):.2f} ms)"
    if not pinned:
        return Check("late fallbacks", WARN, detail + " with the loop unpinned on the normal "
                     "scheduler", "run with --loop-cpus 0 (loop_cpus: 0), and loop_priority "
                     "50 where rtprio allows")
    return Check("late fallbacks", WARN, detail + " with the loop pinned",
                 "raise publish_margin_ms above the lateness, or use loop_priority (SCHED_FIFO)")


def _cpu_text(cpus: Sequence[int] | frozenset[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


def _model_file(inp: DoctorInput, params: dict[str, Any]) -> Path | None:
    model = _named_model(inp, params)
    quant = inp.quant or str(params.get("quant", "") or "") or None
    if quant is None or model is None:
        return model
    # A ladder level (run --quant): the built level's file, where run loads it from; before it
    # is built, the source (larger than any of its levels) stands in.
    from robot_latency.models.ladder import (
        VALID_QUANTS,
        LadderError,
        default_cache_dir,
        level_path,
    )

    stem, _, suffix = model.stem.rpartition(".")
    name = stem if stem and suffix.upper() in VALID_QUANTS else model.stem
    try:
        level = level_path(inp.cache_dir or default_cache_dir(), name, quant)
    except LadderError as err:
        raise DoctorError(f"quant: {err}") from err
    return level if level.is_file() else model


def _named_model(inp: DoctorInput, params: dict[str, Any]) -> Path | None:
    if inp.model is not None:
        return inp.model
    named = str(params.get("model", "") or "")
    if named.endswith((".gguf", ".onnx")):
        return Path(named).expanduser()
    if str(params.get("engine", "llamacpp")) == "sim":
        return None
    from robot_latency.models.bundled import BundledModelError, bundled_model_path

    try:
        return bundled_model_path("planner")
    except BundledModelError:
        return None


def check_memory(inp: DoctorInput, params: dict[str, Any]) -> Check:
    """Available memory against the model file (Jetson memory is shared with the GPU)."""
    model = _model_file(inp, params)
    available = psutil.virtual_memory().available
    if model is None:
        return Check("memory", OK, f"{available / 2**30:.1f} GiB available (sim engine: no model)")
    if not model.is_file():
        return Check("memory", FAIL, f"model {model}: no such file",
                     "set model to an existing GGUF (or '' for the bundled planner)")
    size = model.stat().st_size
    detail = f"{available / 2**30:.2f} GiB available for {model.name} " \
             f"({size / 2**20:.1f} MiB)"
    if available < size:
        return Check("memory", FAIL, detail, "a smaller quant (robot-latency models build), or "
                                             "stop other processes")
    if available < size + _MEMORY_HEADROOM_BYTES:
        return Check("memory", WARN, detail + ": under 512 MiB left for the KV cache and ROS",
                     "a smaller quant, or free memory")
    return Check("memory", OK, detail)


def check_cache(cache_dir: Path | None) -> Check:
    """The model cache (quant ladder, ONNX exports, host probe) exists or can be made, writable."""
    from robot_latency.models.ladder import default_cache_dir

    cache = cache_dir if cache_dir is not None else default_cache_dir()
    fix = "export ROBOT_LATENCY_CACHE_DIR=<a writable directory>"
    probe = cache
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        return Check("cache", FAIL, f"{cache}: {probe} is not a writable directory", fix)
    if not cache.exists():
        return Check("cache", OK, f"{cache} (created on first use)")
    used = sum(p.stat().st_size for p in cache.rglob("*") if p.is_file() and not p.is_symlink())
    free = psutil.disk_usage(str(cache)).free
    detail = f"{cache}: {used / 2**20:.0f} MiB used, {free / 2**30:.1f} GiB free on its disk"
    if free < 2 * 2**30:
        return Check("cache", WARN, detail + " (a quant ladder of a 0.5B model needs ~2 GiB)",
                     fix)
    return Check("cache", OK, detail)
