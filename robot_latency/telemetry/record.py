"""The telemetry record: one read of a Jetson's power, clock, thermal and throttle state."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["JetsonTelemetry"]


@dataclass(frozen=True)
class JetsonTelemetry:
    """One read of the Jetson's power, clock, thermal and throttle state; unknown values are None.

    Frequencies are in Hz, loads in percent (0-100), temperatures in degrees C, rail power in
    mW. ``read_ns`` is the clock reading when the read began and ``read_cost_ns`` how long it took.
    """

    power_mode: str | None = None
    gpu_freq_hz: int | None = None
    gpu_max_freq_hz: int | None = None
    gpu_load_pct: float | None = None
    emc_freq_hz: int | None = None
    emc_load_pct: float | None = None
    temperatures_c: dict[str, float] = field(default_factory=dict)
    throttled: bool | None = None
    throttle_reasons: tuple[str, ...] = ()
    power_mw: dict[str, float] = field(default_factory=dict)
    read_ns: int | None = None
    read_cost_ns: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return the record as a JSON-ready dict."""
        out = asdict(self)
        out["throttle_reasons"] = list(self.throttle_reasons)
        return out
