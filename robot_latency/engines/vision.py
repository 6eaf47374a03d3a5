"""The image's cost on llama.cpp: the vision encode, then the image tokens' prefill, per frame.

A :class:`VisionCost` loads the language model through
:func:`robot_latency.llama_load.open_llama` and an ``mmproj`` beside it through ``libmtmd``
(``llama_cpp.mtmd_cpp``). Each frame is tokenized with the default media marker alone, so its
chunks are the image chunks (plus the few text tokens a projector type wraps them in, which are
not decoded here). For each image chunk, ``mtmd_encode_chunk`` (the vision pass alone) and then
``mtmd_helper_decode_image_chunk`` (its embeddings through the language model, from an empty
context) are timed apart on the project's clock (:data:`robot_latency.clock.DEFAULT_CLOCK`).

The mmproj's weights may be untrained (:mod:`robot_latency.models.mmproj`): the times are real,
the embeddings carry no meaning.
"""

from __future__ import annotations

import ctypes
import io
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from robot_latency.clock import DEFAULT_CLOCK, Clock
from robot_latency.engines.base import EngineError
from robot_latency.engines.llamalog import route_mtmd_log
from robot_latency.llama_load import LoadPolicy, load_policy, open_llama
from robot_latency.models.mmproj import MmprojError, lm_embedding_width, mmproj_output_width

log = logging.getLogger(__name__)

#: ``mtmd_input_chunk_get_type``'s value for an image chunk (mtmd.h).
CHUNK_IMAGE = 1


class VisionError(EngineError, ValueError):
    """An mmproj that libmtmd cannot load beside the language model, or a frame it cannot take."""


@dataclass(frozen=True)
class FrameCost:
    """One frame's image cost.

    Args:
        image_tokens: image tokens through the language model (all image chunks).
        image_chunks: image chunks (1 for mlp; the global view plus the tiles for idefics3).
        text_tokens: the text tokens the projector type wraps the image in (not decoded here).
        encode_ms: the vision encoder's passes (``mtmd_encode_chunk``), all chunks.
        image_prefill_ms: the image embeddings decoded into the context, all chunks.
    """

    image_tokens: int
    image_chunks: int
    text_tokens: int
    encode_ms: float
    image_prefill_ms: float

    def to_dict(self) -> dict[str, Any]:
        return {"image_tokens": self.image_tokens, "image_chunks": self.image_chunks,
                "text_tokens": self.text_tokens, "encode_ms": self.encode_ms,
                "image_prefill_ms": self.image_prefill_ms}


def frame_rgb(image: Any) -> tuple[int, int, bytes]:
    """(width, height, packed RGB bytes) of a Pillow image or of PNG/JPEG bytes."""
    from PIL import Image

    if isinstance(image, (bytes, bytearray)):
        image = Image.open(io.BytesIO(bytes(image)))
    rgb = image.convert("RGB")
    return rgb.width, rgb.height, rgb.tobytes()


def check_pair(lm_path: str | Path, mmproj_path: str | Path) -> int:
    """The width both files share; :class:`VisionError` naming the file and field otherwise."""
    try:
        n_embd = lm_embedding_width(lm_path)
        out = mmproj_output_width(mmproj_path)
    except MmprojError as exc:
        raise VisionError(str(exc)) from None
    if out != n_embd:
        raise VisionError(f"{mmproj_path}: projector output width {out} != the language "
                          f"model's embedding_length {n_embd} ({lm_path})")
    return n_embd


class VisionCost:
    """A language model and an mmproj loaded together, timing frames one at a time.

    Args:
        lm_path: the language model's GGUF.
        mmproj_path: the vision tower's GGUF.
        n_ctx: the context (must hold one frame's image tokens).
        n_batch: the prefill's batch.
        n_threads: threads for both the encoder and the language model.
        policy: the load policy (default: ``load_policy("auto")``).
        clock: the clock (ns).

    Raises:
        VisionError: a missing file, mismatched widths, or an mmproj libmtmd refuses.
    """

    def __init__(self, lm_path: str | Path, mmproj_path: str | Path, *, n_ctx: int = 2048,
                 n_batch: int = 512, n_threads: int = 1, policy: LoadPolicy | None = None,
                 clock: Clock = DEFAULT_CLOCK) -> None:
        from llama_cpp import mtmd_cpp

        self.n_embd = check_pair(lm_path, mmproj_path)
        route_mtmd_log()
        self.lm_path, self.mmproj_path = Path(lm_path), Path(mmproj_path)
        self.n_batch = int(n_batch)
        self._clock = clock
        self._mtmd = mtmd_cpp
        self.llm = open_llama(policy or load_policy("auto"), model_path=str(lm_path),
                              n_ctx=int(n_ctx), n_batch=self.n_batch, n_ubatch=self.n_batch,
                              n_threads=int(n_threads), n_threads_batch=int(n_threads),
                              verbose=False)
        params = mtmd_cpp.mtmd_context_params_default()
        params.use_gpu = False
        params.print_timings = False
        params.n_threads = int(n_threads)
        params.warmup = False
        self._ctx = mtmd_cpp.mtmd_init_from_file(str(mmproj_path).encode(), self.llm.model,
                                                 params)
        if not self._ctx:
            self.llm.close()
            raise VisionError(f"{mmproj_path}: libmtmd could not load it (llama.cpp's log says "
                              "why)")
        if not mtmd_cpp.mtmd_support_vision(self._ctx):
            self.close()
            raise VisionError(f"{mmproj_path}: clip.has_vision_encoder: no vision encoder")

    def close(self) -> None:
        if getattr(self, "_ctx", None):
            self._mtmd.mtmd_free(self._ctx)
            self._ctx = None
        self.llm.close()

    def __enter__(self) -> VisionCost:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _clear(self) -> None:
        import llama_cpp

        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self.llm.ctx), True)

    def frame_cost(self, image: Any) -> FrameCost:
        """Encode ``image`` (Pillow image or PNG/JPEG bytes) and prefill its image tokens into
        an empty context; return the counts and the two times."""
        m = self._mtmd
        width, height, data = frame_rgb(image)
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        bitmap = m.mtmd_bitmap_init(width, height, buf)
        if not bitmap:
            raise VisionError(f"frame {width}x{height}: mtmd_bitmap_init failed")
        chunks = m.mtmd_input_chunks_init()
        try:
            marker = m.mtmd_default_marker()
            text = m.mtmd_input_text(marker, len(marker), False, True)
            bitmaps = (m.mtmd_bitmap_p_ctypes * 1)(bitmap)
            rc = m.mtmd_tokenize(self._ctx, chunks, ctypes.byref(text), bitmaps, 1)
            if rc != 0:
                raise VisionError(f"frame {width}x{height}: mtmd_tokenize returned {rc}")
            return self._run(chunks)
        finally:
            m.mtmd_input_chunks_free(chunks)
            m.mtmd_bitmap_free(bitmap)

    def _run(self, chunks: Any) -> FrameCost:
        m = self._mtmd
        self._clear()
        n_past = ctypes.c_int32(0)
        encode_ns = prefill_ns = 0
        image_tokens = image_chunks = text_tokens = 0
        for i in range(m.mtmd_input_chunks_size(chunks)):
            chunk = m.mtmd_input_chunks_get(chunks, i)
            n = m.mtmd_input_chunk_get_n_tokens(chunk)
            if m.mtmd_input_chunk_get_type(chunk) != CHUNK_IMAGE:
                text_tokens += n
                continue
            t0 = self._clock()
            rc = m.mtmd_encode_chunk(self._ctx, chunk)
            t1 = self._clock()
            if rc != 0:
                raise VisionError(f"{self.mmproj_path}: mtmd_encode_chunk returned {rc}")
            embd = m.mtmd_get_output_embd(self._ctx)
            new_past = ctypes.c_int32(0)
            t2 = self._clock()
            rc = m.mtmd_helper_decode_image_chunk(self._ctx, self.llm.ctx, chunk, embd,
                                                  n_past.value, 0, self.n_batch,
                                                  ctypes.byref(new_past),
                                                  m.mtmd_helper_post_decode_callback(), None)
            t3 = self._clock()
            if rc != 0:
                raise VisionError(f"{self.lm_path}: image prefill of {n} tokens returned {rc} "
                                  "(n_ctx too small?)")
            n_past = new_past
            encode_ns += t1 - t0
            prefill_ns += t3 - t2
            image_tokens += n
            image_chunks += 1
        if not image_chunks:
            raise VisionError(f"{self.mmproj_path}: the frame gave no image chunk")
        return FrameCost(image_tokens=image_tokens, image_chunks=image_chunks,
                         text_tokens=text_tokens, encode_ms=encode_ns / 1e6,
                         image_prefill_ms=prefill_ns / 1e6)
