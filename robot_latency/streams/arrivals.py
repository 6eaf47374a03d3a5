"""Arrival processes for synthetic command streams, and writing such streams to disk.

Times are integer ns from the stream start; the first command arrives at 0. Every process is
deterministic under its seed (one :class:`numpy.random.Generator` per call).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from robot_latency.streams.command import Command
from robot_latency.streams.rosbag import DEFAULT_TOPIC, write_bag
from robot_latency.streams.scene import frame_times_ns, scene_frames

#: Mean gap inside a burst, as a fraction of the mean gap 1/rate, when burst_gap_s is not given.
BURST_INNER_FRACTION = 0.1


def _periodic(n: int, rate_hz: float, rng: np.random.Generator, **_: object) -> np.ndarray:
    del rng
    return np.full(n - 1, 1.0 / rate_hz)


def _poisson(n: int, rate_hz: float, rng: np.random.Generator, **_: object) -> np.ndarray:
    return rng.exponential(1.0 / rate_hz, size=n - 1)


def _bursty(
    n: int,
    rate_hz: float,
    rng: np.random.Generator,
    *,
    burst_size: int,
    burst_gap_s: float | None,
) -> np.ndarray:
    """Gaps (s) of bursts of ``burst_size`` commands separated by quiet gaps, mean rate ``rate_hz``.

    One burst cycle spans burst_size mean gaps: (burst_size - 1) short gaps inside the burst and
    one quiet gap. Both are exponential, so the mean rate is rate_hz and the gaps vary far more
    than a Poisson process's (coefficient of variation > 1).
    """
    if burst_size < 2:
        raise ValueError(f"burst_size must be >= 2 for a bursty process, got {burst_size}")
    cycle_s = burst_size / rate_hz  # mean length of one burst plus its quiet gap
    if burst_gap_s is None:
        inner_s = BURST_INNER_FRACTION / rate_hz
        quiet_s = cycle_s - (burst_size - 1) * inner_s
    else:
        if not (math.isfinite(burst_gap_s) and 0 < burst_gap_s < cycle_s):
            raise ValueError(
                f"burst_gap_s must be in (0, burst_size / rate_hz = {cycle_s:g}) s to keep the "
                f"mean rate, got {burst_gap_s}"
            )
        quiet_s = burst_gap_s
        inner_s = (cycle_s - quiet_s) / (burst_size - 1)
    # Gap i follows command i; it ends a burst when command i is the last of its burst.
    ends_burst = (np.arange(n - 1) % burst_size) == burst_size - 1
    means = np.where(ends_burst, quiet_s, inner_s)
    return rng.exponential(means)


#: Process name -> gap sampler returning n - 1 gaps in seconds.
PROCESSES: dict[str, Callable[..., np.ndarray]] = {
    "periodic": _periodic,
    "poisson": _poisson,
    "bursty": _bursty,
}


def arrival_times_ns(
    n: int,
    *,
    process: str,
    rate_hz: float,
    seed: int,
    burst_size: int = 5,
    burst_gap_s: float | None = None,
) -> list[int]:
    """Draw ``n`` arrival times (ns, first at 0, non-decreasing) from an arrival process.

    Args:
        n: Number of arrivals.
        process: ``"periodic"`` (exactly 1/rate apart), ``"poisson"`` (exponential gaps) or
            ``"bursty"`` (clusters of ``burst_size`` close commands separated by quiet gaps).
        rate_hz: Mean arrival rate.
        seed: Seed of the random generator; same seed, same times.
        burst_size: Commands per burst (bursty only).
        burst_gap_s: Mean quiet gap between bursts (bursty only); by default set so that
            in-burst gaps average 0.1 / rate_hz.

    Returns:
        The arrival times in ns.

    Raises:
        ValueError: Unknown process or an out-of-range parameter.
    """
    if process not in PROCESSES:
        raise ValueError(
            f"Unknown arrival process {process!r}; expected one of {sorted(PROCESSES)}"
        )
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not (math.isfinite(rate_hz) and rate_hz > 0):
        raise ValueError(f"rate_hz must be a positive number, got {rate_hz}")
    if n == 0:
        return []
    rng = np.random.default_rng(seed)
    gaps_s = PROCESSES[process](n, rate_hz, rng, burst_size=burst_size, burst_gap_s=burst_gap_s)
    # Round the cumulative sum, not each gap, so rounding errors do not accumulate; rounding
    # is monotone, so the times stay non-decreasing.
    times_s = np.concatenate(([0.0], np.cumsum(gaps_s)))
    return [int(t) for t in np.rint(times_s * 1e9)]


def make_stream(
    texts: Sequence[str],
    *,
    process: str,
    rate_hz: float,
    seed: int,
    name: str,
    burst_size: int = 5,
    burst_gap_s: float | None = None,
) -> list[Command]:
    """Pair command texts, in order, with arrival times drawn from a process.

    Args:
        texts: Command texts; one command each.
        process: Arrival process (see :func:`arrival_times_ns`).
        rate_hz: Mean arrival rate.
        seed: Random seed.
        name: Stream name; command ids are ``f"{name}:{index}"``.
        burst_size: Commands per burst (bursty only).
        burst_gap_s: Mean quiet gap between bursts (bursty only).

    Returns:
        The commands.
    """
    times = arrival_times_ns(
        len(texts),
        process=process,
        rate_hz=rate_hz,
        seed=seed,
        burst_size=burst_size,
        burst_gap_s=burst_gap_s,
    )
    return [
        Command(t_ns=t_ns, text=text, command_id=f"{name}:{index}")
        for index, (t_ns, text) in enumerate(zip(times, texts, strict=True))
    ]


def make_stream_file(
    path: Path | str,
    texts: Sequence[str],
    *,
    process: str,
    rate_hz: float,
    seed: int,
    storage: str = "mcap",
    topic: str = DEFAULT_TOPIC,
    burst_size: int = 5,
    burst_gap_s: float | None = None,
    frames_hz: float = 0.0,
) -> Path:
    """Make a synthetic command stream and write it as a new rosbag2 directory.

    The stream name (and so the command ids) is the directory name.

    Args:
        path: Bag directory to create; must not exist.
        texts: Command texts, in order.
        process: Arrival process (see :func:`arrival_times_ns`).
        rate_hz: Mean arrival rate.
        seed: Random seed.
        storage: ``"mcap"`` or ``"sqlite3"``.
        topic: Topic of the ``std_msgs/msg/String`` commands.
        burst_size: Commands per burst (bursty only).
        burst_gap_s: Mean quiet gap between bursts (bursty only).
        frames_hz: Also write a synthetic camera frame (a 128x96 PNG table scene,
            :mod:`robot_latency.streams.scene`) at this rate from the first command through the
            last, on ``/camera/image/compressed``; 0: none.

    Returns:
        The bag directory.

    Raises:
        StreamError: The bag cannot be written (e.g. the path exists).
        ValueError: Unknown process or storage, or a parameter out of range.
    """
    path = Path(path)
    commands = make_stream(
        texts,
        process=process,
        rate_hz=rate_hz,
        seed=seed,
        name=path.name,
        burst_size=burst_size,
        burst_gap_s=burst_gap_s,
    )
    frames = () if not frames_hz or not commands else scene_frames(
        frame_times_ns(commands[-1].t_ns, frames_hz), seed=seed)
    return write_bag(path, commands, topic=topic, storage=storage, frames=frames)
