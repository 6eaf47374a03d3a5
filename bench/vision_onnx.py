"""The vision encode of one frame on llama.cpp (libmtmd's clip) and on ONNX Runtime, side by side.

For each tower shape (``--towers``; by default LLaVA-1.5's CLIP ViT-L/14 at 336 px with its MLP
projector) an mmproj is written for the language model's width (cached in ``--mmproj-dir``),
exported to ONNX (:func:`robot_latency.models.vision_onnx.export_vision_onnx`), and the same
frame is encoded ``--repeats`` times by each, interleaved (the order flips every repeat, so a
slow spell on a busy machine lands on both): llama.cpp's ``mtmd_encode_chunk`` (all image
chunks; libmtmd preprocesses the frame at tokenize time, which is not timed) against the ONNX
session's runs (``encode_ms``) with the frame's preprocessing timed apart (``preprocess_ms``).
Both get ``--threads`` threads. The first ``--warmup`` repeats are dropped. The frame is the
tower's own tile size unless ``--frame-px`` says otherwise (an idefics3 tower takes frames of at
most one tile). The towers' weights are untrained: the times are real, the embeddings mean
nothing.

    python bench/vision_onnx.py --threads 1 --repeats 5 --out vision_onnx.json
    python bench/vision_onnx.py --towers clip-l14-336 --image-px 224 --repeats 3
    python bench/vision_onnx.py --smoke --out /tmp/vision_onnx.json
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
from pathlib import Path
from typing import Any

from benchio import emit_result
from vision_cost import _px, mmproj_for, pick_lm

from robot_latency.engines.vision import VisionCost
from robot_latency.engines.vision_onnx import OnnxVisionEncoder
from robot_latency.errors import RobotLatencyError
from robot_latency.models.ladder import default_cache_dir
from robot_latency.models.mmproj import TowerShape, at_resolution, lm_embedding_width, tower_shape
from robot_latency.models.vision_onnx import export_vision_onnx
from robot_latency.streams.scene import render_scene

log = logging.getLogger("vision_onnx")

DEFAULT_TOWERS = ("clip-l14-336",)
SMOKE_TOWERS = ("tiny-mlp", "tiny-shuffle")


def _median(rows: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def time_tower(shape: TowerShape, lm: Path, cache: Path, *, frame_px: tuple[int, int] | None,
               repeats: int, warmup: int, threads: int) -> dict[str, Any]:
    mmproj = mmproj_for(shape, lm, cache)
    onnx = export_vision_onnx(mmproj, mmproj.with_suffix(".onnx"))
    w, h = frame_px or (shape.image_size_px, shape.image_size_px)
    frame = render_scene(0, width=w, height=h)
    n_ctx = max(512, shape.tokens_per_tile * 2 + 64)
    llama_rows: list[dict[str, Any]] = []
    onnx_rows: list[dict[str, Any]] = []
    with VisionCost(lm, mmproj, n_ctx=n_ctx, n_batch=512, n_threads=threads) as vision, \
            OnnxVisionEncoder(mmproj, onnx_path=onnx, intra_op_threads=threads) as enc:
        for i in range(warmup + repeats):
            runs = [("llama", vision.frame_cost), ("onnx", enc.encode)]
            for name, run in (runs if i % 2 == 0 else runs[::-1]):
                row = run(frame).to_dict()
                if i >= warmup:
                    (llama_rows if name == "llama" else onnx_rows).append(row)
    llama_ms, onnx_ms = _median(llama_rows, "encode_ms"), _median(onnx_rows, "encode_ms")
    return {"projector": shape.projector, "image_size_px": shape.image_size_px,
            "tokens_per_tile": shape.tokens_per_tile, "vit_params": shape.params,
            "mmproj": str(mmproj), "onnx_path": str(onnx), "onnx_bytes": onnx.stat().st_size,
            "frame_px": [w, h],
            "image_tokens": {"llama": llama_rows[-1]["image_tokens"],
                             "onnx": onnx_rows[-1]["image_tokens"]},
            "llama": {"runs": llama_rows, "median": {"encode_ms": llama_ms, "n": repeats}},
            "onnx": {"runs": onnx_rows,
                     "median": {"encode_ms": onnx_ms,
                                "preprocess_ms": _median(onnx_rows, "preprocess_ms"),
                                "n": repeats}},
            "onnx_over_llama": onnx_ms / llama_ms if llama_ms > 0 else None}


def main() -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    ap.add_argument("--towers", default=",".join(DEFAULT_TOWERS),
                    help="comma-separated tower shapes (robot_latency.models.mmproj.SHAPES)")
    ap.add_argument("--image-px", type=int, default=None,
                    help="the towers' input resolution (default: each shape's own)")
    ap.add_argument("--frame-px", type=_px, default=None,
                    help="camera frame WIDTHxHEIGHT (default: the tower's tile)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--lm", default="bundled", help="demo, bundled, or a GGUF path")
    ap.add_argument("--mmproj-dir", type=Path, default=None,
                    help="where the mmproj and ONNX files are cached "
                    "(default: <model cache>/mmproj)")
    ap.add_argument("--smoke", action="store_true",
                    help="the tiny towers, the shipped planner, one repeat: seconds")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.smoke:
        args.towers, args.lm, args.repeats, args.warmup = ",".join(SMOKE_TOWERS), "bundled", 1, 0
    if args.repeats < 1 or args.warmup < 0 or args.threads < 1:
        ap.error("--repeats and --threads must be >= 1, --warmup >= 0")
    lm, source = pick_lm(args.lm)
    with tempfile.TemporaryDirectory(prefix="vision_onnx-") as tmp:
        cache = args.mmproj_dir or (Path(tmp) if args.smoke else default_cache_dir() / "mmproj")
        towers = {}
        try:
            for name in (t.strip() for t in args.towers.split(",") if t.strip()):
                shape = tower_shape(name)
                if args.image_px is not None:
                    shape = at_resolution(shape, args.image_px)
                towers[name] = time_tower(shape, lm, cache, frame_px=args.frame_px,
                                          repeats=args.repeats, warmup=args.warmup,
                                          threads=args.threads)
        except RobotLatencyError as exc:
            ap.error(str(exc))
    return emit_result({
        "lm": {"path": str(lm), "source": source, "n_embd": lm_embedding_width(lm)},
        "threads": args.threads, "repeats": args.repeats, "smoke": args.smoke,
        "weights": "untrained (random): the times are real, the embeddings mean nothing",
        "towers": towers}, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
