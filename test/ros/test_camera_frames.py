"""Camera frames over DDS: bag_replayer publishes a bag's frames among its commands, planner_node
(sim engine, camera_topic set) plans each cycle with the newest frame, stamps the plan with it,
and the client edge records the frame's age when the plan arrives. Two real processes, real
Fast DDS; plus the scripted bookkeeping of the tracker and the pacing."""

from __future__ import annotations

import dataclasses
import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from robot_latency.lifetime import follow_parent, popen
from robot_latency.records import read_records
from robot_latency.report.client import compare_edges, edge_section, read_client_log
from robot_latency.report.phases import cycle_spans
from robot_latency.ros.client_edge import ClientTracker
from robot_latency.ros.pacing import Pacer, schedule
from robot_latency.rosenv import localhost_env, ros_args
from robot_latency.streams import Command, write_bag
from robot_latency.streams.scene import scene_frames

MS = 1_000_000


def _env() -> dict[str, str]:
    return {**localhost_env(), "ROS_DOMAIN_ID": str(random.randint(101, 200)),
            "PYTHONUNBUFFERED": "1"}


def _node_and_replay(tmp_path: Path, node_params: dict[str, object], bag: Path,
                     replay_params: dict[str, object], *, start_s: float = 120.0,
                     replay_s: float = 240.0) -> tuple[Path, str]:
    """Start planner_node (its run in ``tmp_path/run``), replay ``bag`` into it with
    bag_replayer (its client log there too), stop the node; return (run dir, replayer output)."""
    run_dir = tmp_path / "run"
    env = _env()
    node_log = open(tmp_path / "node.log", "wb")
    node = popen([sys.executable, "-m", "robot_latency.ros.planner_node",
                  *ros_args({**node_params, "log_dir": str(run_dir),
                             "camera_topic": "camera/image/compressed"})],
                 env=env, stdout=node_log, stderr=subprocess.STDOUT)
    try:
        end = time.monotonic() + start_s
        while not (run_dir / "manifest.json").exists():
            assert node.poll() is None, (tmp_path / "node.log").read_text()
            assert time.monotonic() < end, "planner_node did not start"
            time.sleep(0.1)
        replay = subprocess.run(
            [sys.executable, "-m", "robot_latency.ros.bag_replayer",
             *ros_args({"bag": str(bag), "start_delay_s": 0.5, "client_log_dir": str(run_dir),
                        **replay_params})],
            env=env, capture_output=True, text=True, timeout=replay_s, check=False,
            preexec_fn=follow_parent())
        assert replay.returncode == 0, replay.stdout + replay.stderr
    finally:
        node.send_signal(signal.SIGINT)
        node.wait(timeout=60)
        node_log.close()
    return run_dir, replay.stdout + replay.stderr


def test_frames_are_scheduled_among_the_commands_and_sent_by_their_own_callback() -> None:
    commands = [Command(t_ns=0, text="a", command_id="s:0"),
                Command(t_ns=300 * MS, text="b", command_id="s:1")]
    frames = scene_frames([0, 150 * MS, 300 * MS], seed=1)
    # a frame logged 100 ms before the first command moves the play's start earlier
    early = (dataclasses.replace(scene_frames([0], seed=2)[0], t_ns=-100 * MS),)
    sends = schedule(commands, start_ns=1_000 * MS, frames=early + frames)
    assert [(s.at_ns - 1_000 * MS, s.frame is not None) for s in sends] == [
        (0, True), (100 * MS, True), (100 * MS, False), (250 * MS, True), (400 * MS, True),
        (400 * MS, False)]  # a frame before a command of the same time
    got: list[str] = []
    now = [0]
    pacer = Pacer(sends, got.append, clock=lambda: now[0] + 2_000 * MS, sleep=lambda s: None,
                  send_frame=lambda item: got.append(f"frame {item.frame.t_ns // MS}"))
    report = pacer.run()
    assert got == ["frame -100", "frame 0", "a", "frame 150", "frame 300", "b"]
    assert (report.sent, report.frames) == (2, 4)
    # without a frame callback, frames are left out
    assert Pacer(sends, got.append).sends == [s for s in sends if s.frame is None]


def test_the_tracker_ages_plans_by_the_frame_their_stamp_names() -> None:
    t = ClientTracker(deadline_ms=100.0, clock=lambda: 0, max_frame_age_ms=50.0)
    t.frame_sent(stamp_ns=7_000, sent_ns=10 * MS)
    t.frame_sent(stamp_ns=8_000, sent_ns=90 * MS)
    for i, sent in enumerate((20, 100, 200)):
        t.sent(f"c{i}", sent * MS)
    plan = {"cycle": 0, "source": "model", "plan": {}, "deadline_ms": 100.0}
    t.received({**plan, "command_id": "c0"}, 40 * MS, stamp_ns=7_000)   # 30 ms old frame
    t.received({**plan, "command_id": "c1"}, 150 * MS, stamp_ns=7_000)  # 140 ms: stale
    t.received({**plan, "command_id": "c2"}, 230 * MS, stamp_ns=9_999)  # not a frame: text
    rows = {r.command_id: r for r in t.records()}
    assert (rows["c0"].frame_age_ms, rows["c0"].stale) == (30.0, False)
    assert (rows["c1"].frame_age_ms, rows["c1"].stale) == (140.0, True)
    assert rows["c2"].frame_age_ms is None and rows["c2"].frame_stamp_ns is None
    s = t.summary()
    assert s["frame_age_ms"]["n"] == 2 and s["frame_age_ms"]["max"] == 140.0
    assert (s["answered_stale"], s["stale_rate"], s["max_frame_age_ms"]) == (1, 0.5, 50.0)
    text = "\n".join(edge_section([compare_edges("x", [], t.records())]))
    assert "frame age p50/p99 ms (n)" in text and "| 0 / 1 (> 50 ms) |" in text
    # a text-only client's table has no frame columns
    assert "frame age" not in "\n".join(edge_section([compare_edges("x", [], [rows["c2"]])]))


def test_frames_from_a_bag_reach_the_plan_and_the_client_edge_over_dds(tmp_path: Path) -> None:
    texts = ["go to the kitchen", "stop", "pick up the red cup", "open the door"]
    commands = [Command(t_ns=(50 + 300 * i) * MS, text=texts[i % 4], command_id=f"s{i}")
                for i in range(8)]
    # frames every 100 ms from 0 through the last command: one before each command
    frames = scene_frames([k * 100 * MS for k in range(23)], seed=5)
    bag = write_bag(tmp_path / "seen", commands, frames=frames)
    run_dir, out = _node_and_replay(
        tmp_path, {"engine": "sim", "target_device": "orin-agx-64gb", "mode": "event",
                   "deadline_ms": 150.0, "label": "sim"},
        bag, {"tail_s": 60.0, "max_frame_age_ms": 0.001})
    assert "23 camera frames to /camera/image/compressed" in out
    client = read_client_log(run_dir)
    records = read_records(run_dir / "cycles.jsonl")
    assert client is not None and len(client) == 8
    by_id = {r.command_id: r for r in records if r.published_ns is not None}
    framed = [c for c in client if c.frame_stamp_ns is not None]
    # The planner planned with frames, and each plan's header.stamp is exactly its frame's
    # stamp: the client recognised it among the frames it sent.
    assert len(framed) >= len(client) // 2 and client[-1].frame_stamp_ns is not None
    for c in framed:
        rec = by_id[c.command_id]
        assert rec.frame_stamp_ns == c.frame_stamp_ns
        assert rec.frame_age_ms is not None and rec.frame_age_ms > -1.0
        assert c.frame_age_ms is not None and c.frame_age_ms > 0 and c.stale
    summary = json.loads((run_dir / "client_summary.json").read_text())
    assert summary["frame_age_ms"]["n"] == len(framed)
    assert summary["answered_stale"] == len(framed) and summary["max_frame_age_ms"] == 0.001
    # every cycle with a frame names one the replayer sent (stamps are the sends', not the bag's)
    sent_stamps = {c.frame_stamp_ns for c in framed}
    assert all(r.frame_stamp_ns is None or r.frame_stamp_ns > 1_700_000_100 * 10**9
               for r in records)
    assert sent_stamps <= {r.frame_stamp_ns for r in records}


@pytest.mark.parametrize(("policy", "encoder"),
                         [("reuse", "clip"), ("every", "clip"), ("reuse", "onnx")])
def test_a_vision_tower_encodes_each_new_frame_once_and_reuses_it_over_dds(
        tmp_path: Path, policy: str, encoder: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """planner_node on llama.cpp with the shipped planner and a tiny tower (mmproj): a frame is
    encoded and prefilled in the first cycle that sees it (phases image_encode, image_prefill)
    and found in the KV cache by the next cycles with the same frame (no image phase); with
    image_policy every, each cycle encodes it again; with vision_encoder onnx, the same on the
    tower's ONNX export (written into the node's model cache)."""
    from robot_latency.models.bundled import bundled_model_path
    from robot_latency.models.mmproj import SHAPES, write_mmproj

    mmproj = write_mmproj(SHAPES["tiny-mlp"], tmp_path / "tower.gguf",
                          lm_path=bundled_model_path("planner"))
    monkeypatch.setenv("ROBOT_LATENCY_CACHE_DIR", str(tmp_path / "cache"))  # the node's
    texts = ["go to the kitchen", "stop", "pick up the red cup", "open the door"]
    commands = [Command(t_ns=(100 + 1500 * i) * MS, text=texts[i], command_id=f"s{i}")
                for i in range(4)]
    # two frames: one before the first two commands, one before the last two
    bag = write_bag(tmp_path / "seen", commands,
                    frames=scene_frames([0, 2900 * MS], seed=3))
    run_dir, _ = _node_and_replay(
        tmp_path, {"engine": "llamacpp", "mode": "event", "deadline_ms": 20000.0,
                   "on_new_command": "queue", "image_policy": policy, "label": "seen",
                   "mmproj": str(mmproj), "vision_encoder": encoder},
        bag, {"tail_s": 120.0}, start_s=180.0, replay_s=300.0)
    records = [r for r in read_records(run_dir / "cycles.jsonl") if r.command_id]
    # a command that arrives while the node is busy may be superseded (newest wins): it never
    # reaches the model, so it changes nothing in the KV cache
    asked = [r for r in records if r.plan_source == "model"]
    assert len(records) == 4 and len(asked) >= 3 and all(
        r.fallback_reason == "superseded" for r in records if r not in asked), \
        [(r.command_id, r.plan_source, r.fallback_reason, r.engine_error) for r in records]
    seen = [r for r in asked if r.frame_stamp_ns is not None]
    assert len(seen) >= 3  # the first frame is sent 100 ms before the first command
    previous = None
    for r in seen:
        assert r.image is not None and r.image["tokens"] == 16, r.image
        assert r.image["encoder"] == encoder
        # the frame in the KV cache is the previous cycle's: reused exactly when it is the same
        # (every: never)
        assert r.image["reused"] == (policy == "reuse" and r.frame_stamp_ns == previous), \
            (r.cycle, r.image)
        encoded = {"image_encode", "image_prefill"} <= set(r.phases_ns)
        assert encoded != r.image["reused"]
        if encoded:
            assert r.phases_ns["image_encode"] > 0 and r.phases_ns["image_prefill"] > 0
            # the timeline (trace, tail diagnosis) lays the frame out before the text's prefill
            names = [x.name for x in cycle_spans(r) if x.depth == 0]
            assert names.index("image_encode") < names.index("image_prefill") \
                < names.index("prefill") < names.index("decode")
        previous = r.frame_stamp_ns
    assert sum(r.image["reused"] for r in seen) >= (1 if policy == "reuse" else 0)
    assert sum(not r.image["reused"] for r in seen) >= (2 if policy == "reuse" else len(seen))
