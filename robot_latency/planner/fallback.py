"""Fallback policies, chained in config: ``rule``, ``hold``, ``stop``.

When the model's plan is late, invalid or missing, the chain is asked in order; the first policy
that gives a plan answers. ``rule`` reads the command with a keyword planner (and refuses what it
cannot read); ``hold`` never guesses: it repeats the last valid plan of the same command while it
is young, and for a new command publishes a safe stop-and-wait plan (the action language's
``wait``; a profile's stop plan otherwise). ``stop`` always answers, so a chain ending in it
never comes back empty.
Plans are JSON objects in the planner profile's output form: the profile supplies the ``rule``
planner (the bundled keyword planner, its own keyword map, or none: then ``rule`` is left out) and
the ``stop`` plan.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from robot_latency.profiles.actions import STOP_STEP_PLAN, Step, expand_to_plan
from robot_latency.profiles.rules import rule_plan_json

#: The stop-and-wait plan ``hold`` publishes for a new command (the action language's form).
WAIT_STEP_PLAN: dict[str, Any] = expand_to_plan([Step("wait")])

Plan = dict[str, Any]


@dataclass
class FallbackContext:
    """What a fallback policy may use: the command (None if there was none or it was bad), the
    time now, and the last valid plan with the time it was published and the command it was
    for."""

    command: str | None
    now_ns: int
    last_plan: Plan | None = None
    last_plan_ns: int | None = None
    last_plan_command: str | None = None


Policy = Callable[[FallbackContext], "Plan | None"]
RulePlanner = Callable[[str], "Plan | None"]


def make_rule_policy(rule: RulePlanner) -> Policy:
    """Return a policy that plans with a keyword planner; None when it reads nothing."""
    def rule_policy(ctx: FallbackContext) -> Plan | None:
        return None if ctx.command is None else rule(ctx.command)
    return rule_policy


def make_hold_policy(max_age_ms: float, wait_plan: Plan | None = None) -> Policy:
    """Return a policy that repeats the last valid plan while it is younger than max_age_ms;
    for a command other than the last plan's, ``wait_plan`` (a stop-and-wait) instead of it."""
    def hold_policy(ctx: FallbackContext) -> Plan | None:
        new_command = ctx.command is not None and ctx.command != ctx.last_plan_command
        if wait_plan is not None and new_command:
            return wait_plan
        if ctx.last_plan is None or ctx.last_plan_ns is None:
            return None
        if ctx.now_ns - ctx.last_plan_ns > max_age_ms * 1e6:
            return None
        return ctx.last_plan
    return hold_policy


FALLBACK_NAMES = ("rule", "hold", "stop")


class FallbackChain:
    """Ask policies in order; the first with a plan answers.

    Args:
        names: the chain, in order.
        hold_max_age_ms: ``hold``'s age limit (a run's setting, RunSettings.hold_max_age_ms).
        rule: the ``rule`` policy's planner; None leaves ``rule`` out of the chain (a profile
            whose vocabulary no keyword planner knows).
        stop_plan: the ``stop`` policy's plan.
        wait_plan: ``hold``'s stop-and-wait plan for a new command; by default the action
            language's ``wait`` where the stop plan is the action language's, else the stop plan.
    """

    def __init__(self, names: Sequence[str], *, hold_max_age_ms: float,
                 rule: RulePlanner | None = rule_plan_json,
                 stop_plan: Plan = STOP_STEP_PLAN, wait_plan: Plan | None = None) -> None:
        unknown = [n for n in names if n not in FALLBACK_NAMES]
        if unknown or not names:
            raise ValueError(f"fallback chain {list(names)!r}: unknown policies {unknown}; "
                             f"choose from {FALLBACK_NAMES}")
        self.stop_plan = stop_plan
        if wait_plan is None:
            wait_plan = WAIT_STEP_PLAN if stop_plan == STOP_STEP_PLAN else stop_plan
        self.wait_plan = wait_plan
        table: dict[str, Policy] = {"hold": make_hold_policy(hold_max_age_ms, wait_plan),
                                    "stop": lambda ctx: self.stop_plan}
        if rule is not None:
            table["rule"] = make_rule_policy(rule)
        self.names = tuple(n for n in names if n in table)
        self.dropped = tuple(n for n in names if n not in table)
        self._policies = [(n, table[n]) for n in self.names]

    @classmethod
    def of_run(cls, names: Sequence[str], *, hold_max_age_ms: float,
               planning: Any) -> FallbackChain:
        """The chain a run's loop answers with: ``names`` over ``planning``'s (a profile's
        :class:`~robot_latency.profiles.profile.Planning`) rule planner and stop plan."""
        return cls(names, hold_max_age_ms=hold_max_age_ms, rule=planning.rule,
                   stop_plan=planning.stop_plan)

    def answer(self, ctx: FallbackContext) -> tuple[str, Plan]:
        """Return (policy name, plan); a chain without ``stop`` that finds nothing stops anyway."""
        for name, policy in self._policies:
            plan = policy(ctx)
            if plan:
                return name, plan
        return "stop", self.stop_plan
