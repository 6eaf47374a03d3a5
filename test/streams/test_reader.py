"""Dispatch by what a path is, and the record types' own checks."""

from __future__ import annotations

import pytest

from robot_latency.streams import (
    READERS,
    Command,
    CommandStream,
    StreamError,
    stream_kind,
    write_bag,
    write_jsonl,
    write_mcap,
)


def test_kind_follows_what_the_path_is(tmp_path, commands):
    assert stream_kind(write_bag(tmp_path / "bag", commands, storage="sqlite3")) == "rosbag2"
    assert stream_kind(write_bag(tmp_path / "bag2", commands, storage="mcap")) == "rosbag2"
    assert stream_kind(write_mcap(tmp_path / "bare.mcap", commands)) == "mcap"
    assert stream_kind(write_jsonl(tmp_path / "s.jsonl", commands)) == "jsonl"
    assert set(READERS) == {"rosbag2", "mcap", "jsonl"}


def test_directory_without_metadata_is_not_a_bag(tmp_path):
    (tmp_path / "plain").mkdir()

    with pytest.raises(StreamError, match=r"no metadata\.yaml") as info:
        stream_kind(tmp_path / "plain")
    assert str(tmp_path / "plain") in str(info.value)


def test_unknown_file_kind_is_named(tmp_path):
    path = tmp_path / "commands.txt"
    path.write_text("stop\n")

    with pytest.raises(StreamError, match=r"unknown stream format \.txt") as info:
        stream_kind(path)
    assert str(path) in str(info.value)


def test_command_rejects_negative_or_non_integer_times():
    with pytest.raises(ValueError, match="t_ns"):
        Command(-1, "stop", "s:0")
    with pytest.raises(TypeError, match="t_ns"):
        Command(1.5, "stop", "s:0")  # type: ignore[arg-type]


def test_stream_rejects_commands_out_of_order():
    with pytest.raises(ValueError, match="before"):
        CommandStream("s", "s.jsonl", (Command(5, "a", "s:0"), Command(4, "b", "s:1")), None)


def test_duration_of_empty_and_single_streams_is_zero():
    assert CommandStream("s", "s", (), None).duration_ns == 0
    assert CommandStream("s", "s", (Command(7, "a", "s:0"),), None).duration_ns == 0
