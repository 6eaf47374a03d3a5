"""Installing a trained JSON planner: the manifest keeps every phase of the training."""

from __future__ import annotations

import json

from robot_latency.models import bundled
from robot_latency.models.json_build import _phases


def _meta(steps: int, wall: float) -> dict:
    return {"train": {"lr": 1e-3, "budget_s": wall}, "steps_done": steps, "train_wall_s": wall,
            "final_loss": 0.01, "torch_greedy": {"heldout": {"exact_match": 0.9}}}


def test_a_fresh_run_is_its_own_record():
    rec = _phases(None, _meta(100, 10.0), "json_train --out a")
    assert rec == {"train": {"lr": 1e-3, "budget_s": 10.0}, "steps_done": 100,
                   "train_wall_s": 10.0, "build_command": "json_train --out a"}


def test_a_continued_run_adds_a_phase_to_the_shipped_manifest():
    shipped = json.loads((bundled.MODELS_DIR / bundled.JSON_MANIFEST).read_text())
    n = len(shipped["train"])
    rec = _phases(shipped, _meta(100, 10.0), "json_train --out b --init shipped")
    assert list(rec["train"])[:n] == list(shipped["train"])
    new = rec["train"][f"phase_{n + 1}"]
    assert new["steps_done"] == 100 and new["torch_greedy"]["heldout"]["exact_match"] == 0.9
    assert rec["steps_done"] == shipped["steps_done"] + 100
    assert rec["train_wall_s"] == round(shipped["train_wall_s"] + 10.0, 1)
    assert rec["build_command"].startswith(shipped["build_command"] + "; json_train --out b")


def test_a_single_run_manifest_becomes_phase_one():
    previous = {"train": {"lr": 3e-3}, "steps_done": 50, "train_wall_s": 5.0,
                "build_command": "first"}
    rec = _phases(previous, _meta(100, 10.0), "second")
    assert list(rec["train"]) == ["phase_1", "phase_2"] and rec["train"]["phase_1"] == {"lr": 3e-3}
