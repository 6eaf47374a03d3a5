"""Function-preserving inflation of the trained planner into a real model's tensor shapes.

A tiny planner is launch-overhead bound and far faster than any model a robot would run, so its
timings say little about a deployment. ``inflate`` writes the same function in the exact tensor
shapes of a preset (docs/REFERENCE.md, "Model shapes": Qwen2.5-0.5B, Llama-3.2-1B, ...), so
llama.cpp does the real per-token work of that model while the plans stay the planner's
(docs/REFERENCE.md, "Measured on the development machine" gives the recipe, tried here before):

* hidden size: zero-padded. Embedding columns, q/k/v/gate/up input columns and o/down output
  rows past the small width are zero, so the padded coordinates of the residual stream stay 0.
* RMSNorm: with ``d_small`` real coordinates out of ``d_big``, ``mean(x**2)`` shrinks by
  ``d_small/d_big``; every norm gain is scaled by ``sqrt(d_small/d_big)`` and the file's epsilon
  by ``d_small/d_big``, which makes each norm's output equal the small model's exactly.
* heads: small KV head ``k`` goes to sub-block ``s`` of big KV head ``b`` (see "head packing"
  below; with equal head_dim, ``b = k`` and ``s = 0``). Small query head ``h`` (which reads KV
  head ``k = h // g_small``) takes slot ``s * g_small + h % g_small`` of the big model's query
  group of ``b``, so it reads exactly the KV head it read before. Unused heads (and unused KV
  sub-blocks) have zero projections and zero attention-output columns.
* head packing (``head_dim_small < head_dim_big``; ``p = head_dim_big / head_dim_small`` must be
  an integer): a big head of ``head_dim_big`` dims is ``p`` sub-blocks of ``head_dim_small`` dims
  (sub-block ``s`` = dims ``[s*hs, (s+1)*hs)``), each holding one small KV head. A small query
  head's q rows fill the sub-block of its KV head, zeros elsewhere, so its scores only see that
  KV head's dims; the rows are scaled by ``sqrt(head_dim_big/head_dim_small)`` so that llama.cpp's
  softmax scale ``1/sqrt(head_dim_big)`` equals the small model's ``1/sqrt(head_dim_small)``. Its
  attention output holds the right weighted sum of V in its own sub-block and other KV heads'
  values in the rest: the attn_output columns of those sub-blocks are zero. RoPE: llama.cpp's
  llama architecture takes an optional ``rope_freqs.weight`` (F32, ``[n_rot/2]``, shared by all
  layers; Llama-3.1's rope-scaling tensor) and rotates adjacent pair ``j`` by
  ``pos * base**(-2j/n_rot) / rope_freqs[j]``; with ``n_rot = head_dim_big`` and the small
  model's base, ``rope_freqs[j] = base**(-2j/hd_big) / base**(-2i/hs)`` for ``j = s*hs/2 + i``
  gives every sub-block the small model's frequencies. Equal head_dims write no rope_freqs.
  Assignment ("spread"): small KV head ``k`` goes to big KV head ``k % n_kv_big``, sub-block
  ``k // n_kv_big``. That balances the load, so the most small KV heads any big one hosts is
  ``ceil(n_kv_small / n_kv_big)``, the least possible: if spread does not fit (more than ``p``
  sub-blocks, or more than ``g_big`` query heads in one group), no assignment does. The shipped
  planner (8/4 heads, head_dim 32) into Qwen2.5-0.5B (14/2, head_dim 64): 2 small KV heads per big
  one, 4 of 7 query slots; into Llama-3.2-1B (32/8, head_dim 64): 1 per big KV head (sub-block
  0), 2 of 4 query slots.
* FFN: extra units have zero gate/up rows and zero down columns (``silu(0) * 0 = 0``).
* layers: extra layers are appended with zero attention-output and FFN-down matrices, so they
  pass the residual stream through unchanged.
* head_dim not ``hidden / n_heads`` (Qwen3-0.6B: 16 heads of 128 in a 1024-wide model): the
  target keeps its own head_dim (``HeadShape``; the q/k/v rows and attn_output columns are
  ``n_heads * head_dim``, not ``hidden``), and the file states it in ``llama.attention.key_length``
  and ``value_length``, which llama.cpp's llama architecture reads in place of ``hidden / n_heads``.
  Nothing else changes: the heads are placed and packed as above.
* vocabulary: padded with ``<unused_N>`` tokens of type UNUSED (5) so the GGUF's tokenizer has
  ``vocab_size`` entries; their embedding and output rows are zero.

**Padded tokens have logit 0, which can beat every real token.** The planner must constrain
sampling to the real vocabulary: the action grammar (``plan.actions_gbnf()``) does this for plans;
argmax over the whole vocabulary (``evaluate.GGUFPlanner.greedy``) does not and may emit
``<unused_N>``.

The result is written as architecture ``llama`` (untied output head), whatever the preset's
architecture: Qwen2's q/k/v biases are omitted (a few tens of thousands of parameters), which
does not change the per-token cost, dominated by matrix bytes. Tensors are made and written one at
a time (a Qwen2.5-0.5B-shape F16 file is ~1.3 GB; F32 twice that), never all in memory.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from robot_latency.errors import RobotLatencyError
from robot_latency.models.export import GGUFShape, gguf_tensor_names, write_llama_hparams
from robot_latency.models.tokenizer import (
    Vocab,
    copy_tokenizer_metadata,
    tokenizer_model,
    write_tokenizer_metadata,
)

__all__ = [
    "ROPE_FREQS",
    "UNUSED_TOKEN_TYPE",
    "HeadShape",
    "InflateError",
    "InflationPlan",
    "inflate",
    "pad_vocab",
    "plan_inflation",
    "read_vocab",
]

logger = logging.getLogger(__name__)

UNUSED_TOKEN_TYPE = 5  # gguf.TokenType.UNUSED / LLAMA_TOKEN_TYPE_UNUSED
ROPE_FREQS = "rope_freqs.weight"  # llama.cpp's LLM_TENSOR_ROPE_FREQS: per-pair RoPE divisors


class InflateError(RobotLatencyError, ValueError):
    """A model cannot be inflated into the requested shape."""


@dataclass(frozen=True)
class HeadShape(GGUFShape):
    """A :class:`GGUFShape` whose head_dim is its own, not ``dim // n_heads`` (0: the default).

    The tensor names and hyper-parameters follow it (``gguf_tensor_names``,
    ``write_llama_hparams`` read ``head_dim``); ``write_head_dim`` adds the key/value lengths
    llama.cpp needs to read such a file.
    """

    key_length: int = 0

    @property
    def head_dim(self) -> int:
        """Return the per-head size (``key_length`` where given)."""
        return self.key_length or self.dim // self.n_heads


def head_shape(shape: GGUFShape, head_dim: int) -> GGUFShape:
    """Return ``shape`` with ``head_dim`` (a :class:`HeadShape` unless it is ``dim // n_heads``)."""
    fields = {f: getattr(shape, f) for f in GGUFShape.__dataclass_fields__}
    if head_dim * shape.n_heads == shape.dim:
        return GGUFShape(**fields)
    return HeadShape(**fields, key_length=head_dim)


def write_head_dim(writer: Any, shape: GGUFShape) -> None:
    """Write ``llama.attention.key_length``/``value_length`` where the head_dim is not the
    default ``dim / n_heads`` (llama.cpp assumes the default otherwise)."""
    if shape.head_dim * shape.n_heads != shape.dim:
        writer.add_key_length(shape.head_dim)
        writer.add_value_length(shape.head_dim)


@dataclass(frozen=True)
class InflationPlan:
    """Where each part of the small model goes in the big one.

    Attributes:
        small: the source's hyper-parameters.
        big: the target's hyper-parameters (epsilon already scaled).
        q_slot: big query-head index of each small query head.
        gain_scale: ``sqrt(d_small / d_big)``, applied to every RMSNorm gain.
        kv_slot: (big KV head, sub-block) of each small KV head.
        pack: ``head_dim_big / head_dim_small`` (sub-blocks per big head; 1 without packing).
        q_scale: ``sqrt(pack)``, applied to the q rows.
        rope_freqs: the ``rope_freqs.weight`` values (``head_dim_big / 2``), or None when the
            head_dims are equal (no tensor is written).
    """

    small: GGUFShape
    big: GGUFShape
    q_slot: tuple[int, ...]
    gain_scale: float
    kv_slot: tuple[tuple[int, int], ...] = ()
    pack: int = 1
    q_scale: float = 1.0
    rope_freqs: tuple[float, ...] | None = None


def _target_shape(target: Any) -> tuple[str, GGUFShape]:
    """Return (label, shape without eps/rope/context) for a preset id or a ModelShape-like."""
    from robot_latency.floor.modelinfo import PRESETS

    if isinstance(target, str):
        if target not in PRESETS:
            raise InflateError(f"unknown preset {target!r}; known: {', '.join(sorted(PRESETS))}")
        target = PRESETS[target]
    if target.head_dim <= 0 or target.head_dim % 2:
        raise InflateError(f"{target.name}: head_dim {target.head_dim} must be even and > 0 "
                           "(RoPE rotates pairs)")
    shape = head_shape(GGUFShape(
        vocab_size=target.vocab_size, dim=target.hidden, n_layers=target.n_layers,
        n_heads=target.n_heads, n_kv_heads=target.n_kv_heads, ffn_dim=target.ffn,
    ), target.head_dim)
    return str(target.name), shape


def plan_inflation(small: GGUFShape, target: Any) -> InflationPlan:
    """Check that ``small`` fits in ``target`` and place its heads.

    Args:
        small: the source's hyper-parameters.
        target: a preset id (``"qwen2.5-0.5b"``) or a ``modelinfo.ModelShape``.

    Returns:
        The plan.

    Raises:
        InflateError: head_dim_big is not a multiple of head_dim_small, or some dimension of the
            source exceeds the target's, or the source's KV heads do not fit in the target's KV
            heads' sub-blocks, or their query heads do not fit in the target's GQA groups.
    """
    label, big = _target_shape(target)
    hs, hb = small.head_dim, big.head_dim
    if hs > hb or hb % hs:
        raise InflateError(
            f"head_dim {hs} of the source does not divide {label}'s head_dim {hb}: small heads "
            f"pack into big ones only when head_dim_big is a multiple of head_dim_small"
        )
    if hs % 2:
        raise InflateError(f"head_dim {hs} of the source is odd: RoPE rotates pairs")
    pack = hb // hs
    checks = {
        "dim": (small.dim, big.dim), "n_layers": (small.n_layers, big.n_layers),
        "n_heads": (small.n_heads, big.n_heads), "ffn_dim": (small.ffn_dim, big.ffn_dim),
        "vocab_size": (small.vocab_size, big.vocab_size),
    }
    too_big = {k: v for k, v in checks.items() if v[0] > v[1]}
    if too_big:
        raise InflateError(f"source larger than {label} in {too_big} (source, target)")
    if small.n_heads % small.n_kv_heads or big.n_heads % big.n_kv_heads:
        raise InflateError("n_heads must be a multiple of n_kv_heads in the source and target")
    g_small = small.n_heads // small.n_kv_heads
    g_big = big.n_heads // big.n_kv_heads
    per_big = -(-small.n_kv_heads // big.n_kv_heads)  # small KV heads on the fullest big one
    if per_big > pack:
        raise InflateError(
            f"source n_kv_heads {small.n_kv_heads} does not fit in {label}: {big.n_kv_heads} KV "
            f"heads x {pack} sub-block(s) of head_dim {hs} (head_dim {hb}) = "
            f"{big.n_kv_heads * pack} small KV heads at most"
        )
    if per_big * g_small > g_big:
        raise InflateError(
            f"query slots do not fit: {per_big} source KV head(s) per {label} KV head need "
            f"{per_big * g_small} query heads ({g_small} per KV head), a {label} GQA group has "
            f"only {g_big}"
        )
    # "spread": small KV head k -> big KV head k % n_kv_big, sub-block k // n_kv_big.
    kv_slot = tuple((k % big.n_kv_heads, k // big.n_kv_heads) for k in range(small.n_kv_heads))
    q_slot = tuple(
        kv_slot[h // g_small][0] * g_big + kv_slot[h // g_small][1] * g_small + h % g_small
        for h in range(small.n_heads)
    )
    rope_freqs = None
    if pack > 1:
        base = small.rope_base
        rope_freqs = tuple(
            base ** (-2 * j / hb) / base ** (-2 * (j % (hs // 2)) / hs) for j in range(hb // 2)
        )
    ratio = small.dim / big.dim
    big = head_shape(GGUFShape(
        vocab_size=big.vocab_size, dim=big.dim, n_layers=big.n_layers, n_heads=big.n_heads,
        n_kv_heads=big.n_kv_heads, ffn_dim=big.ffn_dim, context_length=small.context_length,
        rope_base=small.rope_base, norm_eps=small.norm_eps * ratio,
    ), hb)
    return InflationPlan(
        small=small, big=big, q_slot=q_slot, gain_scale=math.sqrt(ratio), kv_slot=kv_slot,
        pack=pack, q_scale=math.sqrt(pack), rope_freqs=rope_freqs,
    )


def read_vocab(reader: Any) -> Vocab:
    """Return the tokenizer vocabulary stored in a GGUF (a ``gguf.GGUFReader``)."""
    tokens = reader.get_field("tokenizer.ggml.tokens").contents()
    scores = reader.get_field("tokenizer.ggml.scores").contents()
    types = reader.get_field("tokenizer.ggml.token_type").contents()
    return Vocab(
        tokens=tuple(str(t) for t in tokens),
        scores=tuple(float(s) for s in scores),
        types=tuple(int(t) for t in types),
    )


def pad_vocab(vocab: Vocab, size: int) -> Vocab:
    """Extend a vocabulary to ``size`` with ``<unused_N>`` tokens of type UNUSED (score 0).

    Raises:
        InflateError: the vocabulary is already larger than ``size``.
    """
    extra = size - vocab.size
    if extra < 0:
        raise InflateError(f"vocabulary of {vocab.size} tokens does not fit in {size}")
    taken = set(vocab.tokens)
    pad: list[str] = []
    n = 0
    while len(pad) < extra:
        tok = f"<unused_{n}>"
        n += 1
        if tok not in taken:
            pad.append(tok)
    return Vocab(
        tokens=(*vocab.tokens, *pad),
        scores=(*vocab.scores, *([0.0] * extra)),
        types=(*vocab.types, *([UNUSED_TOKEN_TYPE] * extra)),
    )


def _big_tensor(
    name: str, shape: tuple[int, ...], small: dict[str, np.ndarray], plan: InflationPlan,
    dtype: np.dtype,
) -> np.ndarray:
    """Make one tensor of the inflated model (torch layout ``(out, in)``)."""
    s, hs, hb = plan.small, plan.small.head_dim, plan.big.head_dim
    g_small = s.n_heads // s.n_kv_heads
    out = np.zeros(shape, dtype=dtype)
    if name == ROPE_FREQS:
        if plan.rope_freqs is None:
            raise InflateError(f"{name}: no RoPE factors without head packing")
        out[:] = plan.rope_freqs
        return out
    parts = name.split(".")
    if parts[0] == "blk":
        layer, kind = int(parts[1]), parts[2]
        if layer >= s.n_layers:
            # Extra layer: every matrix zero, so attention and FFN add 0 to the residual. Norm
            # gains are zero too (their output only feeds zero matrices).
            return out
        w = small[name]

        def q_rows(h: int) -> slice:
            """Rows (of q) / columns (of attn_output) of small query head ``h`` in the big model:
            the sub-block of its KV head inside its big query head."""
            start = plan.q_slot[h] * hb + plan.kv_slot[h // g_small][1] * hs
            return slice(start, start + hs)

        if kind in ("attn_norm", "ffn_norm"):
            out[: s.dim] = w * plan.gain_scale
        elif kind == "attn_q":  # (n_heads * hd, dim); other sub-blocks of the head stay 0
            for h in range(s.n_heads):
                out[q_rows(h), : s.dim] = w[h * hs : (h + 1) * hs] * plan.q_scale
        elif kind in ("attn_k", "attn_v"):  # (n_kv_heads * hd, dim)
            for k, (b, sub) in enumerate(plan.kv_slot):
                start = b * hb + sub * hs
                out[start : start + hs, : s.dim] = w[k * hs : (k + 1) * hs]
        elif kind == "attn_output":  # (dim, n_heads * hd); junk sub-blocks' columns stay 0
            for h in range(s.n_heads):
                out[: s.dim, q_rows(h)] = w[:, h * hs : (h + 1) * hs]
        elif kind in ("ffn_gate", "ffn_up"):  # (ffn, dim)
            out[: s.ffn_dim, : s.dim] = w
        elif kind == "ffn_down":  # (dim, ffn)
            out[: s.dim, : s.ffn_dim] = w
        else:
            raise InflateError(f"no inflation rule for tensor {name}")
        return out
    w = small[name]
    if name == "output_norm.weight":
        out[: s.dim] = w * plan.gain_scale
    elif name in ("token_embd.weight", "output.weight"):  # (vocab, dim); padded rows stay 0
        out[: s.vocab_size, : s.dim] = w
    else:
        raise InflateError(f"no inflation rule for tensor {name}")
    return out


def _tensor_names(plan: InflationPlan) -> dict[str, tuple[int, ...]]:
    """Return the inflated model's tensors (``rope_freqs.weight`` first when heads are packed)."""
    names = gguf_tensor_names(plan.big)
    if plan.rope_freqs is None:
        return names
    return {ROPE_FREQS: (plan.big.head_dim // 2,), **names}


def _tensors(
    plan: InflationPlan, small: dict[str, np.ndarray], dtype: str
) -> Iterator[tuple[str, np.ndarray]]:
    for name, shape in _tensor_names(plan).items():
        # Norm vectors stay F32 (as llama.cpp's converter writes them); matrices take dtype.
        np_dtype = np.dtype(np.float16 if dtype == "F16" and len(shape) > 1 else np.float32)
        yield name, _big_tensor(name, shape, small, plan, np_dtype)


def inflate(
    src_gguf: str | Path, preset_id: Any, out_path: str | Path, *, dtype: str = "F16"
) -> Path:
    """Inflate a planner GGUF into a preset's exact tensor shapes, preserving its function.

    The output computes the same logits over the real vocabulary (to accumulation-order error);
    padded vocabulary entries get logit 0 and can beat every real token, so decode with the
    action grammar (or another mask to the real vocabulary). Written as a llama GGUF with an
    untied output head; Qwen2 q/k/v biases are omitted. See the module docstring for the recipe.

    Args:
        src_gguf: the trained planner (F32/F16 llama GGUF, as ``export.export_gguf`` writes).
        preset_id: a ``modelinfo.PRESETS`` id (``"qwen2.5-0.5b"``, ``"llama-3.2-1b"``) or a
            ``modelinfo.ModelShape``.
        out_path: the GGUF to write (via ``<out_path>.tmp``, renamed when complete).
        dtype: ``"F16"`` or ``"F32"`` for the matrices (norms stay F32).

    Returns:
        ``out_path``.

    Raises:
        InflateError: the shapes are incompatible (head_dims that do not pack, source too large,
            heads that do not fit) or the dtype is unknown.
    """
    import gguf

    from robot_latency.floor.gguf_reader import GGUFReader
    from robot_latency.models.export import read_gguf

    if dtype not in ("F32", "F16"):
        raise InflateError(f"dtype must be F32 or F16, got {dtype!r}")
    src_shape, small = read_gguf(src_gguf)
    plan = plan_inflation(src_shape, preset_id)
    label, _ = _target_shape(preset_id)
    # A real model's BPE (the JSON planner's Qwen2 vocabulary) is copied as it is, merges and
    # chat template included; the planner's own word vocabulary is padded to the preset's size.
    bpe = tokenizer_model(src_gguf) != "llama"
    if bpe and src_shape.vocab_size != plan.big.vocab_size:
        raise InflateError(f"{src_gguf}: its {src_shape.vocab_size}-token vocabulary is not "
                           f"{label}'s {plan.big.vocab_size}; a real tokenizer is not padded")
    vocab = None if bpe else pad_vocab(read_vocab(GGUFReader(str(src_gguf))), plan.big.vocab_size)
    big = plan.big
    out_path = Path(out_path)
    tmp = out_path.with_name(out_path.name + ".tmp")
    writer = gguf.GGUFWriter(str(tmp), "llama")
    writer.add_name(f"robot_latency planner inflated to {label} shape")
    packing = (
        f"; {plan.pack} heads of head_dim {src_shape.head_dim} packed per head, rope_freqs.weight "
        f"restores their RoPE frequencies" if plan.pack > 1 else ""
    )
    writer.add_description(
        f"The robot_latency planner ({src_shape.n_layers} layers, {src_shape.dim} wide) inflated "
        f"function-preservingly into {label}'s tensor shapes (zero padding, norm gains scaled by "
        f"sqrt(d_small/d_big), eps by d_small/d_big; q/k/v biases omitted{packing}). Padded "
        f"vocabulary (<unused_N>) has logit 0: constrain sampling to the real vocabulary (action "
        f"grammar)."
    )
    write_llama_hparams(writer, big)
    write_head_dim(writer, big)
    ftype = gguf.LlamaFileType.ALL_F32 if dtype == "F32" else gguf.LlamaFileType.MOSTLY_F16
    writer.add_file_type(int(ftype))
    if vocab is None:
        copy_tokenizer_metadata(writer, src_gguf)
    else:
        write_tokenizer_metadata(writer, vocab)
    # Declare every tensor first (the header needs their shapes), then stream them in order.
    for name, shape in _tensor_names(plan).items():
        np_dtype = np.dtype(np.float16 if dtype == "F16" and len(shape) > 1 else np.float32)
        writer.add_tensor_info(name, shape, np_dtype, int(np.prod(shape)) * np_dtype.itemsize)
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for _name, arr in _tensors(plan, small, dtype):
            writer.write_tensor_data(arr)
            del arr
        writer.close()
    except BaseException:
        writer.close()
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(out_path)
    logger.info(
        "inflated %s into %s shape: %s (%d bytes, %s)",
        src_gguf, label, out_path, out_path.stat().st_size, dtype,
    )
    return out_path
