"""The image's cost on llama.cpp: the vision encode, then the image tokens' prefill, per tower.

For each tower shape (``--towers``; by default the real ones: CLIP ViT-L/14 at 336 px with
LLaVA-1.5's MLP projector, 576 tokens; SigLIP-base/16 at 512 px with SmolVLM's 4x pixel shuffle,
64 tokens per tile) an mmproj is written for the language model's embedding width (cached in
``--mmproj-dir``), loaded beside the language model by libmtmd, and ``--frames`` rendered table
scenes of ``--frame-px`` are timed one at a time, each from an empty context: the encode
(``mtmd_encode_chunk``) and the image prefill (``mtmd_helper_decode_image_chunk``), apart. The
first ``--warmup`` frames are dropped. The language model is the demo's (the JSON planner
inflated to the Qwen2.5-0.5B shape, Q4_K_M) when the model cache holds it, else the shipped tiny
planner (``lm.source`` says which). The towers' weights are untrained: the times are real, the
embeddings mean nothing.

    python bench/vision_cost.py --threads 1 --frames 5 --out vision_cost.json
    python bench/vision_cost.py --towers siglip-b16-512 --image-px 384 --frames 5
    python bench/vision_cost.py --smoke --out /tmp/vision_cost.json
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
from pathlib import Path
from typing import Any

from benchio import emit_result

from robot_latency.engines.vision import VisionCost
from robot_latency.errors import RobotLatencyError
from robot_latency.models.bundled import bundled_model_path
from robot_latency.models.ladder import default_cache_dir, level_path
from robot_latency.models.mmproj import (
    REAL_SHAPES,
    TowerShape,
    at_resolution,
    lm_embedding_width,
    tower_shape,
    write_mmproj,
)
from robot_latency.streams.scene import render_scene

log = logging.getLogger("vision_cost")

#: The demo's language model in the model cache (name, level): the JSON planner inflated into the
#: Qwen2.5-0.5B shape (Qwen2's 151,936 ids, 896 wide), the main job's middle level.
DEMO_LM = ("planner-json-inflated-qwen2.5-0.5b", "Q4_K_M")
SMOKE_TOWERS = ("tiny-mlp", "tiny-shuffle")


def pick_lm(choice: str) -> tuple[Path, str]:
    """(GGUF, source): ``demo`` (cached, else the shipped planner), ``bundled``, or a path."""
    if choice == "bundled":
        return bundled_model_path("planner"), "bundled"
    if choice == "demo":
        cached = level_path(default_cache_dir(), *DEMO_LM)
        if cached.is_file():
            return cached, "demo"
        log.warning("%s not in the model cache: timing against the shipped planner", cached)
        return bundled_model_path("planner"), "bundled (demo not cached)"
    path = Path(choice).expanduser()
    if not path.is_file():
        raise SystemExit(f"--lm {choice}: no such file")
    return path, "path"


def mmproj_for(shape: TowerShape, lm: Path, cache: Path) -> Path:
    """The tower's mmproj for ``lm``'s width, written on first use."""
    width = lm_embedding_width(lm)
    path = cache / f"mmproj-{shape.name}-{shape.image_size_px}px-to{width}.gguf"
    if not path.is_file():
        write_mmproj(shape, path, n_embd_out=width)
    return path


def time_tower(shape: TowerShape, lm: Path, cache: Path, *, frame_px: tuple[int, int],
               frames: int, warmup: int, threads: int) -> dict[str, Any]:
    mmproj = mmproj_for(shape, lm, cache)
    # room for the view and the tiles a frame of frame_px may give (idefics3)
    n_ctx = max(512, shape.tokens_per_tile * 8 + 64)
    costs = []
    with VisionCost(lm, mmproj, n_ctx=n_ctx, n_batch=512, n_threads=threads) as vision:
        for i in range(warmup + frames):
            cost = vision.frame_cost(render_scene(i, width=frame_px[0], height=frame_px[1]))
            if i >= warmup:
                costs.append(cost)
    last = costs[-1]
    return {"projector": shape.projector, "image_size_px": shape.image_size_px,
            "patch_px": shape.patch_px, "scale_factor": shape.scale_factor,
            "tokens_per_tile": shape.tokens_per_tile, "vit_params": shape.params,
            "source": shape.source, "mmproj": str(mmproj),
            "mmproj_bytes": mmproj.stat().st_size,
            "image_tokens": last.image_tokens, "image_chunks": last.image_chunks,
            "frames": [c.to_dict() for c in costs],
            "median": {"encode_ms": statistics.median(c.encode_ms for c in costs),
                       "image_prefill_ms": statistics.median(c.image_prefill_ms
                                                             for c in costs),
                       "n": len(costs)}}


def _px(text: str) -> tuple[int, int]:
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give WIDTHxHEIGHT, e.g. 640x480") from None
    if w <= 0 or h <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: both sides must be > 0")
    return w, h


def main() -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    ap.add_argument("--towers", default=",".join(REAL_SHAPES),
                    help="comma-separated tower shapes (robot_latency.models.mmproj.SHAPES)")
    ap.add_argument("--image-px", type=int, default=None,
                    help="the towers' input resolution (default: each shape's own)")
    ap.add_argument("--frame-px", type=_px, default=(640, 480), help="camera frame WIDTHxHEIGHT")
    ap.add_argument("--frames", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--lm", default="demo", help="demo, bundled, or a GGUF path")
    ap.add_argument("--mmproj-dir", type=Path, default=None,
                    help="where the mmproj files are cached (default: <model cache>/mmproj)")
    ap.add_argument("--smoke", action="store_true",
                    help="the tiny towers, the shipped planner, one frame: seconds")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.smoke:
        args.towers, args.lm, args.frames, args.warmup = ",".join(SMOKE_TOWERS), "bundled", 1, 0
        args.frame_px = (160, 120)
    if args.frames < 1 or args.warmup < 0 or args.threads < 1:
        ap.error("--frames and --threads must be >= 1, --warmup >= 0")
    lm, source = pick_lm(args.lm)
    with tempfile.TemporaryDirectory(prefix="vision_cost-") as tmp:
        # the smoke run's tiny towers are not worth caching
        cache = args.mmproj_dir or (Path(tmp) if args.smoke else default_cache_dir() / "mmproj")
        towers = {}
        try:
            for name in (t.strip() for t in args.towers.split(",") if t.strip()):
                shape = tower_shape(name)
                if args.image_px is not None:
                    shape = at_resolution(shape, args.image_px)
                towers[name] = time_tower(shape, lm, cache, frame_px=args.frame_px,
                                          frames=args.frames, warmup=args.warmup,
                                          threads=args.threads)
        except RobotLatencyError as exc:
            ap.error(str(exc))
    return emit_result({
        "lm": {"path": str(lm), "source": source, "n_embd": lm_embedding_width(lm)},
        "threads": args.threads, "frame_px": list(args.frame_px), "smoke": args.smoke,
        "weights": "untrained (random): the times are real, the embeddings mean nothing",
        "towers": towers}, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
