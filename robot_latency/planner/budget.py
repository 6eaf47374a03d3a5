"""The loop's CPU budget: which cores the loop and the engine use, and at what priority.

A thread that must wake at a deadline wakes late when the engine computes on its core
(docs/REFERENCE.md, "Measured on the development machine": 3.9 ms late at p99 with llama.cpp on both
cores, 0.29 ms with one core free). The budget makes the remedy explicit and recorded with the run:

* ``loop_cpus``: the loop's thread runs only on these cores (empty: wherever the OS puts it).
* ``engine_cpus``: the engine worker runs only on these (empty: every core the loop does not
  own when ``loop_cpus`` is set, else anywhere). Give the engine ``n_threads`` <= their count.
* ``engine_nice``: niceness added to the engine worker, so the loop wins a shared core.
* no ``loop_cpus`` (the default): the engine may use every core (its prefill threads do), the
  loop shares them and is woken early (:attr:`CpuBudget.spin_ms`): the model gets the machine,
  the fallback stays on time.
* ``loop_priority``: 1-99 runs the loop's thread under ``SCHED_FIFO`` at that priority: no
  ordinary process on its core can delay it. Needs ``CAP_SYS_NICE`` or an ``rtprio`` limit
  (``/etc/security/limits.conf``); 0 keeps the normal scheduler. The engine worker is always
  put back on the normal scheduler.

The loop also freezes the heap it starts with (:func:`freeze_heap`): a full garbage collection
of a process that has imported numpy, rclpy and the engine client scans every object and took
11-17 ms here, holding the GIL, so the loop's thread would stall whenever one ran. Frozen
objects are never scanned again; later collections only see what the run itself allocates.
The frozen heap and the loop's short thread switch interval belong to the whole interpreter:
:class:`LoopProcessHold` keeps them while any loop of the process runs (a fleet runs several),
and gives them back when the last one ends.

What a guest cannot control: on a virtual machine the hypervisor may stop the whole vCPU
("steal" time). Cycle records carry the steal seen during each cycle (``host_steal_ns``) so a
miss caused by it is attributed to it, not to the loop.
"""

from __future__ import annotations

import gc
import logging
import os
import sys
import threading
from dataclasses import asdict, dataclass
from typing import Any

from robot_latency.errors import RobotLatencyError, SettingsError

log = logging.getLogger(__name__)


class BudgetError(RobotLatencyError, RuntimeError):
    """The budget cannot be applied here (a core that does not exist, no real-time rights)."""


def available_cpus() -> frozenset[int]:
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return frozenset(os.sched_getaffinity(0))
    return frozenset(range(os.cpu_count() or 1))


def parse_cpu_list(value: Any) -> tuple[int, ...]:
    """``"0,2-3"``, ``[0, 2, 3]`` or ``2`` as a tuple of CPU numbers; ``""`` or ``[]``: none.

    Raises:
        ValueError: anything else (the message quotes the value).
    """
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if isinstance(value, str):
        cpus: list[int] = []
        for part in (p.strip() for p in value.split(",")):
            if not part:
                continue
            lo, _, hi = part.partition("-")
            try:
                first, last = int(lo), int(hi or lo)
            except ValueError:
                raise ValueError(f"{value!r}: expects CPU numbers such as '0' or '0,2-3'"
                                 ) from None
            if first < 0 or last < first:
                raise ValueError(f"{value!r}: bad CPU range {part!r}")
            cpus.extend(range(first, last + 1))
        value = cpus
    if not isinstance(value, (list, tuple)) or any(
            isinstance(c, bool) or not isinstance(c, int) or c < 0 for c in value):
        raise ValueError(f"expects a list of CPU numbers >= 0, got {value!r}")
    return tuple(value)


#: The loop polls the last this many ms before a give-up time when it has a core of its own.
OWN_CORE_SPIN_MS = 1.5
#: ... and this many when it shares the cores with the engine (see :attr:`CpuBudget.spin_ms`),
SHARED_CORE_SPIN_MS = 5.0
#: napping this long between two polls of that stretch (see :attr:`CpuBudget.nap_ms`).
SHARED_CORE_NAP_MS = 0.1


@dataclass(frozen=True)
class CpuBudget:
    """Cores and priorities of the loop and the engine (see the module's docstring)."""

    loop_cpus: tuple[int, ...] = ()
    engine_cpus: tuple[int, ...] = ()
    engine_nice: int = 5
    loop_priority: int = 0

    def __post_init__(self) -> None:
        for name in ("loop_cpus", "engine_cpus"):
            cpus = tuple(getattr(self, name))
            object.__setattr__(self, name, cpus)
            if any(not isinstance(c, int) or isinstance(c, bool) or c < 0 for c in cpus):
                raise SettingsError(name, f"{list(cpus)!r}: CPU numbers must be integers >= 0")
            if len(set(cpus)) != len(cpus):
                raise SettingsError(name, f"{list(cpus)!r}: a CPU is listed twice")
        if not 0 <= self.engine_nice <= 19:
            raise SettingsError("engine_nice", f"{self.engine_nice!r}: must be 0..19")
        if not 0 <= self.loop_priority <= 99:
            raise SettingsError("loop_priority", f"{self.loop_priority!r}: must be 0 (normal "
                                "scheduler) or a SCHED_FIFO priority 1..99")

    def check(self, available: frozenset[int] | None = None) -> None:
        """Raise :class:`BudgetError` for a core this process may not use."""
        have = available_cpus() if available is None else available
        for name in ("loop_cpus", "engine_cpus"):
            missing = sorted(set(getattr(self, name)) - have)
            if missing:
                raise BudgetError(f"{name}={list(getattr(self, name))}: CPU {missing} not "
                                  f"available here (this process may use {sorted(have)})")

    def resolved_engine_cpus(self, available: frozenset[int] | None = None
                             ) -> tuple[int, ...] | None:
        """The engine worker's cores (None: no pinning).

        The worker is kept off the loop's cores on the normal scheduler. Under SCHED_FIFO
        (``loop_priority`` > 0) it may use every core: the loop preempts it the moment it wakes,
        and the engine's prefill gains the loop's idle core (settings' thread defaults).
        """
        if self.engine_cpus:
            return self.engine_cpus
        if not self.loop_cpus or self.loop_priority > 0:
            return None
        have = available_cpus() if available is None else available
        rest = tuple(sorted(have - set(self.loop_cpus)))
        return rest or None  # a one-core machine: share it (the engine is niced)

    @property
    def spin_ms(self) -> float:
        """How long before a give-up time the loop stops sleeping and polls (ms).

        A loop alone on its core (pinned, or under SCHED_FIFO) wakes within 0.3 ms: the last
        :data:`OWN_CORE_SPIN_MS` are polled. A loop that shares its cores with the engine (not
        pinned: the engine's prefill gets every core) wakes up to 3.9 ms late at p99
        (docs/REFERENCE.md, "Measured on the development machine"): it is woken
        :data:`SHARED_CORE_SPIN_MS` early and polls from there, so a fallback is not late for
        it; the polling costs that much CPU only in cycles that run to their give-up time.
        """
        if self.loop_cpus or self.loop_priority > 0:
            return OWN_CORE_SPIN_MS
        return SHARED_CORE_SPIN_MS

    @property
    def nap_ms(self) -> float:
        """How long the loop sleeps between two polls of its last stretch (ms); 0: it spins.

        Alone on its core the loop spins. Sharing the cores, a thread that polls without a
        break uses up its share of the scheduler and is preempted by whatever else runs,
        for milliseconds; one that sleeps between polls wakes with a sleeper's priority. On
        the loaded development machine the naps halved the late fallbacks of the overshoot
        bench (docs/BENCHMARKS.md, "Planner loop: overshoot").
        """
        if self.loop_cpus or self.loop_priority > 0:
            return 0.0
        return SHARED_CORE_NAP_MS

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "loop_cpus": list(self.loop_cpus),
                "engine_cpus": list(self.engine_cpus)}


@dataclass(frozen=True)
class ThreadSettings:
    """A thread's cores and scheduler, as they were before the loop's budget was applied."""

    thread_id: int
    cpus: frozenset[int]
    policy: int | None
    priority: int


def capture_thread() -> ThreadSettings:
    """Return the calling thread's cores and scheduler (to restore after the loop)."""
    policy = os.sched_getscheduler(0) if hasattr(os, "sched_getscheduler") else None
    priority = os.sched_getparam(0).sched_priority if policy is not None else 0
    return ThreadSettings(threading.get_ident(), available_cpus(), policy, priority)


def restore_thread(before: ThreadSettings) -> None:
    """Give the calling thread back the cores and scheduler it had before the loop ran in it.

    A process that runs several loops in one thread (a sweep) must not start the second pinned
    to the first one's core, nor leave the caller real-time. Only the thread that was captured
    can be restored (affinity and scheduler are per thread); other threads are left alone.
    """
    if threading.get_ident() != before.thread_id:
        return
    try:
        if hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, before.cpus)
        if before.policy is not None and os.sched_getscheduler(0) != before.policy:
            os.sched_setscheduler(0, before.policy, os.sched_param(before.priority))
    except OSError as err:  # best effort: the run itself is over and recorded
        log.warning("could not restore the thread's cores and scheduler: %s", err)


def apply_to_loop_thread(budget: CpuBudget) -> dict[str, Any]:
    """Pin the calling thread and set its scheduler; return what is now in effect.

    On Linux, affinity and scheduler set with pid 0 apply to the calling thread only, so call
    this from the thread that runs the loop (threads it starts later inherit both).

    Raises:
        BudgetError: a core is not available, or real-time priority is not permitted (the
            message says how to grant it).
    """
    budget.check()
    if budget.loop_cpus:
        try:
            os.sched_setaffinity(0, budget.loop_cpus)
        except OSError as err:
            raise BudgetError(f"loop_cpus={list(budget.loop_cpus)}: cannot pin the loop: "
                              f"{err.strerror or err}") from err
    if budget.loop_priority:
        if not hasattr(os, "sched_setscheduler"):
            raise BudgetError(f"loop_priority={budget.loop_priority}: SCHED_FIFO is not "
                              "available on this platform")
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(budget.loop_priority))
        except PermissionError as err:
            raise BudgetError(
                f"loop_priority={budget.loop_priority}: SCHED_FIFO not permitted for this "
                "user. Grant it (an 'rtprio' limit in /etc/security/limits.conf, "
                "CAP_SYS_NICE, or start under 'chrt -f') or set loop_priority to 0") from err
        except OSError as err:
            raise BudgetError(f"loop_priority={budget.loop_priority}: "
                              f"{err.strerror or err}") from err
    return loop_thread_state()


def freeze_heap() -> int:
    """Collect once, then move every surviving object out of the collector's reach.

    Returns the number of frozen objects. Call it when start-up is over (models loaded, nodes
    built), just before the loop starts.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def loop_thread_state() -> dict[str, Any]:
    """The calling thread's cores and scheduler, for the run's manifest."""
    state: dict[str, Any] = {"loop_cpus_in_effect": sorted(available_cpus())}
    if hasattr(os, "sched_getscheduler"):
        policy = os.sched_getscheduler(0)
        state["loop_policy"] = {os.SCHED_OTHER: "SCHED_OTHER",
                                os.SCHED_FIFO: "SCHED_FIFO",
                                os.SCHED_RR: "SCHED_RR"}.get(policy, str(policy))
        state["loop_priority_in_effect"] = os.sched_getparam(0).sched_priority
    return state


class LoopProcessHold:
    """The interpreter-wide settings a running loop needs, held while any loop of the process
    runs: the start-up heap frozen (:func:`freeze_heap`) and a short thread switch interval.

    Several loops may run in one process (a fleet's robots). The first :meth:`enter` saves the
    switch interval and sets the loop's; every one freezes what is alive when it starts; only
    the last :meth:`leave` unfreezes the heap and puts the interval back. Without the count, the
    first loop to end would unfreeze the others' heap (a full collection scanning it during
    their cycles) and the interval would be left to whichever ended last.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loops = 0
        self._switch_interval_before_s: float | None = None

    def enter(self, switch_interval_s: float) -> dict[str, Any]:
        """Hold the settings for one more loop; return what is in effect (for the manifest)."""
        with self._lock:
            if self._loops == 0:
                self._switch_interval_before_s = sys.getswitchinterval()
                sys.setswitchinterval(switch_interval_s)
            self._loops += 1
            frozen = freeze_heap()
            return {"gc_frozen_objects": frozen, "switch_interval_s": sys.getswitchinterval(),
                    "loops_in_process": self._loops}

    def leave(self) -> None:
        """Release one loop's hold; the last one out gives the interpreter's settings back."""
        with self._lock:
            if self._loops == 0:
                return
            self._loops -= 1
            if self._loops == 0:
                gc.unfreeze()
                if self._switch_interval_before_s is not None:
                    sys.setswitchinterval(self._switch_interval_before_s)
                    self._switch_interval_before_s = None


#: The one hold of this process (every planner run enters and leaves it).
LOOP_PROCESS = LoopProcessHold()
