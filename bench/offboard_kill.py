"""The kill drill of ``bench/offboard.py kill``: SIGKILL llama-cpp-python's server while a
``robot-latency run`` plans against it, at chosen moments, restart it, and say afterwards what
each kill hit.

What the server was doing at the kill comes from its own log, read as it grows:

- uvicorn's access line for ``POST /v1/completions`` is written when the streaming response
  starts, which llama-cpp-python's server (0.3.x) does as soon as it takes the request, before it
  waits for the model's lock and prefills: from that line on, the request is in flight;
- llama.cpp's timing line (``total time =``) is written when its generation ends (finished, or
  its client gone).

One robot asks one request at a time, so the last of these lines says what the server was
doing: a request taken and not ended when it died was in flight at the kill, the kill landed
mid-request. (Not the count of lines: in a drill one more request began than ended, beside a
cycle given up at its deadline; a request whose client leaves before its generation starts
writes no timing line.) A
request still on its way to the server, or waiting behind one its client gave up on, is
not the last line; the record of the cycle running at the kill shows it.

The run's records (the run is the CLI's, in a process of its own) say which cycle was running
then and how it ended: both stamp ``time.perf_counter_ns``, the system-wide
monotonic clock on Linux, so the kill's stamp is on the records' clock.
"""

from __future__ import annotations

import logging
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from robot_latency.engines.llama_server import LocalServer
from robot_latency.records import CycleRecord
from robot_latency.stats import distribution

log = logging.getLogger(__name__)

#: A request was taken (uvicorn's access line, written as its streaming response starts).
STREAM_BEGUN = '"POST /v1/completions'
#: A generation ended (llama.cpp's timing line).
STREAM_ENDED = "total time ="
#: The moments a kill is aimed at, in turn: as the server takes a request (before or in its
#: prefill), halfway through one (half the median request seen so far: prefill or decode), and
#: between two requests (just after one ended, before the next tick asks).
MOMENTS = ("request_start", "halfway", "between_requests")
#: Fallback reasons a request cut by the kill may get: the stream broke, or its connection did.
KILL_REASONS = ("server_error", "server_unreachable")


class ServerLog:
    """The server's log, read as it grows: requests begun and ended, the last of those lines,
    and how long requests took.

    Counts are per life of the server: :meth:`new_life` sets them back after a restart (what
    was in flight died with the old process).
    """

    def __init__(self, path: Path, *, clock: Callable[[], int] = time.perf_counter_ns) -> None:
        self.path = path
        self.clock = clock
        # From the log's end now: what an earlier run against the same server did is not ours.
        self._offset = path.stat().st_size if path.exists() else 0
        self._partial = b""
        self.begun = 0
        self.ended = 0
        self.last: str | None = None  # "begun" or "ended": the last request line
        self._begun_at_ns: int | None = None
        self.request_ns: list[int] = []  # begin line seen -> end line seen, for lone requests

    @property
    def in_flight(self) -> bool:
        """The last request line is one taken, not one ended."""
        return self.last == "begun"

    def poll(self) -> None:
        """Read what was appended since the last call; count its complete lines."""
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self._offset)
                data = fh.read()
        except FileNotFoundError:
            return
        if not data:
            return
        self._offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        now = self.clock()
        for raw in lines:
            line = raw.decode("utf-8", errors="replace")
            if STREAM_BEGUN in line:
                self.begun += 1
                self.last, self._begun_at_ns = "begun", now
            elif STREAM_ENDED in line:
                self.ended += 1
                if self.last == "begun" and self._begun_at_ns is not None:
                    self.request_ns.append(now - self._begun_at_ns)
                self.last, self._begun_at_ns = "ended", None

    def new_life(self) -> None:
        """The server was restarted: nothing of the old one is open."""
        self.poll()
        self._partial = b""  # a line the old process died writing
        self.begun = self.ended = 0
        self.last = self._begun_at_ns = None

    def half_request_s(self) -> float:
        """Half the median request seen so far (0 before any)."""
        return statistics.median(self.request_ns) / 2e9 if self.request_ns else 0.0


@dataclass
class Kill:
    """One SIGKILL of the server and what it hit (cycle fields filled from the records)."""

    moment: str
    kill_ns: int
    server_in_flight: bool         # per the server's log, when it died
    restart_s: float               # kill to the restarted server answering
    cycle: int | None = None       # the cycle running at the kill (None: between cycles)
    cycle_request_open: bool | None = None  # its request was open at the kill (its record)
    plan_source: str | None = None
    fallback_reason: str | None = None
    deadline_met: bool | None = None
    lateness_ms: float | None = None  # published - deadline (< 0: early)

    @property
    def mid_request(self) -> bool:
        """A request was in flight at the kill: the server had taken one and not ended it (its
        log), or the cycle running then had sent one not yet answered (its record; a request
        still on its way to the server is not in the server's log yet)."""
        return self.server_in_flight or bool(self.cycle_request_open)

    def to_dict(self, t0_ns: int) -> dict[str, Any]:
        out = asdict(self)
        out["kill_ms"] = (out.pop("kill_ns") - t0_ns) / 1e6
        out["mid_request"] = self.mid_request
        return out


@dataclass
class Killer:
    """SIGKILLs ``server`` ``kills`` times while a run plans against it, restarting it each time.

    Before each kill the server must have ended ``served_between`` generations since it
    (re)started: the run is served again between kills. :meth:`run` polls ``alive`` while it
    waits, so that a run that ended stops the drill.
    """

    server: LocalServer
    kills: int
    served_between: int = 3
    poll_s: float = 0.001
    clock: Callable[[], int] = time.perf_counter_ns
    done: list[Kill] = field(default_factory=list)
    #: What the drill waits for now (at the end: why it stopped short, if it did).
    waiting_for: str = ""

    def __post_init__(self) -> None:
        assert self.server.log_path is not None
        self.log = ServerLog(self.server.log_path, clock=self.clock)

    def at_end(self) -> str:
        """Where the drill was when the run ended: ``done``, or what it still waited for."""
        if len(self.done) == self.kills:
            return "done"
        return (f"kill {len(self.done) + 1}: {self.waiting_for} (server's log: "
                f"{self.log.begun} requests begun, {self.log.ended} ended since it started)")

    def _wait(self, ready: Callable[[], bool], alive: Callable[[], bool]) -> bool:
        """Poll the log until ``ready()``; False when ``alive()`` turns False first."""
        while True:
            self.log.poll()
            if ready():
                return True
            if not alive():
                return False
            time.sleep(self.poll_s)

    def _reached(self, moment: str, begun: int, ended: int) -> bool:
        """The kill's moment came, counting from ``begun`` and ``ended`` requests."""
        if moment == "between_requests":  # one more ended, and none began since
            return self.log.ended > ended and not self.log.in_flight
        return self.log.begun > begun and self.log.in_flight  # one more taken, still going

    def run(self, alive: Callable[[], bool]) -> None:
        """Do every kill (or as many as the run lasts for)."""
        for k in range(self.kills):
            moment = MOMENTS[k % len(MOMENTS)]
            self.waiting_for = f"{self.served_between} requests served"
            if not self._wait(lambda: self.log.ended >= self.served_between, alive):
                return
            self.waiting_for = moment
            begun, ended = self.log.begun, self.log.ended
            if not self._wait(partial(self._reached, moment, begun, ended), alive):
                return
            if moment == "halfway":
                time.sleep(self.log.half_request_s())
            kill_ns = self.clock()
            self.server.stop()  # SIGKILL to its process group; waits until it is gone
            self.log.poll()  # the dead server's last lines
            in_flight = self.log.in_flight
            self.server.start()  # the same port: the run's URL serves again
            restart_s = (self.clock() - kill_ns) / 1e9
            self.log.new_life()
            self.done.append(Kill(moment, kill_ns, in_flight, restart_s))
            log.info("kill %d (%s): %s; served again after %.1f s", k + 1, moment,
                     "a request in flight" if in_flight else "idle", restart_s)


def lateness_ms(rec: CycleRecord) -> float | None:
    """Publish time minus the deadline, ms (< 0: early); None when nothing was published."""
    return None if rec.published_ns is None else (rec.published_ns - rec.deadline_ns) / 1e6


def place_kills(kills: list[Kill], records: list[CycleRecord]) -> None:
    """Fill each kill's cycle: the one whose work spans the kill (started to published)."""
    for kill in kills:
        hit = next((r for r in records if r.started_ns is not None and r.published_ns is not None
                    and r.started_ns <= kill.kill_ns <= r.published_ns), None)
        if hit is not None:
            kill.cycle, kill.plan_source = hit.cycle, hit.plan_source
            kill.fallback_reason, kill.deadline_met = hit.fallback_reason, hit.deadline_met
            kill.lateness_ms = lateness_ms(hit)
            kill.cycle_request_open = request_open_at(hit, kill.kill_ns)


def request_open_at(rec: CycleRecord, at_ns: int) -> bool:
    """Whether ``rec``'s request to the server was open at ``at_ns`` (within the cycle): it
    fell back after asking (the request ended on its fault or at the give-up, and the fallback
    is published at once, so that was after ``at_ns``: whatever the reason, which is what the
    drill checks), or it was the model's plan whose last chunk came after ``at_ns`` (sent
    before the server died, read after)."""
    if rec.plan_source == "fallback":
        # A cycle given up at its deadline may carry no trace (the worker's was not back).
        return rec.offboard is not None or rec.fallback_reason == "deadline"
    if rec.offboard is None:
        return False  # it never asked the server
    return rec.plan_source == "model" and bool(rec.token_ns) and rec.token_ns[-1] > at_ns


def run_summary(records: list[CycleRecord], kills: list[Kill], *, asked: int,
                drill: str = "done") -> dict[str, Any]:
    """One run of the drill: cycles, late ones, fallbacks by reason and their lateness, and
    what each kill hit."""
    place_kills(kills, records)
    t0 = records[0].scheduled_ns if records else 0
    reasons: dict[str, int] = {}
    late_by_reason: dict[str, list[float]] = {}
    for rec in records:
        if rec.plan_source == "fallback" and rec.fallback_reason:
            reasons[rec.fallback_reason] = reasons.get(rec.fallback_reason, 0) + 1
            ms = lateness_ms(rec)
            if ms is not None:
                late_by_reason.setdefault(rec.fallback_reason, []).append(round(ms, 3))
    mid = [k for k in kills if k.mid_request]
    hit = [k for k in mid if k.cycle is not None]
    cut = sum(1 for k in hit if k.plan_source == "fallback" and k.fallback_reason in KILL_REASONS)
    # The model's plan on a mid-request kill: the server had sent the answer's last chunks
    # (read from the socket after it died) and not yet written its timing line.
    answered = sum(1 for k in hit if k.plan_source == "model")
    # A request still on its way to the server when it died (its record open, the server's log
    # without it): the broken connection can surface after the loop's give-up, which then falls
    # back at the deadline, on time, as with any slow server (seen on a loaded host).
    given_up = sum(1 for k in hit if not k.server_in_flight and k.plan_source == "fallback"
                   and k.fallback_reason == "deadline")
    outcomes: dict[str, int] = {}
    for k in hit:
        key = k.fallback_reason or k.plan_source or "none"
        outcomes[key] = outcomes.get(key, 0) + 1
    return {
        "cycles": len(records),
        "late": sum(1 for r in records if not r.deadline_met),
        "skipped": sum(1 for r in records if r.skipped),
        "planned": sum(1 for r in records if r.plan is not None),
        "model_plans": sum(1 for r in records if r.plan_source == "model"),
        "fallbacks": reasons,
        "fallback_lateness_ms": {
            reason: {**distribution(v).to_dict(), "late": sum(1 for x in v if x > 0),
                     "values": v} for reason, v in sorted(late_by_reason.items())},
        "kills_asked": asked,
        "kills": len(kills),
        "drill_at_end": drill,
        "kills_mid_request": len(mid),
        # The cycles those kills hit: cut (a server fault), answered (the model's plan), given
        # up at the deadline with the request not yet at the server, or anything else (a
        # defect: the deadline while the server held the request, a wrong reason); and how
        # many were late.
        "mid_request_cycles": len(hit),
        "mid_request_outcomes": outcomes,
        "mid_request_cut": cut,
        "mid_request_answered": answered,
        "mid_request_given_up": given_up,
        "mid_request_other": len(hit) - cut - answered - given_up,
        "mid_request_late": sum(1 for k in hit if k.deadline_met is False),
        "restart_s": [round(k.restart_s, 3) for k in kills],
        "kill_list": [k.to_dict(t0) for k in kills],
    }


def cli_run_command(stream: Path, url: str, out: Path, *, deadline_ms: float, period_ms: float,
                    labels: Path | None) -> list[str]:
    """``robot-latency run --engine openai --server-url URL`` on ``stream`` into ``out``."""
    cmd = [sys.executable, "-m", "robot_latency.cli", "run",
           "--stream", str(stream), "--engine", "openai", "--server-url", url,
           "--out", str(out), "--deadline-ms", f"{deadline_ms:g}",
           "--period-ms", f"{period_ms:g}", "--json"]
    return cmd + (["--labels", str(labels)] if labels is not None else [])
