"""The Markdown report: comparison table, tail diagnosis per configuration, plots, caveats.

``write_report(run_dirs, out_dir)`` writes into ``out_dir``: ``report.md`` (opening with the
target's answer per level, :mod:`robot_latency.report.target`, and ``target_e2e.png``), the PNGs
of :data:`robot_latency.report.plots.PLOTS` (those with data), and the comparison as
``comparison.csv`` and ``comparison.json`` (columns in :mod:`robot_latency.report.compare`).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from robot_latency.profiles.labels import LabelSet
from robot_latency.report.client import (
    EdgeComparison,
    edge_section,
    load_edges,
    plot_reaction_cdf,
)
from robot_latency.report.compare import compare_loaded, to_csv, to_json, to_markdown
from robot_latency.report.correctness import correctness_for, correctness_markdown
from robot_latency.report.diagnose import (
    CAUSES,
    PREFILL_SHARE,
    QUEUE_SHARE,
    STALL_FACTOR,
    STEAL_SHARE,
    Bucket,
    Diagnosis,
    diagnose,
)
from robot_latency.report.envelope_report import envelope_section
from robot_latency.report.format_price import format_price_lines
from robot_latency.report.plots import write_plots
from robot_latency.report.rundir import RunData, load_runs, replay_mode
from robot_latency.report.table import fmt, markdown_lines, pct
from robot_latency.report.target import (
    plot_target_e2e,
    simulated_answers,
    simulated_section,
    target_level,
    target_section,
)
from robot_latency.report.target_answer import CURVE_PLOT, plot_deadline_curve
from robot_latency.report.vision_runs import vision_markdown, vision_row
from robot_latency.stats import P99_MIN_SAMPLES, energy_per_plan

log = logging.getLogger(__name__)

REPORT_NAME = "report.md"

#: The predicted target e2e plot of the opening section.
TARGET_PLOT = "target_e2e.png"

_PLOT_TITLES = {
    "itl_cdf.png": "ITL CDF with floor lines",
    "ttft_cdf.png": "TTFT CDF",
    "miss_rate.png": "Miss rate with 95% intervals",
    "phase_timeline.png": "Phase timeline of the slowest cycles",
    "measured_vs_predicted.png": "Measured vs predicted ITL",
    "reaction_cdf.png": "Reaction time CDF: client edge against planner",
}


#: What ``robot-latency run`` (and the demo, for all its runs) writes about the host's load
#: over a run (robot_latency/hostcheck/load.py, a layer above: its name is repeated here).
HOST_LOAD_FILE = "host_load.json"


def host_load_warning(run_dir: str | os.PathLike[str]) -> str | None:
    """Return the overload warning recorded for a run: its directory's ``host_load.json``, else
    its parent's (a demo's or sweep's, for all its runs); None when there is none or the host
    was not overloaded."""
    for where in (Path(run_dir), Path(run_dir).parent):
        path = where / HOST_LOAD_FILE
        if not path.is_file():
            continue
        try:
            return json.loads(path.read_text()).get("warning")
        except (OSError, ValueError, AttributeError) as err:
            log.warning("%s: cannot read: %s", path, err)
            return None
    return None


def _host_lines(runs: Sequence[RunData], warnings: Sequence[str | None]) -> list[str]:
    lines = []
    for run, warning in zip(runs, warnings, strict=True):
        if warning:
            lines += [f"> **Host overloaded** ({run.label}): {warning}.", ""]
    return lines


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return markdown_lines(header, rows, aligned=False)


def _sample_warnings(run: RunData, diag: Diagnosis) -> list[str]:
    t = diag.tail
    counts = {
        "TTFT": sum(1 for r in run.records if r.ttft_ns is not None),
        "ITL": t.itl_n,
        "TPOT": t.tpot_n,
        "E2E": t.e2e_n,
    }
    return [f"{name} p99 from only {n} samples (fewer than {P99_MIN_SAMPLES}: not stable)"
            for name, n in counts.items() if 0 < n < P99_MIN_SAMPLES]


def _buckets(title: str, buckets: Sequence[Bucket]) -> list[str]:
    if not buckets:
        return [f"{title}: no data.", ""]
    rows = [[f"{b.lo}" if b.lo == b.hi else f"{b.lo}-{b.hi}", str(b.n),
             pct(b.deadline_miss_rate), pct(b.model_miss_rate),
             fmt(b.e2e_p50_ms, ".1f"), fmt(b.e2e_p99_ms, ".1f"), str(b.e2e_n)]
            for b in buckets]
    return [f"{title}:", "", *_table(["tokens", "cycles", "deadline miss", "model miss",
                                      "E2E p50 ms", "E2E p99 ms", "E2E n"], rows), ""]


#: Misses listed with their parts per run.
SLOWEST_MISSES = 10


def _slowest_misses(diag: Diagnosis) -> list[str]:
    """The slowest misses, each split into its parts (ms) and the tokens it had produced."""
    misses = sorted(diag.misses, key=lambda m: -(m.cycle_ms or 0.0))[:SLOWEST_MISSES]
    if not misses:
        return []
    rows = [[str(m.cycle), m.cause, "deadline" if m.deadline_miss else "model",
             fmt(m.cycle_ms, ".1f"),
             ", ".join(f"{k} {v:.1f}" for k, v in m.parts_ms.items()) or "-",
             str(m.tokens_out)] for m in misses]
    return [f"Slowest misses ({len(misses)} of {len(diag.misses)}), by part:", "",
            *_table(["cycle", "cause", "miss", "cycle ms", "parts (ms)", "tokens"], rows), ""]


def _diagnosis_section(run: RunData, diag: Diagnosis) -> list[str]:
    t = diag.tail
    lines = [f"### {run.label}", ""]
    if replay_mode(run) == "asap":
        lines += ["**Replayed as fast as possible (asap)**: commands were not paced at their "
                  "recorded times, so queueing and misses reflect saturation, not the operator's "
                  "pace.", ""]
    lines += [
        f"- cycles: {diag.cycles}; deadline: {fmt(diag.deadline_ms, 'g')} ms; "
        f"deadline misses (late or skipped): {diag.deadline_misses}; "
        f"model misses (fallback answered): {diag.model_misses}",
        f"- E2E p99/p50 = {fmt(t.e2e_ratio)} (n={t.e2e_n}); TPOT p99/p50 = {fmt(t.tpot_ratio)} "
        f"(n={t.tpot_n}); ITL p99/p50 = {fmt(t.itl_ratio)} (n={t.itl_n})",
        f"- verdict: **{t.verdict}**",
    ]
    lines += [f"- warning: {w}" for w in _sample_warnings(run, diag)]
    lines.append("")
    if any(diag.causes.values()):
        rows = [[c, str(diag.causes_deadline[c]), str(diag.causes_model[c]), str(diag.causes[c])]
                for c in CAUSES if diag.causes[c]]
        lines += ["Miss causes:", "",
                  *_table(["cause", "deadline misses", "model misses", "all (once each)"], rows),
                  ""]
        lines += _slowest_misses(diag)
    else:
        lines += ["No misses to attribute.", ""]
    if diag.phases:
        rows = [[p.phase, str(p.n), fmt(p.mean_ms), fmt(p.p99_ms),
                 pct(p.share)] for p in diag.phases]
        lines += ["Phase split:", "",
                  *_table(["phase", "cycles", "mean ms", "p99 ms", "share of cycle time"], rows),
                  ""]
    lines += _buckets("By prompt length (tokens in)", diag.prompt_buckets)
    lines += _buckets("By output length (tokens out)", diag.output_buckets)
    return lines


def _energy_lines(runs: Sequence[RunData]) -> list[str]:
    """J per plan, measured (the input rail integrated from one publish to the next), per run;
    ``not measured`` where no rail was readable, never 0."""
    lines = ["Energy per plan, measured (the module's input power integrated from the previous "
             "plan's publish to this one's):", ""]
    for run in runs:
        e = energy_per_plan(run.records)
        if e.get("n"):
            lines.append(f"- {run.label}: {e['p50']:.3f} J per plan (p50; p90 {e['p90']:.3f}, "
                         f"{e['n']} plans, {e['total_j']:.1f} J in all; {e['source']})")
        else:
            lines.append(f"- {run.label}: {e['source']}")
    return [*lines, ""]


def render_report(runs: Sequence[RunData], table_md: str,
                  plots: dict[str, Path | None], diagnoses: Sequence[Diagnosis],
                  edges: Sequence[EdgeComparison] = (), reference_note: str = "",
                  target_lines: Sequence[str] = (),
                  host_warnings: Sequence[str | None] = (), correctness_md: str = "") -> str:
    """Return the report's Markdown text; plot links are relative to the report.

    ``host_warnings``: per run, its overload warning (:func:`host_load_warning`) or None; a
    warning opens the report, before any figure.
    """
    lines = ["# Latency report", ""]
    if host_warnings:
        lines += _host_lines(runs, host_warnings)
    asap = [r.label for r in runs if replay_mode(r) == "asap"]
    if asap:
        lines += [f"> **As-fast-as-possible replay** (not at recorded times): {', '.join(asap)}. "
                  "Their latencies include self-inflicted queueing.", ""]
    lines += list(target_lines)
    if correctness_md:  # right, not only on time: correctness, goodput and the level named
        lines += [correctness_md, ""]
    lines += ["## Comparison", "", table_md, ""]
    if reference_note:
        lines += [reference_note, ""]
    lines += [
              "Rates are fractions of all cycles with Wilson 95% intervals. A *deadline miss* is a "
              "plan published late or a skipped cycle; a *model miss* is a cycle the model did "
              "not deliver and a fallback answered, whatever the reason (every fallback is a "
              "model miss). Floor efficiency = host ITL floor / measured "
              "ITL p50. Data: [comparison.csv](comparison.csv), "
              "[comparison.json](comparison.json).", ""]
    lines += _energy_lines(runs)
    lines += edge_section(edges)
    lines += ["## Plots", ""]
    for name, path in plots.items():
        title = _PLOT_TITLES.get(name, name)
        if path is None:
            lines.append(f"- {title}: not drawn (no data)")
        else:
            lines.append(f"- [{title}]({name})")
    lines.append("")
    for name, path in plots.items():
        if path is not None:
            lines += [f"![{_PLOT_TITLES.get(name, name)}]({name})", ""]
    lines += ["## Tail diagnosis", "",
              "Each miss is attributed to the first matching cause: skipped; superseded (a newer "
              "command preempted it); engine_fault (the engine failed, or the server was "
              "unreachable, failing or malformed); invalid_output (the model's output did not "
              "validate); bad_command (a bad or no command); "
              "host_steal (a hypervisor stopped the machine for at least the lateness, or for "
              f"> {STEAL_SHARE:.0%} of the deadline); publish_late (the model's last token "
              "came in time, the plan went out late); "
              f"queueing (queue wait > {QUEUE_SHARE:.0%} of the deadline); stall (one gap > "
              f"{STALL_FACTOR:g}x the run's median gap); prefill_too_long (prefill > "
              f"{PREFILL_SHARE:.0%} of the deadline, or no token at all); else decode_too_slow.",
              ""]
    for run, diag in zip(runs, diagnoses, strict=True):
        lines += _diagnosis_section(run, diag)
    return "\n".join(lines).rstrip() + "\n"


def _target_lines(runs: Sequence[RunData], answers: Sequence[Any | None],
                  rows: Sequence[Any], ref_run: RunData | None, out: Path) -> list[str]:
    """The opening section: the loop simulated on the target where the run directories keep an
    untimed pass (target.json), else each record's own prediction (this host's token counts);
    then, where the runs use more than one output format, its price."""
    price = format_price_lines(runs, rows, answers)
    if any(a is not None for a in answers):
        plot = plot_deadline_curve([a for a in answers if a is not None], out / CURVE_PLOT)
        return [*simulated_section(answers, plot), *price]
    levels = [target_level(r, ref_run, runs) for r in runs]
    target_plot = plot_target_e2e(levels, out / TARGET_PLOT)
    return ["> No untimed pass in these run directories (target.json): the predictions below "
            "take each cycle's token counts from how far this host got, so they depend on this "
            "host's speed.", "", *target_section(levels, rows, target_plot), *price]


def write_report(run_dirs: Sequence[str | os.PathLike[str]], out_dir: str | os.PathLike[str],
                 *, reference: str | None = None, labels: LabelSet | None = None,
                 transport_margin_ms: float | None = None) -> Path:
    """Write the plots, the comparison files and ``report.md`` for finished runs.

    Args:
        run_dirs: directories written by ``robot-latency run``, one per configuration.
        out_dir: where to write (created if needed).
        reference: label of the configuration plan agreement is measured against (default:
            the highest precision, :func:`robot_latency.report.compare.choose_reference`).
        labels: the commands' labels, for runs whose records were not judged as they ran (a
            ROS run); records that carry ``plan_correct`` need none.
        transport_margin_ms: the target's transport margin measured on the robot, for the
            simulated answer (None: the stated default; never this host's).

    Returns:
        The path of ``report.md``.

    Raises:
        RunDirError: a run directory lacks a file or cannot be read (names both).
        ReportError: ``reference`` names no run.
    """
    runs = load_runs(run_dirs)
    rows = compare_loaded(runs, reference=reference, run_dirs=run_dirs,
                          transport_margin_ms=transport_margin_ms)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    to_csv(rows, out / "comparison.csv")
    to_json(rows, out / "comparison.json")
    plots = write_plots(runs, out)
    edges = load_edges(runs, run_dirs)
    if edges:
        plots["reaction_cdf.png"] = plot_reaction_cdf(edges, out / "reaction_cdf.png")
    # each record's own deadline budget is the truth; the manifest's is only a label
    diagnoses = [diagnose(r.records) for r in runs]
    ref = rows[0] if rows else None
    note = (f"Plan agreement and TPOT ratios are against **{ref.reference}**: "
            f"{ref.reference_reason}." if ref is not None and ref.reference else "")
    # The opening section: the target's answer per level (robot_latency.report.target).
    ref_run = next((r for r in runs if ref is not None and r.label == ref.reference), None)
    answers = simulated_answers(runs, run_dirs, transport_margin_ms=transport_margin_ms)
    judged = correctness_for(runs, run_dirs, labels=labels, comparison=out / "comparison.json",
                             transport_margin_ms=transport_margin_ms)
    text = render_report(runs, to_markdown(rows), plots, diagnoses, edges,
                         reference_note=note,
                         target_lines=[*_target_lines(runs, answers, rows, ref_run, out),
                                       *envelope_section([r.label for r in runs], run_dirs, out,
                                                         transport_margin_ms=transport_margin_ms)],
                         host_warnings=[host_load_warning(d) for d in run_dirs],
                         correctness_md=correctness_markdown(judged) if judged else "")
    seen = [row for run in runs if (row := vision_row(run.label, run.records)) is not None]
    if seen:  # runs that planned with a camera frame: its part (report/vision_runs.py)
        text += "\n## The camera frame\n\n" + vision_markdown(seen) + "\n"
    path = out / REPORT_NAME
    path.write_text(text, encoding="utf-8")
    log.info("report written to %s (%d configurations)", path, len(runs))
    return path
