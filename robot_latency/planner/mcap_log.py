"""run.mcap: a run's commands, plans, per-cycle figures, misses, fallbacks and log lines as MCAP
channels with JSON Schemas, for Foxglove, PlotJuggler and the ``mcap`` tools.

Channels (message encoding ``json``, schema encoding ``jsonschema``: the schemas are in
:mod:`robot_latency.planner.mcap_schemas`)::

    /planner/command        robot_latency.Command     every command the planner received
    /planner/plan           robot_latency.Plan        every plan published
    /planner/cycle_stats    CycleStats' fields        one per cycle (PlotJuggler, Foxglove plots)
    /planner/cycle_record   robot_latency.CycleRecord one per cycle: the line of cycles.jsonl
    /planner/events         foxglove.Event            every deadline miss and every fallback
    /planner/log            foxglove.Log              the run's start and stop, its warnings

Times are wall-clock (Unix) nanoseconds: the loop clock's times plus one offset read when the
file opens (its ``clock`` metadata), so Foxglove shows the run at the hour it ran. A message's
log time is when it happened (a plan's: its publish; a command's: its arrival). At close the
file gets the run's manifest and summary as metadata, so a run directory holding only run.mcap
can still be reported.

cycles.jsonl stays the record of a run: run.mcap is written beside it, after it, flushed per
cycle (a crash loses at most the cycle in flight, the commands since the last cycle, and the
file's closing index, which ``mcap recover`` rebuilds). A failure here (the ``mcap`` package
missing, a full disk) is logged once and ends run.mcap, never the run.

Memory: each flush closes a chunk, and the writer keeps one index entry per chunk until the
file closes (the file's index needs them all). A command joins the chunk of the cycle after it
(one chunk per cycle, not two), and each entry is kept as its few encoded bytes
(:class:`_PackedChunkIndexes`), not as Python objects: a node planning for hours grows by
about 120 bytes per cycle here, not 1.2 KB per command.
"""

from __future__ import annotations

import collections
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from robot_latency.planner.cycle_fields import cycle_stats_fields, record_outcome
from robot_latency.planner.mailbox import InboundCommand
from robot_latency.planner.mcap_schemas import (
    COMMAND,
    CYCLE_STATS,
    FOXGLOVE_EVENT,
    FOXGLOVE_LOG,
    LOG_LEVELS,
    PLAN,
    cycle_record_schema,
)
from robot_latency.profiles.actions import is_refusal
from robot_latency.records import CycleRecord

log = logging.getLogger(__name__)

MCAP_NAME = "run.mcap"
PROFILE = "robot_latency"

COMMAND_CHANNEL = "/planner/command"
PLAN_CHANNEL = "/planner/plan"
CYCLE_STATS_CHANNEL = "/planner/cycle_stats"
RECORD_CHANNEL = "/planner/cycle_record"
EVENT_CHANNEL = "/planner/events"
LOG_CHANNEL = "/planner/log"

#: channel -> its schema's name (the title) and JSON Schema
CHANNELS: dict[str, dict[str, Any]] = {
    COMMAND_CHANNEL: COMMAND,
    PLAN_CHANNEL: PLAN,
    CYCLE_STATS_CHANNEL: CYCLE_STATS,
    RECORD_CHANNEL: cycle_record_schema(),
    EVENT_CHANNEL: FOXGLOVE_EVENT,
    LOG_CHANNEL: FOXGLOVE_LOG,
}

#: The events a cycle raises: a deadline miss (the summary's ``deadline_misses``) and a
#: fallback (a cycle without a model plan and with a reason, the summary's ``fallbacks``).
EVENT_KINDS = ("deadline_miss", "fallback")

#: How many recent commands are remembered to write each once (a command put in the mailbox
#: and announced again when the loop takes it is never that far apart).
SEEN_COMMANDS = 1024


def cycle_events(rec: CycleRecord) -> list[str]:
    """The kinds of event (:data:`EVENT_KINDS`) a cycle record raises, in that order."""
    kinds = []
    if not rec.deadline_met:
        kinds.append("deadline_miss")
    if rec.plan_source != "model" and rec.fallback_reason is not None:
        kinds.append("fallback")
    return kinds


def time_of(ns: int) -> dict[str, int]:
    """``{"sec", "nsec"}`` for integer nanoseconds (negative: clamped to 0)."""
    ns = max(0, int(ns))
    return {"sec": ns // 1_000_000_000, "nsec": ns % 1_000_000_000}


def plan_message(rec: CycleRecord) -> dict[str, Any]:
    """The /planner/plan message of a cycle that published a plan."""
    assert rec.published_ns is not None
    refused = is_refusal(rec.plan)
    return {
        "cycle": rec.cycle, "command_id": rec.command_id, "source": rec.plan_source,
        "fallback_reason": rec.fallback_reason, "fallback_policy": rec.fallback_policy,
        "outcome": record_outcome(rec), "plan": None if refused else rec.plan,
        "refusal": rec.plan if refused else None, "deadline_met": rec.deadline_met,
        "cycle_ms": rec.cycle_ns / 1e6 if rec.cycle_ns is not None else 0.0,
        "deadline_ms": rec.deadline_budget_ns / 1e6,
        "margin_ms": None if rec.margin_ns is None else rec.margin_ns / 1e6,
        "tokens_out": rec.tokens_out, "data_ns": rec.data_ns, "published_ns": rec.published_ns,
    }


class _PackedChunkIndexes:
    """The writer's chunk index entries, each encoded (its record's bytes, one buffer for all)
    as the writer appends it; at ``finish`` they are written back as they were encoded."""

    class _Encoded:
        __slots__ = ("data",)

        def __init__(self, data: bytes) -> None:
            self.data = data

        def write(self, stream: Any) -> None:
            stream.write(self.data)

    def __init__(self) -> None:
        self._data = bytearray()
        self.count = 0

    def append(self, index: Any) -> None:
        from mcap.data_stream import RecordBuilder

        builder = RecordBuilder()
        index.write(builder)
        self._data += builder.end()
        self.count += 1

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[_Encoded]:
        if self._data:  # the entries back to back, as the index holds them
            yield self._Encoded(bytes(self._data))

    @property
    def nbytes(self) -> int:
        """The encoded entries' bytes (what the file's index will hold)."""
        return len(self._data)


def pack_chunk_indexes(writer: Any) -> _PackedChunkIndexes | None:
    """Have ``writer`` (an ``mcap.writer.Writer`` that has written no chunk yet) keep its chunk
    index entries packed; None where its internals are not the ones this was written against
    (the entries are then kept as the writer keeps them)."""
    name = "_Writer__chunk_indices"
    if getattr(writer, name, None) != []:
        return None
    packed = _PackedChunkIndexes()
    setattr(writer, name, packed)
    return packed


class _LogLines(logging.Handler):
    """Copies the package's warnings and errors into run.mcap's log channel."""

    def __init__(self, sink: RunMcap) -> None:
        super().__init__(level=logging.WARNING)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        if record.name == __name__:
            return  # run.mcap's own trouble is not written into it
        level = {logging.WARNING: "WARNING", logging.ERROR: "ERROR",
                 logging.CRITICAL: "FATAL"}.get(record.levelno, "WARNING")
        self.sink.log_line(record.getMessage(), level=level, name=record.name,
                           file=record.pathname, line=record.lineno,
                           wall_ns=int(record.created * 1e9))


class RunMcap:
    """Writes a run's run.mcap as the run goes (thread-safe: commands arrive on other threads).

    Args:
        path: the file (``RUN_DIR/run.mcap``).
        clock: the loop's clock; its times are moved to wall time by one offset.
        run_id: the run's id (the file's ``run`` metadata).
        capture_logs: copy the package's warnings (logger ``robot_latency``) while open.
    """

    def __init__(self, path: str | Path, *, clock: Callable[[], int], run_id: str,
                 capture_logs: bool = True) -> None:
        self.path = Path(path)
        self.clock = clock
        self.offset_ns = time.time_ns() - clock()
        self.written = 0
        self._lock = threading.RLock()
        self._writer: Any = None
        self._fh: IO[bytes] | None = None
        self._channels: dict[str, int] = {}
        self._seen: collections.deque[tuple[str, int]] = collections.deque(maxlen=SEEN_COMMANDS)
        self._handler: _LogLines | None = None
        #: the writer's chunk index entries, packed (None: not written, or kept unpacked)
        self.chunk_indexes: _PackedChunkIndexes | None = None
        try:
            from mcap.writer import CompressionType, Writer
        except ImportError as err:
            log.warning("%s not written: the mcap package is not installed (%s)", self.path, err)
            return
        try:
            self._fh = open(self.path, "wb")
            # uncompressed chunks, one per flush: cheap per cycle on a robot's CPU
            self._writer = Writer(self._fh, compression=CompressionType.NONE)
            self.chunk_indexes = pack_chunk_indexes(self._writer)
            self._writer.start(profile=PROFILE, library="robot_latency")
            for topic, schema in CHANNELS.items():
                sid = self._writer.register_schema(
                    name=schema["title"], encoding="jsonschema",
                    data=json.dumps(schema).encode())
                self._channels[topic] = self._writer.register_channel(
                    topic=topic, message_encoding="json", schema_id=sid)
            self._writer.add_metadata("run", {"run_id": run_id})
            self._writer.add_metadata("clock", {"wall_minus_loop_ns": str(self.offset_ns)})
            self._writer.flush()
        except Exception as err:
            self._fail(err)
            return
        if capture_logs:
            self._handler = _LogLines(self)
            logging.getLogger("robot_latency").addHandler(self._handler)

    @property
    def open(self) -> bool:
        """Whether run.mcap is still being written."""
        return self._writer is not None

    def wall_ns(self, loop_ns: int) -> int:
        """A loop-clock time as wall-clock nanoseconds."""
        return int(loop_ns) + self.offset_ns

    # --- writing -----------------------------------------------------------------------------
    def _fail(self, err: BaseException) -> None:
        writer, self._writer = self._writer, None  # first: a log line below must not recurse
        self._drop_handler()
        log.error("%s: stopped writing it: %r (cycles.jsonl is unaffected)", self.path, err)
        if self._fh is not None:
            try:
                self._fh.close()
            except OSError:
                pass
            self._fh = None
        del writer

    def _put(self, messages: list[tuple[str, int, dict[str, Any]]], *,
             flush: bool = True) -> None:
        with self._lock:
            if self._writer is None:
                return
            try:
                for topic, wall_ns, body in messages:
                    data = json.dumps(body, allow_nan=False, separators=(",", ":")).encode()
                    self._writer.add_message(self._channels[topic], log_time=wall_ns,
                                             publish_time=wall_ns, data=data,
                                             sequence=self.written)
                    self.written += 1
                if flush:  # closes the chunk: one index entry each (see the module docstring)
                    self._writer.flush()
            except Exception as err:
                self._fail(err)

    def command(self, cmd: InboundCommand) -> None:
        """A command the planner received (called from the thread that delivered it); one the
        loop announces again as it takes it (event mode) is written once. It goes into the chunk
        the next cycle's flush closes (or the file's close)."""
        key = (cmd.command_id, cmd.arrival_ns)
        with self._lock:
            if key in self._seen:
                return
            self._seen.append(key)
        self._put([(COMMAND_CHANNEL, self.wall_ns(cmd.arrival_ns), {
            "command_id": cmd.command_id, "text": cmd.text, "state": cmd.state,
            "arrival_ns": cmd.arrival_ns, "sent_ns": cmd.sent_ns,
            "deadline_ms": None if cmd.deadline_ns is None else cmd.deadline_ns / 1e6})],
            flush=False)

    def cycle(self, rec: CycleRecord) -> None:
        """One cycle, after its record is in cycles.jsonl: its plan (if one was published),
        its figures, its record and its events."""
        end_ns = rec.published_ns if rec.published_ns is not None else self.clock()
        data_ns = rec.data_ns if rec.data_ns is not None else rec.scheduled_ns
        stats = {"header": {"stamp": time_of(self.wall_ns(data_ns)), "frame_id": ""},
                 **cycle_stats_fields(rec)}
        out = []
        if rec.published_ns is not None and rec.plan_source != "none":
            out.append((PLAN_CHANNEL, self.wall_ns(rec.published_ns), plan_message(rec)))
        out.append((CYCLE_STATS_CHANNEL, self.wall_ns(end_ns), stats))
        out.append((RECORD_CHANNEL, self.wall_ns(end_ns), rec.to_dict()))
        for kind in cycle_events(rec):
            out.append((EVENT_CHANNEL, self.wall_ns(end_ns), self._event(rec, kind, end_ns)))
        self._put(out)

    def _event(self, rec: CycleRecord, kind: str, end_ns: int) -> dict[str, Any]:
        """A foxglove.Event over the cycle: from its scheduled start to its publish (else to
        when it was recorded)."""
        meta = {"kind": kind, "cycle": str(rec.cycle), "command_id": rec.command_id or "",
                "source": rec.plan_source, "reason": rec.fallback_reason or "",
                "deadline_ms": f"{rec.deadline_budget_ns / 1e6:g}"}
        if rec.overshoot_ns is not None:
            meta["overshoot_ms"] = f"{rec.overshoot_ns / 1e6:.3f}"
        return {"start_time": time_of(self.wall_ns(rec.scheduled_ns)),
                "end_time": time_of(self.wall_ns(max(end_ns, rec.scheduled_ns))),
                "metadata": [{"key": k, "value": v} for k, v in meta.items()]}

    def log_line(self, message: str, *, level: str = "INFO", name: str = "robot_latency",
                 file: str = "", line: int = 0, wall_ns: int | None = None) -> None:
        """A foxglove.Log line (wall time now unless given)."""
        wall = time.time_ns() if wall_ns is None else wall_ns
        self._put([(LOG_CHANNEL, wall, {
            "timestamp": time_of(wall), "level": LOG_LEVELS[level], "message": message,
            "name": name, "file": file, "line": max(0, int(line))})])

    # --- closing -----------------------------------------------------------------------------
    def _drop_handler(self) -> None:
        if self._handler is not None:
            logging.getLogger("robot_latency").removeHandler(self._handler)
            self._handler = None

    def close(self, *, manifest: dict[str, Any] | None = None,
              summary: dict[str, Any] | None = None) -> None:
        """Write the manifest and summary as metadata, the index and the footer; close the
        file (idempotent)."""
        self._drop_handler()
        with self._lock:
            if self._writer is None:
                return
            try:
                for name, doc in (("manifest", manifest), ("summary", summary)):
                    if doc is not None:
                        self._writer.add_metadata(name, {"json": json.dumps(doc, default=str)})
                self._writer.finish()
                assert self._fh is not None
                self._fh.close()
                self._fh = None
                self._writer = None
            except Exception as err:
                self._fail(err)
