"""Errors raised by the floor model and its datasheet and model-facts readers."""

from robot_latency.errors import RobotLatencyError


class FloorError(RobotLatencyError):
    """Base class for errors in the floor model."""


class UnknownDeviceError(FloorError, KeyError):
    """A device id that no datasheet matches."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""


class ProbeError(FloorError):
    """The host probe failed or its cache could not be read or written."""


class ModelInfoError(FloorError):
    """A model file or preset could not be read into its facts."""


class UnknownPresetError(ModelInfoError, KeyError):
    """A model preset name that no shape matches."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class CalibrationError(FloorError):
    """A calibration that cannot be fitted, read or applied (the message names what and why)."""


class TableError(FloorError):
    """The published-measurement table is malformed (the message names the row and field)."""


class UnsupportedArchitectureError(ModelInfoError):
    """An architecture the floor cannot count (hybrid state-space, mixture-of-experts)."""
