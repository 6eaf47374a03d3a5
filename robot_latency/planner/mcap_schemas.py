"""The JSON Schemas of run.mcap's channels (MCAP schema encoding ``jsonschema``, message
encoding ``json``): what Foxglove, PlotJuggler and the ``mcap`` reader see for each topic.

``foxglove.Event`` and ``foxglove.Log`` are Foxglove's well-known schemas (foxglove-sdk,
``schemas/jsonschema/Event.json`` and ``Log.json``: the same properties, types and bounds), so
Foxglove shows the events on its timeline and the log lines in its Log panel. The others are
ours: a command as the planner took it, a published plan, the typed per-cycle figures
(``CycleStats``' fields) and the full cycle record (derived from :class:`CycleRecord`'s fields,
so a new field is in the schema without an edit here).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

from robot_latency.planner.cycle_fields import CYCLE_STATS_FIELDS, OUTCOMES
from robot_latency.records import FALLBACK_REASONS, PLAN_SOURCES, CycleRecord

_TIME = {"type": "object", "title": "time",
         "properties": {"sec": {"type": "integer", "minimum": 0},
                        "nsec": {"type": "integer", "minimum": 0, "maximum": 999_999_999}}}
_NULL_INT = {"type": ["integer", "null"]}
_NULL_NUM = {"type": ["number", "null"]}
_NULL_STR = {"type": ["string", "null"]}


def _time(description: str) -> dict[str, Any]:
    return {**_TIME, "description": description}


#: foxglove.Event: a time range on Foxglove's timeline, with key-value metadata.
FOXGLOVE_EVENT: dict[str, Any] = {
    "title": "foxglove.Event",
    "description": "A discrete event that occurred over a time range",
    "type": "object",
    "properties": {
        "start_time": _time("Event start time (inclusive)"),
        "end_time": _time("Event end time (inclusive)"),
        "metadata": {
            "type": "array",
            "items": {"title": "foxglove.KeyValuePair",
                      "description": "A key with its associated value", "type": "object",
                      "properties": {"key": {"type": "string", "description": "Key"},
                                     "value": {"type": "string", "description": "Value"}},
                      "required": ["key", "value"]},
            "description": "Additional key-value metadata. Keys must be unique.",
        },
    },
    "required": ["start_time", "end_time"],
}

#: foxglove.LogLevel's values.
LOG_LEVELS = {"UNKNOWN": 0, "DEBUG": 1, "INFO": 2, "WARNING": 3, "ERROR": 4, "FATAL": 5}

#: foxglove.Log: one log line, for Foxglove's Log panel.
FOXGLOVE_LOG: dict[str, Any] = {
    "title": "foxglove.Log",
    "description": "A log message",
    "type": "object",
    "properties": {
        "timestamp": _time("Timestamp of log message"),
        "level": {"title": "foxglove.LogLevel", "description": "Log level",
                  "oneOf": [{"title": name, "const": value} for name, value in LOG_LEVELS.items()]},
        "message": {"type": "string", "description": "Log message"},
        "name": {"type": "string", "description": "Process or node name"},
        "file": {"type": "string", "description": "Filename"},
        "line": {"type": "integer", "minimum": 0, "description": "Line number in the file"},
    },
    "required": ["timestamp", "level", "message", "name", "file", "line"],
}

#: A command as the planner took it (its mailbox), times on the loop's clock (ns).
COMMAND: dict[str, Any] = {
    "title": "robot_latency.Command",
    "description": "A command as the planner received it (the loop's clock, ns)",
    "type": "object",
    "properties": {
        "command_id": {"type": "string"},
        "text": {"type": "string"},
        "state": {**_NULL_STR, "description": "robot state text sent with it"},
        "arrival_ns": {"type": "integer"},
        "sent_ns": {**_NULL_INT, "description": "its send, where the sender stamped it"},
        "deadline_ms": {**_NULL_NUM, "description": "the deadline its sender asked for"},
    },
    "required": ["command_id", "text", "state", "arrival_ns", "sent_ns", "deadline_ms"],
    "additionalProperties": False,
}

#: A published plan: the envelope ``planner/plan_json`` carries, with its outcome.
PLAN: dict[str, Any] = {
    "title": "robot_latency.Plan",
    "description": "One published plan (the model's or the fallback's)",
    "type": "object",
    "properties": {
        "cycle": {"type": "integer"},
        "command_id": _NULL_STR,
        "source": {"enum": [s for s in PLAN_SOURCES if s != "none"]},
        "fallback_reason": {"enum": [*FALLBACK_REASONS, None]},
        "fallback_policy": _NULL_STR,
        "outcome": {"enum": [o for o in OUTCOMES if o != "none"]},
        "plan": {"type": ["object", "null"], "description": "the profile's JSON plan"},
        "refusal": {"type": ["object", "null"], "description": "what refused the command"},
        "deadline_met": {"type": "boolean"},
        "cycle_ms": {"type": "number"},
        "deadline_ms": {"type": "number"},
        "margin_ms": _NULL_NUM,
        "tokens_out": {"type": "integer", "minimum": 0},
        "data_ns": _NULL_INT,
        "published_ns": {"type": "integer"},
    },
    "required": ["cycle", "command_id", "source", "fallback_reason", "outcome", "plan",
                 "deadline_met", "cycle_ms", "deadline_ms", "published_ns"],
    "additionalProperties": False,
}

_STATS_TYPES = {"integer": {"type": "integer"}, "string": {"type": "string"},
                "boolean": {"type": "boolean"}, "number": _NULL_NUM}

#: The typed per-cycle figures: CycleStats' header and fields (null: the cycle has none).
CYCLE_STATS: dict[str, Any] = {
    "title": "robot_latency_interfaces/msg/CycleStats",
    "description": "One cycle's figures; header.stamp: the data the cycle answered",
    "type": "object",
    "properties": {
        "header": {"type": "object",
                   "properties": {"stamp": _time("the data the cycle answered"),
                                  "frame_id": {"type": "string"}},
                   "required": ["stamp", "frame_id"]},
        **{name: dict(_STATS_TYPES[kind]) for name, kind in CYCLE_STATS_FIELDS.items()},
    },
    "required": ["header", *CYCLE_STATS_FIELDS],
    "additionalProperties": False,
}
CYCLE_STATS["properties"]["outcome"] = {"enum": list(OUTCOMES)}
CYCLE_STATS["properties"]["source"] = {"enum": list(PLAN_SOURCES)}

_SCALARS = {bool: "boolean", int: "integer", float: "number", str: "string"}


def type_schema(hint: Any) -> dict[str, Any]:
    """The JSON Schema of a record field's type hint (``int | None``, ``list[int]``,
    ``dict[str, float | None]``, ``Any``...)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return {}
    if hint in _SCALARS:
        return {"type": _SCALARS[hint]}
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        inner = type_schema(rest[0]) if len(rest) == 1 else {"anyOf": [type_schema(a)
                                                                      for a in rest]}
        if type(None) not in args:
            return inner
        if isinstance(inner.get("type"), str):
            return {**inner, "type": [inner["type"], "null"]}
        return {"anyOf": [inner, {"type": "null"}]}
    if origin is list:
        return {"type": "array", "items": type_schema(args[0]) if args else {}}
    if origin is dict:
        return {"type": "object",
                "additionalProperties": type_schema(args[1]) if len(args) == 2 else {}}
    raise TypeError(f"no JSON Schema for the record field type {hint!r}")


#: The derived values :meth:`CycleRecord.to_dict` adds to the stored fields.
_DERIVED: dict[str, Any] = {
    "tokens_out": int, "deadline_met": bool, "deadline_ms": float,
    "queue_wait_ms": float | None, "ttft_ms": float | None, "itl_ms": list[float],
    "tpot_ms": float | None, "e2e_ms": float | None, "cycle_ms": float | None,
    "reaction_ms": float | None, "overshoot_ms": float | None, "phases_ms": dict[str, float],
}


def cycle_record_schema() -> dict[str, Any]:
    """The JSON Schema of :meth:`CycleRecord.to_dict` (cycles.jsonl's line), from the
    dataclass's type hints and the derived values."""
    hints = typing.get_type_hints(CycleRecord)
    fields = {f.name: type_schema(hints[f.name]) for f in dataclasses.fields(CycleRecord)}
    derived = {name: type_schema(hint) for name, hint in _DERIVED.items()}
    return {"title": "robot_latency.CycleRecord",
            "description": "One cycle record, as a line of cycles.jsonl",
            "type": "object", "properties": {**fields, **derived},
            "required": [*fields, *derived], "additionalProperties": False}
