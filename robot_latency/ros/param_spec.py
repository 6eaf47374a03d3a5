"""What a ROS parameter of this package is, and how a value is checked against it.

Pure Python (no rclpy). The nodes' tables are :data:`robot_latency.ros.params.PLANNER_PARAMS`
and :data:`robot_latency.ros.replayer_params.REPLAYER_PARAMS`; :func:`typed_values` reads a
table's values, :func:`coerce` checks one. Numbers are accepted as int, float or a numeric
string (``--ros-args -p deadline_ms:=100`` gives an int; a launch argument gives a string), so
the nodes declare them with dynamic typing and this module does the type check.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from robot_latency.errors import RobotLatencyError
from robot_latency.planner.budget import parse_cpu_list

#: Kinds of parameter value, as ROS names the types.
KINDS = ("string", "integer", "double", "bool", "string_array", "cpu_list")


class ParamError(RobotLatencyError, ValueError):
    """A parameter value that cannot be used; the message starts with the parameter's name.

    Attributes:
        name: the parameter.
    """

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"parameter {name!r}: {message}")
        self.name = name


@dataclass(frozen=True)
class ParamSpec:
    """One ROS parameter: name, default, kind, description, inclusive range or choices.

    ``runtime`` says whether it may change while the node runs.
    """

    name: str
    default: Any
    kind: str
    description: str
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()
    runtime: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"{self.name}: kind must be one of {KINDS}, got {self.kind!r}")

    def constraints(self) -> str:
        """Return the constraints in words (the descriptor's ``additional_constraints``)."""
        parts = []
        if self.low is not None or self.high is not None:
            parts.append(f"range [{self.low}, {self.high}]")
        if self.choices:
            parts.append("one of " + ", ".join(self.choices))
        parts.append("may change at run time" if self.runtime
                     else "fixed at start-up (restart the node to change it)")
        return "; ".join(parts)


# --- type and range checks --------------------------------------------------------------------
def coerce(spec: ParamSpec, value: Any) -> Any:
    """Return ``value`` as the spec's kind, checked against its range and choices.

    Raises:
        ParamError: wrong type, out of range, not one of the choices.
    """
    name, kind = spec.name, spec.kind
    if kind == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        raise ParamError(name, f"expects true or false, got {value!r}")
    if kind == "string":
        if not isinstance(value, str):
            raise ParamError(name, f"expects a string, got {value!r}")
        if spec.choices and value not in spec.choices:
            raise ParamError(name, f"{value!r} is not one of {', '.join(spec.choices)}")
        return value
    if kind == "string_array":
        if isinstance(value, str):
            items = [v.strip() for v in value.split(",") if v.strip()]
        elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            items = [v.strip() for v in value]
        else:
            raise ParamError(name, f"expects a list of strings or a comma-separated string, "
                                   f"got {value!r}")
        bad = [v for v in items if spec.choices and v not in spec.choices]
        if bad or not items:
            raise ParamError(name, f"{value!r}: must be a non-empty list of "
                                   f"{', '.join(spec.choices) or 'strings'}")
        return items
    if kind == "cpu_list":
        return _cpu_list(name, value)
    number = _number(name, value, integer=kind == "integer")
    if (spec.low is not None and number < spec.low) or (spec.high is not None
                                                         and number > spec.high):
        raise ParamError(name, f"{number!r} is out of range [{spec.low}, {spec.high}]")
    return number


def _cpu_list(name: str, value: Any) -> tuple[int, ...]:
    try:
        return parse_cpu_list(value)
    except ValueError as err:
        raise ParamError(name, str(err)) from None


def _number(name: str, value: Any, *, integer: bool) -> int | float:
    if isinstance(value, bool):
        raise ParamError(name, f"expects a number, got {value!r}")
    if isinstance(value, str):
        try:
            value = float(value) if not integer else int(value.strip())
        except ValueError:
            raise ParamError(name, f"expects {'an integer' if integer else 'a number'}, "
                                   f"got {value!r}") from None
    if integer:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int):
            raise ParamError(name, f"expects an integer, got {value!r}")
        return value
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ParamError(name, f"expects a finite number, got {value!r}")
    return float(value)


def typed_values(table: Sequence[ParamSpec], values: Mapping[str, Any]) -> dict[str, Any]:
    """Return every parameter of ``table``: the given value, else the default, coerced.

    Raises:
        ParamError: a name not in the table, or a value of the wrong kind or out of range.
    """
    known = {s.name for s in table}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ParamError(unknown[0], f"is not a parameter of this node; known: "
                                     f"{', '.join(sorted(known))}")
    return {s.name: coerce(s, values.get(s.name, s.default)) for s in table}


def coerce_or_none(spec: ParamSpec, value: Any) -> Any:
    """Return the coerced value, or None where it does not coerce (for equality checks)."""
    try:
        return coerce(spec, value)
    except ParamError:
        return None
