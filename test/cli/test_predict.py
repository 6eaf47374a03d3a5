"""``predict`` and ``calibrate`` end to end: JSON keys, calibration from real run directories
(simulated engine on a scripted clock), and bad input ending in one line and exit status 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from robot_latency.cli import main
from robot_latency.clock import ScriptedClock
from robot_latency.floor.calibration import read_calibration
from robot_latency.planner.config import RunSettings
from robot_latency.planner.lifecycle import PlannerRun
from robot_latency.planner.replay import replay
from robot_latency.planner.resolve import resolve_run
from robot_latency.records import read_records
from robot_latency.streams import Command, read_stream, write_jsonl

MS = 1_000_000
PREDICT_KEYS = {"itl_pred_ms", "itl_pred_interval_ms", "ttft_pred_ms", "itl_floor_ms",
                "efficiency", "overhead_ms", "calibration"}
TEXTS = ["pick up the red cup and put it on the tray", "go to the kitchen slowly",
         "bring the blue box to the table"]
# the simulated engine's own two terms, which calibrate must find again
SIM_EFFICIENCY, SIM_OVERHEAD_MS = 0.5, 2.0


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def _fails(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(list(argv)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    return err


def test_predict_json_keys(capsys: pytest.CaptureFixture[str]) -> None:
    out = _json(capsys, "predict", "--device", "orin-nano-8gb-super", "--model", "llama-3.2-3b",
                "--quant", "Q4_0", "--engine-family", "mlc", "--prompt-tokens", "64", "--json")
    assert PREDICT_KEYS <= set(out)
    assert out["itl_floor_ms"] < out["itl_pred_ms"]
    assert len(out["itl_pred_interval_ms"]) == 2 and out["ttft_pred_ms"] > 0
    assert out["calibration"]["source"] == "published table"
    assert out["calibration"]["basis"]  # the rows it was fitted on


def test_predict_validate_json(capsys: pytest.CaptureFixture[str]) -> None:
    out = _json(capsys, "predict", "--validate", "--json")
    assert out["predicted"] >= 35 and out["sources"] >= 6
    assert out["median_abs_error"] <= 0.12
    rows = {r["id"]: r for r in out["rows"]}
    for row_id in out["past_35_percent"]:  # each explained in its row's notes
        assert "Past 35% in validation" in rows[row_id]["notes"]
    for family, f in out["by_family"].items():
        assert f["inside_80"] == sum(1 for r in out["rows"]
                                     if r["engine_family"] == family and r["inside_interval"])
        if f["predicted"] >= 8:
            assert f["coverage_80"] >= 0.75 and f["new_model_coverage_80"] >= 0.75
    assert out["by_family"]["llamacpp-cuda"]["median_abs_error"] <= 0.15


def test_predict_small_model_names_the_rows_it_leans_on(
        capsys: pytest.CaptureFixture[str]) -> None:
    out = _json(capsys, "predict", "--device", "orin-nano-8gb", "--model", "qwen2.5-0.5b",
                "--quant", "Q4_K_M", "--engine-family", "llamacpp-cuda", "--json")
    assert out["interval_coverage"] == 0.8
    lo, hi = out["itl_pred_interval_ms"]
    assert out["itl_floor_ms"] <= lo < out["itl_pred_ms"] < hi
    near = out["nearest_rows"]
    assert near and all(r["device"] == "orin-nano-8gb" for r in near)
    assert near[0]["model"] == "qwen2.5-0.5b" and near[0]["published_itl_ms"] > 0
    assert any("GGUF size" in n for n in out["model_notes"])
    # the source measured this model in three other power modes: they move the prediction
    adj = out["model_adjustment"]
    assert adj["seen"] and len(adj["basis"]) == 3 and adj["factor"] != 1.0
    assert any(n.startswith("model: x") for n in out["model_notes"])
    assert main(["predict", "--device", "orin-nano-8gb", "--model", "qwen2.5-0.5b",
                 "--quant", "Q4_K_M"]) == 0
    text = capsys.readouterr().out
    assert "80% interval" in text and near[0]["id"] in text and near[0]["url"] in text
    assert "models measured in other setups" in text


def test_predict_a_model_never_measured_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    out = _json(capsys, "predict", "--device", "orin-nano-8gb", "--model", "qwen3-1.7b",
                "--engine-family", "llamacpp-cuda", "--json")
    assert not out["model_adjustment"]["seen"] and out["model_adjustment"]["factor"] == 1.0
    assert main(["predict", "--device", "orin-nano-8gb", "--model", "qwen3-1.7b"]) == 0
    assert "leave-one-model-out" in capsys.readouterr().out


def test_predict_refuses_a_hybrid_model_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    err = _fails(capsys, "predict", "--model", "lfm2.5-350m")
    assert "hybrid state-space" in err


def test_predict_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = _fails(capsys, "predict", "--engine-family", "warp")
    assert "warp" in err and "llamacpp-cuda" in err and "mlc" in err
    bad = tmp_path / "cal.json"
    bad.write_text(json.dumps({"format": "robot_latency.calibration/1", "decode": [1, 2]}))
    assert "decode" in _fails(capsys, "predict", "--engine-family", "mlc", "--calibration",
                              str(bad))
    assert "vllm" in _fails(capsys, "predict", "--engine-family", "vllm")


def _sim_run(tmp_path: Path, name: str, model: str) -> Path:
    """A real run directory: the simulated engine with fixed terms, no jitter, scripted clock."""
    cmds = [Command(t_ns=i * 300 * MS, text=TEXTS[i % len(TEXTS)], command_id=f"s:{i}")
            for i in range(6)]
    stream = read_stream(write_jsonl(tmp_path / f"{name}.jsonl", cmds))
    out = tmp_path / name
    cfg, _ = resolve_run(RunSettings(
        period_ms=300, deadline_ms=250, max_tokens=24, log_dir=out, engine="sim",
        runner="inline", engine_options={"device": "orin-agx-64gb",
                                         "efficiency": SIM_EFFICIENCY,
                                         "overhead_ms": SIM_OVERHEAD_MS, "jitter_sigma": 0.0},
        model=model, quant="Q4_K_M", target_device="orin-nano-8gb", label=name))
    with PlannerRun(cfg, publish=lambda plan: None, clock=ScriptedClock(start_ns=10**9)) as run:
        replay(run.loop, stream)
        run.close()
    assert any(r.itl_ns for r in read_records(out / "cycles.jsonl"))
    return out


def test_calibrate_finds_the_simulated_terms_again(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    small = _sim_run(tmp_path, "small", "smollm2-135m")
    large = _sim_run(tmp_path, "large", "llama-3.2-1b")
    cal_path = tmp_path / "cal.json"
    out = _json(capsys, "calibrate", str(small), str(large), "--engine-family", "llamacpp-cuda",
                "--out", str(cal_path), "--json")
    cal = out["calibration"]
    # the runs' gaps grow with the KV cache, placed at the median context: close, not exact
    assert cal["decode"]["efficiency"] == pytest.approx(SIM_EFFICIENCY, rel=0.03)
    assert cal["decode"]["overhead_ms"] == pytest.approx(SIM_OVERHEAD_MS, abs=0.1)
    assert cal["device_id"] == "orin-agx-64gb"
    back = read_calibration(cal_path, device_id="orin-agx-64gb")
    # the file is accepted by predict and the sim engine (through run) on that device
    pred = _json(capsys, "predict", "--device", "orin-agx-64gb", "--model", "qwen2.5-0.5b",
                 "--engine-family", "llamacpp-cuda", "--calibration", str(cal_path), "--json")
    assert pred["efficiency"] == pytest.approx(back.efficiency)
    assert pred["calibration"]["source"].startswith("runs")
    # ...and refused for another device
    err = _fails(capsys, "predict", "--device", "orin-nano-8gb", "--engine-family",
                 "llamacpp-cuda", "--calibration", str(cal_path))
    assert "orin-agx-64gb" in err and "orin-nano-8gb" in err


def test_calibrate_single_size_refused_or_held(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    only = _sim_run(tmp_path, "only", "qwen2.5-0.5b")
    err = _fails(capsys, "calibrate", str(only), "--engine-family", "llamacpp-cuda")
    assert "model size" in err and "--fixed-overhead-ms" in err
    out = _json(capsys, "calibrate", str(only), "--engine-family", "llamacpp-cuda",
                "--fixed-overhead-ms", str(SIM_OVERHEAD_MS), "--json")
    assert out["calibration"]["decode"]["overhead_fixed"] is True
    assert out["calibration"]["notes"]
    assert out["calibration"]["decode"]["efficiency"] == pytest.approx(SIM_EFFICIENCY, rel=0.03)


def test_calibrate_needs_a_family(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    only = _sim_run(tmp_path, "only", "qwen2.5-0.5b")
    assert "engine family" in _fails(capsys, "calibrate", str(only))
    assert "manifest.json" in _fails(capsys, "calibrate", str(tmp_path / "absent"))


def test_records_carry_the_target_prediction(tmp_path: Path) -> None:
    run = _sim_run(tmp_path, "r", "qwen2.5-0.5b")
    recs = [r for r in read_records(run / "cycles.jsonl") if r.floor and r.tokens_in]
    assert recs
    for r in recs:
        target = r.floor["target"]
        assert target["engine_family"] == "llamacpp-cuda"  # the default family
        assert target["itl_pred_ms"] > target["itl_floor_ms"] > 0
        assert target["ttft_pred_ms"] > 0 and target["calibration"]
        assert r.floor["host"]["itl_floor_ms"] > 0
    manifest = json.loads((run / "manifest.json").read_text())
    assert set(PREDICT_KEYS) <= set(manifest["floor"]["target_prediction"])


def test_floor_json_with_an_engine_family_adds_the_prediction(
        capsys: pytest.CaptureFixture[str]) -> None:
    out = _json(capsys, "floor", "--device", "orin-nano-8gb-super", "--model", "llama-3.2-3b",
                "--quant", "Q4_0", "--engine-family", "mlc", "--json")
    pred = out["target_prediction"]
    assert PREDICT_KEYS <= set(pred)
    assert pred["itl_floor_ms"] == pytest.approx(out["itl_floor_ms"])
    assert pred["itl_pred_ms"] > out["itl_floor_ms"]
    manual = _json(capsys, "floor", "--device", "orin-nano-8gb-super", "--params", "1e9",
                   "--weight-bits", "4", "--kv-bytes-per-token", "1000", "--engine-family", "mlc",
                   "--json")
    assert manual["target_prediction"]["itl_pred_ms"] > manual["itl_floor_ms"]


def test_comparison_and_plot_show_host_measured_target_predicted_and_floors(
        tmp_path: Path) -> None:
    from robot_latency.report.compare import compare_runs, to_markdown
    from robot_latency.report.plots import plot_measured_vs_predicted
    from robot_latency.report.rundir import load_runs

    runs = [_sim_run(tmp_path, "a", "smollm2-135m"), _sim_run(tmp_path, "b", "qwen2.5-0.5b")]
    rows = compare_runs(runs)
    for row in rows:
        assert row.pred_engine_family == "llamacpp-cuda"
        assert row.pred_itl_target_ms > row.floor_itl_target_ms > 0
        assert row.itl_p50_ms > row.floor_itl_host_ms > 0
    table = to_markdown(rows)
    assert "pred. ITL target ms" in table and "(llamacpp-cuda)" in table
    assert plot_measured_vs_predicted(load_runs(runs), tmp_path / "mvp.png").stat().st_size > 0


def test_run_sim_with_an_engine_family_simulates_and_records_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stream = write_jsonl(tmp_path / "s.jsonl", [
        Command(t_ns=i * 100 * MS, text=TEXTS[i % len(TEXTS)], command_id=f"c:{i}")
        for i in range(3)])
    out = tmp_path / "run"
    assert main(["run", "--stream", str(stream), "--engine", "sim", "--engine-family", "mlc",
                 "--device", "orin-nano-8gb-super", "--model", "smollm2-135m", "--quant", "Q4_0",
                 "--runner", "inline", "--asap", "--mode", "event", "--deadline-ms", "190",
                 "--out", str(out)]) == 0
    capsys.readouterr()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["engine_info"]["calibration"]["engine_family"] == "mlc"
    assert manifest["floor"]["target_prediction"]["engine_family"] == "mlc"
    recs = [r for r in read_records(out / "cycles.jsonl") if r.floor and r.tokens_in]
    assert recs and all(r.floor["target"]["engine_family"] == "mlc" for r in recs)
    err = _fails(capsys, "run", "--stream", str(stream), "--engine", "sim", "--engine-family",
                 "warp", "--device", "orin-nano-8gb", "--out", str(tmp_path / "bad"))
    assert "warp" in err


def test_predict_takes_a_gguf_files_ladder_level(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    import shutil

    from robot_latency.models.bundled import bundled_model_path

    monkeypatch.setenv("ROBOT_LATENCY_CACHE_DIR", str(tmp_path / "cache"))
    own = tmp_path / "mine.gguf"  # an F32 GGUF of the user's
    shutil.copy(bundled_model_path(), own)
    q8 = _json(capsys, "predict", "--model", str(own), "--quant", "Q8_0", "--json")
    f32 = _json(capsys, "predict", "--model", str(own), "--json")
    assert q8["quant"] == "Q8_0" and f32["quant"] != "Q8_0"
    assert q8["itl_floor_ms"] < f32["itl_floor_ms"]  # fewer bytes per step at Q8_0
    assert (tmp_path / "cache" / "models" / "mine.Q8_0.gguf").is_file()
    err = _fails(capsys, "predict", "--model", str(own), "--quant", "Q4_KM")
    assert "--quant: unknown level 'Q4_KM'; valid: F32, F16, Q8_0" in err


def test_quant_help_lists_the_levels(capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("run", "sweep", "predict"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "Q8_0, Q6_K, Q5_K_M, Q4_K_M, Q4_0, Q3_K_M, Q2_K" in text, command


def test_predict_says_where_prefill_and_decode_come_from(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["predict", "--device", "orin-nano-8gb", "--model", "qwen2.5-0.5b",
                 "--engine-family", "mlc", "--prompt-tokens", "128"]) == 0
    assert "prefill uncalibrated" in capsys.readouterr().out  # no MLC prefill row
    assert main(["predict", "--device", "orin-agx-64gb", "--model", "llama-3.2-1b",
                 "--prompt-tokens", "512"]) == 0
    out = capsys.readouterr().out
    assert "prefill calibrated" in out and "floor" in out
    # AGX Orin answers from its best-documented setup (power mode stated: MLLMs, MAXN), the
    # flagged jetpack-nixos set aside
    assert "rests on       MLLMs" in out and "set aside      jetpack-nixos" in out
    js = _json(capsys, "predict", "--device", "orin-agx-64gb", "--model", "llama-3.2-1b",
               "--prompt-tokens", "512", "--json")
    assert js["prefill_calibrated"] and js["ttft_pred_ms"] >= js["ttft_floor_ms"]
    lo, hi = js["ttft_pred_interval_ms"]
    assert lo <= js["ttft_pred_ms"] <= hi
    assert js["calibration"]["set_aside"] and js["calibration"]["sources"]


def test_predict_validate_reports_sources_and_prefill(capsys: pytest.CaptureFixture[str]) -> None:
    out = _json(capsys, "predict", "--validate", "--json")
    loso = out["leave_one_source_out"]
    assert loso["by_family"]["llamacpp-cuda"]["predicted"] >= 30
    assert any(c["flagged"] for c in loso["source_checks"]["llamacpp-cuda"])
    assert out["device_stability"]["max_ratio"] >= 1.0
    assert out["prefill"]["by_family"]["llamacpp-cuda"]["predicted"] >= 12
    assert main(["predict", "--validate"]) == 0
    text = capsys.readouterr().out
    assert "leave-one-source-out" in text and "flagged (llamacpp-cuda)" in text
    assert "prefill:" in text


def test_predict_shows_the_sources_behind_every_figure(
        capsys: pytest.CaptureFixture[str]) -> None:
    # the 7W mode: every row smolhub's, one source: the interval widened, and said so
    assert main(["predict", "--device", "orin-nano-8gb-7w", "--model", "qwen2.5-0.5b",
                 "--quant", "Q4_K_M", "--prompt-tokens", "300", "--plan-tokens", "40"]) == 0
    text = capsys.readouterr().out
    itl = next(line for line in text.splitlines() if "ITL predicted" in line)
    assert "1 source (widened by 19.7% each side" in itl
    ttft = next(line for line in text.splitlines() if "TTFT predicted" in line)
    assert "1 source (widened by" in ttft and "prefill leave-one-source-out error" in ttft
    assert "1 source" in next(line for line in text.splitlines() if "J per plan" in line)
    out = _json(capsys, "predict", "--device", "orin-nano-8gb-7w", "--model", "qwen2.5-0.5b",
                "--quant", "Q4_K_M", "--prompt-tokens", "300", "--plan-tokens", "40", "--json")
    assert out["source_counts"] == {"itl": 1, "ttft": 1, "energy": 1}
    assert out["calibration"]["source_widening_rel"] > 0
    assert out["calibration"]["prefill_source_widening_rel"] > 0
    # the AGX Orin at MAXN: two sources behind the decode answer, no widening
    assert main(["predict", "--device", "orin-agx-64gb", "--model", "llama-3.2-1b"]) == 0
    itl = next(line for line in capsys.readouterr().out.splitlines() if "ITL predicted" in line)
    assert "2 sources, from" in itl and "widened" not in itl


def test_predict_validate_reports_leave_one_source_out_coverage(
        capsys: pytest.CaptureFixture[str]) -> None:
    out = _json(capsys, "predict", "--validate", "--json")
    loso = out["leave_one_source_out"]
    cuda = loso["by_family"]["llamacpp-cuda"]
    done = [r for r in loso["rows"]
            if r["engine_family"] == "llamacpp-cuda" and r["error_rel"] is not None]
    assert cuda["inside_80"] == sum(1 for r in done if r["inside_interval"])
    assert cuda["coverage_80"] == cuda["inside_80"] / len(done)
    # a widened row's interval is its unwidened one plus the stated error on each side
    assert cuda["widened"] == sum(1 for r in done if r["source_widening_rel"] > 0)
    assert all(r["inside_interval"] or not r["inside_unwidened"] for r in done)
