"""The warm-up generation a live planner runs before it says it is ready.

A freshly loaded engine is slow on its first generation, although the fixed prefix was
evaluated at load. Measured on the shipped planner model (llama.cpp, this 2-core host, busy):
the first cycle's prefill of its per-cycle prompt took 851 ms, every later one about 2 ms. A
warm-up on the one-word command ``stop`` did not pay that cost (18 ms, and the first real
prefill still took 851 ms); one on a command of a few words did (about 1 s, then 6 ms). So the
warm-up plans :data:`WARM_UP_COMMAND`, an ordinary command of several words, in the loop's own
thread (its CPU budget in effect), with the profile's real prompt: one short generation whose
output is thrown away. Nothing is published, nothing is recorded as a cycle; the run's
manifest and summary keep what it took (``warm_up``).
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Any

from robot_latency.engines.base import GenerationRequest
from robot_latency.planner.loop import PlannerLoop

log = logging.getLogger(__name__)

#: The command the warm-up plans (never published): several words, as operators' commands are.
WARM_UP_COMMAND = "pick up the red cup and put it on the tray"
#: Tokens generated at most: the first decodes are the cold ones.
WARM_UP_MAX_TOKENS = 8
#: The warm-up is given up after this long at least (ms), or the loop's deadline if longer: it
#: is start-up, not a cycle. Given up at the deadline (1.5 s), a cold first generation on this
#: busy 2-core host was cut off before its first token, and the first goal was still late.
WARM_UP_LIMIT_MS = 30_000.0


@dataclass
class WarmUp:
    """What the warm-up generation took.

    Args:
        status: the runner's outcome (``ok``, ``timeout``, ``error``, ``unavailable``).
        elapsed_ms: its request to its answer (a given-up one: until the engine was free).
        tokens_out: tokens it generated (0 when it had no trace).
        error: the engine's error, if any (the run goes on: each cycle handles its own).
        started_ns, ended_ns: its request and its end (the engine free again) on the loop's
            clock (the planner node's cold-start record places it among its start-up events).
    """

    status: str
    elapsed_ms: float
    tokens_out: int = 0
    error: str | None = None
    started_ns: int | None = None
    ended_ns: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def warm_up(loop: PlannerLoop, command: str = WARM_UP_COMMAND) -> WarmUp:
    """Run one generation of ``command`` through ``loop``'s runner, given up after the loop's
    deadline or :data:`WARM_UP_LIMIT_MS`, the longer, and wait until the engine is free again
    (an aborted generation finished).

    Call it in the loop's thread before the loop runs. Never raises for the engine.
    """
    deadline_ns = round(max(loop.config.deadline_ms, WARM_UP_LIMIT_MS) * 1e6)
    start = loop.clock()
    give_up = start + deadline_ns
    prompt = loop.planning.build(command, None)
    request = GenerationRequest(prompt=prompt.suffix, prefix=prompt.prefix,
                                max_tokens=min(loop.max_tokens, WARM_UP_MAX_TOKENS),
                                deadline_ns=give_up, grammar=loop.grammar,
                                stop=loop.planning.stop, complete=loop.planning.contract.kind,
                                messages=loop.planning.messages(command, None))
    outcome = loop.runner.run(request, give_up_ns=give_up)
    if outcome.status in ("timeout", "preempted"):
        # the engine finishes the aborted request first; the first cycle must not wait for it
        loop.runner.collect_aborted(loop.clock() + deadline_ns)
    trace, end = outcome.trace, loop.clock()
    result = WarmUp(status=outcome.status, elapsed_ms=(end - start) / 1e6,
                    tokens_out=len(trace.token_ns) if trace is not None else 0,
                    error=outcome.error, started_ns=start, ended_ns=end)
    log.info("warm-up generation: %s, %d tokens, %.1f ms%s", result.status, result.tokens_out,
             result.elapsed_ms, f" ({result.error})" if result.error else "")
    return result
