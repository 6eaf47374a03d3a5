"""The ``robot-latency`` command end to end: stable JSON keys, tables, errors naming the input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import gguf  # noqa: F401  (a hard requirement: a missing one fails)
import pytest

from robot_latency.cli import main
from robot_latency.records import CycleRecord, JsonlSink

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

FLOOR_KEYS = {"itl_floor_ms", "throughput_floor_tok_s", "weight_bytes_per_step", "kv_bytes_per_seq",
              "bandwidth_gbps", "fits_in_memory", "memory_needed_bytes"}


def _run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> object:
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def test_floor_json_preset_keys_and_values(capsys: pytest.CaptureFixture[str]) -> None:
    out = _run_json(capsys, "floor", "--device", "orin-agx-64gb", "--model", "llama-3-8b",
                    "--quant", "Q4_K_M", "--context", "1024", "--json")
    assert isinstance(out, dict) and FLOOR_KEYS <= set(out)
    assert out["bandwidth_gbps"] == 204.8
    # 8B at 4.9 bits ~ 4.6 GB read per step over 204.8 GB/s ~ 22-24 ms
    assert 20 < out["itl_floor_ms"] < 26
    assert out["kv_bytes_per_seq"] == 131072 * 1024
    assert out["itl_floor_ms"] == pytest.approx(1e3 / out["throughput_floor_tok_s"])
    assert out["fits_in_memory"] is True
    assert "prefill_floor_ms" in out and out["prefill_floor_ms"] is None


def test_floor_json_manual_form_hand_worked(capsys: pytest.CaptureFixture[str]) -> None:
    # 1e9 params * 4 bits = 5e8 bytes; + 1000 tokens * 1e4 B = 1e7 -> 5.1e8 B / 68e9 B/s
    out = _run_json(capsys, "floor", "--device", "orin-nano-8gb", "--params", "1e9",
                    "--weight-bits", "4", "--kv-bytes-per-token", "10000", "--context", "1000",
                    "--prompt-tokens", "100", "--compute-efficiency", "0.5", "--json")
    assert out["weight_bytes_per_step"] == 500_000_000
    assert out["kv_bytes_per_seq"] == 10_000_000
    assert out["itl_floor_ms"] == pytest.approx(5.1e8 / 68e9 * 1e3)
    # 2 * 1e9 * 100 / (0.5 * 10.2e12) s
    assert out["prefill_floor_ms"] == pytest.approx(2e11 / 5.1e12 * 1e3)


def test_floor_json_on_a_gguf_file(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                   tiny_llama_gguf: Callable[..., Path]) -> None:
    # 2 layers (untied, F32): 64 wide, 4 heads / 2 KV heads, FFN 128, vocabulary 100
    path = tiny_llama_gguf(tmp_path / "tiny.gguf")
    out = _run_json(capsys, "floor", "--device", "h100-sxm", "--model", str(path), "--json")
    # every F32 tensor except the 100x64 embedding is read per step
    total = 4 * (100 * 64 * 2 + 64 + 2 * (64 * 64 * 2 + 32 * 64 * 2 + 128 * 64 * 3 + 64 * 2))
    assert out["weight_bytes_total"] == total
    assert out["weight_bytes_per_step"] == total - 4 * 100 * 64


def test_floor_table_over_orin_and_ladder(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["floor", "--model", "qwen2.5-0.5b", "--context", "512"]) == 0
    text = capsys.readouterr().out
    for dev in ("orin-agx-64gb", "orin-nx-16gb", "orin-nano-8gb", "orin-nano-4gb-super"):
        assert dev in text
    for q in ("F16", "Q8_0", "Q4_K_M", "Q2_K"):
        assert q in text
    assert "h100-sxm" not in text


def test_floor_several_devices_json_is_a_list(capsys: pytest.CaptureFixture[str]) -> None:
    out = _run_json(capsys, "floor", "--device", "orin-nano-8gb,orin-nano-8gb-super",
                    "--model", "qwen2.5-0.5b", "--quant", "Q8_0", "--json")
    assert isinstance(out, list) and len(out) == 2
    # same bytes, 102/68 the bandwidth: 1.5x faster floor
    assert out[0]["itl_floor_ms"] / out[1]["itl_floor_ms"] == pytest.approx(102 / 68)


def test_specdec_json(capsys: pytest.CaptureFixture[str]) -> None:
    out = _run_json(capsys, "specdec", "--alpha", "0.6", "-k", "3", "-c", "0.2", "--json")
    assert out["expected_tokens_per_round"] == pytest.approx(2.176)
    assert out["cost_per_round"] == pytest.approx(1.6)
    assert out["speedup"] == pytest.approx(1.36)
    assert out["best_k"] == 2 and out["best_speedup"] == pytest.approx(1.4)


def test_devices_json_lists_every_orin(capsys: pytest.CaptureFixture[str]) -> None:
    out = _run_json(capsys, "devices", "--json")
    ids = {d["id"] for d in out}
    assert {"orin-agx-64gb", "orin-agx-32gb", "orin-nx-16gb", "orin-nx-8gb", "orin-nano-8gb",
            "orin-nano-8gb-super", "orin-nano-4gb", "h100-sxm"} <= ids


def test_detect_on_fixture_tree(capsys: pytest.CaptureFixture[str]) -> None:
    out = _run_json(capsys, "detect", "--root", str(FIXTURES / "jetson" / "agx-orin-64gb-15w"),
                    "--json")
    assert out["device_id"] == "orin-agx-64gb-15w"
    assert _run_json(capsys, "detect", "--root", str(FIXTURES / "jetson" / "not-jetson"),
                     "--json") is None


def test_model_json_preset(capsys: pytest.CaptureFixture[str]) -> None:
    out = _run_json(capsys, "model", "qwen2.5-0.5b", "--quant", "F16", "--json")
    assert out["n_layers"] == 24 and out["n_kv_heads"] == 2 and out["head_dim"] == 64
    assert out["kv_bytes_per_token"] == 2 * 24 * 2 * 64 * 2


@pytest.mark.parametrize(("argv", "needle"), [
    (["floor", "--device", "orin-xyz", "--model", "qwen2.5-0.5b", "--json"], "orin-xyz"),
    (["floor", "--device", "orin-agx-64gb", "--model", "no-such-model", "--json"],
     "no-such-model"),
    (["floor", "--device", "orin-agx-64gb", "--model", "qwen2.5-0.5b", "--quant", "Q9_X",
      "--json"], "Q9_X"),
    (["floor", "--device", "orin-agx-64gb", "--params", "1e9", "--json"], "--weight-bits"),
    (["specdec", "--alpha", "1.5", "-k", "3", "-c", "0.1"], "alpha"),
])
def test_errors_name_the_bad_input(argv: list[str], needle: str,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


def test_corrupt_gguf_error_names_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"PK\x03\x04 this is a zip, not a model" * 4)
    assert main(["model", str(bad)]) == 2
    assert str(bad) in capsys.readouterr().err


def test_summarize_writes_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "cycles.jsonl"
    with JsonlSink(log) as sink:
        for i in range(3):
            s = i * 10**9
            sink.write(CycleRecord(run_id="r", cycle=i, scheduled_ns=s, deadline_ns=s + 10**7,
                                   started_ns=s, published_ns=s + (2 * 10**7 if i == 2 else 10**6),
                                   token_ns=[s + 5 * 10**5, s + 9 * 10**5], plan_source="model"))
    assert main(["summarize", str(log), "--out", str(tmp_path / "summary.json")]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["cycles"] == 3 and summary["deadline_misses"] == 1
    assert summary["itl_ms"]["n"] == 3


def test_console_script_is_installed() -> None:
    """The installed entry point runs (the same tree installs with pip and colcon)."""
    exe = Path(sys.executable).parent / "robot-latency"
    # `make test` installs the package into the venv: a missing script is an install defect.
    assert exe.is_file(), f"{exe}: the console script is not installed"
    proc = subprocess.run([str(exe), "specdec", "--alpha", "0.8", "-k", "4", "-c", "0.1",
                           "--json"], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONWARNINGS": "error"})
    assert json.loads(proc.stdout)["speedup"] == pytest.approx(3.3616 / 1.4)


def test_the_demo_sends_every_way_the_replayer_can() -> None:
    from robot_latency.cli import build_parser
    from robot_latency.ros.replayer_params import SEND_VIA

    demo = build_parser()._subparsers._group_actions[0].choices["demo"]
    send_via = next(a for a in demo._actions if a.dest == "send_via")
    assert tuple(send_via.choices) == SEND_VIA
