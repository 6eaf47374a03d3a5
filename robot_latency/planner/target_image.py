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

The frame a command plans with is the newest recorded at its arrival (a stream without frames:
one taken at the command's send). Its age at the receiver is then that frame's age at the
command's arrival plus the plan's e2e; the publish and the transport after the last token are
not added. A command that arrives before the stream's first frame plans text-only.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from robot_latency.floor.errors import FloorError
from robot_latency.floor.modelfacts import ModelFacts
from robot_latency.floor.steps import StepPredictor
from robot_latency.floor.vision import VisionPrediction, predict_vision
from robot_latency.floor.vision_tower import DEFAULT_FRAME_PX, VisionTower
from robot_latency.planner.config import RunSettings
from robot_latency.planner.target_sim import SimCommand, TargetAnswer, margin_ms, sim_commands
from robot_latency.planner.untimed import UntimedPass
from robot_latency.streams import CommandStream

__all__ = ["IMAGE_POLICIES", "ImageLevel", "ImageSetting", "frame_age", "image_commands"]

#: What a cycle does with the camera frame (the module's docstring).
IMAGE_POLICIES = ("every", "reuse")


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
    """

    tower: VisionTower
    policy: str = "every"
    frame_px: tuple[int, int] = DEFAULT_FRAME_PX
    project_to_model: bool = False
    max_frame_age_ms: float | None = None

    def __post_init__(self) -> None:
        if self.policy not in IMAGE_POLICIES:
            raise ValueError(f"image policy {self.policy!r}: one of {', '.join(IMAGE_POLICIES)}")
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
    """

    cmds: list[SimCommand]
    text_cmds: list[SimCommand]
    vision: VisionPrediction
    setting: ImageSetting
    frame_offset_ms: dict[str, float]
    paid: tuple[str, ...]
    static_frame: bool

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
                "max_frame_age_ms": self.setting.max_frame_age_ms}


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
                   image: ImageSetting, *, speed: float = 1.0) -> ImageLevel:
    """:func:`~robot_latency.planner.target_sim.sim_commands` with the camera frame.

    Raises:
        UntimedError: a command of the stream has no entry in the pass.
        FloorError: a device without a FLOP/s figure, or a model of unknown width.
    """
    text = sim_commands(stream, untimed, steps, speed=speed)
    vision = predict_vision(image.tower_for(steps.model), steps.model, steps.device,
                            steps.calibration, frame_px=image.frame_px)
    tokens = vision.image_tokens
    facts = untimed.by_id()
    keys, ages = _frame_keys(stream, speed)
    out: list[SimCommand] = []
    offsets: dict[str, float] = {}
    paid: list[str] = []
    last: int | None = None
    for c, key, age in zip(text, keys, ages, strict=True):
        if not c.asked or key is None:
            out.append(c)
            continue
        u = facts[c.command_id]
        offsets[c.command_id] = age
        pays = image.policy == "every" or key != last
        if pays:
            paid.append(c.command_id)
            last = key
        p = steps.predict(u.uncached_prompt_tokens + (tokens if pays else 0),
                          context_tokens=u.prompt_tokens + tokens)
        out.append(replace(c, ttft_ms=p.ttft_ms, itl_ms=p.itl_ms, itl_floor_ms=p.itl_floor_ms,
                           ttft_floor_ms=p.ttft_floor_ms,
                           encode_ms=vision.encode_ms if pays else 0.0))
    return ImageLevel(out, text, vision, image, offsets, tuple(paid), not stream.frames)


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
