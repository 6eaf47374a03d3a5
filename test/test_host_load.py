"""The host-load check over a run (hostcheck/load.py): the reasons it gives against its stated
thresholds, and a real measurement that tells this process's CPU from another process's."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from robot_latency.hostcheck.load import (
    HOST_LOAD_FILE,
    LOAD_PER_CORE_WARN,
    OTHERS_SHARE_WARN,
    STEAL_SHARE_WARN,
    LoadWatch,
    OtherProcess,
    judge,
    read_host_load,
)
from robot_latency.lifetime import set_subreaper


def test_each_reason_names_its_figure_and_threshold() -> None:
    quiet = judge(wall_s=10, cores=2, load_avg_1m=1.0, steal_share=0.0, others_cpu_share=0.05,
                  own_cpu_share=0.9)
    assert not quiet.overloaded and quiet.warning is None and quiet.reasons == ()
    busy = judge(wall_s=10, cores=2, load_avg_1m=2 * LOAD_PER_CORE_WARN + 3.1,
                 steal_share=STEAL_SHARE_WARN + 0.07, others_cpu_share=OTHERS_SHARE_WARN + 0.5,
                 own_cpu_share=0.3, top_others=(OtherProcess(4242, "python3", 0.9),))
    assert busy.overloaded and len(busy.reasons) == 3
    steal, load, others = busy.reasons
    assert steal == "hypervisor steal 12.0% of CPU time (> 5%)"
    assert load == "load average 6.1 on 2 cores (> 1.5 per core)"
    # the named share is of the same 2 cores as the share blamed (90% of one core is 45%)
    assert others == ("other processes used 75% of the 2 cores (> 25%): python3 (pid 4242) 45%, "
                      "the rest not split by process")
    assert busy.warning.startswith("host overloaded during the run: hypervisor steal")
    # unknown figures (no steal counter, no load average) give no reason, never a made-up 0
    unknown = judge(wall_s=1, cores=4, load_avg_1m=None, steal_share=None, others_cpu_share=None,
                    own_cpu_share=None)
    assert not unknown.overloaded


def test_the_named_shares_add_up_to_the_share_blamed() -> None:
    """The named processes, the rest it could read and what it cannot name (processes that
    ended within the run, others' unreadable ones) add up to the other processes' share."""
    top = (OtherProcess(11, "trainer", 0.6), OtherProcess(12, "python3", 0.3))
    load = judge(wall_s=10, cores=2, load_avg_1m=1.0, steal_share=0.0, others_cpu_share=0.7,
                 own_cpu_share=0.3, top_others=top, others_seen_share=0.55)
    reason, = load.reasons
    assert reason == ("other processes used 70% of the 2 cores (> 25%): trainer (pid 11) 30%, "
                      "python3 (pid 12) 15%, other processes it could read 10%, 15% it cannot "
                      "name (processes that started and ended within the run, or whose times "
                      "it may not read)")
    assert sum(int(x) for x in re.findall(r"(\d+)%", reason.split(": ", 1)[1])) == 70
    # whole percents that each round up would add up to more than the whole: they do not
    halves = judge(wall_s=10, cores=2, load_avg_1m=1.0, steal_share=0.0, others_cpu_share=0.83,
                   own_cpu_share=0.1, top_others=(OtherProcess(1, "a", 0.35),
                                                  OtherProcess(2, "b", 0.31)),
                   others_seen_share=0.55)
    tail = halves.reasons[0].split(": ", 1)[1]
    assert sum(int(x) for x in re.findall(r"(\d+)%", tail)) == 83
    # everything seen: no unnamed remainder is invented
    whole = judge(wall_s=10, cores=2, load_avg_1m=1.0, steal_share=0.0, others_cpu_share=0.45,
                  own_cpu_share=0.3, top_others=top, others_seen_share=0.45)
    assert whole.reasons[0].endswith("trainer (pid 11) 30%, python3 (pid 12) 15%")


def test_json_form_round_trips(tmp_path: Path) -> None:
    load = judge(wall_s=3, cores=2, load_avg_1m=9.0, steal_share=0.0, others_cpu_share=0.1,
                 own_cpu_share=0.5)
    path = load.write(tmp_path)
    assert path.name == HOST_LOAD_FILE
    doc = read_host_load(tmp_path)
    assert doc == json.loads(path.read_text())
    assert doc["overloaded"] is True and doc["warning"] == load.warning
    assert doc["thresholds"]["load_per_core"] == LOAD_PER_CORE_WARN
    assert read_host_load(tmp_path / "none") is None


BUSY = "import time\nt = time.monotonic()\nwhile time.monotonic() - t < 4.0:\n    pass\n"


def test_another_process_is_counted_as_other_and_this_one_as_own() -> None:
    # A busy loop orphaned by its shell (so not a child of this process) and a busy loop here.
    watch = LoadWatch(top=10_000).start()
    # The suite makes pytest a subreaper (test/conftest.py), which would adopt the orphan as a
    # child of this process: give orphans back to init while it is made. It ends by itself.
    set_subreaper(False)
    try:
        shell = subprocess.run(["sh", "-c",
                                f"{sys.executable} -c '{BUSY}' >/dev/null 2>&1 & echo $!"],
                               check=True, capture_output=True, text=True)
    finally:
        set_subreaper(True)
    other_pid = int(shell.stdout.split()[-1])
    started = time.monotonic()
    spins = 0
    while time.monotonic() - started < 2.0:  # ends while the other still spins
        spins += 1
    load = watch.stop()
    assert load.wall_s > 0 and load.cores >= 1
    assert load.own_cpu_share is not None and load.own_cpu_share > 0
    assert load.others_cpu_share is not None and load.others_cpu_share > 0
    others = {p.pid: p for p in load.top_others}
    assert other_pid in others and others[other_pid].cpu_share > 0
    assert os.getpid() not in others  # this process's own CPU is its own, not another's


def test_stop_before_start_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="before start"):
        LoadWatch().stop()
