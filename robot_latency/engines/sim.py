"""The simulated engine: per-step times from the floor model, with jitter, on any device datasheet.

It predicts what a real engine would do on a device you do not have. With an ``engine_family``
it makes the calibrated prediction of :mod:`robot_latency.floor.target`: each decode step takes
the bandwidth floor over the family's fitted efficiency plus its per-step overhead, and a prefill
the compute floor over the fitted compute efficiency plus its overhead (calibration from the
published table, or a file from ``robot-latency calibrate``). Without one, the step is the floor
over a fixed ``efficiency`` plus ``overhead_ms`` (a what-if knob). Every step is then multiplied
by a lognormal jitter, plus rare stalls. Deterministic under a seed. Time
passes through an injected ``sleep``: real sleeping with the real clock, ``clock.advance`` with a
:class:`~robot_latency.clock.ScriptedClock`, so tests run instantly and exactly.

Its output is a function of the prompt: ``responder``, a callable injected by whoever builds the
engine (the planner wires in the rule planner's reading of the command,
:func:`robot_latency.planner.engine.rule_responder`, so the loop sees valid plans of realistic
length). The engine layer itself knows no planner.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from robot_latency.clock import DEFAULT_CLOCK, Clock, WaitingClock
from robot_latency.engines.base import (
    AbortSignal,
    ClosesOnExit,
    EngineError,
    GenerationRequest,
    GenerationTrace,
    StopReason,
    note_tokens,
    register_engine,
)
from robot_latency.floor.devices import get_device
from robot_latency.floor.errors import FloorError
from robot_latency.floor.modelinfo import resolve_model
from robot_latency.floor.predict import predict_floor, prefill_params
from robot_latency.floor.target import resolve_calibration
from robot_latency.profiles.actions import END_TOKEN

#: Prompt in, the output's pieces out (action tokens, ``<end>`` last).
Responder = Callable[[str], list[str]]


def _load_jitter(path: str) -> np.ndarray:
    """Return a recorded run's inter-token gaps divided by their median."""
    from robot_latency.records import RecordError, read_records

    try:
        gaps = [g for r in read_records(path) for g in r.itl_ns]
    except RecordError as err:
        raise EngineError(f"sim: jitter_from: {err}") from err
    if len(gaps) < 10:
        raise EngineError(f"sim: jitter_from={path!r} holds {len(gaps)} inter-token gaps; "
                          "need at least 10")
    arr = np.asarray(gaps, dtype=np.float64)
    return arr / np.median(arr)


@dataclass(frozen=True)
class SimConfig:
    """What the simulated engine models.

    Args:
        device: device datasheet id (``host`` uses the cached probe).
        model: GGUF path or shape preset.
        quant: quant type for a preset.
        efficiency: fraction of the decode bandwidth floor reached (0, 1].
        compute_efficiency: fraction of peak FLOP/s a prefill reaches (0, 1].
        jitter_sigma: sigma of the lognormal multiplier on every step (0: none).
        jitter_from: a recorded run's cycles.jsonl: each step's multiplier is resampled from
            that run's inter-token gaps over their median (its real tail shape), instead of the
            lognormal.
        stall_probability: chance that a step stalls (a page fault, a preempted core).
        stall_ms: extra time of a stall.
        overhead_ms: fixed per-step overhead (kernel launches, sampling) added to the floor.
        tokens_per_word: prompt tokens per whitespace-separated word (no tokenizer here).
        cached_prefix_tokens: prompt tokens served from the prefix cache (not prefilled).
        busy_wait: spend simulated time spinning on a core instead of sleeping, to load the
            CPU the way a real CPU engine does (for measuring the loop under contention).
        seed: jitter seed.
        engine_family: predict with this engine family's calibration (``mlc``,
            ``llamacpp-cuda``, ...): efficiency, overhead and the prefill terms then come from
            it, not from the fields above. Empty: the fixed efficiency.
        calibration: a calibration file for ``engine_family`` on ``device`` (empty: the
            published table's).
    """

    device: str = "orin-nano-8gb"
    model: str = "qwen2.5-0.5b"
    quant: str | None = "Q4_K_M"
    efficiency: float = 0.4
    compute_efficiency: float = 0.3
    jitter_sigma: float = 0.05
    jitter_from: str = ""
    stall_probability: float = 0.0
    stall_ms: float = 0.0
    overhead_ms: float = 0.0
    tokens_per_word: float = 1.3
    cached_prefix_tokens: int = 0
    busy_wait: bool = False
    seed: int = 0
    engine_family: str = ""
    calibration: str = ""

    def __post_init__(self) -> None:
        for name in ("efficiency", "compute_efficiency"):
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise EngineError(f"sim: {name} must be in (0, 1], got {value!r}")
        if self.jitter_sigma < 0 or self.stall_ms < 0 or self.overhead_ms < 0:
            raise EngineError("sim: jitter_sigma, stall_ms and overhead_ms must be >= 0")
        if not 0 <= self.stall_probability <= 1:
            raise EngineError(f"sim: stall_probability must be in [0, 1], "
                              f"got {self.stall_probability!r}")


class SimEngine(ClosesOnExit):
    """A batch-1 engine whose timings come from the floor model (see the module docstring)."""

    name = "sim"

    def __init__(self, config: SimConfig | None = None, *, responder: Responder,
                 clock: Clock = DEFAULT_CLOCK,
                 sleep_ns: Callable[[int], Any] | None = None) -> None:
        self.config = config or SimConfig()
        self.clock = clock
        if sleep_ns is None:
            if isinstance(clock, WaitingClock):  # a scripted clock moves on instead of sleeping
                sleep_ns = clock.sleep_for
            elif self.config.busy_wait:
                sleep_ns = self._spin
            else:
                sleep_ns = lambda ns: time.sleep(ns / 1e9)  # noqa: E731
        self._sleep_ns = sleep_ns
        self._responder = responder
        self._rng = np.random.default_rng(self.config.seed)
        self._jitter_pool: np.ndarray | None = None
        if self.config.jitter_from:
            self._jitter_pool = _load_jitter(self.config.jitter_from)
        try:
            device = get_device(self.config.device)
            model = resolve_model(self.config.model, quant=self.config.quant)
            floor = predict_floor(model, device)
        except FloorError as err:
            raise EngineError(f"sim: {err}") from err
        self.efficiency, self.overhead_ms = self.config.efficiency, self.config.overhead_ms
        self.compute_efficiency, self.prefill_overhead_ms = self.config.compute_efficiency, 0.0
        self.calibration: dict[str, Any] | None = None
        if self.config.engine_family:
            try:
                cal = resolve_calibration(self.config.engine_family, device,
                                          calibration=self.config.calibration or None)
            except FloorError as err:
                raise EngineError(f"sim: {err}") from err
            self.efficiency, self.overhead_ms = cal.efficiency, cal.overhead_ms
            self.compute_efficiency = cal.compute_efficiency
            self.prefill_overhead_ms = cal.prefill_overhead_ms
            self.calibration = cal.describe()
        self.device_id = device.id
        self.model_name = model.name
        self.step_floor_ns = floor.itl_floor_ms * 1e6
        self.kv_ns_per_token = model.kv_bytes_per_token / (device.bandwidth_gbps * 1e9) * 1e9
        peak = device.peak_flops
        # ns per prompt token at the compute floor (None: device without a FLOP/s figure).
        self.prefill_ns_per_token = (
            None if peak is None else 2.0 * prefill_params(model) / peak * 1e9)

    def _spin(self, ns: int) -> None:
        end = self.clock() + ns
        while self.clock() < end:
            pass

    def info(self) -> dict[str, Any]:
        """Return the configuration and the floor it derives its timings from."""
        return {"engine": self.name, **asdict(self.config), "device_id": self.device_id,
                "model_name": self.model_name, "step_floor_ms": self.step_floor_ns / 1e6,
                "efficiency_in_effect": self.efficiency,
                "overhead_ms_in_effect": self.overhead_ms, "calibration": self.calibration}

    def close(self) -> None:
        """Nothing to release."""

    def _jitter(self) -> float:
        if self._jitter_pool is not None:
            return float(self._jitter_pool[self._rng.integers(self._jitter_pool.size)])
        if self.config.jitter_sigma == 0:
            return 1.0
        return float(self._rng.lognormal(0.0, self.config.jitter_sigma))

    def _step_ns(self, context_tokens: int) -> int:
        cfg = self.config
        base = (self.step_floor_ns + self.kv_ns_per_token * context_tokens) / self.efficiency
        ns = base * self._jitter() + self.overhead_ms * 1e6
        if cfg.stall_probability and self._rng.random() < cfg.stall_probability:
            ns += cfg.stall_ms * 1e6
        return max(1, int(ns))

    def generate(self, request: GenerationRequest, *,
                 abort: AbortSignal | None = None) -> GenerationTrace:
        """Simulate one generation; stops at the deadline, on abort, at <end> or max tokens."""
        cfg = self.config
        # The output is decided up front, outside the timed path: the responder stands in for
        # the model's arithmetic, whose time the floor model supplies.
        pieces = self._responder(request.prompt)
        trace = GenerationTrace(started_ns=self.clock())
        prompt_tokens = max(1, round(len(request.prompt.split()) * cfg.tokens_per_word))
        cached = min(cfg.cached_prefix_tokens, prompt_tokens - 1)
        trace.prompt_tokens, trace.prefix_cache_tokens = prompt_tokens, cached
        trace.tokenized_ns = self.clock()
        if self.prefill_ns_per_token is not None:
            prefill = (prompt_tokens - cached) * self.prefill_ns_per_token
            prefill = prefill / self.compute_efficiency + self.prefill_overhead_ms * 1e6
            self._sleep_ns(int(prefill * self._jitter()))
        trace.prefill_chunk_ns.append(self.clock())
        context = prompt_tokens
        stop = StopReason.MAX_TOKENS
        for i, piece in enumerate(pieces[: request.max_tokens]):
            if abort is not None and abort.is_set():
                stop = StopReason.ABORTED
                break
            if request.deadline_ns is not None and self.clock() >= request.deadline_ns:
                stop = StopReason.DEADLINE
                break
            if i > 0:  # the first token comes out of the prefill pass itself
                step = self._step_ns(context)
                if (request.deadline_ns is not None
                        and self.clock() + step > request.deadline_ns):
                    # Modelled as an abort that lands exactly at the deadline: the simulated
                    # engine predicts timings; a real engine's abort latency is measured.
                    self._sleep_ns(request.deadline_ns - self.clock())
                    stop = StopReason.DEADLINE
                    break
                self._sleep_ns(step)
            trace.token_ns.append(self.clock())
            trace.tokens.append(i)
            note_tokens(abort, i + 1)
            context += 1
            if piece == END_TOKEN:
                stop = StopReason.DONE
                break
            trace.text += piece
        else:
            if len(pieces) <= request.max_tokens:
                stop = StopReason.DONE
        trace.stop_reason = stop
        trace.finished_ns = self.clock()
        return trace


@register_engine("sim")
def make_sim_engine(*, clock: Clock = DEFAULT_CLOCK, sleep_ns: Callable[[int], Any] | None = None,
                    responder: Responder | None = None, **options: Any) -> SimEngine:
    """Create a :class:`SimEngine` from keyword options (the fields of :class:`SimConfig`).

    Raises:
        EngineError: no ``responder`` (the engine plays what its builder injects), or a bad
            option.
    """
    if responder is None:
        raise EngineError("sim: no responder: the simulated engine needs a callable from prompt "
                          "to output pieces (the planner passes the rule planner's)")
    try:
        config = SimConfig(**options)
    except TypeError as err:
        raise EngineError(f"sim: {err}") from err
    return SimEngine(config, clock=clock, sleep_ns=sleep_ns, responder=responder)
