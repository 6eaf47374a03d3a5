"""``sweep --repeats N``: N runs per configuration, round robin, and the medians across runs with
their order-statistic interval (the sim engine; structure and arithmetic, never timings)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from robot_latency.cli import main
from robot_latency.report.repeats import median_interval
from robot_latency.streams import Command, write_jsonl

TEXTS = ["pick up the red cup and put it on the tray", "go to the kitchen slowly",
         "bring the blue box to the table"]


def test_median_interval_is_the_order_statistics() -> None:
    three = median_interval([3.0, 1.0, 2.0])
    assert (three.median, three.lo, three.hi, three.n) == (2.0, 1.0, 3.0, 3)
    assert three.coverage == pytest.approx(0.75)  # 1 - 2 / 2**3: the range of 3 runs
    # ten runs: [x_(2), x_(9)] is the narrowest reaching 95% (1 - 2 * 11/1024 = 97.9%);
    # [x_(3), x_(8)] would cover 1 - 2 * 56/1024 = 89.1%
    ten = median_interval([float(v) for v in range(10, 0, -1)])
    assert (ten.median, ten.lo, ten.hi) == (5.5, 2.0, 9.0)
    assert ten.coverage == pytest.approx(1 - 2 * 11 / 1024)
    with pytest.raises(ValueError):
        median_interval([])


def test_sweep_repeats_round_robin_and_medians(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    cmds = [Command(t_ns=t * 10**6, text=TEXTS[i % 3], command_id=f"s:{i}")
            for i, t in enumerate([0, 100, 200, 300])]
    stream = write_jsonl(tmp_path / "stream.jsonl", cmds)
    out = tmp_path / "sweep"
    assert main(["sweep", "--stream", str(stream), "--engine", "sim", "--quants", "Q8_0,Q4_0",
                 "--repeats", "3", "--runner", "inline", "--asap", "--mode", "event",
                 "--deadline-ms", "60", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    dirs = sorted(p.name for p in out.iterdir() if (p / "cycles.jsonl").is_file())
    assert dirs == [f"{q}_r{r}" for q in ("Q4_0", "Q8_0") for r in (1, 2, 3)]
    doc = json.loads((out / "repeats.json").read_text())
    # round robin: each configuration once, then each again
    assert doc["order"] == ["Q8_0 #1", "Q4_0 #1", "Q8_0 #2", "Q4_0 #2", "Q8_0 #3", "Q4_0 #3"]
    started = {}
    for name in dirs:
        manifest = json.loads((out / name / "manifest.json").read_text())
        started[manifest["label"]] = manifest["started_unix"]
    assert sorted(started, key=started.get) == doc["order"]
    assert doc["repeats"] == 3
    rows = {r["label"]: r for r in json.loads((out / "comparison.json").read_text())["rows"]}
    assert len(rows) == 6
    for config in doc["configurations"]:
        assert len(config["runs"]) == 3
        for name, fig in config["figures"].items():
            vals = [rows[run][name] for run in config["runs"] if rows[run][name] is not None]
            if not vals:
                assert fig is None
                continue
            assert fig["values"] == vals
            assert fig["median"] == statistics.median(vals)
            assert (fig["lo"], fig["hi"]) == (min(vals), max(vals))
            assert fig["coverage"] == pytest.approx(0.75)
    assert "Median across 3 runs per configuration, run round robin" in printed
    assert "| Q8_0 | 3 |" in printed and "| Q4_0 | 3 |" in printed


def test_sweep_repeats_must_be_positive(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    stream = write_jsonl(tmp_path / "s.jsonl", [Command(t_ns=0, text=TEXTS[0], command_id="a")])
    assert main(["sweep", "--stream", str(stream), "--engine", "sim", "--repeats", "0",
                 "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("--repeats: must be >= 1, got 0") and len(err.splitlines()) == 1
    assert not (tmp_path / "o").exists()
