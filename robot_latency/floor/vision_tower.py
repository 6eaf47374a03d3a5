"""A vision tower's shape and FLOPs, from its ``clip.*`` keys (an mmproj GGUF) or given.

A tower's FLOPs per image chunk count every matmul of the passes llama.cpp runs
(``tools/mtmd/models/llava.cpp``, ``siglip.cpp`` of llama-cpp-python 0.3.36's sdist):

- the patch embedding, ``2 * 3 * patch^2 * width`` per patch;
- each block run, ``2 * positions * (4 * width^2 + 2 * width * ffn)`` for the linears plus
  ``4 * positions^2 * width`` for attention (Q K^T and the weighted sum of V);
- the projector: ``mlp`` ``2 * tokens * (width * E + E * E)``, ``idefics3``
  ``2 * tokens * width * scale^2 * E`` (E the language model's width, ``projection_dim``).

``mlp`` (LLaVA) runs all blocks but the last, with a class token; ``idefics3`` (SmolVLM) runs all
of them, once for the global view and once per tile.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, replace
from typing import Any

from robot_latency.floor.errors import FloorError

__all__ = ["DEFAULT_FRAME_PX", "VISION_PROJECTORS", "VisionTower", "tower_from_mmproj"]

#: Projector types whose passes this module counts (the ones the project writes and times).
VISION_PROJECTORS = ("mlp", "idefics3")
#: The camera frame a prediction assumes unless told (the bench's rendered scenes).
DEFAULT_FRAME_PX = (640, 480)


def tile_grid(width_px: int, height_px: int, tile_px: int) -> tuple[int, int]:
    """idefics3's tiles across and down for a frame, as this llama.cpp cuts it (an mmproj without
    ``clip.vision.preproc_image_size``): each side over the tile, rounded half up
    (``std::round``), at least one."""
    return (max(1, math.floor(width_px / tile_px + 0.5)),
            max(1, math.floor(height_px / tile_px + 0.5)))


@dataclass(frozen=True)
class VisionTower:
    """A vision tower and its projector, as the FLOPs count needs them.

    Args:
        name: what to call it (a shape id, or the mmproj's file name).
        projector: ``mlp`` or ``idefics3``.
        image_size_px: the side of the square tile the tower sees.
        patch_px: the side of one patch.
        width: the ViT's hidden width.
        ffn: the ViT's feed-forward width.
        layers: the ViT's blocks (all of them; ``layers_run`` says how many a pass runs).
        projection_dim: the width the projector gives the language model.
        scale_factor: the pixel shuffle's side (idefics3); 1 for none.
        class_token: a class embedding before the patches.
    """

    name: str
    projector: str
    image_size_px: int
    patch_px: int
    width: int
    ffn: int
    layers: int
    projection_dim: int
    scale_factor: int = 1
    class_token: bool = False

    def __post_init__(self) -> None:
        if self.projector not in VISION_PROJECTORS:
            raise FloorError(f"{self.name}: projector_type={self.projector!r}: the vision "
                             f"prediction counts {', '.join(VISION_PROJECTORS)}")
        for key in ("image_size_px", "patch_px", "width", "ffn", "layers", "projection_dim",
                    "scale_factor"):
            if int(getattr(self, key)) <= 0:
                raise FloorError(f"{self.name}: {key}={getattr(self, key)!r}: must be > 0")
        if self.image_size_px % self.patch_px:
            raise FloorError(f"{self.name}: image_size_px={self.image_size_px}: not a multiple "
                             f"of patch_px={self.patch_px}")
        if self.patches_per_side % self.scale_factor:
            raise FloorError(f"{self.name}: image_size_px={self.image_size_px}: "
                             f"{self.patches_per_side} patches a side is not a multiple of "
                             f"scale_factor={self.scale_factor}")

    @property
    def patches_per_side(self) -> int:
        return self.image_size_px // self.patch_px

    @property
    def positions(self) -> int:
        """Rows through each block: the patches, plus the class token."""
        return self.patches_per_side ** 2 + (1 if self.class_token else 0)

    @property
    def tokens_per_chunk(self) -> int:
        """Image tokens one chunk (a tile, or the global view) gives the language model."""
        side = self.patches_per_side // self.scale_factor
        return side * side

    @property
    def layers_run(self) -> int:
        """Blocks a pass runs: LLaVA's mlp reads the penultimate layer, so all but the last."""
        return max(1, self.layers - 1) if self.projector == "mlp" else self.layers

    def at_resolution(self, image_size_px: int) -> VisionTower:
        """This tower seeing ``image_size_px`` tiles (the position table follows)."""
        return replace(self, image_size_px=int(image_size_px))

    def chunks(self, frame_px: tuple[int, int] = DEFAULT_FRAME_PX) -> int:
        """Image chunks a ``(width, height)`` frame gives: one for mlp (resized to the tile);
        for idefics3 the global view plus the tiles of the frame resized to whole tiles, each
        side rounded to the nearest tile (at least one), as llama.cpp's idefics3 preprocessing
        does for an mmproj without ``clip.vision.preproc_image_size``."""
        w, h = frame_px
        if w <= 0 or h <= 0:
            raise FloorError(f"frame {w}x{h}: both sides must be > 0")
        if self.projector == "mlp":
            return 1
        tiles_x, tiles_y = tile_grid(w, h, self.image_size_px)
        return 1 + tiles_x * tiles_y

    def image_tokens(self, frame_px: tuple[int, int] = DEFAULT_FRAME_PX) -> int:
        """Image tokens a frame gives the language model (all chunks)."""
        return self.chunks(frame_px) * self.tokens_per_chunk

    def flops_per_chunk(self) -> int:
        """FLOPs of one chunk's encode: patch embedding, the blocks run, the projector."""
        d, n, e = self.width, self.positions, self.projection_dim
        patches = self.patches_per_side ** 2
        embed = 2 * 3 * self.patch_px ** 2 * d * patches
        block = 2 * n * (4 * d * d + 2 * d * self.ffn) + 4 * n * n * d
        tokens = self.tokens_per_chunk
        if self.projector == "mlp":
            proj = 2 * tokens * (d * e + e * e)
        else:
            proj = 2 * tokens * d * self.scale_factor ** 2 * e
        return embed + self.layers_run * block + proj

    def encode_flops(self, frame_px: tuple[int, int] = DEFAULT_FRAME_PX) -> int:
        """FLOPs of a frame's encode (every chunk)."""
        return self.chunks(frame_px) * self.flops_per_chunk()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def tower_from_mmproj(path: str | os.PathLike[str]) -> VisionTower:
    """Read a tower's shape from an mmproj GGUF's ``clip.*`` keys (and ``v.class_embd``).

    Raises:
        FloorError: no file, not a GGUF, a key missing, or a projector type not counted here
            (each named with the file).
    """
    from robot_latency.floor.gguf_reader import GGUFReader

    p = os.fspath(path)
    if not os.path.isfile(p):
        raise FloorError(f"--mmproj {p}: no such file")
    try:
        reader = GGUFReader(p, "r")
    except Exception as exc:  # the reader raises several types for a bad file
        raise FloorError(f"--mmproj {p}: not a GGUF ({type(exc).__name__})") from None

    def field(key: str, default: Any = None) -> Any:
        f = reader.fields.get(key)
        if f is None:
            if default is None:
                raise FloorError(f"--mmproj {p}: {key}: missing")
            return default
        return f.contents()

    if not field("clip.has_vision_encoder", False):
        raise FloorError(f"--mmproj {p}: clip.has_vision_encoder: no vision encoder")
    kind = field("clip.projector_type", "")
    if kind not in VISION_PROJECTORS:
        raise FloorError(f"--mmproj {p}: clip.projector_type={kind!r}: the vision prediction "
                         f"counts {', '.join(VISION_PROJECTORS)}")
    names = {t.name for t in reader.tensors}
    return VisionTower(
        name=os.path.basename(p), projector=str(kind),
        image_size_px=int(field("clip.vision.image_size")),
        patch_px=int(field("clip.vision.patch_size")),
        width=int(field("clip.vision.embedding_length")),
        ffn=int(field("clip.vision.feed_forward_length")),
        layers=int(field("clip.vision.block_count")),
        projection_dim=int(field("clip.vision.projection_dim")),
        scale_factor=int(field("clip.vision.projector.scale_factor", 1)),
        class_token="v.class_embd" in names)
