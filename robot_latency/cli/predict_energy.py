"""The energy part of ``predict``: J per output token and per plan, or "energy uncalibrated".

The power model is robot_latency.floor.energy's (published energy figures per device and mode);
the times are the prediction's (TTFT with ``--prompt-tokens``, ITL). ``--plan-tokens`` sets the
output tokens of one plan, ``--wait-ms`` the idle wait of its cycle.
"""

from __future__ import annotations

import argparse
from typing import Any

from robot_latency.cli.common import echo, nonneg_int
from robot_latency.floor.energy import ENERGY_COVERAGE, plan_energy, power_estimate
from robot_latency.floor.target import TargetPrediction
from robot_latency.report.table import n_sources

__all__ = ["add_energy_args", "echo_energy", "energy_answer"]


def add_energy_args(p: argparse.ArgumentParser) -> None:
    """Add ``--plan-tokens`` and ``--wait-ms`` to the ``predict`` parser."""
    p.add_argument("--plan-tokens", type=nonneg_int, default=None,
                   help="output tokens of one plan: also predict the energy per plan")
    p.add_argument("--wait-ms", type=float, default=0.0,
                   help="idle wait of the plan's cycle (counted where idle watts are known)")


def energy_answer(args: argparse.Namespace, pred: TargetPrediction) -> dict[str, Any]:
    """Return the ``energy`` entry of a prediction (J per token; J per plan if asked)."""
    power = power_estimate(pred.device_id, pred.engine_family)
    tokens = getattr(args, "plan_tokens", None)
    plan = plan_energy(power, ttft_ms=pred.ttft_pred_ms, itl_ms=pred.itl_pred_ms,
                       output_tokens=tokens or 1, wait_ms=getattr(args, "wait_ms", 0.0),
                       ttft_interval_ms=pred.ttft_pred_interval_ms,
                       itl_interval_ms=pred.itl_pred_interval_ms)
    out = plan.to_dict()
    out["plan_tokens"] = tokens
    out["interval_coverage"] = ENERGY_COVERAGE
    if tokens is None:  # J per token only: the "plan" of one token is not an answer
        for key in ("prefill_j", "decode_j", "wait_j", "energy_j", "energy_interval_j"):
            out[key] = None
    return out


def echo_energy(answer: dict[str, Any]) -> None:
    """Print the energy entry's lines."""
    power = answer["power"]
    if power["decode_watts"] is None:
        echo(f"  energy         {answer['status']}")
        return
    lo_w, hi_w = power["decode_watts_interval"]
    n = n_sources(len(power["sources"]))
    echo(f"  energy         {1e3 * answer['j_per_output_token']:.1f} mJ/token at "
         f"{power['decode_watts']:.2f} W decoding [{lo_w:.2f}, {hi_w:.2f}], {n} "
         f"({power['rail']} rail; {', '.join(power['basis'][:3])}...)")
    if answer["energy_j"] is not None:
        lo, hi = answer["energy_interval_j"]
        echo(f"  J per plan     {answer['energy_j']:.3f} J [{lo:.3f}, {hi:.3f}] "
             f"{100 * answer['interval_coverage']:.0f}% interval, {n} of watts "
             f"({answer['plan_tokens']} "
             f"tokens: prefill {answer['prefill_j'] or 0:.3f} J, decode {answer['decode_j']:.3f} "
             "J)")
    for note in answer["notes"]:
        echo(f"  note: {note}")
