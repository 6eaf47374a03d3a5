"""``robot-latency fleet`` against a real llama-cpp-python server: one run directory per robot,
a summary per fleet size, the plot; each robot with its own arrivals."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from robot_latency.cli import main
from robot_latency.engines.llama_server import free_port
from robot_latency.records import read_records


def _stream(tmp_path: Path) -> Path:
    path = tmp_path / "commands.jsonl"
    texts = ["pick up the red cup", "go to the kitchen", "stop"]
    path.write_text("".join(json.dumps({"t_ns": i * 300_000_000, "text": t}) + "\n"
                            for i, t in enumerate(texts)))
    return path


@pytest.mark.parametrize("arrivals", ["offset", "poisson"])
def test_fleet_writes_runs_summaries_and_plot(llama_server: Any, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str],
                                              arrivals: str) -> None:
    out = tmp_path / "fleet"
    rc = main(["fleet", "--server-url", llama_server.url, "--robots", "1,2",
               "--stream", str(_stream(tmp_path)), "--out", str(out), "--arrivals", arrivals,
               "--rate-hz", "4", "--seed", "7", "--deadline-ms", "300", "--period-ms", "300",
               "--json"])
    assert rc == 0, capsys.readouterr().err
    doc = json.loads((out / "fleet.json").read_text())
    assert [s["robots"] for s in doc["sizes"]] == [1, 2]
    assert (out / "fleet.png").stat().st_size > 0
    for size in doc["sizes"]:
        n = size["robots"]
        summary = json.loads((out / f"N{n}" / "fleet_summary.json").read_text())
        assert summary["robots"] == n and len(summary["run_dirs"]) == n
        records = [read_records(Path(d) / "cycles.jsonl") for d in summary["run_dirs"]]
        assert summary["cycles"] == sum(len(r) for r in records)
        assert {"p50", "p99"} <= set(summary["ttft_ms"]) and summary["miss_rate_ci95"]
        pooled = [r for recs in records for r in recs]
        assert summary["model_plans"] == sum(1 for r in pooled if r.plan_source == "model")
        assert summary["fallback_plans"] == sum(1 for r in pooled if r.plan_source == "fallback")
        assert summary["fallback_rate"] == summary["fallback_plans"] / summary["cycles"]
        for i, recs in enumerate(records):
            ids = {r.command_id for r in recs if r.command_id}
            assert ids and all(c.startswith(f"r{i}:") for c in ids)
            asked = [r for r in recs if r.offboard is not None]
            assert asked and all(r.offboard["url"] == llama_server.url for r in asked)


def test_fleet_find_robots_against_a_real_server(llama_server: Any, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    # Which size it finds depends on this host's timing: only the answer's structure and its
    # agreement with the sizes' own summaries and records are asserted.
    from robot_latency.planner.fleet import model_misses

    out = tmp_path / "find"
    rc = main(["fleet", "--server-url", llama_server.url, "--find-robots", "--miss-target", "0.5",
               "--find-robots-trials", "2", "--stream", str(_stream(tmp_path)),
               "--out", str(out), "--deadline-ms", "300", "--period-ms", "300"])
    assert rc == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    doc = json.loads((out / "fleet.json").read_text())
    found = doc["find_robots"]
    assert found["criterion"] == "model_miss_rate" and found["max_trials"] == 2
    assert found["miss_target"] == 0.5 and 1 <= found["tried"] == len(found["trials"]) <= 2
    tried = [t["robots"] for t in found["trials"]]
    assert tried[0] == 1 and tried == [1, 2][: len(tried)]
    assert [s["robots"] for s in doc["sizes"]] == sorted(tried)
    assert sorted(p.name for p in out.glob("N*")) == sorted(f"N{n}" for n in tried)
    for trial in found["trials"]:
        summary = json.loads((out / trial["size_dir"] / "fleet_summary.json").read_text())
        pooled = [r for d in summary["run_dirs"] for r in read_records(Path(d) / "cycles.jsonl")]
        assert len(summary["run_dirs"]) == trial["robots"] and summary["cycles"] == len(pooled)
        due, missed = model_misses(pooled)
        assert (summary["model_due"], summary["model_misses"]) == (due, missed) and due > 0
        assert trial["model_miss_rate"] == summary["model_miss_rate"] == missed / due
        assert trial["held"] == (trial["model_miss_rate"] <= 0.5)
    by_size = {t["robots"]: t for t in found["trials"]}
    if found["robots_held"] is not None:
        assert by_size[found["robots_held"]]["held"]
        assert found["miss_held"] == by_size[found["robots_held"]]["model_miss_rate"]
    if found["robots_failed"] is not None:
        assert not by_size[found["robots_failed"]]["held"]
        assert found["miss_failed"] == by_size[found["robots_failed"]]["model_miss_rate"]
    assert found["robots_held"] is not None or found["robots_failed"] == 1
    assert "Largest fleet this server holds" in printed and "model miss" in printed
    assert (out / "fleet.png").stat().st_size > 0


def test_each_robot_has_arrivals_of_its_own(tmp_path: Path) -> None:
    from robot_latency.planner.config import RunSettings
    from robot_latency.planner.fleet import FleetSpec, robot_stream
    from robot_latency.streams import read_stream

    stream = read_stream(str(_stream(tmp_path)))
    settings = RunSettings(period_ms=300, deadline_ms=300, server_url="http://x/v1")
    offset = FleetSpec(sizes=(4,), out=tmp_path, settings=settings)
    shifted = [robot_stream(stream, i, 4, offset) for i in range(4)]
    for i, s in enumerate(shifted):
        assert [c.t_ns for c in s.commands] == [c.t_ns + i * 75_000_000 for c in stream.commands]
        assert [c.text for c in s.commands] == [c.text for c in stream.commands]
    poisson = FleetSpec(sizes=(2,), out=tmp_path, settings=settings,
                        arrivals="poisson", rate_hz=5.0, seed=3)
    a, b = (robot_stream(stream, i, 2, poisson) for i in range(2))
    assert [c.t_ns for c in a.commands] != [c.t_ns for c in b.commands]
    assert [c.t_ns for c in a.commands] == [c.t_ns for c in robot_stream(stream, 0, 2,
                                                                         poisson).commands]


def test_fleet_refuses_an_unreachable_server(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    rc = main(["fleet", "--server-url", url, "--robots", "1", "--stream",
               str(_stream(tmp_path)), "--out", str(tmp_path / "f")])
    assert rc == 2 and url in capsys.readouterr().err


def test_fleet_refuses_bad_sizes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["fleet", "--server-url", "http://127.0.0.1:1/v1", "--robots", "0,2",
               "--stream", str(_stream(tmp_path)), "--out", str(tmp_path / "f")])
    assert rc == 2 and "--robots" in capsys.readouterr().err


def _cycle(i: int, source: str, *, late: bool = False) -> Any:
    from robot_latency.records import CycleRecord

    ms = 1_000_000
    sched = i * 300 * ms
    return CycleRecord(run_id="r", cycle=i, scheduled_ns=sched, deadline_ns=sched + 150 * ms,
                       started_ns=sched, published_ns=sched + (160 if late else 140) * ms,
                       token_ns=[] if source == "fallback" else [sched + 20 * ms, sched + 30 * ms],
                       plan_source=source,
                       fallback_reason="deadline" if source == "fallback" else None)


def test_fleet_table_and_plot_show_model_plans_and_fallbacks(tmp_path: Path) -> None:
    # The fallback keeps deadline misses at 0 while the model's share falls with N: the table
    # and the plot must show that, not misses alone.
    from robot_latency.cli.fleet import FLEET_HEADER, fleet_rows
    from robot_latency.planner.fleet import summarize_fleet
    from robot_latency.report.fleet_plot import plot_fleet

    one = summarize_fleet(1, [_cycle(i, "model") for i in range(10)], ttft_alone_ms=20.0)
    four = summarize_fleet(4, [_cycle(i, "model") for i in range(10)]
                           + [_cycle(i, "fallback") for i in range(10, 40)], ttft_alone_ms=20.0)
    assert one["miss_rate"] == four["miss_rate"] == 0.0
    assert (one["model_plans"], one["fallback_plans"]) == (10, 0)
    assert (four["model_plans"], four["fallback_plans"]) == (10, 30)
    assert four["model_plan_rate"] == 0.25 and four["fallback_rate"] == 0.75
    lo, hi = four["fallback_rate_ci95"]
    assert lo < 0.75 < hi
    rows = {r[0]: dict(zip(FLEET_HEADER, r, strict=True)) for r in fleet_rows([one, four])}
    assert rows["4"]["model plans"] == "10 (25.0%)" and rows["4"]["fallbacks"] == "30 (75.0%)"
    assert rows["4"]["deadline miss"] == "0.0%" and rows["1"]["fallbacks"] == "0 (0.0%)"
    png = plot_fleet([four, one], tmp_path / "fleet.png", deadline_ms=150)
    assert png.read_bytes().startswith(b"\x89PNG")
