"""The doctor's checks of the software: the ROS 2 distro and rclpy, llama.cpp's GPU offload and
backend, and the ONNX Runtime providers that can start."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from robot_latency.floor.jetson import JetsonInfo
from robot_latency.hostcheck.findings import FAIL, OK, WARN, Check
from robot_latency.llama_load import llama_system_info

__all__ = ["LLAMA_CUDA_FIX", "SUPPORTED_DISTROS", "check_cpu", "check_llama", "check_onnxruntime",
           "check_ros"]

#: The ROS 2 distros the project supports (Humble on JetPack 6 through Kilted, and rolling).
SUPPORTED_DISTROS = ("humble", "iron", "jazzy", "kilted", "rolling")
#: The llama.cpp build line for an Orin (compute capability 8.7).
LLAMA_CUDA_FIX = ('CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=87" pip install '
                  '--force-reinstall --no-cache-dir --no-deps llama-cpp-python==0.3.36')


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


def _build_features(info: str) -> list[str]:
    """The CPU features llama.cpp was compiled with (``AVX2 = 1`` in its system info)."""
    cpu = info.split("|")
    names = []
    for part in cpu:
        key, sep, value = part.rpartition("=")
        key = key.split(":")[-1].strip()
        if sep and value.strip() == "1" and key:
            names.append(key)
    return names


def check_cpu(cpuinfo: Path | None = None, system_info: str | None = None) -> Check:
    """The CPU's vector extensions, what llama.cpp was built with, and the load setting chosen.

    Where the loaded llama.cpp has AMX kernels, it loads with its extra buffer types off
    (robot_latency.llama_load): that path segfaults in decode. That is a WARN, with the cost
    (REPACK off) and the way to a build without them (the portable one). An AMX CPU running a
    build without AMX kernels (the portable one) keeps REPACK, and is OK: nothing to install.
    """
    from robot_latency.llama_load import load_policy, read_cpu_features

    features = read_cpu_features(cpuinfo)
    try:
        info = llama_system_info() if system_info is None else system_info
    except ImportError as err:
        return Check("cpu", WARN, f"{features.machine}: llama_cpp does not import: {err}",
                     "pip install -r requirements/base.txt")
    policy = load_policy("auto", features=features, system_info=info)
    detail = (f"{features.machine}, {', '.join(features.reported()) or 'no flags read'} "
              f"({features.source}); llama.cpp built with "
              f"{', '.join(_build_features(info)) or 'unknown'}; {policy.reason}")
    if not policy.use_extra_bufts:
        return Check("cpu", WARN, detail,
                     "nothing to do for the planner (it loads this way by itself); for Q4_0's "
                     "REPACK speed, build llama-cpp-python without AMX: make install (the "
                     "portable build)")
    return Check("cpu", OK, detail)


def check_onnxruntime() -> Check:
    """Which ONNX Runtime providers would initialise here (the engine asks only for those)."""
    try:
        import onnxruntime as ort
    except ImportError as err:
        return Check("onnxruntime", WARN, f"onnxruntime does not import: {err} (only the onnx "
                                          "engine needs it)",
                     "x86-64: pip install -r requirements/base.txt; Jetson: NVIDIA's "
                     "onnxruntime-gpu wheel (docs/INSTALL.md)")
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
