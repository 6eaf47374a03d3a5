"""Check the machine the planner is about to run on: each finding is OK, WARN or FAIL with its fix.

What it looks at, in order: the Jetson module and nvpmodel power mode, the jetson_clocks state, the
ROS 2 distro and rclpy, llama.cpp's GPU offload and backend, the CPU's features and the llama.cpp
load setting chosen for them (extra buffer types off where the build has AMX kernels), the ONNX
Runtime providers that can start, the rtprio limit the params file's ``loop_priority`` needs, the
CPUs the params file pins, free memory against the model's size, and the user cache. Device files
are read under ``root`` (``/`` on a real machine, a fixture tree in tests); nothing is changed.

The findings and input are :mod:`.findings`, the checks of the machine :mod:`.machine` and of the
software :mod:`.software`; this module runs them in order and gathers their names.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from robot_latency.hostcheck.findings import (
    FAIL,
    OK,
    WARN,
    Check,
    DoctorError,
    DoctorInput,
    load_params,
)
from robot_latency.hostcheck.machine import (
    check_cache,
    check_cpus,
    check_jetson,
    check_jetson_clocks,
    check_memory,
    check_rtprio,
    check_run,
)
from robot_latency.hostcheck.software import (
    LLAMA_CUDA_FIX,
    SUPPORTED_DISTROS,
    check_cpu,
    check_llama,
    check_onnxruntime,
    check_ros,
)

__all__ = [
    "FAIL",
    "LLAMA_CUDA_FIX",
    "OK",
    "SUPPORTED_DISTROS",
    "WARN",
    "Check",
    "DoctorError",
    "DoctorInput",
    "check_cache",
    "check_cpu",
    "check_cpus",
    "check_jetson",
    "check_jetson_clocks",
    "check_llama",
    "check_memory",
    "check_onnxruntime",
    "check_ros",
    "check_rtprio",
    "check_run",
    "exit_status",
    "load_params",
    "run_checks",
]


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
        check_ros, lambda: check_llama(jetson), check_cpu, check_onnxruntime,
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
