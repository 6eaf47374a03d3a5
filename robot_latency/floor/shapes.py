"""Transformer shape presets: models described by their public configs, without a file.

The floor model, the synthesizer (``models synth``) and the inflater read these shapes; the
published-measurement table names its models by these ids.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["PRESETS", "REFUSED_MODELS", "ModelShape", "refusal_reason"]


@dataclass(frozen=True)
class ModelShape:
    """A transformer shape without a file (from the models' public config files).

    The parameter count follows the llama / qwen2 layout: token embedding; per layer q, k, v, o
    projections (plus q/k/v biases for qwen2), gate/up/down FFN matrices and two RMSNorm vectors;
    a final norm; and an output head unless the embeddings are tied.
    """

    id: str
    name: str
    architecture: str
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn: int
    vocab_size: int
    tied_embeddings: bool
    qkv_bias: bool
    context_length: int

    def embedding_params(self) -> int:
        """Elements of the token-embedding table (``vocab_size * hidden``)."""
        return self.vocab_size * self.hidden

    def matrix_params(self) -> int:
        """Elements of all 2-D weight matrices, embedding and (untied) output head included."""
        q_dim = self.n_heads * self.head_dim
        kv_dim = self.n_kv_heads * self.head_dim
        attn = self.hidden * q_dim + 2 * self.hidden * kv_dim + q_dim * self.hidden
        mlp = 3 * self.hidden * self.ffn
        heads = self.embedding_params() * (1 if self.tied_embeddings else 2)
        return self.n_layers * (attn + mlp) + heads

    def vector_params(self) -> int:
        """Elements of 1-D tensors: per-layer norms (and qkv biases), and the final norm."""
        per_layer = 2 * self.hidden
        if self.qkv_bias:
            per_layer += (self.n_heads + 2 * self.n_kv_heads) * self.head_dim
        return self.n_layers * per_layer + self.hidden

    def param_count(self) -> int:
        """Exact parameter count implied by the shape."""
        return self.matrix_params() + self.vector_params()

    def matrix_params_per_step(self) -> int:
        """Matrix elements one decode step reads (docs/REFERENCE.md, "The latency model").

        All matrices except the token-embedding lookup; with tied embeddings the table is the
        output head and is read in full, so it is counted.
        """
        if self.tied_embeddings:
            return self.matrix_params()
        return self.matrix_params() - self.embedding_params()


def _shape(
    id: str, name: str, arch: str, layers: int, hidden: int, heads: int, kv: int, hd: int,
    ffn: int, vocab: int, tied: bool, ctx: int,
) -> ModelShape:
    return ModelShape(
        id=id, name=name, architecture=arch, n_layers=layers, hidden=hidden, n_heads=heads,
        n_kv_heads=kv, head_dim=hd, ffn=ffn, vocab_size=vocab, tied_embeddings=tied,
        qkv_bias=arch == "qwen2", context_length=ctx,
    )


#: Why an architecture cannot be counted as one dense transformer pass per token. A refused
#: model is never given a floor: a hybrid's state-space or convolution layers read a fixed state,
#: not a KV cache, and a mixture-of-experts reads only the routed experts' weights per token.
HYBRID_SSM_REASON = ("hybrid state-space/convolution layers: bytes per step and the KV cache "
                     "do not follow the dense-transformer count")
MOE_REASON = ("mixture-of-experts: each token reads only its routed experts, which the dense "
              "bytes-per-step count does not model")

#: Models the published table names that the floor refuses: id -> (name, reason).
REFUSED_MODELS: dict[str, tuple[str, str]] = {
    "nemotron3-nano-4b": ("Nemotron3-Nano-4B", HYBRID_SSM_REASON + " (Nemotron-H: Mamba-2 + "
                          "attention)"),
    "lfm2.5-350m": ("LFM2.5-350M", HYBRID_SSM_REASON + " (LFM2: gated convolutions + attention)"),
    "lfm2.5-1.2b": ("LFM2.5-1.2B", HYBRID_SSM_REASON + " (LFM2: gated convolutions + attention)"),
}


def refusal_reason(model_id: str) -> str | None:
    """Return why ``model_id`` cannot be counted, or None when it is not a refused model."""
    entry = REFUSED_MODELS.get(model_id.strip().lower())
    return None if entry is None else f"{entry[0]}: {entry[1]}"


# Shapes from the models' public config.json files (docs/REFERENCE.md, "Model shapes"). Context
# lengths are from the same configs or model cards: Llama-3 8k, Llama-3.1 and 3.2 128k, Llama-2 4k,
# Qwen2.5 32k, TinyLlama 2k, SmolLM2 8k, Gemma-2 8k, Phi-3.5-mini 128k. Gemma-2 has four norm
# vectors per layer where this layout counts two (2 x 26 x 2304 elements, under 0.01%); Phi-3
# fuses q/k/v and gate/up into single tensors, which changes no element count.
_PRESET_ROWS: tuple[tuple[Any, ...], ...] = (
    # id, name, arch, layers, hidden, heads, kv heads, head_dim, ffn, vocab, tied, context
    ("llama-3-8b", "Llama-3-8B", "llama", 32, 4096, 32, 8, 128, 14336, 128256, False, 8192),
    ("llama-3.2-3b", "Llama-3.2-3B", "llama", 28, 3072, 24, 8, 128, 8192, 128256, True, 131072),
    ("llama-3.2-1b", "Llama-3.2-1B", "llama", 16, 2048, 32, 8, 64, 8192, 128256, True, 131072),
    ("qwen2.5-1.5b", "Qwen2.5-1.5B", "qwen2", 28, 1536, 12, 2, 128, 8960, 151936, True, 32768),
    ("qwen2.5-0.5b", "Qwen2.5-0.5B", "qwen2", 24, 896, 14, 2, 64, 4864, 151936, True, 32768),
    ("tinyllama-1.1b", "TinyLlama-1.1B", "llama", 22, 2048, 32, 4, 64, 5632, 32000, False, 2048),
    ("smollm2-360m", "SmolLM2-360M", "llama", 32, 960, 15, 5, 64, 2560, 49152, True, 8192),
    ("smollm2-135m", "SmolLM2-135M", "llama", 30, 576, 9, 3, 64, 1536, 49152, True, 8192),
    ("llama-3.1-8b", "Llama-3.1-8B", "llama", 32, 4096, 32, 8, 128, 14336, 128256, False, 131072),
    ("qwen2.5-3b", "Qwen2.5-3B", "qwen2", 36, 2048, 16, 2, 128, 11008, 151936, True, 32768),
    ("qwen2.5-7b", "Qwen2.5-7B", "qwen2", 28, 3584, 28, 4, 128, 18944, 152064, False, 32768),
    ("smollm2-1.7b", "SmolLM2-1.7B", "llama", 24, 2048, 32, 32, 64, 8192, 49152, True, 8192),
    ("gemma-2-2b", "Gemma-2-2B", "gemma2", 26, 2304, 8, 4, 256, 9216, 256000, True, 8192),
    ("phi-3.5-mini", "Phi-3.5-mini", "phi3", 32, 3072, 32, 32, 96, 8192, 32064, False, 131072),
    ("llama-2-7b", "Llama-2-7B", "llama", 32, 4096, 32, 32, 128, 11008, 32000, False, 4096),
    ("llama-2-13b", "Llama-2-13B", "llama", 40, 5120, 40, 40, 128, 13824, 32000, False, 4096),
    ("llama-2-70b", "Llama-2-70B", "llama", 80, 8192, 64, 8, 128, 28672, 32000, False, 4096),
    # Qwen3 (Qwen/Qwen3-*/config.json): no q/k/v biases; q/k RMSNorm vectors (2 x head_dim per
    # layer) are left out of the count, under 0.01%. Gemma-3 (google/gemma-3-1b-it and the text
    # model of gemma-3-4b-it): 5 of 6 layers attend within a sliding window (512 tokens in the
    # 1B, 1024 in the 4B), so the KV bytes counted here are an upper bound at long contexts; the
    # 4B's vision encoder does not run per decode step and is not counted.
    # Checked against public copies (Qwen's and Google's own pages were not reachable from the
    # check; the 4B and Gemma files are gated or not indexed): every field below matched.
    #   Qwen3-0.6B  huggingface.co/CodeAtCMU/Qwen3-0.6B-Base_full_sft_JavaScript_data_12K
    #               (config.json, commit b9617cb)
    #   Qwen3-4B    huggingface.co/MultiRL/qwen3_4b_instruct_sft/blob/main/config.json and
    #               huggingface.co/ngocbh/TrimKV-Qwen3-4B-Math/blob/main/config.json (base_model
    #               Qwen/Qwen3-4B): hidden 2560, 36 layers, 32/8 heads, head_dim 128, ffn 9728,
    #               vocab 151936, tied, 40960 positions
    #   Qwen3-8B    huggingface.co/thejaminator/qwen-hook-layer-9 ("Copy config.json from
    #               Qwen/Qwen3-8B", commit 478fb72): untied
    #   Gemma-3-1B  ollama.com/aliafshar/gemma3-it-qat-tools:1b/blobs/57c9b4a897df (GGUF metadata:
    #               26 blocks, 1152, ffn 6912, 4/1 heads, key_length 256, token_embd
    #               [1152, 262144], sliding window 512; no separate output tensor: tied)
    #   Gemma-3-4B  huggingface.co/Creekside/gemma-3/blame/main/config.json (gemma3_text: 2560,
    #               ffn 10240, 34 layers, 8/4 heads, head_dim 256, vocab 262208, window 1024) and
    #               fast.hugflare.com/simaai/gemma-3-4b-it-a16w4/raw/main/devkit/vlm_config.json
    #               (models--google--gemma-3-4b-it: the same figures)
    ("qwen3-0.6b", "Qwen3-0.6B", "qwen3", 28, 1024, 16, 8, 128, 3072, 151936, True, 40960),
    ("qwen3-1.7b", "Qwen3-1.7B", "qwen3", 28, 2048, 16, 8, 128, 6144, 151936, True, 40960),
    ("qwen3-4b", "Qwen3-4B", "qwen3", 36, 2560, 32, 8, 128, 9728, 151936, True, 40960),
    ("qwen3-8b", "Qwen3-8B", "qwen3", 36, 4096, 32, 8, 128, 12288, 151936, False, 40960),
    ("gemma-3-1b", "Gemma-3-1B", "gemma3", 26, 1152, 4, 1, 256, 6912, 262144, True, 32768),
    ("gemma-3-4b", "Gemma-3-4B", "gemma3", 34, 2560, 8, 4, 256, 10240, 262208, True, 131072),
    # DeepSeek-R1-Distill-Qwen-14B and -32B are fine-tunes of Qwen2.5-14B and -32B with their
    # shapes: the base models' config.json files as copied in
    # github.com/citsjtu2020/LLM-Prof/blob/8434c8d/sglang/Model_Config.md (Qwen2.5-14B: 48
    # layers, 5120, 40/8 heads, ffn 13824, vocab 152064, untied, 131072 positions; Qwen2.5-32B: 64
    # layers, ffn 27648, the rest the same). The counts below reproduce the distilled checkpoints'
    # own exactly: 32,763,876,352 (the Hugging Face API's safetensors total for
    # deepseek-ai/DeepSeek-R1-Distill-Qwen-32B) and 14,770,033,664 (llama.cpp's n_params for
    # Qwen2.5-14B GGUFs; llama-bench prints 14.77 B and 32.76 B for the distilled files).
    ("deepseek-r1-distill-qwen-14b", "DeepSeek-R1-Distill-Qwen-14B", "qwen2", 48, 5120, 40, 8,
     128, 13824, 152064, False, 131072),
    ("deepseek-r1-distill-qwen-32b", "DeepSeek-R1-Distill-Qwen-32B", "qwen2", 64, 5120, 40, 8,
     128, 27648, 152064, False, 131072),
)

PRESETS: dict[str, ModelShape] = {row[0]: _shape(*row) for row in _PRESET_ROWS}
"""Shape presets by id."""
