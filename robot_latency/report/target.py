"""The target's answer: will this model, at this level, meet the deadline on the target device?

Every cycle in which the model was asked gets a predicted end-to-end time on the target (the
record's ``target_e2e_pred_ms``: TTFT for its own uncached prompt tokens, plus ``tokens_out - 1``
predicted inter-token gaps, with the ITL prediction's interval). A cycle whose output was cut off
here (deadline, abort, no token at all) is predicted from its *planned* output length instead: the
tokens the reference level's plan took for the same command when that plan was complete, else
another level's complete plan for it (the levels' plans agree on 98-100% of the demo's
commands), else the run's ``max_tokens``; the report says how many cycles were predicted so and
from what.

Per level: the predicted miss rate (cycles whose predicted time exceeds their deadline) with its
Wilson 95% interval, and the prediction's band: the same rate with every cycle at the low and
at the high end of its interval. Skipped and fallback-only cycles (no model asked: a bad
command, no command) are left out, as are queueing and the publish: the target has its own.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from robot_latency.records import CycleRecord
from robot_latency.report.figsave import save_png
from robot_latency.report.rundir import RunData, target_device_id, target_prediction
from robot_latency.report.table import markdown_lines, pct, rate_ci
from robot_latency.stats import distribution, wilson_interval

log = logging.getLogger(__name__)

#: Stop reasons of an output that finished here.
_FINISHED = ("done", "complete")


@dataclass(frozen=True)
class TargetCycle:
    """One cycle's predicted end-to-end time on the target (ms)."""

    command_id: str | None
    e2e_ms: float
    lo_ms: float
    hi_ms: float
    deadline_ms: float
    tokens_out: int
    planned: str | None  # None: its own output; else where the planned length came from


@dataclass(frozen=True)
class TargetLevel:
    """One level's (run's) predicted answer on the target, beside what this host measured."""

    label: str
    device_id: str | None
    engine_family: str | None
    cycles: list[TargetCycle] = field(default_factory=list)
    left_out: int = 0  # cycles with no prediction (skipped, no model asked, no trace)

    @property
    def n(self) -> int:
        return len(self.cycles)

    def misses(self, end: str = "mid") -> int:
        """Cycles predicted past their deadline (``lo``/``hi``: at the interval's ends)."""
        attr = {"mid": "e2e_ms", "lo": "lo_ms", "hi": "hi_ms"}[end]
        return sum(1 for c in self.cycles if getattr(c, attr) > c.deadline_ms)

    def rate(self, end: str = "mid") -> float | None:
        return self.misses(end) / self.n if self.n else None

    def ci95(self) -> tuple[float, float] | None:
        return wilson_interval(self.misses(), self.n) if self.n else None

    @property
    def planned(self) -> dict[str, int]:
        """How many cycles were predicted from a planned length, by its source."""
        out: dict[str, int] = {}
        for c in self.cycles:
            if c.planned is not None:
                out[c.planned] = out.get(c.planned, 0) + 1
        return out


def _finished(rec: CycleRecord) -> bool:
    return rec.stop_reason in _FINISHED and bool(rec.token_ns)


def _max_tokens(run: RunData) -> int | None:
    for rec in run.records:
        value = (rec.target_pred or {}).get("max_tokens")
        if isinstance(value, int) and value > 0:
            return value
    value = ((run.manifest or {}).get("config") or {}).get("max_tokens")
    return value if isinstance(value, int) and value > 0 else None


def _reference_lengths(reference: RunData | None) -> dict[str, int]:
    """Tokens the reference's finished outputs took, per command (its first finished cycle)."""
    out: dict[str, int] = {}
    for rec in reference.records if reference is not None else ():
        if rec.command_id is not None and _finished(rec) and rec.command_id not in out:
            out[rec.command_id] = rec.tokens_out
    return out


def _parts(rec: CycleRecord, rel: tuple[float, float]) -> tuple[float, float, float, float] | None:
    """(ttft, itl, itl_lo, itl_hi) in ms for a record: its own target_pred, else its floor's."""
    pred = rec.target_pred
    if pred and pred.get("ttft_ms") is not None and pred.get("itl_ms") is not None:
        lo, hi = pred.get("itl_interval_ms") or (pred["itl_ms"], pred["itl_ms"])
        return float(pred["ttft_ms"]), float(pred["itl_ms"]), float(lo), float(hi)
    target = (rec.floor or {}).get("target") or {}
    ttft, itl = target.get("ttft_pred_ms"), target.get("itl_pred_ms")
    if ttft is None or itl is None:
        return None
    return float(ttft), float(itl), float(itl) * rel[0], float(itl) * rel[1]


def _interval_rel(run: RunData) -> tuple[float, float]:
    pred = target_prediction(run) or {}
    itl, interval = pred.get("itl_pred_ms"), pred.get("itl_pred_interval_ms")
    if itl and isinstance(interval, (list, tuple)) and len(interval) == 2:
        return float(interval[0]) / float(itl), float(interval[1]) / float(itl)
    return 1.0, 1.0


def target_level(run: RunData, reference: RunData | None,
                 others: Sequence[RunData] = ()) -> TargetLevel:
    """Predict every model cycle of ``run`` on its target (see the module docstring).

    ``others``: the other levels of the comparison, whose complete plans give a planned length
    where the reference has none for a command.
    """
    ref_len = _reference_lengths(reference if reference is not run else None)
    other_len: dict[str, int] = {}
    for other in others:
        if other is not run and other is not reference:
            for command_id, n in _reference_lengths(other).items():
                other_len.setdefault(command_id, n)
    max_tokens = _max_tokens(run)
    rel = _interval_rel(run)
    family = (target_prediction(run) or {}).get("engine_family")
    device = target_device_id(run)
    cycles: list[TargetCycle] = []
    for rec in run.records:
        if rec.skipped or rec.tokens_in is None:
            continue  # the model was not asked: nothing to predict
        parts = _parts(rec, rel)
        if parts is None:
            continue
        ttft, itl, lo, hi = parts
        deadline = rec.deadline_budget_ns / 1e6
        planned: str | None = None
        n = rec.tokens_out
        if not _finished(rec):
            if rec.command_id in ref_len:
                n, planned = max(n, ref_len[rec.command_id]), "the reference's plan length"
            elif rec.command_id in other_len:
                n, planned = max(n, other_len[rec.command_id]), "another level's plan length"
            elif max_tokens is not None:
                n, planned = max(n, max_tokens), "max_tokens"
            else:
                continue
        if n < 1:
            continue
        if planned is None and rec.target_e2e_pred_ms is not None \
                and rec.target_e2e_pred_interval_ms:
            e2e = rec.target_e2e_pred_ms
            lo_ms, hi_ms = rec.target_e2e_pred_interval_ms
        else:
            e2e, lo_ms, hi_ms = (ttft + (n - 1) * itl, ttft + (n - 1) * lo,
                                 ttft + (n - 1) * hi)
        cycles.append(TargetCycle(rec.command_id, e2e, lo_ms, hi_ms, deadline, n, planned))
        if rec.target_pred:
            family = rec.target_pred.get("engine_family") or family
            device = rec.target_pred.get("device_id") or device
    return TargetLevel(run.label, device, family, cycles, left_out=len(run.records) - len(cycles))


def target_section(levels: Sequence[TargetLevel], measured: Sequence[Any],
                   plot: Path | None) -> list[str]:
    """Return the report's opening section (Markdown lines): the answer on the target.

    Args:
        levels: one per run, in the comparison's order.
        measured: the comparison rows of the same runs (this host's measured rates).
        plot: the predicted-e2e plot, if drawn.
    """
    targets = sorted({(lv.device_id or "the target", lv.engine_family or "no engine family")
                      for lv in levels})
    where = "; ".join(f"{d} with {f}" for d, f in targets) or "the target"
    lines = [f"## On {where}", ""]
    if not any(lv.n for lv in levels):
        return [*lines, "No cycle could be predicted on the target (no calibrated prediction "
                "in the records: see the manifest's floor.target_prediction).", ""]
    lines += ["Will the model, at each level, meet its deadline there? Each cycle in which the "
              "model was asked is predicted on the target: TTFT for its own uncached prompt "
              "tokens + (its output tokens - 1) x the predicted ITL (`target_e2e_pred_ms` in "
              "cycles.jsonl). *Predicted miss* = predicted time past the cycle's deadline, with "
              "its Wilson 95% interval; the *band* is the same rate at the low and the high end "
              "of the ITL prediction's interval. Queueing and the publish are not included. "
              "Beside it, what this host measured.", ""]
    rows = []
    notes = []
    for lv, row in zip(levels, measured, strict=True):
        dist = distribution(c.e2e_ms for c in lv.cycles)
        ci = lv.ci95()
        deadlines = sorted({c.deadline_ms for c in lv.cycles})
        rows.append([
            lv.label.replace("|", "\\|"),
            f"{lv.device_id or '-'} / {lv.engine_family or '-'}",
            str(lv.n),
            "-" if ci is None else f"{pct(lv.rate())} [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]",
            "-" if not lv.n else f"{pct(lv.rate('lo'))} - {pct(lv.rate('hi'))}",
            "-" if dist.p50 is None else f"{dist.p50:.0f} / {dist.max:.0f}",
            ", ".join(f"{d:g}" for d in deadlines) or "-",
            _measured(row, "deadline_miss"),
            _measured(row, "model_miss"),
        ])
        if lv.left_out:
            notes.append(f"- {lv.label}: {lv.left_out} of {len(lv.cycles) + lv.left_out} cycles "
                         "left out of the predicted rate (skipped, no model asked, or no "
                         "trace here).")
        if lv.planned:
            how = ", ".join(f"{k} ({v})" for k, v in sorted(lv.planned.items()))
            whole = " (none of its outputs finished here)" if sum(lv.planned.values()) == lv.n \
                else ""
            notes.append(f"- {lv.label}: {sum(lv.planned.values())} of {lv.n} cycles predicted "
                         f"from the planned output length{whole}: {how}.")
    header = ["level", "target / engine family", "cycles", "predicted miss [95% CI]",
              "band", "predicted e2e p50 / max ms", "deadline ms",
              "measured here: deadline miss [95% CI]", "measured here: model miss [95% CI]"]
    lines += markdown_lines(header, rows, aligned=False)
    lines.append("")
    if notes:
        lines += ["Cycles left out, and cycles whose output never finished here (predicted "
                  "from their planned output length: the reference level's plan for the same "
                  "command when it finished, else another level's, else max_tokens):", "",
                  *notes, ""]
    if plot is not None:
        lines += [f"![Predicted end-to-end time on the target against the deadline]"
                  f"({plot.name})", ""]
    return lines


def _measured(row: Any, key: str) -> str:
    return rate_ci(getattr(row, f"{key}_rate", None), getattr(row, f"{key}_ci95_lo", None),
                   getattr(row, f"{key}_ci95_hi", None))


def plot_target_e2e(levels: Sequence[TargetLevel],
                    path: str | os.PathLike[str]) -> Path | None:
    """Plot each level's predicted target e2e per cycle, with its interval, against the
    deadline; hollow markers are cycles predicted from a planned length. None without data."""
    if not any(lv.n for lv in levels):
        log.info("target e2e plot: no predicted cycle")
        return None
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    fig = Figure(figsize=(max(5.0, 1.3 * len(levels) + 2.5), 4.2))
    ax = fig.add_subplot()
    for i, lv in enumerate(levels):
        for j, c in enumerate(lv.cycles):
            x = i + (j / max(1, lv.n - 1) - 0.5) * 0.5 if lv.n > 1 else i
            ax.plot([x, x], [c.lo_ms, c.hi_ms], color="tab:blue", lw=0.8, alpha=0.5)
            ax.plot([x], [c.e2e_ms], marker="o", ms=4, color="tab:blue",
                    mfc="none" if c.planned else "tab:blue", ls="none")
        for d in sorted({c.deadline_ms for c in lv.cycles}):
            ax.plot([i - 0.4, i + 0.4], [d, d], color="tab:red", lw=1.5)
    ax.set_xticks(range(len(levels)), [lv.label for lv in levels])
    ax.set_xlim(-0.6, len(levels) - 0.4)
    ax.set_ylim(bottom=0)
    ax.margins(y=0.1)
    ax.set_ylabel("predicted end-to-end on the target (ms)")
    families = sorted({f"{lv.device_id} / {lv.engine_family}" for lv in levels if lv.n})
    ax.set_title("Predicted target e2e per cycle: " + "; ".join(families), fontsize=9)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(handles=[
        Line2D([], [], marker="o", color="tab:blue", ls="none", label="own output length"),
        Line2D([], [], marker="o", color="tab:blue", mfc="none", ls="none",
               label="planned length"),
        Line2D([], [], color="tab:blue", lw=0.8, label="ITL interval"),
        Line2D([], [], color="tab:red", lw=1.5, label="deadline")],
        loc="best", fontsize=8, framealpha=0.9)
    return save_png(fig, path)


# --- the loop simulated on the target (robot_latency.planner.target_sim) -----------------------

def simulated_answers(runs: Sequence[RunData],
                      run_dirs: Sequence[str | os.PathLike[str]], *,
                      transport_margin_ms: float | None = None) -> list[Any]:
    """Return each run's simulated answer on the target (None where its directory keeps no
    ``target.json``, or a broken one: logged, the report goes on).

    The loop's rules are the run's own (``target.json``) with the target's margins
    (:func:`~robot_latency.planner.target_sim.target_rules`): ``transport_margin_ms`` measured
    on the robot, else the stated default. The margins this host's run kept (its records'
    ``margin_ns``) never enter: what the target keeps is the target's.
    """
    from robot_latency.floor.errors import FloorError
    from robot_latency.planner.target_inputs import read_target_inputs
    from robot_latency.planner.untimed import UntimedError
    from robot_latency.report.target_answer import answers_from_inputs

    found: list[tuple[int, tuple[str, Any, Any]]] = []
    for i, (run, d) in enumerate(zip(runs, run_dirs, strict=True)):
        try:
            inputs = read_target_inputs(d)
        except UntimedError as err:
            log.warning("target answer of %s: %s", run.label, err)
            continue
        if inputs is None:
            continue
        found.append((i, (run.label, inputs, None)))
    out: list[Any] = [None] * len(runs)
    try:
        answers = answers_from_inputs([f for _, f in found],
                                      transport_margin_ms=transport_margin_ms)
    except (FloorError, UntimedError) as err:
        log.warning("target answer: %s", err)
        return out
    for (i, _), answer in zip(found, answers, strict=True):
        out[i] = answer if answer.commands else None
    return out


def simulated_section(answers: Sequence[Any], plot: Path | None) -> list[str]:
    """Return the report's opening section from the simulated answers (Markdown lines)."""
    from robot_latency.report.target_answer import answer_lines, first_line

    have = [a for a in answers if a is not None]
    where = "; ".join(sorted({f"{a.device_id} with {a.engine_family}" for a in have}))
    warn = first_line(have)
    lines = [f"## On {where}", "", *([f"> **{warn}**", ""] if warn else []),
             "Will the model, at each level, meet its deadline there? The planner loop is "
             "simulated on the target for the replayed stream: each command's service time is "
             "the predicted TTFT of its uncached prompt + (its complete plan's tokens - 1) x "
             "the predicted ITL, with the tokens, the plan and the stop reason from an untimed "
             "pass of the same model, profile and grammar (nothing of this host's speed). "
             "The loop's own rules apply: arrivals, queueing or preemption, give-up at the "
             "deadline less the target's publish and transport margins (stated below; never "
             "the margins this host kept). A *receiver miss* "
             "is a command whose model output is not ready by then (or skipped, superseded); "
             "*model plans in time* are those in time with a valid plan. Intervals: a Monte "
             "Carlo over the prediction's error (one systematic draw per run), widened by the "
             "Wilson 95% interval over commands, not re-plans. Not modelled: the target's own "
             "loop overhead and other load on it.", ""]
    body = answer_lines(have)
    lines += body[2:] if warn else body  # the warning opens the section already
    missing = [i for i, a in enumerate(answers) if a is None]
    if missing:
        lines += [f"{len(missing)} level(s) have no untimed pass in their run directory "
                  "(target.json): not simulated (run or sweep with --target-answer).", ""]
    if plot is not None:
        lines += [f"![Predicted receiver miss rate against deadline on the target]"
                  f"({plot.name})", ""]
    return lines


def with_target_fields(row: Any, answer: Any) -> Any:
    """Return a comparison row with the simulated answer's fields (``target_pred_*``,
    ``target_min_deadline_ms``); unchanged without one."""
    from dataclasses import replace

    if answer is None:
        return row
    return replace(row, target_device=answer.device_id,
                   target_pred_miss_rate=float(answer.miss_rate),
                   target_pred_miss_interval=[float(v) for v in answer.miss_interval],
                   target_pred_e2e_p50_ms=answer.e2e_p50_ms,
                   target_pred_model_in_time_rate=float(answer.model_in_time_rate),
                   target_min_deadline_ms=answer.min_deadline_ms)
