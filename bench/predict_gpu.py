"""GPU check of the two-term prediction: llama.cpp with every layer on an NVIDIA GPU.

On a machine with an NVIDIA GPU (and nvcc), in one go, within 15 minutes including the build:

1. builds llama-cpp-python with CUDA for this GPU only (``CMAKE_CUDA_ARCHITECTURES`` from
   nvidia-smi's compute capability) into ``--build-dir``, leaving the project's venv alone;
2. synthesizes three model shapes at two quants (default Qwen2.5-0.5B, Llama-3.2-1B and
   Llama-3.2-3B at Q4_0 and Q8_0);
3. measures their decode ITL with all layers offloaded (round-robin, median of repeats);
4. fits ``itl = floor / efficiency + overhead`` (all six points, and leave-one-out), where the
   floor is bytes per step over the GPU's datasheet memory bandwidth, and writes the JSON.

    python bench/predict_gpu.py [--src SDIST_OR_DIR] [--out docs/bench/predict_gpu.json]

The machine need not reach the package registry: ``--src`` takes a llama-cpp-python sdist
(``pip download llama-cpp-python==0.3.36 --no-binary :all: --no-deps``) or source tree carried
there; without it pip fetches that version. The measuring half runs in a child process whose
path puts the CUDA build first, so the venv's CPU build is never imported by mistake; the child
checks that the GPU offload is really on (``llama_supports_gpu_offload``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"  # the version requirements/base.txt pins
DEADLINE_S = 15 * 60

#: Datasheet memory bandwidth (GB/s) by GPU name fragment, longest match first. Sources: NVIDIA
#: H200, H100 (SXM 3.35 TB/s, PCIe 2.0 TB/s), A100 80GB SXM (2,039 GB/s), L4 (300 GB/s),
#: RTX 4090 (1,008 GB/s) product specifications.
GPU_BANDWIDTH_GBPS: dict[str, float] = {
    "H200": 4800.0,
    "H100 PCIe": 2000.0,
    "H100": 3350.0,
    "A100-SXM4-80GB": 2039.0,
    "A100 80GB PCIe": 1935.0,
    "L4": 300.0,
    "RTX 4090": 1008.0,
}


def gpu_bandwidth_gbps(name: str) -> float | None:
    """Return the datasheet bandwidth for an nvidia-smi GPU name, or None if not in the table."""
    for key in sorted(GPU_BANDWIDTH_GBPS, key=len, reverse=True):
        if key.lower() in name.lower():
            return GPU_BANDWIDTH_GBPS[key]
    return None


def parse_nvidia_smi(text: str) -> dict[str, Any]:
    """Parse ``nvidia-smi --query-gpu=name,compute_cap,memory.total --format=csv,noheader``.

    Returns the first GPU's name, compute capability as CMake wants it ("90" for 9.0) and
    memory in MiB.
    """
    line = next((ln for ln in text.splitlines() if ln.strip()), "")
    parts = [p.strip() for p in line.split(",")]
    if len(parts) < 3:
        raise ValueError(f"unexpected nvidia-smi output: {text!r}")
    name, cap, mem = parts[0], parts[1], parts[2]
    major, _, minor = cap.partition(".")
    if not (major.isdigit() and minor.isdigit()):
        raise ValueError(f"unexpected compute capability {cap!r}")
    return {"name": name, "compute_cap": f"{major}{minor}",
            "memory_mib": int(mem.split()[0]) if mem.split()[0].isdigit() else None}


def build_env(compute_cap: str, jobs: int) -> dict[str, str]:
    """Return the environment for a CUDA build of llama-cpp-python for one architecture."""
    return {
        **os.environ,
        "CMAKE_ARGS": f"-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES={compute_cap} "
                      "-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF",
        "CMAKE_BUILD_PARALLEL_LEVEL": str(jobs),
        "FORCE_CMAKE": "1",
    }


def build(args: argparse.Namespace, gpu: dict[str, Any]) -> float:
    """pip-install llama-cpp-python with CUDA into ``--build-dir``; return the seconds taken."""
    marker = args.build_dir / f".built-sm{gpu['compute_cap']}"
    if marker.exists():
        return 0.0
    start = time.monotonic()
    isolation = [] if args.build_isolation else ["--no-build-isolation"]
    if not args.build_isolation:
        import importlib.util

        missing = [m for m in ("scikit_build_core", "cmake") if importlib.util.find_spec(m) is None]
        if missing:
            raise SystemExit(f"building without isolation needs {missing} in this environment "
                             "(pip install scikit-build-core cmake), or pass --build-isolation "
                             "where the package registry is reachable")
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", *isolation,
           "--upgrade", "--target", str(args.build_dir), "--no-cache-dir",
           str(args.src) if args.src else LLAMA_CPP_PYTHON]
    subprocess.run(cmd, check=True, env=build_env(gpu["compute_cap"], os.cpu_count() or 4))
    marker.write_text("ok\n")
    return time.monotonic() - start


def measure_child(args: argparse.Namespace) -> dict[str, Any]:
    """The measuring half (runs with the CUDA build first on sys.path)."""
    sys.path.insert(0, str(HERE))
    import llama_cpp
    from decode_shapes import measure, results_dicts, synth_shapes

    from robot_latency.floor.calibration import DecodePoint, calibrate_points
    from robot_latency.floor.devices import DeviceSheet
    from robot_latency.llama_load import load_policy, open_llama

    if not llama_cpp.llama_supports_gpu_offload():
        raise SystemExit(f"{llama_cpp.__file__}: this llama_cpp build has no GPU offload")
    device = DeviceSheet(
        id=args.device_id, name=args.gpu_name, bandwidth_gbps=args.bandwidth_gbps,
        memory_bytes=max(1, args.memory_mib) * 2**20, fp16_tflops=None, flops_derived=False,
        cpu_cores=None, power_mode=None, source="datasheet bandwidth (bench/predict_gpu.py)")
    policy = load_policy()
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    results = []
    for quant in [q.strip() for q in args.quants.split(",") if q.strip()]:
        paths = synth_shapes(shapes, quant, args.models_dir)
        results += measure(
            paths, quant=quant, device=device, tokens=args.tokens, repeats=args.repeats,
            load=lambda path: open_llama(policy, model_path=str(path), n_gpu_layers=-1,
                                         n_ctx=256, n_threads=1, verbose=False))
    points = [DecodePoint(f"{r.preset}/{r.quant}", device.id, r.preset, r.floor_ms,
                          r.itl_ms_median) for r in results]
    cal = calibrate_points(points, engine_family="llamacpp-cuda", device_id=device.id,
                           scope="device", source="bench/predict_gpu.py")
    return {"llama_cpp": llama_cpp.__file__, "llama_cpp_version": llama_cpp.__version__,
            "shapes": results_dicts(results), "calibration": cal.to_dict()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    p.add_argument("--src", type=Path, default=None, help="llama-cpp-python sdist or source")
    p.add_argument("--build-dir", type=Path, default=Path("/tmp/robot_latency_cuda_llama"))
    p.add_argument("--build-isolation", action="store_true",
                   help="let pip fetch the build requirements (needs the package registry)")
    p.add_argument("--models-dir", type=Path, default=Path("/tmp/robot_latency_synth"))
    p.add_argument("--shapes", default="qwen2.5-0.5b,llama-3.2-1b,llama-3.2-3b")
    p.add_argument("--quants", default="Q4_0,Q8_0")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--bandwidth-gbps", type=float, default=None,
                   help="memory bandwidth (default: the datasheet figure for the GPU's name)")
    p.add_argument("--out", type=Path, default=None)
    # set by the parent for the child
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--gpu-name", default="", help=argparse.SUPPRESS)
    p.add_argument("--device-id", default="gpu", help=argparse.SUPPRESS)
    p.add_argument("--memory-mib", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        sys.stdout.write(json.dumps(measure_child(args)) + "\n")
        return 0

    start = time.monotonic()
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,compute_cap,memory.total",
                          "--format=csv,noheader"], capture_output=True, text=True, check=True)
    gpu = parse_nvidia_smi(smi.stdout)
    bandwidth = args.bandwidth_gbps or gpu_bandwidth_gbps(gpu["name"])
    if bandwidth is None:
        raise SystemExit(f"no datasheet bandwidth for {gpu['name']!r}; pass --bandwidth-gbps")
    build_s = build(args, gpu)
    child = [sys.executable, str(Path(__file__).resolve()), "--child",
             "--gpu-name", gpu["name"], "--device-id", "gpu-" + gpu["name"].lower().replace(
                 " ", "-"), "--memory-mib", str(gpu["memory_mib"] or 0),
             "--bandwidth-gbps", str(bandwidth), "--shapes", args.shapes, "--quants",
             args.quants, "--tokens", str(args.tokens), "--repeats", str(args.repeats),
             "--models-dir", str(args.models_dir)]
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join([str(args.build_dir), str(REPO),
                                          os.environ.get("PYTHONPATH", "")])}
    remaining = max(60.0, DEADLINE_S - (time.monotonic() - start))
    proc = subprocess.run(child, capture_output=True, text=True, env=env, timeout=remaining,
                          check=False)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        return proc.returncode
    measured = json.loads(proc.stdout.strip().splitlines()[-1])
    sys.path.insert(0, str(HERE))
    from benchio import emit_result

    return emit_result({"gpu": gpu, "bandwidth_gbps": bandwidth, "build_s": build_s,
                        "total_s": time.monotonic() - start, **measured}, args.out)


if __name__ == "__main__":
    sys.exit(main())
