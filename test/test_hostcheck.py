"""``robot-latency doctor`` on the Jetson fixture trees and on this machine (real llama.cpp,
onnxruntime, rclpy, rlimits and CPUs; only a Jetson's device files come from fixtures)."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import llama_cpp

from robot_latency.hostcheck import (
    FAIL,
    OK,
    WARN,
    check_cache,
    check_cpus,
    check_jetson,
    check_jetson_clocks,
    check_rtprio,
)
from robot_latency.lifetime import follow_parent
from robot_latency.planner.budget import available_cpus

FIXTURES = Path(__file__).parent / "fixtures"
JETSON = FIXTURES / "jetson"
TELEMETRY = FIXTURES / "jetson-telemetry" / "agx-orin-maxn"
STATUSES = (OK, WARN, FAIL)


def doctor(*args: str, cache: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "robot_latency.cli", "doctor",
                           "--cache-dir", str(cache), *args],
                          capture_output=True, text=True, timeout=300, preexec_fn=follow_parent())


def _by_name(checks: list[dict[str, str]]) -> dict[str, dict[str, str]]:
    return {c["name"]: c for c in checks}


def test_module_and_power_mode_from_the_fixture_trees() -> None:
    (module, mode), info = check_jetson(JETSON / "agx-orin-64gb-maxn")
    assert info is not None and module.status == OK and "orin-agx-64gb" in module.detail
    assert mode.status == OK and "MAXN" in mode.detail
    (_, mode), info = check_jetson(JETSON / "agx-orin-64gb-15w")
    assert mode.status == WARN and "15W" in mode.detail and "nvpmodel -m" in mode.fix
    assert info is not None and info.device_id == "orin-agx-64gb-15w"
    (_, mode), _ = check_jetson(JETSON / "agx-orin-64gb-bad-status")
    assert mode.status == WARN and "unreadable" in mode.detail and mode.fix
    checks, info = check_jetson(JETSON / "not-jetson")
    assert info is None and [c.status for c in checks] == [OK]


def test_jetson_clocks_state_from_devfreq(tmp_path: Path) -> None:
    scaling = check_jetson_clocks(TELEMETRY)
    assert scaling.status == WARN and "jetson_clocks" in scaling.fix
    pinned = tmp_path / "pinned"
    shutil.copytree(TELEMETRY, pinned, symlinks=True)
    gpu = pinned / "sys/devices/17000000.ga10b/devfreq/17000000.ga10b"
    (gpu / "min_freq").write_text((gpu / "max_freq").read_text())
    clocks = check_jetson_clocks(pinned)
    assert clocks.status == OK and "pinned" in clocks.detail
    assert check_jetson_clocks(JETSON / "not-jetson").status == WARN  # no devfreq node


def test_params_against_this_machines_cpus_and_rtprio() -> None:
    have = available_cpus()
    assert check_cpus({"loop_cpus": str(min(have))}).status == OK
    missing = max(have) + 1
    bad = check_cpus({"loop_cpus": "0", "engine_cpus": f"1-{missing}"})
    assert bad.status == FAIL and str(missing) in bad.detail and bad.fix
    assert check_rtprio({"loop_priority": 0}).status == OK
    soft, _ = resource.getrlimit(resource.RLIMIT_RTPRIO)
    allowed = soft == resource.RLIM_INFINITY or soft >= 50 or os.geteuid() == 0
    rt = check_rtprio({"loop_priority": 50})
    assert rt.status == (OK if allowed else FAIL)
    if not allowed:
        assert "rtprio" in rt.fix and "limits.d" in rt.fix


def test_cache_that_cannot_be_made_fails(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    bad = check_cache(blocker / "models")
    assert bad.status == FAIL and "ROBOT_LATENCY_CACHE_DIR" in bad.fix
    assert check_cache(tmp_path / "new" / "models").status == OK


def test_doctor_on_this_machine(tmp_path: Path) -> None:
    done = doctor("--json", cache=tmp_path / "cache")
    checks = json.loads(done.stdout)
    assert all(c["status"] in STATUSES for c in checks)
    assert all(c["fix"] for c in checks if c["status"] != OK)
    assert done.returncode == (1 if any(c["status"] == FAIL for c in checks) else 0)
    by = _by_name(checks)
    assert {"jetson", "ros", "llama.cpp", "onnxruntime", "rtprio", "cpus", "memory",
            "cache"} <= set(by)
    assert by["ros"]["status"] == OK  # rclpy is a hard requirement of the suite
    offload = bool(llama_cpp.llama_supports_gpu_offload())
    assert f"GPU offload {'yes' if offload else 'no'}" in by["llama.cpp"]["detail"]
    assert "CPUExecutionProvider" in by["onnxruntime"]["detail"]
    text = doctor(cache=tmp_path / "cache")
    lines = [line for line in text.stdout.splitlines() if not line.startswith("     fix:")]
    assert all(line.split()[0] in STATUSES for line in lines[:-1])
    assert lines[-1].endswith("WARN") and text.returncode == done.returncode


def test_doctor_on_a_jetson_fixture_with_a_params_file(tmp_path: Path) -> None:
    params = tmp_path / "params.yaml"
    missing = max(available_cpus()) + 1
    params.write_text("planner_node:\n  ros__parameters:\n"
                      f"    loop_cpus: \"0\"\n    engine_cpus: \"{missing}\"\n")
    done = doctor("--json", "--root", str(TELEMETRY), "--params-file", str(params),
                  cache=tmp_path / "cache")
    by = _by_name(json.loads(done.stdout))
    assert done.returncode == 1
    assert by["jetson"]["status"] == OK and by["power mode"]["status"] == OK
    assert by["jetson_clocks"]["status"] == WARN
    assert by["cpus"]["status"] == FAIL
    if not llama_cpp.llama_supports_gpu_offload():  # a CPU build on a Jetson is a failure
        assert by["llama.cpp"]["status"] == FAIL and "GGML_CUDA=on" in by["llama.cpp"]["fix"]
        assert "CMAKE_CUDA_ARCHITECTURES=87" in by["llama.cpp"]["fix"]


def test_bad_params_file_is_one_line_and_status_2(tmp_path: Path) -> None:
    params = tmp_path / "params.yaml"
    params.write_text("just: [a list\n")
    done = doctor("--params-file", str(params), cache=tmp_path / "cache")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert str(params) in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_an_unpinned_loop_is_a_warning_with_the_fix() -> None:
    if len(available_cpus()) < 2:
        return  # one CPU: nothing to pin the loop away from
    found = check_cpus({})
    assert found.status == WARN and "not pinned" in found.detail
    assert "loop_cpus: 0" in found.fix
    assert check_cpus({"loop_priority": 50}).status == OK  # SCHED_FIFO preempts the engine


def test_doctor_takes_runs_flags_over_the_params_file_and_weighs_a_runs_late_fallbacks(
        tmp_path: Path) -> None:
    from robot_latency.records import CycleRecord, JsonlSink

    params = tmp_path / "params.yaml"
    params.write_text('planner_node:\n  ros__parameters:\n    loop_cpus: "0"\n')
    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({"cpu_budget": {"loop_cpus": [],
                                                                  "loop_priority": 0}}))
    ms = 1_000_000
    with JsonlSink(run / "cycles.jsonl") as sink:
        for i, late_ms in enumerate((0.0, 0.4, 3.5)):
            sink.write(CycleRecord(run_id="r", cycle=i, scheduled_ns=i * 1000 * ms,
                                   deadline_ns=i * 1000 * ms + 400 * ms,
                                   published_ns=i * 1000 * ms + 400 * ms + round(late_ms * ms),
                                   plan_source="fallback", fallback_reason="deadline"))
    model = tmp_path / "mine.gguf"
    model.write_bytes(b"GGUF" + bytes(1000))
    done = doctor("--json", "--params-file", str(params), "--loop-cpus", "",
                  "--model", str(model), "--run", str(run), cache=tmp_path / "cache")
    by = _by_name(json.loads(done.stdout))
    # the flag wins over the params file's loop_cpus, as it does for run
    if len(available_cpus()) > 1:
        assert by["cpus"]["status"] == WARN and "not pinned" in by["cpus"]["detail"]
    assert "mine.gguf" in by["memory"]["detail"]
    late = by["late fallbacks"]
    assert late["status"] == WARN and "2 of 3 fallbacks published late" in late["detail"]
    assert "0.40-3.50 ms" in late["detail"] and "--loop-cpus 0" in late["fix"]
    # a built ladder level is what run would load: its file is the one checked
    level = tmp_path / "cache" / "mine.Q4_0.gguf"
    level.parent.mkdir(parents=True, exist_ok=True)
    level.write_bytes(b"GGUF" + bytes(10))
    done = doctor("--json", "--model", str(model), "--quant", "Q4_0", cache=tmp_path / "cache")
    assert "mine.Q4_0.gguf" in _by_name(json.loads(done.stdout))["memory"]["detail"]
