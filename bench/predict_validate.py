"""Validation of the published tables: how far a prediction can be trusted beyond its own rows.

Computed from the shipped tables alone (no model, no machine: seconds on any host):

* decode, per engine family: leave-one-out (each row from a fit without it), leave-one-model-out
  (every row of its model left out: a model the table has never measured) and
  leave-one-source-out (every row of its source left out: its device's answer for a user whose
  build is a new setup), with the 80% interval's coverage; for leave-one-source-out, the
  interval that answer states (widened by the family's leave-one-source-out error where it
  then rests on one source) and the share of held-out sources' rows inside it;
* the source checks (each source against the others' fit; past x2 it is flagged and set aside
  from a device's answer) and, per device, how far dropping any one source moves the answer
  for Qwen2.5-0.5B, Llama-3.2-1B and Llama-3.2-3B at Q4_K_M;
* prefill: leave-one-out with the 80% TTFT interval's coverage, leave-one-model-out and
  leave-one-source-out;
* power modes: each mode of a source that measured three or more predicted from its other
  modes alone, with the decode compute ratio fitted without it, beside the bandwidth alone
  (robot_latency.floor.published_modes);
* energy: each published energy row's J per output token predicted from its setup's other rows
  (robot_latency.floor.energy), with the 80% interval's coverage.

    python bench/predict_validate.py [--table DECODE_YAML] [--prefill-table PREFILL_YAML]
        [--out docs/bench/predict_validate.json]

Targets (the issue's): prefill >= 12 rows from >= 3 sources and >= 3 devices, leave-one-out
median <= 20%, 80% coverage >= 75%; llama.cpp-CUDA leave-one-source-out median <= 20%; no
device's answer moves by more than 2x when any one source is dropped; leave-one-source-out
coverage of the decode table >= 80%. ``targets`` in the JSON says which are met.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchio import emit_result

from robot_latency.floor.energy import validate_energy
from robot_latency.floor.published import load_table, validate_table
from robot_latency.floor.published_checks import device_stability, validate_prefill
from robot_latency.floor.published_modes import validate_modes
from robot_latency.floor.published_prefill import load_prefill_table
from robot_latency.floor.published_support import leave_one_source_out_coverage


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    p.add_argument("--table", type=Path, default=None, help="decode table (default: shipped)")
    p.add_argument("--prefill-table", type=Path, default=None,
                   help="prefill table (default: shipped)")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)

    rows = load_table(args.table) if args.table else load_table()
    prefill_rows = load_prefill_table(args.prefill_table)
    decode = validate_table(rows)
    loso = leave_one_source_out_coverage(rows)
    stability = device_stability(rows=rows)
    prefill = validate_prefill(prefill_rows)
    modes = validate_modes(rows)
    energy = validate_energy()
    cuda, pf = decode["by_family"].get("llamacpp-cuda", {}), prefill["by_family"].get(
        "llamacpp-cuda", {})
    loso_cuda = loso["by_family"].get("llamacpp-cuda", {})
    summary = {
        "llamacpp_cuda": {
            "leave_one_out_median": cuda.get("median_abs_error"),
            "leave_one_model_out_median": cuda.get("new_model_median_abs_error"),
            "leave_one_source_out_median": loso_cuda.get("median_abs_error"),
            "leave_one_source_out_max": loso_cuda.get("max_abs_error"),
            "leave_one_source_out_coverage_80": loso_cuda.get("coverage_80"),
            "leave_one_source_out_coverage_80_unwidened": loso_cuda.get("coverage_80_unwidened"),
            "flagged_sources": [c["source"] for c in loso["source_checks"].get(
                "llamacpp-cuda", []) if c["flagged"]],
            "largest_device_move": stability["max_ratio"],
        },
        "prefill": {"rows": prefill["total_rows"], "sources": len(prefill["sources"]),
                    "devices": len(prefill["devices"]), "predicted": pf.get("predicted"),
                    "leave_one_out_median": pf.get("median_abs_error"),
                    "coverage_80": pf.get("coverage_80"),
                    "leave_one_model_out_median": pf.get("new_model_median_abs_error"),
                    "leave_one_source_out_median": pf.get("new_source_median_abs_error")},
        "power_modes": {k: modes[k] for k in (
            "predicted", "median_abs_error", "bandwidth_only_median_abs_error",
            "max_abs_error", "bandwidth_only_max_abs_error")}
        | {"ratios": modes["ratio_fits"]},
        "leave_one_source_out": {k: loso["all"][k] for k in (
            "predicted", "median_abs_error", "inside_80", "coverage_80",
            "coverage_80_unwidened", "widened")},
        "energy": {k: energy[k] for k in ("predicted", "sources", "devices", "median_abs_error",
                                          "max_abs_error", "coverage_80")},
    }

    def met(value: float | None, ok: bool) -> bool | None:
        return None if value is None else ok

    s, q = summary["llamacpp_cuda"], summary["prefill"]
    targets = {
        "prefill_rows_sources_devices": q["rows"] >= 12 and q["sources"] >= 3
        and q["devices"] >= 3,
        "prefill_loo_median_le_20pct": met(q["leave_one_out_median"],
                                           (q["leave_one_out_median"] or 1) <= 0.20),
        "prefill_coverage_ge_75pct": met(q["coverage_80"], (q["coverage_80"] or 0) >= 0.75),
        "llamacpp_loso_median_le_20pct": met(s["leave_one_source_out_median"],
                                             (s["leave_one_source_out_median"] or 1) <= 0.20),
        "loso_coverage_ge_80pct": met(summary["leave_one_source_out"]["coverage_80"],
                                      (summary["leave_one_source_out"]["coverage_80"] or 0)
                                      >= 0.80),
        "no_device_moves_past_2x": met(s["largest_device_move"],
                                       (s["largest_device_move"] or 9) <= 2.0),
        "energy_sources_devices": len(energy["sources"]) >= 2 and len(energy["devices"]) >= 2,
        "energy_loo_median_le_25pct": met(energy["median_abs_error"],
                                          (energy["median_abs_error"] or 1) <= 0.25),
        "energy_coverage_ge_75pct": met(energy["coverage_80"],
                                        (energy["coverage_80"] or 0) >= 0.75),
        "unseen_mode_beats_bandwidth_only": met(
            modes["median_abs_error"], (modes["median_abs_error"] or 9)
            < (modes["bandwidth_only_median_abs_error"] or 0)),
    }
    # the decode validation's keys at the top, as `robot-latency predict --validate --json`
    return emit_result({"summary": summary, "targets": targets, **decode,
                        "leave_one_source_out": loso, "device_stability": stability,
                        "prefill": prefill, "power_modes": modes, "energy": energy}, args.out)


if __name__ == "__main__":
    sys.exit(main())
