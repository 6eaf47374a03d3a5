"""Decode ITL of synthesized model shapes, and the two-term calibration fitted from them.

Shared by bench/predict_host.py (CPU, this machine) and bench/predict_gpu.py (every layer on an
NVIDIA GPU). A shape is a random-weight GGUF of a preset (``robot-latency models synth``): the
real per-token bytes and arithmetic of that model, with noise for output, which is all a timing
needs. Each measurement decodes ``tokens`` single-token steps after a short prompt and takes the
median step; the shapes are measured round-robin, ``repeats`` times, so that drift on a shared
machine falls on every shape alike. Each shape gets the median of its repeats and the best
(lowest) repeat; on a machine other jobs share, the best repeat is the least disturbed one.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from robot_latency.floor.devices import DeviceSheet
from robot_latency.floor.fit import TwoTermFit, fit_two_term
from robot_latency.floor.modelinfo import facts_from_gguf

PROMPT_TOKENS = 16


@dataclass(frozen=True)
class ShapeResult:
    """One synthesized shape: its bytes, its floor on the device, and its measured decode step."""

    preset: str
    quant: str
    gguf: str
    weight_bytes_per_step: int
    context_tokens: int
    floor_ms: float
    itl_ms_median: float
    itl_ms_best: float
    itl_ms_repeats: list[float]
    itl_cpu_ms_median: float
    itl_cpu_ms_repeats: list[float]
    steps_per_repeat: int


def synth_shapes(presets: Sequence[str], quant: str, out_dir: Path) -> dict[str, Path]:
    """Synthesize (or reuse) one GGUF per preset at ``quant`` under ``out_dir``."""
    from robot_latency.models.synth import synth

    paths: dict[str, Path] = {}
    for preset in presets:
        path = out_dir / f"{preset}-{quant}.gguf"
        if not path.exists():
            synth(preset, quant, path, seed=0)
        paths[preset] = path
    return paths


def _step_times_ms(llm: Any, tokens: int) -> tuple[list[float], list[float]]:
    """Decode ``tokens`` single-token steps after a fixed prompt; return each step's wall time
    and the calling thread's CPU time (ms).

    With one llama.cpp thread the step is computed on the calling thread, so its CPU time is the
    step's cost without the time other processes held the core: on a shared machine it is the
    steadier figure. (With several threads it covers only the caller's share.)
    """
    llm.reset()
    prompt = [llm.token_bos()] + [10 + i for i in range(PROMPT_TOKENS - 1)]
    llm.eval(prompt)
    wall: list[float] = []
    cpu: list[float] = []
    for i in range(tokens):
        start, start_cpu = time.perf_counter_ns(), time.thread_time_ns()
        # The token fed back does not change a step's cost; a fixed pattern keeps it exact.
        llm.eval([10 + (i % 64)])
        cpu.append((time.thread_time_ns() - start_cpu) / 1e6)
        wall.append((time.perf_counter_ns() - start) / 1e6)
    return wall, cpu


def measure(paths: dict[str, Path], *, quant: str, device: DeviceSheet, tokens: int,
            repeats: int, load: Callable[[Path], Any]) -> list[ShapeResult]:
    """Measure every shape round-robin; return one result per shape (median of repeats).

    ``load(path)`` returns a ``llama_cpp.Llama`` (threads and GPU layers are the caller's).
    """
    models = {preset: load(path) for preset, path in paths.items()}
    per_repeat: dict[str, list[float]] = {p: [] for p in paths}
    cpu_repeat: dict[str, list[float]] = {p: [] for p in paths}
    for _ in range(repeats):
        for preset, llm in models.items():
            wall, cpu = _step_times_ms(llm, tokens)
            per_repeat[preset].append(statistics.median(wall))
            cpu_repeat[preset].append(statistics.median(cpu))
    context = PROMPT_TOKENS + tokens // 2
    results = []
    for preset, path in paths.items():
        prof = facts_from_gguf(path)
        step_bytes = prof.weight_bytes_per_step + prof.kv_bytes_per_token * context
        results.append(ShapeResult(
            preset=preset, quant=quant, gguf=str(path),
            weight_bytes_per_step=prof.weight_bytes_per_step, context_tokens=context,
            floor_ms=step_bytes / (device.bandwidth_gbps * 1e9) * 1e3,
            itl_ms_median=statistics.median(per_repeat[preset]),
            itl_ms_best=min(per_repeat[preset]),
            itl_ms_repeats=per_repeat[preset],
            itl_cpu_ms_median=statistics.median(cpu_repeat[preset]),
            itl_cpu_ms_repeats=cpu_repeat[preset], steps_per_repeat=tokens))
    for llm in models.values():
        llm.close()
    return results


def calibrate_and_predict(results: Sequence[ShapeResult], fit_on: Sequence[str], *,
                          statistic: str = "median") -> dict[str, Any]:
    """Fit the two terms on the ``fit_on`` shapes; predict every other shape; report errors.

    ``statistic`` picks each shape's figure: ``median`` (of its repeats' median wall times),
    ``best`` (the lowest of them) or ``cpu`` (the median of the repeats' median CPU times).
    """
    def itl(r: ShapeResult) -> float:
        if statistic == "cpu":
            return r.itl_cpu_ms_median
        return r.itl_ms_best if statistic == "best" else r.itl_ms_median

    fit_rows = [r for r in results if f"{r.preset}/{r.quant}" in fit_on or r.preset in fit_on]
    if len(fit_rows) < 2:
        raise SystemExit(f"need two shapes to fit on, got {[r.preset for r in fit_rows]}")
    fit: TwoTermFit = fit_two_term([r.floor_ms for r in fit_rows], [itl(r) for r in fit_rows])
    predictions = []
    for r in results:
        if r in fit_rows:
            continue
        pred = fit.predict_ms(r.floor_ms)
        predictions.append({"preset": r.preset, "quant": r.quant, "floor_ms": r.floor_ms,
                            "measured_ms": itl(r), "predicted_ms": pred,
                            "error_rel": pred / itl(r) - 1.0})
    single = fit_rows[-1]  # one efficiency from the largest fitted shape, for contrast
    eff_only = single.floor_ms / itl(single)
    return {
        "statistic": statistic,
        "fit_on": [f"{r.preset}/{r.quant}" for r in fit_rows],
        "fit": fit.to_dict(),
        "predictions": predictions,
        "max_abs_error": max((abs(p["error_rel"]) for p in predictions), default=None),
        "single_efficiency_contrast": {
            "efficiency_from": f"{single.preset}/{single.quant}", "efficiency": eff_only,
            "errors_rel": {f"{r.preset}/{r.quant}": (r.floor_ms / eff_only) / itl(r) - 1
                           for r in results if r is not single}},
    }


def machine_state() -> dict[str, Any]:
    """Load average and CPU count, to note what else the machine was doing."""
    load1, load5, load15 = os.getloadavg()
    return {"loadavg_1_5_15": [load1, load5, load15], "cpu_count": os.cpu_count()}


def results_dicts(results: Sequence[ShapeResult]) -> list[dict[str, Any]]:
    """Return the results as JSON-ready dicts."""
    return [asdict(r) for r in results]
