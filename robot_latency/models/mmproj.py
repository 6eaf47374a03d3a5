"""Vision encoders for llama.cpp's ``libmtmd``: an ``mmproj`` GGUF in the shapes robots use.

An ``mmproj`` is the second file a vision-language model needs beside the language model's GGUF:
a ViT (``v.*`` tensors) and a projector (``mm.*``) that maps its patches to the language model's
embedding width, with ``clip.*`` keys saying how. This module writes one with the ``gguf``
package, in the names and keys that the llama.cpp of llama-cpp-python 0.3.36 loads
(``vendor/llama.cpp/tools/mtmd/clip-impl.h`` and ``clip.cpp`` of its sdist):

- ``mlp`` (LLaVA-1.5): a CLIP ViT with a class token and a pre-layernorm, then ``mm.0`` -> GELU
  -> ``mm.2``. llama.cpp runs all but the last block (LLaVA reads the penultimate layer) and
  drops the class token: ``(image_size / patch) ** 2`` image tokens (576 at 336 px, patch 14).
- ``idefics3`` (SmolVLM): a SigLIP ViT with a post-layernorm, then a pixel shuffle of
  ``scale_factor`` x ``scale_factor`` patches into one, then ``mm.model.fc``:
  ``(image_size / patch / scale_factor) ** 2`` tokens per tile (64 at 512 px, patch 16,
  scale 4). llama.cpp's idefics3 preprocessing always adds a global view to the tiles, so a
  frame of one tile is two image chunks (the view, then the tile).

The weights are NOT trained unless given (``tensors=``): random normal (std 0.02), unit
layernorms, zero biases, enough for the encode and the image tokens' prefill to take their real
time; a frame's embeddings carry no meaning. Trained weights come from
:mod:`robot_latency.models.vision_tower` (the ``mlp`` tower in torch).

The input resolution is a setting (:func:`at_resolution`): it sets the position table's length
and so the number of image tokens.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from robot_latency.errors import RobotLatencyError

log = logging.getLogger(__name__)

#: The projector types written here (``clip.projector_type``).
PROJECTORS = ("mlp", "idefics3")
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
SIGLIP_MEAN = SIGLIP_STD = (0.5, 0.5, 0.5)
#: The std of the untrained weights: small, so activations stay finite in f16.
WEIGHT_STD = 0.02


class MmprojError(RobotLatencyError, ValueError):
    """A vision tower that cannot be written or used: a bad shape, resolution or file."""


@dataclass(frozen=True)
class TowerShape:
    """A vision tower and its projector.

    Args:
        name: the key in :data:`SHAPES`.
        projector: ``mlp`` or ``idefics3`` (:data:`PROJECTORS`).
        image_size_px: the side of the square tile the tower sees.
        patch_px: the side of one patch.
        width: the ViT's hidden width (``clip.vision.embedding_length``).
        ffn: the ViT's feed-forward width.
        layers: the ViT's blocks.
        heads: attention heads.
        scale_factor: the pixel shuffle's side (idefics3); 1 for none.
        class_token: a class embedding before the patches (CLIP).
        pre_ln: a layernorm before the blocks (CLIP).
        post_ln: a layernorm after the blocks (SigLIP).
        gelu: exact GELU in the blocks (SigLIP); False is CLIP's quick GELU.
        eps: the layernorms' epsilon.
        mean: per-channel mean the frame is normalized with.
        std: per-channel std.
        source: where the shape comes from.
    """

    name: str
    projector: str
    image_size_px: int
    patch_px: int
    width: int
    ffn: int
    layers: int
    heads: int
    scale_factor: int = 1
    class_token: bool = False
    pre_ln: bool = False
    post_ln: bool = False
    gelu: bool = False
    eps: float = 1e-5
    mean: tuple[float, float, float] = CLIP_MEAN
    std: tuple[float, float, float] = CLIP_STD
    source: str = ""

    @property
    def patches_per_side(self) -> int:
        return self.image_size_px // self.patch_px

    @property
    def tokens_per_tile(self) -> int:
        """Image tokens one tile gives the language model."""
        side = self.patches_per_side // self.scale_factor
        return side * side

    @property
    def n_positions(self) -> int:
        return self.patches_per_side ** 2 + (1 if self.class_token else 0)

    @property
    def params(self) -> int:
        """The ViT's parameters (blocks, patch and position embeddings), not the projector's."""
        block = 4 * self.width * self.width + 2 * self.width * self.ffn
        return (self.layers * block + 3 * self.patch_px ** 2 * self.width
                + self.n_positions * self.width)

    def check(self) -> None:
        """Raise :class:`MmprojError` naming the field that llama.cpp could not use."""
        if self.projector not in PROJECTORS:
            raise MmprojError(f"{self.name}: projector={self.projector!r}: must be one of "
                              f"{PROJECTORS}")
        if self.patch_px <= 0 or self.image_size_px % self.patch_px:
            raise MmprojError(f"{self.name}: image_size_px={self.image_size_px}: must be a "
                              f"multiple of patch_px={self.patch_px}")
        if self.scale_factor < 1 or self.patches_per_side % self.scale_factor:
            raise MmprojError(f"{self.name}: image_size_px={self.image_size_px}: "
                              f"{self.patches_per_side} patches a side is not a multiple of "
                              f"scale_factor={self.scale_factor}")
        if self.projector == "mlp" and self.scale_factor != 1:
            raise MmprojError(f"{self.name}: scale_factor={self.scale_factor}: the mlp "
                              "projector has no pixel shuffle")
        if self.heads <= 0 or self.width % self.heads:
            raise MmprojError(f"{self.name}: width={self.width}: not a multiple of "
                              f"heads={self.heads}")


#: The shapes. Real ones from the model cards; tiny ones for the tests.
SHAPES: dict[str, TowerShape] = {s.name: s for s in (
    TowerShape("clip-l14-336", "mlp", 336, 14, 1024, 4096, 24, 16, class_token=True,
               pre_ln=True, source="LLaVA-1.5: CLIP ViT-L/14 at 336 px, 2-layer MLP projector "
               "(576 tokens)"),
    TowerShape("siglip-b16-512", "idefics3", 512, 16, 768, 3072, 12, 12, scale_factor=4,
               post_ln=True, gelu=True, eps=1e-6, mean=SIGLIP_MEAN, std=SIGLIP_STD,
               source="SmolVLM-256M/500M: SigLIP-base/16 at 512 px, 4x pixel shuffle "
               "(64 tokens per tile)"),
    TowerShape("tiny-mlp", "mlp", 64, 16, 32, 64, 2, 2, class_token=True, pre_ln=True,
               source="tests: 16 tokens"),
    TowerShape("tiny-shuffle", "idefics3", 128, 8, 32, 64, 2, 2, scale_factor=4,
               post_ln=True, gelu=True, eps=1e-6, mean=SIGLIP_MEAN, std=SIGLIP_STD,
               source="tests: 16 tokens per tile"),
)}
REAL_SHAPES = ("clip-l14-336", "siglip-b16-512")


def tower_shape(name: str) -> TowerShape:
    """The shape called ``name`` in :data:`SHAPES`."""
    try:
        return SHAPES[name]
    except KeyError:
        raise MmprojError(f"tower={name!r}: must be one of {sorted(SHAPES)}") from None


def at_resolution(shape: TowerShape, image_size_px: int) -> TowerShape:
    """``shape`` seeing ``image_size_px`` tiles (the position table grows or shrinks with it)."""
    out = dataclasses.replace(shape, image_size_px=int(image_size_px))
    out.check()
    return out


def gguf_field(path: str | Path, key: str) -> Any:
    """The value of ``key`` in the GGUF at ``path``, or None where it has none.

    Raises:
        MmprojError: no file at ``path``, or not a GGUF.
    """
    field = open_gguf(path).fields.get(key)
    return None if field is None else field.contents()


def open_gguf(path: str | Path) -> Any:
    """The ``gguf.GGUFReader`` of the file at ``path``.

    Raises:
        MmprojError: no file at ``path``, or not a GGUF.
    """
    from robot_latency.floor.gguf_reader import GGUFReader

    p = Path(path)
    if not p.is_file():
        raise MmprojError(f"{p}: no such file")
    try:
        return GGUFReader(str(p))
    except Exception as exc:  # the reader raises several types for a bad file
        why = " ".join(str(exc).split())
        raise MmprojError(f"{p}: not a GGUF ({type(exc).__name__}: {why})") from None


def lm_embedding_width(lm_path: str | Path) -> int:
    """The language model's embedding width (``<arch>.embedding_length`` in its GGUF)."""
    arch = gguf_field(lm_path, "general.architecture")
    if not arch:
        raise MmprojError(f"{lm_path}: general.architecture: missing")
    width = gguf_field(lm_path, f"{arch}.embedding_length")
    if not width:
        raise MmprojError(f"{lm_path}: {arch}.embedding_length: missing")
    return int(width)


def mmproj_output_width(mmproj_path: str | Path) -> int:
    """The width the projector gives the language model, read from the mmproj's tensors."""
    from robot_latency.floor.gguf_reader import GGUFReader

    gguf_field(mmproj_path, "general.architecture")  # names the file when it is missing or bad
    reader = GGUFReader(str(mmproj_path))
    proj = reader.fields.get("clip.projector_type")
    kind = proj.contents() if proj is not None else None
    name = {"mlp": "mm.2.weight", "idefics3": "mm.model.fc.weight"}.get(kind or "")
    if name is None:
        raise MmprojError(f"{mmproj_path}: clip.projector_type={kind!r}: must be one of "
                          f"{PROJECTORS}")
    for tensor in reader.tensors:
        if tensor.name == name:
            return int(tensor.shape[1])  # gguf order: (in, out)
    raise MmprojError(f"{mmproj_path}: tensor {name}: missing")


def _tensors(shape: TowerShape, n_embd_out: int, rng: np.random.Generator
             ) -> list[tuple[str, np.ndarray]]:
    """The tensors, in the row-major shapes the converter writes (a linear is (out, in))."""

    def w(*dims: int) -> np.ndarray:
        return (rng.standard_normal(dims, dtype=np.float32) * WEIGHT_STD).astype(np.float16)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    def zeros(n: int) -> np.ndarray:
        return np.zeros(n, dtype=np.float32)

    d, p = shape.width, shape.patch_px
    out: list[tuple[str, np.ndarray]] = [
        ("v.patch_embd.weight", w(d, 3, p, p)),
        ("v.patch_embd.bias", zeros(d)),
        # f32: SigLIP's graph adds the table to the patches as it is (no f16 + f32 add on CPU)
        ("v.position_embd.weight", w(shape.n_positions, d).astype(np.float32)),
    ]
    if shape.class_token:
        out.append(("v.class_embd", (rng.standard_normal(d, dtype=np.float32) * WEIGHT_STD)))
    if shape.pre_ln:
        out += [("v.pre_ln.weight", ones(d)), ("v.pre_ln.bias", zeros(d))]
    for i in range(shape.layers):
        b = f"v.blk.{i}"
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            out += [(f"{b}.{name}.weight", w(d, d)), (f"{b}.{name}.bias", zeros(d))]
        out += [(f"{b}.ln1.weight", ones(d)), (f"{b}.ln1.bias", zeros(d)),
                (f"{b}.ln2.weight", ones(d)), (f"{b}.ln2.bias", zeros(d)),
                (f"{b}.ffn_up.weight", w(shape.ffn, d)), (f"{b}.ffn_up.bias", zeros(shape.ffn)),
                (f"{b}.ffn_down.weight", w(d, shape.ffn)), (f"{b}.ffn_down.bias", zeros(d))]
    if shape.post_ln:
        out += [("v.post_ln.weight", ones(d)), ("v.post_ln.bias", zeros(d))]
    if shape.projector == "mlp":
        out += [("mm.0.weight", w(n_embd_out, d)), ("mm.0.bias", zeros(n_embd_out)),
                ("mm.2.weight", w(n_embd_out, n_embd_out)), ("mm.2.bias", zeros(n_embd_out))]
    else:
        out.append(("mm.model.fc.weight", w(n_embd_out, d * shape.scale_factor ** 2)))
    return out


def write_mmproj(shape: TowerShape, out_path: str | Path, *, lm_path: str | Path | None = None,
                 n_embd_out: int | None = None, seed: int = 0,
                 tensors: Mapping[str, np.ndarray] | None = None,
                 title: str | None = None) -> Path:
    """Write ``shape`` as an mmproj GGUF at ``out_path`` (untrained weights: see the module).

    Args:
        shape: the tower and projector.
        out_path: where to write.
        lm_path: the language model it is for; its embedding width is the projector's output.
        n_embd_out: that width given directly (one of ``lm_path`` and ``n_embd_out``).
        seed: the weights' seed.
        tensors: trained weights instead of random ones, by tensor name, in the shapes and
            dtypes the random ones have (a trained seeing planner's tower).
        title: ``general.name`` (default: the shape's name, untrained).

    Raises:
        MmprojError: a shape llama.cpp cannot load, or no width to project to.
    """
    import gguf

    shape.check()
    if (lm_path is None) == (n_embd_out is None):
        raise MmprojError("write_mmproj: give one of lm_path and n_embd_out")
    width = lm_embedding_width(lm_path) if lm_path is not None else int(n_embd_out or 0)
    if width <= 0:
        raise MmprojError(f"n_embd_out={n_embd_out}: must be > 0")
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".part")
    writer = gguf.GGUFWriter(str(tmp), arch="clip")
    writer.add_name(title or f"{shape.name} (untrained, for timing)")
    writer.add_description(shape.source)
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_string("clip.projector_type", shape.projector)
    writer.add_uint32("clip.vision.image_size", shape.image_size_px)
    writer.add_uint32("clip.vision.patch_size", shape.patch_px)
    writer.add_uint32("clip.vision.embedding_length", shape.width)
    writer.add_uint32("clip.vision.feed_forward_length", shape.ffn)
    writer.add_uint32("clip.vision.block_count", shape.layers)
    writer.add_uint32("clip.vision.projection_dim", width)
    writer.add_uint32("clip.vision.attention.head_count", shape.heads)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", shape.eps)
    writer.add_array("clip.vision.image_mean", [float(v) for v in shape.mean])
    writer.add_array("clip.vision.image_std", [float(v) for v in shape.std])
    if shape.gelu:
        writer.add_bool("clip.use_gelu", True)
    if shape.projector == "idefics3":
        writer.add_uint32("clip.vision.projector.scale_factor", shape.scale_factor)
    rng = np.random.default_rng(seed)
    for name, data in _tensors(shape, width, rng):
        if tensors is not None:
            if name not in tensors:
                raise MmprojError(f"{out}: tensor {name}: missing from the trained weights")
            if tuple(tensors[name].shape) != data.shape:
                raise MmprojError(f"{out}: tensor {name}: shape {tuple(tensors[name].shape)}, "
                                  f"expected {data.shape}")
            data = np.asarray(tensors[name], dtype=data.dtype)
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(out)
    log.info("mmproj %s (%s, %d px, %d tokens per tile, to width %d) -> %s", shape.name,
             shape.projector, shape.image_size_px, shape.tokens_per_tile, width, out)
    return out
