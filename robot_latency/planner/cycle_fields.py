"""One cycle record's figures as the ``CycleStats`` message carries them, without ROS.

The typed ``robot_latency_interfaces/msg/CycleStats`` on ``planner/cycle_stats``
(:mod:`robot_latency.ros.cycle_stats`) and the ``/planner/cycle_stats`` channel of ``run.mcap``
(:mod:`robot_latency.planner.mcap_log`) are both filled from :func:`cycle_stats_fields`, so the
two carry the same numbers. A figure the cycle does not have is None here (NaN in the ROS
message, null in JSON), never a silent 0.
"""

from __future__ import annotations

import statistics
from typing import Any

from robot_latency.profiles.actions import is_refusal
from robot_latency.records import CycleRecord

#: The CycleStats fields after its header, in the message's order, with their JSON types
#: (``"number"`` fields may be null: a figure the cycle does not have).
CYCLE_STATS_FIELDS: dict[str, str] = {
    "cycle": "integer",
    "command_id": "string",
    "mode": "string",
    "deadline_ms": "number",
    "margin_ms": "number",
    "queue_ms": "number",
    "prefill_ms": "number",
    "decode_ms": "number",
    "publish_ms": "number",
    "cycle_ms": "number",
    "ttft_ms": "number",
    "itl_p50_ms": "number",
    "itl_max_ms": "number",
    "tokens_in": "integer",
    "tokens_out": "integer",
    "outcome": "string",
    "source": "string",
    "fallback_reason": "string",
    "deadline_met": "boolean",
    "frame_age_ms": "number",
}

#: What ``outcome`` takes: a motion plan, a refusal, or nothing published.
OUTCOMES = ("plan", "refused", "none")


def _ms(value_ns: int | float | None) -> float | None:
    return None if value_ns is None else float(value_ns) / 1e6


def record_outcome(rec: CycleRecord) -> str:
    """``plan``, ``refused`` (the published plan is a refusal) or ``none`` (nothing published)."""
    if rec.published_ns is None or rec.plan_source == "none":
        return "none"
    return "refused" if is_refusal(rec.plan) else "plan"


def cycle_stats_fields(rec: CycleRecord, *, frame_age_ms: float | None = None) -> dict[str, Any]:
    """Return the CycleStats fields (:data:`CYCLE_STATS_FIELDS`, no header) of one record.

    ``tokens_in`` is -1 when unknown (the message's integer field has no null); every ``*_ms``
    figure the cycle does not have is None. ``frame_age_ms`` is the camera frame's age when the
    plan was published (the record's own ``frame_age_ms`` is at the cycle's start).
    """
    phases = rec.phases_ns
    gaps = rec.itl_ns
    if frame_age_ms is None and rec.frame_stamp_ns is not None and rec.data_ns is not None \
            and rec.published_ns is not None:  # the frame's age when the plan went out
        frame_age_ms = (rec.published_ns - rec.data_ns) / 1e6
    return {
        "cycle": int(rec.cycle),
        "command_id": rec.command_id or "",
        "mode": rec.mode,
        "deadline_ms": rec.deadline_budget_ns / 1e6,
        "margin_ms": _ms(rec.margin_ns),
        "queue_ms": _ms(rec.queue_wait_ns),
        "prefill_ms": _ms(phases.get("prefill")),
        "decode_ms": _ms(phases.get("decode")),
        "publish_ms": _ms(phases.get("publish")),
        "cycle_ms": _ms(rec.cycle_ns),
        "ttft_ms": _ms(rec.ttft_ns),
        "itl_p50_ms": _ms(statistics.median(gaps)) if gaps else None,
        "itl_max_ms": _ms(max(gaps)) if gaps else None,
        "tokens_in": int(rec.tokens_in) if rec.tokens_in is not None else -1,
        "tokens_out": rec.tokens_out,
        "outcome": record_outcome(rec),
        "source": rec.plan_source,
        "fallback_reason": rec.fallback_reason or "",
        "deadline_met": rec.deadline_met,
        "frame_age_ms": None if frame_age_ms is None else float(frame_age_ms),
    }
