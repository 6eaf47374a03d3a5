"""Many greedy generations decoded together in one llama.cpp batch, for work nobody times.

The llama.cpp engine (:mod:`robot_latency.engines.llamacpp`) runs one prompt at a time, as a robot
does. Work that only wants the outputs (the untimed pass, :mod:`robot_latency.planner.untimed`)
can decode several prompts at once: each decode call carries one token of every sequence still
generating, so the weights are read once for all of them. On one CPU thread here a step of 8
tokens cost 3.2 batch-1 steps, and the demo's pass took 0.57 of the CPU time of one prompt at a
time; a step of several tokens also runs on the prefill's threads (``n_threads_batch``).

    one context, ``n_seq + 1`` sequences, each in its own KV stream (``kv_unified`` off: a
    sequence attends to its own cells only, laid out as at batch 1)
    seq 0: the fixed prefix, evaluated once ─► copied into a free sequence per prompt
    a new prompt: its own part prefilled in a call of its own ─► its first token picked
    per step: one token per generating sequence ─► decode
             ─► each sequence's grammar sampler picks its token from its own logits
             ─► the batch-1 loop's stops (end token, stop string, complete output, max tokens)
    a finished sequence's slot takes the next prompt (continuous batching)

The outputs are those of the engine's batch-1 greedy path: the same tokenization, the same
grammar-constrained greedy sampler (``GreedyGrammarSampler``), the same stop rules;
``test/engines/test_llama_batch.py`` holds them equal through real llama.cpp. Greedy only (a
sampled output depends on the order its random numbers are drawn); no deadline, no abort.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from robot_latency.engines.base import (
    EngineError,
    GenerationRequest,
    StopReason,
    stop_after_token,
)
from robot_latency.engines.generate import cut_at_stop, shared_prefix_len
from robot_latency.engines.llama_sampling import GreedyGrammarSampler
from robot_latency.engines.llamacpp import LlamaCppEngine

log = logging.getLogger(__name__)

#: Sequences decoded together by default. A decode step's cost on a CPU grows with its tokens
#: but far slower than one step per token: the demo's 30 commands at one level took 143 s of CPU
#: one at a time, 98 s 8 at a time, 89 s 16, 81 s all at once (docs/BENCHMARKS.md, "The
#: untimed pass, batched"). The KV cache holds ``n_seq + 1`` streams of a prompt and its output.
DEFAULT_SEQUENCES = 32
#: KV cells are handed out in blocks of this many per stream.
_CELL_BLOCK = 256


@dataclass(frozen=True)
class BatchOutput:
    """One request's greedy output: what a batch-1 ``generate`` of it puts on its trace."""

    prompt_tokens: tuple[int, ...]  # the whole prompt, prefix first
    tokens: tuple[int, ...]  # generated, the end token included when it came
    text: str
    stop_reason: StopReason
    #: the prompt's leading tokens the batch-1 engine finds in its KV cache when it runs the
    #: requests in order (its ``trace.prefix_cache_tokens``; :func:`cached_in_order`)
    prefix_cache_tokens: int = 0


@dataclass
class _Seq:
    index: int  # the request's position
    request: GenerationRequest
    prompt: list[int]
    sampler: Any
    n_past: int = 0
    tokens: list[int] = field(default_factory=list)
    text_bytes: bytes = b""


class _Batch:
    """A ``llama_batch`` of up to ``size`` tokens, each in one sequence."""

    def __init__(self, llama_cpp: Any, size: int) -> None:
        self._llama_cpp, self.size = llama_cpp, size
        self.batch = llama_cpp.llama_batch_init(size, 0, 1)
        self.n = 0

    def add(self, token: int, pos: int, seq: int, logits: bool) -> int:
        b, i = self.batch, self.n
        b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = token, pos, 1, logits
        b.seq_id[i][0] = seq
        self.n += 1
        return i

    def decode(self, ctx: Any) -> None:
        self.batch.n_tokens = self.n
        rc = self._llama_cpp.llama_decode(ctx, self.batch)
        self.n = 0
        if rc != 0:
            raise EngineError(f"llamacpp batch: llama_decode returned {rc}")

    def close(self) -> None:
        self._llama_cpp.llama_batch_free(self.batch)


def _tokens(engine: LlamaCppEngine, request: GenerationRequest) -> list[int]:
    """The prompt's tokens exactly as the engine's ``generate`` makes them."""
    llm = engine.llm
    if request.prefix:
        return engine._prefix(request.prefix) + llm.tokenize(
            request.prompt.encode("utf-8"), add_bos=False, special=True)
    return llm.tokenize(request.prompt.encode("utf-8"), add_bos=True, special=True)


def _sampler(engine: LlamaCppEngine, request: GenerationRequest) -> Any:
    grammar = engine._grammar(request.grammar)
    if grammar is not None:
        return GreedyGrammarSampler(engine.llm, grammar)
    return engine._sampler(request)


class _Context:
    """The multi-sequence context: one KV stream per sequence, the prefix in stream 0."""

    def __init__(self, engine: LlamaCppEngine, n_seq: int, cells_per_seq: int,
                 n_batch: int) -> None:
        import llama_cpp
        from llama_cpp import _internals

        self._llama_cpp = llama_cpp
        params = llama_cpp.llama_context_params.from_buffer_copy(engine.llm.context_params)
        params.n_seq_max = n_seq + 1
        params.kv_unified = False
        params.n_ctx = cells_per_seq * (n_seq + 1)
        params.n_batch = n_batch
        params.n_ubatch = min(n_batch, max(engine.config.chunk_tokens, n_seq))
        self.ctx = _internals.LlamaContext(model=engine.llm._model, params=params, verbose=False)
        got = llama_cpp.llama_n_ctx_seq(self.ctx.ctx)
        if got < cells_per_seq:
            self.ctx.close()
            raise EngineError(f"llamacpp batch: a sequence got {got} cells, {cells_per_seq} "
                              "needed")
        self.memory = llama_cpp.llama_get_memory(self.ctx.ctx)
        self.batch = _Batch(llama_cpp, n_batch)

    def clear(self, seq: int) -> None:
        self._llama_cpp.llama_memory_seq_rm(self.memory, seq, -1, -1)

    def copy_prefix(self, seq: int) -> None:
        self._llama_cpp.llama_memory_seq_cp(self.memory, 0, seq, -1, -1)

    def close(self) -> None:
        self.batch.close()
        self.ctx.close()


def greedy_batch(engine: LlamaCppEngine, requests: Sequence[GenerationRequest], *,
                 n_seq: int = DEFAULT_SEQUENCES,
                 warm_prefix: str | None = None) -> list[BatchOutput]:
    """Generate every request greedily, ``n_seq`` at a time, with ``engine``'s model.

    Every request must share one ``prefix`` (it is evaluated once) and be greedy with no
    deadline. ``engine`` lends its model, tokenizer, grammars and settings (threads, KV type,
    flash attention); its own context is not used (build it with no ``warm_prefix``: nothing
    to evaluate at load). ``warm_prefix``: the prefix the batch-1 engine would have evaluated
    at load, for each output's ``prefix_cache_tokens`` (None: ``engine.config.warm_prefix``).

    Returns:
        One output per request, in order.

    Raises:
        EngineError: mixed prefixes, a sampled or deadlined request, a prompt that does not fit
            the engine's context, or llama.cpp failed a decode.
    """
    if not requests:
        return []
    if n_seq < 1:
        raise EngineError(f"llamacpp batch: n_seq={n_seq}: must be >= 1")
    prefix = requests[0].prefix
    if any(r.prefix != prefix for r in requests):
        raise EngineError("llamacpp batch: the requests must share one prefix")
    if any(r.temperature > 0 or r.deadline_ns is not None for r in requests):
        raise EngineError("llamacpp batch: greedy requests without a deadline only")
    prompts = [_tokens(engine, r) for r in requests]
    for toks, r in zip(prompts, requests, strict=True):
        if len(toks) + r.max_tokens > engine.n_ctx:
            raise EngineError(f"prompt of {len(toks)} tokens + max_tokens {r.max_tokens} "
                              f"exceeds the context of {engine.n_ctx}")
    head = engine._prefix(prefix) if prefix else []
    need = max(len(t) + r.max_tokens for t, r in zip(prompts, requests, strict=True))
    cells = -(-need // _CELL_BLOCK) * _CELL_BLOCK
    n_seq = min(n_seq, len(requests))
    longest_part = max(len(t) - len(head) for t in prompts)
    ctx = _Context(engine, n_seq, cells, n_batch=max(engine.config.chunk_tokens,
                                                     longest_part, n_seq))
    try:
        if head:
            chunk = engine.config.chunk_tokens
            for start in range(0, len(head), chunk):
                for j, tok in enumerate(head[start: start + chunk]):
                    ctx.batch.add(tok, start + j, 0, False)
                ctx.batch.decode(ctx.ctx.ctx)
        outs = _run(engine, ctx, requests, prompts, len(head), n_seq)
    finally:
        ctx.close()
    warm = engine.config.warm_prefix if warm_prefix is None else warm_prefix
    start = engine._prefix(warm) if warm else []
    return cached_in_order(outs, start, prefix_cache=engine.config.prefix_cache)


def cached_in_order(outs: Sequence[BatchOutput], start: Sequence[int], *,
                    prefix_cache: bool = True) -> list[BatchOutput]:
    """Fill each output's ``prefix_cache_tokens`` as the batch-1 engine finds them.

    That engine keeps, from one generation to the next, the KV of the prompt and of every
    generated token but the last (the one that stopped it is never evaluated), and reuses the
    longest prefix the next prompt shares with it (``_reuse_prefix``); ``start`` is what its
    cache holds before the first (the warm prefix, or nothing).
    """
    cached, done = list(start), []
    for o in outs:
        keep = shared_prefix_len(cached, o.prompt_tokens) if prefix_cache and cached else 0
        done.append(replace(o, prefix_cache_tokens=keep))
        cached = [*o.prompt_tokens, *o.tokens[:-1]]
    return done


def _run(engine: LlamaCppEngine, ctx: _Context, requests: Sequence[GenerationRequest],
         prompts: list[list[int]], n_head: int, n_seq: int) -> list[BatchOutput]:
    """The continuous-batching loop (see the module docstring).

    A new prompt's own part is prefilled in a decode call of its own: mixed with other
    sequences' tokens, llama.cpp's split of a batch over separate KV streams (equal tokens per
    sequence in a micro-batch) ran it one token per pass. Its first token is picked from that
    call's logits; every step after carries one token per generating sequence.
    """
    waiting = deque(range(len(requests)))
    free = list(range(n_seq, 0, -1))
    active: dict[int, _Seq] = {}  # by sequence id
    pending: dict[int, int] = {}  # sequence id -> its last token, to be evaluated
    out: list[BatchOutput | None] = [None] * len(requests)
    batch = ctx.batch

    def picked(seq: int, row: int) -> None:
        s = active[seq]
        token = int(s.sampler.sample(ctx.ctx, row))
        stop = _step(engine, s, token)
        if stop is None:
            pending[seq] = token
            return
        text = cut_at_stop(s.text_bytes.decode("utf-8", errors="replace"), s.request.stop)
        out[s.index] = BatchOutput(tuple(s.prompt), tuple(s.tokens), text, stop)
        del active[seq]
        ctx.clear(seq)
        free.append(seq)

    while waiting or active:
        while free and waiting:
            i = waiting.popleft()
            seq = free.pop()
            ctx.clear(seq)
            if n_head:
                ctx.copy_prefix(seq)
            part = prompts[i][n_head:]
            active[seq] = _Seq(i, requests[i], prompts[i], _sampler(engine, requests[i]),
                               n_past=len(prompts[i]))
            for j, tok in enumerate(part):
                row = batch.add(tok, n_head + j, seq, j == len(part) - 1)
            batch.decode(ctx.ctx.ctx)
            picked(seq, row)
        if not pending:
            continue
        rows = {}
        for seq, tok in pending.items():
            s = active[seq]
            rows[seq] = batch.add(tok, s.n_past, seq, True)
            s.n_past += 1
        pending.clear()
        batch.decode(ctx.ctx.ctx)
        for seq, row in rows.items():
            picked(seq, row)
    return [o for o in out if o is not None]


def _step(engine: LlamaCppEngine, s: _Seq, token: int) -> StopReason | None:
    """The batch-1 decode loop's rules for one picked token: its stop reason, or None."""
    s.tokens.append(token)
    if engine._is_end(token):
        return StopReason.DONE
    s.text_bytes += engine.llm.detokenize([token], special=False)
    return stop_after_token(s.request, s.text_bytes, len(s.tokens), None, 0)

