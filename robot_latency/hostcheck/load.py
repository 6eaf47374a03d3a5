"""Was the host overloaded while a run ran? Steal time, load average against cores, and the CPU
other processes took, measured over the run and judged against stated thresholds.

A run's latencies are this host's only when the host was the run's: on a virtual machine whose
hypervisor took CPU time (steal), or beside other busy processes, model misses climb far above
what the same run shows on a quiet machine (90-95% against docs/DEMO.md's 3-28%, once), and nothing
said why. :class:`LoadWatch` takes one snapshot when a run starts and one when it ends and
returns a :class:`HostLoad` with the reasons, if any, to call the host overloaded:

* **steal**: the CPU time the hypervisor took, over all CPUs' time in the interval (Linux's
  ``steal`` counter, as :func:`robot_latency.hostfacts.host_steal_s` reads it), above
  :data:`STEAL_SHARE_WARN`. A Jetson (bare metal) never shows it.
* **load average**: the 1-minute load average (at the end) over the cores, above
  :data:`LOAD_PER_CORE_WARN`. The run's own threads count in it too, hence a margin above 1.
* **other processes**: the CPU time every process but this one and its children used in the
  interval, over the interval times the cores, above :data:`OTHERS_SHARE_WARN`; the busiest of
  them are named (:data:`TOP_OTHERS`), each as a share of the same cores, so the named shares,
  the rest of the processes it could read and what it cannot name (processes that started and
  ended within the run, or whose times it may not read) add up to the share it blames.

The cores are ``os.cpu_count()``: the load average, steal and other processes are the whole
machine's. What a run writes is ``host_load.json`` (:meth:`HostLoad.to_dict`) in its directory;
the report and the run's summary show its ``warning``.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

log = logging.getLogger(__name__)

#: Steal above this share of all CPU time in the run calls the host overloaded.
STEAL_SHARE_WARN = 0.05
#: A 1-minute load average above this many runnable tasks per core does.
LOAD_PER_CORE_WARN = 1.5
#: Other processes' CPU time above this share of all cores over the run does.
OTHERS_SHARE_WARN = 0.25
#: Other processes named in the reason, busiest first.
TOP_OTHERS = 3
#: The file a run directory holds the measurement in.
HOST_LOAD_FILE = "host_load.json"


@dataclass(frozen=True)
class OtherProcess:
    """A process not of this run, and the share of one core it used over the run."""

    pid: int
    name: str
    cpu_share: float


@dataclass(frozen=True)
class HostLoad:
    """The host's load over a run, and the reasons to call it overloaded (none: it was not).

    Shares are fractions: ``steal_share`` of all CPU time, ``others_cpu_share`` and
    ``own_cpu_share`` of all cores over ``wall_s``; None where the platform does not say.
    """

    wall_s: float
    cores: int
    load_avg_1m: float | None
    steal_share: float | None
    others_cpu_share: float | None
    own_cpu_share: float | None
    top_others: tuple[OtherProcess, ...] = ()
    reasons: tuple[str, ...] = field(default=())
    #: every other process it could read, together, as a share of all cores (None: not taken)
    others_seen_share: float | None = None

    @property
    def overloaded(self) -> bool:
        """Whether any reason applies."""
        return bool(self.reasons)

    @property
    def warning(self) -> str | None:
        """One line for the summary and the report (None: not overloaded)."""
        if not self.reasons:
            return None
        return ("host overloaded during the run: " + "; ".join(self.reasons)
                + ". Its latencies and misses are not this host's best; rerun on a quiet machine")

    def to_dict(self) -> dict[str, Any]:
        """Return the ``host_load.json`` form (``overloaded`` and ``warning`` included)."""
        out = asdict(self)
        out["top_others"] = [asdict(p) for p in self.top_others]
        out["reasons"] = list(self.reasons)
        out["overloaded"] = self.overloaded
        out["warning"] = self.warning
        out["thresholds"] = {"steal_share": STEAL_SHARE_WARN,
                             "load_per_core": LOAD_PER_CORE_WARN,
                             "others_cpu_share": OTHERS_SHARE_WARN}
        return out

    def write(self, run_dir: str | os.PathLike[str]) -> Path:
        """Write ``host_load.json`` into ``run_dir``, atomically; return its path."""
        path = Path(run_dir) / HOST_LOAD_FILE
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        os.replace(tmp, path)
        return path


def judge(*, wall_s: float, cores: int, load_avg_1m: float | None, steal_share: float | None,
          others_cpu_share: float | None, own_cpu_share: float | None,
          top_others: tuple[OtherProcess, ...] = (),
          others_seen_share: float | None = None) -> HostLoad:
    """Return the load with its reasons, each naming its figure and the threshold it passed.

    ``others_seen_share``: every other process it could read, together (share of all cores);
    with it, the other-process reason splits its share into the named processes, the rest it
    could read, and what it cannot name, which add up to the share it blames.
    """
    reasons = []
    if steal_share is not None and steal_share > STEAL_SHARE_WARN:
        reasons.append(f"hypervisor steal {100 * steal_share:.1f}% of CPU time "
                       f"(> {100 * STEAL_SHARE_WARN:.0f}%)")
    if load_avg_1m is not None and load_avg_1m > LOAD_PER_CORE_WARN * cores:
        reasons.append(f"load average {load_avg_1m:.1f} on {cores} cores "
                       f"(> {LOAD_PER_CORE_WARN:g} per core)")
    if others_cpu_share is not None and others_cpu_share > OTHERS_SHARE_WARN:
        reasons.append(_others_reason(others_cpu_share, cores, top_others, others_seen_share))
    return HostLoad(wall_s=wall_s, cores=cores, load_avg_1m=load_avg_1m,
                    steal_share=steal_share, others_cpu_share=others_cpu_share,
                    own_cpu_share=own_cpu_share, top_others=top_others, reasons=tuple(reasons),
                    others_seen_share=others_seen_share)


def _others_reason(share: float, cores: int, top: tuple[OtherProcess, ...],
                   seen: float | None) -> str:
    """The other-process reason: its share of all cores, split into parts that add up to it
    (each process's share of one core is divided by the cores; the parts' whole percents are
    rounded to add up to the whole's)."""
    head = (f"other processes used {100 * share:.0f}% of the {cores} cores "
            f"(> {100 * OTHERS_SHARE_WARN:.0f}%)")
    # (before the percent, after it, the fraction, shown when it rounds to 0)
    parts = [(f"{p.name} (pid {p.pid}) ", "%", p.cpu_share / cores, True) for p in top]
    named = sum(p.cpu_share for p in top) / cores
    tail = ""
    if seen is not None:
        seen = min(max(seen, named), share)  # the snapshots are not taken at one instant
        parts.append(("other processes it could read ", "%", seen - named, False))
        parts.append(("", "% it cannot name (processes that started and ended within the run, "
                      "or whose times it may not read)", share - seen, False))
    elif parts:
        tail = ", the rest not split by process"
    pcts = _whole_percents([v for _, _, v, _ in parts],
                           round(100 * share) if seen is not None else None)
    shown = [f"{pre}{n}{post}" for (pre, post, _, always), n in zip(parts, pcts, strict=True)
             if n > 0 or always]
    return head + (": " + ", ".join(shown) + tail if shown else "")


def _whole_percents(values: list[float], whole: int | None) -> list[int]:
    """Whole percents of ``values`` (fractions); with ``whole``, rounded by the largest
    remainders so that they add up to it."""
    exact = [100 * v for v in values]
    if whole is None:
        return [round(x) for x in exact]
    out = [int(x) for x in exact]
    order = sorted(range(len(exact)), key=lambda i: exact[i] - out[i], reverse=True)
    for i in order[:max(0, whole - sum(out))]:
        out[i] += 1
    return out


def _busy_and_total_s() -> tuple[float, float, float | None]:
    """All CPUs' busy time, total time and steal (s) since boot."""
    t = psutil.cpu_times()
    # Linux counts a guest's time in user and nice already (psutil's cpu_percent drops it too)
    total = sum(t) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)
    idle = t.idle + getattr(t, "iowait", 0.0)
    steal = getattr(t, "steal", None)
    # steal is neither the guest's work nor idle: keep it out of the busy time
    return total - idle - (steal or 0.0), total, steal


def _cpu_s(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def _own_s(me: psutil.Process) -> tuple[float, set[int]]:
    """CPU time (s) of this process, its reaped children and its live descendants; their pids."""
    t = me.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    pids = {me.pid}
    for child in me.children(recursive=True):
        try:
            total += _cpu_s(child)
            pids.add(child.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return total, pids


def _process_times() -> dict[int, tuple[str, float]]:
    """pid -> (name, CPU s) of every process this user may read."""
    out = {}
    for proc in psutil.process_iter(["name"]):
        try:
            out[proc.pid] = (proc.info["name"] or "?", _cpu_s(proc))
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return out


class LoadWatch:
    """Measure the host's load between :meth:`start` and :meth:`stop` (a context manager:
    ``with LoadWatch() as watch: ...; load = watch.result``).

    Args:
        clock: seconds, monotonic (injected for tests).
        cores: the cores the shares are of (default ``os.cpu_count()``).
        top: other processes to name, busiest first.
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic,
                 cores: int | None = None, top: int = TOP_OTHERS) -> None:
        self.clock = clock
        self.cores = cores or os.cpu_count() or 1
        self.top = top
        self.result: HostLoad | None = None
        self._start: tuple[float, float, float, float | None, float,
                           dict[int, tuple[str, float]]] | None = None

    def start(self) -> LoadWatch:
        """Take the first snapshot."""
        busy, total, steal = _busy_and_total_s()
        own, _ = _own_s(psutil.Process())
        self._start = (self.clock(), busy, total, steal, own, _process_times())
        return self

    def stop(self) -> HostLoad:
        """Take the second snapshot; return (and keep in ``result``) the judged load.

        Raises:
            RuntimeError: :meth:`start` was not called.
        """
        if self._start is None:
            raise RuntimeError("LoadWatch.stop() before start()")
        t0, busy0, total0, steal0, own0, procs0 = self._start
        wall_s = max(self.clock() - t0, 1e-9)
        busy1, total1, steal1 = _busy_and_total_s()
        own1, own_pids = _own_s(psutil.Process())
        span = total1 - total0
        steal_share = ((steal1 - steal0) / span if steal0 is not None and steal1 is not None
                       and span > 0 else None)
        capacity_s = wall_s * self.cores
        own_s = max(0.0, own1 - own0)
        others_s = max(0.0, (busy1 - busy0) - own_s)
        try:
            load_avg: float | None = os.getloadavg()[0]
        except (AttributeError, OSError):
            load_avg = None
        top = []
        seen_s = 0.0
        for pid, (name, cpu1) in _process_times().items():
            if pid in own_pids:
                continue
            cpu0 = procs0.get(pid, (name, 0.0))[1]
            if cpu1 - cpu0 > 0:
                top.append(OtherProcess(pid, name, (cpu1 - cpu0) / wall_s))
                seen_s += cpu1 - cpu0
        top.sort(key=lambda p: -p.cpu_share)
        self.result = judge(wall_s=wall_s, cores=self.cores, load_avg_1m=load_avg,
                            steal_share=steal_share, others_cpu_share=others_s / capacity_s,
                            own_cpu_share=own_s / capacity_s, top_others=tuple(top[:self.top]),
                            others_seen_share=seen_s / capacity_s)
        if self.result.warning:  # the caller prints it with the run's summary
            log.info("%s", self.result.warning)
        return self.result

    def __enter__(self) -> LoadWatch:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def read_host_load(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """Return a run directory's ``host_load.json`` (None: it has none, or it cannot be read)."""
    path = Path(run_dir) / HOST_LOAD_FILE
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        log.warning("%s: cannot read: %s", path, err)
        return None
