"""`run --mmproj`: a replayed bag's camera frames in the planner's prompt, through real llama.cpp.

A bag made with frames, a tiny untrained tower for the shipped planner (written by
`models mmproj`), and `run` in event mode with a deadline nothing misses: every cycle plans with
the newest frame of the replay by its start, encodes it when it is new, and finds it in the KV
cache when it is the one before (``reuse``); ``every`` encodes each cycle.
"""

from __future__ import annotations

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
