"""A camera frame through the ONNX export of an mmproj's vision tower, on ONNX Runtime.

:class:`OnnxVisionEncoder` exports the mmproj with
:func:`robot_latency.models.vision_onnx.export_vision_onnx` (or opens a given export), and turns a
frame (PNG/JPEG bytes or a Pillow image) into the image embeddings llama.cpp's clip gives for it,
one array per image chunk that libmtmd makes of the frame:

- ``mlp`` (LLaVA-1.5): one chunk. The frame is letterboxed into the ``S`` x ``S`` tile: scaled by
  ``min(S / w, S / h)`` (sides rounded up), Pillow's bicubic resample (which llama.cpp's
  ``resize_bicubic_pillow`` ports, fixed point included), centred on llama.cpp's pad colour for
  this projector, ``(122, 116, 104)`` (CLIP's mean x 255, truncated).
- ``idefics3`` (SmolVLM): the tiles, then the global view, as this llama.cpp's
  ``mtmd_image_preprocessor_idefics3`` makes them (an mmproj without
  ``clip.vision.preproc_image_size``): each side of the frame rounded to whole tiles (halves
  up, at least one), the frame letterboxed into that grid (black pad), cut into ``S`` x ``S``
  tiles row by row; then the frame resized to ``S`` x ``S`` without padding, the view
  (:func:`robot_latency.floor.vision_tower.tile_grid`).

A frame of exactly ``S`` x ``S`` is not resampled at all (llama.cpp copies it), so there the
pixels are bit-equal and only the arithmetic differs. Then ``(x / 255 - mean) / std`` per
channel, with the mmproj's ``clip.vision.image_mean`` / ``image_std``.

The preprocessing and the session run are timed apart on one injected clock (ns).
:func:`decode_embeddings` puts one chunk's embeddings into a llama.cpp context the way
``mtmd_helper_decode_image_chunk`` does (positions ``n_past ..``, no logits), so a plan can be
decoded after the ONNX encode instead of libmtmd's.
"""

from __future__ import annotations

import ctypes
import logging
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from robot_latency.clock import DEFAULT_CLOCK, Clock
from robot_latency.engines.vision import VisionError, frame_rgb
from robot_latency.floor.vision_tower import tile_grid
from robot_latency.models.mmproj import MmprojError
from robot_latency.models.vision_onnx import VisionTower, export_vision_onnx, read_tower

__all__ = ["LLAVA_PAD_RGB", "OnnxFrameEmbedding", "OnnxVisionEncoder", "decode_embeddings",
           "letterbox", "preprocess_frame"]

log = logging.getLogger(__name__)

#: llama.cpp's letterbox colour for the llava projectors (CLIP's mean x 255, truncated).
LLAVA_PAD_RGB = (122, 116, 104)
#: The letterbox colour of idefics3's tiles.
TILE_PAD_RGB = (0, 0, 0)


class OnnxVisionError(VisionError):
    """A frame or an export the ONNX vision encoder cannot take."""


@dataclass(frozen=True)
class OnnxFrameEmbedding:
    """One frame through the ONNX tower.

    Args:
        embeddings: per image chunk, in libmtmd's order, float32 ``(n_tokens, n_embd)``.
        preprocess_ms: decoding, resampling and normalizing the frame.
        encode_ms: the ONNX Runtime runs, all chunks.
    """

    embeddings: tuple[np.ndarray, ...]
    preprocess_ms: float
    encode_ms: float

    @property
    def image_tokens(self) -> int:
        return sum(int(e.shape[0]) for e in self.embeddings)

    def to_dict(self) -> dict[str, Any]:
        return {"image_tokens": self.image_tokens, "image_chunks": len(self.embeddings),
                "preprocess_ms": self.preprocess_ms, "encode_ms": self.encode_ms}


def letterbox(rgb: np.ndarray, side_px: int | tuple[int, int],
              pad_rgb: tuple[int, int, int]) -> np.ndarray:
    """``rgb`` (H, W, 3) uint8 scaled to fit a ``side_px`` square (or a ``(width, height)``
    box) and centred on ``pad_rgb``.

    As llama.cpp's ``img_tool::resize`` with padding: the scale in float32, the sides rounded up,
    the offsets rounded down; no resample when the frame is already the box.
    """
    from PIL import Image

    bw, bh = (side_px, side_px) if isinstance(side_px, int) else side_px
    h, w = int(rgb.shape[0]), int(rgb.shape[1])
    if (w, h) == (bw, bh):
        return rgb
    scale = min(np.float32(bw) / np.float32(w), np.float32(bh) / np.float32(h))
    nw = min(math.ceil(np.float32(w) * scale), bw)
    nh = min(math.ceil(np.float32(h) * scale), bh)
    small = np.asarray(Image.fromarray(rgb).resize((nw, nh), Image.Resampling.BICUBIC))
    out = np.empty((bh, bw, 3), np.uint8)
    out[:] = np.asarray(pad_rgb, np.uint8)
    y0, x0 = (bh - nh) // 2, (bw - nw) // 2
    out[y0:y0 + nh, x0:x0 + nw] = small
    return out


def _stretch(rgb: np.ndarray, side_px: int) -> np.ndarray:
    from PIL import Image

    if rgb.shape[:2] == (side_px, side_px):
        return rgb
    return np.asarray(Image.fromarray(rgb).resize((side_px, side_px), Image.Resampling.BICUBIC))


def _normalize(rgb: np.ndarray, tower: VisionTower) -> np.ndarray:
    # (S, S, 3) uint8 -> (1, 3, S, S) float32, in float32 as clip's img_u8_to_f32
    x = rgb.astype(np.float32) / np.float32(255.0)
    x = (x - np.asarray(tower.mean, np.float32)) / np.asarray(tower.std, np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None])


def preprocess_frame(tower: VisionTower, image: Any) -> list[np.ndarray]:
    """The pixel tensors (1, 3, S, S) float32, one per image chunk, for a frame, in libmtmd's
    order (idefics3: the tiles row by row, then the global view)."""
    width, height, data = frame_rgb(image)
    rgb = np.frombuffer(data, np.uint8).reshape(height, width, 3)
    side = tower.image_size_px
    if tower.projector == "mlp":
        return [_normalize(letterbox(rgb, side, LLAVA_PAD_RGB), tower)]
    cols, rows = tile_grid(width, height, side)
    grid = letterbox(rgb, (cols * side, rows * side), TILE_PAD_RGB)
    tiles = [grid[y * side:(y + 1) * side, x * side:(x + 1) * side]
             for y in range(rows) for x in range(cols)]
    return [*(_normalize(t, tower) for t in tiles), _normalize(_stretch(rgb, side), tower)]


class OnnxVisionEncoder:
    """An mmproj's vision tower on ONNX Runtime (CPU), encoding frames one at a time.

    Args:
        mmproj_path: the mmproj GGUF.
        onnx_path: its export; written to a temporary directory (removed on close) when None.
        intra_op_threads: ONNX Runtime's threads.
        clock: the clock (ns) both times are read from.

    Raises:
        OnnxVisionError: an mmproj that cannot be exported, or a session that will not start.
    """

    def __init__(self, mmproj_path: str | Path, *, onnx_path: str | Path | None = None,
                 intra_op_threads: int = 1, clock: Clock = DEFAULT_CLOCK) -> None:
        import onnxruntime as ort

        if intra_op_threads < 1:
            raise OnnxVisionError(f"intra_op_threads={intra_op_threads}: must be >= 1")
        self._clock = clock
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        try:
            self.tower, _ = read_tower(mmproj_path)
            if onnx_path is None:
                self._tmp = tempfile.TemporaryDirectory(prefix="vision_onnx-")
                onnx_path = export_vision_onnx(mmproj_path, Path(self._tmp.name) / "vision.onnx")
        except MmprojError as exc:
            self.close()
            raise OnnxVisionError(str(exc)) from None
        self.onnx_path = Path(onnx_path)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = int(intra_op_threads)
        opts.inter_op_num_threads = 1
        try:
            self.session = ort.InferenceSession(str(self.onnx_path), sess_options=opts,
                                                providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own types for a bad file
            self.close()
            raise OnnxVisionError(f"{self.onnx_path}: onnxruntime could not open it "
                                  f"({type(exc).__name__})") from None

    def preprocess(self, image: Any) -> list[np.ndarray]:
        """The pixel tensors for ``image``, one per image chunk (:func:`preprocess_frame`)."""
        return preprocess_frame(self.tower, image)

    def encode_pixels(self, pixels: np.ndarray) -> np.ndarray:
        """One chunk's embeddings (n_tokens, n_embd) from its (1, 3, S, S) pixel tensor."""
        return self.session.run(["image_embeds"], {"pixel_values": pixels})[0]

    def encode(self, image: Any) -> OnnxFrameEmbedding:
        """Preprocess and encode ``image`` (Pillow image or PNG/JPEG bytes), timed apart."""
        t0 = self._clock()
        pixels = self.preprocess(image)
        t1 = self._clock()
        embeddings = tuple(self.encode_pixels(p) for p in pixels)
        t2 = self._clock()
        return OnnxFrameEmbedding(embeddings=embeddings, preprocess_ms=(t1 - t0) / 1e6,
                                  encode_ms=(t2 - t1) / 1e6)

    def close(self) -> None:
        self.session = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> OnnxVisionEncoder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def decode_embeddings(lctx: Any, embd: np.ndarray, n_past: int, *, seq_id: int = 0,
                      n_batch: int = 512) -> int:
    """Decode one image chunk's embeddings into ``lctx`` as ``mtmd_helper_decode_image_chunk``
    does for a model without M-RoPE: positions ``n_past .. n_past + n - 1`` in ``seq_id``, no
    logits, in batches of ``n_batch`` tokens.

    Args:
        lctx: a ``llama_context_p``.
        embd: float32 (n_tokens, n_embd), the language model's width.
        n_past: the position of the first image token.
        seq_id: the sequence.
        n_batch: the most tokens per ``llama_decode``.

    Returns:
        The next free position (``n_past + n_tokens``).

    Raises:
        OnnxVisionError: ``llama_decode`` failed.
    """
    import llama_cpp

    n_tokens, n_embd = (int(v) for v in embd.shape)
    flat = np.ascontiguousarray(embd, dtype=np.float32)
    batch = llama_cpp.llama_batch_init(min(n_batch, n_tokens), n_embd, 1)
    try:
        for start in range(0, n_tokens, n_batch):
            n = min(n_batch, n_tokens - start)
            ctypes.memmove(batch.embd, flat[start:start + n].ctypes.data, n * n_embd * 4)
            for i in range(n):
                batch.pos[i] = n_past + start + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = seq_id
                batch.logits[i] = False
            batch.n_tokens = n
            rc = llama_cpp.llama_decode(lctx, batch)
            if rc != 0:
                raise OnnxVisionError(f"llama_decode of image tokens {start}..{start + n} at "
                                      f"n_past={n_past} returned {rc} (n_ctx too small?)")
    finally:
        llama_cpp.llama_batch_free(batch)
    return n_past + n_tokens
