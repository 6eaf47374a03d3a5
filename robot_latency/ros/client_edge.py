"""The client edge: tag each sent command with an id, match the plans that come back to it.

Pure Python (no rclpy): the bag replayer calls :meth:`ClientTracker.sent` just before each
publish and :meth:`ClientTracker.received` from its plan subscription, then writes what the
tracker holds (:mod:`robot_latency.report.client`).

A command travels as std_msgs/String. To be matched by ``command_id`` it carries its id in a
*tagged command*: the JSON object ``{"command_id": "...", "text": "..."}``. The planner node
takes the id from it (:func:`untag_command`) and puts it in the plan envelope's
``command_id``; any other text is a plain command and gets the node's own id, as before.

A tagged command may also say when it was sent: ``sent_ns`` on the clock named by ``clock``
(``monotonic:<boot id>``: this boot's CLOCK_MONOTONIC, which ``time.perf_counter_ns`` reads on
Linux). A planner on the same boot then counts the deadline from the send, where the receiver
counts it, so the command's own way in (measured here: up to 11 ms while the engine held the
cores, against 0.9 ms at the median) is inside the budget (:func:`read_command`).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from robot_latency.clock import DEFAULT_CLOCK, Clock
from robot_latency.report.client import ClientRecord, client_summary

log = logging.getLogger(__name__)

#: The keys of a tagged command, exactly (the send stamp's two are optional, together).
TAG_KEYS = frozenset({"command_id", "text"})
STAMP_KEYS = frozenset({"sent_ns", "clock"})
#: Where Linux names this boot (CLOCK_MONOTONIC is comparable within one boot only).
BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")


@dataclass(frozen=True)
class ReceivedCommand:
    """A received command: the sender's id (None: untagged), its text, and when it was sent on
    this host's monotonic clock (None: not stamped, or stamped on another clock)."""

    command_id: str | None
    text: str
    sent_ns: int | None = None


def monotonic_clock_id() -> str | None:
    """``monotonic:<boot id>``: the clock a send stamp is on; None where the boot has no id."""
    try:
        return "monotonic:" + BOOT_ID_PATH.read_text().strip()
    except OSError:
        return None


def tag_command(command_id: str, text: str, *, sent_ns: int | None = None,
                clock_id: str | None = None) -> str:
    """Return the tagged form of a command (what the replayer publishes), with its send stamp
    when both ``sent_ns`` and ``clock_id`` are given."""
    obj: dict[str, Any] = {"command_id": command_id, "text": text}
    if sent_ns is not None and clock_id is not None:
        obj.update(sent_ns=int(sent_ns), clock=clock_id)
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def read_command(data: str, *, clock_id: str | None = None) -> ReceivedCommand:
    """Read a received command: tagged (its id, text and, when stamped on ``clock_id``, its send
    time) or plain text.

    Only a JSON object with the keys ``command_id`` and ``text`` (a non-empty string and a
    string), and optionally both ``sent_ns`` (an integer) and ``clock`` (a string), is a tagged
    command; anything else is text. A stamp on another clock than ``clock_id`` is ignored.
    """
    if not data.startswith("{"):
        return ReceivedCommand(None, data)
    try:
        obj = json.loads(data)
    except ValueError:
        return ReceivedCommand(None, data)
    if not (isinstance(obj, dict) and set(obj) in (TAG_KEYS, TAG_KEYS | STAMP_KEYS)
            and isinstance(obj["command_id"], str) and obj["command_id"]
            and isinstance(obj["text"], str)):
        return ReceivedCommand(None, data)
    sent = obj.get("sent_ns")
    if not (isinstance(sent, int) and not isinstance(sent, bool) and sent >= 0):
        if STAMP_KEYS <= set(obj):
            return ReceivedCommand(None, data)  # a malformed stamp: not a tagged command
        sent = None
    if clock_id is None or obj.get("clock") != clock_id:
        sent = None
    return ReceivedCommand(obj["command_id"], obj["text"], sent)


def untag_command(data: str) -> tuple[str | None, str]:
    """Split a received command into ``(command_id, text)``; ``(None, data)`` when untagged."""
    command = read_command(data)
    return command.command_id, command.text


class ClientTracker:
    """Match received plans to sent commands (thread-safe: sends and plans come from two threads).

    Args:
        deadline_ms: the planner's deadline; None: taken from the first plan envelope that
            carries ``deadline_ms``.
        clock: the host's monotonic clock in ns (the planner's clock, so the two compare).
        via: how commands are sent: ``topic`` (tagged on planner/command) or ``action``
            (PlanCommand goals); the summary says which.
        max_frame_age_ms: a plan from a camera frame older than this at its receipt is stale
            (None or 0: no limit).
    """

    def __init__(self, *, deadline_ms: float | None = None, clock: Clock = DEFAULT_CLOCK,
                 via: str = "topic", max_frame_age_ms: float | None = None) -> None:
        self.deadline_ms = deadline_ms
        self.max_frame_age_ms = max_frame_age_ms or None
        #: camera frames sent: header stamp (ns) -> send time (this clock)
        self._frames: dict[int, int] = {}
        self.clock = clock
        self.via = via
        self._lock = threading.Lock()
        self._rows: dict[str, ClientRecord] = {}
        self._order: list[str] = []
        self.unmatched_plans = 0
        self.unreadable_plans = 0
        self.plans_without_command = 0
        self.plans_received = 0
        self._last_plan_ns: int | None = None
        self.plan_gaps_ms: list[float] = []

    def sent(self, command_id: str, sent_ns: int, *, stream_command_id: str | None = None,
             play: int = 0) -> None:
        """Register a command about to be published at ``sent_ns``."""
        with self._lock:
            if command_id in self._rows:
                log.warning("command id %s sent twice; the later send replaces it", command_id)
            else:
                self._order.append(command_id)
            self._rows[command_id] = ClientRecord(command_id, sent_ns,
                                                  stream_command_id=stream_command_id, play=play)

    def frame_sent(self, stamp_ns: int, sent_ns: int) -> None:
        """Register a camera frame published with header stamp ``stamp_ns`` at ``sent_ns``."""
        with self._lock:
            self._frames[stamp_ns] = sent_ns

    def not_sent(self, command_id: str) -> None:
        """Forget a command whose publish failed."""
        with self._lock:
            if self._rows.pop(command_id, None) is not None:
                self._order.remove(command_id)

    def received(self, data: str | Mapping[str, Any], received_ns: int | None = None, *,
                 stamp_ns: int | None = None) -> ClientRecord | None:
        """Take one plan (the envelope's JSON text, or the envelope read from a typed Plan:
        :func:`robot_latency.ros.plan_msg.plan_envelope`); return the command it answered.
        ``stamp_ns``: the plan's ``header.stamp``; when it is a frame this client sent, the
        plan came from that frame, and its age at receipt is recorded.

        Never raises for a bad plan: undecodable ones, plans without a command and plans
        whose id matches no sent command are counted.
        """
        now = self.clock() if received_ns is None else received_ns
        envelope: Any
        if isinstance(data, Mapping):
            envelope = dict(data)
        else:
            try:
                envelope = json.loads(data)
            except ValueError:
                envelope = None
        with self._lock:
            self.plans_received += 1
            if self._last_plan_ns is not None:
                self.plan_gaps_ms.append((now - self._last_plan_ns) / 1e6)
            self._last_plan_ns = now
            if not isinstance(envelope, dict):
                self.unreadable_plans += 1
                return None
            if self.deadline_ms is None and isinstance(envelope.get("deadline_ms"), int | float):
                self.deadline_ms = float(envelope["deadline_ms"])
            cid = envelope.get("command_id")
            if cid is None:
                self.plans_without_command += 1
                return None
            row = self._rows.get(str(cid))
            if row is None:
                self.unmatched_plans += 1
                if self.unmatched_plans == 1:
                    log.warning("plan for command %r, which this replayer did not send "
                                "(counted as unmatched)", cid)
                return None
            row.plans_received += 1
            if row.received_ns is None:
                row.received_ns = now
                row.status = "answered"
                source = envelope.get("source")
                row.plan_source = source if isinstance(source, str) else None
                cycle = envelope.get("cycle")
                row.plan_cycle = cycle if isinstance(cycle, int) else None
                if stamp_ns is not None and stamp_ns in self._frames:
                    row.frame_stamp_ns = stamp_ns
                    row.frame_age_ms = (now - self._frames[stamp_ns]) / 1e6
            return row

    def last_answered(self) -> bool:
        """The newest command sent has its plan (then no earlier one is waiting for its
        status: each is answered or superseded); True when nothing was sent."""
        with self._lock:
            return not self._order or self._rows[self._order[-1]].received_ns is not None

    def records(self) -> list[ClientRecord]:
        """Return one record per sent command, in send order, with its final status.

        A command without a plan of its own is ``superseded`` when a later command was answered,
        else ``unanswered``.
        """
        with self._lock:
            rows = [self._rows[c] for c in self._order]
            later_answered = False
            for row in reversed(rows):
                row.deadline_ms, row.max_frame_age_ms = self.deadline_ms, self.max_frame_age_ms
                if row.received_ns is None:
                    row.status = "superseded" if later_answered else "unanswered"
                else:
                    later_answered = True
            return list(rows)

    def summary(self) -> dict[str, Any]:
        """Return the client summary (:func:`robot_latency.report.client.client_summary`)."""
        records = self.records()
        with self._lock:
            out = client_summary(records, unmatched_plans=self.unmatched_plans,
                                 plans_without_command=self.plans_without_command,
                                 plan_gaps_ms=list(self.plan_gaps_ms), via=self.via)
            out["plans_received"] = self.plans_received
            out["plans_unreadable"] = self.unreadable_plans
        return out


def make_sender(tracker: ClientTracker, publish: Callable[[str], None]) -> Callable[..., None]:
    """Return ``send(command_id, text, *, stream_command_id, play)``: register, tag, publish."""

    clock_id = monotonic_clock_id()

    def send(command_id: str, text: str, *, stream_command_id: str | None = None,
             play: int = 0) -> None:
        sent_ns = tracker.clock()
        tracker.sent(command_id, sent_ns, stream_command_id=stream_command_id, play=play)
        try:
            publish(tag_command(command_id, text, sent_ns=sent_ns, clock_id=clock_id))
        except Exception:
            tracker.not_sent(command_id)
            raise

    return send
