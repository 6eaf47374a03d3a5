"""The command streams shipped in `robot_latency/data/streams/`: what they are, how to remake them.

The texts come from the caller (the demo corpus); the specs fix everything else, so that the
same texts always give the same bags.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from robot_latency.streams.arrivals import make_stream_file

#: Where the shipped streams live inside the package.
SHIPPED_DIR = Path(__file__).resolve().parent.parent / "data" / "streams"


@dataclass(frozen=True)
class StreamSpec:
    """One shipped stream: its name (the bag directory), its arrival process and, where
    ``frames_hz`` > 0, a camera topic (:mod:`robot_latency.streams.scene`'s table scenes)."""

    name: str
    process: str
    rate_hz: float
    seed: int
    n_commands: int
    burst_size: int = 5
    burst_gap_s: float | None = None
    frames_hz: float = 0.0


SHIPPED_STREAMS: tuple[StreamSpec, ...] = (
    # An operator giving a command every two seconds or so, at random.
    StreamSpec(name="steady_operator", process="poisson", rate_hz=0.5, seed=1, n_commands=60),
    # The same mean pace in bursts of five quick commands with long pauses between.
    StreamSpec(name="bursty_operator", process="bursty", rate_hz=0.5, seed=2, n_commands=60),
    # The steady pace with a camera: a 128x96 PNG table scene at 2 Hz on
    # /camera/image/compressed, for a planner that sees (docs/VISION.md).
    StreamSpec(name="camera_operator", process="poisson", rate_hz=0.5, seed=3, n_commands=30,
               frames_hz=2.0),
)


def pick_texts(texts: Sequence[str], n: int, *, seed: int) -> list[str]:
    """Draw ``n`` texts, each from the shorter or the longer half of ``texts`` with equal odds.

    Raises:
        ValueError: ``texts`` is empty.
    """
    if not texts:
        raise ValueError("need at least one command text to pick from")
    by_length = sorted(texts, key=len)
    half = max(1, len(by_length) // 2)
    short, long = by_length[:half], by_length[half:] or by_length[:half]
    rng = np.random.default_rng(seed)
    picked = []
    for _ in range(n):
        pool = short if rng.random() < 0.5 else long
        picked.append(pool[int(rng.integers(len(pool)))])
    return picked


def make_shipped_streams(
    out_dir: Path | str,
    texts: Sequence[str],
    *,
    specs: Sequence[StreamSpec] = SHIPPED_STREAMS,
    storage: str = "mcap",
) -> list[Path]:
    """Write one rosbag2 bag per spec into ``out_dir`` (each bag directory must not exist yet).

    Args:
        out_dir: Directory to write the bags into (created if missing).
        texts: Pool of command texts; each stream draws a short/long mix from it.
        specs: Streams to make.
        storage: ``"mcap"`` or ``"sqlite3"``.

    Returns:
        The bag directories, in spec order.

    Raises:
        StreamError: A bag cannot be written (e.g. it exists already).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return [
        make_stream_file(
            out_dir / spec.name,
            pick_texts(texts, spec.n_commands, seed=spec.seed),
            process=spec.process,
            rate_hz=spec.rate_hz,
            seed=spec.seed,
            storage=storage,
            burst_size=spec.burst_size,
            burst_gap_s=spec.burst_gap_s,
            frames_hz=spec.frames_hz,
        )
        for spec in specs
    ]
