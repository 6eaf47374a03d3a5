"""Model facts for the bandwidth floor: bytes of weights per decode step and KV bytes per token.

The facts come from one of three places:

* a GGUF file (``facts_from_gguf``, in :mod:`robot_latency.floor.ggufinfo`): shapes and
  per-tensor types and bytes are read from it;
* a shape preset without a file (``facts_from_preset``; shapes in
  :mod:`robot_latency.floor.shapes`): bytes are estimated from the shape and a quantisation name;
* a Hugging Face ``config.json`` (``facts_from_hf_config``): the shape is read from it and bytes
  are estimated as for a preset;
* numbers given by hand (``facts_manual``).

``resolve_model`` picks between the first three. A hybrid state-space model or a
mixture-of-experts is refused with the reason (:class:`UnsupportedArchitectureError`), never
mis-counted as a dense transformer. KV bytes per token are
``2 * n_layers * n_kv_heads * head_dim * bytes(kv_dtype)``; the bits-per-weight tables and the
facts record live in :mod:`robot_latency.floor.modelfacts`. This module is the floor's one entry
point for models, so it also offers those names.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from robot_latency.floor.errors import (
    ModelInfoError,
    UnknownPresetError,
    UnsupportedArchitectureError,
)
from robot_latency.floor.ggufinfo import facts_from_gguf
from robot_latency.floor.modelfacts import (
    GGML_TYPE_BPW,
    KV_DTYPE_BYTES,
    PRESET_BPW,
    QUANT_BPW,
    ModelFacts,
    TensorInfo,
    kv_bytes_per_token,
    quant_bpw,
)
from robot_latency.floor.shapes import (
    HYBRID_SSM_REASON,
    MOE_REASON,
    PRESETS,
    ModelShape,
    refusal_reason,
)

__all__ = [
    "GGML_TYPE_BPW",
    "KV_DTYPE_BYTES",
    "PRESETS",
    "PRESET_BPW",
    "QUANT_BPW",
    "ModelFacts",
    "ModelShape",
    "TensorInfo",
    "facts_from_gguf",
    "facts_from_hf_config",
    "facts_from_preset",
    "facts_from_shape",
    "facts_manual",
    "kv_bytes_per_token",
    "quant_bpw",
    "resolve_model",
    "shape_from_hf_config",
]

logger = logging.getLogger(__name__)


def _preset(preset_id: str) -> ModelShape:
    shape = PRESETS.get(preset_id.strip().lower())
    reason = refusal_reason(preset_id)
    if reason is not None:
        raise UnsupportedArchitectureError(f"cannot count {preset_id!r}: {reason}")
    if shape is None:
        raise UnknownPresetError(
            f"unknown model preset {preset_id!r}; presets: {', '.join(PRESETS)}"
        )
    return shape


def facts_from_preset(
    preset_id: str, *, quant: str = "Q4_K_M", kv_dtype: str = "f16"
) -> ModelFacts:
    """The facts for a shape preset without a file.

    Matrices are counted at ``quant_bpw(quant)`` (a preset's effective figure for an 8B model, or a
    ggml type's exact one), 1-D norm and bias vectors at F32. Bytes per step leave out the token
    embedding unless it is tied, in which case it is read in full as the output head.
    """
    return facts_from_shape(_preset(preset_id), quant=quant, kv_dtype=kv_dtype)


def facts_from_shape(
    shape: ModelShape, *, quant: str = "Q4_K_M", kv_dtype: str = "f16", source: str = "preset"
) -> ModelFacts:
    """The facts for a shape without a file (a preset's, or one read from a config.json)."""
    bpw = quant_bpw(quant)
    kv_bytes = kv_bytes_per_token(shape.n_layers, shape.n_kv_heads, shape.head_dim, kv_dtype)
    vector_bytes = shape.vector_params() * 4
    total = round(shape.matrix_params() * bpw / 8) + vector_bytes
    per_step = round(shape.matrix_params_per_step() * bpw / 8) + vector_bytes
    return ModelFacts(
        name=shape.name,
        source=source,
        path=None,
        architecture=shape.architecture,
        n_layers=shape.n_layers,
        n_heads=shape.n_heads,
        n_kv_heads=shape.n_kv_heads,
        head_dim=shape.head_dim,
        hidden=shape.hidden,
        ffn=shape.ffn,
        context_length=shape.context_length,
        vocab_size=shape.vocab_size,
        tied_embeddings=shape.tied_embeddings,
        params=shape.param_count(),
        weight_bytes_total=total,
        weight_bytes_per_step=per_step,
        kv_dtype=kv_dtype.strip().lower(),
        kv_bytes_per_token=kv_bytes,
        quant=quant.strip().upper(),
        tensor_types={},
    )


def facts_manual(
    *, params: int, weight_bits: float, kv_bytes_per_token: int, name: str = "manual"
) -> ModelFacts:
    """The facts from bare numbers. With no embedding split known, bytes per step = total bytes.

    ``kv_dtype`` is recorded as ``"unspecified"`` (the KV bytes are given directly) and shape fields
    are None.
    """
    if isinstance(params, bool) or not isinstance(params, int) or params <= 0:
        raise ModelInfoError(f"params must be a positive integer, got {params!r}")
    if not weight_bits > 0:
        raise ModelInfoError(f"weight_bits must be positive, got {weight_bits!r}")
    if (
        isinstance(kv_bytes_per_token, bool)
        or not isinstance(kv_bytes_per_token, int)
        or kv_bytes_per_token < 0
    ):
        raise ModelInfoError(
            f"kv_bytes_per_token must be a non-negative integer, got {kv_bytes_per_token!r}"
        )
    total = round(params * weight_bits / 8)
    return ModelFacts(
        name=name,
        source="manual",
        path=None,
        architecture=None,
        n_layers=None,
        n_heads=None,
        n_kv_heads=None,
        head_dim=None,
        hidden=None,
        ffn=None,
        context_length=None,
        vocab_size=None,
        tied_embeddings=None,
        params=params,
        weight_bytes_total=total,
        weight_bytes_per_step=total,
        kv_dtype="unspecified",
        kv_bytes_per_token=kv_bytes_per_token,
        quant=None,
        tensor_types={},
    )


#: config.json ``model_type`` values the dense count supports, and the preset architecture name.
_HF_DENSE_TYPES: dict[str, str] = {
    "llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma": "gemma",
    "gemma2": "gemma2", "gemma3": "gemma3", "gemma3_text": "gemma3", "phi3": "phi3",
    "smollm3": "llama", "granite": "llama", "olmo2": "llama",
}
_HF_HYBRID_TYPES = ("nemotron_h", "lfm2", "lfm2_vl", "mamba", "mamba2", "jamba", "falcon_h1",
                    "zamba", "zamba2", "bamba", "granitemoehybrid", "qwen3_next", "rwkv")
_HF_EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")


def _config_int(path: Path, doc: dict[str, Any], key: str, default: int | None = None) -> int:
    value = doc.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ModelInfoError(f"{path}: field {key!r} must be a positive integer, got {value!r}")
    return value


def shape_from_hf_config(path: str | Path) -> ModelShape:
    """Read a dense transformer's shape from a Hugging Face ``config.json``.

    A multimodal config's ``text_config`` is used when present. Raises
    :class:`UnsupportedArchitectureError` for hybrid state-space models and mixtures of experts,
    and :class:`ModelInfoError` for a file that is not a readable config (naming the field).
    """
    p = Path(path)
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except OSError as err:
        raise ModelInfoError(f"{p}: cannot read ({err.strerror or err})") from err
    except ValueError as err:
        raise ModelInfoError(f"{p}: not a JSON config ({err})") from err
    if not isinstance(doc, dict):
        raise ModelInfoError(f"{p}: expected a JSON object, got {type(doc).__name__}")
    outer_type = str(doc.get("model_type", ""))
    if isinstance(doc.get("text_config"), dict):
        doc = {**doc["text_config"], "tie_word_embeddings": doc["text_config"].get(
            "tie_word_embeddings", doc.get("tie_word_embeddings"))}
    model_type = str(doc.get("model_type") or outer_type).lower()
    if model_type in _HF_HYBRID_TYPES or any(
            str(t).lower() in ("mamba", "conv", "linear_attention", "ssm")
            for t in doc.get("layer_types") or doc.get("layers_block_type") or ()):
        raise UnsupportedArchitectureError(
            f"{p}: cannot count model_type {model_type!r}: {HYBRID_SSM_REASON}")
    if "moe" in model_type or any(
            isinstance(doc.get(k), int) and doc[k] > 1 for k in _HF_EXPERT_KEYS):
        raise UnsupportedArchitectureError(
            f"{p}: cannot count model_type {model_type!r}: {MOE_REASON}")
    arch = _HF_DENSE_TYPES.get(model_type)
    if arch is None:
        raise UnsupportedArchitectureError(
            f"{p}: model_type {model_type!r} is not a dense transformer the floor knows "
            f"(known: {', '.join(sorted(_HF_DENSE_TYPES))})")
    hidden = _config_int(p, doc, "hidden_size")
    heads = _config_int(p, doc, "num_attention_heads")
    kv_heads = _config_int(p, doc, "num_key_value_heads", heads)
    head_dim = doc.get("head_dim") or hidden // heads
    tied = doc.get("tie_word_embeddings")
    if tied is None:  # the transformers default differs by family; Gemma always ties
        tied = arch.startswith("gemma")
    context = doc.get("max_position_embeddings") or 0
    return ModelShape(
        id=p.parent.name or p.stem, name=str(doc.get("_name_or_path") or p.parent.name or p.stem),
        architecture=arch, n_layers=_config_int(p, doc, "num_hidden_layers"), hidden=hidden,
        n_heads=heads, n_kv_heads=kv_heads, head_dim=_config_int(p, {"head_dim": head_dim},
                                                                    "head_dim"),
        ffn=_config_int(p, doc, "intermediate_size"), vocab_size=_config_int(p, doc, "vocab_size"),
        tied_embeddings=bool(tied),
        qkv_bias=bool(doc.get("attention_bias", arch == "qwen2")),
        context_length=int(context) if isinstance(context, int) else 0,
    )


def facts_from_hf_config(
    path: str | Path, *, quant: str = "Q4_K_M", kv_dtype: str = "f16"
) -> ModelFacts:
    """The facts from a Hugging Face ``config.json`` at ``quant`` (bytes as for a preset)."""
    return facts_from_shape(shape_from_hf_config(path), quant=quant, kv_dtype=kv_dtype,
                              source="config.json")


def resolve_model(spec: str, *, quant: str | None = None, kv_dtype: str = "f16") -> ModelFacts:
    """The facts from a GGUF path, a Hugging Face ``config.json`` or a preset id.

    An existing ``.json`` path is read as a config.json and read at ``quant`` (default
    Q4_K_M); another existing path is read as GGUF (``quant`` is then an error: the file's types
    are read from it). Otherwise ``spec`` must be a preset id (case-insensitive), read at
    ``quant``. A refused architecture raises :class:`UnsupportedArchitectureError` with why.
    """
    if os.path.exists(spec) and spec.lower().endswith(".json"):
        return facts_from_hf_config(spec, quant=quant or "Q4_K_M", kv_dtype=kv_dtype)
    if os.path.exists(spec):
        if quant is not None:
            raise ModelInfoError(
                f"{spec}: --quant applies to presets; the file's types are read from it"
            )
        return facts_from_gguf(spec, kv_dtype=kv_dtype)
    if spec.strip().lower() in PRESETS or refusal_reason(spec) is not None:
        return facts_from_preset(spec, quant=quant or "Q4_K_M", kv_dtype=kv_dtype)
    raise UnknownPresetError(
        f"unknown model {spec!r}: no such file, and not a preset (presets: {', '.join(PRESETS)})"
    )
