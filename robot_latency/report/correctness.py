"""Plans that are right, not only on time: correctness and goodput per level.

Per run (one quantization level, say), over the labelled commands, each counted once at its
first cycle (the cycle that planned it first; re-plans of the same command do not count again):

``correct_n``               labelled commands (an unlabelled one is left out)
``correct_rate``            share whose published plan (the model's, the fallback's, or a
                            refusal) matches the label, with a Wilson 95% interval
``goodput_rate``            share correct *and* on time: at the receiver where the run has a
                            client edge (``client.jsonl``), else at publish; Wilson interval
``*_model``/``*_fallback``  the same two over the commands the model, or the fallback, answered
``by_class``                per label class (its first action, or ``refuse``): n, correct,
                            goodput; a wrong ``stop`` is the costliest mistake
``refuse_rate``             share of ``refuse``-labelled commands refused
``in_domain_refuse_rate``   share of the other labelled commands refused (should be ~0)
``fallback_goodput_rule`` / ``fallback_goodput_hold``
                            goodput had the fallback been ``rule`` or ``hold`` on every cycle
                            it answered (the model's cycles as they were): the fallback judged
``target_in_time_rate``     share of those commands whose model plan the target answer predicts
                            in time there
``target_goodput_pred``     the predicted goodput on the target: with the loop simulated there
                            (``target.json``), each command's plan on the target judged, the
                            untimed pass's where its model plan is in time there, the run's
                            fallback's where it gives up, none where it is skipped or superseded
                            (``target_basis`` ``simulated``: nothing of this host's speed);
                            without it, ``correct_rate x`` the records' predicted in-time share
                            (``records``: this host's plans)
``frames``                  where its cycles planned with a camera frame: the frame scale and the
                            image tokens a frame took (median), so the level named is named with
                            its resolution; None for a text-only run

:func:`recommend` names the level to put on the robot: the highest predicted target goodput,
ties to the smaller file (measured goodput where no target answer exists, said so).

Records carry ``plan_correct`` when the run had labels; runs without (a ROS run, whose node saw
only text) are judged here against labels given by command id or text (:func:`judge_records`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from robot_latency.planner.fallback import WAIT_STEP_PLAN
from robot_latency.profiles.actions import STOP_STEP_PLAN, is_refusal
from robot_latency.profiles.labels import REFUSE_LABEL, LabelError, LabelSet
from robot_latency.profiles.rules import rule_plan_json
from robot_latency.records import CycleRecord
from robot_latency.report.client import read_client_rows
from robot_latency.report.rundir import RunData, frame_scale, load_run, model_field
from robot_latency.report.table import markdown_table, pct, rate_ci
from robot_latency.stats import wilson_interval

log = logging.getLogger(__name__)

__all__ = ["RULE", "CorrectnessRow", "correctness_for", "correctness_markdown", "correctness_rows",
           "judge_records", "level_correctness", "recommend", "write_correctness_json"]

#: The rule :func:`recommend` applies, in words (the report prints it).
RULE = ("the highest predicted goodput on the target (correct x in time there), ties to the "
        "smaller file")


@dataclass(frozen=True)
class CorrectnessRow:
    """One run's correctness and goodput (fields documented in the module)."""

    label: str
    quant: str | None
    model_bytes: int | None
    correct_n: int
    correct_rate: float | None
    correct_ci95: tuple[float, float] | None
    goodput_rate: float | None
    goodput_ci95: tuple[float, float] | None
    on_time_at: str
    n_model: int
    correct_rate_model: float | None
    goodput_rate_model: float | None
    n_fallback: int
    correct_rate_fallback: float | None
    goodput_rate_fallback: float | None
    by_class: dict[str, dict[str, Any]] = field(default_factory=dict)
    refuse_n: int = 0
    refuse_rate: float | None = None
    in_domain_refuse_rate: float | None = None
    fallback_goodput_rule: float | None = None
    fallback_goodput_hold: float | None = None
    better_fallback: str | None = None
    target_in_time_rate: float | None = None
    target_goodput_pred: float | None = None
    target_basis: str | None = None
    frames: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return the row as a JSON-ready dict."""
        return asdict(self)


def _rate(k: int, n: int) -> float | None:
    return k / n if n else None


def judge_records(records: Sequence[CycleRecord], labels: LabelSet) -> list[CycleRecord]:
    """Return the records with ``plan_correct``, ``label_kind`` and ``fallback_correct`` filled
    from ``labels`` where the run did not judge them itself (the bundled rule and hold plans
    stand for the fallback's alternatives)."""
    out = []
    for rec in records:
        label = labels.lookup(rec.command_id) if rec.label_kind is None else None
        if label is None:
            out.append(rec)
            continue
        plan_correct = label.judge(rec.plan) if rec.plan_source != "none" else None
        alternatives = None
        text = labels.text_of(rec.command_id)
        if rec.plan_source == "fallback" and text is not None:
            alternatives = {"rule": bool(label.judge(rule_plan_json(text) or STOP_STEP_PLAN)),
                            "hold": bool(label.judge(WAIT_STEP_PLAN))}
        out.append(dataclasses.replace(rec, plan_correct=plan_correct, label_kind=label.kind,
                                       fallback_correct=alternatives))
    return out


def _first_cycles(records: Sequence[CycleRecord]) -> list[CycleRecord]:
    seen: set[str] = set()
    out = []
    for rec in records:
        if rec.command_id is None or rec.command_id in seen or rec.label_kind is None:
            continue
        seen.add(rec.command_id)
        out.append(rec)
    return out


def _on_time(records: Sequence[CycleRecord], client: Sequence[Mapping[str, Any]] | None
             ) -> tuple[dict[str, bool], str]:
    """Return {command_id: on time} at the receiver where a client log exists, else publish."""
    if client:
        return ({str(r.get("command_id")): bool(r.get("deadline_met")) for r in client},
                "receiver")
    return {str(r.command_id): r.deadline_met for r in records}, "publish"


def _planning_of(inputs: Any) -> Any:
    """The profile an untimed pass ran under, ready for the loop; None (logged) if gone."""
    from robot_latency.profiles.profile import load_planning
    from robot_latency.profiles.profile_file import ProfileError

    try:
        return load_planning(inputs.untimed.profile)
    except ProfileError as err:
        log.warning("untimed pass %s: %s", inputs.untimed.key[:12], err)
        return None


def _labels_of(inputs: Any, planning: Any) -> LabelSet | None:
    """The labels of the stream an untimed pass ran (its commands' own and its bag's
    ``labels.jsonl``); None without any, or (logged) where the stream cannot be read."""
    from robot_latency.profiles.labels import label_schema
    from robot_latency.streams import StreamError
    from robot_latency.streams.reader import labels_of_stream

    try:
        return labels_of_stream(inputs.stream.source, schema=label_schema(planning.contract))
    except (LabelError, StreamError) as err:
        log.warning("labels of %s: %s", inputs.stream.source, err)
        return None


def _target_goodput(firsts: Sequence[CycleRecord], answer: Any, inputs: Any,
                    labels: LabelSet | None) -> tuple[float, float] | None:
    """(model plans in time, goodput) on the target over ``firsts``, from the simulated
    ``answer`` and its ``inputs`` (the untimed pass); None where the plans cannot be judged."""
    from robot_latency.planner.fallback import FallbackChain, FallbackContext

    planning = _planning_of(inputs)
    if labels is None and planning is not None:
        labels = _labels_of(inputs, planning)
    if planning is None or labels is None or not firsts:
        return None
    chain = FallbackChain.of_run(inputs.settings.fallback,
                                 hold_max_age_ms=inputs.settings.hold_max_age_ms,
                                 planning=planning)
    texts = {c.command_id: c.text for c in inputs.stream.commands}
    untimed = inputs.untimed.by_id()
    model_ids, fallback_ids = set(answer.model_in_time_ids), set(answer.fallback_ids)
    in_time = good = 0
    for rec in firsts:
        cid = str(rec.command_id).split("@", 1)[0]  # a ROS run tags its sends: id@n
        label, u = labels.lookup(cid, texts.get(cid)), untimed.get(cid)
        if label is None or u is None or not u.asked:
            # refused before the model: the loop's own answer, the same on any host
            good += bool(rec.plan_correct)
        elif cid in model_ids:
            in_time += 1
            good += bool(label.judge(u.plan))
        elif cid in fallback_ids:
            _, plan = chain.answer(FallbackContext(texts.get(cid), now_ns=0))
            good += bool(label.judge(plan))
    return in_time / len(firsts), good / len(firsts)


def level_correctness(run: RunData, *, client: Sequence[Mapping[str, Any]] | None = None,
                      labels: LabelSet | None = None,
                      target: tuple[Any, Any] | None = None) -> CorrectnessRow:
    """Return one run's correctness and goodput (see the module); ``target``: the run's
    simulated answer on the target and its inputs (``target.json``)."""
    records = judge_records(run.records, labels) if labels is not None else list(run.records)
    firsts = _first_cycles(records)
    on_time, where = _on_time(firsts, client)
    good = [r for r in firsts if r.plan_correct]
    timely = [r for r in good if on_time.get(str(r.command_id), r.deadline_met)]
    n = len(firsts)

    def split(rows: Sequence[CycleRecord]) -> tuple[int, float | None, float | None]:
        k = sum(1 for r in rows if r.plan_correct)
        g = sum(1 for r in rows if r.plan_correct and on_time.get(str(r.command_id), False))
        return len(rows), _rate(k, len(rows)), _rate(g, len(rows))

    by_source = {s: split([r for r in firsts if r.plan_source == s])
                 for s in ("model", "fallback")}
    by_class: dict[str, dict[str, Any]] = {}
    for kind in sorted({str(r.label_kind) for r in firsts}):
        kn, kc, kg = split([r for r in firsts if r.label_kind == kind])
        by_class[kind] = {"n": kn, "correct_rate": kc, "goodput_rate": kg}
    refuse = [r for r in firsts if r.label_kind == REFUSE_LABEL]
    domain = [r for r in firsts if r.label_kind != REFUSE_LABEL]
    alt = {}
    judged_fallbacks = [r for r in firsts if r.plan_source == "fallback"]
    if judged_fallbacks and all(r.fallback_correct for r in judged_fallbacks):
        model_good = sum(1 for r in timely if r.plan_source == "model")
        for policy in ("rule", "hold"):
            k = sum(1 for r in judged_fallbacks if (r.fallback_correct or {}).get(policy)
                    and on_time.get(str(r.command_id), r.deadline_met))
            alt[policy] = _rate(model_good + k, n)
    better = None
    if alt:
        better = max(("rule", "hold"), key=lambda p: (alt[p] or 0.0, p == "rule"))
    correct_rate = _rate(len(good), n)
    simulated = None if target is None else _target_goodput(firsts, *target, labels)
    if simulated is not None:
        (in_time, target_goodput), basis = simulated, "simulated"
    else:
        preds = [r.target_deadline_met_pred for r in firsts
                 if r.target_deadline_met_pred is not None]
        in_time = _rate(sum(1 for p in preds if p), len(preds))
        target_goodput = correct_rate * in_time if correct_rate is not None \
            and in_time is not None else None
        basis = "records" if target_goodput is not None else None
    return CorrectnessRow(
        label=run.label, quant=model_field(run, "quant"),
        model_bytes=model_field(run, "weight_bytes_total"),
        correct_n=n, correct_rate=correct_rate, correct_ci95=wilson_interval(len(good), n),
        goodput_rate=_rate(len(timely), n), goodput_ci95=wilson_interval(len(timely), n),
        on_time_at=where,
        n_model=by_source["model"][0], correct_rate_model=by_source["model"][1],
        goodput_rate_model=by_source["model"][2],
        n_fallback=by_source["fallback"][0], correct_rate_fallback=by_source["fallback"][1],
        goodput_rate_fallback=by_source["fallback"][2],
        by_class=by_class, refuse_n=len(refuse),
        refuse_rate=_rate(sum(1 for r in refuse if is_refusal(r.plan)), len(refuse)),
        in_domain_refuse_rate=_rate(sum(1 for r in domain if is_refusal(r.plan)), len(domain)),
        fallback_goodput_rule=alt.get("rule"), fallback_goodput_hold=alt.get("hold"),
        better_fallback=better, target_in_time_rate=in_time,
        target_goodput_pred=target_goodput, target_basis=basis, frames=_frames(run))


def _frames(run: RunData) -> str | None:
    """The frames a run planned with, in words (:class:`CorrectnessRow` ``frames``)."""
    tokens = sorted(r.image["tokens"] for r in run.records
                    if isinstance(r.image, dict) and r.image.get("tokens"))
    if not tokens:
        return None
    scale = frame_scale(run)
    at = "frames" if scale is None else f"frames at {scale:g}x"
    return f"{at}, {tokens[len(tokens) // 2]} image tokens a frame"


def correctness_rows(run_dirs: Sequence[str | os.PathLike[str]], *,
                     labels: LabelSet | None = None,
                     transport_margin_ms: float | None = None) -> list[CorrectnessRow]:
    """Read run directories and return one :class:`CorrectnessRow` each, in order
    (``transport_margin_ms``: the target's, for the simulated answer; None: the default)."""
    return correctness_for([load_run(d) for d in run_dirs], run_dirs, labels=labels,
                           keep_unlabelled=True, transport_margin_ms=transport_margin_ms)


def _targets(runs: Sequence[RunData], run_dirs: Sequence[str | os.PathLike[str]],
             transport_margin_ms: float | None = None) -> list[tuple[Any, Any] | None]:
    """Each run's simulated answer on the target and its inputs (None without ``target.json``)."""
    from robot_latency.planner.target_inputs import read_target_inputs
    from robot_latency.planner.untimed import UntimedError
    from robot_latency.report.target import simulated_answers

    out: list[tuple[Any, Any] | None] = []
    answers = simulated_answers(runs, run_dirs, transport_margin_ms=transport_margin_ms)
    for answer, d in zip(answers, run_dirs, strict=True):
        try:
            inputs = read_target_inputs(d) if answer is not None else None
        except UntimedError:  # simulated_answers logged it
            inputs = None
        out.append(None if inputs is None else (answer, inputs))
    return out


def correctness_for(runs: Sequence[RunData], run_dirs: Sequence[str | os.PathLike[str]], *,
                    labels: LabelSet | None = None,
                    comparison: str | os.PathLike[str] | None = None,
                    keep_unlabelled: bool = False,
                    transport_margin_ms: float | None = None) -> list[CorrectnessRow]:
    """Return the loaded runs' correctness rows, or [] when no command of any run is labelled
    (``keep_unlabelled``: the rows anyway).

    With ``comparison`` (a ``comparison.json``), its document gains ``"correctness"``: the
    rows, the rule and the level it names, and ``correctness.json`` is written beside it.
    """
    rows = []
    targets = _targets(runs, run_dirs, transport_margin_ms)
    for run, d, target in zip(runs, run_dirs, targets, strict=True):
        client = read_client_rows(d) if (Path(d) / "client.jsonl").exists() else None
        here = labels
        if here is None and target is not None and not any(r.label_kind for r in run.records):
            # a run whose loop saw only text (a ROS node): the labels of the stream it replayed
            planning = _planning_of(target[1])
            here = _labels_of(target[1], planning) if planning is not None else None
        rows.append(level_correctness(run, client=client, labels=here, target=target))
    if not any(r.correct_n for r in rows):
        return rows if keep_unlabelled else []
    if comparison is not None:
        path = Path(comparison)
        doc = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
        doc["correctness"] = _document(rows)
        path.write_text(json.dumps(doc, indent=2, allow_nan=False) + "\n", encoding="utf-8")
        write_correctness_json(rows, path.parent / "correctness.json")
    return rows


def recommend(rows: Sequence[CorrectnessRow]) -> tuple[CorrectnessRow | None, str]:
    """Return (the level to put on the robot, why), by :data:`RULE`."""
    scored = [r for r in rows if r.target_goodput_pred is not None]
    basis = "predicted target goodput"
    if not scored:
        scored, basis = [r for r in rows if r.goodput_rate is not None], "measured goodput here"
    if not scored:
        return None, "no labelled commands: no level can be named by correctness"
    best = max(scored, key=lambda r: (
        (r.target_goodput_pred if basis.startswith("predicted") else r.goodput_rate) or 0.0,
        -(r.model_bytes or 0)))
    value = best.target_goodput_pred if basis.startswith("predicted") else best.goodput_rate
    if not basis.startswith("predicted"):
        note = "; no target answer, so measured here"
    elif best.target_basis == "simulated":
        note = "; each plan judged as the loop simulated on the target gives it"
    else:
        note = ("; from this host's plans, as no untimed pass was run (demo, or run and sweep "
                "with --target-answer)")
    named = best.label if best.frames is None else \
        f"{best.label} (level {best.quant or 'of its file'}, {best.frames})"
    why = f"{named}: {basis} {pct(value)} is the highest (rule: {RULE}{note})"
    return best, why


def correctness_markdown(rows: Sequence[CorrectnessRow]) -> str:
    """Return the per-level correctness section: a table, the per-class view, the fallback
    judged, and the named level with its rule."""
    def ci(rate: float | None, interval: tuple[float, float] | None) -> str:
        return rate_ci(rate, *(interval or (None, None)))

    table = markdown_table(
        ["config", "correct [95% CI]", "goodput [95% CI]", "n", "on time at",
         "model: correct / goodput (n)", "fallback: correct / goodput (n)",
         "refused of 'refuse'", "refused in domain", "goodput had fallback been rule / hold",
         "target in time", "pred. target goodput"],
        [[r.label, ci(r.correct_rate, r.correct_ci95), ci(r.goodput_rate, r.goodput_ci95),
          str(r.correct_n), r.on_time_at,
          f"{pct(r.correct_rate_model)} / {pct(r.goodput_rate_model)} ({r.n_model})",
          f"{pct(r.correct_rate_fallback)} / {pct(r.goodput_rate_fallback)} ({r.n_fallback})",
          f"{pct(r.refuse_rate)} ({r.refuse_n})", pct(r.in_domain_refuse_rate),
          f"{pct(r.fallback_goodput_rule)} / {pct(r.fallback_goodput_hold)}"
          + (f" ({r.better_fallback})" if r.better_fallback else ""),
          pct(r.target_in_time_rate), pct(r.target_goodput_pred)] for r in rows],
        aligned=False)
    kinds = sorted({k for r in rows for k in r.by_class})
    classes = markdown_table(
        ["config", *kinds],
        [[r.label, *(f"{pct(r.by_class[k]['correct_rate'])} ({r.by_class[k]['n']})"
                     if k in r.by_class else "-" for k in kinds)] for r in rows], aligned=False)
    best, why = recommend(rows)
    lines = ["## Plans that are right: correctness and goodput per level", "",
             "Over labelled commands, first cycle each; goodput = correct and on time "
             "(at the receiver where there is one). A refusal counts like any plan.", "",
             table, "", "Correct by the label's first action (n):", "", classes, "",
             f"**Put on the robot:** {why}." if best is not None else f"{why}."]
    return "\n".join(lines)


def write_correctness_json(rows: Sequence[CorrectnessRow], path: str | os.PathLike[str]) -> Path:
    """Write ``{"rule", "recommended", "why", "rows"}`` as JSON."""
    p = Path(path)
    p.write_text(json.dumps(_document(rows), indent=2, allow_nan=False) + "\n", encoding="utf-8")
    return p


def _document(rows: Sequence[CorrectnessRow]) -> dict[str, Any]:
    best, why = recommend(rows)
    return {"rule": RULE, "recommended": best.label if best else None, "why": why,
            "rows": [r.to_dict() for r in rows]}

