"""The camera frame in the loop simulated on the target: a vision-language planner's commands.

With a vision tower (``predict --stream ... --vision-tower SHAPE | --mmproj FILE``), a cycle that
takes a new frame pays, before its first token, the tower's encode of the frame and the frame's
image tokens through the prefill (:mod:`robot_latency.floor.vision`): its TTFT on the target is
the calibrated prefill of its uncached text tokens *plus the image tokens*, at a context grown by
them, and the encode is added before it (``SimCommand.encode_ms``). The image sits after the
cached system prompt and before the command's text, so a new frame leaves the system prompt
cached and an unchanged one is cached with it.

Policies (``--image-policy``):

- ``every``: every command's frame is encoded and prefilled (a new frame each cycle);
- ``reuse``: the image tokens of the last frame encoded are reused while the frame is unchanged
  (its tokens stay in the KV cache: no encode, no image prefill, the context still holds them).
  In a stream with frames, a frame is unchanged when no newer frame was recorded before the
  command (frames are keyed by message, not compared by content); a stream without frames is
  one static frame, so only the first command pays.
- ``fit``: ``reuse``, and a new frame is seen at the largest of its scales (``fit_scales``: the
  frame downscaled, 1 = as taken) at which the command's whole cycle, predicted (the encode,
  the TTFT with that many image tokens, the plan's decode), fits in the deadline less the
  margins; where none fits, the command plans text-only (no image) and is counted as such; a
  plan still late then gets the fallback, as always. The choice is made per command from its
  own predicted cost, before any wait in the queue (a node decides at the cycle's start, knowing
  its wait), so under queueing it is optimistic. A scale changes the cost only where the
  projector's tokens follow the frame's size (idefics3 tiles); LLaVA's ``mlp`` resizes every
  frame to its tile, so there ``fit`` is the frame or text-only.

The frame a command plans with is the newest recorded at its arrival (a stream without frames:
one taken at the command's send). Its age at the receiver is then that frame's age at the
command's arrival plus the plan's e2e; the publish and the transport after the last token are
not added. A command that arrives before the stream's first frame plans text-only.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from robot_latency.floor.errors import FloorError
from robot_latency.floor.modelfacts import ModelFacts
from robot_latency.floor.steps import StepPredictor
from robot_latency.floor.vision import VisionPrediction, predict_vision
from robot_latency.floor.vision_tower import DEFAULT_FRAME_PX, VisionTower
from robot_latency.planner.config import RunSettings
from robot_latency.planner.frame_policy import FIT_SCALES
from robot_latency.planner.target_sim import SimCommand, TargetAnswer, margin_ms, sim_commands
from robot_latency.planner.untimed import UntimedPass
from robot_latency.streams import CommandStream

__all__ = ["DEFAULT_FIT_SCALES", "IMAGE_POLICIES", "ImageLevel", "ImageSetting", "frame_age",
           "image_commands"]

#: What a cycle does with the camera frame (the module's docstring).
IMAGE_POLICIES = ("every", "reuse", "fit")
#: The frame's scales ``fit`` tries, largest first, unless told.
DEFAULT_FIT_SCALES = FIT_SCALES


@dataclass(frozen=True)
class ImageSetting:
    """The camera frame each cycle plans with.

    Attributes:
        tower: the vision tower at its resolution.
        policy: one of :data:`IMAGE_POLICIES`.
        frame_px: the camera frame (width, height) the tower cuts (idefics3 tiles it).
        project_to_model: the projector's width is the language model's (a tower shape, not a
            file): set per level from the model's facts.
        max_frame_age_ms: a plan from a frame older than this at the receiver is stale; None:
            no limit.
        fit_scales: the frame's scales ``fit`` tries (each in (0, 1]), largest first.
    """

    tower: VisionTower
    policy: str = "every"
    frame_px: tuple[int, int] = DEFAULT_FRAME_PX
    project_to_model: bool = False
    max_frame_age_ms: float | None = None
    fit_scales: tuple[float, ...] = DEFAULT_FIT_SCALES

    def __post_init__(self) -> None:
        if self.policy not in IMAGE_POLICIES:
            raise ValueError(f"image policy {self.policy!r}: one of {', '.join(IMAGE_POLICIES)}")
        if not self.fit_scales or not all(0 < x <= 1 for x in self.fit_scales):
            raise ValueError(f"fit_scales={self.fit_scales!r}: each in (0, 1]")
        object.__setattr__(self, "fit_scales", tuple(sorted(set(self.fit_scales), reverse=True)))
        if self.max_frame_age_ms is not None and not self.max_frame_age_ms > 0:
            raise ValueError(f"max_frame_age_ms={self.max_frame_age_ms!r}: must be > 0")

    def tower_for(self, model: ModelFacts) -> VisionTower:
        """The tower projecting to ``model``'s width where it is a shape (``project_to_model``).

        Raises:
            FloorError: the model's embedding width is not known.
        """
        if not self.project_to_model:
            return self.tower
        if not model.hidden:
            raise FloorError(f"{model.name}: its embedding width is not known: give the "
                             "tower as an mmproj file")
        return replace(self.tower, projection_dim=int(model.hidden))

    def scaled_px(self, scale: float) -> tuple[int, int]:
        """The frame downscaled by ``scale`` (at least one pixel a side)."""
        w, h = self.frame_px
        return max(1, round(w * scale)), max(1, round(h * scale))


@dataclass(frozen=True)
class ImageLevel:
    """One level's commands with the frame, and what the frame costs there.

    Attributes:
        cmds: the commands as the simulation sees them, the frame in their TTFT.
        text_cmds: the same commands text-only (the image's share is measured against them).
        vision: the frame's predicted cost on the target (:func:`predict_vision`).
        setting: the image setting.
        frame_offset_ms: per command id, its frame's age at the command's arrival (ms).
        paid: command ids whose cycle encoded and prefilled a frame.
        static_frame: the stream has no frames: one static frame was assumed.
        frame_px_used: ``fit``: per command that encoded a frame, the frame's size it used.
        text_only: ``fit``: command ids that planned text-only (no scale fitted).
    """

    cmds: list[SimCommand]
    text_cmds: list[SimCommand]
    vision: VisionPrediction
    setting: ImageSetting
    frame_offset_ms: dict[str, float]
    paid: tuple[str, ...]
    static_frame: bool
    frame_px_used: dict[str, tuple[int, int]] = field(default_factory=dict)
    text_only: tuple[str, ...] = ()

    def facts(self) -> dict[str, Any]:
        """The ``vision`` entry of the answer's facts: the frame's cost, the policy, the image's
        share of TTFT on the target (point prediction), the vision status."""
        asked = [(c, t) for c, t in zip(self.cmds, self.text_cmds, strict=True) if c.asked]
        with_ms = sum(c.encode_ms + c.ttft_ms for c, _ in asked)
        text_ms = sum(t.ttft_ms for _, t in asked)
        v = self.vision
        return {"tower": v.tower, "projector": v.projector, "image_size_px": v.image_size_px,
                "frame_px": list(v.frame_px), "image_tokens": v.image_tokens,
                "image_chunks": v.image_chunks, "encode_ms": v.encode_ms,
                "image_prefill_ms": v.image_prefill_ms, "policy": self.setting.policy,
                "static_frame": self.static_frame, "frames_paid": len(self.paid),
                "commands_asked": len(asked), "ttft_ms_total": with_ms,
                "text_ttft_ms_total": text_ms,
                "image_share_of_ttft": (with_ms - text_ms) / with_ms if with_ms > 0 else 0.0,
                "vision_calibrated": v.vision_calibrated, "vision_status": v.vision_status,
                "max_frame_age_ms": self.setting.max_frame_age_ms,
                "fit": None if self.setting.policy != "fit" else {
                    "scales": list(self.setting.fit_scales),
                    "frames_at_px": {f"{w}x{h}": n for (w, h), n in sorted(
                        Counter(self.frame_px_used.values()).items(), reverse=True)},
                    "text_only": len(self.text_only)}}


def _frame_keys(stream: CommandStream, speed: float) -> tuple[list[int | None], list[float]]:
    """Per command: the key of the frame it plans with (None: no frame yet) and that frame's
    age at its arrival (ms). Without frames: one static frame (key 0), taken at the send."""
    if not stream.frames:
        return [0] * len(stream.commands), [0.0] * len(stream.commands)
    times = [f.t_ns for f in stream.frames]
    keys: list[int | None] = []
    ages: list[float] = []
    for c in stream.commands:
        i = bisect.bisect_right(times, c.t_ns) - 1
        keys.append(None if i < 0 else i)
        ages.append(0.0 if i < 0 else (c.t_ns - times[i]) / speed / 1e6)
    return keys, ages


def image_commands(stream: CommandStream, untimed: UntimedPass, steps: StepPredictor,
                   image: ImageSetting, *, speed: float = 1.0,
                   rules: RunSettings | None = None) -> ImageLevel:
    """:func:`~robot_latency.planner.target_sim.sim_commands` with the camera frame.

    ``rules``: the target's loop rules (the deadline and margins ``fit`` fits a frame into;
    required for it).

    Raises:
        UntimedError: a command of the stream has no entry in the pass.
        FloorError: a device without a FLOP/s figure, or a model of unknown width.
        ValueError: policy ``fit`` without ``rules``.
    """
    if image.policy == "fit" and rules is None:
        raise ValueError("image policy fit: the target's loop rules are needed")
    text = sim_commands(stream, untimed, steps, speed=speed)
    tower = image.tower_for(steps.model)
    vision = predict_vision(tower, steps.model, steps.device, steps.calibration,
                            frame_px=image.frame_px)
    scales = [vision] if image.policy != "fit" else [
        vision if s == 1.0 else predict_vision(tower, steps.model, steps.device,
                                               steps.calibration, frame_px=image.scaled_px(s))
        for s in image.fit_scales]
    room_ms = rules.deadline_ms - margin_ms(rules) \
        if image.policy == "fit" and rules is not None else math.inf
    facts = untimed.by_id()
    keys, ages = _frame_keys(stream, speed)
    out: list[SimCommand] = []
    offsets: dict[str, float] = {}
    paid: list[str] = []
    used: dict[str, tuple[int, int]] = {}
    text_only: list[str] = []
    last: tuple[int, VisionPrediction] | None = None  # the frame in the KV cache, and its cost
    for c, key, age in zip(text, keys, ages, strict=True):
        if not c.asked or key is None:
            out.append(c)
            continue
        u = facts[c.command_id]
        if image.policy != "every" and last is not None and last[0] == key:
            seen, pays = last[1], False  # the same frame: its image tokens are cached
        else:
            seen = next((v for v in scales if _cycle_ms(v, u, steps) <= room_ms), None)
            pays = seen is not None
        if seen is None:
            text_only.append(c.command_id)  # no scale fits: the cycle plans without the frame
            out.append(c)
            continue
        offsets[c.command_id] = age
        if pays:
            paid.append(c.command_id)
            used[c.command_id] = seen.frame_px
            last = (key, seen)
        p = steps.predict(u.uncached_prompt_tokens + (seen.image_tokens if pays else 0),
                          context_tokens=u.prompt_tokens + seen.image_tokens)
        out.append(replace(c, ttft_ms=p.ttft_ms, itl_ms=p.itl_ms, itl_floor_ms=p.itl_floor_ms,
                           ttft_floor_ms=p.ttft_floor_ms,
                           encode_ms=seen.encode_ms if pays else 0.0))
    return ImageLevel(out, text, vision, image, offsets, tuple(paid), not stream.frames,
                      used if image.policy == "fit" else {}, tuple(text_only))


def _cycle_ms(vision: VisionPrediction, u: Any, steps: StepPredictor) -> float:
    """A command's whole cycle with a new frame of ``vision``'s cost (point prediction): the
    encode, the TTFT with its image tokens, then the plan's decode."""
    p = steps.predict(u.uncached_prompt_tokens + vision.image_tokens,
                      context_tokens=u.prompt_tokens + vision.image_tokens)
    return vision.encode_ms + p.ttft_ms + max(0, u.tokens_out - 1) * p.itl_ms


def image_budget(level: ImageLevel, steps: StepPredictor, rules: RunSettings,
                 prompts: Sequence[tuple[int, int]]) -> list[int]:
    """Output tokens that fit in the deadline after each (uncached, context) text prompt of
    ``prompts`` with a new frame: its encode and its image tokens first (point prediction)."""
    tokens, out = level.vision.image_tokens, []
    for uncached, context in prompts:
        p = steps.predict(uncached + tokens, context_tokens=context + tokens)
        room = rules.deadline_ms - margin_ms(rules) - level.vision.encode_ms - p.ttft_ms
        out.append(0 if room < 0 else math.floor(room / p.itl_ms) + 1)
    return out


def frame_age(level: ImageLevel, answer: TargetAnswer) -> dict[str, Any]:
    """The frame's age at the receiver for the model's plans received in time (point
    prediction): p50 and p99 (ms), and how many are older than the setting's limit (stale)."""
    asked = [c.command_id for c in level.cmds if c.asked]
    in_time = set(answer.model_in_time_ids)
    ages = np.array([level.frame_offset_ms[i] + e for i, e in zip(asked, answer.e2e_ms,
                                                                 strict=True)
                     if i in in_time and i in level.frame_offset_ms])
    limit = level.setting.max_frame_age_ms
    return {"plans": int(ages.size),
            "frame_age_p50_ms": float(np.percentile(ages, 50)) if ages.size else None,
            "frame_age_p99_ms": float(np.percentile(ages, 99)) if ages.size else None,
            "stale": None if limit is None else int((ages > limit).sum())}
