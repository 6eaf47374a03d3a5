"""Starting and stopping a run's engine runner: inline, in a worker process, or the hybrid
(onboard worker raced against a server). The runners themselves are in
:mod:`~robot_latency.planner.runner` (protocol, inline), :mod:`~robot_latency.planner.worker`
(process) and :mod:`~robot_latency.planner.hybrid`; this module only picks and starts one
(named ``runner_factory`` rather than ``runners`` so it does not read like ``runner``)."""

from __future__ import annotations

import dataclasses

from robot_latency.clock import DEFAULT_CLOCK, Clock
from robot_latency.engines.base import EngineError
from robot_latency.errors import RobotLatencyError
from robot_latency.planner.budget import BudgetError
from robot_latency.planner.engine import create_planner_engine
from robot_latency.planner.loop import InlineRunner, Runner
from robot_latency.planner.resolve import ResolvedRun
from robot_latency.planner.worker import ProcessRunner


class RunError(RobotLatencyError):
    """A run that cannot start (bad log directory, model, engine); the message names it."""


def make_runner(cfg: ResolvedRun, clock: Clock = DEFAULT_CLOCK) -> Runner:
    """Start the run's engine runner (the model loaded; a worker process for ``process``).

    Raises:
        RunError: the CPU budget is invalid or the engine cannot load.
    """
    try:
        cfg.cpu.check()
    except BudgetError as err:
        raise RunError(f"cpu budget: {err}") from err
    if cfg.engine == "hybrid":
        return _make_hybrid_runner(cfg, clock)
    try:
        if cfg.runner == "inline":
            engine = create_planner_engine(cfg.engine, clock=clock, **cfg.engine_options)
            return InlineRunner(engine, clock=clock)
        runner = ProcessRunner(cfg.engine, cfg.engine_options,
                               hang_timeout_ms=cfg.settings.hang_timeout_ms, clock=clock,
                               worker_nice=cfg.cpu.engine_nice,
                               worker_cpus=cfg.cpu.resolved_engine_cpus(),
                               spin_ms=cfg.cpu.spin_ms, nap_ms=cfg.cpu.nap_ms)
        runner.start()
        return runner
    except (EngineError, RuntimeError) as err:
        raise RunError(f"engine {cfg.engine!r} could not start: {err}") from err


def _make_hybrid_runner(cfg: ResolvedRun, clock: Clock) -> Runner:
    """Start the onboard runner and the server client of a hybrid run."""
    from robot_latency.engines.openai_server import make_openai_engine
    from robot_latency.planner.hybrid import HybridRunner

    opts = cfg.engine_options
    onboard_cfg = dataclasses.replace(
        cfg, settings=dataclasses.replace(cfg.settings, engine=opts["onboard_engine"]),
        engine_options=dict(opts["onboard"]))
    onboard = make_runner(onboard_cfg, clock)
    try:
        server = make_openai_engine(clock=clock, contract=cfg.planning.contract, **opts["server"])
        return HybridRunner(onboard, server, cfg.planning.contract,
                            policy=opts["hybrid_policy"], clock=clock)
    except (EngineError, RobotLatencyError, ValueError) as err:
        close_runner(onboard)
        raise RunError(f"engine 'hybrid' could not start: {err}") from err


def close_runner(runner: Runner) -> None:
    """Stop a runner's engine (its worker process), if it has one to stop."""
    runner.close()
