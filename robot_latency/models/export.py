"""Write a trained planner as a llama-architecture GGUF that llama.cpp loads.

Tensors arrive as numpy arrays under their GGUF names (``token_embd.weight``,
``blk.N.attn_q.weight`` ...), in torch's ``(out_features, in_features)`` layout, which is what
``gguf.GGUFWriter`` expects (it reverses the dimensions into ggml's order).

Rotary embedding: llama.cpp's "llama" architecture applies RoPE in its "normal" mode, rotating
*adjacent* pairs ``(x[2i], x[2i+1])`` by ``pos * base**(-2i/head_dim)``. The torch model
(:mod:`robot_latency.models.train`) rotates the same pairs, so q/k weights are written as they are,
without the permutation ``convert_hf_to_gguf.py`` applies to HF checkpoints (whose rotary rotates
the two halves of each head instead).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from robot_latency.errors import RobotLatencyError
from robot_latency.models.tokenizer import Vocab, build_vocab, write_tokenizer_metadata

if TYPE_CHECKING:
    import gguf

__all__ = ["ExportError", "GGUFShape", "export_gguf", "gguf_tensor_names", "read_gguf"]

logger = logging.getLogger(__name__)


class ExportError(RobotLatencyError, ValueError):
    """A model cannot be written as GGUF (missing or mis-shaped tensors, unknown type)."""


@dataclass(frozen=True)
class GGUFShape:
    """Hyper-parameters written to the GGUF's ``llama.*`` keys.

    Attributes:
        vocab_size: tokens.
        dim: embedding length.
        n_layers: blocks.
        n_heads: query heads.
        n_kv_heads: key/value heads (GQA when fewer than ``n_heads``).
        ffn_dim: SwiGLU hidden size.
        context_length: trained context.
        rope_base: RoPE frequency base.
        norm_eps: RMSNorm epsilon.
    """

    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    context_length: int = 128
    rope_base: float = 10000.0
    norm_eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        """Return the per-head size."""
        return self.dim // self.n_heads


def gguf_tensor_names(shape: GGUFShape) -> dict[str, tuple[int, ...]]:
    """Return every tensor name the GGUF needs, with its numpy shape.

    Args:
        shape: the model's hyper-parameters.

    Returns:
        ``{name: shape}`` in writing order.
    """
    d, hd, v, f = shape.dim, shape.head_dim, shape.vocab_size, shape.ffn_dim
    names: dict[str, tuple[int, ...]] = {"token_embd.weight": (v, d)}
    for i in range(shape.n_layers):
        p = f"blk.{i}."
        names.update(
            {
                p + "attn_norm.weight": (d,),
                p + "attn_q.weight": (shape.n_heads * hd, d),
                p + "attn_k.weight": (shape.n_kv_heads * hd, d),
                p + "attn_v.weight": (shape.n_kv_heads * hd, d),
                p + "attn_output.weight": (d, shape.n_heads * hd),
                p + "ffn_norm.weight": (d,),
                p + "ffn_gate.weight": (f, d),
                p + "ffn_up.weight": (f, d),
                p + "ffn_down.weight": (d, f),
            }
        )
    names["output_norm.weight"] = (d,)
    names["output.weight"] = (v, d)
    return names


def write_llama_hparams(writer: gguf.GGUFWriter, shape: GGUFShape) -> None:
    """Write the ``llama.*`` hyper-parameter keys of ``shape`` (the one place they are spelled).

    Args:
        writer: an open GGUF writer, before its header is written.
        shape: the model's hyper-parameters.
    """
    writer.add_context_length(shape.context_length)
    writer.add_embedding_length(shape.dim)
    writer.add_block_count(shape.n_layers)
    writer.add_feed_forward_length(shape.ffn_dim)
    writer.add_head_count(shape.n_heads)
    writer.add_head_count_kv(shape.n_kv_heads)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_rope_freq_base(shape.rope_base)
    writer.add_layer_norm_rms_eps(shape.norm_eps)
    writer.add_vocab_size(shape.vocab_size)


def export_gguf(
    path: str | Path,
    shape: GGUFShape,
    tensors: Mapping[str, np.ndarray],
    *,
    name: str = "robot_latency planner",
    dtype: str = "F32",
    vocab: Vocab | None = None,
) -> Path:
    """Write a llama GGUF.

    Args:
        path: output file.
        shape: hyper-parameters.
        tensors: ``{gguf_name: array}`` as listed by :func:`gguf_tensor_names`.
        name: ``general.name``.
        dtype: ``"F32"`` or ``"F16"`` (norm vectors stay F32 either way, as llama.cpp's converter
            writes them).
        vocab: the tokenizer vocabulary; defaults to ``build_vocab()``.

    Returns:
        The path written.

    Raises:
        ExportError: a tensor is missing or mis-shaped, or the dtype is unknown.
    """
    import gguf

    if dtype not in ("F32", "F16"):
        raise ExportError(f"dtype must be F32 or F16, got {dtype!r}")
    vocab = vocab or build_vocab()
    if vocab.size != shape.vocab_size:
        raise ExportError(f"vocab has {vocab.size} tokens, model has {shape.vocab_size}")
    expected = gguf_tensor_names(shape)
    missing = sorted(set(expected) - set(tensors))
    extra = sorted(set(tensors) - set(expected))
    if missing or extra:
        raise ExportError(f"tensors for {path}: missing {missing[:5]}, unexpected {extra[:5]}")
    path = Path(path)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(name)
    write_llama_hparams(writer, shape)
    ftype = gguf.LlamaFileType.ALL_F32 if dtype == "F32" else gguf.LlamaFileType.MOSTLY_F16
    writer.add_file_type(int(ftype))
    write_tokenizer_metadata(writer, vocab)
    for tname, tshape in expected.items():
        arr = np.ascontiguousarray(np.asarray(tensors[tname], dtype=np.float32))
        if arr.shape != tshape:
            raise ExportError(f"{tname}: shape {arr.shape}, expected {tshape}")
        if dtype == "F16" and arr.ndim > 1:
            arr = arr.astype(np.float16)
        writer.add_tensor(tname, arr)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    logger.info("wrote %s (%d bytes)", path, path.stat().st_size)
    return path


def read_gguf(path: str | Path) -> tuple[GGUFShape, dict[str, np.ndarray]]:
    """Read a llama GGUF written by :func:`export_gguf` back (F32 or F16 tensors only).

    Args:
        path: the GGUF file.

    Returns:
        The hyper-parameters and ``{gguf_name: float32 array}`` in torch layout.

    Raises:
        ExportError: the file is not a llama GGUF or holds quantized tensors.
    """
    import gguf

    from robot_latency.floor.gguf_reader import GGUFReader

    reader = GGUFReader(str(path))

    def field(key: str) -> object:
        f = reader.fields.get(key)
        if f is None:
            raise ExportError(f"{path}: no {key}")
        return f.parts[f.data[0]][0]

    if bytes(reader.fields["general.architecture"].parts[-1]).decode() != "llama":
        raise ExportError(f"{path}: not a llama GGUF")
    shape = GGUFShape(
        vocab_size=len(reader.fields["tokenizer.ggml.tokens"].data),
        dim=int(field("llama.embedding_length")),
        n_layers=int(field("llama.block_count")),
        n_heads=int(field("llama.attention.head_count")),
        n_kv_heads=int(field("llama.attention.head_count_kv")),
        ffn_dim=int(field("llama.feed_forward_length")),
        context_length=int(field("llama.context_length")),
        rope_base=float(field("llama.rope.freq_base")),
        norm_eps=float(field("llama.attention.layer_norm_rms_epsilon")),
    )
    tensors = {}
    for t in reader.tensors:
        if t.tensor_type not in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            raise ExportError(f"{path}: tensor {t.name} is {t.tensor_type.name}, not F32/F16")
        shape_np = tuple(int(n) for n in reversed(t.shape))
        tensors[t.name] = np.asarray(t.data, dtype=np.float32).reshape(shape_np)
    return shape, tensors
