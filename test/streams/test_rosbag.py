"""Bags written by rosbags' real Writer (sqlite3 and MCAP), read back through read_stream."""

from __future__ import annotations

import logging
import struct
from pathlib import Path

import pytest

from robot_latency.streams import (
    Command,
    StreamError,
    read_stream,
    write_bag,
    write_mcap,
)

STRING = "std_msgs/msg/String"
INT32 = "std_msgs/msg/Int32"


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_bag_round_trip_keeps_text_and_times(tmp_path, commands, storage):
    bag = write_bag(tmp_path / "session", commands, storage=storage)

    assert (bag / "metadata.yaml").is_file()
    stream = read_stream(bag)

    assert stream.name == "session"
    assert stream.source == str(bag)
    assert stream.topic == "/planner/command"
    assert [c.text for c in stream.commands] == [c.text for c in commands]
    assert [c.t_ns for c in stream.commands] == [c.t_ns for c in commands]
    assert [c.command_id for c in stream.commands] == [f"session:{i}" for i in range(8)]
    assert stream.duration_ns == commands[-1].t_ns
    assert stream.skipped_lines == ()


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_bag_times_are_relative_to_first_message(tmp_path, storage):
    late = [Command(500, "a", "x:0"), Command(1_500, "b", "x:1")]
    bag = write_bag(tmp_path / "late", late, storage=storage, topic="/cmd", start_ns=123)

    stream = read_stream(bag)

    assert [c.t_ns for c in stream.commands] == [0, 1_000]
    assert stream.topic == "/cmd"


def test_bare_mcap_round_trip(tmp_path, commands):
    path = write_mcap(tmp_path / "bare.mcap", commands, topic="/operator/say")

    assert path.is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bare.mcap"]  # no temp dir left behind
    stream = read_stream(path)
    assert stream.name == "bare"
    assert stream.topic == "/operator/say"
    assert [(c.t_ns, c.text) for c in stream.commands] == [(c.t_ns, c.text) for c in commands]


def test_mcap_inside_a_bag_directory_reads_on_its_own(tmp_path, commands):
    bag = write_bag(tmp_path / "dir", commands, storage="mcap")
    (inner,) = bag.glob("*.mcap")

    assert [c.text for c in read_stream(inner).commands] == [c.text for c in commands]


def test_writers_refuse_to_overwrite(tmp_path, commands):
    bag = write_bag(tmp_path / "bag", commands)
    with pytest.raises(StreamError, match="exists already"):
        write_bag(bag, commands)
    mcap = write_mcap(tmp_path / "x.mcap", commands)
    with pytest.raises(StreamError, match="exists already"):
        write_mcap(mcap, commands)


def test_write_mcap_needs_mcap_suffix(tmp_path, commands):
    with pytest.raises(StreamError, match=r"\.mcap"):
        write_mcap(tmp_path / "x.bag", commands)


def test_write_bag_rejects_unknown_storage(tmp_path, commands):
    with pytest.raises(ValueError, match="storage"):
        write_bag(tmp_path / "bag", commands, storage="rosbag1")


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_single_string_topic_is_picked_among_others(tmp_path, make_bag, string, int32, storage):
    bag = make_bag(
        tmp_path / "mixed",
        [
            ("/battery", INT32, 10, int32(data=97)),
            ("/cmd", STRING, 20, string(data="stop")),
            ("/battery", INT32, 30, int32(data=96)),
            ("/cmd", STRING, 40, string(data="go")),
        ],
        storage=storage,
    )

    stream = read_stream(bag)

    assert stream.topic == "/cmd"
    assert [(c.t_ns, c.text) for c in stream.commands] == [(0, "stop"), (20, "go")]


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_messages_are_ordered_by_log_time(tmp_path, make_bag, string, storage):
    bag = make_bag(
        tmp_path / "shuffled",
        [
            ("/cmd", STRING, 300, string(data="third")),
            ("/cmd", STRING, 100, string(data="first")),
            ("/cmd", STRING, 200, string(data="second")),
        ],
        storage=storage,
    )

    stream = read_stream(bag)

    assert [(c.t_ns, c.text) for c in stream.commands] == [
        (0, "first"),
        (100, "second"),
        (200, "third"),
    ]


def test_several_string_topics_is_an_error_listing_them(tmp_path, make_bag, string, int32):
    bag = make_bag(
        tmp_path / "two",
        [
            ("/a/cmd", STRING, 1, string(data="left")),
            ("/b/cmd", STRING, 2, string(data="right")),
            ("/battery", INT32, 3, int32(data=1)),
        ],
    )

    with pytest.raises(StreamError) as info:
        read_stream(bag)

    message = str(info.value)
    assert str(bag) in message
    assert "--topic" in message
    for listed in (
        "/a/cmd (std_msgs/msg/String)",
        "/b/cmd (std_msgs/msg/String)",
        "/battery (std_msgs/msg/Int32)",
    ):
        assert listed in message
    # Naming one resolves it.
    assert [c.text for c in read_stream(bag, topic="/b/cmd").commands] == ["right"]


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_no_string_topic_is_an_error(tmp_path, make_bag, int32, storage):
    bag = make_bag(tmp_path / "ints", [("/count", INT32, 5, int32(data=3))], storage=storage)

    with pytest.raises(StreamError, match="no std_msgs/msg/String topic") as info:
        read_stream(bag)

    assert str(bag) in str(info.value)
    assert "/count (std_msgs/msg/Int32)" in str(info.value)


def test_empty_bag_is_an_error_saying_it_has_no_topics(tmp_path, make_bag):
    bag = make_bag(tmp_path / "empty", [])

    with pytest.raises(StreamError, match="no topics"):
        read_stream(bag)


def test_string_topic_without_messages_gives_an_empty_stream(tmp_path, make_bag):
    bag = make_bag(tmp_path / "quiet", [], topics=[("/cmd", STRING)])

    stream = read_stream(bag)

    assert stream.topic == "/cmd"
    assert stream.commands == ()
    assert stream.duration_ns == 0


def test_named_topic_missing_is_an_error_listing_what_exists(tmp_path, make_bag, string):
    bag = make_bag(tmp_path / "one", [("/cmd", STRING, 1, string(data="stop"))])

    with pytest.raises(StreamError, match="topic /nope not found") as info:
        read_stream(bag, topic="/nope")

    assert str(bag) in str(info.value)
    assert "/cmd (std_msgs/msg/String)" in str(info.value)


def test_named_topic_of_another_type_is_an_error(tmp_path, make_bag, string, int32):
    bag = make_bag(
        tmp_path / "typed",
        [("/cmd", STRING, 1, string(data="stop")), ("/count", INT32, 2, int32(data=1))],
    )

    with pytest.raises(StreamError, match="/count has type std_msgs/msg/Int32"):
        read_stream(bag, topic="/count")


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_invalid_utf8_in_bag_string_is_replaced_with_a_warning(
    tmp_path, make_bag, string, storage, caplog
):
    payload = b"go \xff\xfe fast"
    # A CDR little-endian std_msgs/msg/String: header, uint32 size (with NUL), bytes, NUL.
    raw = b"\x00\x01\x00\x00" + struct.pack("<I", len(payload) + 1) + payload + b"\x00"
    bag = make_bag(
        tmp_path / "bytes",
        [("/cmd", STRING, 1, string(data="ok")), ("/cmd", STRING, 2, raw)],
        storage=storage,
    )

    with caplog.at_level(logging.WARNING, logger="robot_latency.streams"):
        stream = read_stream(bag)

    assert [c.text for c in stream.commands] == ["ok", "go \ufffd\ufffd fast"]
    assert any("message 1" in r.getMessage() and "UTF-8" in r.getMessage() for r in caplog.records)


def test_undecodable_message_is_a_stream_error(tmp_path, make_bag):
    bag = make_bag(tmp_path / "junk", [("/cmd", STRING, 1, b"\x07\x07")])

    with pytest.raises(StreamError, match="message 0 on /cmd") as info:
        read_stream(bag)

    assert str(bag) in str(info.value)


# --- corrupt, truncated and unreadable bags ------------------------------------------------------


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_garbage_storage_file_names_the_bag(tmp_path, commands, storage):
    bag = write_bag(tmp_path / "bag", commands, storage=storage)
    (storage_file,) = [p for p in bag.iterdir() if p.name != "metadata.yaml"]
    storage_file.write_bytes(b"this is not a bag at all\n" * 40)

    with pytest.raises(StreamError, match="Could not read bag") as info:
        read_stream(bag)

    assert str(bag) in str(info.value)
    assert info.value.__cause__ is not None


@pytest.mark.parametrize("keep", [0, 8, 30, 200, -37, -1])
def test_truncated_bare_mcap_names_the_file(tmp_path, commands, keep):
    good = write_mcap(tmp_path / "good.mcap", commands).read_bytes()
    cut = tmp_path / "cut.mcap"
    cut.write_bytes(good[:keep])

    with pytest.raises(StreamError, match="Could not read bag") as info:
        read_stream(cut)

    assert str(cut) in str(info.value)


def test_truncated_mcap_inside_a_bag_names_the_bag(tmp_path, commands):
    bag = write_bag(tmp_path / "bag", commands, storage="mcap")
    (inner,) = bag.glob("*.mcap")
    inner.write_bytes(inner.read_bytes()[: inner.stat().st_size // 2])

    with pytest.raises(StreamError) as info:
        read_stream(bag)

    assert str(bag) in str(info.value)


@pytest.mark.parametrize(
    "metadata",
    [
        b"\x00\xff{{{ not: yaml: [",
        b"just a string\n",
        b"rosbag2_bagfile_information:\n  version: 8\n",
        b"",
    ],
    ids=["binary", "scalar", "missing-keys", "empty"],
)
def test_garbage_metadata_names_the_bag(tmp_path, commands, metadata):
    bag = write_bag(tmp_path / "bag", commands)
    (bag / "metadata.yaml").write_bytes(metadata)

    with pytest.raises(StreamError) as info:
        read_stream(bag)

    assert str(bag) in str(info.value)


def test_missing_storage_file_names_the_bag(tmp_path, commands):
    bag = write_bag(tmp_path / "bag", commands, storage="sqlite3")
    for db in bag.glob("*.db3"):
        db.unlink()

    with pytest.raises(StreamError, match="missing") as info:
        read_stream(bag)

    assert str(bag) in str(info.value)


def test_missing_bag_directory_names_the_path(tmp_path):
    missing = tmp_path / "no_such_bag"

    with pytest.raises(StreamError, match="no such file") as info:
        read_stream(missing)

    assert str(missing) in str(info.value)


def test_state_topic_gives_each_command_the_latest_state(tmp_path: Path) -> None:
    commands = [Command(0, "stop", "a"), Command(10, "go home", "b", state="docked"),
                Command(20, "wait", "c"), Command(30, "stop", "d", state="low battery")]
    bag = write_bag(tmp_path / "bag", commands, state_topic="/robot/state")
    # Two String topics: the state topic is left out when the command topic is picked.
    stream = read_stream(bag, state_topic="/robot/state")
    assert stream.topic == "/planner/command"
    assert [c.text for c in stream.commands] == ["stop", "go home", "wait", "stop"]
    assert [c.state for c in stream.commands] == [None, "docked", "docked", "low battery"]
    assert all(c.state is None for c in read_stream(bag, topic="/planner/command").commands)
    with pytest.raises(StreamError, match=r"topic /nope not found"):
        read_stream(bag, state_topic="/nope")
