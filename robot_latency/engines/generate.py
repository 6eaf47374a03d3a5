"""The generate loop the local engines share (llama.cpp, ONNX Runtime): timing, stops, outcome.

An engine that runs the model itself brings only what is its own: how it tokenizes, how it
evaluates a batch of tokens (``run_chunk``), and the per-token steps of :class:`DecodeSteps`
(pick a token, tell an end-of-generation token, detokenize, evaluate the token picked). The loop
around them is written once here:

    generation(): trace started ─► body ─► trace finished (an exception: an error trace)
    tokenized():  tokenized stamp, prompt size, context check
    prefill():    per chunk: abort/deadline check ─► run_chunk ─► chunk stamp
    decode():     per token: clock ─► sample ─► clock (token stamp, sample time)
                  ─► end token? ─► text ─► stop string / complete plan / max tokens / abort /
                  deadline? ─► feed the token ─► ...
                  then the text (cut at a stop string) and the stop reason

The clock is read at those points only (plus where an engine's own step reads it), so a
scripted clock gives a deterministic trace. The server engine
(:mod:`robot_latency.engines.openai_server`) times streamed chunks, not tokens it picks, and the
simulated engine (:mod:`robot_latency.engines.sim`) plays its timings: neither uses this loop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Protocol

from robot_latency.clock import Clock
from robot_latency.engines.base import (
    AbortSignal,
    EngineError,
    GenerationRequest,
    GenerationTrace,
    StopReason,
    note_tokens,
    stop_after_token,
    stop_reason_now,
)


class DecodeSteps(Protocol):
    """What one engine does per generated token (its own part of :func:`decode`)."""

    def sample(self, started_ns: int) -> int:
        """Pick the next token; ``started_ns`` is the clock read just before (for the engine's
        own phase times, e.g. the grammar mask's)."""
        ...

    def is_end(self, token: int) -> bool:
        """Whether ``token`` ends the generation (any end-of-generation token)."""
        ...

    def piece(self, token: int) -> bytes:
        """Return the text bytes of ``token`` (after any grammar state has taken it)."""
        ...

    def feed(self, token: int) -> bool:
        """Evaluate ``token`` for the next pick; False when the engine was stopped inside it."""
        ...


def stopped_by(abort: AbortSignal | None) -> StopReason:
    """Return why an engine was stopped inside a pass: the caller's abort, else the deadline."""
    return StopReason.ABORTED if abort is not None and abort.is_set() else StopReason.DEADLINE


def shared_prefix_len(cached: Sequence[int], tokens: Sequence[int]) -> int:
    """Return how many leading tokens ``tokens`` shares with ``cached``, leaving at least one
    token of ``tokens`` to run (its pass gives the logits)."""
    keep = 0
    limit = min(len(cached), len(tokens) - 1)
    while keep < limit and cached[keep] == tokens[keep]:
        keep += 1
    return keep


def cut_at_stop(text: str, stop: Sequence[str]) -> str:
    """Return ``text`` up to the first of the ``stop`` strings (each in turn), not included."""
    for s in stop:
        if s and s in text:
            text = text[: text.index(s)]
    return text


def generation(name: str, clock: Clock, logger: logging.Logger,
               body: Callable[[GenerationTrace], None],
               reset: Callable[[], None]) -> GenerationTrace:
    """Run ``body`` on a new trace; never raise for a run-time failure.

    Args:
        name: the engine's name, in the warning logged for a failure.
        clock: the engine's clock (the trace's start and finish stamps).
        logger: the engine module's logger.
        body: fills the trace.
        reset: called after a failure (the engine's KV state is unknown: start clean).

    Returns:
        The trace; an exception in ``body`` makes it ``stop_reason="error"`` with ``error``.
    """
    trace = GenerationTrace(started_ns=clock())
    try:
        body(trace)
    except Exception as err:  # a broken model or request must not take the worker down
        logger.warning("%s generation failed: %r", name, err)
        trace.stop_reason, trace.error = StopReason.ERROR, f"{type(err).__name__}: {err}"
        reset()
    finally:
        trace.finished_ns = clock()
    return trace


def tokenized(trace: GenerationTrace, clock: Clock, tokens: Sequence[int],
              request: GenerationRequest, n_ctx: int, context: str) -> None:
    """Stamp the end of tokenizing and the prompt's size; refuse a prompt that cannot fit.

    Raises:
        EngineError: prompt + ``max_tokens`` exceed ``n_ctx`` (``context`` names the limit).
    """
    trace.tokenized_ns = clock()
    trace.prompt_tokens = len(tokens)
    if len(tokens) + request.max_tokens > n_ctx:
        raise EngineError(f"prompt of {len(tokens)} tokens + max_tokens "
                          f"{request.max_tokens} exceeds {context}")


def prefill(request: GenerationRequest, abort: AbortSignal | None, trace: GenerationTrace,
            clock: Clock, tokens: list[int], keep: int, chunk_tokens: int,
            run_chunk: Callable[[list[int]], bool]) -> StopReason | None:
    """Evaluate ``tokens[keep:]`` in chunks, with an abort/deadline check before each.

    Returns:
        None when the prefill finished; else why it stopped (also set on the trace).
    """
    for start in range(keep, len(tokens), chunk_tokens):
        stop = stop_reason_now(request, abort, clock())
        if stop is None and not run_chunk(tokens[start: start + chunk_tokens]):
            stop = stopped_by(abort)
        if stop is not None:
            trace.stop_reason = stop
            return stop
        trace.prefill_chunk_ns.append(clock())
    return None


def decode(request: GenerationRequest, abort: AbortSignal | None, trace: GenerationTrace,
           clock: Clock, steps: DecodeSteps) -> int:
    """Generate token by token until a stop; fill the trace's tokens, stamps, text and reason.

    Returns:
        The time spent picking tokens (ns), also in ``phases_extra_ns["sample"]``.
    """
    sample_ns = 0
    text_bytes = b""
    stop_reason = StopReason.MAX_TOKENS
    for i in range(request.max_tokens):
        t0 = clock()
        token = steps.sample(t0)
        now = clock()
        sample_ns += now - t0
        trace.token_ns.append(now)
        trace.tokens.append(token)
        note_tokens(abort, i + 1)
        if steps.is_end(token):
            stop_reason = StopReason.DONE
            break
        text_bytes += steps.piece(token)
        stop = stop_after_token(request, text_bytes, i + 1, abort, clock())
        if stop is not None:
            stop_reason = stop
            break
        if not steps.feed(token):
            stop_reason = stopped_by(abort)
            break
    trace.text = cut_at_stop(text_bytes.decode("utf-8", errors="replace"), request.stop)
    trace.stop_reason = stop_reason
    trace.phases_extra_ns["sample"] = sample_ns
    return sample_ns
