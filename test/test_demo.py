"""The main job's pipeline: planner_node and bag_replayer as processes over real Fast DDS."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import rclpy  # noqa: F401  (a hard requirement: the demo runs the ROS 2 nodes)

from robot_latency.demo_job import DemoConfig, DemoError, run_demo, stream_labels_of
from robot_latency.records import read_records
from robot_latency.report.perfetto_check import check_trace
from robot_latency.streams import Command, write_bag

TEXTS = ["pick up the red cup and put it on the tray", "stop", "go to the kitchen slowly",
         "bring me the blue bottle"]


def test_two_configurations_through_ros(tmp_path: Path,
                                        capfd: pytest.CaptureFixture[str]) -> None:
    bag = write_bag(tmp_path / "stream", [Command(t_ns=i * 150_000_000, text=TEXTS[i % 4],
                                                  command_id=f"s:{i}") for i in range(8)])
    configs = [DemoConfig(label=f"sim {d}", params={"engine": "sim", "target_device": d,
                                                    "mode": "event", "deadline_ms": 60.0,
                                                    "period_ms": 100.0})
               for d in ("orin-agx-64gb", "orin-nano-4gb")]
    # The bag's own labels (two of four texts; the rest unlabelled), judged after the ROS runs.
    (bag / "labels.jsonl").write_text(
        json.dumps({"text": "stop", "expected": {"steps": [{"action": "stop"}]}}) + "\n"
        + json.dumps({"text": TEXTS[2], "expected": {"steps": [
            {"action": "goto", "target": "kitchen", "speed": "slow"}]}}) + "\n")
    labels = stream_labels_of(bag)
    # With progress asked for: the replay wait follows the cycle log; no bar off a terminal.
    runs, report = run_demo(configs, stream=bag, out_dir=tmp_path / "demo", progress=True,
                            labels=labels)
    assert "misses=" not in capfd.readouterr().err
    for run in runs:
        records = read_records(run / "cycles.jsonl")
        # event mode: one cycle per command, every command answered, in order
        assert [r.command_id is not None for r in records] == [True] * 8
        assert json.loads((run / "summary.json").read_text())["cycles"] == 8
    rows = json.loads((tmp_path / "demo" / "comparison.json").read_text())["rows"]
    assert [r["label"] for r in rows] == ["sim orin-agx-64gb", "sim orin-nano-4gb"]
    assert report.exists() and (report.parent / "itl_cdf.png").stat().st_size > 1000
    # Both sides per configuration: the replayer's client log beside each run, in the report.
    for run in runs:
        client = [json.loads(line) for line in (run / "client.jsonl").read_text().splitlines()]
        assert len(client) == 8 and client[-1]["status"] == "answered"
    text = report.read_text()
    assert "## Reaction time at the client edge" in text
    # Correctness per level, over the labelled commands only, on time at the receiver.
    assert "## Plans that are right" in text and "**Put on the robot:**" in text
    judged = json.loads((report.parent / "correctness.json").read_text())
    assert judged["recommended"] in [c.label for c in configs] and "smaller file" in judged["rule"]
    for row in judged["rows"]:
        assert row["correct_n"] == 4 and row["on_time_at"] == "receiver"
        assert row["correct_ci95"] is not None and row["goodput_rate"] <= row["correct_rate"]
    assert all(f"| {c.label} |" in text for c in configs)
    trace = json.loads((report.parent / "trace.json").read_text())
    assert {e["pid"] for e in trace["traceEvents"]} == {1, 2}
    # Perfetto's own trace processor reads the demo's trace as the records say it
    # (robot_latency/report/perfetto_check.py: each cycle's slice and each phase's)
    check = check_trace(report.parent / "trace.json", runs)
    assert check.ok, check.problems
    assert check.cycles == 16 and check.phases > check.cycles
    with pytest.raises(DemoError, match="exists"):
        run_demo(configs, stream=bag, out_dir=tmp_path / "demo")


def test_the_main_job_replays_the_first_commands_with_their_labels(tmp_path: Path) -> None:
    from robot_latency.demo_job import first_commands
    from robot_latency.streams import SHIPPED_DIR, read_stream

    shipped = SHIPPED_DIR / "steady_operator"
    bag = first_commands(shipped, 5, tmp_path / "stream")
    cut = read_stream(bag).commands
    assert [c.text for c in cut] == [c.text for c in read_stream(shipped).commands[:5]]
    assert [c.t_ns for c in cut] == [c.t_ns for c in read_stream(shipped).commands[:5]]
    labels = stream_labels_of(bag)
    assert labels is not None and all(labels.lookup(c.command_id, c.text) is not None for c in cut)
    # a stream no longer than asked is replayed as it is
    assert first_commands(shipped, 60, tmp_path / "all") == shipped


def test_the_main_job_shortens_only_the_pauses_over_its_limit(tmp_path: Path) -> None:
    from robot_latency.demo_job import first_commands
    from robot_latency.streams import SHIPPED_DIR, read_stream

    shipped = SHIPPED_DIR / "steady_operator"
    whole = read_stream(shipped).commands[:30]
    limit_ns = 4_000_000_000
    bag = first_commands(shipped, 30, tmp_path / "stream", max_pause_ns=limit_ns)
    paced = read_stream(bag).commands
    assert [c.text for c in paced] == [c.text for c in whole]
    gaps = [b.t_ns - a.t_ns for a, b in itertools.pairwise(whole)]
    new_gaps = [b.t_ns - a.t_ns for a, b in itertools.pairwise(paced)]
    assert any(g > limit_ns for g in gaps)  # the shipped stream has pauses to shorten
    assert new_gaps == [min(g, limit_ns) for g in gaps]
    assert stream_labels_of(bag) is not None
    # with no pause over the limit and no command cut, the stream is replayed as it is
    assert first_commands(shipped, 0, tmp_path / "all", max_pause_ns=10**15) == shipped


def test_a_jsonl_stream_keeps_its_ids_states_and_labels_when_its_pauses_are_shortened(
        tmp_path: Path) -> None:
    from robot_latency.demo_job import first_commands
    from robot_latency.streams import read_stream

    src = tmp_path / "mine.jsonl"
    src.write_text("".join(json.dumps(line) + "\n" for line in [
        {"t_ns": 0, "text": "pick up the red cup", "id": "a", "state": "gripper empty"},
        {"t_ns": 30_000_000_000, "text": "sing me a song", "id": "b", "expected": "refuse"},
        {"t_ns": 31_000_000_000, "text": "pick up the fork", "id": "c"},
    ]))
    out = first_commands(src, 0, tmp_path / "stream", max_pause_ns=4_000_000_000)
    paced = read_stream(out).commands
    assert [c.t_ns for c in paced] == [0, 4_000_000_000, 5_000_000_000]
    assert [c.command_id for c in paced] == ["a", "b", "c"]
    assert paced[0].state == "gripper empty" and paced[1].expected == "refuse"
    labels = stream_labels_of(out)
    assert labels is not None and labels.lookup("b", "sing me a song") is not None
