"""What the floor model knows about a model: bits per weight, KV bytes, and the facts record.

Bits per weight come from two tables:

* ``GGML_TYPE_BPW``: exact per ggml tensor type, derived from ``gguf.constants.GGML_QUANT_SIZES``
  (``8 * type_size / block_size``).
* ``PRESET_BPW``: llama.cpp file-type presets (``Q4_K_M`` ...), effective bits per weight measured
  on an 8B model (docs/REFERENCE.md, "GGUF types"). Presets keep some tensors at higher precision,
  so the figure is above the main type's. They are used only for shapes without a file; a GGUF
  file's real per-tensor types are always read from the file.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from robot_latency.floor.errors import ModelInfoError

__all__ = [
    "GGML_TYPE_BPW",
    "KV_DTYPE_BYTES",
    "PRESET_BPW",
    "QUANT_BPW",
    "ModelFacts",
    "TensorInfo",
    "kv_bytes_per_token",
    "quant_bpw",
]

logger = logging.getLogger(__name__)

# --------------------------------------------------------------------------------------------------
# Bits per weight and KV element sizes
# --------------------------------------------------------------------------------------------------


def _type_ratio(qtype: GGMLQuantizationType) -> Fraction:
    """Bytes per element of a ggml type, exactly (type_size / block_size)."""
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    return Fraction(type_size, block_size)


GGML_TYPE_BPW: dict[str, float] = {
    qtype.name: float(8 * _type_ratio(qtype)) for qtype in GGML_QUANT_SIZES
}
"""Exact bits per weight of each ggml tensor type (F32 32, Q8_0 8.5, Q4_K 4.5, ...), from gguf."""

PRESET_BPW: dict[str, float] = {
    "F32": 32.0,
    "F16": 16.0,
    "BF16": 16.0,
    "Q8_0": 8.52,
    "Q6_K": 6.57,
    "Q5_K_M": 5.70,
    "Q4_K_M": 4.90,
    "Q4_0": 4.64,
    "Q3_K_M": 4.00,
    "Q2_K": 3.17,
}
"""Effective bits per weight of llama.cpp file-type presets, measured on an 8B model.

Used to estimate the bytes of a shape preset that has no file. Where a name is both a preset and a
ggml type (Q8_0, Q6_K, Q4_0, Q2_K), the preset figure is the whole-file average and is slightly
above the type's exact figure in ``GGML_TYPE_BPW``."""

QUANT_BPW: dict[str, float] = {**GGML_TYPE_BPW, **PRESET_BPW}
"""Every name ``quant_bpw`` accepts, with the figure it returns (preset figure preferred)."""

_KV_CACHE_TYPES: tuple[GGMLQuantizationType, ...] = (
    GGMLQuantizationType.F32,
    GGMLQuantizationType.F16,
    GGMLQuantizationType.BF16,
    GGMLQuantizationType.Q8_0,
    GGMLQuantizationType.Q4_0,
    GGMLQuantizationType.Q4_1,
    GGMLQuantizationType.IQ4_NL,
    GGMLQuantizationType.Q5_0,
    GGMLQuantizationType.Q5_1,
)
_KV_RATIO: dict[str, Fraction] = {t.name.lower(): _type_ratio(t) for t in _KV_CACHE_TYPES}

KV_DTYPE_BYTES: dict[str, float] = {name: float(r) for name, r in _KV_RATIO.items()}
"""Bytes per KV-cache element for llama.cpp cache types (``--cache-type-k/-v``): f32 4, f16 2,
bf16 2, q8_0 34/32, q4_0 18/32, ... (block ratios from gguf's GGML_QUANT_SIZES)."""


def quant_bpw(name: str) -> float:
    """Bits per weight for a preset (``Q4_K_M``) or ggml type (``Q4_K``) name, case-insensitive.

    A name that is a llama.cpp preset returns the preset's effective figure (measured on an 8B
    model, docs/REFERENCE.md "GGUF types"); otherwise the exact per-type figure.
    """
    key = name.strip().upper()
    if key in PRESET_BPW:
        return PRESET_BPW[key]
    if key in GGML_TYPE_BPW:
        return GGML_TYPE_BPW[key]
    raise ModelInfoError(
        f"unknown quantisation {name!r}: presets are {', '.join(PRESET_BPW)}; "
        f"ggml types are {', '.join(GGML_TYPE_BPW)}"
    )


def _kv_ratio(kv_dtype: str) -> Fraction:
    key = kv_dtype.strip().lower()
    try:
        return _KV_RATIO[key]
    except KeyError:
        raise ModelInfoError(
            f"unknown KV cache type {kv_dtype!r}: valid types are {', '.join(_KV_RATIO)}"
        ) from None


def _kv_bytes(elements_per_token: int, kv_dtype: str) -> int:
    return round(elements_per_token * _kv_ratio(kv_dtype))


def kv_bytes_per_token(n_layers: int, n_kv_heads: int, head_dim: int, kv_dtype: str = "f16") -> int:
    """KV-cache bytes one token adds: ``2 * n_layers * n_kv_heads * head_dim * bytes(kv_dtype)``.

    Block-quantised cache types (q8_0, q4_0, ...) use their block ratio; the result is rounded to
    an integer. Example: Llama-3-8B at f16 is ``2 * 32 * 8 * 128 * 2 = 131072`` bytes.
    """
    checks = (("n_layers", n_layers), ("n_kv_heads", n_kv_heads), ("head_dim", head_dim))
    for label, value in checks:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ModelInfoError(f"{label} must be a non-negative integer, got {value!r}")
    return _kv_bytes(2 * n_layers * n_kv_heads * head_dim, kv_dtype)


# --------------------------------------------------------------------------------------------------
# Data types
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a GGUF file.

    ``shape`` is in ggml order (``ne0``, the row length, first), as gguf-dump prints it.
    """

    name: str
    ggml_type: str
    shape: tuple[int, ...]
    n_elements: int
    n_bytes: int


_SOURCES = ("gguf", "preset", "manual", "config.json")


@dataclass(frozen=True)
class ModelFacts:
    """What the floor model needs to know about a model.

    ``weight_bytes_per_step`` is the bytes one decode step reads: every tensor except the
    token-embedding lookup; a tied output head (``token_embd`` used as output) is read in full.
    Shape fields are ``None`` where the source does not know them (``manual``).
    """

    name: str
    source: str
    path: str | None
    architecture: str | None
    n_layers: int | None
    n_heads: int | None
    n_kv_heads: int | None
    head_dim: int | None
    hidden: int | None
    ffn: int | None
    context_length: int | None
    vocab_size: int | None
    tied_embeddings: bool | None
    params: int
    weight_bytes_total: int
    weight_bytes_per_step: int
    kv_dtype: str
    kv_bytes_per_token: int
    quant: str | None
    tensor_types: dict[str, int]
    tensors: tuple[TensorInfo, ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        if self.source not in _SOURCES:
            raise ModelInfoError(f"facts source must be one of {_SOURCES}, got {self.source!r}")
        if self.params <= 0:
            raise ModelInfoError(f"{self.name}: params must be positive, got {self.params}")
        if self.weight_bytes_per_step > self.weight_bytes_total:
            raise ModelInfoError(
                f"{self.name}: bytes per step ({self.weight_bytes_per_step}) exceed the total "
                f"({self.weight_bytes_total})"
            )

    @property
    def effective_bpw(self) -> float:
        """Average bits per weight over the whole model: ``8 * weight_bytes_total / params``."""
        return 8 * self.weight_bytes_total / self.params

    def to_dict(self, *, include_tensors: bool = False) -> dict[str, Any]:
        """A JSON-ready dict of the facts (tensors only when asked: large for real models)."""
        out: dict[str, Any] = {
            "name": self.name,
            "source": self.source,
            "path": self.path,
            "architecture": self.architecture,
            "n_layers": self.n_layers,
            "n_heads": self.n_heads,
            "n_kv_heads": self.n_kv_heads,
            "head_dim": self.head_dim,
            "hidden": self.hidden,
            "ffn": self.ffn,
            "context_length": self.context_length,
            "vocab_size": self.vocab_size,
            "tied_embeddings": self.tied_embeddings,
            "params": self.params,
            "weight_bytes_total": self.weight_bytes_total,
            "weight_bytes_per_step": self.weight_bytes_per_step,
            "effective_bpw": self.effective_bpw,
            "kv_dtype": self.kv_dtype,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "quant": self.quant,
            "tensor_types": dict(self.tensor_types),
        }
        if include_tensors:
            out["tensors"] = [
                {
                    "name": t.name,
                    "ggml_type": t.ggml_type,
                    "shape": list(t.shape),
                    "n_elements": t.n_elements,
                    "n_bytes": t.n_bytes,
                }
                for t in self.tensors
            ]
        return out
