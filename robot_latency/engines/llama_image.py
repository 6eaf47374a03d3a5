"""The camera frame in the llama.cpp engine's prompt: encoded by libmtmd (or the tower's ONNX
export), kept in the KV cache.

A :class:`FrameBlocks` holds an ``mmproj`` loaded beside the engine's language model
(``mtmd_init_from_file``). A request's frame (:class:`robot_latency.engines.base.FrameImage`)
becomes a *block* of the prompt between the fixed prefix and the cycle's text: libmtmd's chunks
for the frame alone (the default media marker), text chunks as their token ids and image chunks as
one *sentinel* id per image token. The sentinel is negative (no real token has it) and derived
from the frame's key, so the engine's longest-shared-prefix reuse of the KV cache
(``LlamaCppEngine._reuse_prefix``) is also the frame cache:

- the same frame as the one in the KV cache: its block matches, nothing of it runs again (no
  encode, no image prefill); the record says ``reused``;
- another frame: the match stops at the block, the KV is cut back to the prefix and the block is
  evaluated: each image chunk's vision encode (``mtmd_encode_chunk``, phase ``image_encode``)
  then its embeddings through the language model (``mtmd_helper_decode_image_chunk``, phase
  ``image_prefill``), each text chunk as tokens. Both phases are stamped with the engine's clock.

Neither the encode nor the image prefill can be interrupted (libmtmd has no abort callback): the
deadline is checked before them. The frame is laid out once per key (decoded and tokenized,
counted in ``image_encode``); the last layout is kept for the next cycle.

With ``vision_encoder="onnx"`` libmtmd still lays the frame out (its chunks, text and image), but
an image chunk is encoded by :class:`~robot_latency.engines.vision_onnx.OnnxVisionEncoder` (the
mmproj's ONNX export, written once into the model cache: ``models.onnx_cache``) from that chunk's
pixels (the frame preprocessed once per key, in the layout), and its embeddings go through the
language model with :func:`~robot_latency.engines.vision_onnx.decode_embeddings` at the same
position: the same phases, the same frame cache. The record's ``image`` says which encoder ran.
"""

from __future__ import annotations

import ctypes
import logging
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from robot_latency.clock import Clock
from robot_latency.engines.base import (
    EngineError,
    FrameImage,
    GenerationRequest,
    GenerationTrace,
    stop_reason_now,
)

log = logging.getLogger(__name__)

__all__ = [
    "IMAGE_PHASES",
    "RGB_ENCODINGS",
    "FrameBlock",
    "FrameBlocks",
    "context_for",
    "frame_block",
    "frame_into_kv",
    "frame_sentinel",
    "open_frames",
    "raw_frame",
]

#: The context a vision tower's model gets at least, unless told (``n_ctx``): a frame's image
#: tokens (576 for CLIP ViT-L/14-336, 64 a tile for SigLIP with idefics3's shuffle) come on top
#: of the prompt, which a text model's trained context (256 for the shipped planner) may not hold.
VISION_MIN_CTX = 2048

#: The phases a frame adds to a generation's record.
IMAGE_PHASES = ("image_encode", "image_prefill")

_CHUNK_IMAGE = 1  # mtmd_input_chunk_get_type's image value (mtmd.h)


#: Raw image encodings whose pixels a vision tower reads (as RGB).
RGB_ENCODINGS = ("rgb8", "bgr8", "mono8")


def raw_frame(key: str, encoding: str, width: int, height: int, step: int,
              data: bytes) -> FrameImage | None:
    """A raw camera image (``sensor_msgs/Image``'s fields) as packed RGB; None for an encoding
    other than :data:`RGB_ENCODINGS`."""
    if encoding not in RGB_ENCODINGS:
        return None
    import numpy as np

    rows = np.frombuffer(data, dtype=np.uint8).reshape(height, step)
    channels = 1 if encoding == "mono8" else 3
    px = rows[:, :width * channels].reshape(height, width, channels)
    if encoding == "bgr8":
        px = px[:, :, ::-1]
    elif channels == 1:
        px = np.repeat(px, 3, axis=2)
    return FrameImage(key=key, width=width, height=height,
                      rgb=np.ascontiguousarray(px).tobytes())


def frame_sentinel(key: str) -> int:
    """The negative id standing for every image token of the frame keyed ``key``."""
    return -1 - (zlib.crc32(key.encode("utf-8")) & 0x3FFFFFFF)


@dataclass
class FrameBlock:
    """A frame laid out as prompt positions: ``tokens`` (text ids and the frame's sentinel), and
    libmtmd's chunks to evaluate them (owned: freed with the block)."""

    key: str
    tokens: list[int]
    image_tokens: int
    image_chunks: int
    chunks: Any
    bitmap: Any
    pixels: list[Any] | None = None  # ONNX encoder: (1, 3, S, S) float32 per image chunk


class FrameBlocks:
    """An mmproj loaded beside a llama.cpp model; frames laid out and evaluated into its context.

    ``encoder`` is what encodes an image chunk: ``clip`` (libmtmd) or ``onnx`` (the mmproj's ONNX
    export on ONNX Runtime, ``n_threads`` threads).

    Raises:
        EngineError: the mmproj is missing, of another width than the model, refused by libmtmd,
            or (``onnx``) not exportable (the message names the file).
    """

    def __init__(self, llm: Any, lm_path: str | Path, mmproj_path: str | Path, *,
                 n_threads: int, n_batch: int, clock: Clock, encoder: str = "clip") -> None:
        from llama_cpp import mtmd_cpp

        from robot_latency.engines.llamalog import route_mtmd_log
        from robot_latency.engines.vision import VisionError, check_pair

        try:
            check_pair(lm_path, mmproj_path)
        except VisionError as err:
            raise EngineError(f"llamacpp: mmproj: {err}") from None
        route_mtmd_log()
        self._m, self._llm, self._clock = mtmd_cpp, llm, clock
        self.mmproj_path = Path(mmproj_path)
        self.n_batch = int(n_batch)
        params = mtmd_cpp.mtmd_context_params_default()
        params.use_gpu = False
        params.print_timings = False
        params.n_threads = int(n_threads)
        params.warmup = False
        self._ctx = mtmd_cpp.mtmd_init_from_file(str(mmproj_path).encode(), llm.model, params)
        if not self._ctx:
            raise EngineError(f"llamacpp: mmproj {mmproj_path}: libmtmd could not load it "
                              "(llama.cpp's log says why)")
        self._last: FrameBlock | None = None
        self._warned = False
        self.encoder = encoder
        self._onnx: Any = None
        why = None
        if not mtmd_cpp.mtmd_support_vision(self._ctx):
            why = "no vision encoder (clip.has_vision_encoder)"
        elif mtmd_cpp.mtmd_decode_use_mrope(self._ctx):
            # M-RoPE (Qwen2-VL, Qwen2.5-VL, ...): an image advances the position by other than
            # its token count, and the engine's text positions follow the token count.
            why = "its model uses M-RoPE positions (Qwen2-VL-style), which this engine's " \
                  "prompt bookkeeping does not follow yet"
        if why is None and encoder == "onnx":
            why = self._open_onnx(n_threads)
        if why is not None:
            self.close()
            raise EngineError(f"llamacpp: mmproj {mmproj_path}: {why}")

    def _open_onnx(self, n_threads: int) -> str | None:
        """Open the mmproj's ONNX export (cached); None, or why it cannot be used."""
        from robot_latency.engines.vision_onnx import OnnxVisionEncoder, OnnxVisionError
        from robot_latency.models.onnx_cache import OnnxCacheError, ensure_vision_onnx

        try:
            self._onnx = OnnxVisionEncoder(self.mmproj_path,
                                           onnx_path=ensure_vision_onnx(self.mmproj_path),
                                           intra_op_threads=int(n_threads), clock=self._clock)
        except (OnnxCacheError, OnnxVisionError) as err:
            return f"vision_encoder='onnx': {err}"
        return None

    def close(self) -> None:
        self._drop()
        if self._onnx is not None:
            self._onnx.close()
            self._onnx = None
        if self._ctx:
            self._m.mtmd_free(self._ctx)
            self._ctx = None

    def _drop(self) -> None:
        if self._last is not None:
            self._m.mtmd_input_chunks_free(self._last.chunks)
            self._m.mtmd_bitmap_free(self._last.bitmap)
            self._last = None

    def _text_tokens(self, chunk: Any) -> list[int]:
        """A text chunk's token ids. A projector's wrapper token the model's vocabulary lacks
        (SmolVLM's ``<fake_token_around_image>`` beside another model) comes back from libmtmd
        as -1 (no token): left out, with a warning once."""
        n_out = ctypes.c_size_t()
        ptr = self._m.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n_out))
        ids = [ptr[j] for j in range(n_out.value)]
        if any(t < 0 for t in ids) and not self._warned:
            self._warned = True
            log.warning("%s: the model's vocabulary lacks some of the projector's wrapper "
                        "tokens; they are left out of the prompt", self.mmproj_path)
        return [t for t in ids if t >= 0]

    def block(self, frame: FrameImage) -> tuple[FrameBlock, bool]:
        """The frame's block, and whether it was laid out now (the image decoded and tokenized
        by libmtmd); the last one when the key is the same.

        Raises:
            EngineError: an image that cannot be read, or that libmtmd will not tokenize.
        """
        if self._last is not None and self._last.key == frame.key:
            return self._last, False
        from robot_latency.engines.vision import frame_rgb

        m = self._m
        try:
            width, height, data = (frame.width, frame.height, frame.rgb) if frame.rgb \
                else frame_rgb(frame.data)
        except Exception as err:  # Pillow raises several types for a bad image
            raise EngineError(f"frame {frame.key}: not an image ({type(err).__name__}: "
                              f"{err})") from None
        if frame.scale != 1.0:  # downscaled before the tower sees it (a fit policy's choice)
            from PIL import Image

            size = (max(1, round(width * frame.scale)), max(1, round(height * frame.scale)))
            data = Image.frombytes("RGB", (width, height), data).resize(size).tobytes()
            width, height = size
        pixels = self._pixels(frame.key, width, height, data) if self._onnx is not None \
            else None
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        bitmap = m.mtmd_bitmap_init(width, height, buf)
        if not bitmap:
            raise EngineError(f"frame {frame.key} ({width}x{height}): mtmd_bitmap_init failed")
        chunks = m.mtmd_input_chunks_init()
        marker = m.mtmd_default_marker()
        text = m.mtmd_input_text(marker, len(marker), False, True)
        rc = m.mtmd_tokenize(self._ctx, chunks, ctypes.byref(text),
                             (m.mtmd_bitmap_p_ctypes * 1)(bitmap), 1)
        if rc != 0:
            m.mtmd_input_chunks_free(chunks)
            m.mtmd_bitmap_free(bitmap)
            raise EngineError(f"frame {frame.key} ({width}x{height}): mtmd_tokenize "
                              f"returned {rc}")
        mark = frame_sentinel(frame.key)
        tokens: list[int] = []
        image_tokens = image_chunks = 0
        for i in range(m.mtmd_input_chunks_size(chunks)):
            chunk = m.mtmd_input_chunks_get(chunks, i)
            if m.mtmd_input_chunk_get_type(chunk) == _CHUNK_IMAGE:
                n = m.mtmd_input_chunk_get_n_tokens(chunk)
                tokens += [mark] * n
                image_tokens += n
                image_chunks += 1
            else:
                tokens += self._text_tokens(chunk)
        if pixels is not None and len(pixels) != image_chunks:
            m.mtmd_input_chunks_free(chunks)
            m.mtmd_bitmap_free(bitmap)
            raise EngineError(f"frame {frame.key} ({width}x{height}): libmtmd made "
                              f"{image_chunks} image chunks, the ONNX encoder's preprocessing "
                              f"{len(pixels)}")
        self._drop()
        self._last = FrameBlock(frame.key, tokens, image_tokens, image_chunks, chunks, bitmap,
                                pixels)
        return self._last, True

    def _pixels(self, key: str, width: int, height: int, data: bytes) -> list[Any]:
        """The ONNX encoder's pixel tensors for the frame's image chunks, in libmtmd's order."""
        from PIL import Image

        from robot_latency.engines.vision_onnx import OnnxVisionError

        try:
            return self._onnx.preprocess(Image.frombytes("RGB", (width, height), data))
        except OnnxVisionError as err:
            raise EngineError(f"frame {key}: vision_encoder='onnx': {err}") from None

    def evaluate(self, block: FrameBlock, trace: GenerationTrace) -> None:
        """Evaluate ``block`` at the end of the model's context (its KV already cut back to
        where the block starts), adding the phases ``image_encode`` and ``image_prefill``.

        Raises:
            EngineError: a chunk's encode (libmtmd or ONNX Runtime) or the decode of its
                embeddings failed.
        """
        m, llm, clock = self._m, self._llm, self._clock
        encode_ns = prefill_ns = 0
        image_index = 0  # the image chunk's place among the frame's image chunks
        for i in range(m.mtmd_input_chunks_size(block.chunks)):
            chunk = m.mtmd_input_chunks_get(block.chunks, i)
            if m.mtmd_input_chunk_get_type(chunk) != _CHUNK_IMAGE:
                text = self._text_tokens(chunk)
                if text:
                    llm.eval(text)
                continue
            n = m.mtmd_input_chunk_get_n_tokens(chunk)
            if m.mtmd_decode_use_non_causal(self._ctx, chunk) and n > self.n_batch:
                raise EngineError(f"{self.mmproj_path}: its image attention is non-causal: "
                                  f"the {n} image tokens of a chunk must go in one batch; set "
                                  f"chunk_tokens >= {n}")
            if block.pixels is not None:
                t0, t1, t2 = self._onnx_chunk(block.pixels[image_index], n)
                rc = 0  # a failed decode raised
            else:
                t0 = clock()
                if m.mtmd_encode_chunk(self._ctx, chunk) != 0:
                    raise EngineError(f"{self.mmproj_path}: mtmd_encode_chunk failed")
                t1 = clock()
                new_past = ctypes.c_int32(0)
                rc = m.mtmd_helper_decode_image_chunk(
                    self._ctx, llm.ctx, chunk, m.mtmd_get_output_embd(self._ctx), llm.n_tokens,
                    0, self.n_batch, ctypes.byref(new_past),
                    m.mtmd_helper_post_decode_callback(), None)
                t2 = clock()
            image_index += 1
            if rc != 0:
                raise EngineError(f"llamacpp: the image prefill of {n} tokens failed ({rc}): "
                                  "is n_ctx large enough for the frame?")
            # the positions the frame now holds, marked with its sentinel for the prefix match
            llm.input_ids[llm.n_tokens: llm.n_tokens + n] = frame_sentinel(block.key)
            llm.n_tokens += n
            encode_ns += t1 - t0
            prefill_ns += t2 - t1
        extra = trace.phases_extra_ns
        extra["image_encode"] = extra.get("image_encode", 0) + encode_ns
        extra["image_prefill"] = extra.get("image_prefill", 0) + prefill_ns

    def _onnx_chunk(self, pixels: Any, n_tokens: int) -> tuple[int, int, int]:
        """Encode one image chunk on ONNX Runtime and decode its embeddings at the end of the
        context; return the clock's reads (start, encoded, prefilled; ns).

        Raises:
            EngineError: the encoder's token count is not the chunk's, or the decode failed.
        """
        from robot_latency.engines.vision_onnx import OnnxVisionError, decode_embeddings

        clock, llm = self._clock, self._llm
        t0 = clock()
        embd = self._onnx.encode_pixels(pixels)  # (n_tokens, n_embd) float32
        t1 = clock()
        if int(embd.shape[0]) != n_tokens:
            raise EngineError(f"{self.mmproj_path}: the ONNX encoder gave {embd.shape[0]} image "
                              f"tokens for a chunk of {n_tokens}")
        try:
            decode_embeddings(llm.ctx, embd, llm.n_tokens, n_batch=self.n_batch)
        except OnnxVisionError as err:
            raise EngineError(f"llamacpp: the image prefill of {n_tokens} tokens failed "
                              f"({err}): is n_ctx large enough for the frame?") from None
        return t0, t1, clock()


def frame_block(engine: Any, request: GenerationRequest,
                trace: GenerationTrace) -> FrameBlock | None:
    """The request's frame laid out by ``engine``'s :class:`FrameBlocks` (None: no frame, or no
    vision tower), its layout time counted in ``image_encode``."""
    if request.image is None or engine.frames is None:
        return None
    t0 = engine.clock()
    block, laid_out = engine.frames.block(request.image)
    layout_ns = engine.clock() - t0 if laid_out else 0
    if laid_out:
        trace.phases_extra_ns["image_encode"] = layout_ns
    trace.image = {"key": block.key, "tokens": block.image_tokens,
                   "chunks": block.image_chunks, "reused": False, "layout_ns": layout_ns,
                   "encoder": engine.frames.encoder}
    return block


def frame_into_kv(engine: Any, request: GenerationRequest, trace: GenerationTrace,
                  tokens: list[int], start: int, block: FrameBlock, keep: int) -> int | None:
    """Put the frame's block (at ``tokens[start:]``) in ``engine``'s KV cache unless it is
    there (``keep``, the tokens the prefix match kept, reaches past it); return the tokens now
    cached, or None when the deadline passed before the encode (the trace says so). The
    trace's ``prefix_cache_tokens`` counts the frame only where it was found in the cache."""
    end = start + len(block.tokens)
    if keep >= end:
        trace.image["reused"] = True
        return keep
    if keep > start:  # into another frame's block (its wrapping text): cut back to the prefix
        engine._reuse_prefix(tokens[:start + 1])
        keep = start
    trace.prefix_cache_tokens = keep  # what was cached: the frame is evaluated, not found
    step = engine.config.chunk_tokens
    for i in range(keep, start, step):  # the prefix itself not cached (prefix_cache off)
        engine.llm.eval(tokens[i: min(start, i + step)])
    stop = stop_reason_now(request, None, engine.clock())
    if stop is not None:
        trace.stop_reason = stop
        return None
    engine.frames.evaluate(block, trace)
    return end


def open_frames(llm: Any, lm_path: Path, config: Any, clock: Clock) -> FrameBlocks | None:
    """The engine's vision tower (``config.mmproj_path``, a
    :class:`~robot_latency.engines.llamacpp_config.LlamaCppConfig`), or None for text only."""
    if not config.mmproj_path:
        return None
    from robot_latency.engines.llamacpp_config import verify_batch_tokens

    return FrameBlocks(llm, lm_path, config.mmproj_path,
                       n_threads=config.n_threads_batch or config.n_threads,
                       n_batch=verify_batch_tokens(config), clock=clock,
                       encoder=config.vision_encoder)


def context_for(config: Any, trained: int | None) -> int:
    """The ``n_ctx`` a model is opened with: ``config.n_ctx`` where set (0: the model's trained
    context), else, with a vision tower, at least :data:`VISION_MIN_CTX`."""
    if config.n_ctx or not config.mmproj_path:
        return int(config.n_ctx)
    return max(int(trained or 0), VISION_MIN_CTX)
