"""Every bench script runs, at its smallest settings, so none can rot unnoticed.

Each is run as its documented command (a subprocess, the real engine, real ROS where it uses
ROS) on the shipped tiny planner or the smallest synthesized shapes, and its JSON checked for
the figures it promises. Nothing here judges a figure: timings belong to the headline runs.
``benchio.py`` and ``decode_shapes.py`` are the scripts' shared modules, run through them;
``naive_node.py`` runs inside ``client_edge.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from robot_latency.lifetime import follow_parent
from robot_latency.models.bundled import bundled_model_path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
#: A hang guard, not a timing: each smoke run takes seconds.
HANG_S = 600


def _run(tmp_path: Path, script: str, *args: str, ok: bool = True) -> Any:
    out = tmp_path / "out.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), str(BENCH), os.environ.get("PYTHONPATH", "")]),
        "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST", "ROS_LOCALHOST_ONLY": "1"}
    proc = subprocess.run([sys.executable, str(BENCH / script), *args,
                           *(["--out", str(out)] if ok else [])], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=HANG_S, check=False,
                          preexec_fn=follow_parent())
    if not ok:
        return proc
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["command"].startswith("python ") and script in doc["command"]
    return doc


def test_every_bench_script_has_a_smoke_run() -> None:
    covered = {"benchio.py", "decode_shapes.py", "naive_node.py", "client_edge.py", "cpu_build.py",
               "engine.py", "onnx_engine.py", "overshoot.py", "predict_gpu.py",
               "predict_host.py", "profiles.py", "rule_planner.py", "soak.py",
               "offboard.py",  # offboard.py: test/test_bench_offboard.py
               "offboard_kill.py",  # offboard.py kill: test_bench_offboard.py test_kill_smoke
               "predict_validate.py",  # test/test_bench_predict_validate.py
               "target_sim.py",  # target_sim.py: test/test_bench_target_sim.py
               "predict_stream_time.py",  # test/test_bench_target_sim.py
               "correctness.py",  # correctness.py: test/test_bench_correctness.py
               "predict_labels.py", "format_price.py",
               "envelope.py", "vision_cost.py", "vision_predict.py", "node_soak.py",
               "cold_start.py", "untimed_batch.py", "vision_loop.py",
               "vision_overhead.py", "vision_onnx.py", "gguf_read.py"}
    assert {p.name for p in BENCH.glob("*.py")} <= covered


def test_client_edge_planner_and_naive_nodes(tmp_path: Path) -> None:
    doc = _run(tmp_path, "client_edge.py", "--model", "bundled", "--max-commands", "2",
               "--repeats", "1", "--nodes", "planner,planner-action,naive", "--speed", "4",
               "--tail-s", "2")
    level = doc["levels"]["bundled"]
    assert level["planner-action"]["runs"][0]["via"] == "action"
    assert level["planner"]["runs"][0]["via"] == "topic"
    for node in ("planner", "planner-action", "naive"):
        (run,) = level[node]["runs"]
        assert run["commands"] == 2 and run["answered"] + run["unanswered"] + \
            run["superseded"] == 2
        assert 0 <= run["model_in_time"] <= 2
        assert level[node]["median"]["receiver_miss_rate"]["n"] == 1
    planner = level["planner"]["runs"][0]
    assert planner["planner_miss_rate"] is not None
    assert planner["transport_margin"]["transport_margin"] == "measured"
    assert doc["busy_cores"] == []


def test_client_edge_busy_keeps_a_core_busy_for_the_bench(tmp_path: Path) -> None:
    core = max(os.sched_getaffinity(0))  # this process's own core: never one it may not use
    doc = _run(tmp_path, "client_edge.py", "--model", "bundled", "--max-commands", "2",
               "--repeats", "1", "--nodes", "planner", "--speed", "4", "--tail-s", "2",
               "--busy", str(core))
    assert doc["busy_cores"] == [core]
    (run,) = doc["levels"]["bundled"]["planner"]["runs"]
    assert run["commands"] == 2 and run["planner_miss_rate"] is not None
    bad = _run(tmp_path, "client_edge.py", "--busy", "4096", ok=False)
    assert bad.returncode == 2 and "--busy" in bad.stderr


@pytest.mark.parametrize("what", ["overhead", "abort", "prefix", "specdec"])
def test_engine(tmp_path: Path, what: str) -> None:
    small = {"overhead": ["--tokens", "4", "--runs", "1"],
             "abort": ["--prompt-words", "20", "--trials", "1"],
             "prefix": ["--runs", "1"],
             "specdec": ["--draft", str(bundled_model_path("planner-draft")), "--commands", "1"]}
    doc = _run(tmp_path, "engine.py", what, "--model", str(bundled_model_path("planner")),
               *small[what])
    assert len(doc) > 1


def test_cpu_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROBOT_LATENCY_CACHE_DIR", str(tmp_path / "cache"))
    doc = _run(tmp_path, "cpu_build.py", "--model", "planner", "--quants", "Q8_0",
               "--repeats", "1", "--gens", "1", "--threads", "1")
    on, off = doc["cells"]["Q8_0/venv/on"], doc["cells"]["Q8_0/venv/off"]
    assert on["use_extra_bufts"] is True and off["use_extra_bufts"] is False
    assert on["n_repeats"] == off["n_repeats"] == 1 and on["itl_n"] > 0
    assert "CPU :" in on["system_info"] and "Q8_0/venv off/on" in doc["ratios"]


def test_onnx_engine(tmp_path: Path) -> None:
    import onnxruntime  # noqa: F401  (a hard requirement: base.txt; missing, this fails)
    doc = _run(tmp_path, "onnx_engine.py", "--random-dim", "64", "--random-layers", "1",
               "--runs", "1", "--tokens", "2", "--work-dir", str(tmp_path / "w"))
    assert "variants" in doc


def test_overshoot(tmp_path: Path) -> None:
    doc = _run(tmp_path, "overshoot.py", "--cycles", "20", "--period-ms", "20",
               "--deadline-ms", "10")
    assert doc["cycles"] == 20 and doc["fallbacks"] + doc["skipped"] == 20
    # the CLI's default: the publish margin learned from the loop's own lateness
    assert doc["publish_margin"]["publish_margin"] == "learned"
    assert doc["publish_margin"]["wake_samples"] > 0 and doc["margin_ms"]["n"] > 0


def test_predict_gpu_refuses_a_build_without_gpu_offload(tmp_path: Path) -> None:
    """The measuring half runs with the installed llama_cpp, a CPU build here: it must say so
    in one line, not measure the CPU and call it a GPU."""
    proc = _run(tmp_path, "predict_gpu.py", "--child", "--shapes", "smollm2-135m",
                "--quants", "Q4_0", "--tokens", "2", "--repeats", "1",
                "--bandwidth-gbps", "100", "--models-dir", str(tmp_path / "synth"), ok=False)
    assert proc.returncode != 0
    assert "no GPU offload" in proc.stderr


def test_predict_host(tmp_path: Path) -> None:
    doc = _run(tmp_path, "predict_host.py", "--shapes", "smollm2-135m,smollm2-360m",
               "--fit-on", "smollm2-135m,smollm2-360m", "--quant", "Q4_0", "--tokens", "2",
               "--repeats", "1", "--models-dir", str(tmp_path / "synth"))
    assert len(doc["shapes"]) == 2


@pytest.mark.parametrize("what", ["prefix", "threads"])
def test_profiles(tmp_path: Path, what: str) -> None:
    small = {"prefix": ["--commands", "2"], "threads": ["--max-commands", "2", "--speed", "8"]}
    doc = _run(tmp_path, "profiles.py", what, "--model", "bundled", *small[what])
    assert doc["model"].endswith("planner.gguf")


def test_untimed_batch(tmp_path: Path) -> None:
    doc = _run(tmp_path, "untimed_batch.py", "--model", str(bundled_model_path("planner-json")),
               "--commands", "3", "--sequences", "2", "1")
    assert [r["sequences"] for r in doc["runs"]] == [2, 1]
    assert all(r["same_facts_as_first"] for r in doc["runs"]) and len(doc["facts"]) == 3


def test_gguf_read(tmp_path: Path) -> None:
    doc = _run(tmp_path, "gguf_read.py", "--file", str(bundled_model_path("planner")),
               "--repeats", "2")
    assert doc["n"] == 2 and doc["all_same"] is True
    assert [r["order"] for r in doc["runs"]] == [["gguf", "project"], ["project", "gguf"]]


def test_rule_planner(tmp_path: Path) -> None:
    doc = _run(tmp_path, "rule_planner.py", "--commands", "10", "--repeats", "1")
    assert len(doc) > 1


@pytest.mark.parametrize("what", ["soak", "flood", "recovery"])
def test_soak(tmp_path: Path, what: str) -> None:
    small = {"soak": ["--cycles", "20", "--warmup", "5", "--batch", "10"],
             "flood": ["--cycles", "10", "--flood-x", "5"],
             "recovery": ["--cycles", "20", "--kill-at", "5"]}
    doc = _run(tmp_path, "soak.py", what, *small[what], "--log-dir", str(tmp_path / "log"))
    assert len(doc) > 1


def test_node_soak(tmp_path: Path) -> None:
    """planner_node as its own process, a client here: goals and tagged commands, half each."""
    doc = _run(tmp_path, "node_soak.py", "--smoke")
    ways = doc["edge"]["by_way"]
    assert doc["commands_sent"] == doc["client"]["commands"] == 20
    assert ways["action"]["commands"] == ways["topic"]["commands"] == 10
    assert doc["client"]["unanswered"] == 0 and doc["goals"]["pending_at_end"] == 0
    assert doc["node_stop"]["exit_code"] == 0 and doc["node_stop"]["left_running"] == []
    for key in ("start", "end"):
        assert doc["process"][key]["rss_mb"] > 0 and doc["process"][key]["node_fds"] > 0
    assert len(doc["process"]["samples"]) >= 2


def test_predict_labels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROBOT_LATENCY_CACHE_DIR", str(tmp_path / "cache"))
    doc = _run(tmp_path, "predict_labels.py", "--smoke")
    check = doc["check"]
    assert check["prompt_tokens_equal"] and check["tokens_out_equal_where_written"]
    assert check["labels"]["commands"] == check["untimed_pass"]["commands"] == 6
    assert {r["format"] for r in doc["price"]} == {"json", "actions"}
    assert all(r["tokens_per_plan"] is not None for r in doc["price"])


def test_format_price(tmp_path: Path) -> None:
    doc = _run(tmp_path, "format_price.py", "--smoke")
    assert [r["format"] for r in doc["runs"]] == ["json", "compact"]
    for r in doc["runs"]:
        assert r["cycles"] == 3 and r["target"]["min_deadline_ms"] is not None
    # the JSON plan takes several times the compact plan's tokens, on the target as here
    ratio = doc["summary"]["json_over_compact"]["tokens_per_plan_p50"]
    assert ratio is not None and ratio >= 3


def test_envelope(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROBOT_LATENCY_CACHE_DIR", str(tmp_path / "cache"))
    doc = _run(tmp_path, "envelope.py", "--repeats", "1", "--commands", "6",
               "--sweep-points", "3")
    env = doc["envelope"]
    assert env["cells"] == 24 and len(env["runs_s"]) == 1 and doc["target_s"] == 5.0
    assert set(env["modes"]) == {"orin-nano-8gb", "orin-agx-64gb"}
    assert all(len(modes) == 4 for modes in env["modes"].values())
    sweep = doc["capacity_vs_sweep"]
    assert len(sweep["sweep"]) == 3 and sweep["search"]["miss_target"] == 0.05


def test_vision_cost(tmp_path: Path) -> None:
    doc = _run(tmp_path, "vision_cost.py", "--smoke", "--mmproj-dir", str(tmp_path / "mm"))
    assert doc["lm"]["source"] == "bundled" and doc["lm"]["n_embd"] > 0
    towers = doc["towers"]
    assert set(towers) == {"tiny-mlp", "tiny-shuffle"}
    assert (towers["tiny-mlp"]["image_tokens"], towers["tiny-mlp"]["image_chunks"]) == (16, 1)
    # idefics3: the global view and one tile, 16 tokens each
    assert (towers["tiny-shuffle"]["image_tokens"], towers["tiny-shuffle"]["image_chunks"]) \
        == (32, 2)
    for tower in towers.values():
        assert Path(tower["mmproj"]).is_file()
        assert tower["median"]["n"] == 1 == len(tower["frames"])
        assert tower["median"]["encode_ms"] > 0 and tower["median"]["image_prefill_ms"] > 0


def test_vision_onnx(tmp_path: Path) -> None:
    doc = _run(tmp_path, "vision_onnx.py", "--smoke")
    towers = doc["towers"]
    assert set(towers) == {"tiny-mlp", "tiny-shuffle"}
    assert towers["tiny-mlp"]["image_tokens"] == {"llama": 16, "onnx": 16}
    assert towers["tiny-shuffle"]["image_tokens"] == {"llama": 32, "onnx": 32}  # view + tile
    for tower in towers.values():
        assert tower["llama"]["median"]["encode_ms"] > 0
        assert tower["onnx"]["median"]["encode_ms"] > 0 and tower["onnx"]["median"]["n"] == 1


def test_vision_loop(tmp_path: Path) -> None:
    doc = _run(tmp_path, "vision_loop.py", "--smoke")
    s = doc["summary"]
    assert {p: s[p]["cycles"] for p in s} == {"text": 5, "every": 5, "reuse": 5, "fit": 5}
    # each new frame is encoded; one reused frame only once; none without a frame
    assert (s["text"]["frames_encoded"], s["every"]["frames_encoded"],
            s["reuse"]["frames_encoded"]) == (0, 5, 1)
    # a 256x256 frame: the global view and 4 tiles of 16 tokens
    assert s["every"]["image_tokens"] == s["reuse"]["image_tokens"] == 80
    reused = [c for c in doc["cycles"]["reuse"] if c["reused"]]
    assert len(reused) == 4 and all(c["image_prefill_ms"] is None for c in reused)
    assert all(c["image_encode_ms"] > 0 for c in doc["cycles"]["every"])
    # fit on a budget nothing fits: each scale tried once (learned), then text-only
    assert [c["scale"] for c in doc["cycles"]["fit"]] == [1.0, 0.75, 0.5, 0.25, None]
    # 192 px is still 2 x 2 tiles of 128 (each side rounded), 128 and 64 px one tile
    assert [c["image_tokens"] for c in doc["cycles"]["fit"]] == [80, 80, 32, 32, 0]
    assert s["fit"]["text_only"] == 1


def test_vision_overhead(tmp_path: Path) -> None:
    doc = _run(tmp_path, "vision_overhead.py", "--smoke")
    assert len(doc["frames"]) == 2 and doc["tower"] == "tiny-mlp"
    for f in doc["frames"]:
        # llama.cpp's own encode and prefill times were read from its log, in whole ms
        assert f["chunks"] == 1 and f["ours_ms"] > 0 and f["llama_cpp_ms"] >= 0
        assert f["llama_cpp_ms"] == int(f["llama_cpp_ms"])
    total = doc["total"]
    assert total["ours_ms"] == pytest.approx(sum(f["ours_ms"] for f in doc["frames"]))


def test_vision_predict(tmp_path: Path) -> None:
    doc = _run(tmp_path, "vision_predict.py", "--smoke")
    for check in doc["host_check"].values():
        assert check["image_tokens_predicted"] == check["image_tokens_measured"]
        assert check["encode_ratio"] > 0 and check["image_prefill_ratio"] > 0
    (device, towers), = doc["targets"].items()
    assert device == "orin-nano-8gb" and set(towers) == {"clip-l14-336", "siglip-b16-512"}
    for p in towers.values():
        assert p["encode_ms"] > 0 and p["image_prefill_ms"] > 0
        assert p["vision_status"].startswith("vision uncalibrated")


def test_cold_start(tmp_path: Path) -> None:
    doc = _run(tmp_path, "cold_start.py", "--smoke")
    assert doc["repeats"] == 1 and set(doc["by_node"]) == {"planner_node",
                                                            "managed_planner_node"}
    for trial in doc["trials"]:
        assert trial["exit_status"] == 0
        first = trial["first_goal"]
        assert first["accepted"] and not first["timed_out"] and first["latency_ms"] > 0
        assert trial["later_goals"]["n"] == 1
        assert trial["process_start_to_ready_ms"] > 0
        # the node's own record: its first plan in time is the first goal's (when on time)
        node = trial["node"]
        assert node["events_ns"]["ready"] <= node["events_ns"]["first_plan"]
        if first["node_deadline_met"] and first["source"] == "model":
            assert node["first_plan_in_time"]["cycle"] == 0
