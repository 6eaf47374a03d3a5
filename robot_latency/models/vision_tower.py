"""The ``mlp`` (LLaVA-1.5) vision tower and projector in torch, as llama.cpp's clip computes it.

:class:`SeeingTower` holds exactly the tensors :func:`robot_latency.models.mmproj.write_mmproj`
writes for an ``mlp`` shape (its parameters are named by them) and runs them as llama.cpp's
``clip_graph_llava`` does (the same quirks as :mod:`robot_latency.models.vision_onnx`): the patch
convolution, the class embedding concatenated *after* the patches, the position table added, the
pre-layernorm, all blocks but the last, then rows ``1 .. n_patches`` (the class row kept, the
first patch's dropped), then ``mm.0`` -> GELU (tanh form) -> ``mm.2``. In the blocks: layernorm,
attention (``1/sqrt(head_dim)``, no mask), residual, layernorm, feed-forward with CLIP's quick
GELU, residual.

:func:`write_trained_mmproj` saves its weights through ``write_mmproj`` (same keys, names, dtypes),
so llama.cpp's libmtmd loads the trained tower as it loads an untrained one.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from robot_latency.models.mmproj import TowerShape, _tensors, write_mmproj
from robot_latency.models.vision_onnx import VisionTower

__all__ = ["SEEING_SHAPE", "SeeingTower", "onnx_tower", "write_trained_mmproj"]

log = logging.getLogger(__name__)

#: The seeing planner's tower: 64 px, patch 16 (16 image tokens), 64 wide, 3 blocks (2 run).
SEEING_SHAPE = TowerShape("seeing-mlp", "mlp", 64, 16, 64, 128, 3, 4, class_token=True,
                          pre_ln=True, source="the seeing JSON planner's trained tower "
                          "(16 tokens)")


def _key(name: str) -> str:
    return name.replace(".", "__")  # a ParameterDict key cannot hold a dot


def onnx_tower(shape: TowerShape, n_embd_out: int) -> VisionTower:
    """The preprocessing's view of ``shape`` (as :func:`vision_onnx.read_tower` reads it)."""
    return VisionTower(projector=shape.projector, image_size_px=shape.image_size_px,
                       patch_px=shape.patch_px, width=shape.width, layers=shape.layers,
                       heads=shape.heads, eps=shape.eps, mean=shape.mean, std=shape.std,
                       gelu=shape.gelu, scale_factor=shape.scale_factor, n_embd_out=n_embd_out)


class SeeingTower(nn.Module):
    """An ``mlp`` tower + projector whose parameters are the mmproj's tensors.

    Args:
        shape: an ``mlp`` shape with a class token and a pre-layernorm.
        n_embd_out: the language model's width.
        seed: the initial (untrained) weights' seed, drawn as ``write_mmproj`` draws them.
    """

    def __init__(self, shape: TowerShape, n_embd_out: int, *, seed: int = 0) -> None:
        super().__init__()
        shape.check()
        if shape.projector != "mlp" or not shape.class_token or not shape.pre_ln:
            raise ValueError(f"{shape.name}: SeeingTower runs the mlp projector with a class "
                             "token and a pre-layernorm")
        self.shape, self.n_embd_out = shape, int(n_embd_out)
        init = _tensors(shape, self.n_embd_out, np.random.default_rng(seed))
        self.names = [name for name, _ in init]
        self.p = nn.ParameterDict({_key(n): nn.Parameter(torch.from_numpy(
            a.astype(np.float32))) for n, a in init})

    @classmethod
    def from_tensors(cls, shape: TowerShape, tensors: dict[str, np.ndarray]) -> SeeingTower:
        """A tower holding ``tensors`` (float arrays named as in the mmproj)."""
        tower = cls(shape, int(tensors["mm.2.weight"].shape[0]))
        with torch.no_grad():
            for name in tower.names:
                tower.p[_key(name)].copy_(torch.from_numpy(np.asarray(tensors[name],
                                                                      np.float32)))
        return tower

    def w(self, name: str) -> torch.Tensor:
        return self.p[_key(name)]

    def _ln(self, x: torch.Tensor, name: str) -> torch.Tensor:
        d = self.shape.width
        return F.layer_norm(x, (d,), self.w(name + ".weight"), self.w(name + ".bias"),
                            self.shape.eps)

    def _dense(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return F.linear(x, self.w(name + ".weight"), self.w(name + ".bias"))

    def _block(self, x: torch.Tensor, i: int) -> torch.Tensor:
        b, t, d = x.shape
        nh = self.shape.heads
        hd = d // nh
        pre = f"v.blk.{i}."
        h = self._ln(x, pre + "ln1")
        q, k, v = (self._dense(h, pre + n).view(b, t, nh, hd).transpose(1, 2)  # (B, nh, T, hd)
                   for n in ("attn_q", "attn_k", "attn_v"))
        a = F.scaled_dot_product_attention(q, k, v, scale=1.0 / math.sqrt(hd))
        x = x + self._dense(a.transpose(1, 2).reshape(b, t, d), pre + "attn_out")
        h = self._dense(self._ln(x, pre + "ln2"), pre + "ffn_up")
        h = h * torch.sigmoid(1.702 * h)  # CLIP's quick GELU (ggml_gelu_quick)
        return x + self._dense(h, pre + "ffn_down")

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """Image embeddings ``(B, N, E)`` of normalized pixels ``(B, 3, S, S)``."""
        b = pixels.shape[0]
        s = self.shape
        n = s.patches_per_side ** 2
        x = F.conv2d(pixels, self.w("v.patch_embd.weight"), self.w("v.patch_embd.bias"),
                     stride=s.patch_px)                      # (B, d, S/p, S/p)
        x = x.flatten(2).transpose(1, 2)                     # (B, N, d), raster order
        cls = self.w("v.class_embd").view(1, 1, -1).expand(b, 1, -1)
        x = torch.cat((x, cls), dim=1) + self.w("v.position_embd.weight")  # class row last
        x = self._ln(x, "v.pre_ln")
        for i in range(s.layers - 1):  # LLaVA reads the penultimate layer
            x = self._block(x, i)
        x = x[:, 1:1 + n]  # llama.cpp's patch rows are offset by one: class row in, patch 0 out
        x = F.gelu(self._dense(x, "mm.0"), approximate="tanh")
        return self._dense(x, "mm.2")

    def gguf_tensors(self) -> dict[str, np.ndarray]:
        """The weights by mmproj tensor name (float32; the writer stores each in its dtype)."""
        return {n: self.w(n).detach().float().cpu().numpy() for n in self.names}


def write_trained_mmproj(tower: SeeingTower, out_path: str | Path, *, title: str) -> Path:
    """Write ``tower``'s trained weights as an mmproj GGUF llama.cpp's libmtmd loads."""
    return write_mmproj(tower.shape, out_path, n_embd_out=tower.n_embd_out,
                        tensors=tower.gguf_tensors(), title=title)
