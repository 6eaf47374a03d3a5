"""What a cycle does with its camera frame when the engine has a vision tower (``image_policy``).

- ``reuse`` (the default): the frame goes in as it is (downscaled by ``frame_scale`` first,
  where set), keyed by its message; an unchanged frame is found in the engine's KV cache (no
  encode, no image prefill).
- ``every``: every cycle encodes its frame again (its key made the cycle's own): what a planner
  without a frame cache pays.
- ``fit``: ``reuse``, and a new frame is sent at the largest of :data:`FIT_SCALES` whose cost
  fits what is left of the cycle's budget at its start: the image's cost at that scale (the
  largest of the newest :data:`COST_WINDOW` measured there; a scale not measured yet is tried)
  plus the text's (the median engine time of the newest :data:`TEXT_WINDOW` cycles that asked
  the model, less their image phases). Where no scale fits, the cycle plans text-only and its
  record's ``image`` says so (``{"text_only": true, ...}``); a plan still late then gets the
  fallback, as always.

The costs are this host's, measured by the cycles themselves, so the choice follows the machine
the planner runs on (a Jetson's own on a Jetson).
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import replace
from typing import Any

from robot_latency.engines.base import FrameImage, GenerationTrace

__all__ = ["COST_WINDOW", "FIT_SCALES", "TEXT_WINDOW", "FramePolicy"]

#: The frame's scales ``fit`` tries, largest first (the simulated loop's ``fit`` on the target
#: tries the same unless told: :mod:`robot_latency.planner.target_image`).
FIT_SCALES = (1.0, 0.75, 0.5, 0.25)
#: Image costs kept per scale (the largest counts: a frame must fit on a bad cycle too).
COST_WINDOW = 4
#: Text-only engine times kept (their median counts).
TEXT_WINDOW = 8

_TEXT_PHASES = ("tokenize", "prefill", "decode")
_IMAGE_PHASES = ("image_encode", "image_prefill")


class FramePolicy:
    """The loop's frame policy (see the module docstring); used from the loop's thread only."""

    def __init__(self, policy: str, frame_scale: float) -> None:
        self.policy, self.frame_scale = policy, frame_scale
        self.cost_ns: dict[float, deque[int]] = {s: deque(maxlen=COST_WINDOW)
                                                 for s in FIT_SCALES}
        self.text_ns: deque[int] = deque(maxlen=TEXT_WINDOW)
        self._sent: FrameImage | None = None  # the frame last sent (it may be in the KV)

    def choose(self, frame: FrameImage | None, cycle: int, left_ns: int
               ) -> tuple[FrameImage | None, dict[str, Any] | None]:
        """The frame to send this cycle (None: text only) and, when ``fit`` leaves it out, the
        record's ``image`` saying so. ``left_ns``: the budget left at the cycle's start."""
        if frame is None:
            return None, None
        if self.policy != "fit" and self.frame_scale != 1.0:
            frame = replace(frame, key=f"{frame.key}@{self.frame_scale:g}",
                            scale=self.frame_scale)
        if self.policy == "every":
            return replace(frame, key=f"{frame.key}#{cycle}"), None
        if self.policy != "fit":
            return frame, None
        sent = self._sent
        if sent is not None and sent.key.startswith(frame.key + "@"):
            return sent, None  # unchanged: in the KV cache at the scale it went in with
        text = statistics.median(self.text_ns) if self.text_ns else 0
        for scale in FIT_SCALES:
            costs = self.cost_ns[scale]
            if not costs or max(costs) + text <= left_ns:
                self._sent = replace(frame, key=f"{frame.key}@{scale:g}", scale=scale)
                return self._sent, None
        self._sent = None  # the text-only cycle's prompt cuts any frame from the KV cache
        return None, {"text_only": True, "policy": "fit", "left_ms": left_ns / 1e6,
                      "smallest_cost_ms": min(max(c) for c in self.cost_ns.values()) / 1e6,
                      "text_ms": text / 1e6}

    def learn(self, frame: FrameImage | None, trace: GenerationTrace) -> None:
        """Take a finished generation's measured costs (``frame``: what it was sent)."""
        if trace.error is not None or not trace.token_ns:
            return
        phases = trace.phases_ns()
        self.text_ns.append(sum(phases.get(p, 0) for p in _TEXT_PHASES))
        image = trace.image or {}
        if frame is not None and image and not image.get("reused"):
            self.cost_ns.setdefault(frame.scale, deque(maxlen=COST_WINDOW)).append(
                sum(phases.get(p, 0) for p in _IMAGE_PHASES))
