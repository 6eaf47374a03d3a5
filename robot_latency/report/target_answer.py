"""The target's answer, simulated (:mod:`robot_latency.planner.target_sim`), as text and a plot.

One rendering for ``robot-latency predict --stream`` and the report's first section: per level
the predicted receiver miss rate with its interval, the model plans in time, e2e p50/p99 and the
smallest deadline held at the stated miss rate; the deadline curve as a table and a plot; one line
per level on what the answer rests on.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from robot_latency.floor.steps import StepPredictor
from robot_latency.planner.capacity import find_rate as search_rate
from robot_latency.planner.config import RunSettings
from robot_latency.planner.target_image import (
    ImageLevel,
    ImageSetting,
    frame_age,
    image_budget,
    image_commands,
)
from robot_latency.planner.target_inputs import TargetInputs
from robot_latency.planner.target_sim import (
    DEFAULT_DRAWS,
    DEFAULT_MISS_TARGET,
    SimCommand,
    TargetAnswer,
    deadline_grid,
    pass_facts,
    sim_commands,
    target_answer,
    target_rules,
)
from robot_latency.report.figsave import save_png
from robot_latency.report.table import markdown_lines, n_sources

log = logging.getLogger(__name__)

#: The deadline-curve plot's file name in the report.
CURVE_PLOT = "target_deadline_curve.png"


@dataclass(frozen=True)
class PreparedLevel:
    """One level made ready to simulate: its inputs, the loop's rules on the target (and where
    the transport margin comes from), its step predictor and its commands (with the camera
    frame where ``image`` is set)."""

    label: str
    inputs: TargetInputs
    rules: RunSettings
    margin_source: str
    steps: StepPredictor
    cmds: list[SimCommand]
    image: ImageLevel | None = None


def prepare_levels(levels: Sequence[tuple[str, TargetInputs, RunSettings | None]], *,
                   transport_margin_ms: float | None = None,
                   image: ImageSetting | None = None) -> list[PreparedLevel]:
    """Predict each level's commands on its target and set the target's loop rules (the first
    half of :func:`answers_from_inputs`; ``envelope`` also reads the commands for the energy).
    ``image``: each cycle plans with a camera frame (:mod:`robot_latency.planner.target_image`)."""
    out = []
    for label, inputs, rules in levels:
        steps = inputs.predictor()
        level = None
        target, source = target_rules(rules or inputs.settings,
                                      transport_margin_ms=transport_margin_ms)
        if image is None:
            cmds = sim_commands(inputs.stream, inputs.untimed, steps, speed=inputs.speed)
        else:
            level = image_commands(inputs.stream, inputs.untimed, steps, image,
                                   speed=inputs.speed, rules=target)
            cmds = level.cmds
        out.append(PreparedLevel(label, inputs, target, source, steps, cmds, level))
    return out


def answers_from_inputs(levels: Sequence[tuple[str, TargetInputs, RunSettings | None]], *,
                        draws: int = DEFAULT_DRAWS, miss_target: float = DEFAULT_MISS_TARGET,
                        transport_margin_ms: float | None = None,
                        find_rate: bool = False,
                        image: ImageSetting | None = None) -> list[TargetAnswer]:
    """Simulate each level from its inputs, on one deadline grid for the curve: the one path
    ``predict --stream``, ``run``/``sweep --target-answer``, ``envelope`` and the report take.

    Args:
        levels: (label, inputs, settings) per level; settings None: the inputs' own loop rules.
        draws: Monte Carlo draws.
        miss_target: the miss rate the smallest held deadline is stated at.
        transport_margin_ms: the target's transport margin measured on the robot; None: the
            stated default (:func:`~robot_latency.planner.target_sim.target_rules`). Never a
            margin this host measured.
        find_rate: also search each level's highest command rate held at ``miss_target``
            (:mod:`robot_latency.planner.capacity`; ``TargetAnswer.capacity``).
        image: each cycle plans with a camera frame: its encode and image prefill are in the
            TTFT (:mod:`robot_latency.planner.target_image`; ``facts["vision"]``).

    Raises:
        CapacityError: ``find_rate`` on a stream of fewer than two commands at different times.
    """
    prepared = prepare_levels(levels, transport_margin_ms=transport_margin_ms, image=image)
    return answers_for(prepared, draws=draws, miss_target=miss_target, find_rate=find_rate)


def answers_for(prepared: Sequence[PreparedLevel], *, draws: int = DEFAULT_DRAWS,
                miss_target: float = DEFAULT_MISS_TARGET, find_rate: bool = False,
                curve: bool = True) -> list[TargetAnswer]:
    """Simulate prepared levels (:func:`prepare_levels`) on one deadline grid: the second half of
    :func:`answers_from_inputs`, with its arguments (``curve`` False: no deadline curve)."""
    if not prepared:
        return []
    grid = deadline_grid([c for p in prepared for c in p.cmds], prepared[0].rules) \
        if curve else None
    out = []
    for p in prepared:
        rules = p.rules
        a = target_answer(p.label, p.cmds, p.steps, rules, draws=draws,
                          miss_target=miss_target, grid=grid, curve=curve,
                          rests_on={"untimed_pass": p.inputs.untimed.key[:12]})
        facts = {**pass_facts(p.inputs.untimed, p.steps, rules),
                 "assumption": p.inputs.assumption, "profile": p.inputs.untimed.profile,
                 "publish_margin_ms": rules.publish_margin_ms,
                 "transport_margin_ms": rules.transport_margin_ms,
                 "transport_margin_source": p.margin_source}
        if p.image is not None:
            facts["vision"] = {**p.image.facts(), **frame_age(p.image, a)}
            if p.image.setting.policy == "every" and facts.get("prompt_tokens"):
                prompts = list(zip(facts["prompt_tokens"], facts["context_tokens"], strict=True))
                facts["budget_tokens"] = image_budget(p.image, p.steps, rules, prompts)
        capacity = None
        if find_rate:
            capacity = search_rate(p.cmds, p.steps, rules, miss_target=miss_target,
                                   base_speed=p.inputs.speed).to_dict()
        out.append(replace(a, facts=facts, capacity=capacity))
    return out


def first_line(answers: Sequence[TargetAnswer]) -> str | None:
    """The line an answer opens with when its pass found no valid plan for some commands, or
    cut outputs at ``max_tokens`` (counts per level); None when it found neither."""
    parts, cut = [], False
    for a in answers:
        f = a.facts
        if not f or not (f.get("no_valid_plan") or f.get("cut_at_max_tokens")):
            continue
        what = "the labelled plans" if f.get("engine") == "labels" else "the untimed pass"
        bits = []
        if f.get("no_valid_plan"):
            bits.append(f"no valid plan for {f['no_valid_plan']} of {f['asked']} commands")
        if f.get("cut_at_max_tokens"):
            cut = True
            bits.append(f"{f['cut_at_max_tokens']} outputs cut at max_tokens "
                        f"({f['max_tokens']})")
        parts.append(f"{a.label}: {what} had {' and '.join(bits)}")
    if not parts:
        return None
    return ("WARNING: " + "; ".join(parts) + " (a command with no valid plan gets the fallback "
            "on any device" + ("; a cut output is timed at max_tokens: raise --max-tokens or "
                               "the profile's output.max_tokens" if cut else "") + ").")


def budget_lines(answers: Sequence[TargetAnswer]) -> list[str]:
    """Per level: the output tokens that fit in the deadline on the target after the stream's
    p50 and p95 prompts, beside the model's own tokens per plan (Markdown lines)."""
    out = []
    for a in answers:
        f = a.facts
        if not f or f.get("budget_tokens") is None:
            continue
        (b50, b95), (u50, u95) = f["budget_tokens"], f["prompt_tokens"]
        plan = f.get("tokens_per_plan")
        own = "no complete plan" if plan is None else \
            f"the plans take {plan[0]} (p50) / {plan[1]} (p95) tokens"
        out.append(f"- {a.label}: in {a.deadline_ms:g} ms less {a.margin_ms:.1f} ms of margins, "
                   f"{b50} output tokens fit after a p50 prompt ({u50} uncached tokens), {b95} "
                   f"after a p95 prompt ({u95}); {own}.")
    return out


def vision_lines(answers: Sequence[TargetAnswer]) -> list[str]:
    """Where the cycles plan with a camera frame: the image's share of TTFT on the target per
    level, the vision status, then per level the frame's cost, the policy and the frame's age
    at the receiver (Markdown lines; none without a frame)."""
    seen = [(a, a.facts["vision"]) for a in answers if a.facts.get("vision")]
    if not seen:
        return []
    lines = ["Image share of TTFT on the target (point prediction): " + "; ".join(
        f"{a.label} {_pct(v['image_share_of_ttft'])}" for a, v in seen) + "."]
    for status in sorted({v["vision_status"] for _, v in seen}):
        lines.append(status + (" (read it as optimistic: docs/VISION.md); the encode takes "
                               "the prefill's error draw, its own is not drawn"
                               if status.startswith("vision uncalibrated") else "") + ".")
    if any(v["static_frame"] for _, v in seen):
        policy = {v["policy"] for _, v in seen}
        lines.append("The stream has no camera frames: one static scene is assumed, its frame "
                     "taken at each command's send" + (
                         "; with --image-policy reuse or fit only the first command encodes it "
                         "and the rest reuse its image tokens" if policy & {"reuse", "fit"}
                         else "") + ".")
    lines.append("")
    for a, v in seen:
        w, h = v["frame_px"]
        age = ("no model plan in time" if v["frame_age_p50_ms"] is None else
               f"frame age at the receiver p50 {v['frame_age_p50_ms']:.1f} / p99 "
               f"{v['frame_age_p99_ms']:.1f} ms over {v['plans']} model plans in time")
        if v["stale"] is not None:
            age += f", {v['stale']} stale (older than {v['max_frame_age_ms']:g} ms)"
        lines.append(f"- {a.label}: {v['tower']} ({v['projector']}, {v['image_size_px']} px), a "
                     f"{w}x{h} frame: {v['image_tokens']} image tokens, encode "
                     f"{v['encode_ms']:.1f} ms + image prefill {v['image_prefill_ms']:.1f} ms "
                     f"a frame; policy {v['policy']}: {v['frames_paid']} of "
                     f"{v['commands_asked']} commands encode a frame{_fit_words(v)}; {age}.")
    lines += ["", "Frame age: the frame's age at the command's arrival plus the plan's e2e "
              "(publish and transport not added)." + (
                  " The token budget counts a new frame's encode and image tokens beside the "
                  "uncached text tokens it names."
                  if any(v["policy"] == "every" for _, v in seen) else "")]
    return lines


def _fit_words(v: dict[str, Any]) -> str:
    """Policy ``fit``: the frame sizes encoded and the commands planned text-only."""
    fit = v.get("fit")
    if not fit:
        return ""
    sizes = ", ".join(f"{n} at {px}" for px, n in fit["frames_at_px"].items())
    return (f" ({sizes or 'none'}; {fit['text_only']} planned text-only, no frame size "
            "fitting the deadline)")


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _iv(iv: Sequence[float]) -> str:
    return f"[{100 * iv[0]:.1f}, {100 * iv[1]:.1f}]"


def answer_table(answers: Sequence[TargetAnswer]) -> list[str]:
    """Markdown lines: one row per level."""
    target = answers[0].miss_target if answers else DEFAULT_MISS_TARGET
    rows = [[a.label.replace("|", "\\|"), str(a.commands) + (f" (+{a.refused} refused)"
                                                              if a.refused else ""),
             f"{_pct(a.miss_rate)} {_iv(a.miss_interval)}",
             f"{_pct(a.model_in_time_rate)} {_iv(a.model_in_time_interval)}",
             "-" if a.e2e_p50_ms is None else f"{a.e2e_p50_ms:.1f} / {a.e2e_p99_ms:.1f}",
             f"{a.deadline_ms:g} (margins {a.margin_ms:.1f})",
             "-" if a.min_deadline_ms is None else f"{a.min_deadline_ms:g}"]
            for a in answers]
    header = ["level", "commands", "predicted receiver miss [95%]",
              "model plans in time [95%]", "predicted e2e p50 / p99 ms", "deadline ms",
              f"smallest deadline held at {100 * target:g}% ms"]
    return markdown_lines(header, rows, aligned=False)


def curve_table(answers: Sequence[TargetAnswer]) -> list[str]:
    """Markdown lines: predicted receiver miss rate against deadline, one column per level."""
    grid = sorted({d for a in answers for d, *_ in a.curve})
    if not grid:
        return []
    cells = {a.label: {d: (r, lo, hi) for d, r, lo, hi in a.curve} for a in answers}
    rows = []
    for d in grid:
        row = [f"{d:g}"]
        for a in answers:
            v = cells[a.label].get(d)
            row.append("-" if v is None else f"{_pct(v[0])} {_iv(v[1:])}")
        rows.append(row)
    return markdown_lines(["deadline ms", *(a.label for a in answers)], rows, aligned=False)


def _rate(cmd_s: float | None) -> str:
    return "-" if cmd_s is None else f"{cmd_s:.3g}"


def rate_held_text(c: dict[str, Any]) -> str:
    """A capacity's rate held (commands/s) with its interval, replay speed and miss rate."""
    lo, hi = c["rate_held_interval_cmd_s"]
    return "none (even the slowest tried misses)" if c["rate_held_cmd_s"] is None else (
        f"{_rate(c['rate_held_cmd_s'])} [{_rate(lo)}, {_rate(hi)}] "
        f"(x{c['base_speed'] * c['speed_held']:.3g}, {_pct(c['miss_held'])} missed)")


def rate_failed_text(c: dict[str, Any]) -> str:
    """A capacity's first rate that failed (commands/s), its replay speed and miss rate."""
    return "none (every speed tried held)" if c["rate_failed_cmd_s"] is None else (
        f"{_rate(c['rate_failed_cmd_s'])} (x{c['base_speed'] * c['speed_failed']:.3g}, "
        f"{_pct(c['miss_failed'])} missed)")


def capacity_table(answers: Sequence[TargetAnswer]) -> list[str]:
    """Markdown lines: per level, the highest command rate held at the miss target (with the
    rates held at the prediction's slow and fast ends), and the first rate that failed."""
    rows = [[a.label.replace("|", "\\|"),
             _rate(a.capacity["base_rate_cmd_s"] / a.capacity["base_speed"]),
             rate_held_text(a.capacity), rate_failed_text(a.capacity)]
            for a in answers if a.capacity]
    if not rows:
        return []
    target = answers[0].miss_target
    return markdown_lines(
        ["level", "stream at x1 cmd/s", f"highest rate held at {100 * target:g}% cmd/s "
         "[slow, fast end] (replay speed)", "first rate that failed cmd/s"], rows,
        aligned=False)


def rests_on(a: TargetAnswer) -> str:
    """One line: the calibration and its sources, the validation, the prefill's state."""
    r = a.rests_on
    basis = list(r.get("basis") or [])
    shown = ", ".join(basis[:4]) + (f" and {len(basis) - 4} more" if len(basis) > 4 else "")
    loso = r.get("leave_one_source_out")
    loso_text = (f"leave-one-source-out median error {100 * loso:.1f}%" if loso is not None
                 else "leave-one-source-out error not measured")
    count = r.get("source_count")
    if count is not None:
        shown = f"{n_sources(count)}: {shown}" if shown else n_sources(count)
    if r.get("source_widening_rel"):
        loso_text += (f" (one source: the interval widened by "
                      f"{100 * r['source_widening_rel']:.1f}% each side)")
    prefill_wide = (f"; one source: the TTFT interval widened by "
                    f"{100 * r['prefill_source_widening_rel']:.1f}% each side"
                    if r.get("prefill_source_widening_rel") else "")
    prefill = f"prefill calibrated (its error drawn too{prefill_wide})" \
        if r.get("prefill_calibrated") else \
        f"prefill uncalibrated ({r.get('prefill')}; its error is not drawn)"
    aside = list(r.get("set_aside") or [])
    if aside:
        shown += f"; set aside: {', '.join(aside)}"
    return (f"{a.label}: {r.get('engine_family')} on {r.get('device_id')}, {r.get('source')} "
            f"({r.get('scope')} scope; {shown or 'no rows'}); {loso_text}; {prefill}; "
            f"{a.draws} draws; {_pass_name(a)} {r.get('untimed_pass', '-')}.")


def _pass_name(a: TargetAnswer) -> str:
    return "labelled plans (no weights)" if a.facts.get("engine") == "labels" \
        else "untimed pass"


def answer_lines(answers: Sequence[TargetAnswer], *, curve: bool = True) -> list[str]:
    """The whole answer as Markdown lines: the warning of :func:`first_line` first where there
    is one, the camera frame's share and status (:func:`vision_lines`), what a pass without
    weights assumes, the table, the token budget, the margins, what
    it rests on, and the curve."""
    warn = first_line(answers)
    lines = [warn, ""] if warn else []
    vision = vision_lines(answers)
    lines += [*vision, ""] if vision else []
    assumed = sorted({a.facts["assumption"] for a in answers if a.facts.get("assumption")})
    lines += [f"The answer {text}." for text in assumed]
    per_plan = "; ".join(f"{a.label}: {a.facts['tokens_per_plan'][0]} / "
                         f"{a.facts['tokens_per_plan'][1]}" for a in answers
                         if a.facts.get("tokens_per_plan"))
    formats = sorted({a.facts["profile"] for a in answers if a.facts.get("profile")})
    if per_plan:
        lines.append(f"It holds for the output format of profile {', '.join(formats)}: tokens "
                     f"per plan (p50 / p95) {per_plan}.")
    lines += [""] if assumed or per_plan else []
    lines += answer_table(answers)
    budget = budget_lines(answers)
    if budget:
        lines += ["", "Token budget on the target (point prediction):", "", *budget]
    margins = sorted({(a.facts["publish_margin_ms"], a.facts["transport_margin_ms"],
                       a.facts["transport_margin_source"]) for a in answers
                      if "transport_margin_ms" in a.facts})
    lines += [""] + [f"Margins on the target: publish {p:g} ms (the loop's own), transport "
                     f"{t:g} ms ({src})." for p, t, src in margins]
    lines += ["", "What each level's answer rests on:", ""]
    lines += [f"- {rests_on(a)}" for a in answers]
    notes = [f"- {n}" for a in answers for n in a.rests_on.get("notes", [])]
    if notes:
        lines += ["", "Notes of the prediction:", "", *sorted(set(notes))]
    rates = capacity_table(answers)
    if rates:
        a0 = answers[0]
        lines += ["", f"Highest command rate held (the stream's arrivals scaled; predicted "
                  f"receiver miss at most {100 * a0.miss_target:g}% at the {a0.deadline_ms:g} "
                  "ms deadline, point prediction; in brackets the rate held with every "
                  "command at the slow and the fast end of the prediction's 80% interval):",
                  "", *rates]
    if curve:
        table = curve_table(answers)
        if table:
            lines += ["", "Deadline curve (predicted receiver miss rate [95%] at each deadline, "
                      "the same margins):", "", *table]
    return [*lines, ""]


def plot_deadline_curve(answers: Sequence[TargetAnswer],
                        path: str | os.PathLike[str]) -> Path | None:
    """Plot each level's predicted receiver miss rate against the deadline, with its interval
    band, and the stated miss rate; None without data."""
    if not any(a.curve for a in answers):
        log.info("deadline curve: nothing to plot")
        return None
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.2))
    ax = fig.add_subplot()
    for a in answers:
        if not a.curve:
            continue
        d = [c[0] for c in a.curve]
        line, = ax.plot(d, [100 * c[1] for c in a.curve], marker=".", label=a.label)
        ax.fill_between(d, [100 * c[2] for c in a.curve], [100 * c[3] for c in a.curve],
                        color=line.get_color(), alpha=0.15)
        if a.min_deadline_ms is not None:
            ax.axvline(a.min_deadline_ms, color=line.get_color(), ls=":", lw=1)
    target = answers[0].miss_target
    ax.axhline(100 * target, color="tab:red", lw=1, ls="--",
               label=f"{100 * target:g}% miss")
    ax.set_xlabel("deadline (ms)")
    ax.set_ylabel("predicted receiver miss rate (%)")
    ax.set_ylim(-2, 102)
    ax.set_title(f"On {answers[0].device_id} with {answers[0].engine_family}: miss rate "
                 "against deadline", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, framealpha=0.9)
    return save_png(fig, path)
