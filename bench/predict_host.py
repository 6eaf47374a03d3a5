"""Host check of the two-term prediction: calibrate on two shapes, predict two others.

Synthesizes four model shapes (SmolLM2-135M, SmolLM2-360M, Qwen2.5-0.5B, Llama-3.2-1B at Q8_0 by
default), measures their decode ITL with llama.cpp on this machine's CPU in one run (round-robin),
fits ``itl = floor / efficiency + overhead`` on two of them and predicts the other two. The
floor is bytes per step over the host probe's all-core read bandwidth.

    python bench/predict_host.py [--quant Q8_0 --tokens 48 --repeats 5 --threads 1]
        [--fit-on smollm2-135m,qwen2.5-0.5b] [--models-dir DIR] [--out docs/bench/predict_host.json]

Done when every predicted shape is within 10% (``max_abs_error`` <= 0.10).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchio import emit_result
from decode_shapes import (
    calibrate_and_predict,
    machine_state,
    measure,
    results_dicts,
    synth_shapes,
)

from robot_latency.floor.devices import get_device

DEFAULT_SHAPES = "smollm2-135m,smollm2-360m,qwen2.5-0.5b,llama-3.2-1b"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default=DEFAULT_SHAPES, help="comma-separated presets")
    p.add_argument("--fit-on", default="smollm2-135m,qwen2.5-0.5b",
                   help="the two presets the calibration is fitted on")
    p.add_argument("--quant", default="Q8_0")
    p.add_argument("--tokens", type=int, default=48, help="decode steps per repeat")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1,
                   help="llama.cpp threads (1: a thread that spins for its partner is what a "
                        "shared machine punishes most)")
    p.add_argument("--statistic", choices=("cpu", "best", "median"), default="cpu",
                   help="each shape's figure: the step's CPU time on the calling thread "
                        "(default; one thread), the best repeat's wall time, or the median's")
    p.add_argument("--models-dir", type=Path, default=Path.home() / ".cache" / "robot_latency"
                   / "synth", help="where the synthesized GGUFs are kept (reused)")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)

    from robot_latency.llama_load import load_policy, open_llama

    policy = load_policy()

    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    paths = synth_shapes(shapes, args.quant, args.models_dir)
    device = get_device("host")
    before = machine_state()
    results = measure(
        paths, quant=args.quant, device=device, tokens=args.tokens, repeats=args.repeats,
        load=lambda path: open_llama(policy, model_path=str(path), n_threads=args.threads,
                                     n_threads_batch=args.threads, n_ctx=256, n_gpu_layers=0,
                                     verbose=False))
    fit_on = [s.strip() for s in args.fit_on.split(",")]
    return emit_result({
        "device": device.to_dict(),
        "engine_family": "llamacpp-cpu",
        "threads": args.threads,
        "machine_before": before,
        "machine_after": machine_state(),
        "shapes": results_dicts(results),
        **calibrate_and_predict(results, fit_on, statistic=args.statistic),
    }, args.out)


if __name__ == "__main__":
    sys.exit(main())
