"""Synthetic camera frames: a small table seen from above with coloured objects on it, one PNG per
frame (``robot-latency streams make --frames-hz N``).

Each frame is drawn from its own seed (the stream's seed and the frame's index), so the same
stream always gets the same frames; the objects are the vocabulary's colours and shapes
(:data:`robot_latency.profiles.actions.COLORS`), placed at random on the table. Pillow comes
with matplotlib, a dependency already; it is imported when a frame is drawn.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np

from robot_latency.profiles.actions import COLORS
from robot_latency.streams.frames import COMPRESSED_TYPE, Frame

#: Frame size (pixels): small, so a bag with frames stays small.
WIDTH, HEIGHT = 128, 96

#: Colour name -> RGB.
RGB = {"red": (220, 40, 40), "blue": (40, 80, 220), "green": (40, 170, 60),
       "yellow": (235, 215, 40), "black": (20, 20, 20), "white": (245, 245, 245),
       "orange": (245, 140, 30), "purple": (140, 50, 170)}
TABLE_RGB, FLOOR_RGB = (150, 105, 60), (90, 90, 100)


def render_scene(seed: int, *, width: int = WIDTH, height: int = HEIGHT,
                 n_objects: int = 3) -> bytes:
    """Draw one scene (a table, ``n_objects`` coloured discs and boxes on it) as PNG bytes."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    img = Image.new("RGB", (width, height), FLOOR_RGB)
    draw = ImageDraw.Draw(img)
    mx, my = width // 10, height // 8
    draw.rectangle((mx, my, width - mx, height - my), fill=TABLE_RGB)
    size = max(4, min(width, height) // 8)
    for _ in range(n_objects):
        color = RGB[COLORS[int(rng.integers(len(COLORS)))]]
        x = int(rng.integers(mx + size, width - mx - size))
        y = int(rng.integers(my + size, height - my - size))
        box = (x - size // 2, y - size // 2, x + size // 2, y + size // 2)
        if rng.random() < 0.5:
            draw.ellipse(box, fill=color, outline=(0, 0, 0))
        else:
            draw.rectangle(box, fill=color, outline=(0, 0, 0))
    out = io.BytesIO()
    img.save(out, format="PNG", optimize=True)
    return out.getvalue()


def scene_frames(times_ns: Sequence[int], *, seed: int) -> tuple[Frame, ...]:
    """One synthetic PNG frame per time (ns from the stream start), each drawn from
    ``seed * 1_000_003 + index``."""
    frames = []
    for index, t_ns in enumerate(times_ns):
        data = render_scene(seed * 1_000_003 + index)
        frames.append(Frame(t_ns=int(t_ns), topic="", stamp_ns=int(t_ns),
                            msgtype=COMPRESSED_TYPE, encoding="png", width=WIDTH,
                            height=HEIGHT, size_bytes=len(data), frame_id="camera", data=data))
    return tuple(frames)


def frame_times_ns(span_ns: int, frames_hz: float) -> list[int]:
    """Frame times at ``frames_hz`` from 0 through ``span_ns`` (at least one frame, at 0)."""
    if not frames_hz > 0:
        raise ValueError(f"frames_hz must be > 0, got {frames_hz}")
    step = 1e9 / frames_hz
    return [round(i * step) for i in range(int(span_ns // step) + 1)]
