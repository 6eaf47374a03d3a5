"""Where each phase of a cycle sits in time: one layout for the trace export and the timeline plot.

A record holds each phase's total (``phases_ns``), not its start. The layout puts them back on
the cycle's timeline from the timestamps the record does hold:

    queue      scheduled_ns .. started_ns
    worker_wait  from started_ns: the engine worker still finishing an earlier, aborted request
    tokenize, prefill, decode   back to back, ending at the last token when there is one
                                (decode ends at ``token_ns[-1]``), else from ``started_ns``
    abort      after the engine phases
    fallback   ending at ``published_ns`` (the fallback answered just before the publish)
    publish    from ``published_ns``

Some phases are parts of another, not extra time: ``sample`` (per-token sampling) and the
speculative ``draft``/``verify`` run inside ``decode``; ``grammar`` (the grammar's share of
sampling) runs inside ``sample``. They are laid out as children inside their parent, so nothing
is counted twice. Their starts are nominal (each is a total of many per-token slices), their
durations exact; a child never reaches past its parent's end.
"""

from __future__ import annotations

from dataclasses import dataclass

from robot_latency.records import CycleRecord

#: Phase -> the phase it is a part of (its time is inside the parent's, not after it).
PARENT_PHASE = {"sample": "decode", "draft": "decode", "verify": "decode", "grammar": "sample"}

#: Engine phases, in the order they run (a camera frame's encode and image prefill, where the
#: engine has a vision tower, before the text's prefill; its layout is counted in the encode).
ENGINE_PHASES = ("tokenize", "image_encode", "image_prefill", "prefill", "decode")


@dataclass(frozen=True)
class PhaseSpan:
    """One phase of one cycle on the loop's clock (ns); ``depth`` 0 is a top-level phase."""

    name: str
    start_ns: int
    end_ns: int
    depth: int = 0
    parent: str | None = None

    @property
    def dur_ns(self) -> int:
        """The span's length."""
        return self.end_ns - self.start_ns


def parent_of(name: str, present: set[str] | frozenset[str]) -> str | None:
    """The phase ``name`` is nested in, among the phases ``present`` (None: top level).

    ``grammar`` falls back to ``decode`` when there is no ``sample`` total.
    """
    parent = PARENT_PHASE.get(name)
    while parent is not None and parent not in present:
        parent = PARENT_PHASE.get(parent)
    return parent


def top_level_phases(phases_ns: dict[str, int]) -> dict[str, int]:
    """The phases that add up along the cycle (nested ones left out)."""
    present = frozenset(phases_ns)
    return {k: v for k, v in phases_ns.items() if parent_of(k, present) is None}


def cycle_spans(rec: CycleRecord) -> list[PhaseSpan]:
    """Lay a record's phases out on its timeline (see the module docstring), parents first.

    Top-level spans do not overlap and lie in time order; every child lies inside its parent.
    """
    phases = {k: int(v) for k, v in rec.phases_ns.items() if v is not None and v >= 0}
    present = frozenset(phases)
    top = top_level_phases(phases)
    spans: list[PhaseSpan] = []
    cursor = rec.scheduled_ns
    started = rec.started_ns if rec.started_ns is not None else rec.scheduled_ns

    def place(name: str, start: int) -> None:
        nonlocal cursor
        start = max(start, cursor)
        spans.append(PhaseSpan(name, start, start + top[name]))
        cursor = start + top[name]

    if "queue" in top:
        place("queue", rec.scheduled_ns)
    cursor = max(cursor, started)
    if "worker_wait" in top:
        place("worker_wait", cursor)
    engine = [p for p in ENGINE_PHASES if p in top]
    engine_total = sum(top[p] for p in engine)
    if rec.token_ns and "decode" in top:
        first = max(cursor, rec.token_ns[-1] - engine_total)
    else:
        first = cursor
    for i, name in enumerate(engine):
        place(name, first if i == 0 else cursor)
    if "abort" in top:
        place("abort", cursor)
    if "fallback" in top:
        end = rec.published_ns if rec.published_ns is not None else cursor + top["fallback"]
        place("fallback", end - top["fallback"])
    if "publish" in top:
        place("publish", rec.published_ns if rec.published_ns is not None else cursor)
    known = {"queue", "worker_wait", "abort", "fallback", "publish", *ENGINE_PHASES}
    for name in sorted(set(top) - known):
        place(name, cursor)
    # Children, parents first (decode before sample before grammar), back to back in the parent.
    by_name = {s.name: s for s in spans}
    fill: dict[str, int] = {}
    for name in sorted(set(phases) - set(top), key=_nesting_depth):
        parent = parent_of(name, present)
        ps = by_name.get(parent) if parent is not None else None
        if ps is None:
            continue
        start = fill.get(ps.name, ps.start_ns)
        end = min(ps.end_ns, start + phases[name])
        span = PhaseSpan(name, start, end, depth=ps.depth + 1, parent=ps.name)
        spans.append(span)
        by_name[name] = span
        fill[ps.name] = end
    return spans


def _nesting_depth(name: str) -> tuple[int, str]:
    depth, parent = 0, PARENT_PHASE.get(name)
    while parent is not None:
        depth, parent = depth + 1, PARENT_PHASE.get(parent)
    return depth, name
