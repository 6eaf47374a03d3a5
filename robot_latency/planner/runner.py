"""How the loop gets a generation: the runner protocol, its outcome, and the inline runner.

A runner runs one request for the loop and gives up at a time the loop chooses; what it got is a
:class:`RunOutcome`. :func:`outcome_of` classifies a finished generation the same way for every
runner (inline here; the worker process's in :mod:`robot_latency.planner.worker`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from robot_latency.clock import DEFAULT_CLOCK, Clock
from robot_latency.engines.base import Engine, GenerationRequest, GenerationTrace, StopReason

log = logging.getLogger(__name__)


@dataclass
class RunOutcome:
    """What a runner got from the engine for one request."""

    trace: GenerationTrace | None
    status: str  # "ok", "timeout" (not done by the give-up time), "error", "unavailable",
    #              "preempted" (a newer command arrived; on_new_command: preempt)
    error: str | None = None
    wait_ns: int = 0  # waited for the worker to finish a request aborted earlier


Interrupt = Callable[[], bool]


class Runner(Protocol):
    """Runs one generation for the loop, giving up at a time the loop chooses.

    ``interrupt``: polled while the generation runs; when it returns True the generation is
    aborted at once and the outcome is ``preempted`` (a newer command arrived).
    """

    def run(self, request: GenerationRequest, *, give_up_ns: int,
            interrupt: Interrupt | None = None) -> RunOutcome: ...

    def info(self) -> dict[str, Any]: ...


class _AbortWhen:
    """An abort signal that is set when the loop's interrupt says so."""

    def __init__(self, interrupt: Interrupt) -> None:
        self.interrupt = interrupt
        self.fired = False

    def is_set(self) -> bool:
        if not self.fired and self.interrupt():
            self.fired = True
        return self.fired


class InlineRunner:
    """Run the engine in the loop's own thread.

    The engine must honour ``request.deadline_ns`` itself (the simulated engine does; llama.cpp
    does through its abort callback). An engine that raises gives an ``error`` outcome; the loop
    never sees the exception.
    """

    def __init__(self, engine: Engine, *, clock: Clock = DEFAULT_CLOCK) -> None:
        self.engine = engine
        self.clock = clock

    def run(self, request: GenerationRequest, *, give_up_ns: int,
            interrupt: Interrupt | None = None) -> RunOutcome:
        abort = _AbortWhen(interrupt) if interrupt is not None else None
        try:
            trace = self.engine.generate(request, abort=abort)
        except Exception as err:  # a broken engine must not stop the loop
            log.warning("engine %s raised: %r", getattr(self.engine, "name", "?"), err)
            return RunOutcome(None, "error", f"{type(err).__name__}: {err}")
        return outcome_of(trace, self.clock, give_up_ns,
                          preempted=abort is not None and abort.fired)

    def info(self) -> dict[str, Any]:
        return {"runner": "inline", **self.engine.info()}

    def close(self) -> None:
        """Close the engine (the runner owns it; idempotent)."""
        self.engine.close()


def outcome_of(trace: GenerationTrace, clock: Clock, give_up_ns: int, *,
               preempted: bool = False) -> RunOutcome:
    """Classify a generation that came back: ``error`` (the engine failed), ``preempted`` (a
    newer command stopped it), ``timeout`` (back after ``give_up_ns``, or stopped by its
    deadline or an abort), else ``ok``. The clock is read only when the first two do not apply.
    """
    if trace.stop_reason is StopReason.ERROR:
        return RunOutcome(trace, "error", trace.error)
    if preempted:
        return RunOutcome(trace, "preempted")
    if clock() > give_up_ns or trace.stop_reason in (StopReason.DEADLINE, StopReason.ABORTED):
        return RunOutcome(trace, "timeout")
    return RunOutcome(trace, "ok")
