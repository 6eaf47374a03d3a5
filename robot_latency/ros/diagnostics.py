"""Planner health for ``/diagnostics``: OK / WARN / ERROR from recent cycles, by thresholds.

Pure Python (no rclpy): the node turns each :class:`StatusReport` into a
``diagnostic_msgs/DiagnosticStatus``. Statistics come from a rolling window of the newest cycle
records; a statistic with no samples is reported as ``n/a``, never as 0.
"""

from __future__ import annotations

import collections
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from robot_latency.errors import SettingsError
from robot_latency.records import CycleRecord
from robot_latency.stats import distribution, wilson_interval

# Levels as diagnostic_msgs/DiagnosticStatus defines them (OK=0, WARN=1, ERROR=2, STALE=3).
OK, WARN, ERROR, STALE = 0, 1, 2, 3
LEVEL_NAMES = {OK: "OK", WARN: "WARN", ERROR: "ERROR", STALE: "STALE"}

#: Fallback reasons that say the engine itself is in trouble.
ENGINE_FAULTS = ("engine_error", "engine_unavailable", "server_unreachable", "server_error",
                 "server_malformed")


class DiagnosticsError(SettingsError):
    """A threshold out of range; ``name`` is the parameter."""


@dataclass(frozen=True)
class DiagnosticThresholds:
    """Where each health figure turns WARN or ERROR.

    Args:
        miss_rate_warn: deadline-miss rate over the window at or above which the level is WARN.
        miss_rate_error: ... ERROR (>= miss_rate_warn).
        ttft_p99_warn_ms: TTFT p99 (ms) at or above which the level is WARN; 0: 80% of the
            deadline.
        ttft_p99_error_ms: ... ERROR; 0: the deadline itself.
        itl_p99_warn_ms: inter-token gap p99 (ms) at or above which the level is WARN; 0: off.
        itl_p99_error_ms: ... ERROR; 0: off.
        diagnostics_window: number of newest cycles the figures are computed over.
        plan_expected_hz: the plan topic's expected rate for monitors (greenwave's
            ``expected_frequency``); 0: one plan per period in periodic mode, none in event mode.
        plan_rate_tolerance_percent: how far (%) the plan rate may stray from it before WARN.
    """

    miss_rate_warn: float = 0.01
    miss_rate_error: float = 0.05
    ttft_p99_warn_ms: float = 0.0
    ttft_p99_error_ms: float = 0.0
    itl_p99_warn_ms: float = 0.0
    itl_p99_error_ms: float = 0.0
    diagnostics_window: int = 200
    plan_expected_hz: float = 0.0
    plan_rate_tolerance_percent: float = 10.0

    def __post_init__(self) -> None:
        for name in ("miss_rate_warn", "miss_rate_error"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise DiagnosticsError(name, f"{value!r}: must be in [0, 1]")
        for name in ("ttft_p99_warn_ms", "ttft_p99_error_ms", "itl_p99_warn_ms",
                     "itl_p99_error_ms"):
            if getattr(self, name) < 0:
                raise DiagnosticsError(name, f"{getattr(self, name)!r}: must be >= 0 "
                                       "(0: default)")
        pairs = (("miss_rate_warn", "miss_rate_error"), ("ttft_p99_warn_ms", "ttft_p99_error_ms"),
                 ("itl_p99_warn_ms", "itl_p99_error_ms"))
        for warn, error in pairs:
            w, e = getattr(self, warn), getattr(self, error)
            if w and e and w > e:
                raise DiagnosticsError(warn, f"{w!r}: must not exceed {error}={e!r}")
        if self.plan_expected_hz < 0 or self.plan_rate_tolerance_percent < 0:
            name = "plan_expected_hz" if self.plan_expected_hz < 0 \
                else "plan_rate_tolerance_percent"
            raise DiagnosticsError(name, f"{getattr(self, name)!r}: must be >= 0")
        if self.diagnostics_window < 1:
            raise DiagnosticsError("diagnostics_window", f"{self.diagnostics_window!r}: "
                                   "must be >= 1")

    def ttft_limits_ms(self, deadline_ms: float) -> tuple[float, float]:
        """Return the (warn, error) TTFT p99 limits, defaults filled in from the deadline."""
        return (self.ttft_p99_warn_ms or 0.8 * deadline_ms,
                self.ttft_p99_error_ms or deadline_ms)


@dataclass(frozen=True)
class StatusReport:
    """One diagnostic status: a short name, a level, a message and key/value figures."""

    name: str
    level: int
    message: str
    values: dict[str, str] = field(default_factory=dict)


def _fmt(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _level(value: float | None, warn: float | None, error: float | None) -> int:
    if value is None:
        return OK
    if error is not None and error > 0 and value >= error:
        return ERROR
    if warn is not None and warn > 0 and value >= warn:
        return WARN
    return OK


class CycleWindow:
    """The newest cycle records (thread-safe: the loop thread adds, the node's timer reads)."""

    def __init__(self, size: int) -> None:
        self._lock = threading.Lock()
        self._records: collections.deque[CycleRecord] = collections.deque(maxlen=size)
        self.total = 0

    def add(self, rec: CycleRecord) -> None:
        """Append one record (the oldest falls out beyond the window)."""
        with self._lock:
            self._records.append(rec)
            self.total += 1

    def resize(self, size: int) -> None:
        """Change the window length, keeping the newest records."""
        with self._lock:
            self._records = collections.deque(self._records, maxlen=size)

    def snapshot(self) -> list[CycleRecord]:
        """Return a copy of the window, oldest first."""
        with self._lock:
            return list(self._records)


class DiagnosticsTracker:
    """Turn the window, engine state and mailbox counters into status reports.

    Args:
        deadline_ms: the planner's deadline (for the default TTFT limits).
    """

    def __init__(self, *, deadline_ms: float) -> None:
        self.deadline_ms = deadline_ms
        self._last_dropped = 0

    def evaluate(self, records: Sequence[CycleRecord], thresholds: DiagnosticThresholds, *,
                 engine: Mapping[str, Any], mailbox: Mapping[str, int]) -> list[StatusReport]:
        """Return the deadline, latency, engine and mailbox statuses."""
        return [self._deadline(records, thresholds), self._latency(records, thresholds),
                self._engine(records, engine), self._mailbox(mailbox)]

    @staticmethod
    def _deadline(records: Sequence[CycleRecord], t: DiagnosticThresholds) -> StatusReport:
        n = len(records)
        misses = sum(1 for r in records if not r.deadline_met)
        rate = misses / n if n else None
        ci = wilson_interval(misses, n)
        reasons = Counter(r.fallback_reason for r in records
                          if r.plan_source != "model" and r.fallback_reason is not None)
        values = {"window_cycles": str(n), "misses": str(misses), "miss_rate": _fmt(rate, 4),
                  "miss_rate_ci95": "n/a" if ci is None else f"[{ci[0]:.4f}, {ci[1]:.4f}]",
                  "skipped": str(sum(1 for r in records if r.skipped)),
                  "model_plans": str(sum(1 for r in records if r.plan_source == "model")),
                  "fallbacks": str(sum(reasons.values()))}
        values.update({f"fallback.{k}": str(v) for k, v in sorted(reasons.items())})
        level = _level(rate, t.miss_rate_warn, t.miss_rate_error)
        if n == 0:
            message = "no cycles yet"
        else:
            message = f"{misses}/{n} deadline misses ({rate:.2%}) over the newest cycles"
        return StatusReport("deadline", level, message, values)

    def _latency(self, records: Sequence[CycleRecord], t: DiagnosticThresholds) -> StatusReport:
        ttft = distribution(r.ttft_ns / 1e6 for r in records if r.ttft_ns is not None)
        itl = distribution(g / 1e6 for r in records for g in r.itl_ns)
        e2e = distribution(r.e2e_ns / 1e6 for r in records if r.e2e_ns is not None)
        ttft_warn, ttft_error = t.ttft_limits_ms(self.deadline_ms)
        level = max(_level(ttft.p99, ttft_warn, ttft_error),
                    _level(itl.p99, t.itl_p99_warn_ms, t.itl_p99_error_ms))
        values = {"ttft_p99_ms": _fmt(ttft.p99), "ttft_n": str(ttft.n),
                  "itl_p99_ms": _fmt(itl.p99), "itl_n": str(itl.n),
                  "e2e_p99_ms": _fmt(e2e.p99), "e2e_n": str(e2e.n),
                  "ttft_p99_warn_ms": _fmt(ttft_warn), "ttft_p99_error_ms": _fmt(ttft_error)}
        message = (f"TTFT p99 {_fmt(ttft.p99, 1)} ms (n={ttft.n}), "
                   f"ITL p99 {_fmt(itl.p99, 2)} ms (n={itl.n})")
        return StatusReport("latency", level, message, values)

    @staticmethod
    def _engine(records: Sequence[CycleRecord], engine: Mapping[str, Any]) -> StatusReport:
        faults = [r for r in records if r.plan_source != "model"
                  and r.fallback_reason in ENGINE_FAULTS]
        values = {str(k): str(v) for k, v in engine.items()}
        values["faults_in_window"] = str(len(faults))
        if records and len(faults) == len(records):
            last = engine.get("load_error") or faults[-1].engine_error or "?"
            return StatusReport("engine", ERROR,
                                f"every recent cycle had an engine fault (last: {last})", values)
        server_down = engine.get("server_check_error")
        if server_down and not any(r.plan_source == "model" for r in records):
            # A server engine whose server did not answer at start-up: ERROR until it does.
            return StatusReport("engine", ERROR, f"no plan from the server yet: {server_down}",
                                values)
        if faults:
            return StatusReport("engine", WARN,
                                f"{len(faults)} engine faults in the newest cycles", values)
        return StatusReport("engine", OK, "engine running", values)

    def _mailbox(self, mailbox: Mapping[str, int]) -> StatusReport:
        dropped = int(mailbox.get("dropped", 0))
        new_drops = dropped - self._last_dropped
        self._last_dropped = dropped
        values = {k: str(v) for k, v in mailbox.items()}
        values["dropped_since_last_report"] = str(new_drops)
        if new_drops > 0:
            return StatusReport("mailbox", WARN,
                                f"{new_drops} commands dropped by a full mailbox", values)
        return StatusReport("mailbox", OK, "no commands dropped", values)


def _rate_hz(times_ns: Sequence[int]) -> float | None:
    """Messages per second over the span of ``times_ns`` (None with fewer than two)."""
    if len(times_ns) < 2 or times_ns[-1] <= times_ns[0]:
        return None
    return (len(times_ns) - 1) * 1e9 / (times_ns[-1] - times_ns[0])


def plan_topic_report(records: Sequence[CycleRecord], t: DiagnosticThresholds, *, topic: str,
                      period_ms: float, mode: str) -> StatusReport:
    """The plan topic's status under greenwave_monitor's keys (Isaac ROS NITROS's convention),
    named by the topic itself, so topic-rate dashboards show the planner beside the sensors.

    ``frame_rate_node``: plans per second by their publish; ``frame_rate_msg``: by their header
    stamps (the commands they answer); ``current_delay_from_realtime_ms``: the newest plan's
    publish minus its stamp (its reaction time on the node's side); ``expected_frequency`` and
    ``tolerance`` (%); ``total_dropped_frames``: cycles in the window that published no plan.
    """
    published = [r for r in records if r.published_ns is not None and not r.skipped]
    node_hz = _rate_hz([r.published_ns for r in published if r.published_ns is not None])
    msg_hz = _rate_hz(sorted({r.data_ns for r in published if r.data_ns is not None}))
    newest = published[-1] if published else None
    delay_ms = None if newest is None or newest.published_ns is None or newest.data_ns is None \
        else (newest.published_ns - newest.data_ns) / 1e6
    expected = t.plan_expected_hz or (1000.0 / period_ms if mode == "periodic" and period_ms
                                      else 0.0)
    values = {"frame_rate_node": _fmt(node_hz), "frame_rate_msg": _fmt(msg_hz),
              "current_delay_from_realtime_ms": _fmt(delay_ms),
              "expected_frequency": _fmt(expected),
              "tolerance": _fmt(t.plan_rate_tolerance_percent),
              "total_dropped_frames": str(len(records) - len(published))}
    if node_hz is None:
        return StatusReport(topic, OK, "no plan rate yet", values)
    if expected and abs(node_hz - expected) > expected * t.plan_rate_tolerance_percent / 100:
        return StatusReport(topic, WARN, f"plan rate {node_hz:.2f} Hz, expected {expected:.2f} "
                            f"Hz +/- {t.plan_rate_tolerance_percent:g}%", values)
    return StatusReport(topic, OK, f"plan rate {node_hz:.2f} Hz", values)
