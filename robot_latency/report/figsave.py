"""Where every report plot is written: one PNG, its folder made, at one resolution."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

#: Dots per inch of every report plot.
PLOT_DPI = 110


def save_png(fig: Any, path: str | os.PathLike[str]) -> Path:
    """Write a matplotlib figure as a PNG at ``path`` (its folder made); return the path."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(p, format="png", dpi=PLOT_DPI, bbox_inches="tight")
    return p
