"""Declare a node's parameter table (:mod:`robot_latency.ros.params`) on an rclpy node."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor
from rclpy.exceptions import InvalidParameterTypeException, InvalidParameterValueException
from rclpy.node import Node

from robot_latency.ros.param_spec import ParamError, ParamSpec


def descriptor(spec: ParamSpec) -> ParameterDescriptor:
    """Return the ROS descriptor of one parameter: description, constraints and range.

    Parameters are dynamically typed (a number may come as an int, a float or a launch
    argument's string); :func:`robot_latency.ros.params.coerce` does the type check. The range
    is still declared, for ``ros2 param describe`` and for values of the declared kind.
    """
    d = ParameterDescriptor(name=spec.name, description=spec.description,
                            additional_constraints=spec.constraints(), dynamic_typing=True)
    if spec.low is not None and spec.high is not None:
        if spec.kind == "double":
            d.floating_point_range = [FloatingPointRange(from_value=float(spec.low),
                                                         to_value=float(spec.high), step=0.0)]
        elif spec.kind == "integer":
            d.integer_range = [IntegerRange(from_value=int(spec.low), to_value=int(spec.high),
                                            step=0)]
    return d


def declare_table(node: Node, table: Sequence[ParamSpec]) -> dict[str, Any]:
    """Declare every parameter of ``table`` on ``node``; return their values (overrides applied).

    Raises:
        ParamError: rclpy refused a value (e.g. out of the declared range); names the parameter.
    """
    values: dict[str, Any] = {}
    for spec in table:
        try:
            param = node.declare_parameter(spec.name, spec.default, descriptor(spec))
        except (InvalidParameterValueException, InvalidParameterTypeException) as err:
            raise ParamError(spec.name, str(err)) from err
        values[spec.name] = param.value
    return values


def unknown_overrides(node: Node, table: Sequence[ParamSpec]) -> list[str]:
    """Return overridden parameter names (params file, ``-p``) that ``table`` does not declare.

    rclpy ignores such overrides silently, so a typo in a params file would go unnoticed.
    """
    known = {s.name for s in table} | {"use_sim_time", "start_type_description_service"}
    overrides = getattr(node, "_parameter_overrides", None) or {}  # no public accessor
    return sorted(name for name in overrides if name not in known and "." not in name)
