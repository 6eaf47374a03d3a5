"""Model profiles for the bandwidth floor: bytes of weights per decode step and KV bytes per token.

A profile comes from one of three places:

* a GGUF file (``profile_from_gguf``): shapes and per-tensor types and bytes are read from it;
* a shape preset without a file (``profile_from_preset``, REFERENCE 6): bytes are estimated from the
  shape and a quantisation name;
* numbers given by hand (``profile_manual``).

Decode at batch 1 reads every weight matrix once per step, except the token-embedding table, which
is a row lookup. A tied output head (the embedding table used as the output projection) is read in
full (REFERENCE 1). KV bytes per token are
``2 * n_layers * n_kv_heads * head_dim * bytes(kv_dtype)``.

Bits per weight come from two tables:

* ``GGML_TYPE_BPW``: exact per ggml tensor type, derived from ``gguf.constants.GGML_QUANT_SIZES``
  (``8 * type_size / block_size``).
* ``PRESET_BPW``: llama.cpp file-type presets (``Q4_K_M`` ...), effective bits per weight measured
  on an 8B model (REFERENCE 5). Presets keep some tensors at higher precision, so the figure is
  above the main type's. They are used only for shapes without a file; a GGUF file's real
  per-tensor types are always read from the file.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import struct
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import gguf
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, LlamaFileType

from robot_latency.floor.errors import ModelInfoError, UnknownPresetError

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
"""Effective bits per weight of llama.cpp file-type presets, measured on an 8B model (REFERENCE 5).

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
    model, REFERENCE 5); otherwise the exact per-type figure.
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


@dataclass(frozen=True)
class ModelShape:
    """A transformer shape without a file (REFERENCE 6, from the models' public config files).

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
        """Matrix elements one decode step reads (REFERENCE 1).

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


# Shapes from REFERENCE 6. Context lengths are from the models' cards / configs (not in the table):
# Llama-3 8k, Llama-3.2 128k, Qwen2.5 small models 32k, TinyLlama 2k, SmolLM2 8k.
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
)

PRESETS: dict[str, ModelShape] = {row[0]: _shape(*row) for row in _PRESET_ROWS}
"""Shape presets by id (REFERENCE 6)."""

_SOURCES = ("gguf", "preset", "manual")


@dataclass(frozen=True)
class ModelProfile:
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
            raise ModelInfoError(f"profile source must be one of {_SOURCES}, got {self.source!r}")
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
        """A JSON-ready dict of the profile (tensors only when asked: large for real models)."""
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


# --------------------------------------------------------------------------------------------------
# GGUF files
# --------------------------------------------------------------------------------------------------

_GGUF_MAGIC_BYTES = b"GGUF"
_HEADER_BYTES = 24  # magic u32, version u32, tensor_count u64, kv_count u64
_MIN_KV_BYTES = 8 + 4 + 1  # key length, value type, smallest value (u8, empty key)
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8  # name length, n_dims, type, offset (empty name, 0 dims)
_SUPPORTED_VERSIONS = (2, 3)

# Tensors that a decode step reads a row of, not the whole table.
_LOOKUP_TENSORS = frozenset({"token_embd.weight", "position_embd.weight", "token_types.weight"})
_TOKEN_EMBD = "token_embd.weight"
_OUTPUT = "output.weight"

# What the gguf reader raises on malformed input (it slices a memmap and trusts the header).
_READER_ERRORS = (
    ValueError,  # bad magic/version, reshape of short data, unknown type enum, UnicodeDecodeError
    IndexError,  # [0] of an empty slice past the end of the file
    KeyError,  # duplicate keys
    TypeError,
    OverflowError,
    MemoryError,
    struct.error,
    OSError,  # memmap failures
)


def _check_header(path: str) -> int:
    """Check the file exists, is non-empty and starts like a GGUF file; return its size in bytes."""
    if not os.path.exists(path):
        raise ModelInfoError(f"{path}: no such file")
    if not os.path.isfile(path):
        raise ModelInfoError(f"{path}: not a regular file")
    try:
        size_bytes = os.path.getsize(path)
        with open(path, "rb") as fh:
            head = fh.read(_HEADER_BYTES)
    except OSError as err:
        raise ModelInfoError(f"{path}: cannot read ({err})") from err
    if size_bytes == 0:
        raise ModelInfoError(f"{path}: empty file (0 bytes)")
    magic = head[:4]
    if magic != _GGUF_MAGIC_BYTES:
        raise ModelInfoError(
            f"{path}: not a GGUF file (magic {magic!r}, expected {_GGUF_MAGIC_BYTES!r})"
        )
    if len(head) < _HEADER_BYTES:
        raise ModelInfoError(
            f"{path}: truncated GGUF header ({size_bytes} bytes, the header alone needs "
            f"{_HEADER_BYTES})"
        )
    order = "<"
    (version,) = struct.unpack_from("<I", head, 4)
    if version & 0xFFFF == 0:  # written on a host of the other byte order
        order = ">"
        (version,) = struct.unpack_from(">I", head, 4)
    if version not in _SUPPORTED_VERSIONS:
        raise ModelInfoError(
            f"{path}: GGUF version {version} not supported (readable: {_SUPPORTED_VERSIONS})"
        )
    tensor_count, kv_count = struct.unpack_from(order + "QQ", head, 8)
    min_bytes = _HEADER_BYTES + kv_count * _MIN_KV_BYTES + tensor_count * _MIN_TENSOR_INFO_BYTES
    if min_bytes > size_bytes:
        raise ModelInfoError(
            f"{path}: header claims {tensor_count} tensors and {kv_count} metadata keys, more than "
            f"a {size_bytes}-byte file can hold (truncated or corrupt)"
        )
    return size_bytes


def _field_value(reader: gguf.GGUFReader, key: str) -> Any:
    """A metadata value (scalar, string or list), or None when the key is absent."""
    fld = reader.get_field(key)
    if fld is None:
        return None
    return fld.contents()


def _array_len(reader: gguf.GGUFReader, key: str) -> int | None:
    fld = reader.get_field(key)
    if fld is None or not fld.types or fld.types[0] != gguf.GGUFValueType.ARRAY:
        return None
    return len(fld.data)


def _as_int(path: str, key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ModelInfoError(
            f"{path}: metadata {key} should be a non-negative integer, got {value!r}"
        )
    return value


def _int_or_list(path: str, key: str, value: Any) -> int | list[int]:
    if isinstance(value, list):
        if not value:
            raise ModelInfoError(f"{path}: metadata {key} is an empty array")
        return [_as_int(path, key, v) for v in value]
    return _as_int(path, key, value)


def _opt_int(path: str, key: str, value: Any) -> int | None:
    if value is None:
        return None
    v = _int_or_list(path, key, value)
    return max(v) if isinstance(v, list) else v


def _ftype_name(value: Any) -> str | None:
    """The llama.cpp file type name (``Q4_K_M``) for ``general.file_type``, or None."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    try:
        ftype = LlamaFileType(value)
    except ValueError:
        logger.warning("unknown general.file_type %d; using the dominant tensor type", value)
        return None
    if ftype == LlamaFileType.GUESSED:
        return None
    name = ftype.name
    for prefix in ("MOSTLY_", "ALL_"):
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


def _gguf_version() -> str:
    try:
        return f"gguf {importlib.metadata.version('gguf')}"
    except importlib.metadata.PackageNotFoundError:
        return "gguf, version unknown"


def profile_from_gguf(path: str | os.PathLike[str], *, kv_dtype: str = "f16") -> ModelProfile:
    """Read a model profile from a GGUF file.

    Shapes come from the ``{arch}.*`` metadata, bytes from the tensors' real types. Raises
    ModelInfoError, naming the file and the problem, for a missing, empty, non-GGUF, truncated or
    otherwise malformed file, or one without the metadata a profile needs.
    """
    _kv_ratio(kv_dtype)  # reject a bad cache type before touching the file
    p = os.fspath(path)
    size_bytes = _check_header(p)
    # gguf's reader parses every metadata array (150k-token vocabularies take seconds), so a
    # file already profiled in this process, unchanged since, is not read again.
    stat = os.stat(p)
    key = (os.path.realpath(p), stat.st_size, stat.st_mtime_ns, kv_dtype)
    cached = _PROFILE_CACHE.get(key)
    if cached is not None:
        return cached
    profile = _profile_from_file(p, size_bytes, kv_dtype)
    if len(_PROFILE_CACHE) >= 64:
        _PROFILE_CACHE.clear()
    _PROFILE_CACHE[key] = profile
    return profile


_PROFILE_CACHE: dict[tuple[str, int, int, str], ModelProfile] = {}


def _profile_from_file(p: str, size_bytes: int, kv_dtype: str) -> ModelProfile:
    try:
        reader = gguf.GGUFReader(p, "r")
    except _READER_ERRORS as err:
        if isinstance(err, ValueError) and "GGMLQuantizationType" in str(err):
            raise ModelInfoError(
                f"{p}: a tensor has a type this gguf package ({_gguf_version()}) does not know "
                f"({err}); the file may be newer than the package"
            ) from err
        raise ModelInfoError(
            f"{p}: cannot parse GGUF ({type(err).__name__}: {err}); the file ({size_bytes} bytes) "
            f"is truncated or corrupt"
        ) from err
    try:
        return _profile_from_reader(reader, p, size_bytes, kv_dtype)
    except _READER_ERRORS as err:
        raise ModelInfoError(
            f"{p}: malformed GGUF metadata ({type(err).__name__}: {err})"
        ) from err


def _profile_from_reader(
    reader: gguf.GGUFReader, path: str, size_bytes: int, kv_dtype: str
) -> ModelProfile:
    tensors: list[TensorInfo] = []
    for t in reader.tensors:
        if not t.name:
            raise ModelInfoError(f"{path}: tensor with an empty name (corrupt tensor table)")
        end = int(t.data_offset) + int(t.n_bytes)
        if end > size_bytes:
            raise ModelInfoError(
                f"{path}: tensor {t.name} ends at byte {end}, past the end of the file "
                f"({size_bytes} bytes): truncated"
            )
        tensors.append(
            TensorInfo(
                name=t.name,
                ggml_type=t.tensor_type.name,
                shape=tuple(int(d) for d in t.shape),
                n_elements=int(t.n_elements),
                n_bytes=int(t.n_bytes),
            )
        )
    if not tensors:
        raise ModelInfoError(f"{path}: no tensors (a vocabulary-only file?)")

    arch = _field_value(reader, "general.architecture")
    if not isinstance(arch, str) or not arch:
        raise ModelInfoError(f"{path}: missing metadata general.architecture")

    def key(suffix: str) -> str:
        return f"{arch}.{suffix}"

    def required(suffix: str) -> Any:
        value = _field_value(reader, key(suffix))
        if value is None:
            raise ModelInfoError(f"{path}: missing metadata {key(suffix)}")
        return value

    n_layers = _as_int(path, key("block_count"), required("block_count"))
    hidden = _as_int(path, key("embedding_length"), required("embedding_length"))
    heads_raw = _int_or_list(path, key("attention.head_count"), required("attention.head_count"))
    kv_value = _field_value(reader, key("attention.head_count_kv"))
    # llama.cpp: head_count_kv defaults to head_count when absent
    kv_raw = heads_raw if kv_value is None else _int_or_list(
        path, key("attention.head_count_kv"), kv_value
    )
    n_heads = max(heads_raw) if isinstance(heads_raw, list) else heads_raw
    if n_heads == 0:
        raise ModelInfoError(f"{path}: metadata {key('attention.head_count')} is 0")

    key_len = _opt_int(path, key("attention.key_length"), _field_value(
        reader, key("attention.key_length")))
    head_dim = key_len if key_len is not None else hidden // n_heads
    value_len = _opt_int(path, key("attention.value_length"), _field_value(
        reader, key("attention.value_length")))
    v_dim = value_len if value_len is not None else head_dim

    if isinstance(kv_raw, list):  # per-layer KV head counts (0 for layers without attention)
        kv_heads_sum = sum(kv_raw[:n_layers]) if len(kv_raw) >= n_layers else sum(kv_raw)
        n_kv_heads = max(kv_raw)
    else:
        kv_heads_sum = kv_raw * n_layers
        n_kv_heads = kv_raw
    kv_bytes = _kv_bytes(kv_heads_sum * (head_dim + v_dim), kv_dtype)

    def optional(suffix: str) -> int | None:
        return _opt_int(path, key(suffix), _field_value(reader, key(suffix)))

    ffn = optional("feed_forward_length")
    context = optional("context_length")

    by_name = {t.name: t for t in tensors}
    vocab = _array_len(reader, "tokenizer.ggml.tokens")
    if vocab is None:
        vocab = _opt_int(path, key("vocab_size"), _field_value(reader, key("vocab_size")))
    if vocab is None and _TOKEN_EMBD in by_name and len(by_name[_TOKEN_EMBD].shape) >= 2:
        vocab = by_name[_TOKEN_EMBD].shape[1]

    tied = _OUTPUT not in by_name
    blocks = {int(t.name.split(".")[1]) for t in tensors
              if t.name.startswith("blk.") and t.name.split(".")[1].isdigit()}
    if blocks and max(blocks) >= n_layers:
        raise ModelInfoError(
            f"{path}: tensors for layer {max(blocks)} but {key('block_count')} is {n_layers}"
        )
    if blocks and len(blocks) < n_layers:
        logger.warning("%s: %s is %d but tensors cover %d layers",
                       path, key("block_count"), n_layers, len(blocks))

    tensor_types: dict[str, int] = {}
    matrix_elements: dict[str, int] = {}
    for t in tensors:
        tensor_types[t.ggml_type] = tensor_types.get(t.ggml_type, 0) + t.n_bytes
        if len(t.shape) >= 2:
            matrix_elements[t.ggml_type] = matrix_elements.get(t.ggml_type, 0) + t.n_elements

    total_bytes = sum(t.n_bytes for t in tensors)
    per_step = sum(
        t.n_bytes for t in tensors
        if t.name not in _LOOKUP_TENSORS or (t.name == _TOKEN_EMBD and tied)
    )

    quant = _ftype_name(_field_value(reader, "general.file_type"))
    if quant is None and matrix_elements:
        quant = max(matrix_elements.items(), key=lambda kv: kv[1])[0]

    name = _field_value(reader, "general.name")
    if not isinstance(name, str) or not name:
        name = os.path.splitext(os.path.basename(path))[0]

    profile = ModelProfile(
        name=name,
        source="gguf",
        path=path,
        architecture=arch,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        head_dim=head_dim,
        hidden=hidden,
        ffn=ffn,
        context_length=context,
        vocab_size=vocab,
        tied_embeddings=tied,
        params=sum(t.n_elements for t in tensors),
        weight_bytes_total=total_bytes,
        weight_bytes_per_step=per_step,
        kv_dtype=kv_dtype.strip().lower(),
        kv_bytes_per_token=kv_bytes,
        quant=quant,
        tensor_types=tensor_types,
        tensors=tuple(tensors),
    )
    logger.debug(
        "%s: %s, %d layers, %d params, %d bytes/step, %d KV bytes/token",
        path, arch, n_layers, profile.params, per_step, kv_bytes,
    )
    return profile


# --------------------------------------------------------------------------------------------------
# Presets, manual profiles and resolution
# --------------------------------------------------------------------------------------------------


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
    """A profile for a shape preset without a file (REFERENCE 6).

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
