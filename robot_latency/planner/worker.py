"""Run the engine in a worker process, so neither the GIL nor a crash in the engine holds the loop.

The loop's thread only waits on a pipe with a timeout: whatever the engine does (computes past
the deadline, raises, hangs, is killed), the loop wakes at its give-up time and answers with a
fallback. Clock: the worker stamps its trace with ``time.perf_counter_ns``, which on Linux reads
CLOCK_MONOTONIC, the same system-wide clock the loop reads, so timestamps compare across the two
processes.

Thread and core budget: the worker's engine uses ``n_threads`` cores; leave one core to the loop
(docs/REFERENCE.md, "Measured on the development machine": a waiting thread woke 3.9 ms late at p99
with llama.cpp on both cores, 0.29 ms with one core left free).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

from robot_latency.clock import DEFAULT_CLOCK, Clock
from robot_latency.engines.base import GenerationRequest, GenerationTrace
from robot_latency.lifetime import start_process
from robot_latency.planner.abort import AbortFlag
from robot_latency.planner.config import DEFAULT_HANG_TIMEOUT_MS
from robot_latency.planner.runner import Interrupt, RunnerHealth, RunOutcome, outcome_of

log = logging.getLogger(__name__)

#: How often a generation that a newer command may preempt checks for one (ns).
INTERRUPT_POLL_NS = 2_000_000


def _worker_main(conn: Connection, abort: AbortFlag, engine_name: str,
                 options: dict[str, Any], nice: int, cpus: tuple[int, ...] | None,
                 log_level: int = logging.WARNING) -> None:
    """Create the engine, then answer requests until the pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when the worker ends
    # A spawned process starts with logging unconfigured: log at the parent's level, and route
    # llama.cpp's own lines to the logger (debug) before any model loads here.
    logging.basicConfig(level=log_level, format="%(levelname)s %(name)s (engine worker): "
                                                "%(message)s")
    if engine_name != "sim":
        from robot_latency.engines.llamalog import route_llama_log

        route_llama_log()
    # The loop must win the CPU when both want it: the engine runs at a lower priority, and on
    # its own cores when told which. A loop running real-time (chrt) must not pass that on.
    if hasattr(os, "sched_setscheduler") and os.sched_getscheduler(0) != os.SCHED_OTHER:
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    if nice:
        os.nice(nice)
    if cpus:
        os.sched_setaffinity(0, cpus)
    from robot_latency.planner.engine import create_planner_engine

    try:
        engine = create_planner_engine(engine_name, **options)
    except Exception as err:
        conn.send(("load_error", f"{type(err).__name__}: {err}"))
        return
    with engine:
        conn.send(("ready", engine.info()))
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                break
            if msg is None:
                break
            seq, request = msg
            try:
                trace = engine.generate(request, abort=abort.for_request(seq))
                conn.send(("trace", seq, trace.to_dict()))
            except Exception as err:
                conn.send(("error", seq, f"{type(err).__name__}: {err}"))


class ProcessRunner:
    """Run generations in a worker process; restart it when it hangs or dies.

    Args:
        engine_name: registered engine name, created inside the worker.
        options: keyword options for the engine (picklable).
        hang_timeout_ms: a generation still running this long after its give-up time is hung:
            the worker is killed and restarted.
        load_timeout_s: how long the worker may take to load the model and evaluate the
            profile's fixed prompt prefix (minutes for a large model on slow storage).
        clock: the loop's clock (must be ``time.perf_counter_ns``-compatible across processes).
        worker_nice: niceness added to the worker, so the loop's thread wins the CPU.
        worker_cpus: CPUs the worker may run on (None: any); leave one to the loop.
        spin_ms: the last stretch before a give-up time is waited by polling without blocking
            (a blocking poll wakes up to 1 ms late); costs that much CPU on the loop's core.
        nap_ms: sleep this long between two polls of that stretch (0: spin; see
            :attr:`~robot_latency.planner.budget.CpuBudget.nap_ms`).
    """

    def __init__(self, engine_name: str, options: dict[str, Any] | None = None, *,
                 hang_timeout_ms: float = DEFAULT_HANG_TIMEOUT_MS, load_timeout_s: float = 600.0,
                 clock: Clock = DEFAULT_CLOCK, worker_nice: int = 5,
                 worker_cpus: tuple[int, ...] | None = None, spin_ms: float = 1.5,
                 nap_ms: float = 0.0) -> None:
        self.engine_name = engine_name
        self.options = dict(options or {})
        self.hang_timeout_ns = int(hang_timeout_ms * 1e6)
        self.load_timeout_s = load_timeout_s
        self.clock = clock
        self.worker_nice = worker_nice
        self.worker_cpus = worker_cpus
        self.spin_ns = int(spin_ms * 1e6)
        self.nap_s = nap_ms / 1e3
        self._ctx = mp.get_context("spawn")  # no fork of the loop's threads or a loaded model
        self._proc: Any = None
        self._conn: Connection | None = None
        self._abort: AbortFlag | None = None
        self._seq = 0
        self._busy_seq: int | None = None   # request still running in the worker
        # The request sent last (its object and id), one whose abort was asked before it was
        # sent (request_abort from another thread), the flag's stores: under _abort_lock.
        self._abort_lock = threading.Lock()
        self._sent: tuple[GenerationRequest, int] | None = None
        self._abort_wanted: GenerationRequest | None = None
        self._in_flight = False             # a run() is waiting for the worker's answer
        self._busy_give_up_ns = 0
        self.engine_info: dict[str, Any] = {}
        self.restarts = 0
        self.load_error: str | None = None
        self.events: list[tuple[int, str]] = []  # (ns, what happened), for the run's record
        self._loading = False

    # --- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        """Start the worker and wait until its engine is loaded (blocking: before the loop runs).

        Raises:
            RuntimeError: the engine could not be loaded (the message is the engine's error).
        """
        self._launch()
        assert self._conn is not None
        if not self._conn.poll(self.load_timeout_s):
            self._stop_worker(polite=False)
            raise RuntimeError(f"engine {self.engine_name!r} did not load within "
                               f"{self.load_timeout_s} s")
        if not self._collect_ready():
            raise RuntimeError(self.load_error or f"engine {self.engine_name!r} failed to load")

    def _launch(self) -> None:
        """Start a worker process without waiting for it to load."""
        self._stop_worker(polite=False)
        parent, child = self._ctx.Pipe()
        self._abort = AbortFlag(self._ctx)
        # The worker dies with this process, however it ends (a SIGKILL included).
        self._proc = start_process(self._ctx, _worker_main, name=f"engine-{self.engine_name}",
                                   args=(child, self._abort, self.engine_name,
                                         self.options, self.worker_nice,
                                         self.worker_cpus,
                                         logging.getLogger().getEffectiveLevel()),
                                   daemon=True)
        child.close()
        self._conn = parent
        self._busy_seq = None
        self._loading = True

    def _collect_ready(self) -> bool:
        """Read the worker's load answer; True when the engine is ready."""
        assert self._conn is not None
        try:
            kind, payload = self._conn.recv()
        except (EOFError, OSError):
            self.load_error = f"engine {self.engine_name!r} worker died while loading"
            self._stop_worker(polite=False)
            return False
        if kind != "ready":
            self.load_error = payload
            self._stop_worker(polite=False)
            return False
        self.engine_info = payload
        self.load_error = None
        self._loading = False
        return True

    def close(self) -> None:
        """Stop the worker (idempotent)."""
        self._stop_worker()

    def __enter__(self) -> ProcessRunner:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _stop_worker(self, *, polite: bool = True) -> None:
        """End the worker: ask it to exit (polite) or kill it at once (hung, dead, restart)."""
        if polite and self._conn is not None and not self._loading:
            try:
                self._conn.send(None)
            except (OSError, ValueError):
                pass
        if self._proc is not None:
            if polite:
                self._proc.join(timeout=0.5)
            if self._proc.is_alive():
                self._proc.kill()
            self._proc.join(timeout=5)
        if self._conn is not None:
            self._conn.close()
        self._proc, self._conn = None, None

    def _restart(self, why: str) -> None:
        """Kill the worker and launch a new one; the loop does not wait for it to load."""
        self.events.append((self.clock(), why))
        log.warning("engine worker: %s; restarting", why)
        self.restarts += 1
        self._launch()

    def health(self) -> RunnerHealth:
        return RunnerHealth(load_error=self.load_error,
                            server_check_error=self.engine_info.get("check_error"))

    @property
    def pid(self) -> int | None:
        """The worker's process id (None when not running)."""
        return None if self._proc is None else self._proc.pid

    def info(self) -> dict[str, Any]:
        return {"runner": "process", "hang_timeout_ms": self.hang_timeout_ns / 1e6,
                "restarts": self.restarts, "worker_nice": self.worker_nice,
                "worker_cpus": self.worker_cpus, **self.engine_info}

    # --- one generation ---------------------------------------------------------------------
    def _drain_late(self) -> None:
        """Collect the late answer of an earlier request, or restart a hung or dead worker."""
        if self._busy_seq is None:
            return
        assert self._conn is not None
        try:
            while self._conn.poll(0):
                msg = self._conn.recv()
                if msg[0] in ("trace", "error") and msg[1] == self._busy_seq:
                    self._busy_seq = None
                    return
        except (EOFError, OSError):
            self._restart("worker died")
            return
        if not self._proc.is_alive():
            self._restart(f"worker died (exit code {self._proc.exitcode})")
        elif self.clock() - self._busy_give_up_ns > self.hang_timeout_ns:
            self._restart("worker hung past the watchdog")

    def _wait_free(self, give_up_ns: int) -> bool:
        """Wait, until ``give_up_ns``, for the worker to answer a request aborted earlier.

        An abort lands within milliseconds, so a cycle that starts while the worker still
        finishes the previous (aborted) request waits for it within its own budget rather than
        falling back at once. True when the worker is free; False at the give-up time, or when
        it died (it is then restarted).
        """
        assert self._conn is not None
        self.events.append((self.clock(), f"waiting for aborted request {self._busy_seq}"))
        while self._busy_seq is not None:
            try:
                if not self._wait_ready(give_up_ns):
                    return False
                msg = self._conn.recv()
            except (EOFError, OSError):
                self._restart("worker died finishing an aborted request")
                return False
            if msg[0] in ("trace", "error") and msg[1] == self._busy_seq:
                self._busy_seq = None
        self.events.append((self.clock(), "worker free after the aborted request"))
        return True

    def run(self, request: GenerationRequest, *, give_up_ns: int,
            interrupt: Interrupt | None = None) -> RunOutcome:
        """Send ``request`` to the worker; wait at most until ``give_up_ns``.

        A worker still finishing a request aborted in an earlier cycle is waited for within
        this budget (the outcome's ``wait_ns``); only a worker not free by ``give_up_ns`` gives
        ``unavailable``. ``interrupt`` is polled every :data:`INTERRUPT_POLL_NS` while the
        generation runs: when it says so, the generation is aborted (``preempted``).
        """
        t0 = self.clock()
        waited = self._wait_free_ns(give_up_ns)
        if waited is None:
            return RunOutcome(None, "unavailable", "engine still busy with an earlier cycle",
                              wait_ns=self.clock() - t0)
        outcome = self._run(request, give_up_ns, interrupt)
        outcome.wait_ns = waited
        return outcome

    def _wait_free_ns(self, give_up_ns: int) -> int | None:
        """Wait for a worker still finishing an aborted request; return the ns waited (None:
        not free by ``give_up_ns``)."""
        if self._proc is None or self._conn is None or self._loading:
            return 0
        if not self._proc.is_alive():
            return 0
        self._drain_late()
        if self._busy_seq is None or self._loading:
            return 0
        t0 = self.clock()
        if not self._wait_free(give_up_ns):
            return None
        return self.clock() - t0

    def collect_aborted(self, until_ns: int) -> GenerationTrace | None:
        """Return the partial trace of the request given up on last, waiting until ``until_ns``.

        The worker answers an abort with the trace so far (its prefill chunks and the tokens it
        produced); None when it has not answered by then (it stays busy: the next cycle waits
        for it) or answered with an error.
        """
        if self._busy_seq is None or self._conn is None:
            return None
        try:
            while self._busy_seq is not None:
                if not self._wait_ready(until_ns):
                    return None
                msg = self._conn.recv()
                if msg[0] in ("trace", "error") and msg[1] == self._busy_seq:
                    self._busy_seq = None
                    return GenerationTrace.from_dict(msg[2]) if msg[0] == "trace" else None
        except (EOFError, OSError):
            return None  # the next cycle notices the dead worker and restarts it
        return None

    def _run(self, request: GenerationRequest, give_up_ns: int,
             interrupt: Interrupt | None) -> RunOutcome:
        if self._proc is None or self._conn is None:
            self._restart("no worker")
        assert self._proc is not None and self._conn is not None
        if self._loading:
            # A restarted worker loads in the background; cycles fall back meanwhile.
            if not self._proc.is_alive():
                self._restart(f"worker died while loading (exit code {self._proc.exitcode})")
                return RunOutcome(None, "unavailable", "engine worker restarting")
            if not self._conn.poll(0):
                return RunOutcome(None, "unavailable", "engine loading after a restart")
            if not self._collect_ready():
                return RunOutcome(None, "unavailable", self.load_error)
        elif not self._proc.is_alive():
            self._restart(f"worker died (exit code {self._proc.exitcode})")
            return RunOutcome(None, "unavailable", "engine worker died; restarting")
        self._drain_late()
        if self._busy_seq is not None and not self._wait_free(give_up_ns):
            return RunOutcome(None, "unavailable", "engine still busy with an earlier cycle")
        if self._loading or self._proc is None or self._conn is None:
            return RunOutcome(None, "unavailable", "engine restarting")
        assert self._abort is not None
        self._seq += 1
        seq = self._seq
        with self._abort_lock:
            self._sent = (request, seq)
            if self._abort_wanted is request:  # asked for before it could be sent
                self._abort_wanted = None
                self._abort.stop(seq)
        self._abort.reset_tokens()
        try:
            self._conn.send((seq, request))
        except (OSError, ValueError) as err:
            self._restart(f"worker pipe broken: {err}")
            return RunOutcome(None, "unavailable", "engine worker was restarted")
        self._in_flight = True
        try:
            return self._answer(seq, give_up_ns, interrupt)
        finally:
            self._in_flight = False

    def generated_tokens(self) -> int | None:
        """Tokens out so far of the generation the loop waits for now (any thread); None when
        it waits for none."""
        abort = self._abort
        return abort.tokens if self._in_flight and abort is not None else None

    def _answer(self, seq: int, give_up_ns: int, interrupt: Interrupt | None) -> RunOutcome:
        assert self._proc is not None and self._conn is not None and self._abort is not None
        while True:
            try:
                ready = self._wait_ready(give_up_ns, interrupt)
                msg = self._conn.recv() if ready else None
            except (EOFError, OSError):
                code = self._proc.exitcode if self._proc is not None else None
                self._restart(f"worker died mid-generation (exit code {code})")
                return RunOutcome(None, "error", f"engine worker died (exit code {code})")
            if msg is None:
                # Not done in time, or a newer command preempts it: ask the engine to stop,
                # keep the slot busy until it answers (collect_aborted takes its trace).
                with self._abort_lock:
                    self._abort.stop(seq)
                self._busy_seq, self._busy_give_up_ns = seq, self.clock()
                preempted = interrupt is not None and self.clock() < give_up_ns
                return RunOutcome(None, "preempted" if preempted else "timeout")
            kind, got_seq, payload = msg
            if got_seq != seq:
                continue  # a stale answer from an aborted request
            if kind == "error":
                return RunOutcome(None, "error", payload)
            return outcome_of(GenerationTrace.from_dict(payload), self.clock, give_up_ns)

    def _wait_ready(self, give_up_ns: int, interrupt: Interrupt | None = None) -> bool:
        """Wait for the worker's answer until ``give_up_ns``; True when one is ready.

        ``Connection.poll`` rounds its timeout up to whole milliseconds (poll(2)), so a plain
        poll wakes up to 1 ms late. Sleep in poll until ``spin_ns`` before the give-up time,
        then poll without blocking until it: the loop's thread wakes within microseconds.
        With ``interrupt``, the sleeps last at most :data:`INTERRUPT_POLL_NS` and the wait ends
        (False) as soon as it returns True.
        """
        assert self._conn is not None
        while True:
            remaining = give_up_ns - self.clock()
            if remaining <= 0:
                return bool(self._conn.poll(0))
            if interrupt is not None and interrupt():
                return bool(self._conn.poll(0))
            if remaining > self.spin_ns:
                sleep_ns = remaining - self.spin_ns
                if interrupt is not None:
                    sleep_ns = min(sleep_ns, INTERRUPT_POLL_NS)
                if self._conn.poll(sleep_ns / 1e9):
                    return True
                continue
            if self._conn.poll(0):
                return True
            if self.nap_s:
                time.sleep(min(self.nap_s, remaining / 1e9))

    def request_abort(self, request: GenerationRequest | None = None) -> None:
        """Ask the worker to stop ``request``'s generation (None: the one sent last), also when
        it is not sent yet: it then stops as it starts (thread-safe; e.g. a hedged request
        answered first while the worker still finished an earlier, aborted one)."""
        with self._abort_lock:
            sent = self._sent
            if request is None or (sent is not None and sent[0] is request):
                if sent is not None and self._abort is not None:
                    self._abort.stop(sent[1])
            else:
                self._abort_wanted = request

    def kill_worker(self) -> None:
        """SIGKILL the worker (for fault drills); the next cycle notices and restarts it."""
        if self._proc is not None and self._proc.pid is not None:
            os.kill(self._proc.pid, signal.SIGKILL)
            time.sleep(0)  # let the signal land before the caller goes on
