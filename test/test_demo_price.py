"""The main job's two output formats through the real pipeline: the JSON planner (Qwen2's
tokenizer, chat prompt, JSON under the schema's grammar) beside the compact action language,
each through planner_node and bag_replayer over Fast DDS, and the report's output format's
price from their untimed passes."""

from __future__ import annotations

import json
from pathlib import Path

import rclpy  # noqa: F401  (a hard requirement: the demo runs the ROS 2 nodes)

from robot_latency.demo_job import (
    DemoConfig,
    DemoLevel,
    MainJob,
    run_demo,
    stream_labels_of,
    untimed_passes,
)
from robot_latency.models.bundled import bundled_model_path
from robot_latency.profiles.vocab import VocabTokenizer
from robot_latency.records import read_records
from robot_latency.streams import Command, write_bag

TEXTS = ["pick up the red cup", "go to the kitchen", "bring me the blue bottle"]


def test_json_and_compact_priced_in_one_report(tmp_path: Path) -> None:
    bag = write_bag(tmp_path / "stream", [Command(t_ns=i * 2_000_000_000, text=TEXTS[i],
                                                  command_id=f"s:{i}") for i in range(3)])
    levels = [DemoLevel("json-F16", "F16", bundled_model_path("planner-json"), "bundled-json",
                        0, 16.0),
              DemoLevel("compact-F32", "F32", bundled_model_path("planner"), "", 0, 32.0)]
    job = MainJob(out_dir=tmp_path / "demo", deadline_ms=5000.0, period_ms=5000.0,
                  device="orin-nano-8gb")
    lines: list[str] = []
    targets = untimed_passes(job, levels, bag, lines.append)
    assert [line.split(":")[0] for line in lines] == ["untimed pass json-F16",
                                                      "untimed pass compact-F32"]
    configs = [DemoConfig(label=lv.label, params={
        "engine": "llamacpp", "model": str(lv.path), "target_device": job.device,
        "mode": "event", "deadline_ms": job.deadline_ms, "period_ms": job.period_ms,
        **({"planner_profile": lv.profile} if lv.profile else {})}) for lv in levels]
    runs, report = run_demo(configs, stream=bag, out_dir=job.out_dir, targets=targets,
                            labels=stream_labels_of(bag))
    for run in runs:
        assert len(read_records(run / "cycles.jsonl")) == 3
    # The JSON planner's outputs are JSON plans, counted in Qwen2 tokens: the untimed pass's
    # count of each complete plan is the vendored tokenizer's count of its text.
    untimed = targets["json-F16"].untimed
    with VocabTokenizer.for_family("qwen2") as tok:
        for c in untimed.commands:
            if c.plan_valid:
                json.loads(c.text)
                assert c.tokens_out == len(tok.tokenize(c.text, special=False))
    text = report.read_text()
    assert "## The output format's price" in text
    section = text.split("## The output format's price", 1)[1].split("\n## ", 1)[0]
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in section.splitlines() if line.startswith("| json") or
            line.startswith("| compact")}
    assert set(rows) == {"json-F16", "compact-F32"}
    assert rows["json-F16"][0] == "bundled-json" and rows["compact-F32"][0] == "bundled-actions"
    json_p50 = int(rows["json-F16"][1].split("/")[0])
    compact_p50 = int(rows["compact-F32"][1].split("/")[0])
    # JSON costs tokens: a plan in the schema's JSON is several times its compact form.
    assert json_p50 >= 3 * compact_p50 > 0
    # The target's smallest deadline held is stated for each format.
    assert all(r[-1] != "-" for r in rows.values())
