"""Comparison, plots and the Markdown report, on run directories built in tmp_path."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import Any

import pytest

from robot_latency.records import CycleRecord, JsonlSink
from robot_latency.report.compare import (
    COLUMNS,
    compare_runs,
    human_bytes,
    to_csv,
    to_json,
    to_markdown,
)
from robot_latency.report.markdown import write_report
from robot_latency.report.plots import (
    PLOTS,
    plot_itl_cdf,
    plot_measured_vs_predicted,
    plot_miss_rate,
    plot_phase_timeline,
    plot_ttft_cdf,
)
from robot_latency.report.rundir import ReportError, RunDirError, load_run
from robot_latency.stats import summarize, wilson_interval, write_summary

MS = 1_000_000
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _cycle(i: int, *, gap_ms: int = 10, n_gaps: int = 4, late: bool = False,
           fallback: bool = False, plan: dict[str, Any] | None = None,
           reason: str = "deadline") -> CycleRecord:
    """Cycle i on a scripted clock, deadline 100 ms; a fallback has no tokens and is in time."""
    sched = i * 1000 * MS
    started = sched + MS
    tokens = [] if fallback else [started + 20 * MS + k * gap_ms * MS for k in range(n_gaps + 1)]
    published = sched + (150 if late else (99 if fallback else 90)) * MS
    phases = {"queue": MS, "prefill": 20 * MS}
    if tokens:
        phases["decode"] = tokens[-1] - tokens[0]
    if fallback:
        phases["fallback"] = MS
    phases["publish"] = MS // 10
    return CycleRecord(run_id="r", cycle=i, scheduled_ns=sched, deadline_ns=sched + 100 * MS,
                       started_ns=started, published_ns=published, token_ns=tokens,
                       command_id=f"c{i}", tokens_in=40 + i,
                       phases_ns=phases, plan_source="fallback" if fallback else "model",
                       fallback_reason=reason if fallback else None,
                       plan=plan if plan is not None else {"steps": [{"action": "stop"}]})


def _manifest(label: str, *, asap: bool = False, full: bool = True) -> dict[str, Any]:
    if not full:
        return {"label": label, "engine": None, "model": None, "device": None, "floor": None,
                "config": {"deadline_ms": 100}, "replay": None}
    return {
        "label": label, "engine": "llama.cpp",
        "model": {"name": "planner", "quant": label, "weight_bytes_total": 3 * 1024 ** 3,
                  "effective_bpw": 4.85},
        "device": {"host": {"cpus": 2}, "target": {"id": "orin-nano-8gb"}},
        "floor": {"host": {"itl_floor_ms": 4.0, "prefill_floor_ms": None},
                  "target": {"device_id": "orin-nano-8gb", "itl_floor_ms": 2.5}},
        "config": {"deadline_ms": 100, "period_ms": 200},
        "replay": {"mode": "asap" if asap else "recorded", "speed": 1.0},
    }


def _write_run(d: Path, records: list[CycleRecord], manifest: dict[str, Any] | None) -> Path:
    d.mkdir(parents=True)
    with JsonlSink(d / "cycles.jsonl") as sink:
        for r in records:
            sink.write(r)
    write_summary(summarize(records), d / "summary.json")
    if manifest is not None:
        (d / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    return d


@pytest.fixture
def two_runs(tmp_path: Path) -> list[Path]:
    # reference F16: 10 cycles, all model plans, cycle 9 published late
    ref = [_cycle(i, plan={"steps": [i]}, late=(i == 9)) for i in range(10)]
    # Q4: 6 plans agree, 2 differ, 2 model misses answered in time by a fallback
    q4 = [_cycle(i, plan={"steps": [i if i < 6 else -i]}) for i in range(8)]
    q4 += [_cycle(i, fallback=True) for i in (8, 9)]
    return [_write_run(tmp_path / "f16", ref, _manifest("F16", full=False)),
            _write_run(tmp_path / "q4", q4, _manifest("Q4_K_M", asap=True))]


def test_every_fallback_counts_as_a_model_miss_in_every_table(tmp_path: Path) -> None:
    # 20 cycles: 9 model plans, 10 fallbacks because the server was unreachable, 1 because the
    # model ran out of time. The report once showed model miss 5.0% beside fallback 55.0%.
    recs = [_cycle(i) for i in range(9)]
    recs += [_cycle(i, fallback=True, reason="server_unreachable") for i in range(9, 19)]
    recs.append(_cycle(19, fallback=True))
    d = _write_run(tmp_path / "srv", recs, _manifest("Q4_K_M"))
    (row,) = compare_runs([d])
    assert row.model_misses == row.fallbacks == 11
    assert row.model_miss_rate == row.fallback_rate == pytest.approx(0.55)
    report = write_report([d], tmp_path / "rep")
    (saved,) = json.loads((report.parent / "comparison.json").read_text())["rows"]
    assert saved["model_misses"] == saved["fallbacks"] == 11
    assert "model misses (fallback answered): 11" in report.read_text()


def test_comparison_numbers(two_runs: list[Path]) -> None:
    ref, q4 = compare_runs(two_runs)
    assert ref.label == "F16" and q4.label == "Q4_K_M"
    assert ref.deadline_misses == 1 and ref.deadline_miss_rate == pytest.approx(0.1)
    assert (ref.deadline_miss_ci95_lo, ref.deadline_miss_ci95_hi) == \
        pytest.approx(wilson_interval(1, 10))
    assert ref.model_misses == 0 and ref.model_miss_ci95_lo == 0.0
    assert q4.deadline_misses == 0 and q4.deadline_miss_ci95_lo == 0.0
    assert q4.model_misses == 2 and q4.model_miss_rate == pytest.approx(0.2)
    assert (q4.model_miss_ci95_lo, q4.model_miss_ci95_hi) == pytest.approx(wilson_interval(2, 10))
    assert q4.fallbacks == 2 and q4.fallback_rate == pytest.approx(0.2)
    # agreement over every command both ran: c0..c5 agree; c6, c7 differ; c8, c9 fell back
    # where the reference planned (a fallback is its own outcome, not a dropped pair)
    assert q4.agreement == pytest.approx(0.6) and q4.agreement_n == 10
    assert q4.reference == "F16" and ref.agreement is None
    # every gap is 10 ms; host floor 4 ms -> efficiency 0.4
    assert q4.itl_p50_ms == pytest.approx(10.0) and q4.itl_n == 8 * 4
    assert q4.floor_efficiency == pytest.approx(0.4)
    assert q4.ttft_p50_ms == pytest.approx(21.0) and q4.ttft_n == 8
    assert q4.floor_itl_target_ms == 2.5 and q4.target_device == "orin-nano-8gb"
    assert q4.model_bytes == 3 * 1024 ** 3 and q4.model_size == "3.0 GiB"
    assert q4.effective_bpw == 4.85 and q4.replay_mode == "asap"
    # the reference's manifest has nulls everywhere: None, never a made-up 0
    assert ref.floor_itl_host_ms is None and ref.floor_efficiency is None
    assert ref.model_size is None and ref.engine is None


def test_named_reference_and_unknown_reference(two_runs: list[Path]) -> None:
    ref, q4 = compare_runs(two_runs, reference="Q4_K_M")
    assert q4.agreement is None and ref.reference == "Q4_K_M"
    assert ref.agreement == pytest.approx(0.6)
    with pytest.raises(ReportError, match="NOPE"):
        compare_runs(two_runs, reference="NOPE")


def test_markdown_table_shows_dashes_for_unknowns(two_runs: list[Path]) -> None:
    table = to_markdown(compare_runs(two_runs))
    lines = table.splitlines()
    assert len(lines) == 4 and lines[0].startswith("| config |")
    f16 = lines[2].split(" | ")
    assert f16[0] == "| F16" and f16[1] == "-" and "ref" in lines[2]
    assert "Q4_K_M (asap)" in lines[3] and "orin-nano-8gb" in lines[3]
    assert "60% (n=10)" in lines[3] and "20.0% [" in lines[3]


def test_csv_and_json_parse_back(two_runs: list[Path], tmp_path: Path) -> None:
    rows = compare_runs(two_runs)
    with open(to_csv(rows, tmp_path / "out" / "cmp.csv"), encoding="utf-8", newline="") as fh:
        reader = csv.DictReader(fh)
        assert tuple(reader.fieldnames or ()) == COLUMNS
        back = list(reader)
    assert [r["label"] for r in back] == ["F16", "Q4_K_M"]
    assert float(back[1]["model_miss_rate"]) == pytest.approx(0.2)
    assert back[0]["floor_itl_host_ms"] == ""  # None is an empty cell
    doc = json.loads(to_json(rows, tmp_path / "cmp.json").read_text(encoding="utf-8"))
    assert tuple(doc["columns"]) == COLUMNS
    assert [tuple(r) for r in doc["rows"]] == [COLUMNS, COLUMNS]
    assert doc["rows"][1]["agreement"] == pytest.approx(0.6)
    assert doc["rows"][0]["floor_efficiency"] is None


def test_missing_files_name_the_directory(tmp_path: Path) -> None:
    no_manifest = _write_run(tmp_path / "broken_run", [_cycle(0)], None)
    with pytest.raises(RunDirError) as err:
        compare_runs([no_manifest])
    assert str(no_manifest) in str(err.value) and "manifest.json" in str(err.value)
    (no_manifest / "manifest.json").write_text("{}", encoding="utf-8")
    (no_manifest / "cycles.jsonl").unlink()
    with pytest.raises(RunDirError, match=r"cycles\.jsonl") as err:
        load_run(no_manifest)
    assert str(no_manifest) in str(err.value)
    with pytest.raises(RunDirError, match="does not exist"):
        load_run(tmp_path / "nowhere")
    (no_manifest / "cycles.jsonl").write_text("{}", encoding="utf-8")
    (no_manifest / "manifest.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(RunDirError, match=r"manifest\.json"):
        load_run(no_manifest)


def test_label_defaults_to_directory_name(tmp_path: Path) -> None:
    d = _write_run(tmp_path / "my_run", [_cycle(0)], {"label": None})
    assert load_run(d).label == "my_run"
    assert human_bytes(512) == "512 B" and human_bytes(None) is None


def _assert_png(path: Path | None) -> None:
    assert path is not None and path.is_file()
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert len(data) > 5_000


def test_every_plot_written(two_runs: list[Path], tmp_path: Path) -> None:
    runs = [load_run(d) for d in two_runs]
    out = tmp_path / "plots"
    for name, fn in PLOTS.items():
        _assert_png(fn(runs, out / name))


def test_plots_skip_without_data(tmp_path: Path) -> None:
    all_fallback = [("fb", [_cycle(i, fallback=True) for i in range(5)], _manifest("fb"))]
    assert plot_itl_cdf(all_fallback, tmp_path / "a.png") is None
    assert plot_ttft_cdf(all_fallback, tmp_path / "b.png") is None
    assert plot_measured_vs_predicted(all_fallback, tmp_path / "c.png") is None
    assert not (tmp_path / "a.png").exists()
    # misses and phases are still there to show
    _assert_png(plot_miss_rate(all_fallback, tmp_path / "d.png"))
    _assert_png(plot_phase_timeline(all_fallback, tmp_path / "e.png"))
    empty = [("none", [], None)]
    for name, fn in PLOTS.items():
        assert fn(empty, tmp_path / name) is None
    # gaps but no floor anywhere: no measured-vs-predicted point
    no_floor = [("nf", [_cycle(0)], {"floor": None})]
    assert plot_measured_vs_predicted(no_floor, tmp_path / "f.png") is None


def test_report_has_table_and_links_that_exist(two_runs: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "report"
    path = write_report(two_runs, out)
    assert path == out / "report.md"
    text = path.read_text(encoding="utf-8")
    assert "| config |" in text and "| F16" in text and "Q4_K_M" in text
    links = re.findall(r"\]\(([^)]+)\)", text)
    assert {"itl_cdf.png", "ttft_cdf.png", "miss_rate.png", "phase_timeline.png",
            "measured_vs_predicted.png", "comparison.csv"} <= set(links)
    for link in links:
        assert (out / link).is_file(), link
    for png in out.glob("*.png"):
        _assert_png(png)
    # diagnosis per configuration, the asap label, and the small-sample warning
    assert "### F16" in text and "### Q4_K_M" in text
    assert "verdict: **" in text and "Miss causes:" in text and "Phase split:" in text
    assert "As-fast-as-possible replay" in text
    assert "p99 from only" in text
    # the Q4 model misses produced no token before giving up; the F16 late cycle's tokens
    # were all in by 61 ms, its plan went out at 150 ms
    assert "| prefill_too_long | 0 | 2 | 2 |" in text
    assert "| publish_late | 1 | 0 | 1 |" in text


def test_report_with_a_run_without_tokens(tmp_path: Path) -> None:
    d = _write_run(tmp_path / "fb", [_cycle(i, fallback=True) for i in range(3)],
                   _manifest("fb"))
    text = write_report([d], tmp_path / "out").read_text(encoding="utf-8")
    assert "not drawn (no data)" in text
    links = re.findall(r"\]\(([^)]+)\)", text)
    assert all((tmp_path / "out" / link).is_file() for link in links)


def test_the_reference_is_the_highest_precision_whatever_the_order(tmp_path: Path) -> None:
    def run(name: str, bpw: float | None) -> Path:
        manifest = _manifest(name)
        manifest["model"]["effective_bpw"] = bpw
        recs = [_cycle(i, plan={"steps": [i]}) for i in range(3)]
        return _write_run(tmp_path / name, recs, manifest)

    dirs = [run("Q4_0", 5.37), run("Q4_K_M", 6.16), run("Q8_0", 8.5)]  # the shell's order
    for order in (dirs, dirs[::-1]):
        rows = compare_runs(order)
        assert {r.reference for r in rows} == {"Q8_0"}
        assert rows[0].reference_reason == ("highest precision among the runs: 8.50 bits per "
                                            "weight (Q8_0)")
    rows = compare_runs(dirs, reference="Q4_0")  # --reference still overrides
    assert {r.reference for r in rows} == {"Q4_0"}
    assert rows[0].reference_reason == "chosen with --reference"
    # without bits per weight for every run, the ladder's order decides
    f16 = run("F16", None)
    assert {r.reference for r in compare_runs([dirs[0], f16])} == {"F16"}
    report = (write_report(dirs, tmp_path / "rep")).read_text()
    assert "against **Q8_0**: highest precision among the runs: 8.50 bits per weight" in report
    same = [run("a", 5.37), run("b", 5.37)]  # e.g. a sweep over devices
    assert compare_runs(same[::-1])[0].reference_reason == ("every run at the same precision: "
                                                            "the first run")


def _predicted(rec: CycleRecord, *, ttft_ms: float, itl_ms: float, finished: bool) -> CycleRecord:
    """Give a record what the run writes: its stop reason and the target's answer."""
    rec.stop_reason = "complete" if finished else "deadline"
    n = rec.tokens_out
    rec.target_pred = {"ttft_ms": ttft_ms, "itl_ms": itl_ms,
                       "itl_interval_ms": [0.9 * itl_ms, 1.2 * itl_ms], "tokens_out": n,
                       "basis": "complete" if finished else "partial", "max_tokens": 50,
                       "device_id": "orin-nano-8gb", "engine_family": "llamacpp-cuda"}
    rec.target_e2e_pred_ms = ttft_ms + (n - 1) * itl_ms
    rec.target_e2e_pred_interval_ms = [ttft_ms + (n - 1) * 0.9 * itl_ms,
                                       ttft_ms + (n - 1) * 1.2 * itl_ms]
    rec.target_deadline_met_pred = rec.target_e2e_pred_ms <= 100 if finished else None
    return rec


def test_the_report_opens_with_the_targets_answer_per_level(tmp_path: Path) -> None:
    from robot_latency.report.target import target_level

    # Q8_0 (reference): 5 gaps per plan; predicted 10 + 4 x 20 = 90 ms (in time) for c0-c7,
    # 10 + 4 x 30 = 130 ms (a miss) for c8, c9. Interval ends: 82 / 106 ms and 118 / 154 ms.
    ref = [_predicted(_cycle(i), ttft_ms=10, itl_ms=20 if i < 8 else 30, finished=True)
           for i in range(10)]
    # Q4_0: every output cut off here after 2 tokens: predicted from the reference's plan
    # length for the same command (5 tokens; every reference plan finished).
    q4 = [_predicted(_cycle(i, n_gaps=1), ttft_ms=10, itl_ms=15, finished=False)
          for i in range(10)]
    dirs = [_write_run(tmp_path / "q4", q4, _manifest("Q4_0")),
            _write_run(tmp_path / "q8", ref, _manifest("Q8_0"))]
    for d, bpw in ((dirs[0], 5.37), (dirs[1], 8.5)):
        m = json.loads((d / "manifest.json").read_text())
        m["model"]["effective_bpw"] = bpw
        (d / "manifest.json").write_text(json.dumps(m))
    runs = [load_run(d) for d in dirs]
    lv8 = target_level(runs[1], runs[1])
    assert lv8.n == 10 and lv8.misses() == 2 and lv8.planned == {}
    assert (lv8.rate("lo"), lv8.rate("hi")) == (pytest.approx(0.2), pytest.approx(1.0))
    assert lv8.ci95() == pytest.approx(wilson_interval(2, 10))
    lv4 = target_level(runs[0], runs[1])
    # planned from the reference's 5 tokens: 10 + 4 x 15 = 70 ms, never its own 2 tokens
    assert lv4.planned == {"the reference's plan length": 10} and lv4.misses() == 0
    assert {c.tokens_out for c in lv4.cycles} == {5}
    assert [c.e2e_ms for c in lv4.cycles] == pytest.approx([70.0] * 10)
    # without a reference, the run's max_tokens (50): 10 + 49 x 15 = 745 ms, all misses
    alone = target_level(runs[0], None)
    assert alone.planned == {"max_tokens": 10} and alone.misses() == 10
    # the reference itself cut off, another level finished: that level's plan length
    q8_cut = [_predicted(_cycle(i, n_gaps=1), ttft_ms=10, itl_ms=20, finished=False)
              for i in range(10)]
    q5 = [_predicted(_cycle(i, n_gaps=3), ttft_ms=10, itl_ms=18, finished=True)
          for i in range(10)]
    cut = [load_run(_write_run(tmp_path / name, recs, _manifest(label)))
           for name, recs, label in (("q8c", q8_cut, "Q8_0"), ("q5", q5, "Q5_K_M"))]
    lv = target_level(cut[0], cut[0], cut)
    assert lv.planned == {"another level's plan length": 10}
    assert {c.tokens_out for c in lv.cycles} == {4}  # q5's 4 tokens, not max_tokens' 50
    assert target_level(cut[0], cut[0]).planned == {"max_tokens": 10}  # no other level given

    text = write_report(dirs, tmp_path / "rep").read_text()
    first = text.split("\n## ")[1]
    assert first.startswith("On orin-nano-8gb with llamacpp-cuda")
    q8_row = next(line for line in first.splitlines() if line.startswith("| Q8_0 |"))
    assert "| 20.0% [" in q8_row and "| 20.0% - 100.0% |" in q8_row
    assert "Q4_0: 10 of 10 cycles predicted from the planned output length (none of its " \
        "outputs finished here): the reference's plan length (10)" in first
    png = tmp_path / "rep" / "target_e2e.png"
    assert png.read_bytes().startswith(PNG_SIGNATURE)


def _overlaps(boxes: list[Any]) -> list[tuple[int, int]]:
    return [(i, j) for i in range(len(boxes)) for j in range(i + 1, len(boxes))
            if boxes[i].overlaps(boxes[j])]


def test_plots_are_legible_at_their_default_size(tmp_path: Path) -> None:
    """No tick labels or point labels running into each other; the deadline inside every
    panel of the phase timeline; its legend under the panels, not floating above them."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from robot_latency.report.plots import measured_vs_predicted_figure, phase_timeline_figure

    # three levels with close floors and ITLs, as a quant ladder gives them
    runs = []
    for name, floor_ms, gap_ms in (("Q4_0", 10.8, 19), ("Q4_K_M", 12.3, 20), ("Q8_0", 16.4, 28)):
        manifest = _manifest(name)
        manifest["floor"]["host"]["itl_floor_ms"] = floor_ms
        manifest["floor"]["target_prediction"] = {
            "itl_pred_ms": 2 * floor_ms, "engine_family": "llamacpp-cuda",
            "itl_pred_interval_ms": [1.8 * floor_ms, 2.3 * floor_ms]}
        recs = [_cycle(i, gap_ms=gap_ms) for i in range(6)]
        runs.append(load_run(_write_run(tmp_path / name, recs, manifest)))
    fig = measured_vs_predicted_figure(runs)
    assert fig is not None
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    ax = fig.axes[0]
    assert not ax.texts  # the efficiencies are in the legend, not next to close points
    for axis in (ax.xaxis, ax.yaxis):
        boxes = [t.get_window_extent(renderer) for t in axis.get_ticklabels(which="both")
                 if t.get_visible() and t.get_text()]
        assert len(boxes) >= 2 and not _overlaps(boxes)
    legend_text = " ".join(t.get_text() for t in ax.get_legend().get_texts())
    assert "Q4_0: measured here, floor eff. 0.57 (n=24)" in legend_text

    fig = phase_timeline_figure(runs)
    assert fig is not None
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    assert not fig.legends  # one legend, under the last panel
    for panel in fig.axes:
        lo, hi = panel.get_xlim()
        assert lo <= 0 and hi > 100 * 1.05  # the 100 ms deadline well inside, not on the edge
    legend = fig.axes[-1].get_legend()
    bottom = fig.axes[-1].get_window_extent(renderer)
    assert legend.get_window_extent(renderer).y1 < bottom.y0
    assert {"deadline", "published"} <= {t.get_text() for t in legend.get_texts()}
