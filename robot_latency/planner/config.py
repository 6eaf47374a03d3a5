"""The planner's configuration: one frozen dataclass, validated in one place."""

from __future__ import annotations

from dataclasses import dataclass, field

from robot_latency.errors import RobotLatencyError
from robot_latency.planner.fallback import FALLBACK_NAMES
from robot_latency.planner.margin import MarginSettings

MODES = ("periodic", "event")
ON_NEW_COMMAND = ("queue", "preempt")


class ConfigError(RobotLatencyError, ValueError):
    """A configuration value out of range; the message names the field and the value."""


@dataclass(frozen=True)
class PlannerConfig:
    """How the planner loop runs.

    Args:
        period_ms: planner period (periodic mode: one cycle per tick; unused in event mode).
        deadline_ms: deadline per cycle, counted from the cycle's scheduled start; <= period_ms
            in periodic mode, any length in event mode.
        mode: ``periodic`` (tick-driven, plans for the newest command) or ``event`` (each
            arriving command starts a cycle; the deadline counts from its arrival).
        publish_margin_ms: time kept before the deadline for the fallback and the publish; the
            model's plan must be ready by ``deadline - margin``.
        max_tokens: most tokens the model may generate per cycle; 0: the planner profile's.
        max_command_chars: longer commands are refused (fallback ``bad_command``), never fed to
            the model: the prompt's length bounds the prefill time.
        fallback: the fallback chain, in order (``rule``, ``hold``, ``stop``).
        hold_max_age_ms: ``hold`` repeats the last valid plan only while younger than this.
        mailbox_capacity: commands waiting at most; the oldest is dropped beyond it.
        grammar: constrain decoding with the output contract's grammar (the profile's).
        transport_margin_ms: time kept before the deadline, on top of ``publish_margin_ms``,
            for the plan to cross the middleware to its receiver; < 0: measured by the ROS node
            (loopback at start-up, then its own plans), between the floor and the cap below
            (:mod:`robot_latency.planner.margin`); 0: none (the CLI's ``run``, no middleware).
        transport_margin_floor_ms: the measured transport margin never goes below this.
        transport_margin_cap_ms: nor above this, nor above a quarter of what the deadline leaves
            after ``publish_margin_ms`` (the margin until enough samples arrived).
        on_new_command: what a command arriving while the model works on an older one does:
            ``queue`` (it waits for the older cycle to end) or ``preempt`` (the older generation
            is aborted at once and its command recorded as superseded; the newer one is planned
            with its full budget). Event mode only: a periodic tick already plans the newest.
    """

    period_ms: float = 200.0
    deadline_ms: float = 150.0
    mode: str = "periodic"
    publish_margin_ms: float = 2.0
    max_tokens: int = 0
    max_command_chars: int = 512
    fallback: tuple[str, ...] = field(default=("rule", "hold", "stop"))
    hold_max_age_ms: float = 1000.0
    mailbox_capacity: int = 16
    grammar: bool = True
    transport_margin_ms: float = 0.0
    transport_margin_floor_ms: float = 1.0
    transport_margin_cap_ms: float = 50.0
    on_new_command: str = "queue"

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> ConfigError:
            return ConfigError(f"{name}={getattr(self, name)!r}: {why}")

        if not self.period_ms > 0:
            raise bad("period_ms", "must be > 0")
        if not self.deadline_ms > 0:
            raise bad("deadline_ms", "must be > 0")
        # In event mode each command starts its own cycle: there is no period to fit into.
        if self.mode == "periodic" and self.deadline_ms > self.period_ms:
            raise bad("deadline_ms", f"must not exceed period_ms={self.period_ms!r}")
        if self.mode not in MODES:
            raise bad("mode", f"must be one of {MODES}")
        if not 0 <= self.publish_margin_ms < self.deadline_ms:
            raise bad("publish_margin_ms", "must be >= 0 and below deadline_ms")
        if self.max_tokens < 0:
            raise bad("max_tokens", "must be >= 1, or 0 for the planner profile's")
        if self.max_command_chars < 1:
            raise bad("max_command_chars", "must be >= 1")
        if not self.fallback or any(p not in FALLBACK_NAMES for p in self.fallback):
            raise bad("fallback", f"must be a non-empty sequence of {FALLBACK_NAMES}")
        if self.hold_max_age_ms < 0:
            raise bad("hold_max_age_ms", "must be >= 0")
        if self.mailbox_capacity < 1:
            raise bad("mailbox_capacity", "must be >= 1")
        if not 0 <= self.transport_margin_floor_ms <= self.transport_margin_cap_ms:
            raise bad("transport_margin_floor_ms",
                      f"must be >= 0 and <= transport_margin_cap_ms="
                      f"{self.transport_margin_cap_ms!r}")
        if self.publish_margin_ms + max(0.0, self.transport_margin_ms) >= self.deadline_ms:
            raise bad("transport_margin_ms", "plus publish_margin_ms must stay below "
                                             f"deadline_ms={self.deadline_ms!r}")
        if self.on_new_command not in ON_NEW_COMMAND:
            raise bad("on_new_command", f"must be one of {ON_NEW_COMMAND}")

    @property
    def period_ns(self) -> int:
        """The period in ns."""
        return round(self.period_ms * 1e6)

    @property
    def deadline_ns(self) -> int:
        """The deadline in ns from the scheduled start."""
        return round(self.deadline_ms * 1e6)

    def margin_settings(self) -> MarginSettings:
        """The transport margin's settings (see :mod:`robot_latency.planner.margin`)."""
        return MarginSettings(fixed_ms=self.transport_margin_ms,
                              floor_ms=self.transport_margin_floor_ms,
                              cap_ms=min(self.transport_margin_cap_ms,
                                         (self.deadline_ms - self.publish_margin_ms) / 4))

    @property
    def margin_ns(self) -> int:
        """The publish margin in ns."""
        return round(self.publish_margin_ms * 1e6)
