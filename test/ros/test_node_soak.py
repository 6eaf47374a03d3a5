
"""planner_node soaked for two minutes from outside: bench/node_soak.py at 2 Hz, invariants only.

The node is its own process (llama.cpp, the shipped compact planner, event mode), the client is
the bench's: half the commands PlanCommand goals, half tagged commands on planner/command, one
client-edge tracker for both. Nothing here judges a timing; what must hold on any host, loaded
or not:

- every command is answered: by a plan of its own, or superseded by a newer command's; no goal
  is rejected or left open, no plan matches nothing;
- a receiver miss is a planner miss or a superseded command, per command (so
  ``receiver misses <= planner misses + superseded``);
- after the warm-up the node's process tree (the node and its engine worker) grows its RSS by
  at most 5%, and its open files and threads do not grow (a leak per command would be
  hundreds over 240 commands; the slack is for a descriptor or thread that comes and goes);
- the node exits 0 on SIGINT and leaves nothing running.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from robot_latency.lifetime import follow_parent

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
DURATION_S = 120
RATE_HZ = 2.0
#: A hang guard, not a timing: start-up, two minutes of commands, the tail and the stop.
HANG_S = 900
MAX_RSS_GROWTH_PCT = 5.0
FD_SLACK = 3
THREAD_SLACK = 2


def test_two_minutes_of_commands_hold_the_invariants(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), str(BENCH), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(BENCH / "node_soak.py"),
                           "--duration-s", str(DURATION_S), "--rate-hz", str(RATE_HZ),
                           "--warmup-s", "30", "--sample-s", "10", "--out", str(out)],
                          cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=HANG_S, check=False, preexec_fn=follow_parent())
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    n = round(DURATION_S * RATE_HZ)
    client, edge, goals = doc["client"], doc["edge"], doc["goals"]

    # every command answered, by its own plan or a newer one's
    assert doc["commands_sent"] == client["commands"] == n
    assert edge["by_way"]["action"]["commands"] == edge["by_way"]["topic"]["commands"] == n // 2
    assert client["unanswered"] == 0, client
    assert client["answered"] + client["superseded"] == n
    assert goals == {"rejected": 0, "ended_without_plan": goals["ended_without_plan"],
                     "pending_at_end": 0}
    assert client["plans_unmatched"] == client["plans_unreadable"] == 0
    assert doc["plans_received"] >= client["answered"]

    # the receiver's misses are the planner's own, or superseded commands
    assert edge["unexplained_receiver_misses"] == [], edge
    assert edge["receiver_misses"] <= edge["planner_misses"] + edge["superseded"]
    assert edge["receiver_le_planner_plus_superseded"]

    # the node's process tree after the warm-up: no growth beyond the bounds
    start, end = doc["process"]["start"], doc["process"]["end"]
    growth = doc["process"]["growth"]
    assert growth["rss_pct"] <= MAX_RSS_GROWTH_PCT, doc["process"]
    assert growth["fds"] <= FD_SLACK, doc["process"]
    assert growth["threads"] <= THREAD_SLACK, doc["process"]
    samples = doc["process"]["samples"]
    assert len(samples) >= 3
    assert max(s["node_fds"] + s["children_fds"] for s in samples) <= \
        start["node_fds"] + start["children_fds"] + FD_SLACK
    assert max(s["node_threads"] + s["children_threads"] for s in samples) <= \
        start["node_threads"] + start["children_threads"] + THREAD_SLACK
    assert end["children"] >= 1  # the engine worker was measured, not only the node

    stop = doc["node_stop"]
    assert stop == {"exit_code": 0, "killed": False, "left_running": []}
