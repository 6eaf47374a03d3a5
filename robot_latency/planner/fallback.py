"""Fallback policies, chained in config: ``rule``, ``hold``, ``stop``.

When the model's plan is late, invalid or missing, the chain is asked in order; the first policy
that gives a plan answers. ``stop`` always answers, so a chain ending in it never comes back empty.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from robot_latency.models.plan import Step
from robot_latency.planner.rules import rule_plan

STOP_PLAN: tuple[Step, ...] = (Step("stop"),)


@dataclass
class FallbackContext:
    """What a fallback policy may use: the command (None if there was none or it was bad), the
    time now, and the last valid plan with the time it was published."""

    command: str | None
    now_ns: int
    last_plan: tuple[Step, ...] | None = None
    last_plan_ns: int | None = None


Policy = Callable[[FallbackContext], "tuple[Step, ...] | None"]


def rule_policy(ctx: FallbackContext) -> tuple[Step, ...] | None:
    """Plan with the keyword planner; None when it reads nothing."""
    if ctx.command is None:
        return None
    steps = rule_plan(ctx.command)
    return tuple(steps) if steps else None


def make_hold_policy(max_age_ms: float) -> Policy:
    """Return a policy that repeats the last valid plan while it is younger than max_age_ms."""
    def hold_policy(ctx: FallbackContext) -> tuple[Step, ...] | None:
        if ctx.last_plan is None or ctx.last_plan_ns is None:
            return None
        if ctx.now_ns - ctx.last_plan_ns > max_age_ms * 1e6:
            return None
        return ctx.last_plan
    return hold_policy


def stop_policy(ctx: FallbackContext) -> tuple[Step, ...]:
    """Return the safe stop plan (always answers)."""
    return STOP_PLAN


FALLBACK_NAMES = ("rule", "hold", "stop")


class FallbackChain:
    """Ask policies in order; the first with a plan answers."""

    def __init__(self, names: Sequence[str], *, hold_max_age_ms: float = 1000.0) -> None:
        unknown = [n for n in names if n not in FALLBACK_NAMES]
        if unknown or not names:
            raise ValueError(f"fallback chain {list(names)!r}: unknown policies {unknown}; "
                             f"choose from {FALLBACK_NAMES}")
        table: dict[str, Policy] = {"rule": rule_policy,
                                    "hold": make_hold_policy(hold_max_age_ms),
                                    "stop": stop_policy}
        self.names = tuple(names)
        self._policies = [(n, table[n]) for n in self.names]

    def answer(self, ctx: FallbackContext) -> tuple[str, tuple[Step, ...]]:
        """Return (policy name, plan); a chain without ``stop`` that finds nothing stops anyway."""
        for name, policy in self._policies:
            plan = policy(ctx)
            if plan:
                return name, plan
        return "stop", STOP_PLAN
