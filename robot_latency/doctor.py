"""Check the machine the planner is about to run on: each finding is OK, WARN or FAIL with its fix.

What it looks at, in order: the Jetson module and nvpmodel power mode, the jetson_clocks state, the
ROS 2 distro and rclpy, llama.cpp's GPU offload and backend, the ONNX Runtime providers that can
start, the rtprio limit the params file's ``loop_priority`` needs, the CPUs the params file pins,
free memory against the model's size, and the user cache. Device files are read under ``root``
(``/`` on a real machine, a fixture tree in tests); nothing is changed.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil
import yaml

from robot_latency.errors import RobotLatencyError
from robot_latency.floor.jetson import JetsonInfo, detect_jetson

log = logging.getLogger(__name__)

OK, WARN, FAIL = "OK", "WARN", "FAIL"
#: The ROS 2 distros the project supports (Humble on JetPack 6 through Kilted, and rolling).
SUPPORTED_DISTROS = ("humble", "iron", "jazzy", "kilted", "rolling")
#: Devfreq node suffixes of Jetson GPUs (JetPack 5: ga10b, JetPack 6: gpu).
_GPU_DEVFREQ = ("ga10b", "gpu", "gv11b", "gp10b")
#: Beyond the model file: KV cache, the engine process, the loop, ROS (bytes).
_MEMORY_HEADROOM_BYTES = 512 * 2**20
#: The llama.cpp build line for an Orin (compute capability 8.7).
LLAMA_CUDA_FIX = ('CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=87" pip install '
                  '--force-reinstall --no-cache-dir --no-deps llama-cpp-python==0.3.36')


class DoctorError(RobotLatencyError):
    """Bad input to the doctor (a params file that cannot be read)."""


@dataclass(frozen=True)
class Check:
    """One finding.

    Attributes:
        name: what was checked (``jetson``, ``ros``, ``llama.cpp``, ...).
        status: OK, WARN or FAIL.
        detail: what was found.
        fix: what to do about it ("" when nothing).
    """

    name: str
    status: str
    detail: str
    fix: str = ""

    def line(self) -> str:
        """Return the one-line form: ``STATUS name: detail (fix: ...)``."""
        return f"{self.status:<4} {self.name}: {self.detail}" + (
            f"\n     fix: {self.fix}" if self.fix else "")

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass(frozen=True)
class DoctorInput:
    """What the checks run against.

    Attributes:
        root: where device files are read (``/`` here, a fixture tree in tests).
        params_file: a node params file (``config/*.yaml``), or None for the defaults.
        model: the GGUF whose size is checked against free memory, or None: the params file's
            model, else the bundled planner.
        cache_dir: the model cache, or None for the default.
        overrides: settings given as flags, the same names as the params file's (``model``,
            ``quant``, ``engine``, ``loop_cpus``, ``engine_cpus``, ``loop_priority``); they win
            over the params file, as they do for ``run``.
        quant: the model's ladder level (``run --quant``): its built file is checked.
        run_dir: a finished run whose late fallbacks are weighed against an unpinned loop.
    """

    root: Path = Path("/")
    params_file: Path | None = None
    model: Path | None = None
    cache_dir: Path | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    quant: str | None = None
    run_dir: Path | None = None


def load_params(path: Path | None) -> dict[str, Any]:
    """Return the ``ros__parameters`` of a params file's first node ({} for None).

    Raises:
        DoctorError: the file cannot be read or has no ``ros__parameters``.
    """
    if path is None:
        return {}
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as err:
        raise DoctorError(f"params file {path}: cannot read it: {err}") from err
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}:" if mark is not None else ""
        why = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise DoctorError(f"params file {path}:{where} not valid YAML: {why}") from err
    if isinstance(data, dict):
        for node in data.values():
            if isinstance(node, dict) and isinstance(node.get("ros__parameters"), dict):
                return node["ros__parameters"]
    raise DoctorError(f"params file {path}: no '<node>: ros__parameters:' mapping")


# --- Jetson -----------------------------------------------------------------------------------
def check_jetson(root: Path) -> tuple[list[Check], JetsonInfo | None]:
    """The module, its floor profile and the nvpmodel power mode."""
    info = detect_jetson(root)
    if info is None:
        return [Check("jetson", OK, "not a Jetson; floor predictions for a target use "
                                    "--device / device_profile")], None
    checks = []
    if info.profile_id is None:
        checks.append(Check("jetson", WARN, f"unknown Jetson module {info.model_string!r} "
                                            f"(part {info.module})",
                            "set device_profile (or --device) to the closest id from "
                            "`robot-latency devices`"))
    else:
        checks.append(Check("jetson", OK, f"{info.model_string} (part {info.module}): "
                                          f"profile {info.profile_id}"))
    if info.power_mode is None:
        checks.append(Check("power mode", WARN,
                            "nvpmodel mode unreadable (/var/lib/nvpmodel/status, "
                            "/etc/nvpmodel.conf); records will not name it",
                            "sudo nvpmodel -q  (and check that nvpmodel.service runs)"))
    elif not info.power_mode.startswith("MAXN"):
        checks.append(Check("power mode", WARN,
                            f"nvpmodel mode {info.power_mode_id} ({info.power_mode}) caps the "
                            f"clocks; predictions use {info.profile_id}",
                            "sudo nvpmodel -m 0  (MAXN) for the fastest planner, or keep the "
                            "mode and compare against its profile"))
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


# --- ROS --------------------------------------------------------------------------------------
def check_ros() -> list[Check]:
    """The distro, and whether rclpy imports (in a child process: this one stays ROS-free)."""
    from robot_latency.rosenv import ros_facts

    facts = ros_facts()
    done = subprocess.run([sys.executable, "-c", "import rclpy, std_msgs.msg, "
                                                  "diagnostic_msgs.msg"],
                          capture_output=True, text=True, timeout=120)
    source_fix = ("source /opt/ros/humble/setup.bash (a Jetson), or on x86-64 with "
                  "CPython 3.11: pip install -r requirements/ros.txt")
    if done.returncode != 0:
        error = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return [Check("ros", FAIL, f"rclpy does not import: {error}", source_fix)]
    distro = facts.ros_distro
    detail = f"ROS 2 {distro or '(distro unknown)'}, rclpy {facts.rclpy_version} " \
             f"({facts.rclpy_source})"
    if distro is None:
        return [Check("ros", WARN, detail, source_fix)]
    if distro not in SUPPORTED_DISTROS:
        return [Check("ros", WARN, detail + f"; {distro} is not one of {SUPPORTED_DISTROS}",
                      "use ROS 2 Humble (JetPack 6) or a later distro")]
    return [Check("ros", OK, detail)]


# --- engines ----------------------------------------------------------------------------------
def _llama_backends(info: str) -> list[str]:
    """Backend names from llama.cpp's system info (``"CPU : SSE3 = 1 | ... | CUDA : ..."``)."""
    names = []
    for part in info.split("|"):
        head, sep, _ = part.partition(" : ")
        if sep and head.strip() and " " not in head.strip():
            names.append(head.strip())
    return list(dict.fromkeys(names))


def check_llama(jetson: JetsonInfo | None) -> Check:
    """llama.cpp imports, and was built with GPU offload where the machine has a GPU."""
    try:
        import llama_cpp
    except ImportError as err:
        return Check("llama.cpp", FAIL, f"llama_cpp does not import: {err}",
                     "pip install -r requirements/base.txt (on a Jetson: " + LLAMA_CUDA_FIX + ")")
    raw = llama_cpp.llama_print_system_info()
    backends = _llama_backends(raw.decode(errors="replace") if isinstance(raw, bytes) else raw)
    offload = bool(llama_cpp.llama_supports_gpu_offload())
    detail = (f"llama-cpp-python {llama_cpp.__version__}, GPU offload "
              f"{'yes' if offload else 'no'}, backends {', '.join(backends) or 'unknown'}")
    if offload:
        return Check("llama.cpp", OK, detail)
    if jetson is not None:
        return Check("llama.cpp", FAIL, detail + ": a CPU-only build on a Jetson",
                     LLAMA_CUDA_FIX)
    from robot_latency.engines.providers import cuda_device_count

    devices, _ = cuda_device_count()
    if devices:
        return Check("llama.cpp", WARN, detail + f"; this machine has {devices} CUDA device(s)",
                     LLAMA_CUDA_FIX.replace("=87", "=native"))
    return Check("llama.cpp", OK, detail + " (no GPU here: CPU is right)")


def check_onnxruntime() -> Check:
    """Which ONNX Runtime providers would initialise here (the engine asks only for those)."""
    try:
        import onnxruntime as ort
    except ImportError as err:
        return Check("onnxruntime", WARN, f"onnxruntime does not import: {err} (only the onnx "
                                          "engine needs it)",
                     "x86-64: pip install -r requirements/base.txt; Jetson: NVIDIA's "
                     "onnxruntime-gpu wheel (README)")
    from robot_latency.engines.onnx import DEFAULT_PROVIDERS
    from robot_latency.engines.providers import choose_providers, cuda_device_count

    choice = choose_providers(DEFAULT_PROVIDERS)
    dropped = "; ".join(f"{k} left out: {v}" for k, v in choice.dropped.items())
    detail = f"onnxruntime {ort.__version__}: would run on {', '.join(choice.usable) or 'none'}"
    if not choice.usable:
        return Check("onnxruntime", FAIL, detail + (f" ({dropped})" if dropped else ""),
                     "reinstall onnxruntime")
    gpu_dropped = [k for k in choice.dropped if k != "CPUExecutionProvider"]
    if gpu_dropped and cuda_device_count()[0]:
        return Check("onnxruntime", WARN, detail + f" ({dropped})",
                     "install the CUDA/cuDNN (and TensorRT) libraries this onnxruntime-gpu was "
                     "built for, or NVIDIA's Jetson wheel")
    return Check("onnxruntime", OK, detail + (f" ({dropped})" if dropped else ""))


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


def run_checks(inp: DoctorInput) -> list[Check]:
    """Run every check; return the findings in order.

    Raises:
        DoctorError: the params file cannot be read.
    """
    params = {**load_params(inp.params_file), **inp.overrides}
    checks, jetson = check_jetson(inp.root)
    if jetson is not None:
        checks.append(check_jetson_clocks(inp.root))
    steps: list[Callable[[], Check | list[Check]]] = [
        check_ros, lambda: check_llama(jetson), check_onnxruntime,
        lambda: check_rtprio(params), lambda: check_cpus(params),
        lambda: check_memory(inp, params), lambda: check_cache(inp.cache_dir)]
    if inp.run_dir is not None:
        steps.append(lambda: check_run(inp.run_dir))  # type: ignore[arg-type]
    for step in steps:
        found = step()
        checks.extend(found if isinstance(found, list) else [found])
    return checks


def exit_status(checks: Sequence[Check]) -> int:
    """1 when any check failed, else 0."""
    return 1 if any(c.status == FAIL for c in checks) else 0
