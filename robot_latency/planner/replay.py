"""Replay a recorded command stream through a planner run, at the recorded pace or as fast as
possible.

At the recorded pace (``speed`` 1.0, or faster/slower), each command is delivered at its
recorded time from the start of the replay, and latency counts from the *scheduled* time of each
cycle (periodic mode) or command (event mode): a planner that falls behind shows it as queueing
and misses, not as a quietly stretched timeline (no coordinated omission).

As fast as possible (``asap``), each command starts a cycle the moment the previous one is done;
there is no arrival process, so no queueing is measured. Results say which mode produced them.
"""

from __future__ import annotations

import bisect
import logging
import math
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

from robot_latency.planner.config import RunSettings
from robot_latency.planner.lifecycle import PlannerRun
from robot_latency.planner.loop import PlannerLoop, Publisher
from robot_latency.planner.mailbox import InboundCommand
from robot_latency.planner.resolve import ResolvedRun
from robot_latency.profiles.labels import LabelSet, label_schema, stream_labels
from robot_latency.progress import CycleProgress
from robot_latency.streams import CommandStream

log = logging.getLogger(__name__)


def _arrivals(stream: CommandStream, start_ns: int, speed: float) -> list[InboundCommand]:
    return [InboundCommand(c.command_id, c.text, start_ns + round(c.t_ns / speed), c.state)
            for c in stream.commands]


def frame_source(stream: CommandStream, start_ns: int, speed: float,
                 clock: Callable[[], int]) -> Callable[[], tuple[int, int, Any] | None]:
    """The loop's camera for a replayed stream with frames: at each cycle's start, the newest
    frame logged by then at the replay's pace (its recorded stamp, the time it was "taken" on
    the loop's clock, its image keyed by its place in the stream); None before the first."""
    from robot_latency.engines.base import FrameImage
    from robot_latency.engines.llama_image import raw_frame
    from robot_latency.streams.frames import FrameLoader
    from robot_latency.streams.rosbag import typestore

    frames = sorted(stream.frames, key=lambda f: f.t_ns)
    taken = [start_ns + round(f.t_ns / speed) for f in frames]
    loader = FrameLoader(typestore())
    cache: dict[int, Any] = {}

    def newest() -> tuple[int, int, Any] | None:
        i = bisect.bisect_right(taken, clock()) - 1
        if i < 0:
            return None
        if i not in cache:
            cache.clear()
            f, data = frames[i], loader.data(frames[i])
            key = f"{stream.source}#frame{i}"
            cache[i] = FrameImage(key=key, data=data) if f.compressed else raw_frame(
                key, f.encoding, f.width or 0, f.height or 0, f.step, data)
        return frames[i].stamp_ns, taken[i], cache[i]
    return newest


def planned_cycles(config: RunSettings, stream: CommandStream, *, speed: float = 1.0,
                   asap: bool = False, tail_cycles: int = 1) -> int:
    """Return how many cycles a replay of ``stream`` runs: one per command (event mode, asap),
    else the ticks until the last command arrives plus ``tail_cycles``."""
    if not stream.commands:
        return 0
    if asap or config.mode == "event":
        return len(stream.commands)
    last_ns = round(stream.commands[-1].t_ns / speed)
    return math.floor(last_ns / config.period_ns) + 1 + tail_cycles


def replay(loop: PlannerLoop, stream: CommandStream, *, speed: float = 1.0,
           asap: bool = False, tail_cycles: int = 1,
           should_stop: Callable[[], bool] | None = None) -> int:
    """Replay ``stream`` through ``loop``; return the number of cycles recorded.

    Args:
        loop: the planner loop (its config's mode decides periodic or event timing).
        stream: the commands with their recorded arrival times.
        speed: time compression of the recording (2.0 plays it twice as fast).
        asap: ignore recorded times: one cycle per command, back to back.
        tail_cycles: periodic mode: ticks to run after the last command arrives.
        should_stop: polled before each cycle; True ends the replay early (e.g. on SIGTERM).
    """
    if not stream.commands:
        log.warning("stream %s holds no commands; nothing to replay", stream.source)
        return 0
    if asap:
        def back_to_back() -> Iterator[InboundCommand]:
            for c in stream.commands:
                yield InboundCommand(c.command_id, c.text, loop.clock(), c.state)
        return loop.run_events(back_to_back(), should_stop=should_stop)
    if not speed > 0:
        raise ValueError(f"speed must be > 0, got {speed!r}")
    start = loop.clock()
    arrivals = _arrivals(stream, start, speed)
    if stream.frames and loop.config.mmproj:  # a vision tower sees the stream's camera
        loop.frame_source = frame_source(stream, start, speed, loop.clock)
    if loop.config.mode == "event":
        return loop.run_events(arrivals, should_stop=should_stop)
    pending = iter(arrivals)
    nxt: list[InboundCommand | None] = [next(pending, None)]

    def feed(now_ns: int) -> None:
        while nxt[0] is not None and nxt[0].arrival_ns <= now_ns:
            loop.submit(nxt[0])
            nxt[0] = next(pending, None)

    n_cycles = planned_cycles(loop.config, stream, speed=speed, tail_cycles=tail_cycles)
    return loop.run_periodic(n_cycles, start_ns=start, feed=feed, should_stop=should_stop)


def run_replay(config: ResolvedRun, stream: CommandStream, *, speed: float = 1.0,
               asap: bool = False, publish: Publisher | None = None,
               handle_signals: bool = False, progress: bool = False,
               labels: LabelSet | None = None) -> dict[str, Any]:
    """Replay ``stream`` into a new run directory; return its summary.

    The stream's labels (each command's own ``expected``, then ``labels``: a sidecar's, by id
    or text) are checked against the run's planner profile, and every record's plan is judged
    against them (``plan_correct``).

    With ``handle_signals``, SIGINT and SIGTERM end the replay after the current cycle: the
    cycle log is complete and flushed, and summary.json is written from it. With ``progress``,
    a bar on stderr shows cycles done and misses so far (only when stderr is a terminal).

    Raises:
        RunError: the run could not start (log directory, engine, model).
        LabelError: a command's own label does not fit the profile's schema.
    """
    judged = stream_labels(stream.commands, schema=label_schema(config.planning.contract),
                           source=stream.source, sidecar=labels)
    stop = threading.Event()
    previous: dict[int, Any] = {}
    if handle_signals and threading.current_thread() is threading.main_thread():
        def on_signal(signum: int, _frame: Any) -> None:
            log.warning("signal %d: stopping after the current cycle", signum)
            stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, on_signal)
    bar = CycleProgress(planned_cycles(config.settings, stream, speed=speed, asap=asap),
                        desc=config.label or "run", enabled=progress)
    try:
        with PlannerRun(config, publish=publish or (lambda envelope: None),
                        on_record=bar.record, labels=judged if len(judged) else None) as run:
            run.enter_loop_thread()
            replay(run.loop, stream, speed=speed, asap=asap, should_stop=stop.is_set)
            summary = run.close()
        bar.close()
        summary["interrupted"] = stop.is_set()
        return summary
    finally:
        bar.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
