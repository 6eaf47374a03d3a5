"""The vision part of ``predict``: a camera frame's encode and image prefill on the target.

``--mmproj FILE`` reads the tower from an mmproj GGUF's ``clip.*`` keys; ``--vision-tower SHAPE``
takes one of the shapes the project writes (robot_latency.models.mmproj.SHAPES), projecting to
the language model's width. ``--image-px`` sets the tower's input resolution, ``--frame-px`` the
camera frame (idefics3 tiles it). The answer (robot_latency.floor.vision) is printed beside the
text TTFT; without a published vision row of the engine family it says "vision uncalibrated".
"""

from __future__ import annotations

import argparse
from typing import Any

from robot_latency.cli.common import UsageError, echo, positive_int
from robot_latency.floor.calibration import Calibration
from robot_latency.floor.devices import DeviceSheet
from robot_latency.floor.errors import FloorError
from robot_latency.floor.modelfacts import ModelFacts
from robot_latency.floor.vision import VisionPrediction, predict_vision
from robot_latency.floor.vision_tower import DEFAULT_FRAME_PX, VisionTower, tower_from_mmproj
from robot_latency.planner.target_image import DEFAULT_FIT_SCALES, IMAGE_POLICIES, ImageSetting

__all__ = ["add_vision_args", "echo_vision", "image_setting", "vision_answer", "vision_json",
           "wants_vision"]


def frame_px(text: str | tuple[int, int]) -> tuple[int, int]:
    """``--frame-px WIDTHxHEIGHT``, both > 0; a UsageError naming the flag otherwise."""
    if isinstance(text, tuple):
        return text
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise UsageError(f"--frame-px {text!r}: give WIDTHxHEIGHT, e.g. 640x480") from None
    if w <= 0 or h <= 0:
        raise UsageError(f"--frame-px {text!r}: both sides must be > 0")
    return w, h


def add_vision_args(p: argparse.ArgumentParser) -> None:
    """Add ``--mmproj``, ``--vision-tower``, ``--image-px`` and ``--frame-px`` to ``predict``."""
    from robot_latency.models.mmproj import SHAPES

    g = p.add_mutually_exclusive_group()
    g.add_argument("--mmproj", default=None, metavar="FILE",
                   help="an mmproj GGUF: also predict a frame's image encode and image prefill")
    g.add_argument("--vision-tower", default=None, metavar="SHAPE",
                   help=f"a tower shape instead of a file ({', '.join(SHAPES)})")
    p.add_argument("--image-px", type=positive_int, default=None,
                   help="the tower's input resolution (default: the tower's own)")
    p.add_argument("--frame-px", default=DEFAULT_FRAME_PX,
                   help="the camera frame WIDTHxHEIGHT (default 640x480)")


def wants_vision(args: argparse.Namespace) -> bool:
    """True where ``--mmproj`` or ``--vision-tower`` was given; ``--image-px`` alone is an
    error naming the flag."""
    want = bool(getattr(args, "mmproj", None) or getattr(args, "vision_tower", None))
    if not want and getattr(args, "image_px", None) is not None:
        raise UsageError("--image-px: give --mmproj FILE or --vision-tower SHAPE with it")
    if want:
        args.frame_px = frame_px(args.frame_px)
    return want


def _tower(args: argparse.Namespace, model: ModelFacts) -> VisionTower:
    if args.mmproj:
        return _file_tower(args)
    if not model.hidden:
        raise UsageError(f"--vision-tower {args.vision_tower}: the model's embedding width is "
                         "not known; give --mmproj FILE")
    return _shape_tower(args, int(model.hidden))


def _file_tower(args: argparse.Namespace) -> VisionTower:
    tower = tower_from_mmproj(args.mmproj)
    return tower if args.image_px is None else _at(tower, args.image_px)


def _shape_tower(args: argparse.Namespace, projection_dim: int) -> VisionTower:
    """``--vision-tower SHAPE`` at ``--image-px``, projecting to ``projection_dim``."""
    from robot_latency.models.mmproj import MmprojError, at_resolution, tower_shape

    try:
        shape = tower_shape(args.vision_tower)
    except MmprojError as err:
        raise UsageError(f"--vision-tower: {err}") from None
    if args.image_px is not None:
        try:
            shape = at_resolution(shape, args.image_px)
        except MmprojError as err:
            raise UsageError(f"--image-px {args.image_px}: {err}") from None
    return VisionTower(name=shape.name, projector=shape.projector,
                       image_size_px=shape.image_size_px, patch_px=shape.patch_px,
                       width=shape.width, ffn=shape.ffn, layers=shape.layers,
                       projection_dim=projection_dim, scale_factor=shape.scale_factor,
                       class_token=shape.class_token)


def image_setting(args: argparse.Namespace) -> ImageSetting | None:
    """``predict --stream``'s camera frame: the tower (a shape projects to each level's model
    width), ``--image-policy`` and ``--max-frame-age-ms``; None without a tower. Either flag
    without a tower is an error naming it."""
    scales = getattr(args, "fit_scales", None)
    if not wants_vision(args):
        for flag, value in (("--image-policy", args.image_policy),
                            ("--max-frame-age-ms", args.max_frame_age_ms),
                            ("--fit-scales", scales)):
            if value is not None:
                raise UsageError(f"{flag}: give --mmproj FILE or --vision-tower SHAPE with it")
        return None
    if args.image_policy is not None and args.image_policy not in IMAGE_POLICIES:
        raise UsageError(f"--image-policy {args.image_policy!r}: one of "
                         f"{', '.join(IMAGE_POLICIES)}")
    if args.max_frame_age_ms is not None and not args.max_frame_age_ms > 0:
        raise UsageError(f"--max-frame-age-ms: must be > 0, got {args.max_frame_age_ms!r}")
    if scales is not None:
        if args.image_policy != "fit":
            raise UsageError("--fit-scales: only with --image-policy fit")
        bad = [x for x in scales if not 0 < x <= 1]
        if bad:
            raise UsageError(f"--fit-scales: each in (0, 1], got {bad[0]!r}")
    shape = not args.mmproj
    tower = _shape_tower(args, 1) if shape else _file_tower(args)
    return ImageSetting(tower=tower, policy=args.image_policy or "every",
                        frame_px=args.frame_px, project_to_model=shape,
                        max_frame_age_ms=args.max_frame_age_ms,
                        fit_scales=tuple(scales) if scales else DEFAULT_FIT_SCALES)


def _at(tower: VisionTower, px: int) -> VisionTower:
    try:
        return VisionTower(**{**tower.to_dict(), "image_size_px": int(px)})
    except FloorError as err:
        raise UsageError(f"--image-px {px}: {err}") from None


def vision_answer(args: argparse.Namespace, model: ModelFacts, device: DeviceSheet,
                  cal: Calibration) -> VisionPrediction:
    """The frame's predicted image cost on ``device`` (``wants_vision`` must be True)."""
    return predict_vision(_tower(args, model), model, device, cal, frame_px=args.frame_px,
                          prompt_tokens=args.prompt_tokens)


def echo_vision(v: VisionPrediction) -> None:
    """Print the frame's image cost beside the text TTFT."""
    w, h = v.frame_px
    echo(f"  image          {v.tower} ({v.projector}, {v.image_size_px} px), frame {w}x{h}: "
         f"{v.image_chunks} chunk{'s' if v.image_chunks != 1 else ''}, {v.image_tokens} "
         "image tokens")
    echo(f"  image encode   {v.encode_ms:8.2f} ms  ({v.encode_gflop:.1f} GFLOP at "
         f"{v.compute_rate_gflops:.0f} GFLOP/s, the prefill's calibrated compute rate"
         f"{'' if v.vision_factor == 1.0 else f' x {v.vision_factor:.2f}'})")
    echo(f"  image prefill  {v.image_prefill_ms:8.2f} ms  ({v.image_tokens} image tokens "
         "through the calibrated prefill)")
    if v.text_ttft_ms is not None and v.ttft_with_image_ms is not None:
        echo(f"  text TTFT      {v.text_ttft_ms:8.2f} ms  ({v.prompt_tokens} prompt tokens); "
             f"with the frame {v.ttft_with_image_ms:.2f} ms")
    echo(f"  vision         {v.vision_status}")


def vision_json(v: VisionPrediction | None) -> dict[str, Any] | None:
    """The ``vision`` entry of ``predict --json``."""
    return None if v is None else v.to_dict()
