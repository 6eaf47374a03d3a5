"""Write an mmproj GGUF's vision tower and projector as an ONNX graph (no torch).

The graph is built with ``onnx.helper`` from the mmproj's numpy weights (f16 weights widened to
f32, exactly) and computes what llama.cpp's clip (llama-cpp-python 0.3.36's ``libmtmd``)
computes for the projector types :mod:`robot_latency.models.mmproj` writes:

* ``mlp`` (LLaVA-1.5, ``clip_graph_llava``): the patch convolution; the class embedding
  concatenated *after* the patches (``ggml_concat(inp, class_embd, 1)``); position rows
  ``0 .. n_patches`` added in that order; the pre-layernorm; all blocks but the last (LLaVA reads
  the penultimate layer); then the rows ``1 .. n_patches`` (llama.cpp's ``patches`` input is
  offset by one for the class token, so it keeps the class row and drops the first patch's);
  then ``mm.0`` -> GELU -> ``mm.2``.
* ``idefics3`` (SmolVLM, ``clip_graph_siglip``): the patch convolution plus the position table,
  every block, the post-layernorm, the pixel shuffle of ``scale_factor`` x ``scale_factor``
  patches into one (transformers' ``Idefics3Connector.pixel_shuffle``), then ``mm.model.fc``.

In the blocks: layernorm -> attention (``1/sqrt(head_dim)``, no mask) -> residual, layernorm ->
feed-forward -> residual. The feed-forward's activation is ``clip.use_gelu``'s: GELU, else
CLIP's quick GELU ``x * sigmoid(1.702 x)``. llama.cpp's ``ggml_gelu`` is the tanh form, so the
graph uses it too.

Graph I/O (``S`` = ``clip.vision.image_size``, ``N`` = image tokens, ``E`` = the language
model's width)::

    inputs   pixel_values   float32 [1, 3, S, S]   normalized with image_mean / image_std
    outputs  image_embeds   float32 [N, E]
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from robot_latency.models.mmproj import MmprojError, open_gguf
from robot_latency.models.onnx_export import IR_FOR_OPSET, OnnxGraph, linear_node, save_onnx

__all__ = ["PROJECTORS", "VisionTower", "export_vision_onnx", "read_tower"]

log = logging.getLogger(__name__)

#: The projector types the graph is written for.
PROJECTORS = ("mlp", "idefics3")
#: ONNX opsets the builder writes (LayerNormalization is opset 17).
SUPPORTED_OPSETS = range(17, 22)
_GELU_C = math.sqrt(2.0 / math.pi)


@dataclass(frozen=True)
class VisionTower:
    """What the graph and the preprocessing need from an mmproj's ``clip.*`` keys.

    Args:
        projector: ``clip.projector_type``.
        image_size_px: ``clip.vision.image_size``, the square tile's side.
        patch_px: ``clip.vision.patch_size``.
        width: ``clip.vision.embedding_length``.
        layers: ``clip.vision.block_count``.
        heads: ``clip.vision.attention.head_count``.
        eps: ``clip.vision.attention.layer_norm_epsilon``.
        mean: ``clip.vision.image_mean`` (RGB).
        std: ``clip.vision.image_std`` (RGB).
        gelu: ``clip.use_gelu`` (else quick GELU).
        scale_factor: ``clip.vision.projector.scale_factor`` (idefics3), else 1.
        n_embd_out: the projector's output width (the language model's embedding width).
    """

    projector: str
    image_size_px: int
    patch_px: int
    width: int
    layers: int
    heads: int
    eps: float
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    gelu: bool
    scale_factor: int
    n_embd_out: int

    @property
    def n_patches(self) -> int:
        return (self.image_size_px // self.patch_px) ** 2

    @property
    def n_tokens(self) -> int:
        """Image tokens one tile gives (one chunk's rows)."""
        return self.n_patches // (self.scale_factor ** 2)


def read_tower(path: str | Path) -> tuple[VisionTower, dict[str, np.ndarray]]:
    """Read an mmproj GGUF's keys and tensors (float32).

    Raises:
        MmprojError: no file, not a GGUF, a projector type not in :data:`PROJECTORS`, a missing
            key or tensor, or a quantized tensor.
    """
    p = Path(path)
    reader = open_gguf(p)

    def key(name: str, default: Any = None) -> Any:
        field = reader.fields.get(name)
        if field is None:
            if default is None:
                raise MmprojError(f"{p}: {name}: missing")
            return default
        return field.contents()

    kind = key("clip.projector_type", "")
    if kind not in PROJECTORS:
        raise MmprojError(f"{p}: clip.projector_type={kind!r}: the ONNX export supports "
                          f"{PROJECTORS}")
    if kind == "idefics3" and int(key("clip.vision.preproc_image_size", 0) or 0) > 0:
        raise MmprojError(f"{p}: clip.vision.preproc_image_size: the longest-edge resize of "
                          "this llama.cpp's idefics3 preprocessing is not reproduced by the "
                          "ONNX export")
    if reader.fields.get("clip.vision.feature_layer") is not None:
        raise MmprojError(f"{p}: clip.vision.feature_layer: explicit feature layers (granite) "
                          "are not reproduced by the ONNX export")
    tensors: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        if t.tensor_type.name not in ("F32", "F16"):
            raise MmprojError(f"{p}: tensor {t.name}: type {t.tensor_type.name}: the ONNX export "
                              "reads F32 and F16 only")
        tensors[t.name] = np.array(t.data, dtype=np.float32)  # f16 -> f32 is exact
    fc = "mm.2.weight" if kind == "mlp" else "mm.model.fc.weight"
    if fc not in tensors:
        raise MmprojError(f"{p}: tensor {fc}: missing")
    tower = VisionTower(
        projector=kind, image_size_px=int(key("clip.vision.image_size")),
        patch_px=int(key("clip.vision.patch_size")),
        width=int(key("clip.vision.embedding_length")),
        layers=int(key("clip.vision.block_count")),
        heads=int(key("clip.vision.attention.head_count")),
        eps=float(key("clip.vision.attention.layer_norm_epsilon")),
        mean=tuple(float(v) for v in key("clip.vision.image_mean")),  # type: ignore[arg-type]
        std=tuple(float(v) for v in key("clip.vision.image_std")),  # type: ignore[arg-type]
        gelu=bool(key("clip.use_gelu", False)),
        scale_factor=int(key("clip.vision.projector.scale_factor", 1)) if kind == "idefics3"
        else 1,
        n_embd_out=int(tensors[fc].shape[0]))
    if tower.image_size_px % tower.patch_px or tower.width % tower.heads:
        raise MmprojError(f"{p}: clip.vision.image_size={tower.image_size_px}, patch_size="
                          f"{tower.patch_px}, heads={tower.heads}: not a shape clip can run")
    return tower, tensors


def _layer_norm(g: OnnxGraph, x: str, t: dict[str, np.ndarray], name: str, eps: float) -> str:
    # (N, d) -> (N, d): ggml_norm then * w + b, as one LayerNormalization.
    return g.op("LayerNormalization", [x, g.const(name + ".weight", t[name + ".weight"]),
                                       g.const(name + ".bias", t[name + ".bias"])],
                axis=-1, epsilon=float(eps))


def _dense(g: OnnxGraph, x: str, t: dict[str, np.ndarray], name: str) -> str:
    y = linear_node(g, x, t[name + ".weight"], name)
    bias = t.get(name + ".bias")
    return y if bias is None else g.op("Add", [y, g.const(name + ".bias", bias)])


def _gelu_tanh(g: OnnxGraph, x: str) -> str:
    # ggml_gelu: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    f = lambda v: g.const("c", np.array(v, np.float32))  # noqa: E731
    cube = g.op("Mul", [g.op("Mul", [x, x]), x])
    inner = g.op("Mul", [g.op("Add", [x, g.op("Mul", [cube, f(0.044715)])]), f(_GELU_C)])
    return g.op("Mul", [g.op("Mul", [x, f(0.5)]), g.op("Add", [g.op("Tanh", [inner]), f(1.0)])])


def _gelu_quick(g: OnnxGraph, x: str) -> str:
    # ggml_gelu_quick: x * sigmoid(1.702 x)
    return g.op("Mul", [x, g.op("Sigmoid", [g.op("Mul", [x, g.const(
        "c", np.array(1.702, np.float32))])])])


def _block(g: OnnxGraph, x: str, t: dict[str, np.ndarray], tower: VisionTower, i: int) -> str:
    b = f"v.blk.{i}."
    hd = tower.width // tower.heads
    i64 = lambda *v: np.array(v, np.int64)  # noqa: E731

    def heads(y: str) -> str:
        # (N, d) -> (H, N, hd)
        return g.op("Transpose", [g.op("Reshape", [y, g.const("hshape", i64(-1, tower.heads,
                                                                              hd))])],
                    perm=[1, 0, 2])

    h = _layer_norm(g, x, t, b + "ln1", tower.eps)
    q, k, v = (heads(_dense(g, h, t, b + n)) for n in ("attn_q", "attn_k", "attn_v"))
    scores = g.op("Mul", [g.op("MatMul", [q, g.op("Transpose", [k], perm=[0, 2, 1])]),
                          g.const("kq_scale", np.array(1.0 / math.sqrt(hd), np.float32))])
    a = g.op("MatMul", [g.op("Softmax", [scores], axis=-1), v])    # (H, N, hd)
    a = g.op("Reshape", [g.op("Transpose", [a], perm=[1, 0, 2]),
                         g.const("flat", i64(-1, tower.width))])   # (N, d)
    x = g.op("Add", [x, _dense(g, a, t, b + "attn_out")])
    h = _dense(g, _layer_norm(g, x, t, b + "ln2", tower.eps), t, b + "ffn_up")
    h = _gelu_tanh(g, h) if tower.gelu else _gelu_quick(g, h)
    return g.op("Add", [x, _dense(g, h, t, b + "ffn_down")])


def _pixel_shuffle(g: OnnxGraph, x: str, tower: VisionTower) -> str:
    # transformers' Idefics3Connector.pixel_shuffle on (N, d), n = sqrt(N) patches a side:
    # (n, n, d) -> (n, n/s, d s) -> T -> (n/s, n/s, d s^2) -> T -> (N / s^2, d s^2)
    n, s, d = tower.image_size_px // tower.patch_px, tower.scale_factor, tower.width
    i64 = lambda *v: np.array(v, np.int64)  # noqa: E731
    y = g.op("Reshape", [x, g.const("shuf", i64(n, n // s, d * s))])
    y = g.op("Transpose", [y], perm=[1, 0, 2])
    y = g.op("Reshape", [y, g.const("shuf", i64(n // s, n // s, d * s * s))])
    y = g.op("Transpose", [y], perm=[1, 0, 2])
    return g.op("Reshape", [y, g.const("shuf", i64(-1, d * s * s))])


def _build(tower: VisionTower, t: dict[str, np.ndarray], *, opset: int, doc: str) -> Any:
    from onnx import TensorProto, helper

    g = OnnxGraph(opset)
    i64 = lambda *v: np.array(v, np.int64)  # noqa: E731
    d, n = tower.width, tower.n_patches
    # Patches: Conv (1, 3, S, S) -> (1, d, S/p, S/p) -> (d, N) -> (N, d), rows in raster order.
    x = g.op("Conv", ["pixel_values", g.const("v.patch_embd.weight", t["v.patch_embd.weight"]),
                      g.const("v.patch_embd.bias", t["v.patch_embd.bias"])],
             kernel_shape=[tower.patch_px, tower.patch_px],
             strides=[tower.patch_px, tower.patch_px])
    x = g.op("Transpose", [g.op("Reshape", [x, g.const("dn", i64(d, n))])], perm=[1, 0])
    if "v.class_embd" in t:  # after the patches, as llama.cpp concatenates it
        x = g.op("Concat", [x, g.const("v.class_embd", t["v.class_embd"].reshape(1, d))], axis=0)
    x = g.op("Add", [x, g.const("v.position_embd", t["v.position_embd.weight"])])
    if "v.pre_ln.weight" in t:
        x = _layer_norm(g, x, t, "v.pre_ln", tower.eps)
    # LLaVA (mlp) reads the penultimate layer: llama.cpp runs all blocks but the last.
    n_run = tower.layers - 1 if tower.projector == "mlp" else tower.layers
    for i in range(n_run):
        x = _block(g, x, t, tower, i)
    if "v.post_ln.weight" in t:
        x = _layer_norm(g, x, t, "v.post_ln", tower.eps)
    if tower.projector == "mlp":
        start = 1 if "v.class_embd" in t else 0  # llama.cpp's patch rows are offset by the class
        x = g.op("Slice", [x, g.const("start", i64(start)), g.const("end", i64(start + n)),
                           g.const("axis", i64(0))])
        x = _gelu_tanh(g, _dense(g, x, t, "mm.0"))
        x = _dense(g, x, t, "mm.2")
    else:
        x = linear_node(g, _pixel_shuffle(g, x, tower), t["mm.model.fc.weight"], "mm.model.fc")
    g.nodes.append(helper.make_node("Identity", [x], ["image_embeds"], name="image_embeds_node"))
    side = tower.image_size_px
    graph = helper.make_graph(
        g.nodes, f"vision_{tower.projector}",
        [helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT, [1, 3, side, side])],
        [helper.make_tensor_value_info("image_embeds", TensorProto.FLOAT,
                                       [tower.n_tokens, tower.n_embd_out])],
        initializer=g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="robot_latency", doc_string=doc)
    model.ir_version = IR_FOR_OPSET[opset]
    return model


def export_vision_onnx(mmproj_path: str | Path, out_path: str | Path, *,
                       opset: int = 17) -> Path:
    """Write the mmproj at ``mmproj_path`` as an ONNX vision tower + projector at ``out_path``.

    Args:
        mmproj_path: the mmproj GGUF (``mlp`` or ``idefics3``; F32/F16 tensors).
        out_path: the ``.onnx`` file to write (weights inside it).
        opset: ONNX opset, 17 to 21.

    Returns:
        The path written.

    Raises:
        MmprojError: the mmproj cannot be read or exported, or a bad opset.
    """
    if opset not in SUPPORTED_OPSETS:
        raise MmprojError(f"opset={opset}: supported {SUPPORTED_OPSETS.start}.."
                          f"{SUPPORTED_OPSETS.stop - 1}")
    src, out = Path(mmproj_path), Path(out_path)
    tower, tensors = read_tower(src)
    missing = [k for k in ("v.patch_embd.weight", "v.patch_embd.bias",
                           "v.position_embd.weight") if k not in tensors]
    if missing:
        raise MmprojError(f"{src}: tensor {missing[0]}: missing")
    doc = (f"{tower.projector} vision tower from {src.name}: {tower.layers} blocks, width "
           f"{tower.width}, {tower.image_size_px} px, {tower.n_tokens} tokens to width "
           f"{tower.n_embd_out}")
    try:
        model = _build(tower, tensors, opset=opset, doc=doc)
    except KeyError as exc:
        raise MmprojError(f"{src}: tensor {exc.args[0]}: missing") from None
    out.parent.mkdir(parents=True, exist_ok=True)
    save_onnx(model, out, external=False)
    log.info("wrote %s (%d bytes) from %s", out, out.stat().st_size, src)
    return out
