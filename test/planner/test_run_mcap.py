"""run.mcap: a real ``robot-latency run`` writes it; the ``mcap`` reader reads it back, every
message validates against its channel's JSON Schema, and the foxglove.Event channel holds the
records' deadline misses and fallbacks one for one."""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from mcap.reader import make_reader

import robot_latency
from robot_latency.cli import main
from robot_latency.planner.cycle_fields import CYCLE_STATS_FIELDS
from robot_latency.planner.mailbox import InboundCommand
from robot_latency.planner.mcap_log import (
    CHANNELS,
    COMMAND_CHANNEL,
    CYCLE_STATS_CHANNEL,
    EVENT_CHANNEL,
    LOG_CHANNEL,
    PLAN_CHANNEL,
    RECORD_CHANNEL,
    RunMcap,
    cycle_events,
)
from robot_latency.records import CycleRecord, read_records
from robot_latency.report.rundir import RunDirError, load_run
from robot_latency.report.runmcap import read_run_mcap
from robot_latency.streams import Command, write_jsonl

MS = 1_000_000


def read_mcap(path: Path) -> tuple[dict[str, Any], list[tuple[str, int, dict[str, Any]]],
                                   dict[str, dict[str, str]]]:
    """(topic -> schema, [(topic, log_time, message)], metadata by name), checking encodings."""
    schemas: dict[str, Any] = {}
    messages = []
    with open(path, "rb") as fh:
        reader = make_reader(fh)
        assert reader.get_header().profile == "robot_latency"
        for schema, channel, msg in reader.iter_messages(log_time_order=False):
            assert channel.message_encoding == "json" and schema.encoding == "jsonschema"
            schemas[channel.topic] = json.loads(schema.data)
            messages.append((channel.topic, msg.log_time, json.loads(msg.data)))
        summary = reader.get_summary()
        assert summary is not None  # closed cleanly: the index and footer are there
        assert {c.topic for c in summary.channels.values()} == set(CHANNELS)
        meta = {m.name: m.metadata for m in reader.iter_metadata()}
    return schemas, messages, meta


@pytest.fixture(scope="module")
def burst_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An event-mode run with an engine that never answers in time and a burst of commands
    that arrive at once: the first waits for the model until its give-up time and falls back;
    the ones whose deadline passes while they wait are skipped (misses); a later one falls
    back in time."""
    tmp = tmp_path_factory.mktemp("mcap")
    texts = ["stop", "go to the kitchen", "pick up the red cup", "go to the tray"]
    commands = [Command(t_ns=0, text=texts[i % 4], command_id=f"b:{i}") for i in range(12)]
    commands.append(Command(t_ns=400 * MS, text="stop", command_id="late"))
    stream = write_jsonl(tmp / "burst.jsonl", commands)
    out = tmp / "run"
    assert main(["run", "--stream", str(stream), "--engine", "sim", "--device", "orin-nano-4gb",
                 "--engine-opt", "efficiency=0.01", "--deadline-ms", "20", "--mode", "event",
                 "--publish-margin-ms", "1", "--out", str(out), "--json"]) == 0
    return out


def test_every_message_validates_against_its_channels_schema(burst_run: Path) -> None:
    schemas, messages, _ = read_mcap(burst_run / "run.mcap")
    assert set(schemas) == set(CHANNELS)
    for topic, _, body in messages:
        jsonschema.validate(body, schemas[topic])
    counts = Counter(topic for topic, _, _ in messages)
    records = read_records(burst_run / "cycles.jsonl")
    assert counts[COMMAND_CHANNEL] == 13
    assert counts[CYCLE_STATS_CHANNEL] == counts[RECORD_CHANNEL] == len(records) == 13
    assert counts[PLAN_CHANNEL] == sum(1 for r in records if r.published_ns is not None)
    assert counts[LOG_CHANNEL] >= 2  # the run's start and its end


def test_the_events_are_the_records_misses_and_fallbacks_one_for_one(burst_run: Path) -> None:
    _, messages, _ = read_mcap(burst_run / "run.mcap")
    records = read_records(burst_run / "cycles.jsonl")
    events = [{m["key"]: m["value"] for m in body["metadata"]}
              for topic, _, body in messages if topic == EVENT_CHANNEL]
    got = Counter((int(e["cycle"]), e["kind"]) for e in events)
    want = Counter((r.cycle, kind) for r in records for kind in cycle_events(r))
    assert got == want and max(got.values()) == 1
    summary = json.loads((burst_run / "summary.json").read_text())
    misses = sum(1 for _, kind in got if kind == "deadline_miss")
    assert misses == summary["deadline_misses"] > 0
    assert sum(1 for _, kind in got if kind == "fallback") == sum(summary["fallbacks"].values())
    assert summary["plan_sources"].get("fallback", 0) > 0  # the fallback answered some in time
    for e in events:
        rec = next(r for r in records if r.cycle == int(e["cycle"]))
        assert e["reason"] == (rec.fallback_reason or "") and e["source"] == rec.plan_source


def test_the_records_channel_is_cycles_jsonl_and_stats_match(burst_run: Path) -> None:
    _, messages, meta = read_mcap(burst_run / "run.mcap")
    records = read_records(burst_run / "cycles.jsonl")
    from_mcap = [CycleRecord.from_dict(b) for t, _, b in messages if t == RECORD_CHANNEL]
    assert [r.to_dict() for r in from_mcap] == [r.to_dict() for r in records]
    stats = [b for t, _, b in messages if t == CYCLE_STATS_CHANNEL]
    for rec, st in zip(records, stats, strict=True):
        assert set(st) == {"header", *CYCLE_STATS_FIELDS}
        assert st["cycle"] == rec.cycle and st["deadline_met"] == rec.deadline_met
        assert st["cycle_ms"] == (None if rec.cycle_ns is None else rec.cycle_ns / 1e6)
    assert json.loads(meta["manifest"]["json"])["status"] == "finished"
    assert json.loads(meta["summary"]["json"])["cycles"] == len(records)
    # wall-clock times: the offset read at the start, the same for every message
    offset = int(meta["clock"]["wall_minus_loop_ns"])
    plans = [(lt, b) for t, lt, b in messages if t == PLAN_CHANNEL]
    assert all(lt == b["published_ns"] + offset for lt, b in plans)


def test_a_failing_file_never_stops_the_caller(tmp_path: Path,
                                               caplog: pytest.LogCaptureFixture) -> None:
    """A write that fails ends run.mcap (logged once), never the run: later calls are no-ops."""
    clock = iter(range(0, 10**12, MS)).__next__
    sink = RunMcap(tmp_path / "run.mcap", clock=clock, run_id="t")
    assert sink.open
    assert sink._fh is not None
    sink._fh.close()  # the disk goes away under it
    sink.command(InboundCommand("c", "stop", arrival_ns=5))  # into the chunk the cycle closes
    sink.cycle(CycleRecord(run_id="t", cycle=0, scheduled_ns=5, deadline_ns=5 + 400 * MS))
    assert not sink.open
    assert sum("stopped writing it" in r.getMessage() for r in caplog.records) == 1
    sink.command(InboundCommand("d", "stop", arrival_ns=6))
    sink.close(manifest={}, summary={})


def test_the_index_kept_in_memory_is_one_packed_entry_per_cycle(tmp_path: Path) -> None:
    """A long run's writer keeps one chunk index entry per cycle (a command joins its cycle's
    chunk), each as its encoded bytes, not Python objects: what a node keeps for the file's
    index grows by the index's own size per cycle. The closed file's index has every chunk and
    gives back every message."""
    clock = iter(range(0, 10**15, MS)).__next__
    sink = RunMcap(tmp_path / "run.mcap", clock=clock, run_id="t", capture_logs=False)
    packed = sink.chunk_indexes
    assert packed is not None  # the mcap writer's internals are the ones packed
    assert sink._writer._Writer__chunk_indices is packed
    n = 500
    for i in range(n):
        at = clock()
        sink.command(InboundCommand(f"c{i}", "stop", arrival_ns=at))
        sink.cycle(CycleRecord(run_id="t", cycle=i, command_id=f"c{i}", scheduled_ns=at,
                               deadline_ns=at + 400 * MS))
    assert len(packed) == n  # one chunk per cycle, not one per write
    assert packed.nbytes <= 128 * n  # an entry: times, offsets, a few channels' offsets
    sink.close(manifest={}, summary={})
    _, messages, _ = read_mcap(tmp_path / "run.mcap")
    counts = Counter(topic for topic, _, _ in messages)
    assert counts[COMMAND_CHANNEL] == counts[RECORD_CHANNEL] == n
    with open(tmp_path / "run.mcap", "rb") as fh:
        summary = make_reader(fh).get_summary()
    assert summary is not None and len(summary.chunk_indexes) == n
    assert summary.statistics is not None and summary.statistics.chunk_count == n


def test_report_reads_a_run_that_has_only_its_run_mcap(
        burst_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A run directory holding run.mcap alone, and a run.mcap given itself, load with the
    records and the manifest of cycles.jsonl's run; ``report`` and its trace build from it."""
    only = tmp_path / "only"
    only.mkdir()
    shutil.copy(burst_run / "run.mcap", only / "run.mcap")
    want = load_run(burst_run)
    for source in (only, burst_run / "run.mcap"):
        got = load_run(source)
        assert got.label == want.label and got.manifest == json.loads(
            (burst_run / "manifest.json").read_text())
        assert [r.to_dict() for r in got.records] == [r.to_dict() for r in want.records]
    assert main(["report", str(only), "--out", str(tmp_path / "rep"),
                 "--trace", str(tmp_path / "trace.json")]) == 0
    capsys.readouterr()
    assert "| 13 |" in (tmp_path / "rep" / "report.md").read_text()  # the cycles column
    trace = json.loads((tmp_path / "trace.json").read_text())
    cycles = [e for e in trace["traceEvents"]
              if e["ph"] == "X" and str(e.get("name", "")).startswith("cycle ")]
    assert len(cycles) == 13


def test_a_run_mcap_cut_short_gives_the_cycles_it_holds(
        burst_run: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """What a crash leaves (no closing index, a record cut in half): the cycles before the cut,
    with a warning, as cycles.jsonl does with a partial last line."""
    data = (burst_run / "run.mcap").read_bytes()
    records = read_records(burst_run / "cycles.jsonl")
    cut = tmp_path / "run.mcap"
    at = -1
    for _ in range(7):  # into the 7th record (chunks are uncompressed: its JSON is visible)
        at = data.index(b'"run_id"', at + 1)
    cut.write_bytes(data[: at + 10])
    got, manifest = read_run_mcap(cut)
    assert 0 < len(got) < len(records) and manifest == {}
    assert [r.to_dict() for r in got] == [r.to_dict() for r in records[: len(got)]]
    assert any("ends early" in r.getMessage() for r in caplog.records)
    (tmp_path / "bad.mcap").write_text("not an mcap file\n")
    with pytest.raises(RunDirError, match=r"bad\.mcap"):
        load_run(tmp_path / "bad.mcap")


LAYOUTS = Path(robot_latency.__file__).resolve().parent / "data" / "layouts"
PLOTTABLE = {"number", "integer", "boolean"}


def _field(schema: dict[str, Any], parts: list[str]) -> dict[str, Any]:
    """The schema of the field at ``parts`` (KeyError: no such field)."""
    for part in parts:
        schema = schema["properties"][part]
    return schema


def _types(schema: dict[str, Any]) -> set[str]:
    kind = schema.get("type")
    if kind is None and "enum" in schema:
        return {"string"}
    return {kind} if isinstance(kind, str) else set(kind or [])


def test_the_foxglove_layout_names_only_what_run_mcap_holds(burst_run: Path) -> None:
    schemas, _, _ = read_mcap(burst_run / "run.mcap")
    doc = json.loads((LAYOUTS / "foxglove_run.json").read_text())
    panels = doc["configById"]

    def leaves(node: Any) -> list[str]:
        return [node] if isinstance(node, str) else leaves(node["first"]) + leaves(node["second"])

    assert sorted(leaves(doc["layout"])) == sorted(panels)  # every panel placed, none missing
    named = []
    for panel_id, config in panels.items():
        for path in [p["value"] for p in config.get("paths", [])]:
            topic, _, field = path.partition(".")
            named.append(topic)
            field_schema = _field(schemas[topic], field.split("."))
            if panel_id.startswith("Plot!"):
                assert _types(field_schema) & PLOTTABLE, path
        named += [config[k] for k in ("topicPath", "topicToRender") if k in config]
    assert set(named) <= set(schemas)
    assert {EVENT_CHANNEL, LOG_CHANNEL, PLAN_CHANNEL, CYCLE_STATS_CHANNEL} <= set(named)


def test_the_plotjuggler_layout_names_only_what_run_mcap_holds(burst_run: Path) -> None:
    """PlotJuggler's JSON parser names a field ``TOPIC/a/b`` (nulls skipped, booleans 0/1)."""
    schemas, _, _ = read_mcap(burst_run / "run.mcap")
    root = ET.parse(LAYOUTS / "plotjuggler_run.xml").getroot()
    curves = [c.get("name") for c in root.iter("curve")]
    assert len(curves) >= 8
    for name in curves:
        assert name is not None
        topic = max((t for t in schemas if name.startswith(t + "/")), key=len)
        field = name[len(topic) + 1:].split("/")
        assert _types(_field(schemas[topic], field)) & PLOTTABLE, name
    files = root.findall("./previouslyLoaded_Datafiles/fileInfo")
    assert [f.get("filename") for f in files] == ["run.mcap"]
    params = files[0].find("./plugin[@ID='DataLoad MCAP']/parameters")
    assert params is not None
    assert set(params.get("selected_topics", "").split(";")) <= set(schemas)
