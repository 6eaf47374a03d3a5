"""`robot-latency streams make`: bags from the corpus; the shipped streams are what it makes."""

from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path

import pytest

from robot_latency.cli import main
from robot_latency.streams import SHIPPED_DIR, SHIPPED_STREAMS, read_stream


def test_make_a_stream(tmp_path: Path) -> None:
    out = tmp_path / "bursty"
    assert main(["streams", "make", "--out", str(out), "--process", "bursty", "--count", "12",
                 "--rate-hz", "2", "--seed", "3"]) == 0
    stream = read_stream(out)
    assert len(stream.commands) == 12 and stream.topic == "/planner/command"
    assert all(c.text.strip() for c in stream.commands)
    # the corpus's labels beside it: one per distinct text, each a plan of the action language
    labels = [json.loads(line) for line in (out / "labels.jsonl").read_text().splitlines()]
    assert {x["text"] for x in labels} == {c.text for c in stream.commands}
    assert all(x["expected"]["steps"] for x in labels)


def test_shipped_streams_are_reproducible(tmp_path: Path) -> None:
    assert main(["streams", "make", "--shipped", "--out", str(tmp_path)]) == 0
    for spec in SHIPPED_STREAMS:
        made, shipped = read_stream(tmp_path / spec.name), read_stream(SHIPPED_DIR / spec.name)
        assert len(shipped.commands) == spec.n_commands
        assert [(c.t_ns, c.text) for c in made.commands] == \
            [(c.t_ns, c.text) for c in shipped.commands]
        # a stream with a camera ships its frames: the same scenes at the same times
        assert [(f.t_ns, f.stamp_ns, f.size_bytes, f.encoding) for f in made.frames] == \
            [(f.t_ns, f.stamp_ns, f.size_bytes, f.encoding) for f in shipped.frames]
        assert bool(shipped.frames) == (spec.frames_hz > 0)
        if spec.frames_hz:
            assert shipped.camera_topic == "/camera/image/compressed"
            period_ns = round(1e9 / spec.frames_hz)
            assert {b.t_ns - a.t_ns for a, b in pairwise(shipped.frames)} == \
                {period_ns}
            assert shipped.frames[-1].t_ns >= shipped.commands[-1].t_ns - period_ns


def test_process_required(tmp_path: Path) -> None:
    assert main(["streams", "make", "--out", str(tmp_path / "x")]) == 2


def _jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_make_a_bag_from_a_jsonl_stream(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    from rosbags.highlevel import AnyReader

    src = _jsonl(tmp_path / "session.jsonl", [
        '{"t_ns": 1000000000, "text": "pick up the red cup", "state": "gripper open"}',
        '{"t_ns": 1250000000, "text": "stop"}',
        '{"t_ns": 3000000000, "text": "go to the kitchen", "state": "at the door"}'])
    bag = tmp_path / "session_bag"
    assert main(["streams", "make", "--from", str(src), "--out", str(bag)]) == 0
    assert "3 commands over 2.0 s on /planner/command, robot state on /planner/state" in \
        capsys.readouterr().out
    # read back by the project's reader: the texts, the times and the states are the file's
    back = read_stream(bag, state_topic="/planner/state")
    assert back.topic == "/planner/command"
    assert [(c.t_ns, c.text) for c in back.commands] == [
        (0, "pick up the red cup"), (250_000_000, "stop"), (2_000_000_000, "go to the kitchen")]
    assert [c.state for c in back.commands] == ["gripper open", "gripper open", "at the door"]
    # and by rosbags itself: a real rosbag2 directory of std_msgs/msg/String messages
    with AnyReader([bag]) as reader:
        topics = {c.topic: (c.msgtype, c.msgcount) for c in reader.connections}
        texts = [reader.deserialize(raw, c.msgtype).data
                 for c, _t, raw in reader.messages()
                 if c.topic == "/planner/command"]
    assert topics == {"/planner/command": ("std_msgs/msg/String", 3),
                      "/planner/state": ("std_msgs/msg/String", 2)}
    assert texts == ["pick up the red cup", "stop", "go to the kitchen"]
    assert (bag / "metadata.yaml").is_file()


def test_make_from_jsonl_refuses_bad_input(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    bad = _jsonl(tmp_path / "bad.jsonl", ['{"t_ns": 0, "text": "stop"}', '{"t_ns": 5}'])
    bag = tmp_path / "bag"
    assert main(["streams", "make", "--from", str(bad), "--out", str(bag)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "bad.jsonl:2: " in err
    assert not bag.exists()  # nothing half-written
    assert main(["streams", "make", "--from", str(bad), "--out", str(bag),
                 "--skip-bad-lines"]) == 0
    assert "skipped bad lines [2]" in capsys.readouterr().out
    assert [c.text for c in read_stream(bag).commands] == ["stop"]
    # an existing bag is never overwritten
    assert main(["streams", "make", "--from", str(bad), "--out", str(bag)]) == 2
    assert "exists" in capsys.readouterr().err
    assert main(["streams", "make", "--from", str(tmp_path / "x.mcap"), "--out",
                 str(tmp_path / "b2")]) == 2
    assert "expected a .jsonl" in capsys.readouterr().err


def test_make_from_jsonl_keeps_the_labels(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """A labelled JSONL stream's ``expected`` reaches the bag's labels.jsonl, which the bag's
    readers (run, report, predict --stream) find by text."""
    from robot_latency.profiles.actions import plan_json_schema
    from robot_latency.streams.reader import labels_of_stream

    stop = {"steps": [{"action": "stop"}]}
    src = _jsonl(tmp_path / "l.jsonl", [
        json.dumps({"t_ns": 0, "text": "stop", "expected": stop}),
        json.dumps({"t_ns": 10, "text": "what is love?", "expected": "refuse"}),
        json.dumps({"t_ns": 20, "text": "go to the kitchen"}),
        json.dumps({"t_ns": 30, "text": "stop", "expected": stop})])
    bag = tmp_path / "bag"
    assert main(["streams", "make", "--from", str(src), "--out", str(bag)]) == 0
    assert f"labels in {bag / 'labels.jsonl'}" in capsys.readouterr().out
    lines = [json.loads(x) for x in (bag / "labels.jsonl").read_text().splitlines()]
    assert lines == [{"text": "stop", "expected": stop},
                     {"text": "what is love?", "expected": "refuse"}]
    labels = labels_of_stream(bag, schema=plan_json_schema())
    cmds = read_stream(bag).commands
    assert [labels.lookup(c.command_id, c.text) is not None for c in cmds] == [
        True, True, False, True]
    # one text labelled two ways cannot be kept by text: refused, naming the line
    two = _jsonl(tmp_path / "two.jsonl", [
        json.dumps({"t_ns": 0, "text": "stop", "expected": stop}),
        json.dumps({"t_ns": 1, "text": "stop", "expected": "refuse"})])
    assert main(["streams", "make", "--from", str(two), "--out", str(tmp_path / "b3")]) == 2
    assert "two.jsonl:2: command 'stop' is labelled two ways" in capsys.readouterr().err


def test_make_a_stream_with_camera_frames(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "seen"
    assert main(["streams", "make", "--out", str(out), "--process", "periodic", "--count", "3",
                 "--rate-hz", "2", "--frames-hz", "4"]) == 0
    assert "camera frames at 4 Hz on /camera/image/compressed" in capsys.readouterr().out
    stream = read_stream(out)
    assert len(stream.commands) == 3 and stream.camera_topic == "/camera/image/compressed"
    # 4 Hz over the commands' 1 s: frames at 0, 250, 500, 750 and 1000 ms, each a PNG
    assert [f.t_ns for f in stream.frames] == [k * 250_000_000 for k in range(5)]
    assert {(f.encoding, f.width, f.height) for f in stream.frames} == {("png", 128, 96)}
    # without --process there is nothing to draw frames for
    assert main(["streams", "make", "--out", str(tmp_path / "s"), "--shipped",
                 "--frames-hz", "4"]) == 2
    with pytest.raises(SystemExit):  # argparse's own refusal
        main(["streams", "make", "--out", str(tmp_path / "n"), "--process", "periodic",
              "--frames-hz", "-1"])
