"""The camera frame in the loop simulated on the target: a tower costs time, reuse pays once.

The untimed pass runs the real simulated engine on the shipped stream; the tower is one of the
project's real shapes (its FLOPs and tokens counted, predicted on the target). Checked on events:
which commands encode a frame, who misses, the e2e, never on wall-clock gaps.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from robot_latency.cli import main
from robot_latency.floor.vision_tower import VisionTower
from robot_latency.models.mmproj import SHAPES
from robot_latency.planner.config import RunSettings
from robot_latency.planner.target_image import ImageSetting, frame_age, image_commands
from robot_latency.planner.target_inputs import TargetInputs, untimed_inputs
from robot_latency.planner.target_sim import (
    margin_ms,
    min_deadline_ms,
    sim_commands,
    target_answer,
)
from robot_latency.report.target_answer import answers_from_inputs
from robot_latency.streams import SHIPPED_DIR, read_stream, write_jsonl
from robot_latency.streams.scene import frame_times_ns, scene_frames

DEADLINE_MS = 400.0


def _tower(name: str) -> VisionTower:
    s = SHAPES[name]
    return VisionTower(name=s.name, projector=s.projector, image_size_px=s.image_size_px,
                       patch_px=s.patch_px, width=s.width, ffn=s.ffn, layers=s.layers,
                       projection_dim=1, scale_factor=s.scale_factor,
                       class_token=s.class_token)


@pytest.fixture(scope="module")
def inputs() -> TargetInputs:
    full = read_stream(SHIPPED_DIR / "steady_operator")
    stream = replace(full, commands=full.commands[:24])
    return untimed_inputs(RunSettings(log_dir=Path("x"), engine="sim", model="qwen2.5-0.5b",
                                      quant="Q4_K_M", target_device="orin-nano-8gb",
                                      mode="event", deadline_ms=DEADLINE_MS),
                          stream, speed=3.0, use_cache=False)


@pytest.mark.parametrize("shape", ["siglip-b16-512", "clip-l14-336"])
@pytest.mark.parametrize("mode", ["event", "periodic"])
def test_a_tower_never_makes_the_answer_better(inputs: TargetInputs, shape: str,
                                               mode: str) -> None:
    steps = inputs.predictor()
    rules = replace(inputs.settings, mode=mode, period_ms=DEADLINE_MS)
    text = sim_commands(inputs.stream, inputs.untimed, steps, speed=3.0)
    seen = image_commands(inputs.stream, inputs.untimed, steps,
                          ImageSetting(_tower(shape), project_to_model=True), speed=3.0)
    # every asked command pays the encode and its image tokens
    assert seen.paid == tuple(c.command_id for c in text if c.asked)
    for t, v in zip(text, seen.cmds, strict=True):
        if t.asked:
            assert v.encode_ms == seen.vision.encode_ms > 0
            assert v.ttft_ms > t.ttft_ms and v.service_ms > t.service_ms
    a_text = target_answer("t", text, steps, rules, draws=200, curve=False)
    a_seen = target_answer("v", seen.cmds, steps, rules, draws=200, curve=False)
    assert a_seen.miss_rate >= a_text.miss_rate
    assert a_seen.e2e_p50_ms >= a_text.e2e_p50_ms and a_seen.e2e_p99_ms >= a_text.e2e_p99_ms
    assert a_seen.miss_interval[1] >= a_text.miss_interval[1]
    # the smallest deadline held moves up, or none is held any more (None: in periodic mode
    # commands replaced before a tick miss at any deadline)
    held_text, held_seen = min_deadline_ms(text, rules), min_deadline_ms(seen.cmds, rules)
    assert (held_text is not None) or mode == "periodic"
    assert held_seen is None or (held_text is not None and held_seen >= held_text)
    # the commands' own e2e, one by one (those planned in both)
    both = [(x, y) for x, y in zip(a_text.e2e_ms, a_seen.e2e_ms, strict=True)
            if not (np.isnan(x) or np.isnan(y))]
    assert both and all(y >= x for x, y in both)
    share = seen.facts()["image_share_of_ttft"]
    assert 0.5 < share < 1.0  # the frame is most of a short text prompt's TTFT
    assert seen.facts()["vision_status"].startswith("vision uncalibrated")


def test_reuse_pays_the_encode_once_for_an_unchanged_frame(inputs: TargetInputs) -> None:
    steps = inputs.predictor()
    tower = _tower("clip-l14-336")
    every = image_commands(inputs.stream, inputs.untimed, steps,
                           ImageSetting(tower, project_to_model=True), speed=3.0)
    reuse = image_commands(inputs.stream, inputs.untimed, steps,
                           ImageSetting(tower, policy="reuse", project_to_model=True),
                           speed=3.0)
    text = sim_commands(inputs.stream, inputs.untimed, steps, speed=3.0)
    asked = [i for i, c in enumerate(text) if c.asked]
    first = asked[0]
    assert reuse.static_frame and reuse.paid == (text[first].command_id,)
    assert [c.encode_ms > 0 for c in reuse.cmds] == [i == first for i in range(len(text))]
    assert reuse.cmds[first] == every.cmds[first]
    for i in asked[1:]:
        # no encode, no image prefill: only the longer context is left of the frame
        assert reuse.cmds[i].ttft_ms < every.cmds[i].ttft_ms
        assert reuse.cmds[i].service_ms >= text[i].service_ms
    assert reuse.facts()["frames_paid"] == 1 < every.facts()["frames_paid"]
    assert reuse.facts()["image_share_of_ttft"] < every.facts()["image_share_of_ttft"]


def test_reuse_pays_again_when_a_new_frame_arrives(inputs: TargetInputs) -> None:
    # frames every 2 s of the stream: a command pays when a newer frame came since the last
    # one encoded; the frame's age at arrival joins the plan's e2e in the frame age
    stream = inputs.stream
    span = stream.commands[-1].t_ns
    frames = scene_frames([t + 10**8 for t in frame_times_ns(span, 0.5)], seed=1)
    with_frames = replace(stream, frames=frames)
    steps = inputs.predictor()
    level = image_commands(with_frames, inputs.untimed, steps,
                           ImageSetting(_tower("siglip-b16-512"), policy="reuse",
                                        project_to_model=True, max_frame_age_ms=50.0),
                           speed=3.0)
    times = [f.t_ns for f in frames]
    expected, last = [], None
    for c, u in zip(stream.commands, inputs.untimed.commands, strict=True):
        key = max((i for i, t in enumerate(times) if t <= c.t_ns), default=None)
        if u.asked and key is not None and key != last:
            expected.append(c.command_id)
            last = key
    assert level.paid == tuple(expected) and 1 < len(expected) < len(frames) + 1
    assert not level.static_frame
    before = [c.command_id for c in stream.commands if c.t_ns < times[0]]
    assert before and all(level.frame_offset_ms.get(i) is None for i in before)
    a = target_answer("v", level.cmds, steps, inputs.settings, draws=1, curve=False)
    age = frame_age(level, a)
    assert age["plans"] <= len(a.model_in_time_ids)
    ids = [c.command_id for c in level.cmds if c.asked]
    e2e = dict(zip(ids, a.e2e_ms, strict=True))
    ages = [level.frame_offset_ms[i] + e2e[i] for i in a.model_in_time_ids
            if i in level.frame_offset_ms]
    assert age["stale"] == sum(1 for x in ages if x > 50.0)
    assert age["frame_age_p50_ms"] == pytest.approx(float(np.percentile(ages, 50)))


def test_the_answer_carries_the_frame(inputs: TargetInputs) -> None:
    setting = ImageSetting(_tower("siglip-b16-512"), project_to_model=True,
                           max_frame_age_ms=200.0)
    text, = answers_from_inputs([("Q4_K_M", inputs, None)], draws=50)
    seen, = answers_from_inputs([("Q4_K_M", inputs, None)], draws=50, image=setting)
    assert "vision" not in text.facts
    v = seen.facts["vision"]
    assert v["policy"] == "every" and v["frames_paid"] == v["commands_asked"]
    assert v["plans"] == len(seen.model_in_time_ids) and v["stale"] is not None
    # the frame is taken at the command's send: its age at the receiver is the plan's e2e
    assert v["frame_age_p99_ms"] <= DEADLINE_MS
    assert seen.miss_rate >= text.miss_rate
    # a new frame each cycle leaves fewer output tokens in the deadline
    assert all(b_img <= b for b_img, b in zip(seen.facts["budget_tokens"],
                                              text.facts["budget_tokens"], strict=True))


def test_predict_stream_prints_the_image_share_and_vision_uncalibrated(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROBOT_LATENCY_CACHE_DIR", str(tmp_path / "cache"))
    full = read_stream(SHIPPED_DIR / "steady_operator")
    path = write_jsonl(tmp_path / "s.jsonl", full.commands[:12])
    common = ["predict", "--stream", str(path), "--engine", "sim", "--model", "qwen2.5-0.5b",
              "--quants", "Q4_K_M", "--device", "orin-nano-8gb", "--deadline-ms", "400",
              "--mode", "event", "--draws", "20"]
    assert main([*common, "--vision-tower", "clip-l14-336", "--image-policy", "reuse",
                 "--max-frame-age-ms", "300"]) == 0
    out = capsys.readouterr().out.splitlines()
    head = "\n".join(out[:6])
    assert "Image share of TTFT on the target (point prediction): Q4_K_M " in head
    assert "vision uncalibrated" in head
    assert "one static scene is assumed" in head and "only the first command encodes" in head
    assert any("policy reuse: 1 of 12 commands encode a frame" in line for line in out)
    assert any("stale (older than 300 ms)" in line for line in out)
    assert main([*common, "--vision-tower", "siglip-b16-512", "--json"]) == 0
    level, = json.loads(capsys.readouterr().out)["levels"]
    v = level["facts"]["vision"]
    assert v["image_tokens"] == 128 and v["frames_paid"] == 12 and not v["vision_calibrated"]
    assert 0 < v["image_share_of_ttft"] < 1
    assert main(common) == 0
    assert "Image share" not in capsys.readouterr().out
    # fit on a 1280x960 frame (7 chunks at full size) with a tight deadline: smaller frames,
    # and the count of each, in the answer
    fit_args = [*common, "--vision-tower", "siglip-b16-512", "--frame-px", "1280x960",
                "--image-policy", "fit", "--fit-scales", "1", "0.5"]
    assert main(fit_args) == 0
    line, = [x for x in capsys.readouterr().out.splitlines() if "policy fit:" in x]
    assert "planned text-only, no frame size fitting the deadline" in line
    assert main([*fit_args, "--json"]) == 0
    level, = json.loads(capsys.readouterr().out)["levels"]
    v = level["facts"]["vision"]
    assert v["fit"]["scales"] == [1.0, 0.5]
    assert set(v["fit"]["frames_at_px"]) <= {"1280x960", "640x480"}
    assert sum(v["fit"]["frames_at_px"].values()) == v["frames_paid"]
    assert v["frames_paid"] + v["fit"]["text_only"] <= v["commands_asked"]


def _framed(inputs: TargetInputs):
    """The stream with a new frame just before each command: every asked command sees a new
    one, so ``fit`` decides for each."""
    stream = inputs.stream
    return replace(stream, frames=scene_frames([c.t_ns - 10**6 for c in stream.commands],
                                                 seed=2))


def test_fit_sees_each_new_frame_at_the_largest_size_that_fits_else_plans_text_only(
        inputs: TargetInputs) -> None:
    """Per command, fit's choice against the same command costed with ``every`` at each of the
    frame sizes: the size it used fits the deadline less the margins, every larger one does
    not; a command planned text-only fits at no size; a deadline in between makes both
    happen. Its answer is never worse than ``every``'s."""
    steps = inputs.predictor()
    stream = _framed(inputs)
    tower = _tower("siglip-b16-512")
    scales = (1.0, 0.75, 0.5)
    # idefics3 tiles the frame: a 1280x960 one is 6 tiles and the global view, 960x720 two and
    # 640x480 one (each side rounded to whole 512-px tiles)
    base = ImageSetting(tower, project_to_model=True, frame_px=(1280, 960))
    sizes = [base.scaled_px(s) for s in scales]
    every = {px: image_commands(stream, inputs.untimed, steps,
                                replace(base, frame_px=px), speed=3.0) for px in sizes}
    text = sim_commands(stream, inputs.untimed, steps, speed=3.0)
    asked = [i for i, c in enumerate(text) if c.asked]
    # the deadline: a third of the commands fit at full size (the rest need a smaller frame)
    full = sorted(every[sizes[0]].cmds[i].service_ms for i in asked)
    assert all(every[sizes[1]].cmds[i].service_ms < every[sizes[0]].cmds[i].service_ms
               for i in asked)  # a smaller frame costs less
    rules = replace(inputs.settings,
                    deadline_ms=margin_ms(inputs.settings) + full[len(asked) // 3])
    room = rules.deadline_ms - margin_ms(rules)
    fit = image_commands(stream, inputs.untimed, steps,
                         replace(base, policy="fit", fit_scales=scales), speed=3.0,
                         rules=rules)
    assert len(fit.paid) + len(fit.text_only) == len(asked)
    for i in asked:
        cid = text[i].command_id
        if cid in fit.text_only:
            assert fit.cmds[i] == text[i]
            assert all(every[px].cmds[i].service_ms > room for px in sizes)
            continue
        px = fit.frame_px_used[cid]
        k = sizes.index(px)
        assert fit.cmds[i] == every[px].cmds[i] and fit.cmds[i].service_ms <= room
        assert all(every[bigger].cmds[i].service_ms > room for bigger in sizes[:k])
    used = set(fit.frame_px_used.values())
    assert sizes[0] in used and len(used) > 1  # some at full size, some downscaled
    facts = fit.facts()["fit"]
    assert sum(facts["frames_at_px"].values()) == len(fit.paid)
    assert facts["text_only"] == len(fit.text_only)
    a_every = target_answer("e", every[sizes[0]].cmds, steps, rules, draws=200, curve=False)
    a_fit = target_answer("f", fit.cmds, steps, rules, draws=200, curve=False)
    assert a_fit.miss_rate <= a_every.miss_rate
    assert a_fit.e2e_p50_ms <= a_every.e2e_p50_ms


def test_fit_is_reuse_when_everything_fits_and_text_only_when_nothing_does(
        inputs: TargetInputs) -> None:
    steps = inputs.predictor()
    stream = _framed(inputs)
    base = ImageSetting(_tower("clip-l14-336"), project_to_model=True)
    reuse = image_commands(stream, inputs.untimed, steps, replace(base, policy="reuse"),
                           speed=3.0)
    roomy = image_commands(stream, inputs.untimed, steps, replace(base, policy="fit"),
                           speed=3.0, rules=replace(inputs.settings, deadline_ms=10**7))
    assert roomy.cmds == reuse.cmds and roomy.paid == reuse.paid and not roomy.text_only
    # LLaVA's projector resizes every frame to its tile: a smaller frame costs the same
    assert set(roomy.frame_px_used.values()) == {base.frame_px}
    tight = image_commands(stream, inputs.untimed, steps, replace(base, policy="fit"),
                           speed=3.0, rules=replace(inputs.settings, deadline_ms=1.0
                                                    + margin_ms(inputs.settings)))
    text = sim_commands(stream, inputs.untimed, steps, speed=3.0)
    assert tight.cmds == text and not tight.paid
    assert tight.text_only == tuple(c.command_id for c in text if c.asked)
    assert tight.frame_offset_ms == {}  # no plan answers a frame
    with pytest.raises(ValueError, match="rules"):
        image_commands(stream, inputs.untimed, steps, replace(base, policy="fit"), speed=3.0)
    with pytest.raises(ValueError, match="fit_scales"):
        ImageSetting(base.tower, fit_scales=(1.0, 1.5))
