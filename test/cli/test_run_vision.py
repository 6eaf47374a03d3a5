"""`run --mmproj`: a replayed bag's camera frames in the planner's prompt, through real llama.cpp.

A bag made with frames, a tiny untrained tower for the shipped planner (written by
`models mmproj`), and `run` in event mode with a deadline nothing misses: every cycle plans with
the newest frame of the replay by its start, encodes it when it is new, and finds it in the KV
cache when it is the one before (``reuse``); ``every`` encodes each cycle.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from robot_latency.cli import main
from robot_latency.records import read_records


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("vision_run")
    assert main(["streams", "make", "--process", "periodic", "--rate-hz", "2", "--count", "6",
                 "--frames-hz", "1", "--out", str(d / "bag")]) == 0
    assert main(["models", "mmproj", "--tower", "tiny-shuffle", "--out", str(d / "t.gguf")]) == 0
    return d / "bag", d / "t.gguf"


@pytest.mark.parametrize("policy", ["reuse", "every"])
def test_run_plans_each_cycle_with_the_replays_newest_frame(inputs, tmp_path: Path,
                                                            policy: str) -> None:
    bag, mmproj = inputs
    out = tmp_path / "run"
    assert main(["run", "--stream", str(bag), "--mmproj", str(mmproj), "--image-policy", policy,
                 "--mode", "event", "--deadline-ms", "60000", "--out", str(out)]) == 0
    records = [r for r in read_records(out / "cycles.jsonl") if r.plan_source == "model"]
    assert len(records) == 6
    previous = None
    for r in records:
        # frames every second from the first command's time, commands every half second
        assert r.frame_stamp_ns is not None and r.frame_age_ms is not None
        assert r.image is not None and r.image["chunks"] == 2
        reused = policy == "reuse" and r.frame_stamp_ns == previous
        assert r.image["reused"] == reused, (r.cycle, r.image)
        assert ("image_prefill" in r.phases_ns) != reused
        previous = r.frame_stamp_ns
    assert len({r.frame_stamp_ns for r in records}) >= 2


def test_run_without_a_tower_is_text_only(inputs, tmp_path: Path) -> None:
    bag, _ = inputs
    assert main(["run", "--stream", str(bag), "--mode", "event", "--deadline-ms", "60000",
                 "--asap", "--out", str(tmp_path / "text")]) == 0
    for r in read_records(tmp_path / "text" / "cycles.jsonl"):
        assert r.image is None and r.frame_stamp_ns is None
        assert not {"image_encode", "image_prefill"} & set(r.phases_ns)


def test_sweep_compares_frame_scales_and_image_policies(tmp_path: Path, capsys) -> None:
    """sweep --frame-scales 1,0.5 with an idefics3 tower: a 256x256 frame is four 128-px tiles
    and the global view at full size, one tile and the view at half; the policies axis names
    its points too."""
    import dataclasses

    from robot_latency.models.bundled import bundled_model_path
    from robot_latency.models.mmproj import SHAPES, write_mmproj
    from robot_latency.streams import Command, write_bag
    from robot_latency.streams.scene import render_scene, scene_frames

    ms = 1_000_000
    commands = [Command(t_ns=(50 + 400 * i) * ms, text=t, command_id=f"c{i}")
                for i, t in enumerate(["stop", "go to the kitchen", "pick up the red cup"])]
    frames = [dataclasses.replace(f, data=render_scene(i, width=256, height=256), width=256,
                                  height=256)
              for i, f in enumerate(scene_frames([0, 420 * ms], seed=1))]
    bag = write_bag(tmp_path / "bag", commands, frames=tuple(frames))
    mmproj = write_mmproj(SHAPES["tiny-shuffle"], tmp_path / "t.gguf",
                          lm_path=bundled_model_path("planner"))
    out = tmp_path / "sweep"
    assert main(["sweep", "--stream", str(bag), "--mmproj", str(mmproj), "--frame-scales",
                 "1,0.5", "--image-policies", "reuse,every", "--mode", "event",
                 "--deadline-ms", "60000", "--out", str(out)]) == 0
    tokens = {}
    for run in sorted(p for p in out.iterdir() if (p / "cycles.jsonl").is_file()):
        recs = [r for r in read_records(run / "cycles.jsonl") if r.image is not None]
        assert len(recs) == 3, run.name
        tokens[run.name] = {r.image["tokens"] for r in recs}
        reused = [r.image["reused"] for r in recs]
        # frames at 0 and 420 ms, commands at 50, 450 and 850 ms: the last reuses the second
        assert reused == ([False, False, True] if "reuse" in run.name else [False] * 3)
    assert tokens == {"reuse_x1": {80}, "reuse_x0.5": {32}, "every_x1": {80},
                      "every_x0.5": {32}}
    # the frame's part per run, printed and in vision.json; the report has it too
    printed = capsys.readouterr().out
    assert "The camera frame" in printed and "| reuse x0.5 | 3 | 2 / 1 / 0 | 32 |" in printed
    rows = {r["label"]: r for r in json.loads((out / "vision.json").read_text())}
    assert (rows["every x1"]["frames_encoded"], rows["every x1"]["frames_reused"]) == (3, 0)
    assert rows["reuse x1"]["image_tokens"] == 80 and 0 < rows["reuse x1"]["image_share_of_ttft"]
    assert rows["reuse x1"]["frame_age_p50_ms"] > 0
    assert main(["report", *[str(p) for p in sorted(out.glob("*_x*"))], "--out",
                 str(tmp_path / "rep")]) == 0
    assert "## The camera frame" in (tmp_path / "rep" / "report.md").read_text()
