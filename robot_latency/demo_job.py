"""The main job: replay a bundled command stream through the real ROS 2 pipeline, per configuration.

For each configuration (a model file at a quantization level, or a simulated device) it starts the
``planner_node`` and the ``bag_replayer`` as separate processes talking over DDS (Fast DDS,
loopback only, a private domain id), waits until the stream has played, stops the node with
SIGINT (it flushes its cycle log and writes ``summary.json``), then compares the run directories
and writes the report, with the reaction time the replayer measured at the client edge
(``client.jsonl`` in each run directory) and the runs as a Perfetto trace (``trace.json``).
The node and the replayer are exactly what ``ros2 launch robot_latency replay.launch.py``
starts on a robot; only the launch system is replaced by this function.
"""

from __future__ import annotations

import json
import logging
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from robot_latency.errors import RobotLatencyError
from robot_latency.lifetime import popen
from robot_latency.planner.config import DEFAULT_TARGET_DEVICE, RunSettings
from robot_latency.progress import CycleLogFollower, CycleProgress
from robot_latency.rosenv import localhost_env, ros_args

log = logging.getLogger(__name__)

#: How often the replay wait looks at the node's cycle log (for the progress bar).
_POLL_S = 0.25


class DemoError(RobotLatencyError, RuntimeError):
    """A demo step failed; the message says which and where its log is."""


@dataclass(frozen=True)
class DemoConfig:
    """One configuration of the demo: a label, the planner node's parameters for it, and the
    bag replayer's beyond the stream (``send_via: action``: each command a PlanCommand goal)."""

    label: str
    params: dict[str, str | int | float | bool] = field(default_factory=dict)
    replayer: dict[str, str | int | float | bool] = field(default_factory=dict)


def _bin(name: str) -> str:
    """Return the console script next to this interpreter (the venv's), else the PATH's."""
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


def _wait_for(path: Path, proc: subprocess.Popen[bytes], timeout_s: float, what: str,
              log_path: Path) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if path.exists():
            return
        if proc.poll() is not None:
            raise DemoError(f"{what} exited with status {proc.returncode} before it was ready; "
                            f"see {log_path}")
        time.sleep(0.1)
    raise DemoError(f"{what} not ready after {timeout_s:.0f} s; see {log_path}")


def _play(cmd: list[str], env: dict[str, str], rlog: Any, *, cycle_log: Path,
          timeout_s: float, replay_log: Path, bar: CycleProgress) -> None:
    """Run the bag replayer to its end; meanwhile count the node's cycles into ``bar``."""
    follower = CycleLogFollower(cycle_log)
    replayer = popen(cmd, env=env, stdout=rlog, stderr=subprocess.STDOUT)
    end = time.monotonic() + timeout_s
    try:
        while True:
            try:
                replayer.wait(timeout=_POLL_S)
                break
            except subprocess.TimeoutExpired:
                bar.add(*follower.poll())
                if time.monotonic() > end:
                    raise DemoError(f"bag_replayer did not finish within {timeout_s:.0f} s; "
                                    f"see {replay_log}") from None
    finally:
        if replayer.poll() is None:
            replayer.kill()
            replayer.wait()
    bar.add(*follower.poll())
    if replayer.returncode != 0:
        raise DemoError(f"bag_replayer exited with status {replayer.returncode}; "
                        f"see {replay_log}")


def run_one(config: DemoConfig, *, stream: Path, run_dir: Path, speed: float = 1.0,
            start_timeout_s: float = 180.0, play_timeout_s: float = 900.0,
            tail_s: float = 30.0, progress: bool = False) -> Path:
    """Run the planner node and the bag replayer for one configuration; return the run dir.

    With ``progress``, a bar on stderr shows the node's cycles and misses while the stream
    plays (only when stderr is a terminal). ``tail_s`` bounds the replayer's wait for the last
    command's plan: it leaves as soon as that plan is in, so a loaded host's last plan is
    received, not counted unanswered.

    Raises:
        DemoError: a process failed or did not finish in time (the message names its log).
    """
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    env = {**localhost_env(), "ROS_DOMAIN_ID": str(random.randint(1, 200)),
           "PYTHONUNBUFFERED": "1"}
    node_log = run_dir.parent / f"{run_dir.name}.planner_node.log"
    replay_log = run_dir.parent / f"{run_dir.name}.bag_replayer.log"
    params = {**config.params, "log_dir": str(run_dir), "label": config.label}
    with open(node_log, "wb") as nlog, open(replay_log, "wb") as rlog:
        node = popen([_bin("planner_node"), *ros_args(params)], env=env,
                                stdout=nlog, stderr=subprocess.STDOUT)
        try:
            # The manifest appears once the engine has loaded and the loop is about to run.
            _wait_for(run_dir / "manifest.json", node, start_timeout_s, "planner_node",
                      node_log)
            with CycleProgress(desc=config.label, enabled=progress) as bar:
                _play([_bin("bag_replayer"), *ros_args({"bag": str(stream), "speed": speed,
                                                        "tail_s": tail_s,
                                                        "client_log_dir": str(run_dir),
                                                        **config.replayer})],
                      env, rlog, cycle_log=run_dir / "cycles.jsonl", timeout_s=play_timeout_s,
                      replay_log=replay_log, bar=bar)
        finally:
            if node.poll() is None:
                node.send_signal(signal.SIGINT)
                try:
                    node.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    node.kill()
                    node.wait()
    if not (run_dir / "summary.json").exists():
        raise DemoError(f"planner_node wrote no summary.json in {run_dir}; see {node_log}")
    return run_dir


def run_demo(configs: Sequence[DemoConfig], *, stream: Path, out_dir: Path,
             speed: float = 1.0, progress: bool = False,
             targets: dict[str, Any] | None = None,
             labels: Any = None) -> tuple[list[Path], Path]:
    """Run every configuration, then write the comparison and the report (``progress``: a bar
    of each replay's cycles and misses, when stderr is a terminal). ``targets``: per label, the
    level's inputs to the target's answer (the untimed pass), written into its run directory
    as ``target.json`` for the report's first section.

    Returns:
        The run directories and the report path.
    """
    from robot_latency.report.compare import compare_runs, to_csv, to_json
    from robot_latency.report.markdown import write_report
    from robot_latency.report.trace import write_trace

    out_dir.mkdir(parents=True, exist_ok=True)
    run_dirs = []
    for i, config in enumerate(configs, start=1):
        run_dir = out_dir / config.label.replace(" ", "_").replace("/", "-")
        if run_dir.exists():
            raise DemoError(f"{run_dir} exists; remove {out_dir} to run the demo again")
        log.info("[%d/%d] %s", i, len(configs), config.label)
        run_dirs.append(run_one(config, stream=stream, run_dir=run_dir, speed=speed,
                                progress=progress))
        if targets and config.label in targets:
            from robot_latency.planner.target_inputs import write_target_inputs

            write_target_inputs(targets[config.label], run_dir)
    rows = compare_runs(run_dirs)
    to_csv(rows, out_dir / "comparison.csv")
    to_json(rows, out_dir / "comparison.json")
    report = write_report(run_dirs, out_dir / "report", labels=labels)
    write_trace(run_dirs, out_dir / "report" / "trace.json")
    (out_dir / "demo.json").write_text(json.dumps(
        {"stream": str(stream), "speed": speed, "runs": [str(p) for p in run_dirs],
         "report": str(report)}, indent=2) + "\n")
    return run_dirs, report


def stream_labels_of(stream: Path) -> Any:
    """Return a bag's labels (its ``labels.jsonl``: the shipped streams have one), keyed by its
    command ids, or None when it has none (the bundled action language's schema)."""
    from robot_latency.profiles.actions import plan_json_schema
    from robot_latency.streams.reader import labels_of_stream

    return labels_of_stream(stream, schema=plan_json_schema())


#: The main job's output formats: the JSON planner (Qwen2's tokenizer, chat prompt, JSON plan)
#: and the compact action language of the first planner.
PLANNERS = {"json": ("planner-json", "bundled-json"), "compact": ("planner", "")}


@dataclass(frozen=True)
class MainJob:
    """The main job's options (``robot-latency demo``; ``make demo`` takes the defaults).

    The levels are the JSON planner's, what an instruct model writes (``planner="json"``), and
    ``compact_quant`` adds the compact action language at one level, for the output format's
    price. The stream's first ``commands`` (0: all) play at the operator's own pace (``speed``
    1): a JSON plan takes about a second on a 2-core machine, and the steady operator speaks
    every 1.6 s (median). 2,000 ms sits between the JSON levels' plan times there: the job shows
    how the miss rate moves with the quant level, not a row of zeros or of ones. A pause in the
    stream longer than ``max_pause_s`` (0: none shortened) is shortened to it: the planner is
    idle through it (4 s is twice the deadline), and the first 30 commands' five longer pauses
    would add 22.6 s to every level's replay.
    """

    out_dir: Path = Path("runs/demo")
    quants: tuple[str, ...] = ("Q8_0", "Q4_K_M", "Q4_0")
    planner: str = "json"
    compact_quant: str = "Q4_0"
    inflate: str = "qwen2.5-0.5b"
    stream: Path | None = None
    commands: int = 30
    max_pause_s: float = 4.0
    speed: float = 1.0
    mode: str = "event"
    deadline_ms: float = 2000.0
    period_ms: float = 2000.0
    device: str = DEFAULT_TARGET_DEVICE
    n_threads: int = 0
    context_tokens: int = 32
    profile: str = ""
    on_new_command: str = RunSettings().on_new_command
    send_via: str = "topic"


@dataclass(frozen=True)
class DemoLevel:
    """One level the main job times: its label, file and planner profile ("" the default)."""

    label: str
    quant: str
    path: Path
    profile: str
    size_bytes: int
    bpw: float


def demo_levels(job: MainJob, cache: Path) -> tuple[list[DemoLevel], list[str]]:
    """Build (or reuse) the job's levels in the model cache; return them and a line per ladder.

    Raises:
        DemoError: an unknown planner; LadderError: a level cannot be built.
    """
    from robot_latency.models.bundled import bundled_model_path
    from robot_latency.models.ladder import (
        INFLATED_PREFIX,
        JSON_INFLATED_PREFIX,
        build_ladder,
        ensure_inflated,
    )

    if job.planner not in PLANNERS:
        raise DemoError(f"planner {job.planner!r}: give one of {', '.join(PLANNERS)}")
    wanted = [(job.planner, q, q) for q in job.quants]
    if job.planner == "json" and job.compact_quant:
        wanted.append(("compact", job.compact_quant, f"compact-{job.compact_quant}"))
    levels, lines = [], []
    for planner in dict.fromkeys(p for p, _, _ in wanted):
        bundled, profile = PLANNERS[planner]
        t0 = time.perf_counter()
        name = (JSON_INFLATED_PREFIX if planner == "json" else INFLATED_PREFIX) + job.inflate
        src = ensure_inflated(bundled_model_path(bundled), job.inflate, cache, name=name)
        quants = tuple(q for p, q, _ in wanted if p == planner)
        man = build_ladder(src, cache, quants=quants, name=name)
        lines.append(f"{man.name}: built {', '.join(man.built) or 'nothing (all current)'} in "
                     f"{time.perf_counter() - t0:.1f} s")
        levels += [DemoLevel(label, q, man.path(q), (job.profile or profile)
                             if planner == job.planner else profile,
                             man.levels[q].bytes, man.levels[q].effective_bpw)
                   for p, q, label in wanted if p == planner]
    return levels, lines


def main_job(job: MainJob, say: Callable[[str], None]) -> Path:
    """Run the main job: build the levels, print their floors, replay the stream per level.

    Args:
        job: the options.
        say: prints one line of the job's output (the CLI's stdout).

    Returns:
        The report's path.

    Raises:
        DemoError: a step failed (the message names it); LadderError: a level cannot be built.
    """
    from robot_latency.floor.devices import DEVICES
    from robot_latency.floor.modelinfo import resolve_model
    from robot_latency.floor.predict import predict_floor
    from robot_latency.floor.probe import load_or_probe_host
    from robot_latency.models.ladder import default_cache_dir
    from robot_latency.report.client import edge_markdown
    from robot_latency.report.compare import compare_runs, to_markdown
    from robot_latency.report.correctness import correctness_markdown, correctness_rows
    from robot_latency.report.table import markdown_table
    from robot_latency.streams import SHIPPED_DIR

    t_start = time.perf_counter()
    out = Path(job.out_dir)
    if out.exists() and any(out.iterdir()):
        raise DemoError(f"{out} exists and is not empty; remove it or pass --out")
    if not job.quants:
        raise DemoError("quants: give at least one level")
    cache = default_cache_dir()
    extra = (f", and the compact action language at {job.compact_quant}"
             if job.planner == "json" and job.compact_quant else "")
    say(f"[1/3] models: the shipped {job.planner} planner inflated into the {job.inflate} "
        f"shape, levels {', '.join(job.quants)}{extra} (cache {cache})")
    levels, built = demo_levels(job, cache)
    for line in built:
        say(line)
    say(markdown_table(["level", "profile", "MB", "bits/weight", "file"],
                       [[lv.label, lv.profile or "default", f"{lv.size_bytes / 1e6:.1f}",
                         f"{lv.bpw:.2f}", str(lv.path)] for lv in levels]))
    stream = Path(job.stream) if job.stream else SHIPPED_DIR / "steady_operator"
    stream = first_commands(stream, job.commands, out / "stream",
                            max_pause_ns=round(job.max_pause_s * 1e9))
    say(f"\n[2/3] bandwidth floor of these files on this host and the Orin modules "
        f"(ms per token at {job.context_tokens} tokens of context):")
    host = load_or_probe_host()
    devices = [host, *(d for d in DEVICES.values() if d.family.startswith("orin"))]
    models = {lv.label: resolve_model(str(lv.path)) for lv in levels}
    ctx = job.context_tokens
    rows = [[d.id, f"{d.bandwidth_gbps:.4g}",
             *(f"{predict_floor(m, d, context_tokens=ctx).itl_floor_ms:.2f}"
               for m in models.values())] for d in devices]
    say(markdown_table(["device", "GB/s", *models], rows))
    paused = f", pauses over {job.max_pause_s:g} s shortened to it" if job.max_pause_s else ""
    say(f"\n[3/3] replaying {stream} (x{job.speed:g}{paused}) through planner_node and "
        f"bag_replayer over ROS 2 (Fast DDS), deadline {job.deadline_ms:g} ms, one "
        f"configuration per level")
    # The default CPU budget: the loop not pinned and woken early (it sleeps most of the
    # cycle), the engine niced on every core (its prefill threads use them all): the model gets
    # the machine, the fallback stays on time (robot_latency/planner/budget.py).
    configs = [DemoConfig(label=lv.label, params={
        "engine": "llamacpp", "model": str(lv.path), "target_device": job.device,
        "mode": job.mode, "deadline_ms": float(job.deadline_ms),
        "period_ms": float(max(job.period_ms, job.deadline_ms)),
        "on_new_command": job.on_new_command,
        **({"planner_profile": lv.profile} if lv.profile else {}),
        **({"n_threads": job.n_threads} if job.n_threads else {})},
        replayer={"send_via": job.send_via}) for lv in levels]
    targets = untimed_passes(job, levels, stream, say)
    labels = stream_labels_of(stream)
    runs, report = run_demo(configs, stream=stream, out_dir=out, speed=job.speed, progress=True,
                            targets=targets, labels=labels)
    say("")
    say(to_markdown(compare_runs(runs)))
    judged = correctness_rows(runs, labels=labels) if labels is not None else []
    if any(r.correct_n for r in judged):
        say("\n" + correctness_markdown(judged))
    say("\n" + edge_markdown(runs))
    price = report.read_text(encoding="utf-8").split("\n## The output format's price\n", 1)
    if len(price) == 2:
        say("\nThe output format's price" + price[1].split("\n## ", 1)[0].rstrip())
    say(f"\nreport with plots: {report}")
    say(f"demo finished in {time.perf_counter() - t_start:.0f} s")
    return report


def first_commands(stream: Path, n: int, out: Path, *, max_pause_ns: int = 0) -> Path:
    """Write the first ``n`` commands of ``stream`` (0: all) at ``out``; return what to replay
    (``stream`` itself where nothing is cut and no pause shortened). ``max_pause_ns`` > 0: a
    pause between two commands longer than that is shortened to it, the commands after it moved
    earlier by the difference (the planner is idle through such a pause; ROS 1's ``rosbag play
    --skip-empty`` does the same). A JSONL stream is written as ``out/stream.jsonl`` (its ids,
    states and labels kept); a bag as a bag at ``out``, with its states on the state topic and
    its ``labels.jsonl`` beside it. Camera frames are not carried (the main job is text-only)."""
    import shutil
    from dataclasses import replace

    from robot_latency.streams import read_stream, write_bag, write_jsonl
    from robot_latency.streams.convert import DEFAULT_STATE_TOPIC

    whole = read_stream(stream)
    shift, prev, paced = 0, None, []
    for c in whole.commands[:n] if n else whole.commands:
        if max_pause_ns > 0 and prev is not None:
            shift += max(0, c.t_ns - prev - max_pause_ns)
        prev = c.t_ns
        paced.append(replace(c, t_ns=c.t_ns - shift))
    if shift == 0 and len(paced) == len(whole.commands):
        return stream
    if whole.topic is None:  # a JSONL file
        out.mkdir(parents=True, exist_ok=True)
        return write_jsonl(out / "stream.jsonl", paced)
    has_state = any(c.state is not None for c in paced)
    write_bag(out, paced, state_topic=DEFAULT_STATE_TOPIC if has_state else None)
    labels = (stream if stream.is_dir() else stream.parent) / "labels.jsonl"
    if labels.is_file():
        shutil.copyfile(labels, out / "labels.jsonl")
    return out


def untimed_passes(job: MainJob, levels: Sequence[DemoLevel], stream: Path,
                   say: Callable[[str], None]) -> dict[str, Any]:
    """Run (or load from the cache) the untimed pass of ``stream`` per level: the facts of each
    command that do not depend on this host's speed (robot_latency.planner.untimed)."""
    from robot_latency.planner.target_inputs import untimed_inputs
    from robot_latency.streams import read_stream

    commands = read_stream(stream)
    out: dict[str, Any] = {}
    for lv in levels:
        t0 = time.perf_counter()
        settings = RunSettings(
            log_dir=Path(job.out_dir) / ".untimed", model=str(lv.path),
            target_device=job.device, mode=job.mode, deadline_ms=float(job.deadline_ms),
            period_ms=float(max(job.period_ms, job.deadline_ms)),
            on_new_command=job.on_new_command, profile=lv.profile or None,
            n_threads=job.n_threads)
        out[lv.label] = untimed_inputs(settings, commands, speed=job.speed)
        say(f"untimed pass {lv.label}: {len(commands.commands)} commands in "
            f"{time.perf_counter() - t0:.1f} s (key {out[lv.label].untimed.key[:12]})")
    return out
