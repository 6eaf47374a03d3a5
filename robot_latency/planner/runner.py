"""How the loop gets a generation: the runner protocol, its outcome, and the inline runner.

A runner runs one request for the loop and gives up at a time the loop chooses; what it got is a
:class:`RunOutcome`. :func:`outcome_of` classifies a finished generation the same way for every
runner (inline here; the worker process's in :mod:`robot_latency.planner.worker`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
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


@dataclass(frozen=True)
class RunnerHealth:
    """What the runner knows about its engine's health (the node's diagnostics report it).

    Args:
        load_error: why the engine did not load (None: it did).
        server_check_error: why the engine's server did not answer its start-up check (None:
            it did, or there is no server).
    """

    load_error: str | None = None
    server_check_error: str | None = None


class Runner(Protocol):
    """Runs one generation for the loop, giving up at a time the loop chooses.

    ``interrupt``: polled while the generation runs; when it returns True the generation is
    aborted at once and the outcome is ``preempted`` (a newer command arrived).

    Every runner has all of this; a runner without a worker process answers ``pid`` None,
    ``restarts`` 0, ``worker_cpus`` None and ``collect_aborted`` None.
    """

    def run(self, request: GenerationRequest, *, give_up_ns: int,
            interrupt: Interrupt | None = None) -> RunOutcome: ...

    def info(self) -> dict[str, Any]: ...

    def close(self) -> None:
        """Stop the engine (and its worker process); idempotent."""

    def collect_aborted(self, until_ns: int) -> GenerationTrace | None:
        """The partial trace of the request given up on last, waited for until ``until_ns``."""

    def request_abort(self, request: GenerationRequest | None = None) -> None:
        """Ask ``request``'s generation (None: the one running now) to stop, from another
        thread; a request not started yet stops as it starts."""

    def generated_tokens(self) -> int | None:
        """Tokens out so far of the generation the loop waits for now (from another thread);
        None when it waits for none, or this runner cannot tell."""

    def health(self) -> RunnerHealth:
        """The engine's load and server-check errors."""

    @property
    def pid(self) -> int | None:
        """The engine worker's process id (None: the engine runs in this process)."""

    @property
    def restarts(self) -> int:
        """How often the engine worker was restarted."""

    @property
    def worker_cpus(self) -> tuple[int, ...] | None:
        """The cores the engine worker is pinned to (None: not pinned, or no worker)."""


class _AbortWhen:
    """An abort signal that is set when the loop's interrupt says so (``fired``: a preemption),
    or when ``stopped`` does (another thread asked this request to stop)."""

    def __init__(self, interrupt: Interrupt | None, stopped: Callable[[], bool]) -> None:
        self.interrupt = interrupt
        self.stopped = stopped
        self.fired = False

    def is_set(self) -> bool:
        if not self.fired and self.interrupt is not None and self.interrupt():
            self.fired = True
        return self.fired or self.stopped()


class InlineRunner:
    """Run the engine in the loop's own thread.

    The engine must honour ``request.deadline_ns`` itself (the simulated engine does; llama.cpp
    does through its abort callback). An engine that raises gives an ``error`` outcome; the loop
    never sees the exception.
    """

    #: no worker process: nothing to restart, pin or wait for
    pid: int | None = None
    restarts = 0
    worker_cpus: tuple[int, ...] | None = None

    def __init__(self, engine: Engine, *, clock: Clock = DEFAULT_CLOCK) -> None:
        self.engine = engine
        self.clock = clock
        self._lock = threading.Lock()
        self._running: GenerationRequest | None = None
        self._stop: GenerationRequest | None = None  # the request asked to stop, newest

    def run(self, request: GenerationRequest, *, give_up_ns: int,
            interrupt: Interrupt | None = None) -> RunOutcome:
        with self._lock:
            self._running = request
        abort = _AbortWhen(interrupt, lambda: self._stop is request)
        try:
            trace = self.engine.generate(request, abort=abort)
        except Exception as err:  # a broken engine must not stop the loop
            log.warning("engine %s raised: %r", getattr(self.engine, "name", "?"), err)
            return RunOutcome(None, "error", f"{type(err).__name__}: {err}")
        finally:
            with self._lock:
                self._running = None
        return outcome_of(trace, self.clock, give_up_ns, preempted=abort.fired)

    def info(self) -> dict[str, Any]:
        return {"runner": "inline", **self.engine.info()}

    def close(self) -> None:
        """Close the engine (the runner owns it; idempotent)."""
        self.engine.close()

    def collect_aborted(self, until_ns: int) -> GenerationTrace | None:
        """None: an inline generation is over when :meth:`run` returns, nothing is left."""
        return None

    def request_abort(self, request: GenerationRequest | None = None) -> None:
        """Ask ``request``'s generation (None: the one running now) to stop, from another
        thread (a hedge's server answered first); one not started yet stops as it starts. The
        engine stops at its next abort check, as at the loop's interrupt."""
        with self._lock:
            target = request if request is not None else self._running
            if target is not None:
                self._stop = target

    def generated_tokens(self) -> int | None:
        """None: an inline generation's tokens are the loop thread's until it returns."""
        return None

    def health(self) -> RunnerHealth:
        return RunnerHealth(server_check_error=self.engine.info().get("check_error"))


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


def clip_trace(trace: GenerationTrace, cut_ns: int) -> GenerationTrace:
    """Return what ``trace`` had done by ``cut_ns`` (when the loop gave up on it).

    An aborted generation answers a little after the give-up: tokens and prefill chunks
    stamped after it are left out, and a prefill still running then counts up to it
    (``phases_extra_ns["prefill"]``), so the record shows where the budget went, not what
    the engine did after nobody was waiting.
    """
    keep = sum(1 for t in trace.token_ns if t <= cut_ns)
    chunks = [t for t in trace.prefill_chunk_ns if t <= cut_ns]
    extra = dict(trace.phases_extra_ns)
    cut_prefill = len(chunks) < len(trace.prefill_chunk_ns) or (
        not trace.prefill_chunk_ns and "prefill" in extra)
    if cut_prefill and trace.tokenized_ns is not None and trace.tokenized_ns <= cut_ns:
        chunks = []  # the prefill did not finish by the give-up: one partial total instead
        extra["prefill"] = min(extra.get("prefill", cut_ns), cut_ns - trace.tokenized_ns)
    return replace(trace, token_ns=trace.token_ns[:keep], tokens=trace.tokens[:keep],
                   prefill_chunk_ns=chunks, phases_extra_ns=extra)
