"""``robot-latency envelope`` wall time, each run a new process; the capacity search against a
sweep of replay speeds.

    python bench/envelope.py --repeats 5 --out docs/bench/envelope.json
    python bench/envelope.py --repeats 1 --commands 6 --sweep-points 3   # a smoke run

The envelope: ``steady_operator`` (60 commands), ``qwen2.5-0.5b`` at Q8_0, Q4_K_M and Q4_0
answered from the stream's labels (no weights: the preset's shipped tokenizer, no untimed pass to
cache, so every run builds its labelled pass and the time includes it), every power mode of the
Orin Nano 8GB and the AGX Orin 64GB (``--power-modes all``: 4 + 4 modes, 24 cells), event mode,
a 1500 ms deadline. One run first (any cache the command keeps is filled), then ``--repeats``
timed runs, each ``python -m robot_latency.cli envelope ... --json`` from start to exit.

The sweep: for one level and mode (Q4_0 on orin-nano-8gb), the receiver miss rate simulated at
``--sweep-points`` replay speeds around the rate the search found (x1/4 to x4 of it, log-spaced),
each through ``predict --stream``'s own path at that ``--speed``, beside the search's answer.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from benchio import emit_result

from robot_latency.cli import build_parser
from robot_latency.cli.common import check_quant_flags
from robot_latency.cli.predict_stream import checked_stream, stream_levels
from robot_latency.report.target_answer import answers_for, prepare_levels
from robot_latency.streams import SHIPPED_DIR, read_stream, write_jsonl

MODEL = "qwen2.5-0.5b"
QUANTS = ("Q8_0", "Q4_K_M", "Q4_0")
DEVICES = "orin-nano-8gb,orin-agx-64gb"
#: the issue's done-when: the envelope answers in at most this many seconds
TARGET_S = 5.0


def envelope_argv(stream: Path, deadline_ms: float) -> list[str]:
    return [sys.executable, "-m", "robot_latency.cli", "envelope", "--stream", str(stream),
            "--model", MODEL, "--quants", *QUANTS, "--device", DEVICES, "--power-modes", "all",
            "--deadline-ms", f"{deadline_ms:g}", "--mode", "event", "--json"]


def _loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return "unknown"


def timed_runs(argv: list[str], repeats: int) -> dict[str, Any]:
    """Run the envelope once untimed, then ``repeats`` timed runs; return the times and the
    last run's picks."""
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    runs_s, loads, doc = [], [], {}
    for _ in range(repeats):
        loads.append(_loadavg())
        t0 = time.perf_counter()
        out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
        runs_s.append(round(time.perf_counter() - t0, 3))
        doc = json.loads(out)
    modules = doc.get("modules", [])
    return {"runs_s": runs_s, "median_s": statistics.median(runs_s), "max_s": max(runs_s),
            "loadavg_before": loads, "cells": sum(len(m["cells"]) for m in modules),
            "modes": {m["module"]: m["modes"] for m in modules},
            "put_on_robot": {m["module"]: m["put_on_robot"] for m in modules},
            "why": {m["module"]: m["why"] for m in modules}}


def speed_sweep(stream: Path, deadline_ms: float, points: int) -> dict[str, Any]:
    """The search's answer for Q4_0 on orin-nano-8gb, and the miss rate at a sweep of speeds."""
    args = build_parser().parse_args([
        "predict", "--stream", str(stream), "--model", MODEL, "--quants", "Q4_0", "--device",
        "orin-nano-8gb", "--deadline-ms", f"{deadline_ms:g}", "--mode", "event"])
    check_quant_flags(args)
    s, quants = checked_stream(args)
    (label, inputs), = stream_levels(args, quants, s)
    (found,) = answers_for(prepare_levels([(label, inputs, None)]), draws=1, curve=False,
                           find_rate=True, miss_target=args.miss_target)
    cap = found.capacity or {}
    held = cap.get("speed_held") or 1.0
    rows = []
    for speed in np.geomspace(held / 4, held * 4, points):
        (a,) = answers_for(prepare_levels([(label, replace(inputs, speed=float(speed)), None)]),
                           draws=1, curve=False, miss_target=args.miss_target)
        rows.append({"speed": float(speed), "miss_rate": float(a.miss_rate),
                     "held": bool(a.miss_rate <= args.miss_target)})
    below = [r for r in rows if r["speed"] <= held]
    above = [r for r in rows if r["speed"] > cap.get("speed_failed", held)]
    return {"level": "Q4_0", "device": "orin-nano-8gb", "miss_target": args.miss_target,
            "search": cap, "sweep": rows,
            "sweep_below_held_all_hold": all(r["held"] for r in below),
            "sweep_above_failed_any_fail": any(not r["held"] for r in above) if above else None}


def main() -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--deadline-ms", type=float, default=1500.0)
    ap.add_argument("--commands", type=int, default=None,
                    help="the first N commands of steady_operator (default: all 60)")
    ap.add_argument("--sweep-points", type=int, default=13)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    stream: Path = SHIPPED_DIR / "steady_operator"
    if args.commands is not None:
        root = Path(tempfile.mkdtemp(prefix="bench-envelope-"))
        commands = read_stream(stream).commands[: args.commands]
        stream = write_jsonl(root / "steady_operator.jsonl", list(commands))
        (root / "labels.jsonl").write_bytes((SHIPPED_DIR / "steady_operator" /
                                             "labels.jsonl").read_bytes())
    times = timed_runs(envelope_argv(stream, args.deadline_ms), args.repeats)
    return emit_result({
        "code": os.environ.get("PYTHONPATH", ""), "stream": str(stream), "model": MODEL,
        "quants": list(QUANTS), "devices": DEVICES, "deadline_ms": args.deadline_ms,
        "cpus": os.cpu_count(), "envelope": times, "target_s": TARGET_S,
        "met": times["median_s"] <= TARGET_S,
        "capacity_vs_sweep": speed_sweep(stream, args.deadline_ms, args.sweep_points)},
        args.out)


if __name__ == "__main__":
    sys.exit(main())
