"""Publish a command stream at its recorded pace, scheduled against one absolute start time.

Pure Python (no rclpy). Every send time is ``start + loop_offset + t_ns / speed``, fixed before
the first send: a publish that runs late delays only itself, never the ones after it, so a slow
receiver cannot stretch the timeline and hide its own lateness (no coordinated omission). How
late each send was is measured against its scheduled time and reported.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from robot_latency.clock import DEFAULT_CLOCK, Clock
from robot_latency.stats import distribution
from robot_latency.streams import Command, Frame

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Send:
    """One scheduled publish: when (ns, the pacer's clock), what, and which play of the stream;
    a camera frame's (``frame`` set; ``text`` empty) or a command's."""

    at_ns: int
    text: str
    command_id: str
    play: int
    frame: Frame | None = None


def schedule(commands: Sequence[Command], *, start_ns: int, speed: float = 1.0,
             loop_count: int = 1, loop_gap_ns: int = 0,
             frames: Sequence[Frame] = ()) -> list[Send]:
    """Return every send of ``loop_count`` plays, in time order.

    Play ``k`` starts ``k * (span + loop_gap_ns)`` after ``start_ns``, where ``span`` is the
    time from the stream's first send to its last, divided by ``speed``. Camera frames
    (``frames``) are sent at their recorded times among the commands, a frame before a command
    of the same time; a frame recorded before the first command moves the play's start earlier
    (the first send is at ``start_ns``).

    Raises:
        ValueError: speed <= 0, loop_count < 1 or a negative gap.
    """
    if not speed > 0:
        raise ValueError(f"speed must be > 0, got {speed!r}")
    if loop_count < 1 or loop_gap_ns < 0:
        raise ValueError(f"need loop_count >= 1 and loop_gap_ns >= 0, got {loop_count}, "
                         f"{loop_gap_ns}")
    if not commands:
        return []
    first = min([commands[0].t_ns, *(f.t_ns for f in frames[:1])])
    last = max([commands[-1].t_ns, *(f.t_ns for f in frames[-1:])])
    span = round((last - first) / speed)
    out: list[Send] = []
    for play in range(loop_count):
        offset = start_ns + play * (span + loop_gap_ns)
        items = [(f.t_ns, 0, Send(offset + round((f.t_ns - first) / speed), "", "", play, f))
                 for f in frames]
        items += [(c.t_ns, 1, Send(offset + round((c.t_ns - first) / speed), c.text,
                                   c.command_id, play)) for c in commands]
        items.sort(key=lambda item: (item[0], item[1]))
        out.extend(send for _, _, send in items)
    return out


@dataclass
class PacerReport:
    """What a pacer did: sends done and how late they were (ms after their scheduled time)."""

    sent: int = 0
    failed: int = 0
    frames: int = 0  # camera frames sent (not in ``sent`` nor ``lateness_ms``)
    lateness_ms: list[float] = field(default_factory=list)

    def summary(self) -> str:
        """Return one line for the log."""
        d = distribution(self.lateness_ms)

        def fmt(x: float | None) -> str:
            return "n/a" if x is None else f"{x:.2f}"

        return (f"{self.sent} commands sent, {self.failed} failed"
                + (f", {self.frames} camera frames" if self.frames else "")
                + f"; lateness p50 {fmt(d.p50)} ms, p99 {fmt(d.p99)} ms, max {fmt(d.max)} ms "
                f"(n={d.n})")


class Pacer:
    """Send a schedule through ``send(text)``, each at its time, in a thread of its own.

    Args:
        sends: the schedule (see :func:`schedule`).
        send: publishes one command text.
        clock: the clock the schedule's times are on.
        sleep: sleeps a number of seconds (``time.sleep``; tests inject their own).
        send_item: publishes one :class:`Send` (its text, id and play); used instead of
            ``send`` when given (the client edge tags each command with its id).
        send_frame: publishes one camera frame's :class:`Send`; frames are left out without it.
    """

    def __init__(self, sends: Sequence[Send], send: Callable[[str], None], *,
                 clock: Clock = DEFAULT_CLOCK,
                 sleep: Callable[[float], None] = time.sleep,
                 send_item: Callable[[Send], None] | None = None,
                 send_frame: Callable[[Send], None] | None = None) -> None:
        self._send_frame = send_frame
        self.sends = [s for s in sends if s.frame is None or send_frame is not None]
        self._send = send
        self._send_item = send_item
        self.clock = clock
        self._sleep = sleep
        self.report = PacerReport()
        self._stop = threading.Event()
        self.done = threading.Event()
        self._thread: threading.Thread | None = None

    def run(self) -> PacerReport:
        """Send everything (or until :meth:`stop`), in the calling thread; return the report."""
        try:
            for item in self.sends:
                while not self._stop.is_set():
                    delay_ns = item.at_ns - self.clock()
                    if delay_ns <= 0:
                        break
                    # Sleep in slices so stop() is honoured within 0.1 s.
                    self._sleep(min(delay_ns / 1e9, 0.1))
                if self._stop.is_set():
                    break
                late_ms = (self.clock() - item.at_ns) / 1e6
                try:
                    if item.frame is not None:
                        assert self._send_frame is not None
                        self._send_frame(item)
                        self.report.frames += 1
                        continue
                    if self._send_item is not None:
                        self._send_item(item)
                    else:
                        self._send(item.text)
                except Exception as err:  # one failed publish must not end the replay
                    self.report.failed += 1
                    log.error("%s (play %d) not sent: %r", f"command {item.command_id}"
                              if item.frame is None else f"frame at {item.frame.t_ns} ns",
                              item.play, err)
                    continue
                self.report.sent += 1
                self.report.lateness_ms.append(late_ms)
        finally:
            self.done.set()
        return self.report

    def start(self) -> None:
        """Run :meth:`run` in a daemon thread."""
        self._thread = threading.Thread(target=self.run, name="bag-replayer-pacer", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop sending and wait for the thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
