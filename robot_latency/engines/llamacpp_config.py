"""The llama.cpp engine's options: one frozen dataclass, validated in one place."""

from __future__ import annotations

from dataclasses import dataclass

from robot_latency.engines.base import EngineError
from robot_latency.llama_load import EXTRA_BUFTS_CHOICES

#: llama.cpp KV cache types by name (ggml_type values).
KV_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8,
            "bf16": 30}
#: What encodes a frame with a vision tower: llama.cpp's clip (through libmtmd) or the tower's
#: ONNX export on ONNX Runtime (robot_latency.engines.vision_onnx).
VISION_ENCODERS = ("clip", "onnx")


@dataclass(frozen=True)
class LlamaCppConfig:
    """Options of the llama.cpp engine; all recorded with every run.

    Args:
        model_path: GGUF file ("" = the bundled planner model).
        n_threads: CPU threads for decode (leave a core to the planner loop).
        n_threads_batch: CPU threads for prefill (default: n_threads).
        n_gpu_layers: layers offloaded to the GPU (Jetson CUDA build; 0 on a CPU host).
        n_ctx: context length allocated (0: the model's trained context).
        chunk_tokens: prefill chunk size: a deadline check runs between chunks.
        flash_attn: use flash attention.
        kv_type: KV cache element type (f16, q8_0, ...).
        prefix_cache: reuse the KV of the prefix shared with the previous prompt.
        abort_callback: arm llama.cpp's abort callback near deadlines (CPU backend only).
        arm_margin_steps: in decode, arm the callback once the deadline is this many ITLs away.
        draft: speculative decoding: "" (off), "model" (``draft_model_path``) or
            "prompt_lookup" (n-gram lookup in the context).
        draft_model_path: the draft GGUF (same vocabulary as the target).
        draft_k: tokens drafted per round.
        draft_adaptive: adapt k each round (grow after a fully accepted round, shrink after a
            rejection), between 1 and ``draft_k``.
        draft_n_threads: CPU threads of the draft model.
        seed: sampling seed.
        warm_prefix: the planner profile's fixed prompt prefix, evaluated once at load so the
            first cycle prefills only its own part ("" = none).
        max_suffix_tokens: the longest per-cycle part the run will send (tokens); with
            ``warm_prefix`` and ``max_new_tokens`` it must fit the context, checked at load.
        max_new_tokens: the most tokens a cycle generates (for that check).
        extra_bufts: llama.cpp's extra buffer types (REPACK, AMX): "auto" turns them off where
            the loaded llama.cpp has AMX kernels, whose path segfaults in decode, and keeps them
            elsewhere; "on" or "off" forces (robot_latency.llama_load).
        mmproj_path: a vision tower (an mmproj GGUF for libmtmd) beside the model: a request's
            camera frame is encoded and kept in the KV cache between the prefix and the cycle's
            text (robot_latency.engines.llama_image); "" = text only.
        vision_encoder: what encodes the frame's image chunks (:data:`VISION_ENCODERS`):
            ``clip`` (libmtmd) or ``onnx`` (the mmproj's ONNX export on ONNX Runtime, cached in
            the model cache); libmtmd lays the frame out either way.
    """

    model_path: str = ""
    n_threads: int = 1
    n_threads_batch: int | None = None
    n_gpu_layers: int = 0
    n_ctx: int = 0
    chunk_tokens: int = 64
    flash_attn: bool = False
    kv_type: str = "f16"
    prefix_cache: bool = True
    abort_callback: bool = True
    arm_margin_steps: float = 2.0
    draft: str = ""
    draft_model_path: str = ""
    draft_k: int = 4
    draft_adaptive: bool = False
    draft_n_threads: int = 1
    seed: int = 0
    warm_prefix: str = ""
    max_suffix_tokens: int = 0
    max_new_tokens: int = 0
    extra_bufts: str = "auto"
    mmproj_path: str = ""
    vision_encoder: str = "clip"

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> EngineError:
            return EngineError(f"llamacpp: {name}={getattr(self, name)!r}: {why}")

        if self.n_threads < 1:
            raise bad("n_threads", "must be >= 1")
        if self.n_threads_batch is not None and self.n_threads_batch < 1:
            raise bad("n_threads_batch", "must be >= 1")
        if self.n_ctx != 0 and self.n_ctx < 16:
            raise bad("n_ctx", "must be 0 (the model's) or >= 16")
        if self.chunk_tokens < 1:
            raise bad("chunk_tokens", "must be >= 1")
        if self.kv_type not in KV_TYPES:
            raise bad("kv_type", f"must be one of {sorted(KV_TYPES)}")
        if self.extra_bufts not in EXTRA_BUFTS_CHOICES:
            raise bad("extra_bufts", f"must be one of {EXTRA_BUFTS_CHOICES}")
        if self.n_gpu_layers < -1:
            raise bad("n_gpu_layers", "must be >= -1 (-1: all)")
        if self.draft not in ("", "model", "prompt_lookup"):
            raise bad("draft", "must be '', 'model' or 'prompt_lookup'")
        if self.draft == "model" and not self.draft_model_path:
            raise bad("draft_model_path", "is required when draft='model'")
        if not 1 <= self.draft_k <= 32:
            raise bad("draft_k", "must be in 1..32")
        if self.mmproj_path and self.draft:
            raise bad("draft", "speculative decoding is text only: not with mmproj_path")
        if self.vision_encoder not in VISION_ENCODERS:
            raise bad("vision_encoder", f"must be one of {VISION_ENCODERS}")
        if self.vision_encoder != "clip" and not self.mmproj_path:
            raise bad("vision_encoder", "needs mmproj_path (a vision tower)")


def verify_batch_tokens(config: LlamaCppConfig) -> int:
    """Return llama.cpp's ``n_batch`` for ``config``: the most tokens one decode call takes.

    The prefill goes in ``chunk_tokens`` chunks (also ``n_ubatch``, so a chunk is one pass with
    a deadline check between passes). Speculative decoding verifies the pending token and up to
    ``draft_k`` drafts in one call, so with drafting on, ``n_batch`` is at least ``draft_k + 1``:
    a verify batch longer than the Llama's ``llama_batch`` (``n_batch`` tokens) was written past
    its arrays ("NULL pointer access" at its ``seq_id`` sentinel) whenever ``chunk_tokens`` was
    smaller than a round's batch.
    """
    if not config.draft:
        return config.chunk_tokens
    return max(config.chunk_tokens, config.draft_k + 1)
