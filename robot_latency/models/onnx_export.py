"""Write a llama GGUF as an ONNX decoder with a KV cache, and a dynamic INT8 copy of it.

The graph is built directly from the GGUF's numpy weights with ``onnx.helper`` (no torch), and
computes what llama.cpp computes for the "llama" architecture on the same weights:

* RMSNorm ``x / sqrt(mean(x^2) + eps) * w`` with the GGUF's epsilon,
* RoPE in llama.cpp's "normal" mode: *adjacent* pairs ``(x[2i], x[2i+1])`` rotated by
  ``pos * base**(-2i/head_dim)`` (what :mod:`robot_latency.models.export` writes and
  :mod:`robot_latency.models.train` trains; no HF half-split permutation),
* grouped-query attention: query head ``h`` reads KV head ``h // (n_heads / n_kv_heads)``,
  scaled by ``1/sqrt(head_dim)``, causal mask built inside the graph,
* SwiGLU feed-forward ``down(silu(gate(h)) * up(h))`` and an untied output head.

Graph I/O (``L`` = layers, ``KV`` = KV heads, ``D`` = head_dim, ``V`` = vocabulary)::

    inputs   input_ids                 int64   [1, T]
             past_key_{i}, past_value_{i}  float32 [1, KV, P, D]   i in 0..L-1, P may be 0
    outputs  logits                    float32 [1, 1, V]  (last position; "all": [1, T, V])
             present_key_{i}, present_value_{i}  float32 [1, KV, P+T, D]

The new tokens' positions are ``P .. P+T-1``, read from ``past_key_0``'s shape: there is no
separate position input that could disagree with the cache. Keys are stored after RoPE.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import numpy as np

from robot_latency.digest import sha256_file
from robot_latency.models.export import ExportError, GGUFShape, read_gguf

__all__ = [
    "IR_FOR_OPSET",
    "OnnxExportError",
    "OnnxGraph",
    "export_all",
    "export_onnx",
    "linear_node",
    "onnx_io_names",
    "quantize_onnx_int8",
    "save_onnx",
]

logger = logging.getLogger(__name__)

#: Opsets the graph builder supports (ReduceMean takes its axes as an input from 18 on).
SUPPORTED_OPSETS = range(17, 22)
#: ONNX IR version written: 8 is what onnxruntime 1.14+ reads for opset 17-18; newer opsets need 9+.
IR_FOR_OPSET = {17: 8, 18: 8, 19: 9, 20: 9, 21: 10}


#: Above this many weight bytes the weights go to ``<file>.data`` beside the graph (protobuf's
#: 2 GB limit: an F32 model of Qwen2.5-0.5B's shape is ~2.5 GB).
EXTERNAL_DATA_BYTES = 1 << 30


class OnnxExportError(ExportError):
    """A GGUF cannot be written as ONNX (unreadable, quantized, bad option)."""


def onnx_io_names(n_layers: int) -> tuple[list[str], list[str]]:
    """Return the graph's input and output names, in order.

    Args:
        n_layers: blocks in the model.

    Returns:
        ``(inputs, outputs)``: ``input_ids, past_key_0, past_value_0, ...`` and
        ``logits, present_key_0, present_value_0, ...``.
    """
    ins, outs = ["input_ids"], ["logits"]
    for i in range(n_layers):
        ins += [f"past_key_{i}", f"past_value_{i}"]
        outs += [f"present_key_{i}", f"present_value_{i}"]
    return ins, outs


class OnnxGraph:
    """A small helper that names nodes and collects initializers."""

    def __init__(self, opset: int) -> None:
        self.opset = opset
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self._n = 0

    def name(self, hint: str) -> str:
        self._n += 1
        return f"{hint}_{self._n}"

    def const(self, hint: str, value: np.ndarray) -> str:
        from onnx import numpy_helper

        name = self.name(hint)
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def op(self, op_type: str, inputs: list[str], hint: str = "", n_out: int = 1,
           **attrs: Any) -> str:
        from onnx import helper

        outs = [self.name(hint or op_type.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=outs[0] + "_node",
                                           **attrs))
        return outs[0]

    def reduce_mean_last(self, x: str) -> str:
        if self.opset >= 18:
            return self.op("ReduceMean", [x, self.const("axes", np.array([-1], np.int64))],
                           keepdims=1)
        return self.op("ReduceMean", [x], axes=[-1], keepdims=1)


def _rms_norm(g: OnnxGraph, x: str, weight: np.ndarray, eps: float, hint: str) -> str:
    # (1, T, d) -> (1, T, d): x / sqrt(mean(x^2) + eps) * w, as ggml_rms_norm then ggml_mul.
    ms = g.reduce_mean_last(g.op("Mul", [x, x]))
    denom = g.op("Sqrt", [g.op("Add", [ms, g.const("eps", np.array(eps, np.float32))])])
    return g.op("Mul", [g.op("Div", [x, denom]), g.const(hint, weight.astype(np.float32))])


def linear_node(g: OnnxGraph, x: str, weight: np.ndarray, hint: str) -> str:
    # Weights arrive as torch (out, in); MatMul wants (in, out). A constant B is what
    # quantize_dynamic turns into an int8 MatMul.
    return g.op("MatMul", [x, g.const(hint, np.ascontiguousarray(weight.T.astype(np.float32)))])


def _build_model(shape: GGUFShape, tensors: dict[str, np.ndarray], *, opset: int,
                 logits: str, doc: str) -> Any:
    from onnx import TensorProto, helper

    g = OnnxGraph(opset)
    n_h, n_kv, hd = shape.n_heads, shape.n_kv_heads, shape.head_dim
    if n_h % n_kv:
        raise OnnxExportError(f"n_heads={n_h} is not a multiple of n_kv_heads={n_kv}")
    if hd % 2:
        raise OnnxExportError(f"head_dim={hd} is odd; RoPE rotates pairs")
    rep = n_h // n_kv
    i64 = lambda *v: np.array(v, np.int64)  # noqa: E731

    # Lengths: T new tokens, P cached ones (from past_key_0), S = P + T.
    ids_shape = g.op("Shape", ["input_ids"])
    t_len = g.op("Gather", [ids_shape, g.const("one", np.array(1, np.int64))], axis=0)
    p_len = g.op("Gather", [g.op("Shape", ["past_key_0"]), g.const("two", np.array(2, np.int64))],
                 axis=0)
    s_len = g.op("Add", [p_len, t_len])
    one = g.const("step", np.array(1, np.int64))
    q_pos = g.op("Range", [p_len, s_len, one])                      # (T,) int64
    k_pos = g.op("Range", [g.const("zero", np.array(0, np.int64)), s_len, one])  # (S,)
    # Causal mask (T, S): query at position p may read keys at positions <= p.
    masked = g.op("Greater", [g.op("Unsqueeze", [k_pos, g.const("ax0", i64(0))]),
                              g.op("Unsqueeze", [q_pos, g.const("ax1", i64(1))])])
    neg_inf = g.const("neg_inf", np.array(-np.inf, np.float32))

    # RoPE tables for the new positions, over the full head dim (T, D): element d uses the
    # frequency of pair d // 2; rotate(x)[2i] = -x[2i+1], rotate(x)[2i+1] = x[2i].
    inv = shape.rope_base ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    inv_full = np.repeat(inv, 2).astype(np.float32)                 # (D,)
    ang = g.op("Mul", [g.op("Unsqueeze", [g.op("Cast", [q_pos], to=TensorProto.FLOAT),
                                          g.const("ax1", i64(1))]),
                       g.const("inv_freq", inv_full)])              # (T, D)
    cos = g.op("Cos", [ang])
    sign = np.tile(np.array([-1.0, 1.0], np.float32), hd // 2)
    sin = g.op("Mul", [g.op("Sin", [ang]), g.const("rot_sign", sign)])
    swap = g.const("pair_swap", np.arange(hd, dtype=np.int64).reshape(-1, 2)[:, ::-1].reshape(-1))

    def rope(x: str) -> str:
        # x: (1, H, T, D); cos/sin broadcast from (T, D).
        return g.op("Add", [g.op("Mul", [x, cos]),
                            g.op("Mul", [g.op("Gather", [x, swap], axis=-1), sin])])

    def heads(x: str, n: int) -> str:
        # (1, T, n*D) -> (1, n, T, D)
        return g.op("Transpose", [g.op("Reshape", [x, g.const("hshape", i64(1, -1, n, hd))])],
                    perm=[0, 2, 1, 3])

    x = g.op("Gather", [g.const("token_embd", tensors["token_embd.weight"].astype(np.float32)),
                        "input_ids"], axis=0)                        # (1, T, d)
    scale = g.const("kq_scale", np.array(1.0 / math.sqrt(hd), np.float32))
    for i in range(shape.n_layers):
        p = f"blk.{i}."
        h = _rms_norm(g, x, tensors[p + "attn_norm.weight"], shape.norm_eps, p + "attn_norm")
        q = rope(heads(linear_node(g, h, tensors[p + "attn_q.weight"], p + "attn_q"), n_h))
        k = rope(heads(linear_node(g, h, tensors[p + "attn_k.weight"], p + "attn_k"), n_kv))
        v = heads(linear_node(g, h, tensors[p + "attn_v.weight"], p + "attn_v"), n_kv)
        k_all = g.op("Concat", [f"past_key_{i}", k], axis=2)        # (1, KV, S, D)
        v_all = g.op("Concat", [f"past_value_{i}", v], axis=2)
        g.nodes.append(_identity(k_all, f"present_key_{i}"))
        g.nodes.append(_identity(v_all, f"present_value_{i}"))
        # GQA without copying KV: (1, H, T, D) -> (1, KV, rep, T, D) against (1, KV, 1, S, D).
        qg = g.op("Reshape", [q, g.const("gshape", i64(1, n_kv, rep, -1, hd))])
        kg = g.op("Unsqueeze", [k_all, g.const("ax2", i64(2))])
        vg = g.op("Unsqueeze", [v_all, g.const("ax2", i64(2))])
        scores = g.op("Mul", [g.op("MatMul", [qg, g.op("Transpose", [kg], perm=[0, 1, 2, 4, 3])]),
                              scale])                               # (1, KV, rep, T, S)
        probs = g.op("Softmax", [g.op("Where", [masked, neg_inf, scores])], axis=-1)
        a = g.op("MatMul", [probs, vg])                             # (1, KV, rep, T, D)
        a = g.op("Reshape", [a, g.const("hshape", i64(1, n_h, -1, hd))])
        a = g.op("Reshape", [g.op("Transpose", [a], perm=[0, 2, 1, 3]),
                             g.const("flat", i64(1, -1, n_h * hd))])  # (1, T, H*D)
        x = g.op("Add", [x, linear_node(g, a, tensors[p + "attn_output.weight"],
                                        p + "attn_output")])
        h = _rms_norm(g, x, tensors[p + "ffn_norm.weight"], shape.norm_eps, p + "ffn_norm")
        gate = linear_node(g, h, tensors[p + "ffn_gate.weight"], p + "ffn_gate")
        up = linear_node(g, h, tensors[p + "ffn_up.weight"], p + "ffn_up")
        act = g.op("Mul", [g.op("Mul", [gate, g.op("Sigmoid", [gate])]), up])
        x = g.op("Add", [x, linear_node(g, act, tensors[p + "ffn_down.weight"], p + "ffn_down")])
    if logits == "last":
        # Only the last position's logits: the output head is the largest matrix, and the
        # engine needs no other row (prefill chunks and decode steps alike).
        x = g.op("Slice", [x, g.const("start", i64(-1)), g.const("end", i64(2**62)),
                           g.const("axis", i64(1))])
    x = _rms_norm(g, x, tensors["output_norm.weight"], shape.norm_eps, "output_norm")
    g.nodes.append(_identity(linear_node(g, x, tensors["output.weight"], "output"), "logits"))

    kv_in, kv_out = [], []
    for i in range(shape.n_layers):
        for kind in ("key", "value"):
            kv_in.append(helper.make_tensor_value_info(
                f"past_{kind}_{i}", TensorProto.FLOAT, [1, n_kv, "past_seq", hd]))
            kv_out.append(helper.make_tensor_value_info(
                f"present_{kind}_{i}", TensorProto.FLOAT, [1, n_kv, "total_seq", hd]))
    graph = helper.make_graph(
        g.nodes, "llama_decoder",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, "seq"]), *kv_in],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT,
                                       [1, 1 if logits == "last" else "seq", shape.vocab_size]),
         *kv_out],
        initializer=g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="robot_latency", doc_string=doc)
    model.ir_version = IR_FOR_OPSET[opset]
    return model


def _identity(src: str, dst: str) -> Any:
    from onnx import helper

    return helper.make_node("Identity", [src], [dst], name=dst + "_node")


def save_onnx(model: Any, path: Path, *, external: bool) -> None:
    """Check and write a model, its weights in ``<path>.data`` when ``external``."""
    import onnx

    if external:
        data = path.with_name(path.name + ".data")
        data.unlink(missing_ok=True)  # save_model appends to an existing data file
        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=data.name, size_threshold=1024)
        onnx.checker.check_model(str(path))
    else:
        onnx.checker.check_model(model)
        onnx.save_model(model, str(path))


def export_onnx(gguf_path: str | Path, out_path: str | Path, *, opset: int = 17,
                logits: str = "last") -> Path:
    """Write a llama GGUF (F32 or F16 tensors) as an ONNX decoder with KV cache I/O.

    Args:
        gguf_path: the GGUF, as written by :func:`robot_latency.models.export.export_gguf`.
        out_path: the ``.onnx`` file to write (weights inside it; ONNX's 2 GB protobuf limit
            applies).
        opset: ONNX opset, 17 to 21.
        logits: ``"last"`` (``[1, 1, V]``, what the engine uses) or ``"all"`` (``[1, T, V]``,
            for comparing every position).

    Returns:
        The path written.

    Raises:
        OnnxExportError: the GGUF cannot be read or the options are bad.
    """

    if opset not in SUPPORTED_OPSETS:
        raise OnnxExportError(f"opset={opset}: supported {SUPPORTED_OPSETS.start}.."
                              f"{SUPPORTED_OPSETS.stop - 1}")
    if logits not in ("last", "all"):
        raise OnnxExportError(f"logits={logits!r}: must be 'last' or 'all'")
    gguf_path, out_path = Path(gguf_path), Path(out_path)
    try:
        shape, tensors = read_gguf(gguf_path)
    except ExportError as err:
        raise OnnxExportError(f"cannot export {gguf_path}: {err}") from err
    except (OSError, ValueError, KeyError, IndexError) as err:
        raise OnnxExportError(f"cannot read {gguf_path} as GGUF: {err}") from err
    doc = (f"llama decoder from {gguf_path.name}: {shape.n_layers} layers, dim {shape.dim}, "
           f"{shape.n_heads}/{shape.n_kv_heads} heads, vocab {shape.vocab_size}")
    model = _build_model(shape, tensors, opset=opset, logits=logits, doc=doc)
    meta = {"source_gguf": gguf_path.name, "source_sha256": sha256_file(gguf_path),
            "logits": logits, "rope": "normal (adjacent pairs)", "weights": "fp32",
            "shape": json.dumps(shape.__dict__)}
    for key, value in meta.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    out_path.parent.mkdir(parents=True, exist_ok=True)
    save_onnx(model, out_path,
              external=sum(t.nbytes for t in tensors.values()) > EXTERNAL_DATA_BYTES)
    logger.info("wrote %s (%d bytes) from %s", out_path, out_path.stat().st_size, gguf_path)
    return out_path


def quantize_onnx_int8(fp32_path: str | Path, out_path: str | Path) -> Path:
    """Write a dynamic-INT8 copy of an exported decoder (int8 weights, activations quantized
    at run time) with ``onnxruntime.quantization.quantize_dynamic``.

    Args:
        fp32_path: the FP32 ``.onnx`` from :func:`export_onnx`.
        out_path: the INT8 ``.onnx`` to write.

    Returns:
        The path written.

    Raises:
        OnnxExportError: the input cannot be read or quantized.
    """
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    fp32_path, out_path = Path(fp32_path), Path(out_path)
    if not fp32_path.is_file():
        raise OnnxExportError(f"no ONNX model at {fp32_path}")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        # MatMul only: the embedding Gather stays FP32 (a row lookup, not a bandwidth cost
        # worth the accuracy), so INT8 changes exactly the matrices read every step.
        external = fp32_path.with_name(fp32_path.name + ".data").is_file()
        quantize_dynamic(str(fp32_path), str(out_path), weight_type=QuantType.QInt8,
                         op_types_to_quantize=["MatMul"], use_external_data_format=external)
        model = onnx.load(str(out_path))
    except Exception as err:  # onnx/onnxruntime raise many types for a bad graph
        raise OnnxExportError(f"could not quantize {fp32_path}: {err}") from err
    # Record the weight type where the engine reads it (ORT's model metadata).
    props = {p.key: p for p in model.metadata_props}
    if "weights" in props:
        props["weights"].value = "int8"
    else:
        entry = model.metadata_props.add()
        entry.key, entry.value = "weights", "int8"
    save_onnx(model, out_path, external=external or model.ByteSize() > EXTERNAL_DATA_BYTES)
    logger.info("wrote %s (%d bytes)", out_path, out_path.stat().st_size)
    return out_path


def export_all(gguf_path: str | Path, out_dir: str | Path, *, name: str | None = None,
               opset: int = 17) -> dict[str, Any]:
    """Write ``<name>.onnx`` (FP32) and ``<name>.int8.onnx`` with a manifest entry for each.

    Args:
        gguf_path: the source GGUF.
        out_dir: the output directory (created).
        name: file stem; defaults to the GGUF's stem, so the engine finds the tokenizer GGUF
            next to the ONNX files when ``out_dir`` is the GGUF's directory.
        opset: ONNX opset.

    Returns:
        ``{"source": {...}, "files": {"fp32": {...}, "int8": {...}}}`` with each file's
        ``path``, ``bytes`` and ``sha256``; also written to ``<name>.onnx.json``.

    Raises:
        OnnxExportError: the export or the quantization failed.
    """
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    name = name or gguf_path.stem
    fp32 = export_onnx(gguf_path, out_dir / f"{name}.onnx", opset=opset)
    int8 = quantize_onnx_int8(fp32, out_dir / f"{name}.int8.onnx")

    def entry(path: Path) -> dict[str, Any]:
        out = {"path": path.name, "bytes": path.stat().st_size, "sha256": sha256_file(path)}
        data = path.with_name(path.name + ".data")  # external weights, for large models
        if data.is_file():
            out["data"] = {"path": data.name, "bytes": data.stat().st_size,
                           "sha256": sha256_file(data)}
        return out

    manifest = {"source": {**entry(gguf_path), "path": str(gguf_path)}, "opset": opset,
                "logits": "last", "files": {"fp32": entry(fp32), "int8": entry(int8)}}
    (out_dir / f"{name}.onnx.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest
