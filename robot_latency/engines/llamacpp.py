"""The llama.cpp engine (llama-cpp-python) at batch 1, timed to the token.

The loop is ours, not ``Llama.generate``'s, so that every event is stamped with the injected clock
and a deadline check runs wherever llama.cpp can stop:

    tokenize ─► reuse the KV of the longest prefix shared with the previous prompt
             ─► prefill in chunks of ``chunk_tokens`` (deadline/abort check between chunks; on the
                CPU backend the abort callback also stops a chunk mid-pass)
             ─► sample (greedy, grammar-constrained) ─► token stamped ─► eval it ─► ...

The abort callback is a Python function that llama.cpp calls a few hundred times per token
(docs/REFERENCE.md, "Engine facts": +4% ITL when always armed), so it is armed only during the
prefill and, in decode, once the deadline is within ``arm_margin_steps`` inter-token gaps. It does
nothing when layers are offloaded to a GPU (llama.cpp checks it on the CPU backend only); there the
chunk boundaries are the interruption points.
"""

from __future__ import annotations

import ctypes
import logging
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from robot_latency.clock import DEFAULT_CLOCK, Clock
from robot_latency.engines import llama_image
from robot_latency.engines.base import (
    AbortSignal,
    ClosesOnExit,
    EngineError,
    GenerationRequest,
    GenerationTrace,
    StopReason,
    output_done,
    register_engine,
    stop_reason_now,
)
from robot_latency.engines.generate import (
    decode,
    generation,
    prefill,
    shared_prefix_len,
    tokenized,
)
from robot_latency.engines.llamacpp_config import KV_TYPES, LlamaCppConfig, verify_batch_tokens
from robot_latency.llama_load import load_policy, open_llama

log = logging.getLogger(__name__)

def resolve_model_path(model_path: str) -> Path:
    """Return the GGUF to load: the given path, or the bundled planner for ""."""
    if model_path:
        return Path(model_path)
    from robot_latency.models.bundled import BundledModelError, bundled_model_path

    try:
        return bundled_model_path()
    except BundledModelError as err:
        raise EngineError(f"llamacpp: no model_path given and {err}") from err


class LlamaCppEngine(ClosesOnExit):
    """A batch-1 llama.cpp engine with per-token timing, prefix reuse, chunked prefill, abort
    and grammar-constrained greedy decoding (see the module docstring)."""

    name = "llamacpp"

    def __init__(self, config: LlamaCppConfig, *, clock: Clock = DEFAULT_CLOCK) -> None:
        import llama_cpp

        self._llama_cpp = llama_cpp
        self.config = config
        self.clock = clock
        path = resolve_model_path(config.model_path)
        self.model_path = path
        # Validate the file first: a clear error naming it, before llama.cpp prints to stderr.
        from robot_latency.floor.errors import ModelInfoError
        from robot_latency.floor.modelinfo import facts_from_gguf

        try:
            self.profile = facts_from_gguf(path)
        except ModelInfoError as err:
            raise EngineError(f"llamacpp: {err}") from err
        if self.profile.architecture not in ("llama", "qwen2", "qwen3", "gemma", "phi3",
                                             "mistral", "granite", "smollm"):
            log.warning("%s: architecture %r not tried with this engine", path,
                        self.profile.architecture)
        kv = KV_TYPES[config.kv_type]
        self.load_policy = load_policy(config.extra_bufts)
        try:
            self.llm = open_llama(
                self.load_policy, model_path=str(path),
                n_ctx=llama_image.context_for(config, self.profile.context_length),
                n_threads=config.n_threads,
                n_threads_batch=config.n_threads_batch or config.n_threads,
                n_batch=verify_batch_tokens(config), n_ubatch=config.chunk_tokens,
                n_gpu_layers=config.n_gpu_layers, flash_attn=config.flash_attn, type_k=kv,
                type_v=kv, seed=config.seed, verbose=False, logits_all=False)
        except (ValueError, RuntimeError, OSError) as err:
            raise EngineError(f"llamacpp: could not load {path}: {err}") from err
        self._ctx_ptr = self.llm._ctx.ctx
        self.n_ctx = self.llm.n_ctx()
        self._eos = self.llm.token_eos()
        self._vocab = self.llm._model.vocab
        self._grammars: dict[str, Any] = {}
        # The abort callback: one ctypes object kept alive for the engine's life; it reads
        # plain attributes set per generation.
        self._cb_deadline_ns: int | None = None
        self._cb_abort: AbortSignal | None = None
        self._cb_fired = False
        self._abort_cb = llama_cpp.ggml_abort_callback(self._should_abort)
        self._null_cb = ctypes.cast(None, llama_cpp.ggml_abort_callback)
        self._armed = False
        self._abort_works = config.abort_callback and config.n_gpu_layers == 0
        self._last_itl_ns = 0
        self._prefix_text: str | None = None
        self._prefix_tokens: list[int] = []
        if config.warm_prefix:
            self._warm(config.warm_prefix)
        self.frames = llama_image.open_frames(self.llm, path, config, clock)
        self.drafter: Any = None
        if config.draft == "model":
            from robot_latency.engines.speculative import DraftModelDrafter

            self.drafter = DraftModelDrafter(config.draft_model_path,
                                             n_threads=config.draft_n_threads,
                                             n_ctx=self.n_ctx, target=self.llm,
                                             policy=self.load_policy)
        elif config.draft == "prompt_lookup":
            from robot_latency.engines.speculative import PromptLookupDrafter

            self.drafter = PromptLookupDrafter()
        self.closed = False

    # --- abort callback ------------------------------------------------------------------------
    def _should_abort(self, _data: Any) -> bool:
        if self._cb_abort is not None and self._cb_abort.is_set():
            self._cb_fired = True
            return True
        if self._cb_deadline_ns is not None and self.clock() >= self._cb_deadline_ns:
            self._cb_fired = True
            return True
        return False

    def _arm(self, on: bool) -> None:
        if not self._abort_works or on == self._armed:
            return
        self._llama_cpp.llama_set_abort_callback(
            self._ctx_ptr, self._abort_cb if on else self._null_cb, None)
        self._armed = on

    # --- the fixed prefix ----------------------------------------------------------------------
    def _prefix(self, text: str) -> list[int]:
        """Return the prefix's tokens (BOS first), tokenized once per distinct prefix."""
        if text != self._prefix_text:
            self._prefix_tokens = self.llm.tokenize(text.encode("utf-8"), add_bos=True,
                                                    special=True)
            self._prefix_text = text
        return self._prefix_tokens

    def _warm(self, text: str) -> None:
        """Evaluate the fixed prefix now, after checking that a whole cycle fits the context.

        Raises:
            EngineError: prefix + longest per-cycle part + max tokens exceed the context.
        """
        cfg = self.config
        tokens = self._prefix(text)
        need = len(tokens) + cfg.max_suffix_tokens + cfg.max_new_tokens
        if need > self.n_ctx:
            raise EngineError(
                f"llamacpp: the profile's fixed prefix ({len(tokens)} tokens) + the longest "
                f"allowed command ({cfg.max_suffix_tokens} tokens) + max_tokens "
                f"({cfg.max_new_tokens}) = {need} exceeds the context of {self.n_ctx} tokens "
                f"of {self.model_path}")
        for start in range(0, len(tokens), cfg.chunk_tokens):
            self.llm.eval(tokens[start: start + cfg.chunk_tokens])
        log.debug("prefix of %d tokens evaluated at load", len(tokens))

    # --- helpers -------------------------------------------------------------------------------
    def _grammar(self, text: str | None) -> Any:
        if text is None:
            return None
        grammar = self._grammars.get(text)
        if grammar is None:
            grammar = self._llama_cpp.LlamaGrammar.from_string(text, verbose=False)
            self._grammars[text] = grammar
        return grammar

    def _sampler(self, request: GenerationRequest) -> Any:
        from llama_cpp import _internals

        grammar = self._grammar(request.grammar)
        if grammar is not None and request.temperature <= 0:
            from robot_latency.engines.llama_sampling import GreedyGrammarSampler

            return GreedyGrammarSampler(self.llm, grammar)
        sampler = _internals.LlamaSampler()
        if grammar is not None:
            sampler.add_grammar(self.llm._model, grammar)
        if request.temperature <= 0:
            sampler.add_greedy()
        else:
            sampler.add_temp(request.temperature)
            sampler.add_dist(request.seed)
        return sampler

    def _reuse_prefix(self, tokens: list[int]) -> int:
        """Keep the KV of the longest prefix shared with what is cached; return its length."""
        llm = self.llm
        keep = 0
        if self.config.prefix_cache and llm.n_tokens > 0:
            keep = shared_prefix_len(llm.input_ids[: llm.n_tokens], tokens)
        if keep < llm.n_tokens:
            llm._ctx.kv_cache_seq_rm(-1, keep, -1)
            llm.n_tokens = keep
        return keep

    def _eval(self, tokens: list[int]) -> bool:
        """Evaluate tokens; False when llama.cpp aborted (the KV is trimmed back)."""
        try:
            self.llm.eval(tokens)
            return True
        except RuntimeError:
            if not self._cb_fired:
                raise
            # Aborted mid-pass: nothing of this batch counts; drop any KV it wrote.
            self.llm._ctx.kv_cache_seq_rm(-1, self.llm.n_tokens, -1)
            return False

    # --- the protocol ------------------------------------------------------------------------
    def generate(self, request: GenerationRequest, *,
                 abort: AbortSignal | None = None) -> GenerationTrace:
        """Generate for ``request`` (see the module docstring); never raises for run-time
        failures: the trace carries ``stop_reason="error"``."""
        self._cb_deadline_ns, self._cb_abort, self._cb_fired = request.deadline_ns, abort, False

        def body(trace: GenerationTrace) -> None:
            try:
                self._generate(request, abort, trace)
            finally:
                self._arm(False)
        return generation("llamacpp", self.clock, log, body, self._forget_kv)

    def _forget_kv(self) -> None:
        """Drop the whole KV cache (its state is unknown after a failure: start clean)."""
        self.llm.n_tokens = 0
        self.llm._ctx.kv_cache_seq_rm(-1, 0, -1)

    def _generate(self, request: GenerationRequest, abort: AbortSignal | None,
                  trace: GenerationTrace) -> None:
        clock, llm, cfg = self.clock, self.llm, self.config
        block = llama_image.frame_block(self, request, trace)
        if request.prefix or block is not None:
            head = self._prefix(request.prefix) if request.prefix else [llm.token_bos()]
            tokens = head + (block.tokens if block is not None else []) + llm.tokenize(
                request.prompt.encode("utf-8"), add_bos=False, special=True)
        else:
            tokens = llm.tokenize(request.prompt.encode("utf-8"), add_bos=True, special=True)
        tokenized(trace, clock, tokens, request, self.n_ctx, f"the context of {self.n_ctx}")
        keep = self._reuse_prefix(tokens)
        trace.prefix_cache_tokens = keep
        if block is not None:  # the frame: found in the KV cache, or evaluated into it now
            keep = llama_image.frame_into_kv(self, request, trace, tokens, len(head), block, keep)
            if keep is None:
                return
        # Prefill, chunk by chunk; the callback is armed for the whole prefill.
        self._arm(request.deadline_ns is not None or abort is not None)
        if prefill(request, abort, trace, clock, tokens, keep, cfg.chunk_tokens,
                   self._eval) is not None:
            # The prefill given up on still took this long (a timed-out cycle's record shows
            # where its budget went).
            trace.phases_extra_ns["prefill"] = clock() - trace.tokenized_ns
            return
        self._arm(False)
        if self.drafter is not None:
            self._decode_speculative(request, abort, trace, tokens)
            return
        sample_ns = decode(request, abort, trace, clock,
                           _LlamaSteps(self, self._sampler(request), request, trace))
        if request.grammar is not None:
            trace.phases_extra_ns["grammar"] = sample_ns  # sampling time is grammar-dominated

    def _is_end(self, token: int) -> bool:
        """Whether ``token`` ends the generation: any end-of-generation token of the vocabulary.

        Not only ``token_eos()``: llama.cpp's vocabulary marks more tokens as end of generation
        (``</s>``, ``<|im_end|>``, ``<|endoftext|>``, ... by their text) and its grammar sampler
        allows every one of them once the grammar's root is complete. Stopping on the EOS alone
        let a model that picked another of them go on emitting it (no text, still allowed by
        the grammar) until the deadline.
        """
        return bool(self._llama_cpp.llama_vocab_is_eog(self._vocab, token))

    def _eval_verify(self, batch: list[int]) -> None:
        """Evaluate ``batch`` with logits at every position (for verification).

        The batch goes through the Llama's own ``llama_batch``, which holds ``n_batch`` tokens
        (``llamacpp_config.verify_batch_tokens`` sizes it for ``draft_k + 1``): a longer one
        would be written past its arrays.
        """
        llm = self.llm
        if len(batch) > llm.n_batch:
            raise EngineError(f"llamacpp: a verify batch of {len(batch)} tokens exceeds the "
                              f"batch of {llm.n_batch} tokens")
        n_past = llm.n_tokens
        llm._ctx.kv_cache_seq_rm(-1, n_past, -1)
        llm._batch.set_batch(batch=batch, n_past=n_past, logits_all=True)
        llm._ctx.decode(llm._batch)
        llm.input_ids[n_past: n_past + len(batch)] = batch
        llm.n_tokens += len(batch)

    def _decode_speculative(self, request: GenerationRequest, abort: AbortSignal | None,
                            trace: GenerationTrace, prompt: list[int]) -> None:
        """Greedy decoding with draft-and-verify rounds; output identical to plain greedy."""
        from robot_latency.stats import SpecStats

        clock, llm, cfg = self.clock, self.llm, self.config
        sampler = self._sampler(request)
        grammar = self._grammar(request.grammar)
        stats = SpecStats(k=cfg.draft_k)
        out: list[int] = []
        stop_reason = StopReason.MAX_TOKENS
        k = cfg.draft_k
        # The first token comes from the prefill's logits.
        pending = int(sampler.sample(llm._ctx, -1))
        trace.token_ns.append(clock())
        out.append(pending)
        done = self._is_end(pending)
        while not done and len(out) < request.max_tokens:
            stop = stop_reason_now(request, abort, clock())
            if stop is not None:
                stop_reason = stop
                break
            t0 = clock()
            room = request.max_tokens - len(out)
            draft = self.drafter.draft(prompt + out, min(k, room - 1) if room > 1 else 0,
                                       grammar=grammar, output_start=len(prompt)) \
                if room > 1 else []
            t1 = clock()
            n_past = llm.n_tokens
            self._eval_verify([pending, *draft])
            t2 = clock()
            accepted = 0
            for j in range(len(draft) + 1):
                tok = int(sampler.sample(llm._ctx, j))
                trace.token_ns.append(clock())
                out.append(tok)
                if self._is_end(tok) or len(out) >= request.max_tokens:
                    done = True
                    break
                if j < len(draft) and tok == draft[j]:
                    accepted += 1
                    continue
                break
            # Keep the KV of `pending` and the accepted drafts; the last sampled token is the
            # new pending one, evaluated in the next round.
            keep = n_past + 1 + accepted
            if llm.n_tokens > keep:
                llm._ctx.kv_cache_seq_rm(-1, keep, -1)
                llm.n_tokens = keep
            pending = out[-1]
            stats.add_round(len(draft), accepted, t1 - t0, t2 - t1)
            if not done and request.complete is not None and output_done(
                    request.complete, llm.detokenize(out, special=False)):
                stop_reason = StopReason.COMPLETE
                break
            if cfg.draft_adaptive and draft:
                k = min(cfg.draft_k, k + 1) if accepted == len(draft) else max(1, accepted)
        if done:
            stop_reason = StopReason.DONE if self._is_end(out[-1]) else StopReason.MAX_TOKENS
        trace.tokens = out
        body = out[:-1] if out and self._is_end(out[-1]) else out
        trace.text = llm.detokenize(body, special=False).decode("utf-8", errors="replace")
        trace.stop_reason = stop_reason
        trace.draft = stats.to_dict()
        trace.phases_extra_ns["draft"] = stats.draft_ns
        trace.phases_extra_ns["verify"] = stats.verify_ns

    def perf(self) -> dict[str, float]:
        """Return llama.cpp's own timings (llama_perf_context): eval ms and counts."""
        data = self._llama_cpp.llama_perf_context(self._ctx_ptr)
        return {"t_p_eval_ms": data.t_p_eval_ms, "t_eval_ms": data.t_eval_ms,
                "n_p_eval": data.n_p_eval, "n_eval": data.n_eval}

    def perf_reset(self) -> None:
        """Zero llama.cpp's own timings."""
        self._llama_cpp.llama_perf_context_reset(self._ctx_ptr)

    def info(self) -> dict[str, Any]:
        """Return the configuration, the model file and the backend facts."""
        config = asdict(self.config)
        config["warm_prefix"] = f"<{len(self.config.warm_prefix)} characters>"
        return {"engine": self.name, **config, "model_path": str(self.model_path),
                "model_bytes": os.path.getsize(self.model_path),
                "architecture": self.profile.architecture, "quant": self.profile.quant,
                "llama_cpp_python": self._llama_cpp.__version__,
                "gpu_offload": bool(self._llama_cpp.llama_supports_gpu_offload()),
                "abort_callback_effective": self._abort_works,
                "load_policy": self.load_policy.to_dict(),
                "warm_prefix_tokens": len(self._prefix_tokens)}

    def close(self) -> None:
        """Free the model and context (idempotent)."""
        if not self.closed:
            self.closed = True
            self._arm(False)
            if self.drafter is not None:
                self.drafter.close()
            if self.frames is not None:
                self.frames.close()
            self.llm.close()


class _LlamaSteps:
    """The llama.cpp engine's part of the shared decode loop
    (:func:`robot_latency.engines.generate.decode`)."""

    def __init__(self, engine: LlamaCppEngine, sampler: Any, request: GenerationRequest,
                 trace: GenerationTrace) -> None:
        self.engine, self.sampler, self.request, self.trace = engine, sampler, request, trace

    def sample(self, started_ns: int) -> int:
        return int(self.sampler.sample(self.engine.llm._ctx, -1))

    def is_end(self, token: int) -> bool:
        return self.engine._is_end(token)

    def piece(self, token: int) -> bytes:
        return self.engine.llm.detokenize([token], special=False)

    def feed(self, token: int) -> bool:
        # Arm the abort callback only once the deadline is within a few inter-token gaps.
        deadline, stamps = self.request.deadline_ns, self.trace.token_ns
        if deadline is not None and len(stamps) >= 2:
            itl = stamps[-1] - stamps[-2]
            self.engine._arm(deadline - stamps[-1] < self.engine.config.arm_margin_steps * itl)
        return self.engine._eval([token])


@register_engine("llamacpp")
def make_llamacpp_engine(*, clock: Clock = DEFAULT_CLOCK, **options: Any) -> LlamaCppEngine:
    """Create a :class:`LlamaCppEngine` from keyword options (fields of :class:`LlamaCppConfig`)."""
    try:
        config = LlamaCppConfig(**options)
    except TypeError as err:
        raise EngineError(f"llamacpp: {err}") from err
    return LlamaCppEngine(config, clock=clock)
