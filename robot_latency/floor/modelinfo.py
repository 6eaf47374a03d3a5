"""Model profiles for the bandwidth floor: bytes of weights per decode step and KV bytes per token.

A profile comes from one of three places:

* a GGUF file (``profile_from_gguf``, in :mod:`robot_latency.floor.ggufinfo`): shapes and
  per-tensor types and bytes are read from it;
* a shape preset without a file (``profile_from_preset``; shapes in
  :mod:`robot_latency.floor.shapes`): bytes are estimated from the shape and a quantisation name;
* numbers given by hand (``profile_manual``).

``resolve_model`` picks between the first two. KV bytes per token are
``2 * n_layers * n_kv_heads * head_dim * bytes(kv_dtype)``; the bits-per-weight tables and the
profile record live in :mod:`robot_latency.floor.profile`. This module is the floor's one entry
point for models, so it also offers those names.
"""

from __future__ import annotations

import logging
import os

from robot_latency.floor.errors import ModelInfoError, UnknownPresetError
from robot_latency.floor.ggufinfo import profile_from_gguf
from robot_latency.floor.profile import (
    GGML_TYPE_BPW,
    KV_DTYPE_BYTES,
    PRESET_BPW,
    QUANT_BPW,
    ModelProfile,
    TensorInfo,
    kv_bytes_per_token,
    quant_bpw,
)
from robot_latency.floor.shapes import PRESETS, ModelShape

__all__ = [
    "GGML_TYPE_BPW",
    "KV_DTYPE_BYTES",
    "PRESETS",
    "PRESET_BPW",
    "QUANT_BPW",
    "ModelProfile",
    "ModelShape",
    "TensorInfo",
    "kv_bytes_per_token",
    "profile_from_gguf",
    "profile_from_preset",
    "profile_manual",
    "quant_bpw",
    "resolve_model",
]

logger = logging.getLogger(__name__)


def _preset(preset_id: str) -> ModelShape:
    shape = PRESETS.get(preset_id.strip().lower())
    if shape is None:
        raise UnknownPresetError(
            f"unknown model preset {preset_id!r}; presets: {', '.join(PRESETS)}"
        )
    return shape


def profile_from_preset(
    preset_id: str, *, quant: str = "Q4_K_M", kv_dtype: str = "f16"
) -> ModelProfile:
    """A profile for a shape preset without a file.

    Matrices are counted at ``quant_bpw(quant)`` (a preset's effective figure for an 8B model, or a
    ggml type's exact one), 1-D norm and bias vectors at F32. Bytes per step leave out the token
    embedding unless it is tied, in which case it is read in full as the output head.
    """
    shape = _preset(preset_id)
    bpw = quant_bpw(quant)
    kv_bytes = kv_bytes_per_token(shape.n_layers, shape.n_kv_heads, shape.head_dim, kv_dtype)
    vector_bytes = shape.vector_params() * 4
    total = round(shape.matrix_params() * bpw / 8) + vector_bytes
    per_step = round(shape.matrix_params_per_step() * bpw / 8) + vector_bytes
    return ModelProfile(
        name=shape.name,
        source="preset",
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


def profile_manual(
    *, params: int, weight_bits: float, kv_bytes_per_token: int, name: str = "manual"
) -> ModelProfile:
    """A profile from bare numbers. With no embedding split known, bytes per step = total bytes.

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
    return ModelProfile(
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


def resolve_model(spec: str, *, quant: str | None = None, kv_dtype: str = "f16") -> ModelProfile:
    """A profile from a GGUF path or a preset id (case-insensitive).

    An existing path is read as GGUF (``quant`` is then an error: the file's types are read from
    it). Otherwise ``spec`` must be a preset id, profiled at ``quant`` (default Q4_K_M).
    """
    if os.path.exists(spec):
        if quant is not None:
            raise ModelInfoError(
                f"{spec}: --quant applies to presets; the file's types are read from it"
            )
        return profile_from_gguf(spec, kv_dtype=kv_dtype)
    if spec.strip().lower() in PRESETS:
        return profile_from_preset(spec, quant=quant or "Q4_K_M", kv_dtype=kv_dtype)
    raise UnknownPresetError(
        f"unknown model {spec!r}: no such file, and not a preset (presets: {', '.join(PRESETS)})"
    )
