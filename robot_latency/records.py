"""The per-cycle record and its JSONL form.

One :class:`CycleRecord` per planner cycle. Timestamps are integer nanoseconds from the one
injected clock; every duration is derived from them, so ``e2e_ns == ttft_ns + sum(itl_ns)``
holds exactly (integer arithmetic, no float rounding). The ``*_ms`` views are for people.

Timeline of one cycle::

    scheduled_ns   the cycle's scheduled start (the tick, or the command's arrival in event
                   mode; a stamped command's send for its first cycle, in both modes):
                   latency counts from here, so a late loop cannot hide its lateness
    started_ns     the loop began work on it (queue wait = started - scheduled)
    token_ns[i]    the i-th generated token was available (TTFT = token_ns[0] - scheduled)
    published_ns   the plan (model or fallback) was published
    deadline_ns    scheduled + deadline; overshoot = max(0, published - deadline)
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from robot_latency.errors import RobotLatencyError

log = logging.getLogger(__name__)

#: Version of the JSONL record layout; bump when a field changes meaning.
RECORD_SCHEMA_VERSION = 1

PLAN_SOURCES = ("model", "fallback", "none")

#: Why a cycle fell back (or produced nothing).
FALLBACK_REASONS = (
    "deadline",
    "invalid_output",
    "engine_error",
    "engine_unavailable",
    "bad_command",
    "no_command",
    "skipped",
    "superseded",
    "cancelled",
    "server_unreachable",
    "server_error",
    "server_malformed",
)


class RecordError(RobotLatencyError, ValueError):
    """A record or a record file that cannot be read; the message names the file and line."""


def _ns_to_ms(value_ns: int | None) -> float | None:
    return None if value_ns is None else value_ns / 1e6


@dataclass
class CycleRecord:
    """Everything measured about one planner cycle.

    Durations that do not apply are ``None``, never 0 (a cycle without a model token has no TTFT).
    ``phases_ns`` holds the time spent per phase (queue, tokenize, prefill, decode, grammar,
    abort, fallback, publish); only the phases that ran appear. ``host_steal_ns`` is the CPU
    time a hypervisor took from this machine (all CPUs) between the previous record and this
    one, at the kernel's 10 ms tick resolution (None where the OS does not report it).
    ``prompt`` is the per-cycle part of what the model was given (the normalized command in the
    profile's template; the fixed prefix is in the manifest's profile), ``raw_output`` what it
    wrote. ``margin_ns`` is the time the loop kept before the deadline for the fallback, the
    publish and the transport to the receiver (``deadline_ns - margin_ns``: when it gave up on
    the model).

    ``energy_mj`` is the energy the module drew from the previous plan's publish to this one's
    (the input rail integrated: :mod:`robot_latency.telemetry.energy`), ``energy_phases_mj``
    its parts (``wait``, ``prefill``, ``decode``, ``rest``) and ``energy_source`` what was
    integrated, or ``not measured`` (and why) where no rail is readable: then ``energy_mj`` is
    None, never 0.

    The target's answer for this cycle: ``target_e2e_pred_ms`` is the predicted time from the
    cycle's start to its last token on the target device, ``ttft_pred + (tokens_out - 1) *
    itl_pred`` (the same form as the measured ``e2e_ms``; TTFT for this cycle's own uncached
    prompt tokens, ITL at its context), with ``target_e2e_pred_interval_ms`` from the ITL
    prediction's interval, and ``target_deadline_met_pred`` whether that meets the cycle's
    deadline. ``target_pred`` holds the parts (``ttft_ms``, ``itl_ms``, ``itl_interval_ms``,
    ``tokens_out``, ``basis``, ``max_tokens``, ``device_id``, ``engine_family``). ``basis`` is
    ``complete`` when the output was finished here; ``partial`` when it was cut off here (the
    tokens so far: the prediction is a lower bound, and ``target_deadline_met_pred`` is False
    when even that misses, else None). Queue wait and publish are not part of it.

    ``plan_correct`` is whether the published plan (the model's, the fallback's, or a refusal)
    matches the command's label (:mod:`robot_latency.profiles.labels`); None when the command
    is unlabelled or nothing was published. ``label_kind`` is the label's class (its first
    action, or ``refuse``), None when unlabelled. ``fallback_correct`` is, for a labelled
    cycle the fallback answered, whether each policy's plan for this command would have been
    right (``{"rule": ..., "hold": ...}``): the fallback judged, whichever policy answered.

    ``command_sent_ns`` is when the sender sent the command, where it stamped the send on this
    clock (a tagged command from the client edge): the first cycle's ``scheduled_ns`` (and so
    its deadline) is then that send, not ``command_arrival_ns`` nor the tick (periodic mode).

    ``data_ns`` is when the data the cycle answers was taken, the stamp its plan carries: the
    command's send where stamped, else its arrival (re-plans of the same command too), else (no
    command) the scheduled start. None in records written before it existed. With a camera
    frame it is the frame's stamp (on the loop's clock) instead: the plan answers the frame.

    ``frame_stamp_ns`` is the header stamp (ROS clock, ns) of the camera frame that was newest
    when the cycle started (the frame it plans with), ``frame_age_ms`` that frame's age then
    (cycle start minus its stamp); both None for a text-only node or before the first frame.
    ``image`` is what the frame cost the model where the engine has a vision tower
    (:mod:`robot_latency.engines.llama_image`): ``tokens``, ``chunks``, ``key``, ``reused``
    (already in the KV cache: no ``image_encode`` or ``image_prefill`` phase this cycle) and
    ``encoder`` (``clip`` or ``onnx``: the ``vision_encoder`` setting); None for a text-only
    cycle.
    """

    run_id: str
    cycle: int
    scheduled_ns: int
    deadline_ns: int
    started_ns: int | None = None
    published_ns: int | None = None
    token_ns: list[int] = field(default_factory=list)
    command_id: str | None = None
    command_arrival_ns: int | None = None
    mode: str = "periodic"
    tokens_in: int | None = None
    prefix_cache_tokens: int | None = None
    phases_ns: dict[str, int] = field(default_factory=dict)
    plan_source: str = "none"
    fallback_reason: str | None = None
    fallback_policy: str | None = None
    stop_reason: str | None = None
    engine_error: str | None = None
    skipped: bool = False
    prompt: str | None = None
    raw_output: str | None = None
    plan: dict[str, Any] | None = None
    draft: dict[str, Any] | None = None
    floor: dict[str, Any] | None = None
    cpu_percent: float | None = None
    rss_bytes: int | None = None
    host_steal_ns: int | None = None
    telemetry: dict[str, Any] | None = None
    energy_mj: float | None = None
    energy_phases_mj: dict[str, float | None] | None = None
    energy_source: str | None = None
    schema_version: int = RECORD_SCHEMA_VERSION
    margin_ns: int | None = None
    target_e2e_pred_ms: float | None = None
    target_e2e_pred_interval_ms: list[float] | None = None
    target_deadline_met_pred: bool | None = None
    target_pred: dict[str, Any] | None = None
    offboard: dict[str, Any] | None = None
    command_sent_ns: int | None = None
    plan_correct: bool | None = None
    label_kind: str | None = None
    fallback_correct: dict[str, bool] | None = None
    data_ns: int | None = None
    frame_stamp_ns: int | None = None
    frame_age_ms: float | None = None
    image: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.plan_source not in PLAN_SOURCES:
            raise RecordError(f"plan_source must be one of {PLAN_SOURCES}, "
                              f"got {self.plan_source!r}")
        if self.fallback_reason is not None and self.fallback_reason not in FALLBACK_REASONS:
            raise RecordError(f"fallback_reason must be one of {FALLBACK_REASONS}, "
                              f"got {self.fallback_reason!r}")
        if any(b < a for a, b in zip(self.token_ns, self.token_ns[1:], strict=False)):
            raise RecordError(f"cycle {self.cycle}: token timestamps go backwards")
        if self.token_ns and self.token_ns[0] < self.scheduled_ns:
            raise RecordError(f"cycle {self.cycle}: first token before the cycle was scheduled")

    def take_frame(self, frame: tuple[Any, ...] | None) -> None:
        """Plan with the camera frame ``frame`` (its header stamp, its stamp on the loop's
        clock, and anything after: the image): its stamps and its age at the cycle's start go
        in; None changes nothing."""
        if frame is not None and self.started_ns is not None:
            self.frame_stamp_ns, self.data_ns = frame[0], frame[1]
            self.frame_age_ms = (self.started_ns - frame[1]) / 1e6

    # --- derived durations (ns, exact) -------------------------------------------------------
    @property
    def tokens_out(self) -> int:
        """Generated tokens."""
        return len(self.token_ns)

    @property
    def deadline_budget_ns(self) -> int:
        """The deadline as a duration from the scheduled start."""
        return self.deadline_ns - self.scheduled_ns

    @property
    def queue_wait_ns(self) -> int | None:
        """Time from the scheduled start to the loop starting work."""
        return None if self.started_ns is None else self.started_ns - self.scheduled_ns

    @property
    def ttft_ns(self) -> int | None:
        """Time to first token, from the scheduled start."""
        return self.token_ns[0] - self.scheduled_ns if self.token_ns else None

    @property
    def itl_ns(self) -> list[int]:
        """Every inter-token gap."""
        return [b - a for a, b in zip(self.token_ns, self.token_ns[1:], strict=False)]

    @property
    def e2e_ns(self) -> int | None:
        """Scheduled start to last token: ``ttft_ns + sum(itl_ns)`` exactly."""
        return self.token_ns[-1] - self.scheduled_ns if self.token_ns else None

    @property
    def tpot_ns(self) -> float | None:
        """Mean time per output token after the first; None with fewer than two tokens."""
        if len(self.token_ns) < 2:
            return None
        return (self.token_ns[-1] - self.token_ns[0]) / (len(self.token_ns) - 1)

    @property
    def cycle_ns(self) -> int | None:
        """Scheduled start to the plan being published."""
        return None if self.published_ns is None else self.published_ns - self.scheduled_ns

    @property
    def reaction_ns(self) -> int | None:
        """Command arrival to the plan being published."""
        if self.published_ns is None or self.command_arrival_ns is None:
            return None
        return self.published_ns - self.command_arrival_ns

    @property
    def overshoot_ns(self) -> int | None:
        """How late the plan was published after the deadline; 0 when on time."""
        if self.published_ns is None:
            return None
        return max(0, self.published_ns - self.deadline_ns)

    @property
    def deadline_met(self) -> bool:
        """A plan was published by the deadline (a skipped cycle never meets it)."""
        return (not self.skipped and self.published_ns is not None
                and self.published_ns <= self.deadline_ns)

    # --- (de)serialisation -------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form: the stored fields, then the derived values (ms) for readers."""
        out = dataclasses.asdict(self)
        tpot = self.tpot_ns
        out.update(
            tokens_out=self.tokens_out,
            deadline_met=self.deadline_met,
            deadline_ms=self.deadline_budget_ns / 1e6,
            queue_wait_ms=_ns_to_ms(self.queue_wait_ns),
            ttft_ms=_ns_to_ms(self.ttft_ns),
            itl_ms=[g / 1e6 for g in self.itl_ns],
            tpot_ms=None if tpot is None else tpot / 1e6,
            e2e_ms=_ns_to_ms(self.e2e_ns),
            cycle_ms=_ns_to_ms(self.cycle_ns),
            reaction_ms=_ns_to_ms(self.reaction_ns),
            overshoot_ms=_ns_to_ms(self.overshoot_ns),
            phases_ms={k: v / 1e6 for k, v in self.phases_ns.items()},
        )
        return out

    def to_json(self) -> str:
        """Return the record as one line of JSON (no newline)."""
        return json.dumps(self.to_dict(), separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CycleRecord:
        """Rebuild a record from its JSON form; derived values are recomputed, not trusted."""
        names = {f.name for f in dataclasses.fields(cls)}
        missing = [n for n in ("run_id", "cycle", "scheduled_ns", "deadline_ns") if n not in data]
        if missing:
            raise RecordError(f"record lacks required fields {missing}")
        kwargs = {k: v for k, v in data.items() if k in names}
        try:
            return cls(**kwargs)
        except TypeError as err:
            raise RecordError(f"record has a field of the wrong type: {err}") from err


class JsonlSink:
    """Append cycle records to a JSONL file, one line per record, flushed per record.

    A crash loses nothing that was written: each line is flushed to the OS before :meth:`write`
    returns (and fsync'ed too with ``fsync=True``, which survives power loss at a cost per cycle).
    """

    def __init__(self, path: str | os.PathLike[str], *, fsync: bool = False) -> None:
        self.path = Path(path)
        self.fsync = fsync
        self.written = 0
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh: IO[str] | None = open(self.path, "a", encoding="utf-8")
        except OSError as err:
            raise RecordError(f"cannot open the cycle log {self.path} for appending: "
                              f"{err.strerror or err}") from err

    def write(self, record: CycleRecord) -> None:
        """Append one record and flush it.

        Raises:
            RecordError: the write failed (disk full, file gone); nothing partial is counted.
        """
        if self._fh is None:
            raise RecordError(f"the cycle log {self.path} is closed")
        line = record.to_json() + "\n"
        try:
            self._fh.write(line)
            self._fh.flush()
            if self.fsync:
                os.fsync(self._fh.fileno())
        except OSError as err:
            raise RecordError(f"cannot write cycle {record.cycle} to {self.path}: "
                              f"{err.strerror or err}") from err
        self.written += 1

    def close(self) -> None:
        """Flush and close the file (idempotent)."""
        if self._fh is not None:
            try:
                self._fh.close()
            finally:
                self._fh = None

    def __enter__(self) -> JsonlSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def iter_records(path: str | os.PathLike[str]) -> Iterator[CycleRecord]:
    """Yield the records of a JSONL cycle log in order.

    A partial last line (what a crash mid-write leaves) is skipped with a warning. A bad line
    anywhere else is an error: it means the file was damaged, not interrupted.

    Raises:
        RecordError: the file cannot be read, or a line before the last is not a valid record;
            the message names the file and the line number.
    """
    p = Path(path)
    try:
        with open(p, encoding="utf-8", errors="strict") as fh:
            lines = fh.read().split("\n")
    except (OSError, UnicodeDecodeError) as err:
        raise RecordError(f"cannot read the cycle log {p}: {err}") from err
    # A complete file ends with "\n", so the last element is "" (or the partial tail).
    *complete, tail = lines
    for lineno, line in enumerate(complete, start=1):
        if not line.strip():
            continue
        try:
            yield CycleRecord.from_dict(json.loads(line))
        except (json.JSONDecodeError, RecordError) as err:
            raise RecordError(f"{p}, line {lineno}: not a valid cycle record: {err}") from err
    if tail.strip():
        try:
            yield CycleRecord.from_dict(json.loads(tail))
        except (json.JSONDecodeError, RecordError):
            log.warning("%s, line %d: partial last line skipped (an interrupted write)",
                        p, len(complete) + 1)


def read_records(path: str | os.PathLike[str]) -> list[CycleRecord]:
    """Return every record of a JSONL cycle log (see :func:`iter_records`)."""
    return list(iter_records(path))
