"""The camera frame's part in measured runs: one row per run whose cycles planned with a frame.

For a run with a vision tower (``run``/``sweep --mmproj``, ``planner_node -p mmproj:=``), from
its records (docs/RECORDS.md):

- frames encoded, reused from the KV cache, and cycles planned text-only by ``fit``;
- image tokens per frame (the largest seen), the encode and the image prefill p50 over the
  cycles that paid them;
- the image's share of the time to first token: the image phases over the engine's phases up to
  the first token (tokenize, image encode, image prefill, prefill), summed over the cycles;
- the frame's age when the plan was published (publish time less the frame's stamp) p50 / p99,
  over the cycles whose plan answers a frame.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from robot_latency.records import CycleRecord
from robot_latency.report.table import fmt, markdown_table
from robot_latency.stats import distribution

__all__ = ["VisionRow", "vision_markdown", "vision_row"]

_TO_FIRST_TOKEN = ("tokenize", "image_encode", "image_prefill", "prefill")


@dataclass(frozen=True)
class VisionRow:
    """One run's frame figures (see the module docstring)."""

    label: str
    cycles_with_frame: int
    frames_encoded: int
    frames_reused: int
    text_only: int
    image_tokens: int | None
    image_encode_p50_ms: float | None
    image_prefill_p50_ms: float | None
    image_share_of_ttft: float | None
    frame_age_p50_ms: float | None
    frame_age_p99_ms: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def vision_row(label: str, records: Sequence[CycleRecord]) -> VisionRow | None:
    """The run's row, or None when no cycle planned with a frame (a text-only run)."""
    seen = [r for r in records if r.image is not None]
    if not seen:
        return None
    framed = [r for r in seen if not r.image.get("text_only")]
    paid = [r for r in framed if not r.image.get("reused")]
    image_ns = sum(r.phases_ns.get("image_encode", 0) + r.phases_ns.get("image_prefill", 0)
                   for r in framed)
    first_ns = sum(r.phases_ns.get(p, 0) for r in framed for p in _TO_FIRST_TOKEN)
    ages = distribution((r.published_ns - r.data_ns) / 1e6 for r in framed
                        if r.published_ns is not None and r.data_ns is not None
                        and r.frame_stamp_ns is not None)
    return VisionRow(
        label=label, cycles_with_frame=len(framed), frames_encoded=len(paid),
        frames_reused=len(framed) - len(paid), text_only=len(seen) - len(framed),
        image_tokens=max((int(r.image.get("tokens", 0)) for r in framed), default=None),
        image_encode_p50_ms=distribution(r.phases_ns["image_encode"] / 1e6 for r in paid
                                         if "image_encode" in r.phases_ns).p50,
        image_prefill_p50_ms=distribution(r.phases_ns["image_prefill"] / 1e6 for r in paid
                                          if "image_prefill" in r.phases_ns).p50,
        image_share_of_ttft=image_ns / first_ns if first_ns else None,
        frame_age_p50_ms=ages.p50, frame_age_p99_ms=ages.p99)


def vision_markdown(rows: Sequence[VisionRow]) -> str:
    """The rows as a Markdown table (no trailing newline)."""
    header = ("run", "cycles with a frame", "encoded / reused / text-only", "image tokens",
              "encode p50 ms", "image prefill p50 ms", "image share of TTFT",
              "frame age at publish p50 / p99 ms")
    return markdown_table(header, [[
        r.label.replace("|", "\\|"), str(r.cycles_with_frame),
        f"{r.frames_encoded} / {r.frames_reused} / {r.text_only}",
        "-" if r.image_tokens is None else str(r.image_tokens),
        fmt(r.image_encode_p50_ms, ".1f"), fmt(r.image_prefill_p50_ms, ".1f"),
        "-" if r.image_share_of_ttft is None else f"{100 * r.image_share_of_ttft:.1f}%",
        f"{fmt(r.frame_age_p50_ms, '.1f')} / {fmt(r.frame_age_p99_ms, '.1f')}"]
        for r in rows], aligned=False)
