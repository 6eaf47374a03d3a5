"""The harness's overhead on a frame's image cost: our clock against llama.cpp's own timing.

libmtmd's helper (``mtmd_helper_eval_chunk_single``) times its own encode of an image chunk and
each batch of the chunk's image prefill, and logs them ("image slice encoded in N ms", "image
decoded (batch i/n) in N ms"; routed into Python logging, ``robot_latency.llama_cpp``). Here the
same call is also timed on the project's clock, around it, for ``--frames`` rendered frames
through a tower written for the language model (untrained: the times are real). The difference,
over our time, bounds what our timing adds: the ctypes call, the clock reads and the helper's
own bookkeeping between its timed parts. llama.cpp logs whole milliseconds, so a real tower's
encode (seconds) is needed for a ratio finer than a percent.

    python bench/vision_overhead.py --tower siglip-b16-512 --frames 3 --out vision_overhead.json
    python bench/vision_overhead.py --smoke --out /tmp/vision_overhead.json
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import re
import tempfile
from pathlib import Path
from typing import Any

from benchio import emit_result

from robot_latency.clock import DEFAULT_CLOCK
from robot_latency.engines.llamalog import LOGGER_NAME
from robot_latency.engines.vision import VisionCost, frame_rgb
from robot_latency.models.bundled import bundled_model_path
from robot_latency.models.mmproj import tower_shape, write_mmproj
from robot_latency.streams.scene import render_scene

_ENCODED = re.compile(r"slice encoded in (\d+) ms")
_DECODED = re.compile(r"decoded \(batch \d+/\d+\) in (\d+) ms")


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def time_frame(vc: VisionCost, png: bytes, lines: _Lines) -> dict[str, Any]:
    """One frame through the helper: our time and llama.cpp's, per image chunk, summed."""
    m = vc._mtmd
    width, height, data = frame_rgb(png)
    buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
    bitmap = m.mtmd_bitmap_init(width, height, buf)
    chunks = m.mtmd_input_chunks_init()
    ours_ns = llama_ms = 0.0
    n_chunks = 0
    try:
        marker = m.mtmd_default_marker()
        text = m.mtmd_input_text(marker, len(marker), False, True)
        if m.mtmd_tokenize(vc._ctx, chunks, ctypes.byref(text),
                           (m.mtmd_bitmap_p_ctypes * 1)(bitmap), 1) != 0:
            raise SystemExit("mtmd_tokenize failed")
        vc._clear()
        n_past = 0
        for i in range(m.mtmd_input_chunks_size(chunks)):
            chunk = m.mtmd_input_chunks_get(chunks, i)
            if m.mtmd_input_chunk_get_type(chunk) != 1:
                continue
            new_past = ctypes.c_int32(0)
            del lines.lines[:]
            t0 = DEFAULT_CLOCK()
            rc = m.mtmd_helper_eval_chunk_single(vc._ctx, vc.llm.ctx, chunk, n_past, 0,
                                                 vc.n_batch, False, ctypes.byref(new_past))
            ours_ns += DEFAULT_CLOCK() - t0
            if rc != 0:
                raise SystemExit(f"mtmd_helper_eval_chunk_single returned {rc}")
            n_past = new_past.value
            text_log = "\n".join(lines.lines)
            llama_ms += sum(int(x) for x in _ENCODED.findall(text_log))
            llama_ms += sum(int(x) for x in _DECODED.findall(text_log))
            n_chunks += 1
    finally:
        m.mtmd_input_chunks_free(chunks)
        m.mtmd_bitmap_free(bitmap)
    ours_ms = ours_ns / 1e6
    return {"chunks": n_chunks, "ours_ms": round(ours_ms, 3), "llama_cpp_ms": llama_ms,
            "overhead_ms": round(ours_ms - llama_ms, 3),
            "overhead_fraction": round((ours_ms - llama_ms) / ours_ms, 5) if ours_ms else None}


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    ap.add_argument("--tower", default="siglip-b16-512")
    ap.add_argument("--frames", type=int, default=3)
    ap.add_argument("--frame-px", default="640x480")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--smoke", action="store_true", help="a tiny tower, 2 frames")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if args.smoke:
        args.tower, args.frames, args.frame_px = "tiny-mlp", 2, "96x72"
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    lines = _Lines()
    logger = logging.getLogger(LOGGER_NAME)
    logger.addHandler(lines)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False  # the routed llama.cpp lines go to the handler, not the console
    lm = bundled_model_path("planner")
    shape = tower_shape(args.tower)
    w, h = (int(x) for x in args.frame_px.lower().split("x"))
    with tempfile.TemporaryDirectory() as tmp:
        mmproj = write_mmproj(shape, Path(tmp) / "t.gguf", lm_path=lm)
        with VisionCost(lm, mmproj, n_ctx=4096, n_threads=args.threads) as vc:
            frames = [time_frame(vc, render_scene(i, width=w, height=h), lines)
                      for i in range(args.frames)]
    ours = sum(f["ours_ms"] for f in frames)
    theirs = sum(f["llama_cpp_ms"] for f in frames)
    emit_result({"lm": str(lm), "tower": shape.name, "frame_px": [w, h],
                 "threads": args.threads, "frames": frames,
                 "total": {"ours_ms": round(ours, 3), "llama_cpp_ms": theirs,
                           "overhead_fraction": round((ours - theirs) / ours, 5)
                           if ours else None}}, args.out)


if __name__ == "__main__":
    main()
