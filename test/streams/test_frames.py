"""Camera frames with a command stream: a foreign bag's Image topic, a JSONL line's image file,
frames written by write_bag and by `streams make --frames-hz`, all read back through
read_stream."""

from __future__ import annotations

import json

import numpy as np
import pytest

from robot_latency.streams import Command, FrameLoader, StreamError, read_stream, write_bag
from robot_latency.streams.convert import jsonl_to_bag
from robot_latency.streams.frames import image_size
from robot_latency.streams.rosbag import typestore as our_typestore
from robot_latency.streams.scene import HEIGHT, WIDTH, render_scene, scene_frames

from .conftest import START_NS

STRING = "std_msgs/msg/String"
IMAGE = "sensor_msgs/msg/Image"
COMPRESSED = "sensor_msgs/msg/CompressedImage"
START = 1_700_000_000_000_000_000  # write_bag's default start


def _image(typestore, stamp_ns: int, value: int, *, width: int = 4, height: int = 2):
    t = typestore.types
    header = t["std_msgs/msg/Header"](
        stamp=t["builtin_interfaces/msg/Time"](sec=stamp_ns // 10**9, nanosec=stamp_ns % 10**9),
        frame_id="cam")
    data = np.full(width * height * 3, value, dtype=np.uint8)
    return t[IMAGE](header=header, height=height, width=width, encoding="rgb8",
                    is_bigendian=0, step=width * 3, data=data)


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_a_foreign_bag_with_an_image_topic_reads_its_frames_in_order(
        tmp_path, make_bag, typestore, string, storage):
    """A bag written with rosbags' own writer and typestore: String commands on one topic,
    raw sensor_msgs/Image frames on another, interleaved; each frame's header stamp a little
    before its log time (the camera's capture)."""
    cmds = [(START_NS + 100_000_000, "go to the kitchen"), (START_NS + 700_000_000, "stop")]
    frame_log = [START_NS + k * 250_000_000 for k in range(5)]  # 0, 250, 500, 750, 1000 ms
    messages = [("/robot/cmd", STRING, t, string(data=text)) for t, text in cmds]
    # written out of time order: the reader orders by log time
    messages += [("/cam/image_raw", IMAGE, t, _image(typestore, t - 5_000_000, k))
                 for k, t in reversed(list(enumerate(frame_log)))]
    bag = make_bag(tmp_path / "foreign", messages, storage=storage)

    stream = read_stream(bag)

    assert [c.text for c in stream.commands] == ["go to the kitchen", "stop"]
    assert stream.camera_topic == "/cam/image_raw"
    frames = stream.frames
    assert [f.t_ns for f in frames] == [t - cmds[0][0] for t in frame_log]
    assert frames[0].t_ns == -100_000_000  # recorded before the first command
    assert [f.stamp_ns for f in frames] == [t - 5_000_000 for t in frame_log]
    assert {(f.msgtype, f.encoding, f.width, f.height, f.step, f.frame_id) for f in frames} \
        == {(IMAGE, "rgb8", 4, 2, 12, "cam")}
    assert all(f.data is None and f.size_bytes == 24 for f in frames)  # bytes left in the bag
    loader = FrameLoader(our_typestore())
    try:
        assert [loader.data(f) for f in frames] == [bytes([k]) * 24 for k in range(5)]
        assert loader.data(frames[1]) == bytes([1]) * 24  # out of order: reopened
    finally:
        loader.close()

    # chosen by name; "" reads none; a missing or non-image topic is an error naming it
    assert len(read_stream(bag, camera_topic="/cam/image_raw").frames) == 5
    assert read_stream(bag, camera_topic="").frames == ()
    with pytest.raises(StreamError, match="camera topic /robot/cmd is not an image topic"):
        read_stream(bag, camera_topic="/robot/cmd")


def test_two_image_topics_give_no_frames_unless_one_is_named(tmp_path, make_bag, typestore,
                                                            string):
    messages = [("/cmd", STRING, START_NS, string(data="stop")),
                ("/left", IMAGE, START_NS, _image(typestore, START_NS, 1)),
                ("/right", IMAGE, START_NS, _image(typestore, START_NS, 2))]
    bag = make_bag(tmp_path / "two", messages)
    assert read_stream(bag).frames == ()
    (frame,) = read_stream(bag, camera_topic="/right").frames
    loader = FrameLoader(our_typestore())
    assert loader.data(frame) == bytes([2]) * 24
    loader.close()


def test_write_bag_writes_compressed_frames_that_read_back(tmp_path):
    frames = scene_frames([0, 300_000_000, 900_000_000], seed=4)
    commands = [Command(t_ns=0, text="pick up the red cup", command_id="a:0"),
                Command(t_ns=500_000_000, text="stop", command_id="a:1")]
    bag = write_bag(tmp_path / "with_frames", commands, frames=frames,
                    camera_topic="/front/image/compressed")

    stream = read_stream(bag)

    assert stream.camera_topic == "/front/image/compressed"
    assert [f.t_ns for f in stream.frames] == [0, 300_000_000, 900_000_000]
    assert [f.stamp_ns for f in stream.frames] == [START + t for t in (0, 300_000_000,
                                                                       900_000_000)]
    assert {(f.msgtype, f.encoding, f.width, f.height) for f in stream.frames} \
        == {(COMPRESSED, "png", WIDTH, HEIGHT)}
    loader = FrameLoader(our_typestore())
    assert [loader.data(f) for f in stream.frames] == [f.data for f in frames]
    loader.close()
    assert len({f.data for f in frames}) == 3  # each frame its own scene


def test_a_jsonl_line_may_name_an_image(tmp_path):
    png = render_scene(7)
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "scene.png").write_bytes(png)
    src = tmp_path / "session.jsonl"
    src.write_text(json.dumps({"t_ns": 1_000, "text": "stop"}) + "\n"
                   + json.dumps({"t_ns": 5_000, "text": "pick that up",
                                 "image": "img/scene.png"}) + "\n")

    stream = read_stream(src)

    (frame,) = stream.frames
    assert (frame.t_ns, frame.stamp_ns) == (4_000, 5_000)  # the line's time, as its command's
    assert (frame.encoding, frame.width, frame.height, frame.size_bytes) \
        == ("png", WIDTH, HEIGHT, len(png))
    assert FrameLoader(our_typestore()).data(frame) == png

    # converted to a bag: the frame on the camera topic, just before its command
    bag = jsonl_to_bag(src, tmp_path / "bag").bag
    again = read_stream(bag)
    assert [f.t_ns for f in again.frames] == [4_000]
    assert FrameLoader(our_typestore()).data(again.frames[0]) == png


@pytest.mark.parametrize(("image", "message"), [
    ("missing.png", "session.jsonl:1: bad command line: image .*missing.png"),
    ("notes.txt", "expected a .png, .jpg or .jpeg file"),
    (3, "image must be a non-empty string"),
])
def test_a_bad_image_line_names_the_line(tmp_path, image, message):
    (tmp_path / "notes.txt").write_text("x")
    src = tmp_path / "session.jsonl"
    src.write_text(json.dumps({"t_ns": 0, "text": "stop", "image": image}) + "\n")
    with pytest.raises(StreamError, match=message):
        read_stream(src)
    assert read_stream(src, on_bad_line="skip").skipped_lines == (1,)


def test_image_size_reads_png_and_jpeg_headers():
    assert image_size(render_scene(1)) == (WIDTH, HEIGHT)
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (33, 17)).save(out, format="JPEG")
    assert image_size(out.getvalue()) == (33, 17)
    assert image_size(b"not an image") is None
