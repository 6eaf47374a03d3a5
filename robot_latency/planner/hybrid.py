"""Hedged planning: each cycle asks the onboard engine and an OpenAI-compatible server at once.

::

    run(request, give_up) ─► server request sent (its own coroutine; never waited on past give_up)
                          ─► onboard engine (its worker process) until give_up
                          ─► policy picks the plan to publish:
                               first_valid     the first schema-valid plan (the other is stopped:
                                               the onboard worker aborted, the server's stream
                                               closed)
                               prefer_server   the server's plan if valid by give_up, else the
                                               onboard one

Under either policy a valid server plan, once it arrives, aborts the onboard generation of its
cycle (it is the plan published), so the cycle goes on at once instead of waiting for a slow
onboard model until give_up. The abort names the onboard request it is for, so it holds even
when it comes before the worker has taken that request (:class:`~robot_latency.planner.abort.
AbortFlag`). A plan is finished when its generation ended by itself, ``done`` or ``complete``
(:func:`~robot_latency.engines.base.finished`), and valid when the contract parses it; the
server's is in time when its stream ended (``finished_ns``, stamped as the last chunk came) by
give_up.

The chosen side's trace goes to the loop; ``trace.server["hybrid"]`` keeps both sides' timings,
which plan was published and why, so a record shows the race. When neither is valid, the
onboard side's failure names the fallback reason, as onboard-only would, unless the onboard
model only ran out of time while the server failed: the server's fault names it then (a server
killed mid-stream is ``server_error``, not ``deadline``).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from robot_latency.clock import DEFAULT_CLOCK, Clock
from robot_latency.engines.base import (
    GenerationRequest,
    GenerationTrace,
    StopReason,
    finished,
)
from robot_latency.planner.config import HYBRID_POLICIES
from robot_latency.planner.loop import Interrupt, Runner, RunOutcome
from robot_latency.planner.runner import RunnerHealth

log = logging.getLogger(__name__)


def _side(trace: GenerationTrace | None, status: str, valid: bool,
          error: str | None) -> dict[str, Any]:
    """One side's timing for the record (absolute ns on the run's clock)."""
    if trace is None:
        return {"status": status, "valid": valid, "error": error, "started_ns": None,
                "first_token_ns": None, "last_token_ns": None, "finished_ns": None,
                "tokens": 0, "stop_reason": None}
    return {"status": status, "valid": valid, "error": error or trace.error,
            "started_ns": trace.started_ns,
            "first_token_ns": trace.token_ns[0] if trace.token_ns else None,
            "last_token_ns": trace.token_ns[-1] if trace.token_ns else None,
            "finished_ns": trace.finished_ns, "tokens": len(trace.token_ns),
            "stop_reason": trace.stop_reason.value}


def _server_status(trace: GenerationTrace, in_time: bool) -> str:
    """ok, late, stopped (closed: the onboard plan won), timeout or error."""
    if trace.stop_reason is StopReason.ABORTED:
        return "stopped"
    if trace.stop_reason is StopReason.DEADLINE:
        return "timeout"
    if trace.stop_reason is StopReason.ERROR:
        return "error"
    return "ok" if in_time else "late"


class HybridRunner:
    """Race an onboard runner and a server engine each cycle (module docstring).

    Args:
        onboard: the onboard engine's runner (a :class:`~robot_latency.planner.worker.
            ProcessRunner` keeps its worker process).
        server: an :class:`~robot_latency.engines.openai_server.OpenAIServerEngine`.
        contract: the profile's output contract (a plan is valid when it parses).
        policy: one of :data:`HYBRID_POLICIES`.
        clock: the loop's clock.
    """

    def __init__(self, onboard: Runner, server: Any, contract: Any, *,
                 policy: str, clock: Clock = DEFAULT_CLOCK) -> None:
        if policy not in HYBRID_POLICIES:
            raise ValueError(f"hybrid_policy={policy!r}: must be one of {HYBRID_POLICIES}")
        self.onboard, self.server, self.contract = onboard, server, contract
        self.policy, self.clock = policy, clock
        self._lock = threading.Lock()
        self._cycle = 0
        self._onboard_running = False
        self.published = {"onboard": 0, "server": 0, "none": 0}

    def _parses(self, text: str) -> bool:
        try:
            self.contract.parse(text)
        except Exception:
            return False
        return True

    def _valid(self, trace: GenerationTrace | None) -> bool:
        """A finished generation (done or complete) whose text the contract accepts."""
        return trace is not None and finished(trace) and self._parses(trace.text)

    def _on_server_done(self, cycle: int, request: GenerationRequest, pending: Any) -> None:
        """A valid server plan stops the onboard generation of the same cycle: it is the plan
        published (first_valid: it came first; prefer_server: it is preferred)."""
        text = pending.finished_text()
        if text is None or not self._parses(text):
            return
        with self._lock:
            if cycle == self._cycle and self._onboard_running:
                self.onboard.request_abort(request)

    def run(self, request: GenerationRequest, *, give_up_ns: int,
            interrupt: Interrupt | None = None) -> RunOutcome:
        """Ask both; return the outcome of the plan the policy publishes.

        ``interrupt`` (a newer command under ``on_new_command: preempt``) aborts the onboard
        generation; the server's request is then closed too, and the outcome is ``preempted``.
        """
        with self._lock:
            self._cycle += 1
            cycle = self._cycle
            self._onboard_running = True
        pending = self.server.start(request)
        pending.future.add_done_callback(
            lambda _f: self._on_server_done(cycle, request, pending))
        try:
            onboard = self.onboard.run(request, give_up_ns=give_up_ns, interrupt=interrupt)
        except Exception as err:  # a broken onboard engine leaves the server's answer
            log.warning("hybrid: onboard runner raised: %r", err)
            onboard = RunOutcome(None, "error", f"{type(err).__name__}: {err}")
        with self._lock:
            self._onboard_running = False
        if onboard.status == "preempted":
            pending.cancel()  # closes the stream: the server stops too
            return onboard
        on_valid = onboard.status == "ok" and self._valid(onboard.trace)
        if pending.done:
            server_trace = pending.finish(None)
        elif self.policy == "first_valid" and on_valid:
            server_trace = pending.cancel()  # closes the stream: the server stops
        else:
            server_trace = pending.wait(until_ns=give_up_ns)
        server_ok = finished(server_trace) and (server_trace.finished_ns or 0) <= give_up_ns
        sv_valid = server_ok and self._valid(server_trace)
        choice, why = self._choose(on_valid, sv_valid, onboard.trace, server_trace)
        self.published[choice] += 1
        stopped = not on_valid and onboard.trace is not None and sv_valid and \
            onboard.trace.stop_reason is StopReason.ABORTED  # by the server's plan
        race = {"policy": self.policy, "published": None if choice == "none" else choice,
                "why": why,
                "onboard": _side(onboard.trace, "stopped" if stopped else onboard.status,
                                 on_valid, onboard.error),
                "server": {**_side(server_trace, _server_status(server_trace, server_ok),
                                   sv_valid, None), "fault": server_trace.fault}}
        if choice == "server":
            server_trace.server = {**(server_trace.server or {}), "hybrid": race}
            return RunOutcome(server_trace, "ok")
        if choice == "onboard":
            assert onboard.trace is not None
            onboard.trace.server = {**(server_trace.server or {}), "hybrid": race}
            return RunOutcome(onboard.trace, "ok")
        if onboard.status == "timeout" and server_trace.fault is not None:
            # Neither, and the server failed while the onboard model only ran out of time: the
            # server's fault is the reason (module docstring).
            server_trace.server = {**(server_trace.server or {}), "hybrid": race}
            return RunOutcome(server_trace, "error", server_trace.error)
        # Neither: the onboard side's outcome decides the fallback reason (as onboard-only
        # would), the record still shows the server's try.
        trace = onboard.trace or GenerationTrace(started_ns=server_trace.started_ns,
                                                 stop_reason=StopReason.DEADLINE,
                                                 finished_ns=self.clock())
        trace.server = {**(server_trace.server or {}), "hybrid": race}
        return RunOutcome(trace, onboard.status, onboard.error)

    def _choose(self, on_valid: bool, sv_valid: bool, on_trace: GenerationTrace | None,
                sv_trace: GenerationTrace) -> tuple[str, str]:
        if on_valid and sv_valid:
            if self.policy == "prefer_server":
                return "server", "both valid; the server is preferred"
            assert on_trace is not None
            # when each side's plan was finished: its generation's end, stamped where it ended
            on_t = on_trace.finished_ns or (on_trace.token_ns or [0])[-1]
            sv_t = sv_trace.finished_ns or (sv_trace.token_ns or [0])[-1]
            return (("server", "both valid; the server's came first") if sv_t < on_t
                    else ("onboard", "both valid; the onboard one came first"))
        if sv_valid:
            return "server", "only the server's plan was valid in time"
        if on_valid:
            return "onboard", ("the server's plan was not valid in time"
                               if self.policy == "prefer_server"
                               else "only the onboard plan was valid in time")
        return "none", "neither plan was valid in time"

    def info(self) -> dict[str, Any]:
        return {"runner": "hybrid", "hybrid_policy": self.policy,
                "onboard": self.onboard.info(), "server": self.server.info(),
                "published": dict(self.published)}

    def collect_aborted(self, until_ns: int) -> GenerationTrace | None:
        """The onboard worker's partial trace of the request given up on last, if it has one."""
        return self.onboard.collect_aborted(until_ns)

    def request_abort(self, request: GenerationRequest | None = None) -> None:
        """Stop the onboard generation (the server's request ends with its cycle)."""
        self.onboard.request_abort(request)

    def generated_tokens(self) -> int | None:
        """The onboard generation's tokens so far (the server's stream is not counted)."""
        return self.onboard.generated_tokens()

    def health(self) -> RunnerHealth:
        """The onboard engine's load error; why the server did not answer at start-up."""
        return RunnerHealth(load_error=self.onboard.health().load_error,
                            server_check_error=self.server.check_error)

    @property
    def pid(self) -> int | None:
        """The onboard worker's process id, if it has one."""
        return self.onboard.pid

    @property
    def restarts(self) -> int:
        return self.onboard.restarts

    @property
    def worker_cpus(self) -> tuple[int, ...] | None:
        return self.onboard.worker_cpus

    def close(self) -> None:
        """Stop the onboard worker and the server client."""
        self.onboard.close()
        self.server.close()
