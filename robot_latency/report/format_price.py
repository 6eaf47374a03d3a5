"""The output format's price: what writing the plan as JSON costs against the compact action
language, here (measured) and on the target (simulated), per configuration.

A report whose runs use more than one planner profile (``bundled-json`` beside the compact
``bundled-actions``, say) opens with this table, next to the target's answer. Per configuration:

* tokens per plan, p50 / p95: the untimed pass's complete plans (the stream's commands, as the
  target answer counts them), else the model's own plans in this run;
* model plan time here, p50 / p95: from the cycle's start to the model's last token, the model's
  plans only (what a deadline must cover besides the margins and any queueing);
* deadline miss here: the run's rate at its deadline (a plan published late, or none);
* on the target: the predicted e2e p50, receiver miss rate [95%] at the same deadline and the
  smallest deadline held at the stated miss rate (:mod:`robot_latency.planner.target_sim`).

The smallest deadline held is stated for the target only: here one run measures one deadline.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from robot_latency.records import CycleRecord
from robot_latency.report.rundir import RunData
from robot_latency.report.table import markdown_lines

__all__ = ["format_price_lines", "run_profile"]


def run_profile(run: RunData, answer: Any | None) -> str:
    """Return the planner profile a run used: its simulated answer's, else its manifest's
    settings, else ``default`` (the shipped compact action language)."""
    if answer is not None and answer.facts.get("profile"):
        return str(answer.facts["profile"])
    settings = (run.manifest or {}).get("settings") or {}
    return str(settings.get("profile") or "default")


def _model_plans(records: Sequence[CycleRecord]) -> list[CycleRecord]:
    return [r for r in records if r.plan_source == "model" and r.token_ns
            and r.started_ns is not None]


def _p50_p95(values: Sequence[float], fmt: str) -> str:
    if not values:
        return "-"
    p50, p95 = np.percentile(np.asarray(values, dtype=np.float64), [50, 95])
    return f"{p50:{fmt}} / {p95:{fmt}}"


def format_price_lines(runs: Sequence[RunData], rows: Sequence[Any],
                       answers: Sequence[Any | None]) -> list[str]:
    """Markdown lines of the output format's price; [] when every run used one profile.

    Args:
        runs: the runs, in report order.
        rows: their comparison rows (:class:`robot_latency.report.compare.ComparisonRow`).
        answers: their simulated answers on the target (None where a run has none).
    """
    profiles = [run_profile(r, a) for r, a in zip(runs, answers, strict=True)]
    if len(set(profiles)) < 2:
        return []
    table = []
    for run, row, answer, profile in zip(runs, rows, answers, profiles, strict=True):
        plans = _model_plans(run.records)
        per_plan = answer.facts.get("tokens_per_plan") if answer is not None else None
        tokens = (f"{per_plan[0]} / {per_plan[1]}" if per_plan
                  else _p50_p95([float(len(r.token_ns)) for r in plans], ".0f"))
        plan_ms = [(r.token_ns[-1] - int(r.started_ns or 0)) / 1e6 for r in plans]
        miss = row.deadline_miss_rate
        target = ["-", "-", "-"]
        if answer is not None:
            target = ["-" if answer.e2e_p50_ms is None else f"{answer.e2e_p50_ms:.0f}",
                      f"{100 * answer.miss_rate:.1f}% [{100 * answer.miss_interval[0]:.1f}, "
                      f"{100 * answer.miss_interval[1]:.1f}]",
                      "-" if answer.min_deadline_ms is None else f"{answer.min_deadline_ms:g}"]
        table.append([run.label, profile, tokens, _p50_p95(plan_ms, ".0f"),
                      "-" if miss is None else f"{100 * miss:.1f}%", *target])
    device = next((a.device_id for a in answers if a is not None), None)
    deadline = next((a.deadline_ms for a in answers if a is not None), None)
    on = f" on {device}" if device else ""
    held = (f"smallest deadline held{on} ms" if device else "smallest deadline held ms")
    header = ["config", "profile (output format)", "tokens per plan p50 / p95",
              "model plan time here p50 / p95 ms", "deadline miss here",
              f"predicted e2e p50{on} ms", f"predicted receiver miss{on} [95%]", held]
    at = f" at {deadline:g} ms" if deadline is not None else ""
    return ["## The output format's price", "",
            f"The same commands planned in each output format{at}: the tokens each plan takes, "
            "what they cost on this host, and what they cost on the target. The smallest "
            "deadline held is the target's (simulated over a grid of deadlines); here one run "
            "measures one deadline.", "", *markdown_lines(header, table, aligned=False), ""]
