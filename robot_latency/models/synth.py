"""Random-weight GGUFs of any preset shape, for timing studies only.

**Random weights: outputs are noise, timing only.** A synthetic model has the exact tensor shapes
(and so the per-token bytes and FLOPs) of a preset (docs/REFERENCE.md, "Model shapes"), written as a
llama GGUF with the planner's tokenizer padded to the preset's vocabulary (``<unused_N>`` tokens),
so the planner's prompts tokenize. Use it to time a shape; never read meaning into what it
generates. For a model
of the same shape that still plans, see :mod:`robot_latency.models.inflate`.

Tied presets are written tied (no ``output.weight``; llama.cpp reads the embedding table as the
output head), so the parameter count matches the preset's; Qwen2's q/k/v biases are omitted.
Weights are slices of one seeded pool of random F16 values, so a 1B-parameter file is written in
seconds; other types are quantized from a temporary F16 file with llama.cpp's own quantizer.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from robot_latency.errors import RobotLatencyError
from robot_latency.models.export import GGUFShape, gguf_tensor_names, write_llama_hparams
from robot_latency.models.inflate import head_shape, pad_vocab, write_head_dim
from robot_latency.models.ladder import normalize_quant, quantize_gguf
from robot_latency.models.tokenizer import build_vocab, write_tokenizer_metadata

__all__ = ["SYNTH_DESCRIPTION", "SynthError", "synth"]

logger = logging.getLogger(__name__)

SYNTH_DESCRIPTION = "random weights: outputs are noise, timing only"

_POOL_SIZE = (1 << 22) + 7  # random F16 values shared by every tensor (odd size: shifted slices)


class SynthError(RobotLatencyError, ValueError):
    """A synthetic model cannot be made for this preset or type."""


def _preset(preset_id: Any) -> Any:
    from robot_latency.floor.modelinfo import PRESETS

    if isinstance(preset_id, str):
        if preset_id not in PRESETS:
            raise SynthError(f"unknown preset {preset_id!r}; known: {', '.join(sorted(PRESETS))}")
        return PRESETS[preset_id]
    return preset_id


def _write_f16(preset: Any, path: Path, *, seed: int) -> Path:
    """Write the preset's shape with random F16 matrices and unit norms, streamed."""
    import gguf

    if preset.head_dim <= 0 or preset.head_dim % 2:
        raise SynthError(f"{preset.name}: head_dim {preset.head_dim} must be even and > 0 "
                         "(RoPE rotates pairs)")
    # a head_dim other than hidden / n_heads (Qwen3, Gemma) is kept and stated in the file
    shape = head_shape(GGUFShape(
        vocab_size=preset.vocab_size, dim=preset.hidden, n_layers=preset.n_layers,
        n_heads=preset.n_heads, n_kv_heads=preset.n_kv_heads, ffn_dim=preset.ffn,
        context_length=preset.context_length,
    ), preset.head_dim)
    vocab = pad_vocab(build_vocab(), shape.vocab_size)
    names = gguf_tensor_names(shape)
    if preset.tied_embeddings:
        del names["output.weight"]
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(f"synthetic {preset.name} ({SYNTH_DESCRIPTION})")
    writer.add_description(
        f"{SYNTH_DESCRIPTION}: {preset.name}'s tensor shapes filled with random values "
        f"(seed {seed}), robot_latency planner tokenizer padded to {shape.vocab_size} tokens"
    )
    write_llama_hparams(writer, shape)
    write_head_dim(writer, shape)
    writer.add_file_type(int(gguf.LlamaFileType.MOSTLY_F16))
    write_tokenizer_metadata(writer, vocab)
    for name, tshape in names.items():
        dt = np.dtype(np.float16 if len(tshape) > 1 else np.float32)
        writer.add_tensor_info(name, tshape, dt, int(np.prod(tshape)) * dt.itemsize)
    rng = np.random.default_rng(seed)
    # N(0, 0.02) values, the usual init scale: no inf/NaN in F16 and sane activations.
    pool = (rng.standard_normal(_POOL_SIZE, dtype=np.float32) * 0.02).astype(np.float16)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for i, tshape in enumerate(names.values()):
        if len(tshape) == 1:
            writer.write_tensor_data(np.ones(tshape, dtype=np.float32))
            continue
        start = int(rng.integers(0, _POOL_SIZE))
        n = int(np.prod(tshape))
        # np.resize tiles the (rolled) pool to n values: a fast memcpy, not n random draws.
        arr = np.resize(np.roll(pool, start + i), n).reshape(tshape)
        writer.write_tensor_data(arr)
        del arr
    writer.close()
    return path


def synth(preset_id: Any, quant: str, out_path: str | Path, *, seed: int = 0) -> Path:
    """Write a random-weight GGUF of a preset's shape (outputs are noise, timing only).

    Args:
        preset_id: a ``modelinfo.PRESETS`` id (``"qwen2.5-0.5b"``) or a ``modelinfo.ModelShape``.
        quant: ``F16`` (written directly) or any ladder level (``ladder.VALID_QUANTS``; quantized
            from a temporary F16 file with llama.cpp's quantizer, which is then deleted).
        out_path: the GGUF to write.
        seed: the random seed (same seed, same file).

    Returns:
        ``out_path``.

    Raises:
        SynthError: unknown preset or a shape the llama layout cannot hold.
        robot_latency.models.ladder.LadderError: unknown quant or a failed quantization.
    """
    q = normalize_quant(quant)
    preset = _preset(preset_id)
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(out_path.name + ".f16.tmp")
    try:
        _write_f16(preset, tmp, seed=seed)
        if q == "F16":
            os.replace(tmp, out_path)
        else:
            quantize_gguf(tmp, out_path, q)
    finally:
        tmp.unlink(missing_ok=True)
    logger.info(
        "synthetic %s %s (%s): %s, %d bytes",
        preset.name, q, SYNTH_DESCRIPTION, out_path, out_path.stat().st_size,
    )
    return out_path
