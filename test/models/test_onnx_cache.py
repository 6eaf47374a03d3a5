"""The bundled planner's ONNX export in the cache, `models onnx`, and `run --engine onnx` with no
model: real export, real onnxruntime, real llama.cpp tokenizer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from robot_latency.cli import main
from robot_latency.engines.providers import choose_providers, cuda_device_count
from robot_latency.lifetime import follow_parent
from robot_latency.models.bundled import bundled_model_path
from robot_latency.models.onnx_cache import OnnxCacheError, ensure_onnx_export
from robot_latency.records import read_records
from robot_latency.rosenv import ros_facts
from robot_latency.streams import Command, write_jsonl

GPU_PROVIDERS = ("TensorrtExecutionProvider", "CUDAExecutionProvider")


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("model-cache")


def test_export_is_built_once_and_rebuilt_when_incomplete(cache: Path) -> None:
    first = ensure_onnx_export(cache_dir=cache)
    assert first.built and first.source == bundled_model_path("planner").resolve()
    assert first.fp32.is_file() and first.int8.is_file()
    assert (first.directory / "planner.gguf").resolve() == first.source  # the tokenizer
    again = ensure_onnx_export(cache_dir=cache)
    assert not again.built and again.fp32 == first.fp32
    first.int8.write_bytes(b"")  # a damaged file is rebuilt, never loaded
    repaired = ensure_onnx_export(cache_dir=cache)
    assert repaired.built and repaired.int8.stat().st_size > 0
    assert not [p for p in first.directory.parent.iterdir() if p.name.startswith(".")]


def test_a_file_that_is_not_gguf_is_an_error_naming_it(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"PK\x03\x04" + b"\0" * 64)
    with pytest.raises(OnnxCacheError, match=r"bad\.gguf"):
        ensure_onnx_export(bad, cache_dir=tmp_path / "cache")
    assert main(["models", "onnx", "--model", str(bad), "--cache-dir",
                 str(tmp_path / "cache")]) == 2


def test_models_onnx_command(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "onnx", "--cache-dir", str(cache), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert Path(out["fp32"]).is_file() and out["fp32"].endswith("planner.onnx")
    assert out["built"] is False  # built by the test above, found in the cache


def test_gpu_providers_only_where_they_can_start() -> None:
    choice = choose_providers((*GPU_PROVIDERS, "CPUExecutionProvider"))
    assert choice.usable[-1] == "CPUExecutionProvider"
    if cuda_device_count()[0] == 0:
        assert set(choice.dropped) == set(GPU_PROVIDERS) and choice.usable == (
            "CPUExecutionProvider",)
        assert all("CUDA" in why for why in choice.dropped.values())


def test_run_engine_onnx_without_model_uses_the_cached_export(cache: Path,
                                                             tmp_path: Path) -> None:
    stream = write_jsonl(tmp_path / "stream.jsonl",
                         [Command(t_ns=i * 10**8, text=t, command_id=f"s:{i}")
                          for i, t in enumerate(["go to the kitchen", "stop", "wait here"])])
    out = tmp_path / "run"
    # The model cache is <ROBOT_LATENCY_CACHE_DIR>/models: a fresh one, exported on first use.
    env = {**os.environ, "ROBOT_LATENCY_CACHE_DIR": str(tmp_path / "rlcache")}
    done = subprocess.run(
        [sys.executable, "-m", "robot_latency.cli", "run", "--stream", str(stream),
         "--engine", "onnx", "--asap", "--deadline-ms", "5000", "--period-ms", "5000",
         "--out", str(out)], env=env, capture_output=True, text=True, timeout=600,
         preexec_fn=follow_parent())
    assert done.returncode == 0, done.stderr
    assert "EP Error" not in done.stdout + done.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["ros"] == ros_facts().to_dict()  # distro and rclpy version, as found here
    info = manifest["engine_info"]
    assert info["provider"] == "CPUExecutionProvider" or cuda_device_count()[0] > 0
    assert Path(info["model_path"]).is_relative_to(tmp_path / "rlcache" / "models" / "onnx")
    assert info["model_path"].endswith("planner.onnx")
    records = read_records(out / "cycles.jsonl")
    assert len(records) == 3 and any(r.plan_source == "model" for r in records)
