"""The untimed pass: what each command asks of the model, whatever this host's speed.

Some facts about a command do not depend on how fast this host is: its uncached prompt tokens,
the output tokens of its complete plan, the plan itself and the stop reason. The untimed pass
takes them by running the run's own engine (llama.cpp, the simulated engine, ...) on every
command of a stream with no deadline, under the same planner profile, grammar and sampling as
the timed run. The target's answer (:mod:`robot_latency.planner.target_sim`) is built from
them; the timed run goes on measuring this host.

A pass is run once per (model file, profile, stream) and cached by content hash
(:func:`untimed_key`): the model file's sha256, the profile's sha256, the commands' text and
state, the engine and the settings that change the output (max tokens, grammar). Arrival times
are not in the key: a faster replay reuses the pass.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from robot_latency.digest import sha256_file
from robot_latency.engines.base import GenerationRequest, StopReason
from robot_latency.errors import RobotLatencyError
from robot_latency.planner.engine import create_planner_engine
from robot_latency.planner.resolve import ResolvedRun
from robot_latency.profiles.actions import PlanParseError
from robot_latency.profiles.contract import complete_plan
from robot_latency.streams import CommandStream

log = logging.getLogger(__name__)

#: Version of the cached file's shape; a change makes old entries misses.
UNTIMED_FORMAT = 1
#: Commands a llama.cpp pass decodes together (``run_untimed``'s ``sequences``).
DEFAULT_SEQUENCES = 32
#: The file an untimed pass is written to in a run directory.
UNTIMED_FILE = "untimed.json"
#: Engine options that change how fast, not what, the engine generates.
_TIMING_ONLY = frozenset({"n_threads", "n_threads_batch", "busy_wait", "jitter_sigma",
                          "jitter_from", "stall_probability", "stall_ms", "seed", "device",
                          "efficiency", "compute_efficiency", "overhead_ms", "engine_family",
                          "calibration"})


class UntimedError(RobotLatencyError, ValueError):
    """An untimed pass cannot be run or read; the message names the file or the field."""


@dataclass(frozen=True)
class UntimedCommand:
    """One command's facts from the untimed pass.

    ``asked`` is False for a command the loop refuses before asking the model (empty, too long,
    control characters): it gets a fallback on any host. ``plan_valid``: the output is a
    complete plan the contract accepts (a fallback answers otherwise, on any host).
    """

    command_id: str
    asked: bool
    prompt_tokens: int = 0
    uncached_prompt_tokens: int = 0
    tokens_out: int = 0
    stop_reason: str | None = None
    plan_valid: bool = False
    plan: dict[str, Any] | None = None
    text: str = ""


@dataclass(frozen=True)
class UntimedPass:
    """The untimed pass of one (model file, profile, stream)."""

    key: str
    engine: str
    model: str | None
    profile: str
    stream: str
    max_tokens: int
    commands: tuple[UntimedCommand, ...]

    def by_id(self) -> dict[str, UntimedCommand]:
        return {c.command_id: c for c in self.commands}

    def to_dict(self) -> dict[str, Any]:
        return {"format": UNTIMED_FORMAT, "key": self.key, "engine": self.engine,
                "model": self.model, "profile": self.profile, "stream": self.stream,
                "max_tokens": self.max_tokens, "commands": [asdict(c) for c in self.commands]}

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, where: str = "untimed pass") -> UntimedPass:
        """Rebuild a pass from its JSON form.

        Raises:
            UntimedError: a missing or mistyped field (named with ``where``).
        """
        try:
            if data.get("format") != UNTIMED_FORMAT:
                raise UntimedError(f"{where}: format {data.get('format')!r}, expected "
                                   f"{UNTIMED_FORMAT}")
            commands = tuple(UntimedCommand(**c) for c in data["commands"])
            return cls(key=str(data["key"]), engine=str(data["engine"]), model=data["model"],
                       profile=str(data["profile"]), stream=str(data["stream"]),
                       max_tokens=int(data["max_tokens"]), commands=commands)
        except (KeyError, TypeError, ValueError) as err:
            if isinstance(err, UntimedError):
                raise
            raise UntimedError(f"{where}: bad field: {err}") from err


def write_untimed(up: UntimedPass, path: str | os.PathLike[str]) -> Path:
    """Write ``up`` as JSON to ``path`` (atomically: a reader never sees half a file)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps(up.to_dict(), indent=1) + "\n", encoding="utf-8")
    tmp.replace(p)
    return p


def read_untimed(path: str | os.PathLike[str]) -> UntimedPass:
    """Read an untimed pass written by :func:`write_untimed`.

    Raises:
        UntimedError: the file cannot be read or is not an untimed pass (names the file).
    """
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise UntimedError(f"{path}: cannot read an untimed pass: {err}") from err
    if not isinstance(data, dict):
        raise UntimedError(f"{path}: not an untimed pass (a JSON object expected)")
    return UntimedPass.from_dict(data, where=str(path))


def _model_digest(model: str | None) -> str | None:
    if model is None or not Path(model).is_file():
        return model  # a preset (the sim engine) is its own content
    return sha256_file(model)


def untimed_key(run: ResolvedRun, stream: CommandStream) -> str:
    """Return the content hash a pass of ``stream`` under ``run`` is cached by."""
    opts = run.engine_options.get("onboard", run.engine_options)
    spec = {
        "format": UNTIMED_FORMAT, "engine": run.engine,
        "model": _model_digest(opts.get("model_path") or run.model),
        "quant": run.quant, "profile": run.planning.profile.sha256 or run.planning.profile.name,
        "max_tokens": run.settings.max_tokens or run.planning.max_tokens,
        "grammar": run.settings.grammar, "max_command_chars": run.settings.max_command_chars,
        "options": {k: str(v) for k, v in sorted(opts.items())
                    if k not in _TIMING_ONLY and k != "model_path"},
        "commands": [[c.command_id, c.text, c.state] for c in stream.commands],
    }
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()


def _refusal(text: str, max_command_chars: int) -> str | None:
    """The loop's own refusals (PlannerLoop._command_problem): the model is never asked."""
    if not text.strip():
        return "empty command"
    if len(text) > max_command_chars:
        return "too long"
    if any(ord(c) < 32 and c not in "\t\n\r" for c in text) or "\ufffd" in text:
        return "control characters"
    return None


def _judge(run: ResolvedRun, stop: StopReason, text: str) -> dict[str, Any] | None:
    """The loop's judgement of a finished output: the plan it would publish, or None."""
    contract = run.planning.contract
    if stop not in (StopReason.DONE, StopReason.COMPLETE):
        return complete_plan(contract, text)
    try:
        return contract.parse(text)
    except PlanParseError:
        return None


def _engine(run: ResolvedRun) -> Any:
    if run.engine == "hybrid":
        opts = run.engine_options
        return create_planner_engine(opts["onboard_engine"], **opts["onboard"])
    if run.engine == "sim":  # no time to spend: the pass is untimed
        return create_planner_engine("sim", sleep_ns=lambda ns: None,
                                     **run.engine_options)
    return create_planner_engine(run.engine, **run.engine_options)


@dataclass(frozen=True)
class _Facts:
    """What the pass keeps of one generation."""

    prompt_tokens: int
    uncached_prompt_tokens: int
    tokens_out: int
    stop_reason: StopReason
    text: str


def _llama_options(run: ResolvedRun) -> dict[str, Any] | None:
    """The llama.cpp engine's options where the pass's engine is one that batches (plain
    greedy llama.cpp, on its own or the hybrid's onboard one), else None."""
    opts = run.engine_options
    if run.engine == "hybrid" and opts.get("onboard_engine") == "llamacpp":
        opts = opts["onboard"]
    elif run.engine != "llamacpp":
        return None
    return None if opts.get("draft") else dict(opts)


def _batched(options: dict[str, Any], requests: list[GenerationRequest],
             sequences: int) -> list[_Facts]:
    """Decode the requests ``sequences`` at a time (:mod:`robot_latency.engines.llama_batch`):
    the batch-1 engine's outputs and prompt caching, in a fraction of its time."""
    from robot_latency.engines.base import EngineError
    from robot_latency.engines.llama_batch import greedy_batch

    warm = options.get("warm_prefix", "")
    # its own context is not used: nothing to warm
    with create_planner_engine("llamacpp", **{**options, "warm_prefix": ""}) as engine:
        try:
            outs = greedy_batch(engine, requests, n_seq=sequences, warm_prefix=warm)
        except EngineError as err:
            raise UntimedError(f"untimed pass: the engine failed: {err}") from err
    return [_Facts(len(o.prompt_tokens), max(1, len(o.prompt_tokens) - o.prefix_cache_tokens),
                   len(o.tokens), o.stop_reason, o.text) for o in outs]


def _one_by_one(run: ResolvedRun, stream: CommandStream,
                asked: list[tuple[int, GenerationRequest]],
                progress: Callable[[int, int], None] | None) -> list[_Facts]:
    """Generate the requests one at a time through the run's engine, as the loop does."""
    out = []
    with _engine(run) as engine:
        for i, request in asked:
            trace = engine.generate(request)
            if trace.stop_reason == StopReason.ERROR:
                raise UntimedError(f"untimed pass, command {stream.commands[i].command_id}: "
                                   f"the engine failed: {trace.error}")
            out.append(_Facts(trace.prompt_tokens,
                              max(1, trace.prompt_tokens - trace.prefix_cache_tokens),
                              len(trace.token_ns), trace.stop_reason, trace.text))
            if progress is not None:
                progress(i + 1, len(stream.commands))
    return out


def run_untimed(run: ResolvedRun, stream: CommandStream, *,
                cache_dir: str | os.PathLike[str] | None = None,
                progress: Callable[[int, int], None] | None = None,
                sequences: int = DEFAULT_SEQUENCES) -> UntimedPass:
    """Return the untimed pass of ``stream`` under ``run``: from the cache, else run it.

    Args:
        run: the resolved run whose engine, profile and settings the pass uses.
        stream: the commands (their arrival times are not used).
        cache_dir: where passes are cached by content hash (None: not cached).
        progress: called with (done, total) after each command (batched: once, at the end).
        sequences: greedy llama.cpp decodes this many commands together (the same outputs
            as one at a time, :mod:`robot_latency.engines.llama_batch`); 1, or another
            engine: one at a time through the run's engine. Not in the cache key.

    Raises:
        UntimedError: the engine failed on a command (names it), or a cached file is broken.
        EngineError: the engine cannot be created.
    """
    key = untimed_key(run, stream)
    cached = None if cache_dir is None else Path(cache_dir) / f"{key}.json"
    if cached is not None and cached.is_file():
        try:
            up = read_untimed(cached)
            if up.key == key:
                log.info("untimed pass: cached %s", cached)
                return up
        except UntimedError as err:
            log.warning("untimed pass: %s; running it again", err)
    planning, cfg = run.planning, run.settings
    grammar = planning.contract.grammar if cfg.grammar else None
    max_tokens = cfg.max_tokens or planning.max_tokens
    asked: list[tuple[int, GenerationRequest]] = []
    state: str | None = None
    for i, c in enumerate(stream.commands):
        state = c.state if c.state is not None else state
        if _refusal(c.text, cfg.max_command_chars) is None:
            prompt = planning.build(c.text, state)
            asked.append((i, GenerationRequest(
                prompt=prompt.suffix, prefix=prompt.prefix, max_tokens=max_tokens,
                deadline_ns=None, grammar=grammar, stop=planning.stop,
                complete=planning.contract.kind, messages=planning.messages(c.text, state))))
    llama = _llama_options(run)
    if llama is not None and sequences > 1 and len({r.prefix for _, r in asked}) == 1:
        facts = _batched(llama, [r for _, r in asked], sequences)
        if progress is not None:
            progress(len(stream.commands), len(stream.commands))
    else:
        facts = _one_by_one(run, stream, asked, progress)
    by_index = {i: f for (i, _), f in zip(asked, facts, strict=True)}
    out: list[UntimedCommand] = []
    for i, c in enumerate(stream.commands):
        f = by_index.get(i)
        if f is None:
            out.append(UntimedCommand(c.command_id, asked=False))
            continue
        plan = _judge(run, f.stop_reason, f.text)
        out.append(UntimedCommand(
            c.command_id, asked=True, prompt_tokens=f.prompt_tokens,
            uncached_prompt_tokens=f.uncached_prompt_tokens, tokens_out=f.tokens_out,
            stop_reason=f.stop_reason.value, plan_valid=plan is not None, plan=plan,
            text=f.text))
    up = UntimedPass(key=key, engine=run.engine, model=run.model,
                     profile=planning.profile.name, stream=stream.source,
                     max_tokens=max_tokens, commands=tuple(out))
    if cached is not None:
        write_untimed(up, cached)
    return up
