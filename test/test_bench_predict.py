"""The parts of the prediction bench scripts that need no GPU: nvidia-smi parsing, the datasheet
bandwidth lookup, the CUDA build environment, and calibrating from measured shapes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

from decode_shapes import ShapeResult, calibrate_and_predict  # noqa: E402
from predict_gpu import build_env, gpu_bandwidth_gbps, parse_nvidia_smi  # noqa: E402


def test_parse_nvidia_smi_first_gpu() -> None:
    gpu = parse_nvidia_smi("NVIDIA H200, 9.0, 143771 MiB\nNVIDIA H200, 9.0, 143771 MiB\n")
    assert gpu == {"name": "NVIDIA H200", "compute_cap": "90", "memory_mib": 143771}
    assert parse_nvidia_smi("Orin (nvgpu), 8.7, [N/A]")["compute_cap"] == "87"
    with pytest.raises(ValueError, match="nvidia-smi"):
        parse_nvidia_smi("")
    with pytest.raises(ValueError, match="compute capability"):
        parse_nvidia_smi("GPU, nine, 1 MiB")


def test_gpu_bandwidth_longest_name_wins() -> None:
    assert gpu_bandwidth_gbps("NVIDIA H100 PCIe") == 2000.0
    assert gpu_bandwidth_gbps("NVIDIA H100 80GB HBM3") == 3350.0
    assert gpu_bandwidth_gbps("NVIDIA H200") == 4800.0
    assert gpu_bandwidth_gbps("Some Future GPU") is None


def test_build_env_targets_one_architecture() -> None:
    env = build_env("90", 16)
    assert "-DGGML_CUDA=on" in env["CMAKE_ARGS"]
    assert "-DCMAKE_CUDA_ARCHITECTURES=90" in env["CMAKE_ARGS"]
    assert env["CMAKE_BUILD_PARALLEL_LEVEL"] == "16"


def _shape(preset: str, floor_ms: float, eff: float, overhead_ms: float) -> ShapeResult:
    itl = floor_ms / eff + overhead_ms
    return ShapeResult(preset=preset, quant="Q8_0", gguf=f"{preset}.gguf",
                       weight_bytes_per_step=int(floor_ms * 1e7), context_tokens=40,
                       floor_ms=floor_ms, itl_ms_median=itl, itl_ms_best=itl, itl_ms_repeats=[itl],
                       itl_cpu_ms_median=itl, itl_cpu_ms_repeats=[itl],
                       steps_per_repeat=48)


def test_calibrate_and_predict_on_generated_shapes() -> None:
    shapes = [_shape("a", 4.6, 0.9, 3.0), _shape("b", 12.3, 0.9, 3.0),
              _shape("c", 16.7, 0.9, 3.0), _shape("d", 41.8, 0.9, 3.0)]
    out = calibrate_and_predict(shapes, ["a", "c"])
    assert out["fit"]["efficiency"] == pytest.approx(0.9)
    assert out["fit"]["overhead_ms"] == pytest.approx(3.0)
    assert [p["preset"] for p in out["predictions"]] == ["b", "d"]
    assert out["max_abs_error"] == pytest.approx(0.0, abs=1e-9)
    # one efficiency alone (from the largest fitted shape) misses the small shapes
    assert out["single_efficiency_contrast"]["errors_rel"]["a/Q8_0"] < -0.2
